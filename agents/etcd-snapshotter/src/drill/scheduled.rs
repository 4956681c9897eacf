//! The installation drill on its schedule (`drills.installation`) in the daemon: run by the leader only, each
//! tick recorded on the Lease as `installation-drill` (so two replicas drill a tick once), in the snapshots' turn
//! unless `drills.alongsideSnapshots`, bounded by `drills.timeout`. Every shard is restored to the newest time
//! every shard reaches (`latest-consistent`) and served by a real kcp, exactly as `drill --installation` does
//! ([`super::installation`]); nothing is written to the bucket.
//!
//! The outcome is what the metrics and Events say, never whether a process is alive: a pass sets the point it
//! proved, a failure counts each failed shard by reason and names them in a Warning Event. A shutdown drops the
//! drill in flight: every shard's scratch kills its processes and removes its directory before the process exits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::ObjectReference;
use kcp_keeper_runtime::events::{EventType, Recorder};
use kcp_keeper_runtime::metrics::{GaugeF64, at_zero, unix_now};
use kcp_keeper_runtime::schedule::Tick;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use strum::VariantNames;
use tokio_util::sync::CancellationToken;

use super::installation::{self, Installation, Tools};
use crate::config::Config;
use crate::error::DrillError;
use crate::labels::{FailureLabels, RetryLabels};
use crate::plan::At;
use crate::storage::Store;

/// `result`: `passed` or `failed`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// The results an installation drill counts, each exported at 0 from the start.
pub const RESULTS: [&str; 2] = ["passed", "failed"];

kcp_keeper_runtime::metrics! {
    /// `etcd_snapshotter_installation_drill*`: the scheduled installation drill, run by the leader only
    /// (followers keep 0, so alerts take the max over replicas). Registered by `crate::metrics::Metrics`.
    pub struct InstallationDrillMetrics {
        pub runs: Family<ResultLabel, Counter> => "installation_drills",
            "Scheduled installation drills (every shard at one point, a real kcp on each), by result";
        pub last_success: GaugeF64 => "installation_drill_last_success_timestamp" [Seconds],
            "When the last scheduled installation drill passed (0: never since start)";
        pub last_failure: GaugeF64 => "installation_drill_last_failure_timestamp" [Seconds],
            "When the last scheduled installation drill failed (0: never since start)";
        /// The point every shard was restored to by the last drill that passed: the installation is proven
        /// restorable, consistently across shards, to this time.
        pub point: GaugeF64 => "installation_drill_point_timestamp" [Seconds],
            "The point in time the last passing installation drill restored every shard to (0: none since start)";
        pub duration: GaugeF64 => "installation_drill_duration" [Seconds],
            "Wall time of the last scheduled installation drill";
        /// Each shard that failed in an installation drill, by [`DrillError`] reason.
        pub shard_failures: Family<FailureLabels, Counter> => "installation_drill_shard_failures",
            "Shards that failed in a scheduled installation drill, by shard and reason";
        /// The longest gap between firings of `drills.installation.schedule`; 0 when it is not scheduled.
        pub schedule_interval: GaugeF64 => "installation_drill_schedule_interval" [Seconds],
            "Longest gap between consecutive firings of the installation drill's schedule (0: not scheduled)";
    }
}

impl InstallationDrillMetrics {
    /// Every series at 0 (the interval set) before the first drill.
    pub fn init(&self, config: &Config) {
        at_zero(&self.runs, RESULTS.map(|result| ResultLabel { result: result.into() }));
        let gap =
            config.drills.installation.as_ref().map(|i| crate::cadence::longest_gap(&i.schedule, chrono::Utc::now()));
        self.schedule_interval.set(gap.unwrap_or(Duration::ZERO).as_secs_f64());
        let reasons = config.shards.iter().flat_map(|shard| {
            DrillError::VARIANTS
                .iter()
                .map(|reason| FailureLabels { shard: shard.name.clone(), reason: reason.to_string() })
        });
        at_zero(&self.shard_failures, reasons);
    }

    fn counted(&self, result: &str) {
        self.runs.get_or_create(&ResultLabel { result: result.into() }).inc();
    }
}

/// The scheduled installation drill of one configuration.
pub struct Job {
    pub config: Arc<Config>,
    pub metrics: InstallationDrillMetrics,
    /// `etcd_snapshotter_retries_total`: the drill's S3 requests count their retries there.
    pub retries: Family<RetryLabels, Counter>,
    pub events: Arc<Recorder>,
    pub regarding: Arc<ObjectReference>,
    pub shutdown: CancellationToken,
    /// The snapshots' turn, or the drills' own with `drills.alongsideSnapshots`.
    pub turn: Arc<tokio::sync::Mutex<()>>,
}

impl Job {
    /// The tick's drill, in its turn, within `drills.timeout`; dropped (and cleaned up) on shutdown.
    pub async fn drill(&self, tick: Tick) {
        let _turn = self.turn.lock().await;
        let timeout = self.config.drills.timeout;
        let started = Instant::now();
        let drilled = tokio::select! {
            biased;
            // Dropping the drill kills every shard's processes and removes every shard's directory.
            () = self.shutdown.cancelled() => {
                tracing::warn!(tick = %tick.at, "shutdown: the installation drill in flight was stopped and cleaned up");
                return;
            }
            drilled = tokio::time::timeout(timeout, self.run()) => drilled,
        };
        self.metrics.duration.set(started.elapsed().as_secs_f64());
        match drilled {
            Ok(Ok(installation)) => self.finished(&tick, &installation).await,
            Ok(Err(error)) => self.failed(&tick, &format!("{error:#}"), &[]).await,
            Err(_) => {
                let why = format!("timeout: the installation drill did not finish within {timeout:?}");
                self.failed(&tick, &why, &[]).await;
            }
        }
    }

    /// Every configured shard at the newest point every shard reaches (see [`installation::drill`]).
    async fn run(&self) -> anyhow::Result<Installation> {
        let drills = &self.config.drills;
        let kcp = drills.kcp.as_deref().context("the installation drill needs drills.kcp")?;
        let store = Store::new(&self.config.storage)?.counting_retries(self.retries.clone());
        let tools = Tools {
            etcdutl: &drills.etcdutl,
            etcd: &drills.etcd,
            kcp: Some(kcp),
            scratch_root: &drills.directory,
            identity_file: drills.identity_file.as_deref(),
            signing: self.config.delta_key.as_ref(),
        };
        installation::drill(&store, &self.config, At::LatestConsistent, &tools).await
    }

    /// A drill that ran to the end: passed when every shard did, failed naming each shard that did not.
    async fn finished(&self, tick: &Tick, installation: &Installation) {
        let (lines, verdict) = installation::summary(installation);
        let Some(verdict) = verdict else {
            self.metrics.counted("passed");
            self.metrics.point.set(installation.at.timestamp_millis() as f64 / 1000.0);
            self.metrics.last_success.set(unix_now());
            let at = crate::clock::stamp(installation.at);
            tracing::info!(tick = %tick.at, %at, "installation drill passed");
            let note = format!("installation drill of tick {}: {}", tick.at.to_rfc3339(), lines.join("; "));
            let (kind, reason) = (EventType::Normal, "InstallationDrillPassed");
            return self.events.publish(&self.regarding, kind, reason, "InstallationDrill", &note).await;
        };
        let failed: Vec<_> =
            installation.shards.iter().filter_map(|s| Some((&s.shard, s.result.as_ref().err()?))).collect();
        for (shard, error) in &failed {
            let reason: &'static str = (*error).into();
            self.metrics
                .shard_failures
                .get_or_create(&FailureLabels { shard: (*shard).clone(), reason: reason.into() })
                .inc();
        }
        let failed_lines: Vec<_> = lines.into_iter().filter(|l| l.starts_with("FAILED ")).collect();
        self.failed(tick, &verdict, &failed_lines).await;
    }

    /// Counts a failed drill and says so in a Warning Event ([`failed_note`]).
    async fn failed(&self, tick: &Tick, why: &str, lines: &[String]) {
        self.metrics.counted("failed");
        self.metrics.last_failure.set(unix_now());
        tracing::error!(tick = %tick.at, why, "installation drill failed");
        let note = failed_note(tick.at, why, lines);
        let kind = EventType::Warning;
        self.events.publish(&self.regarding, kind, "InstallationDrillFailed", "InstallationDrill", &note).await;
    }
}

/// The failed drill's note: `why` first (it names every failed shard with its reason, or why no shard was
/// drilled), then each failed shard's line: the Event's limit cuts the lines, never the names.
fn failed_note(tick: chrono::DateTime<chrono::Utc>, why: &str, lines: &[String]) -> String {
    let mut note = format!("installation drill of tick {} failed: {why}", tick.to_rfc3339());
    for line in lines {
        note.push_str("; ");
        note.push_str(line);
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drill::installation::ShardResult;

    #[test]
    fn the_failed_note_names_every_failed_shard_with_its_reason_before_their_lines() {
        let at = chrono::DateTime::parse_from_rfc3339("2026-12-01T12:00:00Z").unwrap().with_timezone(&chrono::Utc);
        let shard = |name: &str, result| ShardResult { shard: name.into(), result };
        let installation = Installation {
            at,
            shards: vec![
                shard("root", Ok("read".into())),
                shard("alpha", Err(DrillError::Kcp("workspace root:x: 404 NotFound".into()))),
            ],
        };
        let (lines, verdict) = installation::summary(&installation);
        let failed: Vec<_> = lines.into_iter().filter(|l| l.starts_with("FAILED ")).collect();
        let note = failed_note(at, &verdict.unwrap(), &failed);
        assert_eq!(
            note,
            "installation drill of tick 2026-12-01T12:00:00+00:00 failed: the installation drill at \
             2026-12-01T12:00:00.000Z failed on 1 shard(s): alpha (kcp); FAILED alpha at 2026-12-01T12:00:00.000Z: \
             kcp: kcp level: workspace root:x: 404 NotFound"
        );
    }
}
