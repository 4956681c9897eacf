//! The reconcile driver: when to reconcile, who may, and what it cost.
//!
//! An agent describes its work as a [`Reconciler`]: the items a full pass covers (ca-syncer: its bundles) and
//! how to reconcile one. [`run`] does the rest:
//! - triggers: the agent's scoped watches ([`crate::watch`]), a configuration change (the watches are rebuilt
//!   from the new configuration), a leadership change, the time an item asked to be looked at again, and a
//!   resync interval as a backstop;
//! - debounce: changes arrive in bursts (a Secret and its namespace, a rotation touching two keys), one pass
//!   follows the burst; an agent whose every intermediate state is safe to publish ([`Settings::leading_edge`])
//!   runs the first change after a quiet spell at once and the rest of its burst in one pass after the quiet;
//! - leader gating: every replica keeps its caches warm, only the leader reconciles (and so writes);
//! - backoff: an item that failed is retried with exponential backoff and jitter (`backon`), reset by its next
//!   success; a new trigger still runs it at once, as controller-runtime's queue does;
//! - observability: a span per item reconcile, `<prefix>_reconcile_duration_seconds`,
//!   `<prefix>_reconcile_errors_total{reason}` with the reason taken from the agent's own error enum
//!   ([`ErrorReason`]), every reason exported at 0 from the start so no series appears out of nowhere;
//! - readiness ([`crate::admin::Health`]): watches synced, apiserver reachable, and for the leader its first
//!   full pass has run. A failing item is reported by metrics and Events, not readiness.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures::StreamExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use tokio::time::Instant;
use tracing::Instrument;

use crate::context::Context;
use crate::lease::until;
use crate::metrics::{GaugeF64, ReasonLabel, at_zero, unix_now};
use crate::watch::{Signal, Watches};

/// An agent's error enum, mapped to a bounded metric label by its variant names, with no list of strings to
/// keep by hand: derive `strum::IntoStaticStr` and `strum::VariantNames` (with the same
/// `#[strum(serialize_all = "snake_case")]`) and this trait comes for free.
pub trait ErrorReason: std::error::Error + Send + Sync + 'static {
    /// Every label this type can produce.
    fn reasons() -> &'static [&'static str];
    /// The label of this error.
    fn reason(&self) -> &'static str;
}

impl<E> ErrorReason for E
where
    E: std::error::Error + strum::VariantNames + Send + Sync + 'static,
    for<'a> &'a E: Into<&'static str>,
{
    fn reasons() -> &'static [&'static str] {
        E::VARIANTS
    }

    fn reason(&self) -> &'static str {
        self.into()
    }
}

/// What an agent reconciles, item by item.
pub trait Reconciler: Send + Sync {
    /// One unit of work (a bundle); its Display names it in spans and logs (`bundle/kcp-root-ca`).
    type Item: Clone + Ord + Display + Send + Sync;
    type Error: ErrorReason;

    /// The items of a full pass, from the configuration this reconciler was built with.
    fn items(&self) -> Vec<Self::Item>;

    /// Reconciles one item. `Ok(Some(d))` asks to be run again within `d` (a certificate due to expire).
    fn reconcile(&self, item: &Self::Item) -> impl Future<Output = Result<Option<Duration>, Self::Error>> + Send;
}

crate::metrics! {
    /// The series of [`ReconcileMetrics`] but its histogram, under the agent's prefix.
    pub struct ReconcileSeries {
        pub errors: Family<ReasonLabel, Counter> => "reconcile_errors", "Failed reconciles, by reason";
        pub last_pass: GaugeF64 => "reconcile_pass_timestamp" [Seconds],
            "When this replica, leading, last finished a full pass over every item";
    }
}

/// `<prefix>_reconcile_duration_seconds`, `<prefix>_reconcile_errors_total{reason}`,
/// `<prefix>_reconcile_pass_timestamp_seconds` (when the leader last finished a full pass); `<prefix>_leader` is
/// every daemon's, exported by the runtime ([`crate::lease::Leadership::export`]).
/// The histogram is registered here beside the [`ReconcileSeries`] (its buckets are no `Default`, which a
/// [`crate::metrics!`] field needs), and so are the reasons of the agent's error enum, at 0.
#[derive(Clone, Debug)]
pub struct ReconcileMetrics {
    duration: Histogram,
    series: ReconcileSeries,
}

impl ReconcileMetrics {
    /// Registers under the agent's prefix, with every reason `E` can give at 0.
    pub fn register<E: ErrorReason>(registry: &mut Registry) -> Self {
        // 1 ms to ~30 s.
        let duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let help = "Time spent reconciling one item";
        registry.register_with_unit("reconcile_duration", help, Unit::Seconds, duration.clone());
        let series = ReconcileSeries::register(registry);
        at_zero(&series.errors, E::reasons().iter().map(|reason| ReasonLabel { reason: (*reason).into() }));
        Self { duration, series }
    }

    /// Times `reconcile` and counts its error by reason.
    pub async fn observe<T, E: ErrorReason>(&self, reconcile: impl Future<Output = Result<T, E>>) -> Result<T, E> {
        let started = Instant::now();
        let result = reconcile.await;
        self.duration.observe(started.elapsed().as_secs_f64());
        if let Err(e) = &result {
            self.series.errors.get_or_create(&ReasonLabel { reason: e.reason().into() }).inc();
        }
        result
    }
}

/// Timing of the driver.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Quiet time after a change before the pass runs.
    pub debounce: Duration,
    /// A change that comes after `debounce` without a pass runs its pass at once, with the events already
    /// queued beside it; changes within `debounce` of a pass wait for quiet as before, so a burst makes at most
    /// two passes instead of one. For an agent whose intermediate states are all safe to publish (ca-syncer keeps
    /// a CA that left its sources, so a half-applied rotation never drops one), it takes the debounce out of the
    /// time from a lone change to its first write.
    pub leading_edge: bool,
    /// Every item is reconciled at least this often.
    pub resync: Duration,
    /// Retry delays after a failure: exponential with jitter.
    pub backoff: ExponentialBuilder,
    /// While the apiserver is unreachable, how often to ask it again.
    pub probe_interval: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            debounce: Duration::from_millis(300),
            leading_edge: false,
            resync: Duration::from_secs(60),
            backoff: default_backoff(),
            probe_interval: Duration::from_secs(2),
        }
    }
}

/// 1 s doubling to 60 s, each with up to as much again of jitter, never giving up.
pub fn default_backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(60))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
}

/// When an item runs next, and its backoff while it keeps failing.
struct ItemState {
    due: Instant,
    backoff: Option<ExponentialBackoff>,
}

/// Runs `build`'s reconciler until shutdown. `build` is called with each applied configuration and returns
/// the reconciler and the watches it reads through (their stores live in the reconciler).
pub async fn run<C, R, B>(ctx: &Context<C>, metrics: &ReconcileMetrics, settings: Settings, mut build: B)
where
    C: Send + Sync + 'static,
    R: Reconciler,
    B: FnMut(Arc<C>) -> (R, Watches),
{
    let mut driver = Driver {
        ctx,
        metrics,
        settings,
        config: ctx.config.clone(),
        leadership: ctx.leadership.subscribe(),
        next_probe: Instant::now(),
    };
    'generation: loop {
        let mut generation = driver.start(&mut build);
        loop {
            if driver.read_leadership() && generation.watches.all_synced() {
                match driver.pass(&mut generation).await {
                    Pass::Finished => {}
                    Pass::Abandoned => continue,
                    Pass::Shutdown => return,
                }
            }
            match driver.wait(&mut generation).await {
                Wake::Again => {}
                Wake::Reconfigured => continue 'generation,
                Wake::Shutdown => return,
            }
        }
    }
}

/// What [`run`] keeps across configurations.
struct Driver<'a, C> {
    ctx: &'a Context<C>,
    metrics: &'a ReconcileMetrics,
    settings: Settings,
    config: tokio::sync::watch::Receiver<Arc<C>>,
    leadership: tokio::sync::watch::Receiver<bool>,
    /// Kept across wake-ups, so a stream of watch failures does not keep postponing the probe.
    next_probe: Instant,
}

/// One configuration's reconciler, its started watches, and what the driver knows of its items.
struct Generation<R: Reconciler> {
    /// Declared before the reconciler, so the watches stop before the stores they fill are dropped.
    watches: crate::watch::WatchSet,
    reconciler: R,
    items: BTreeMap<R::Item, ItemState>,
    /// Set by anything that makes every item due: a change, a new configuration, leadership.
    everything: bool,
    /// When the last pass ended: a change within the debounce of it is part of a burst.
    last_pass_end: Option<Instant>,
}

/// How [`Driver::pass`] ended.
enum Pass {
    /// Every item it took up ran.
    Finished,
    /// The lease was lost mid-pass: leadership is read again before anything else.
    Abandoned,
    /// Shutdown, mid-pass.
    Shutdown,
}

/// Why [`Driver::wait`] returned.
enum Wake {
    /// A reason to look again: a pass runs if this replica leads and its watches are synced.
    Again,
    /// A new configuration: the reconciler and its watches are built again.
    Reconfigured,
    /// Shutdown.
    Shutdown,
}

impl<C: Send + Sync + 'static> Driver<'_, C> {
    /// Builds the reconciler and its watches from the current configuration, marking it seen, and starts the
    /// watches; every item is due in the first pass.
    fn start<R: Reconciler>(&mut self, build: &mut impl FnMut(Arc<C>) -> (R, Watches)) -> Generation<R> {
        let (reconciler, watches) = build(self.config.borrow_and_update().clone());
        let watches = watches.start();
        self.ctx.health.set_watches_synced(watches.all_synced());
        Generation { watches, reconciler, items: BTreeMap::new(), everything: true, last_pass_end: None }
    }

    /// Reads the election and publishes it to readiness; returns whether this replica leads.
    fn read_leadership(&self) -> bool {
        // "Decided" is read first: the election sets leadership before it marks itself decided, so a decided
        // election read here comes with the leadership it decided.
        let decided = self.ctx.leadership.is_decided();
        let leading = self.ctx.leadership.is_leader();
        // Until the election has answered, this replica is neither leader nor follower: it counts as a
        // leader that has not reconciled, so it is not ready yet.
        self.ctx.health.set_leading(leading || !decided);
        leading
    }

    /// Runs a pass as leader: every item after a trigger that made them all due, else the items whose time has
    /// come; a pass that covered every item is recorded as a full pass.
    async fn pass<R: Reconciler>(&self, generation: &mut Generation<R>) -> Pass {
        generation.refresh_items();
        // A pass in flight is abandoned on shutdown or a lost lease: writes are idempotent applies, and
        // a replica that may no longer hold the lease must not write on.
        let mut lost = self.ctx.leadership.subscribe();
        let ran = tokio::select! {
            biased;
            () = self.ctx.shutdown.cancelled() => return Pass::Shutdown,
            Ok(_) = lost.wait_for(|leading| !*leading) => return Pass::Abandoned,
            ran = generation.run_due(self.metrics, &self.settings) => ran,
        };
        if generation.everything || ran == generation.items.len() {
            self.metrics.series.last_pass.set(unix_now());
            self.ctx.health.mark_reconciled();
        }
        tracing::debug!(ran, full = generation.everything, "pass done");
        generation.everything = false;
        generation.last_pass_end = Some(Instant::now());
        Pass::Finished
    }

    /// Waits for the next reason to run: a configuration or leadership change, a watch's signal (a change waits
    /// out its burst), an item's due time; meanwhile, while the apiserver is unreachable, probes it.
    async fn wait<R: Reconciler>(&mut self, generation: &mut Generation<R>) -> Wake {
        let ctx = self.ctx;
        let health = &ctx.health;
        let next_due = generation.items.values().map(|s| s.due).min();
        let probe_at = self.next_probe;
        let probe = async move {
            tokio::time::sleep_until(probe_at).await;
            ctx.client.apiserver_version().await
        };
        tokio::select! {
            biased;
            () = ctx.shutdown.cancelled() => return Wake::Shutdown,
            changed = self.config.changed() => {
                if changed.is_ok() {
                    tracing::info!("configuration changed: rebuilding watches");
                    return Wake::Reconfigured;
                }
                // The configuration task ended: only at shutdown.
                ctx.shutdown.cancelled().await;
                return Wake::Shutdown;
            }
            changed = self.leadership.changed() => {
                if changed.is_err() {
                    // The election ended: only at shutdown (or after a lost lease, which shuts down).
                    ctx.shutdown.cancelled().await;
                    return Wake::Shutdown;
                }
                generation.everything = true;
            }
            Some(signal) = generation.watches.next() => match signal {
                Signal::Failed(_) => {
                    if health.is_reachable() {
                        self.next_probe = Instant::now() + self.settings.probe_interval;
                    }
                    health.set_reachable(false);
                }
                Signal::Synced(_) => {
                    health.set_watches_synced(generation.watches.all_synced());
                    generation.everything = true;
                    debounce(&mut generation.watches, &self.settings, health).await;
                }
                Signal::Changed(_) => {
                    generation.everything = true;
                    let quiet = generation.last_pass_end.is_none_or(|at| at.elapsed() >= self.settings.debounce);
                    if self.settings.leading_edge && quiet {
                        take_queued(&mut generation.watches, health);
                    } else {
                        debounce(&mut generation.watches, &self.settings, health).await;
                    }
                }
            },
            answer = probe, if !health.is_reachable() => {
                self.next_probe = Instant::now() + self.settings.probe_interval;
                if answer.is_ok() {
                    health.set_reachable(true);
                }
            }
            () = until(next_due) => {}
        }
        Wake::Again
    }
}

impl<R: Reconciler> Generation<R> {
    /// Brings the items to the reconciler's current list: a new item is due now, an item no longer listed is
    /// dropped, and the rest keep their due time and backoff.
    fn refresh_items(&mut self) {
        let now = Instant::now();
        let mut current: BTreeMap<R::Item, ItemState> = BTreeMap::new();
        for item in self.reconciler.items() {
            let state = self.items.remove(&item).unwrap_or(ItemState { due: now, backoff: None });
            current.insert(item, state);
        }
        self.items = current;
    }

    /// Reconciles, in order, every item when `everything` is set, else each item due by the time its turn
    /// comes; returns how many ran.
    async fn run_due(&mut self, metrics: &ReconcileMetrics, settings: &Settings) -> usize {
        let mut ran = 0;
        for (item, state) in self.items.iter_mut() {
            if self.everything || state.due <= Instant::now() {
                run_item(&self.reconciler, item, state, metrics, settings).await;
                ran += 1;
            }
        }
        ran
    }
}

/// Waits until `settings.debounce` has passed without a change, recording syncs and failures meanwhile.
async fn debounce(watches: &mut crate::watch::WatchSet, settings: &Settings, health: &crate::admin::Health) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(settings.debounce) => return,
            Some(signal) = watches.next() => record(signal, watches, health),
        }
    }
}

/// Takes the signals already queued (the rest of a change that arrived together) without waiting, recording
/// syncs and failures as [`debounce`] does.
fn take_queued(watches: &mut crate::watch::WatchSet, health: &crate::admin::Health) {
    while let Some(Some(signal)) = futures::FutureExt::now_or_never(watches.next()) {
        record(signal, watches, health);
    }
}

/// What a signal taken while waiting changes: a change needs nothing more (the pass that follows covers it).
fn record(signal: Signal, watches: &crate::watch::WatchSet, health: &crate::admin::Health) {
    match signal {
        Signal::Failed(_) => health.set_reachable(false),
        Signal::Synced(_) => health.set_watches_synced(watches.all_synced()),
        Signal::Changed(_) => {}
    }
}

async fn run_item<R: Reconciler>(
    reconciler: &R,
    item: &R::Item,
    state: &mut ItemState,
    metrics: &ReconcileMetrics,
    settings: &Settings,
) {
    let span = tracing::info_span!("reconcile", object = %item);
    let result = metrics.observe(reconciler.reconcile(item)).instrument(span.clone()).await;
    let now = Instant::now();
    match result {
        Ok(requeue) => {
            state.backoff = None;
            state.due = now + requeue.unwrap_or(settings.resync).min(settings.resync);
        }
        Err(e) => {
            let backoff = state.backoff.get_or_insert_with(|| settings.backoff.build());
            let delay = backoff.next().unwrap_or(settings.resync);
            span.in_scope(|| {
                tracing::warn!(reason = e.reason(), error = %e, retry_in = ?delay, "reconcile failed");
            });
            state.due = now + delay;
        }
    }
}

/// An item as the driver names it in spans and logs: `<kind>/<name>` (`bundle/kcp-ca`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Named {
    pub kind: &'static str,
    pub name: String,
}

impl Named {
    pub fn new(kind: &'static str, name: impl Into<String>) -> Self {
        Self { kind, name: name.into() }
    }
}

impl std::fmt::Display for Named {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
    #[strum(serialize_all = "snake_case")]
    enum TestError {
        #[error("source missing")]
        SourceMissing,
        #[error("write failed: {0}")]
        WriteFailed(String),
    }

    #[test]
    fn error_reasons_come_from_variant_names_and_cover_every_variant() {
        assert_eq!(TestError::reasons(), ["source_missing", "write_failed"]);
        assert_eq!(TestError::WriteFailed("x".into()).reason(), "write_failed");
        assert_eq!(TestError::SourceMissing.reason(), "source_missing");
    }

    #[test]
    fn every_reason_is_exported_at_zero_before_any_error() {
        let mut registry = Registry::default();
        let _ = ReconcileMetrics::register::<TestError>(&mut registry);
        let text = crate::metrics::encode(&registry);
        assert!(text.contains("reconcile_errors_total{reason=\"source_missing\"} 0"), "{text}");
        assert!(text.contains("reconcile_errors_total{reason=\"write_failed\"} 0"), "{text}");
        assert!(text.contains("reconcile_duration_seconds_count 0"), "{text}");
    }

    #[tokio::test]
    async fn observe_times_the_reconcile_and_counts_its_error_by_reason() {
        let mut registry = Registry::default();
        let metrics = ReconcileMetrics::register::<TestError>(&mut registry);
        let _ = metrics.observe(async { Err::<(), _>(TestError::WriteFailed("boom".into())) }).await;
        let _ = metrics.observe(async { Ok::<_, TestError>(()) }).await;
        let text = crate::metrics::encode(&registry);
        assert!(text.contains("reconcile_errors_total{reason=\"write_failed\"} 1"), "{text}");
        assert!(text.contains("reconcile_duration_seconds_count 2"), "{text}");
    }

    #[test]
    fn backoff_grows_with_jitter_up_to_its_cap_and_resets_after_success() {
        let mut backoff = default_backoff().build();
        let delays: Vec<Duration> = (0..10).map(|_| backoff.next().unwrap()).collect();
        // Jitter adds up to one more delay: attempt n lies in [2^n, 2^(n+1)) seconds, capped at 60 (+60).
        for (n, delay) in delays.iter().enumerate().take(5) {
            let base = Duration::from_secs(1 << n);
            assert!(*delay >= base && *delay < 2 * base, "attempt {n}: {delay:?}");
        }
        assert!(delays[9] >= Duration::from_secs(60) && delays[9] <= Duration::from_secs(120), "{:?}", delays[9]);
        let distinct: std::collections::BTreeSet<_> =
            (0..5).map(|_| default_backoff().build().next().unwrap()).collect();
        assert!(distinct.len() > 1, "jitter makes first delays differ: {distinct:?}");
        // A success drops the item's backoff (`run_item`); the next failure starts a fresh one.
        let mut backoff = default_backoff().build();
        assert!(backoff.next().unwrap() < Duration::from_secs(2), "a success resets the backoff");
    }
}
