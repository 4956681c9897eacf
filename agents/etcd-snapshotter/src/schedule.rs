//! The daemon's schedules (`etcd-snapshotter run`): one cron schedule per shard on the runtime's schedules (leader only, each tick
//! recorded on the Lease before it runs, so two replicas take one snapshot per tick), one snapshot at a time
//! (the memory budget is the process's, not a shard's), each under `finish_or_abort` so a shutdown aborts the
//! multipart upload rather than leaving it half done. Retention runs only after a published snapshot.
//!
//! Restore drills run on each shard's own drill schedule the same way (leader only, the tick recorded on the
//! Lease as `drill-<shard>`), one drill at a time (a drill restores a whole database to local disk), and not
//! while a snapshot runs unless `drills.alongsideSnapshots` says the pod holds both. A shutdown drops the drill in flight: its scratch kills its processes and removes its
//! directory before the process exits. The installation drill (`drills.installation`, `crate::drill::scheduled`)
//! runs the same way on its own schedule, recorded as `installation-drill`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kcp_keeper_runtime::agent::Context;
use kcp_keeper_runtime::events::{EventType, Recorder};
use kcp_keeper_runtime::lease::Leadership;
use kcp_keeper_runtime::schedule::{self, Schedule, Tick};
use kcp_keeper_runtime::shutdown::Grace;
use tokio_util::sync::CancellationToken;

use crate::catalog;
use crate::config::{Config, Deltas, Shard};
use crate::delta::writer::{End, Writer};
use crate::drill::older_choice;
use crate::drill::run::{self as drill_run, Outcome};
use crate::error::{DrillError, SnapshotError};
use crate::generation;
use crate::labels::{FailureLabels, RetryLabels};
use crate::metrics::Metrics;
use crate::scope::{self, Lease};
use crate::snapshot;
use crate::storage::Store;
use crate::throwaway as scratch;

/// How long a scheduled snapshot waits while another run (a one-shot, an old leader in its grace) holds the
/// shard's lock before it fails with reason `busy`.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// The daemon: the schedules of every shard until shutdown, restarted when the configuration changes. Events
/// are about `lease`, the agent's own.
pub async fn run(mut ctx: Context<Config>, metrics: Metrics, lease: Lease) -> anyhow::Result<()> {
    let one_at_a_time = Arc::new(tokio::sync::Mutex::new(()));
    let one_drill_at_a_time = Arc::new(tokio::sync::Mutex::new(()));
    let regarding = Arc::new(lease.regarding());
    let mut first = true;
    loop {
        let config = ctx.config.borrow_and_update().clone();
        if std::mem::take(&mut first) {
            // Only before any drill of this process runs: what a killed predecessor left is not in use.
            scratch::remove_leftovers(&config.drills.directory);
        }
        metrics.configure(&config.spill);
        metrics.installation.init(&config);
        for shard in &config.shards {
            metrics.init_shard(shard);
        }
        // Ready only once the bucket answered: a replica that cannot reach storage does nothing useful.
        if !wait_for_storage(&config, &metrics, &ctx.shutdown).await {
            return Ok(());
        }
        // Start-up's code (configuration, TLS, clients) is not needed again until the first tick, which an hourly
        // schedule puts up to an hour away: the same release as after each run (`release_resident`).
        kcp_keeper_runtime::release_resident::release();
        ctx.health.mark_synced();
        let schedules = ctx.shutdown.child_token();
        let mut tasks = tokio::task::JoinSet::new();
        // On-demand snapshots by object: each shard's snapshot job, as a scheduled run takes it.
        let mut on_demand: std::collections::BTreeMap<String, crate::requests::Snapshotter> = Default::default();
        // The objects mirroring the bucket: a pass after every snapshot and drill (`Job::changed`).
        let objects = config.snapshot_objects.then(|| Arc::new(tokio::sync::Notify::new()));
        if let Some(nudge) = objects.clone() {
            let (config, metrics, client) = (config.clone(), metrics.clone(), ctx.client.clone());
            let (namespace, leadership, token) = (ctx.namespace.clone(), ctx.leadership.clone(), schedules.clone());
            tasks.spawn(crate::objects::run(config, metrics, client, namespace, leadership, nudge, token));
        }
        for shard in config.shards.clone() {
            let job = |one_at_a_time: &Arc<tokio::sync::Mutex<()>>| {
                Arc::new(Job {
                    config: config.clone(),
                    shard: shard.clone(),
                    metrics: metrics.clone(),
                    events: ctx.events.clone(),
                    regarding: regarding.clone(),
                    shutdown: ctx.shutdown.clone(),
                    one_at_a_time: one_at_a_time.clone(),
                    objects: objects.clone(),
                })
            };
            let snapshots = job(&one_at_a_time);
            let requested = snapshots.clone();
            on_demand.insert(
                shard.name.clone(),
                Arc::new(move || {
                    let job = requested.clone();
                    Box::pin(async move { job.published(None).await })
                }),
            );
            if let Some(deltas) = shard.deltas.clone() {
                let (job, leadership, token) = (snapshots.clone(), ctx.leadership.clone(), schedules.clone());
                tasks.spawn(async move { job.deltas_while_leading(deltas, leadership, token).await });
            }
            // etcd health: every replica reads it (read-only calls), the alerts take the max over replicas.
            let (health_shard, health_metrics, token) = (shard.clone(), metrics.clone(), schedules.clone());
            tasks.spawn(async move { crate::health::run(&health_shard, &health_metrics, &token).await });
            spawn_schedule(&mut tasks, &ctx, &schedules, shard.schedule.clone(), move |tick| {
                let job = snapshots.clone();
                async move { job.snapshot_within_tick(tick).await }
            });
            if let Some(defrag) = shard.defrag.clone() {
                // In the snapshots' turn: a scheduled snapshot does not stream from a member being rewritten.
                let defrags = job(&one_at_a_time);
                spawn_schedule(&mut tasks, &ctx, &schedules, defrag.schedule.clone(), move |tick| {
                    let (job, defrag) = (defrags.clone(), defrag.clone());
                    async move { job.defrag(tick, &defrag).await }
                });
            }
            let Some(drill) = shard.drill.clone() else { continue };
            // By default a drill takes the snapshots' turn: a drill restores a whole database beside the
            // snapshot's memory budget and spill, and a pod sized for one of them would be OOM-killed or evicted
            // mid-snapshot by both at once.
            let drills = job(if config.drills.alongside_snapshots { &one_drill_at_a_time } else { &one_at_a_time });
            spawn_schedule(&mut tasks, &ctx, &schedules, drill.schedule, move |tick| {
                let job = drills.clone();
                async move { job.drill(tick).await }
            });
        }
        if config.snapshot_objects {
            let (client, namespace, leadership) = (ctx.client.clone(), ctx.namespace.clone(), ctx.leadership.clone());
            tasks.spawn(crate::requests::run(client, namespace, leadership, on_demand, schedules.clone()));
        }
        let drills_turn = if config.drills.alongside_snapshots { &one_drill_at_a_time } else { &one_at_a_time };
        spawn_installation_drill(&mut tasks, &ctx, &config, &metrics, (drills_turn, regarding.clone()), &schedules);
        spawn_upgrade_watches(&mut tasks, &ctx, &config, &metrics, (&one_at_a_time, drills_turn), &schedules);
        if config.secondary.is_some() {
            // The second store's copy passes: on their own, never in the snapshots' turn or their way.
            let (config, metrics, leadership) = (config.clone(), metrics.clone(), ctx.leadership.clone());
            tasks.spawn(crate::secondary::run(config, metrics, leadership, schedules.clone()));
        }
        tokio::select! {
            () = ctx.shutdown.cancelled() => {}
            changed = ctx.config.changed() => if changed.is_ok() {
                tracing::info!("configuration changed: restarting the schedules after the snapshot in flight");
            },
        }
        // A snapshot in flight finishes (or is aborted by its own shutdown guard) before the schedules restart.
        schedules.cancel();
        while tasks.join_next().await.is_some() {}
        if ctx.shutdown.is_cancelled() {
            return Ok(());
        }
    }
}

/// A snapshot before every kcp upgrade (`crate::upgrade`) of each object the scope watches, by the leader, in
/// the snapshots' turn (its drill in the drills' turn), until `schedules` is cancelled.
fn spawn_upgrade_watches(
    tasks: &mut tokio::task::JoinSet<()>,
    ctx: &Context<Config>,
    config: &Arc<Config>,
    metrics: &Metrics,
    (snapshots_turn, drills_turn): (&Arc<tokio::sync::Mutex<()>>, &Arc<tokio::sync::Mutex<()>>),
    schedules: &CancellationToken,
) {
    for (shard, watched) in scope::watched(config) {
        let watch = crate::upgrade::watch::Watch {
            config: config.clone(),
            shard: shard.clone(),
            watched: watched.clone(),
            metrics: metrics.clone(),
            events: ctx.events.clone(),
            client: ctx.client.clone(),
            snapshots_turn: snapshots_turn.clone(),
            drills_turn: drills_turn.clone(),
            shutdown: ctx.shutdown.clone(),
        };
        tasks.spawn(watch.while_leading(ctx.leadership.clone(), schedules.clone()));
    }
}

/// The installation drill on `drills.installation.schedule` (`crate::drill::scheduled`), when configured: by the
/// leader, each tick once across replicas (recorded on the Lease as `installation-drill`), in `turn`.
fn spawn_installation_drill(
    tasks: &mut tokio::task::JoinSet<()>,
    ctx: &Context<Config>,
    config: &Arc<Config>,
    metrics: &Metrics,
    (turn, regarding): (&Arc<tokio::sync::Mutex<()>>, Arc<ObjectReference>),
    schedules: &CancellationToken,
) {
    let Some(installation) = &config.drills.installation else { return };
    let job = Arc::new(crate::drill::scheduled::Job {
        config: config.clone(),
        metrics: metrics.installation.clone(),
        retries: metrics.retries.clone(),
        events: ctx.events.clone(),
        regarding,
        shutdown: ctx.shutdown.clone(),
        turn: turn.clone(),
    });
    spawn_schedule(tasks, ctx, schedules, installation.schedule.clone(), move |tick| {
        let job = job.clone();
        async move { job.drill(tick).await }
    });
}

/// Runs `job` on `schedule` while this replica leads, until `schedules` is cancelled.
fn spawn_schedule<C, F, Fut>(
    tasks: &mut tokio::task::JoinSet<()>,
    ctx: &Context<C>,
    schedules: &CancellationToken,
    schedule: Schedule,
    job: F,
) where
    F: FnMut(Tick) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (record, leadership, token) = (ctx.lease_record.clone(), ctx.leadership.clone(), schedules.clone());
    tasks.spawn(schedule::run(schedule, record, leadership, token, job));
}

/// Waits until the bucket answers; false if shutdown came first.
async fn wait_for_storage(config: &Config, metrics: &Metrics, shutdown: &CancellationToken) -> bool {
    let mut delay = std::time::Duration::from_secs(1);
    loop {
        let result = match Store::new(&config.storage) {
            Ok(store) => store.reachable().await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => {
                metrics.storage_reachable.set(1);
                return true;
            }
            Err(error) => {
                metrics.storage_reachable.set(0);
                tracing::warn!(%error, "the bucket does not answer; not ready");
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(std::time::Duration::from_secs(30));
    }
}

struct Job {
    config: Arc<Config>,
    shard: Shard,
    metrics: Metrics,
    events: Arc<Recorder>,
    regarding: Arc<ObjectReference>,
    shutdown: CancellationToken,
    one_at_a_time: Arc<tokio::sync::Mutex<()>>,
    /// Wakes the objects' pass (`snapshotObjects`).
    objects: Option<Arc<tokio::sync::Notify>>,
}

impl Job {
    /// What the bucket holds changed (a snapshot published, a drill reported): the objects follow.
    fn changed(&self) {
        if let Some(nudge) = &self.objects {
            nudge.notify_one();
        }
    }

    /// One run of the tick's snapshot (no tick: one the delta writer needs, its start revision compacted
    /// away): `Some(reason)` when it failed.
    async fn snapshot(&self, tick: Option<&Tick>) -> Option<&'static str> {
        self.published(tick).await.err()
    }

    /// [`Self::snapshot`], with the published snapshot's id.
    async fn published(&self, tick: Option<&Tick>) -> Result<String, &'static str> {
        let _turn = self.one_at_a_time.lock().await;
        let shard = &self.shard.name;
        let started = std::time::Instant::now();
        // Credentials are read per run, so a rotated Secret is used without a restart.
        let store = match Store::new(&self.config.storage).map(|s| s.counting_retries(self.metrics.retries.clone())) {
            Ok(store) => store,
            Err(e) => return Err(self.snapshot_failed(&SnapshotError::Storage(e), started).await),
        };
        let waiting = |holder: &str| tracing::warn!(shard, holder, "another run holds the shard's lock; waiting");
        let run = snapshot::Run {
            tick: tick.map(|t| t.at),
            progress: None,
            command: "run",
            lock_wait: LOCK_WAIT,
            waiting: &waiting,
            kcp: None,
            roll: None,
        };
        let taken = snapshot::take_until(
            &self.config,
            &self.shard,
            &store,
            &self.metrics,
            run,
            &self.shutdown,
            Grace::default(),
        )
        .await;
        // Until the next run, the process needs none of the run's code resident (`release_resident`: about 7 MiB less).
        kcp_keeper_runtime::release_resident::release();
        let snapshot::Taken { manifest, retention } = match taken {
            Ok(taken) => taken,
            Err(error) => return Err(self.snapshot_failed(&error, started).await),
        };
        tracing::info!(
            shard, id = manifest.id, tick = ?tick.map(|t| t.at), revision = manifest.revision, keys = manifest.key_count,
            bytes = manifest.object_size_bytes, seconds = manifest.total_seconds, "snapshot published"
        );
        let note = format!(
            "snapshot {} of shard {shard}: revision {}, {} keys, {} bytes in {:.1}s",
            manifest.id, manifest.revision, manifest.key_count, manifest.object_size_bytes, manifest.total_seconds
        );
        self.events.publish(&self.regarding, EventType::Normal, "SnapshotTaken", "Snapshot", &note).await;
        self.changed();
        if let Ok(report) = retention
            && report.other_clusters > 0
        {
            let note = format!(
                "{} snapshot(s) of other etcd clusters under shard {shard}'s directory (another installation on \
                 the prefix, or the shard's etcd before it was re-created): not used by latest, drills or \
                 retention, and never deleted; `list` shows them",
                report.other_clusters
            );
            self.events.publish(&self.regarding, EventType::Warning, "OtherClusterSnapshots", "Retention", &note).await;
        }
        Ok(manifest.id)
    }

    /// The shard's delta writer while this replica leads, until `token` is cancelled: session after session
    /// (`delta::writer`), each starting from what the store holds. A compacted start revision takes a full
    /// snapshot (in the snapshots' turn, under the shard's lock), counted in `delta_compacted_total`; so does a
    /// shard with no full snapshot yet.
    async fn deltas_while_leading(&self, deltas: Deltas, mut leadership: Leadership, token: CancellationToken) {
        let shard = self.shard.name.clone();
        let label = self.metrics.shard(&shard);
        let writer = Writer {
            config: self.config.clone(),
            shard: self.shard.clone(),
            deltas: deltas.clone(),
            metrics: self.metrics.clone(),
        };
        loop {
            tokio::select! {
                () = token.cancelled() => return,
                () = leadership.wait_until_leader() => {}
            }
            // Ends when this replica stops leading or the schedules stop.
            let session = leadership.session(&token);
            let end = writer.session(&session).await;
            session.cancel();
            let pause = match end {
                Ok(End::Compacted) => {
                    self.metrics.delta.compacted.get_or_create(&label).inc();
                    if self.snapshot(None).await.is_some() { deltas.interval } else { Duration::ZERO }
                }
                Ok(End::Blocked) => {
                    self.metrics.delta.failures.get_or_create(&label).inc();
                    tracing::error!(shard, "the delta chain is blocked: taking a full snapshot to start a new one");
                    if self.snapshot(None).await.is_some() { deltas.interval } else { Duration::ZERO }
                }
                Ok(End::NoSnapshot) => {
                    // Continuous protection needs a base: the first full snapshot now, not at the next tick.
                    tracing::info!(shard, "no full snapshot of the shard yet: taking one for the deltas to chain to");
                    if self.snapshot(None).await.is_some() { deltas.interval } else { Duration::ZERO }
                }
                Ok(End::NewSnapshot | End::Raced | End::Stopped) => Duration::ZERO,
                Err(error) => {
                    self.metrics.delta.failures.get_or_create(&label).inc();
                    tracing::warn!(shard, error = %format!("{error:#}"), "delta session failed; starting again from the store");
                    deltas.interval
                }
            };
            tokio::select! {
                () = token.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    async fn snapshot_failed(&self, error: &SnapshotError, started: std::time::Instant) -> &'static str {
        let shard = &self.shard.name;
        let reason: &'static str = error.into();
        self.metrics.failed(shard, error);
        self.metrics.duration.get_or_create(&self.metrics.shard(shard)).set(started.elapsed().as_secs_f64());
        tracing::error!(shard, reason, error = %error, "snapshot failed; nothing was published and retention did not run");
        let note = format!("snapshot of shard {shard} failed ({reason}): {error}");
        self.events.publish(&self.regarding, EventType::Warning, "SnapshotFailed", "Snapshot", &note).await;
        reason
    }

    /// The tick's snapshot, run again after a failure while the tick's retry window lasts (`retry` in the
    /// configuration), so one transient failure does not cost the whole interval. Each run again is counted
    /// as `etcd_snapshotter_retries_total{op="snapshot_run",reason=<the failed run's reason>}`.
    async fn snapshot_within_tick(&self, tick: Tick) {
        let shard = &self.shard.name;
        let mut runs = 0;
        while let Some(reason) = self.snapshot(Some(&tick)).await {
            runs += 1;
            if reason == "interrupted" || self.shutdown.is_cancelled() {
                return;
            }
            let next = self.shard.schedule.next_tick(tick.at);
            let Some(wait) = self.config.retry.wait_before_next(tick.at, next, chrono::Utc::now(), runs) else {
                tracing::warn!(shard, runs, tick = %tick.at, "no time left in the tick's retry window; the next tick runs");
                return;
            };
            tracing::warn!(
                shard,
                reason,
                runs,
                wait_seconds = wait.as_secs_f64(),
                "the run failed; running it again within its tick"
            );
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            let labels = RetryLabels { op: crate::retries::OP_RUN.into(), reason: reason.into() };
            self.metrics.retries.get_or_create(&labels).inc();
        }
    }
}

/// A shard's scheduled defragmentation (`crate::defrag`): a full snapshot first, then the members one at a
/// time in the snapshots' turn.
impl Job {
    async fn defrag(&self, tick: Tick, defrag: &crate::config::Defrag) {
        let shard = &self.shard.name;
        let report = if let Some(reason) = self.snapshot(None).await {
            crate::defrag::Report { members: vec![], stopped: Some(crate::defrag::Stopped::SnapshotFailed(reason)) }
        } else {
            let _turn = self.one_at_a_time.lock().await;
            let mut done = |d: &crate::defrag::Done| {
                tracing::info!(
                    shard,
                    member = d.member,
                    result = d.result.as_str(),
                    seconds = d.seconds,
                    "defrag: member done"
                );
            };
            let run = crate::defrag::run::run(&self.shard, defrag.into(), &mut done);
            tokio::select! {
                report = run => report,
                // etcd finishes a defragmentation it started on its own; the next member is not started.
                () = self.shutdown.cancelled() => {
                    tracing::warn!(shard, "shutdown: the defragmentation run stopped");
                    return;
                }
            }
        };
        self.metrics.defrag.finished(shard, &report);
        let summary = report.summary();
        if report.stopped.is_some() {
            tracing::error!(shard, tick = %tick.at, summary, "defragmentation stopped");
            let note = format!("defragmentation of shard {shard} (tick {}) stopped: {summary}", tick.at.to_rfc3339());
            self.events.publish(&self.regarding, EventType::Warning, "DefragStopped", "Defrag", &note).await;
        } else {
            tracing::info!(shard, tick = %tick.at, summary, "defragmentation done");
            let note = format!("defragmentation of shard {shard} (tick {}): {summary}", tick.at.to_rfc3339());
            self.events.publish(&self.regarding, EventType::Normal, "Defragmented", "Defrag", &note).await;
        }
    }
}

/// A shard's scheduled drill: the newest snapshot every tick, and at the configured rate also a random older
/// retained one.
impl Job {
    async fn drill(&self, tick: Tick) {
        let _turn = self.one_at_a_time.lock().await;
        let shard = &self.shard.name;
        let store = match Store::new(&self.config.storage).map(|s| s.counting_retries(self.metrics.retries.clone())) {
            Ok(store) => store,
            Err(e) => return self.drill_failed(&tick, shard, &DrillError::Storage(e.to_string())).await,
        };
        let listed = match catalog::list(&store, Some(shard)).await {
            Ok(listed) => listed,
            Err(e) => return self.drill_failed(&tick, shard, &DrillError::Storage(e.to_string())).await,
        };
        // Only the shard's own cluster's snapshots: another installation's newest is not this shard's.
        let listed: Vec<_> = match generation::live(&self.shard).await {
            Some(own) => listed.into_iter().filter(|m| own.owns(m)).collect(),
            None => match generation::only_cluster(&listed) {
                Ok(_) => listed,
                Err(e) => return self.drill_failed(&tick, shard, &DrillError::NoSnapshot(e)).await,
            },
        };
        let Some(newest) = listed.first() else {
            let error = DrillError::NoSnapshot(format!("shard {shard} has no published snapshot"));
            return self.drill_failed(&tick, shard, &error).await;
        };
        let mut ids = vec![newest.id.clone()];
        let rate = self.shard.drill.as_ref().map(|d| d.older_rate).unwrap_or(0.0);
        if let Some(older) = older_choice(&listed, rate, rand::random::<f64>(), rand::random::<f64>()) {
            ids.push(older.id.clone());
        }
        let kcp = self.shard.drill.as_ref().and_then(|d| d.kcp.as_ref());
        for id in ids {
            let drill = drill_run::drill_and_record(&self.config.drills, kcp, &store, &id);
            let outcome = tokio::select! {
                outcome = drill => outcome,
                // Dropping the drill kills its processes and removes its directory (its Scratch).
                () = self.shutdown.cancelled() => {
                    let error = DrillError::Interrupted;
                    let reason: &'static str = (&error).into();
                    tracing::warn!(shard, id, reason, "shutdown: the drill in flight was stopped and cleaned up");
                    // Counted, but not as the shard's last failure: a restart says nothing about the snapshot.
                    self.metrics.drill.failures.get_or_create(&FailureLabels {
                        shard: shard.clone(), reason: reason.into(),
                    }).inc();
                    return;
                }
            };
            self.drill_finished(&tick, &outcome).await;
        }
    }

    async fn drill_finished(&self, tick: &Tick, outcome: &Outcome) {
        let shard = &self.shard.name;
        let report = &outcome.report;
        self.metrics.drill_outcome(shard, outcome);
        self.changed();
        if let Some(seconds) = report.restore_seconds {
            self.metrics.drill.restore.get_or_create(&self.metrics.shard(shard)).set(seconds);
        }
        let Err(error) = &outcome.result else {
            tracing::info!(shard, id = report.id, tick = %tick.at, restore_seconds = report.restore_seconds, "drill passed");
            let note = format!("drill of tick {}: {}", tick.at.to_rfc3339(), drill_run::summary(outcome));
            return self.events.publish(&self.regarding, EventType::Normal, "DrillPassed", "Drill", &note).await;
        };
        self.tell_drill_failed(tick, shard, error).await;
    }

    /// A drill that failed before it ran.
    async fn drill_failed(&self, tick: &Tick, shard: &str, error: &DrillError) {
        self.metrics.drill_failed(shard, error);
        self.tell_drill_failed(tick, shard, error).await;
    }

    async fn tell_drill_failed(&self, tick: &Tick, shard: &str, error: &DrillError) {
        let reason: &'static str = error.into();
        tracing::error!(shard, reason, error = %error, tick = %tick.at, "restore drill failed");
        let note = format!("drill of shard {shard} (tick {}) failed ({reason}): {error}", tick.at.to_rfc3339());
        self.events.publish(&self.regarding, EventType::Warning, "DrillFailed", "Drill", &note).await;
    }
}
