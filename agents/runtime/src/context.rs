//! What an agent's daemon works with ([`Context`]): its own file, so that the driver and the schedules, which take
//! it, and `agent::run`, which builds it, do not import each other.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::admin::Health;
use crate::events::Recorder;
use crate::lease::Leadership;

/// What an agent's loop works with.
pub struct Context<C> {
    pub client: kube::Client,
    /// The current valid configuration; changes when a valid new file is applied.
    pub config: watch::Receiver<Arc<C>>,
    /// Only write while this says leader.
    pub leadership: Leadership,
    pub health: Arc<Health>,
    /// Cancelled on SIGTERM/SIGINT or when leadership is lost; the loop finishes its step and returns.
    pub shutdown: CancellationToken,
    pub events: Arc<Recorder>,
    pub identity: String,
    /// The agent's own namespace (`--lease-namespace`, the pod's): its Lease, and any state it keeps, live there,
    /// with leader election on or off.
    pub namespace: String,
    /// The agent's Lease name (`--lease-name`, else `kcp-keeper-<agent>`), also when leader election is off.
    pub lease_name: String,
    /// Where schedules record the ticks they ran ([`crate::schedule::LeaseRecord`]): this agent's own Lease.
    /// `None` when leader election is off (then every tick fires and nothing is recorded).
    pub lease_record: Option<crate::schedule::LeaseRecord>,
}
