//! `<agent> run`: everything around an agent's own loop. The agent gets a [`Context`] and returns when its
//! shutdown token is cancelled.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, Health};
use crate::args::RunArgs;
use crate::config::{self, AgentConfig};
use crate::events::Recorder;
use crate::lease::{self, Leadership, LeaseConfig};
use crate::metrics::ConfigMetrics;

/// Names an agent: its binary name (Lease, Events) and metric prefix.
#[derive(Debug, Clone, Copy)]
pub struct AgentInfo {
    pub name: &'static str,
    pub metrics_prefix: &'static str,
}

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
}

/// Runs an agent: logging, configuration (fails at start with the field path when invalid), metrics and the
/// admin server, the Kubernetes client, leader election, configuration reload and graceful shutdown.
/// `metrics` registers the agent's own metrics under its prefix; `body` is the agent's loop.
pub async fn run<C, M, F, Fut>(
    info: AgentInfo,
    args: RunArgs,
    metrics: impl FnOnce(&mut Registry) -> M,
    body: F,
) -> anyhow::Result<()>
where
    C: AgentConfig,
    F: FnOnce(Context<C>, M) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let rt = &args.runtime;
    crate::logging::init(&rt.log_level, rt.log_format)?;
    tracing::info!(agent = info.name, version = crate::VERSION, "starting");
    let initial: C = config::load(&args.config)?;

    let mut registry = crate::metrics::registry(info.metrics_prefix);
    let config_metrics = ConfigMetrics::register(registry.sub_registry_with_prefix(info.metrics_prefix));
    let agent_metrics = metrics(registry.sub_registry_with_prefix(info.metrics_prefix));
    let health = Arc::new(Health::default());
    let _admin = admin::serve(rt.admin_addr, health.clone(), Arc::new(registry))
        .await
        .with_context(|| format!("binding the admin server to {}", rt.admin_addr))?;

    let signals = crate::shutdown::on_signals()?;
    // One token for the agent: cancelled by a signal or by losing the lease.
    let shutdown = signals.child_token();
    let client = rt.kube.client().await.context("creating the Kubernetes client")?;
    let identity = rt.lease.identity();

    let lease_token = CancellationToken::new();
    let (leadership, lease_task) = if rt.lease.enabled {
        let mut lease_config = LeaseConfig::new(
            rt.lease.lease_namespace.clone(),
            rt.lease.lease_name.clone().unwrap_or_else(|| format!("kcp-keeper-{}", info.name)),
            identity.clone(),
        );
        lease_config.lease_duration = rt.lease.lease_duration;
        lease_config.renew_deadline = rt.lease.renew_deadline;
        lease_config.validate().map_err(|e| anyhow::anyhow!("leader election: {e}"))?;
        let (leadership, task) = lease::spawn(client.clone(), lease_config, lease_token.clone());
        (leadership, Some(task))
    } else {
        (Leadership::always(), None)
    };
    let lost = spawn_lost_lease_monitor(&leadership, shutdown.clone());

    {
        let (health, shutdown) = (health.clone(), shutdown.clone());
        tokio::spawn(async move {
            shutdown.cancelled().await;
            health.start_draining();
        });
    }
    let config = config::watch(args.config.clone(), initial, config_metrics, config::POLL_INTERVAL, shutdown.clone())?;
    let events = Arc::new(Recorder::new(client.clone(), info.name, &identity));
    let ctx = Context { client, config, leadership, health, shutdown: shutdown.clone(), events, identity };
    let result = body(ctx, agent_metrics).await;

    // Release the lease on the way out so another replica takes over at once.
    shutdown.cancel();
    lease_token.cancel();
    if let Some(task) = lease_task {
        // The lease task bounds its release by the renew deadline.
        let bound = rt.lease.renew_deadline + Duration::from_secs(1);
        match tokio::time::timeout(bound, task).await {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "leader election ended with an error"),
            Err(_) => tracing::warn!("lease not released in time"),
            _ => {}
        }
    }
    tracing::info!(agent = info.name, "stopped");
    if lost.is_finished() && lost.await.unwrap_or(false) {
        anyhow::bail!("lost the lease while leading; exiting so a fresh start re-joins the election");
    }
    result
}

/// Cancels `shutdown` when this replica stops leading after it led: writes in flight must stop, and a fresh
/// process re-joins the election cleanly. Resolves to whether that happened.
fn spawn_lost_lease_monitor(leadership: &Leadership, shutdown: CancellationToken) -> tokio::task::JoinHandle<bool> {
    let mut rx = leadership.subscribe();
    tokio::spawn(async move {
        let mut led = *rx.borrow();
        loop {
            tokio::select! {
                // A clean shutdown releases the lease too; it must not read as "lost".
                biased;
                _ = shutdown.cancelled() => return false,
                changed = rx.changed() => {
                    if changed.is_err() {
                        return false;
                    }
                    let now = *rx.borrow();
                    if led && !now {
                        tracing::error!("lost the lease while leading; stopping");
                        shutdown.cancel();
                        return true;
                    }
                    led = now;
                }
            }
        }
    })
}
