//! Leader election on a `coordination.k8s.io/v1` Lease, after client-go's `leaderelection` (kube 5 has none).
//!
//! Every replica runs [`spawn`]; the one holding the Lease leads and may write, the others watch and wait.
//! Safety rests on `renew_deadline < lease_duration`: a holder that could not renew for `renew_deadline` stops
//! leading before any other replica may consider its lease expired. Expiry is judged as client-go judges it:
//! by the follower's own monotonic clock, `leaseDuration` after it last saw the lease's record change, never by
//! comparing the holder's `renewTime` with the follower's wall clock; so a replica whose clock runs ahead
//! (a node whose time sync failed) cannot take over a lease that is still being renewed.
//! Two contenders never both win a takeover: every write replaces the object at the resourceVersion just read,
//! so the apiserver lets exactly one through and answers the other with 409.
//!
//! Why ours and not `kube-lease-manager` (0.13 builds on kube 5): its model is a lease duration plus a grace
//! for clock skew, written with server-side apply; ours is client-go's (lease duration, renew deadline, retry
//! period), which the chart's flags, `kubectl get lease` readers and client-go based tooling share. The
//! properties we rely on (a holder stops leading before anyone may take its lease, even when the apiserver
//! hangs mid-request; the lease is released on shutdown; apiserver errors never end the election) are proven
//! here against a real apiserver, killed and frozen (`tests/lease.rs`); moving would mean proving them again
//! for a different model, for about 300 lines saved.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::FIELD_MANAGER;

/// How many times shutdown re-reads the lease when its release meets a concurrent write.
const RELEASE_ATTEMPTS: usize = 3;

/// An agent's Lease when `--lease-name` does not say: `kcp-keeper-<agent>` (the chart's name too).
pub fn default_name(agent: &str) -> String {
    format!("kcp-keeper-{agent}")
}

/// Where the lease lives, who we are, and the election's timing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// Names this replica in `holderIdentity`; must be unique among contenders (the pod name).
    pub identity: String,
    /// How long others wait after the last renew before taking the lease; whole seconds (the Lease stores them).
    pub lease_duration: Duration,
    /// How long the holder keeps leading without a successful renew; must be below `lease_duration`.
    pub renew_deadline: Duration,
    /// The pause between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's defaults: 15s lease, 10s renew deadline, 2s retry period.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        for (field, value) in [("namespace", &self.namespace), ("name", &self.name), ("identity", &self.identity)] {
            if value.is_empty() {
                return Err(format!("{field}: must not be empty"));
            }
        }
        if self.lease_duration < Duration::from_secs(1) || self.lease_duration.subsec_nanos() != 0 {
            return Err(format!(
                "lease_duration: must be a whole number of seconds, at least 1s (got {:?})",
                self.lease_duration
            ));
        }
        if i32::try_from(self.lease_duration.as_secs()).is_err() {
            return Err(format!("lease_duration: too long (got {:?})", self.lease_duration));
        }
        if self.retry_period.is_zero() {
            return Err("retry_period: must be positive".into());
        }
        // A holder needs more than one attempt before its deadline, or a single slow request ends its term.
        if self.renew_deadline <= self.retry_period {
            return Err(format!(
                "renew_deadline: must be longer than retry_period ({:?} <= {:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        // The holder must stop leading before others may take the lease, or two replicas lead at once.
        if self.renew_deadline >= self.lease_duration {
            return Err(format!(
                "renew_deadline: must be shorter than lease_duration ({:?} >= {:?})",
                self.renew_deadline, self.lease_duration
            ));
        }
        Ok(())
    }

    fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("invalid leader election configuration: {0}")]
    Config(String),
}

/// Whether this replica leads right now. Cheap to clone; every clone follows the same election.
///
/// Once the election task has ended (shutdown, or aborted/panicked), this reads as not leading.
#[derive(Clone, Debug)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
    /// Whether the election has answered once (leading, or someone else holds the lease): until then this
    /// replica is neither leader nor follower, and not ready.
    decided: Arc<std::sync::atomic::AtomicBool>,
    /// Keeps [`Leadership::always`]'s channel open: a closed channel means the election task is gone.
    _always: Option<Arc<watch::Sender<bool>>>,
}

impl Leadership {
    pub fn is_leader(&self) -> bool {
        // A task that died while leading never got to say so; it can renew nothing, so it leads nothing.
        !self.rx.is_closed() && *self.rx.borrow()
    }

    /// Returns once this replica leads (at once if it does). Never returns if the election task has ended,
    /// so select it against shutdown.
    pub async fn wait_until_leader(&mut self) {
        loop {
            if self.is_leader() {
                return;
            }
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Whether the election has decided this replica's role at least once (a change is announced on
    /// [`Leadership::subscribe`]'s channel).
    pub fn is_decided(&self) -> bool {
        self.decided.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A receiver that sees every change; `changed()` fails once the election task has ended.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }

    /// A child of `parent` that is also cancelled when this replica stops leading (or the election ends): the
    /// token of one session of leader-only work. Cancel it when the session ends; that also ends the task
    /// watching the election for it.
    pub fn session(&self, parent: &CancellationToken) -> CancellationToken {
        let session = parent.child_token();
        let mut changes = self.subscribe();
        let lost = async move {
            while *changes.borrow_and_update() {
                if changes.changed().await.is_err() {
                    return;
                }
            }
        };
        let token = session.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = token.cancelled() => {}
                () = lost => token.cancel(),
            }
        });
        session
    }

    /// Always leading: for one-shot commands and for running with leader election disabled.
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        Self { rx, decided: Arc::new(true.into()), _always: Some(Arc::new(tx)) }
    }

    /// Keeps `<prefix>_leader` at 1 while this replica leads and 0 otherwise, until the election ends (then 0).
    /// Every agent's daemon exports it ([`crate::agent::run_with`]), whatever the form of its work, so one alert
    /// can tell that no replica of an agent leads.
    pub fn export(&self, metrics: LeaderMetrics) -> JoinHandle<()> {
        let mut rx = self.subscribe();
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                metrics.leader.set(i64::from(this.is_leader()));
                if rx.changed().await.is_err() {
                    metrics.leader.set(i64::from(this.is_leader()));
                    return;
                }
            }
        })
    }
}

crate::metrics! {
    /// Whether this replica holds the agent's Lease.
    pub struct LeaderMetrics {
        pub leader: Gauge => "leader", "1 while this replica holds the lease";
    }
}

/// What to do with the lease as read, at `now`, as `identity`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds a live lease: take it. `previous` is the holder whose term ran out, if any.
    Acquire { previous: Option<String> },
    /// The lease names us: write a fresh renewTime.
    Renew,
    /// Someone else holds it for at least `expires_in` more (by our monotonic clock).
    Follow { holder: String, expires_in: Duration },
}

/// Decides from the lease's spec (`None` when there is no lease) and how long this replica has seen that spec
/// unchanged (`unchanged_for`, by its monotonic clock), without any client, so it can be tested.
///
/// Another holder's lease expires once its record has not changed for its `leaseDurationSeconds`
/// (`default_duration` when missing): every renew writes a new renewTime, so a live holder's record keeps
/// changing. No wall-clock time is compared, so clock skew between replicas does not matter. A lease naming a
/// holder but carrying neither renewTime nor acquireTime counts as expired: nothing shows that holder is alive.
pub fn decide(
    current: Option<&LeaseSpec>,
    identity: &str,
    unchanged_for: Duration,
    default_duration: Duration,
) -> Decision {
    let Some(spec) = current else { return Decision::Acquire { previous: None } };
    let holder = match spec.holder_identity.as_deref() {
        None | Some("") => return Decision::Acquire { previous: None },
        Some(holder) => holder,
    };
    if holder == identity {
        return Decision::Renew;
    }
    let previous = Some(holder.to_string());
    if spec.renew_time.is_none() && spec.acquire_time.is_none() {
        return Decision::Acquire { previous };
    }
    let duration = match spec.lease_duration_seconds {
        Some(seconds) => Duration::from_secs(u64::try_from(seconds).unwrap_or(0)),
        None => default_duration,
    };
    match duration.checked_sub(unchanged_for).filter(|left| !left.is_zero()) {
        Some(expires_in) => Decision::Follow { holder: holder.into(), expires_in },
        None => Decision::Acquire { previous },
    }
}

/// How long `spec` has been seen unchanged as of `now`; `observed` is the spec this replica last saw change and
/// when (client-go's observed record and time), updated here.
fn unchanged_for(observed: &mut Option<(LeaseSpec, Instant)>, spec: Option<&LeaseSpec>, now: Instant) -> Duration {
    match (observed.as_ref(), spec) {
        (Some((last, since)), Some(spec)) if last == spec => now.saturating_duration_since(*since),
        _ => {
            *observed = spec.map(|spec| (spec.clone(), now));
            Duration::ZERO
        }
    }
}

impl Decision {
    /// The spec to write for this decision (`None` for [`Decision::Follow`]), keeping fields we do not manage.
    pub fn next_spec(
        &self,
        current: Option<&LeaseSpec>,
        identity: &str,
        now: Timestamp,
        lease_duration_seconds: i32,
    ) -> Option<LeaseSpec> {
        let mut spec = current.cloned().unwrap_or_default();
        match self {
            Self::Follow { .. } => return None,
            Self::Acquire { .. } => {
                spec.holder_identity = Some(identity.into());
                spec.acquire_time = Some(MicroTime(now));
                // As client-go counts: every change of holder on an existing lease, including from nobody.
                spec.lease_transitions =
                    Some(current.map_or(0, |c| c.lease_transitions.unwrap_or(0).saturating_add(1)));
            }
            Self::Renew => {
                spec.acquire_time.get_or_insert(MicroTime(now));
            }
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(lease_duration_seconds);
        Some(spec)
    }
}

/// The spec that hands the lease back: no holder, so others take it at their next attempt. The one-second
/// duration is for client-go-based readers, which judge expiry by duration even without a holder.
pub fn released_spec(current: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        acquire_time: None,
        renew_time: Some(MicroTime(now)),
        lease_duration_seconds: Some(1),
        ..current.clone()
    }
}

/// Runs the election until `shutdown` is cancelled; on the way out releases the lease if held.
///
/// The task ends with an error only for an invalid configuration; apiserver errors are logged and retried.
/// Aborting the task (rather than cancelling) leaves the lease to expire, as a crash would.
pub fn spawn(
    client: kube::Client,
    config: LeaseConfig,
    shutdown: CancellationToken,
) -> (Leadership, JoinHandle<Result<(), LeaseError>>) {
    let (tx, rx) = watch::channel(false);
    let decided = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let span = tracing::info_span!(
        "lease",
        lease = %format!("{}/{}", config.namespace, config.name),
        identity = %config.identity
    );
    let election_decided = decided.clone();
    let task = tokio::spawn(
        async move {
            config.validate().map_err(LeaseError::Config)?;
            let api = Api::namespaced(client, &config.namespace);
            Elector {
                api,
                config,
                tx,
                decided: election_decided,
                observed: None,
                renewed_at: None,
                holds: false,
                failures: 0,
            }
            .run(shutdown)
            .await;
            Ok(())
        }
        .instrument(span),
    );
    (Leadership { rx, decided, _always: None }, task)
}

/// The result of one attempt to acquire or renew.
enum Outcome {
    /// We hold the lease (acquired or renewed as `decision` says); `written_at` matches the renewTime written.
    Holding {
        written_at: Instant,
        decision: Decision,
    },
    Following {
        holder: String,
    },
    /// The lease changed between our read and our write: someone else wrote first.
    LostRace,
}

struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    tx: watch::Sender<bool>,
    decided: Arc<std::sync::atomic::AtomicBool>,
    /// The lease as last seen changing, for judging another holder's expiry.
    observed: Option<(LeaseSpec, Instant)>,
    /// While leading: the monotonic time matching the renewTime of our last successful write.
    renewed_at: Option<Instant>,
    /// Whether the lease named us when we last read or wrote it, so shutdown knows whether to release it.
    holds: bool,
    failures: u32,
}

impl Elector {
    async fn run(mut self, shutdown: CancellationToken) {
        tracing::info!(
            lease_duration = ?self.config.lease_duration,
            renew_deadline = ?self.config.renew_deadline,
            retry_period = ?self.config.retry_period,
            "leader election started"
        );
        loop {
            // Every wait races the renew deadline, so a hung request cannot keep us leading past it.
            let renew_by = self.renew_by();
            let attempt = tokio::time::timeout(self.config.renew_deadline, self.try_once());
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                () = until(renew_by) => self.step_down_late(),
                result = attempt => self.record(result),
            }
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                () = until(self.renew_by()) => self.step_down_late(),
                () = tokio::time::sleep(self.config.retry_period) => {}
            }
        }
        self.release().await;
    }

    async fn try_once(&mut self) -> Result<Outcome, kube::Error> {
        let current = self.api.get_opt(&self.config.name).await?;
        // `written_at` starts the renew deadline and times the lease's record as read; `now` is only what is
        // written (others judge expiry by when they see the record change, not by this time).
        let (written_at, now) = (Instant::now(), Timestamp::now());
        let spec = current.as_ref().and_then(|lease| lease.spec.as_ref());
        let unchanged_for = unchanged_for(&mut self.observed, spec, written_at);
        let decision = decide(spec, &self.config.identity, unchanged_for, self.config.lease_duration);
        let Some(next) = decision.next_spec(spec, &self.config.identity, now, self.config.lease_duration_seconds())
        else {
            // Only Follow writes nothing.
            let holder = match decision {
                Decision::Follow { holder, .. } => holder,
                Decision::Acquire { .. } | Decision::Renew => String::new(),
            };
            return Ok(Outcome::Following { holder });
        };
        let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        let written = match current {
            // The resourceVersion we read goes back with the write: a concurrent writer makes it fail with 409.
            Some(mut lease) => {
                lease.spec = Some(next);
                self.api.replace(&self.config.name, &pp, &lease).await
            }
            None => {
                let metadata = ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                };
                self.api.create(&pp, &Lease { metadata, spec: Some(next) }).await
            }
        };
        match written {
            Ok(_) => Ok(Outcome::Holding { written_at, decision }),
            Err(e) if is_conflict(&e) => Ok(Outcome::LostRace),
            Err(e) => Err(e),
        }
    }

    fn record(&mut self, result: Result<Result<Outcome, kube::Error>, tokio::time::error::Elapsed>) {
        let outcome = match result {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(error)) => return self.failed(&error),
            Err(_) => return self.failed(&format!("no answer within {:?}", self.config.renew_deadline)),
        };
        if self.failures > 0 {
            tracing::info!(failures = self.failures, "lease API reachable again");
            self.failures = 0;
        }
        match outcome {
            Outcome::Holding { written_at, decision } => {
                self.holds = true;
                // A write that landed too late proves nothing about the deadline we promised; the next one will.
                if Instant::now() >= written_at + self.config.renew_deadline {
                    tracing::warn!("lease written but too late to count as a renew");
                    return;
                }
                self.renewed_at = Some(written_at);
                // Leadership before "decided": a driver that sees the election decided must also see that this
                // replica leads, or it counts itself a follower for one pass and reports ready before the
                // leader's first reconcile.
                let changed = self.set_leader(true);
                self.decide();
                if changed {
                    match decision {
                        Decision::Acquire { previous: Some(previous) } => {
                            tracing::info!(%previous, "took over an expired lease; now leading")
                        }
                        Decision::Acquire { previous: None } => tracing::info!("acquired the lease; now leading"),
                        Decision::Renew | Decision::Follow { .. } => {
                            tracing::info!("renewed a lease naming us; now leading")
                        }
                    }
                } else {
                    tracing::trace!("renewed the lease");
                }
            }
            Outcome::Following { holder } => {
                self.holds = false;
                self.renewed_at = None;
                let changed = self.set_leader(false);
                self.decide();
                if changed {
                    tracing::warn!(%holder, "another replica holds the lease; no longer leading");
                } else {
                    tracing::trace!(%holder, "following");
                }
            }
            Outcome::LostRace => tracing::debug!("the lease changed since it was read; another replica wrote first"),
        }
    }

    fn failed(&mut self, error: &dyn std::fmt::Display) {
        self.failures += 1;
        tracing::warn!(failures = self.failures, leading = self.renewed_at.is_some(), %error, "lease attempt failed");
    }

    fn renew_by(&self) -> Option<Instant> {
        self.renewed_at.map(|t| t + self.config.renew_deadline)
    }

    fn step_down_late(&mut self) {
        self.renewed_at = None;
        if self.set_leader(false) {
            tracing::warn!(
                renew_deadline = ?self.config.renew_deadline,
                "could not renew the lease within the renew deadline; no longer leading (still trying)"
            );
        }
    }

    /// The first answer decides this replica's role; watchers are woken even when leadership did not change.
    fn decide(&self) {
        if !self.decided.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.tx.send_modify(|_| {});
        }
    }

    /// Returns whether leadership changed.
    fn set_leader(&self, leading: bool) -> bool {
        self.tx.send_if_modified(|current| std::mem::replace(current, leading) != leading)
    }

    async fn release(&mut self) {
        // Writers stop before the lease is handed over, so a successor never overlaps with us.
        if self.set_leader(false) {
            tracing::info!("shutting down; no longer leading");
        }
        self.renewed_at = None;
        if !self.holds {
            return;
        }
        match tokio::time::timeout(self.config.renew_deadline, self.try_release()).await {
            Ok(Ok(true)) => tracing::info!("released the lease"),
            Ok(Ok(false)) => tracing::info!("the lease no longer names us; nothing to release"),
            Ok(Err(error)) => tracing::warn!(%error, "could not release the lease; it expires on its own"),
            Err(_) => tracing::warn!("releasing the lease timed out; it expires on its own"),
        }
    }

    async fn try_release(&self) -> Result<bool, kube::Error> {
        let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        // A renew of ours cut off by the deadline may still land after our read; read again and retry.
        for _ in 0..RELEASE_ATTEMPTS {
            let Some(mut lease) = self.api.get_opt(&self.config.name).await? else { return Ok(false) };
            let Some(spec) = lease.spec.as_ref() else { return Ok(false) };
            if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
                return Ok(false);
            }
            lease.spec = Some(released_spec(spec, Timestamp::now()));
            match self.api.replace(&self.config.name, &pp, &lease).await {
                Ok(_) => return Ok(true),
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }
}

/// Sleeps until `deadline`, or forever without one.
pub(crate) async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// 409: a replace at a stale resourceVersion (Conflict) or a create that someone beat us to (AlreadyExists).
fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}
