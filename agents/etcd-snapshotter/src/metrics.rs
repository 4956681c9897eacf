//! `etcd_snapshotter_*` metrics. Every per-shard series is created at start with a value (failures by every
//! reason at 0, last success at 0), so a shard that never succeeds is visible to alerts as `time() - 0`
//! rather than missing.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use strum::VariantNames;

use kcp_keeper_runtime::metrics::{GaugeF64, at_zero, unix_now};

use crate::error::{DrillError, SnapshotError};
use crate::labels::{ALARMS, AlarmLabels, FailureLabels, MemberLabels, RetryLabels, ShardLabel};
use crate::retries::{OP_REQUEST, OP_RUN, OP_UPLOAD_PART, Reason};

kcp_keeper_runtime::metrics! {
    /// `etcd_snapshotter_member_*` and `leader_changes_total`: etcd health as `health` reads it.
    pub struct HealthMetrics {
        pub db_size: Family<MemberLabels, Gauge> => "member_db_size" [Bytes],
            "Size of the member's database file (etcd's dbSize), read every 15 s";
        pub db_size_in_use: Family<MemberLabels, Gauge> => "member_db_size_in_use" [Bytes],
            "Bytes of the member's database in use (what a defragmentation would leave)";
        pub quota: Family<MemberLabels, Gauge> => "member_db_quota" [Bytes],
            "The member's --quota-backend-bytes as it reports it (0: not reported, etcd before 3.6)";
        pub up: Family<MemberLabels, Gauge> => "member_up",
            "Whether the member answered the last health read (1) or not (0)";
        pub leader_changes: Family<ShardLabel, Counter> => "leader_changes",
            "Changes of the shard's etcd leader seen by this replica's health reads";
    }
}

kcp_keeper_runtime::metrics! {
    pub struct Metrics {
        pub last_success: Family<ShardLabel, GaugeF64> => "last_success_timestamp" [Seconds],
            "When the shard's last snapshot was published (0: never since start)";
        pub duration: Family<ShardLabel, GaugeF64> => "duration" [Seconds], "Duration of the shard's last snapshot run";
        pub object_bytes: Family<ShardLabel, Gauge> => "object" [Bytes], "Size of the last published object";
        pub db_bytes: Family<ShardLabel, Gauge> => "database" [Bytes], "Size of the last streamed etcd database";
        pub revision: Family<ShardLabel, Gauge> => "revision", "Revision of the last published snapshot";
        pub failures: Family<FailureLabels, Counter> => "failures", "Snapshot runs that failed, by reason";
        pub kept: Family<ShardLabel, Gauge> => "snapshots_kept",
            "Published snapshots left after the last retention pass";
        pub spilled: Family<ShardLabel, Counter> => "spilled" [Bytes],
            "Bytes written to the spill directory because S3 lagged";
        pub locked_skipped: Family<ShardLabel, Counter> => "retention_locked_skipped",
            "Snapshots retention would delete but object lock protects";
        /// The correction `clock` adds to this host's clock for the times it records (the upper bound of the
        /// object stores' clock minus this host's, as their answers prove it; 0 while the bounds hold zero).
        pub clock_offset: GaugeF64 => "clock_offset" [Seconds],
            "Correction added to this host's clock for recorded times: the object stores' clock minus this host's";
        pub object_sync_failures: Counter => "object_sync_failures",
            "Passes that could not bring the EtcdSnapshot and EtcdShardBackup objects in line with the bucket";
        pub storage_reachable: Gauge => "storage_reachable",
            "Whether the bucket answered the last request (1) or not (0)";
        pub memory_budget: Gauge => "memory_budget" [Bytes], "Configured bound on snapshot bytes held in memory";
        pub part_size: Gauge => "part_size" [Bytes], "Configured multipart part size";
        pub parts_in_flight_max: Gauge => "parts_in_flight_max", "Configured bound on parts uploading at once";
        pub parts_in_flight: Gauge => "parts_in_flight", "Parts uploading now";
        /// The longest gap between firings of the shard's snapshot schedule (alerts: "no success within 2x").
        pub schedule_interval: Family<ShardLabel, GaugeF64> => "schedule_interval" [Seconds],
            "Longest gap between consecutive firings of the shard's snapshot schedule";
        /// Members of the shard's etcd cluster with the alarm active, as the last run's member probe read them.
        pub alarms: Family<AlarmLabels, Gauge> => "alarms",
            "Members of the shard's etcd cluster with the alarm active (nospace, corrupt), read by the last run";
        /// Snapshots of other etcd clusters under the shard's directory (another installation, or the shard's etcd
        /// before it was re-created), as the last retention pass found them: never used or deleted.
        pub other_clusters: Family<ShardLabel, Gauge> => "other_cluster_snapshots",
            "Snapshots of other etcd clusters under the shard's directory, found by the last retention pass";
        /// Retries of S3 requests and of whole runs, every label pair exported at 0 from the start.
        pub retries: Family<RetryLabels, Counter> => "retries",
            "Retries of S3 requests and of snapshot runs, by op and reason";
        ..
        pub drill: DrillMetrics;
        pub delta: DeltaMetrics;
        pub health: HealthMetrics;
        pub secondary: crate::secondary::metrics::SecondaryMetrics;
        pub upgrade: crate::upgrade::metrics::UpgradeMetrics;
        pub defrag: crate::defrag::metrics::DefragMetrics;
        pub installation: crate::drill::scheduled::InstallationDrillMetrics;
    }
}

kcp_keeper_runtime::metrics! {
    /// `etcd_snapshotter_delta_*`: delta snapshots, written by the leader only (followers export 0).
    pub struct DeltaMetrics {
        /// The time up to which every write of the shard is in the bucket (a full snapshot and its deltas): the
        /// recovery point is `time() - this`. 0 until the first delta session has caught up.
        pub stored_through: Family<ShardLabel, GaugeF64> => "delta_stored_through_timestamp" [Seconds],
            "Time up to which every write of the shard is stored (full snapshot and deltas); time() minus it is the RPO";
        /// The newest source revision stored in a delta.
        pub revision: Family<ShardLabel, Gauge> => "delta_revision", "Newest source revision stored in a delta";
        pub last_write_timestamp: Family<ShardLabel, GaugeF64> => "delta_last_write_timestamp" [Seconds],
            "When the shard's last delta object was written";
        pub objects: Family<ShardLabel, Counter> => "delta_objects", "Delta objects written";
        pub bytes: Family<ShardLabel, Counter> => "delta" [Bytes], "Bytes of delta objects written";
        /// Sessions whose start revision was compacted away (a full snapshot was taken to close the gap).
        pub compacted: Family<ShardLabel, Counter> => "delta_compacted",
            "Delta sessions whose start revision was compacted away, each closed by a full snapshot";
        /// Sessions that ended on an error (etcd, the bucket); the next starts after an interval.
        pub failures: Family<ShardLabel, Counter> => "delta_failures", "Delta sessions that ended on an error";
        /// `deltas.interval`; 0 when the shard has no deltas (the alert's yardstick and selector).
        pub interval: Family<ShardLabel, GaugeF64> => "delta_interval" [Seconds],
            "The shard's deltas.interval (0: no deltas)";
    }
}

kcp_keeper_runtime::metrics! {
    /// `etcd_snapshotter_drill_*`: restore drills (names fixed by contract with the chart's alerts).
    pub struct DrillMetrics {
        pub last_success: Family<ShardLabel, GaugeF64> => "drill_last_success_timestamp" [Seconds],
            "When the shard's last restore drill passed (0: never since start)";
        pub last_failure: Family<ShardLabel, GaugeF64> => "drill_last_failure_timestamp" [Seconds],
            "When the shard's last restore drill failed (0: never since start)";
        pub duration: Family<ShardLabel, GaugeF64> => "drill_duration" [Seconds],
            "Wall time of the shard's last restore drill";
        /// The last measured restore time: `etcdutl snapshot restore` until the throwaway etcd answers.
        pub restore: Family<ShardLabel, GaugeF64> => "drill_restore" [Seconds],
            "Restore time measured by the shard's last drill (etcdutl restore until etcd answers): the RTO";
        pub failures: Family<FailureLabels, Counter> => "drill_failures", "Restore drills that failed, by reason";
        /// The longest gap between firings of the shard's drill schedule; 0 when drills are not scheduled.
        pub schedule_interval: Family<ShardLabel, GaugeF64> => "drill_schedule_interval" [Seconds],
            "Longest gap between consecutive firings of the shard's drill schedule (0: not scheduled)";
    }
}

impl Metrics {
    /// Creates every per-shard series with a value, so none is missing before the first run, and sets the
    /// schedule intervals.
    pub fn init_shard(&self, config: &crate::config::Shard) {
        let shard = config.name.as_str();
        let label = ShardLabel { shard: shard.into() };
        let now = chrono::Utc::now();
        let gap = |s: &kcp_keeper_runtime::schedule::Schedule| crate::cadence::longest_gap(s, now).as_secs_f64();
        self.schedule_interval.get_or_create(&label).set(gap(&config.schedule));
        let drill_gap = config.drill.as_ref().map(|d| gap(&d.schedule)).unwrap_or(0.0);
        self.drill.schedule_interval.get_or_create(&label).set(drill_gap);
        let interval = config.deltas.as_ref().map(|d| d.interval.as_secs_f64()).unwrap_or(0.0);
        self.delta.interval.get_or_create(&label).set(interval);
        let one = || [label.clone()];
        let reasons = |names: &'static [&'static str]| {
            names.iter().map(|reason| FailureLabels { shard: shard.into(), reason: reason.to_string() })
        };
        for family in [&self.drill.last_success, &self.drill.last_failure, &self.drill.duration, &self.drill.restore] {
            at_zero(family, one());
        }
        at_zero(&self.drill.failures, reasons(DrillError::VARIANTS));
        at_zero(&self.failures, reasons(SnapshotError::VARIANTS));
        for family in [&self.last_success, &self.duration, &self.delta.stored_through, &self.delta.last_write_timestamp]
        {
            at_zero(family, one());
        }
        for family in
            [&self.object_bytes, &self.db_bytes, &self.revision, &self.kept, &self.other_clusters, &self.delta.revision]
        {
            at_zero(family, one());
        }
        for family in [
            &self.spilled,
            &self.locked_skipped,
            &self.delta.objects,
            &self.delta.bytes,
            &self.delta.compacted,
            &self.delta.failures,
            &self.health.leader_changes,
        ] {
            at_zero(family, one());
        }
        at_zero(&self.alarms, ALARMS.map(|alarm| AlarmLabels { shard: shard.into(), alarm: alarm.into() }));
        // The second store's and defragmentation's series too, at 0 where neither is configured: every alert's
        // metric is exported (the chart test checks it), and 0 fires none of them.
        self.secondary.init_shard(&config.name);
        at_zero(&self.defrag.last_success, one());
        at_zero(&self.defrag.last_failure, one());
        self.upgrade.init(config);
        self.defrag.init(config);
        let members = config.endpoints.iter().map(|e| MemberLabels { shard: shard.into(), member: e.clone() });
        at_zero(&self.health.up, members);
    }

    /// Sets the shard's alarm gauges from what a member listed: `(member id, alarm)` pairs.
    pub fn alarms_seen(&self, shard: &str, alarms: &[(u64, crate::member::Alarm)]) {
        for alarm in ALARMS {
            let members = alarms.iter().filter(|(_, a)| a.as_str() == alarm).count();
            self.alarms.get_or_create(&AlarmLabels { shard: shard.into(), alarm: alarm.into() }).set(members as i64);
        }
    }

    /// The configured bounds, and every retries label pair at 0, before the first run.
    pub fn configure(&self, spill: &crate::config::Spill) {
        let s3 = [OP_UPLOAD_PART, OP_REQUEST].into_iter().flat_map(|op| {
            Reason::VARIANTS.iter().map(move |reason| RetryLabels { op: op.into(), reason: reason.to_string() })
        });
        let runs =
            SnapshotError::VARIANTS.iter().map(|reason| RetryLabels { op: OP_RUN.into(), reason: reason.to_string() });
        at_zero(&self.retries, s3.chain(runs));
        self.memory_budget.set(spill.memory_budget as i64);
        self.part_size.set(spill.part_size as i64);
        self.parts_in_flight_max.set(spill.parts_in_flight as i64);
    }

    pub fn shard(&self, shard: &str) -> ShardLabel {
        ShardLabel { shard: shard.into() }
    }

    /// A drill that ran: its duration, and its pass or its failure (by reason).
    pub fn drill_outcome(&self, shard: &str, outcome: &crate::drill::run::Outcome) {
        self.drill.duration.get_or_create(&self.shard(shard)).set(outcome.report.duration_seconds);
        match &outcome.result {
            Ok(()) => _ = self.drill.last_success.get_or_create(&self.shard(shard)).set(unix_now()),
            Err(error) => self.drill_failed(shard, error),
        }
    }

    pub fn drill_failed(&self, shard: &str, error: &DrillError) {
        let reason: &'static str = error.into();
        self.drill.failures.get_or_create(&FailureLabels { shard: shard.into(), reason: reason.into() }).inc();
        self.drill.last_failure.get_or_create(&self.shard(shard)).set(unix_now());
    }

    pub fn failed(&self, shard: &str, error: &SnapshotError) {
        let reason: &'static str = error.into();
        self.failures.get_or_create(&FailureLabels { shard: shard.into(), reason: reason.into() }).inc();
        if matches!(error, SnapshotError::Storage(_)) {
            self.storage_reachable.set(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use kcp_keeper_runtime::metrics::Registry;

    use super::*;
    use crate::member::Alarm;

    #[test]
    fn alarms_are_exported_at_0_per_shard_and_count_the_members_with_each_alarm() {
        let mut registry = Registry::with_prefix("etcd_snapshotter");
        let m = Metrics::register(&mut registry);
        for alarm in ALARMS {
            let _ = m.alarms.get_or_create(&AlarmLabels { shard: "root".into(), alarm: alarm.into() });
        }
        let text = |registry: &Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
            out
        };
        assert!(text(&registry).contains("etcd_snapshotter_alarms{shard=\"root\",alarm=\"corrupt\"} 0"));
        m.alarms_seen("root", &[(1, Alarm::Nospace), (2, Alarm::Nospace), (3, Alarm::Corrupt)]);
        let out = text(&registry);
        assert!(out.contains("etcd_snapshotter_alarms{shard=\"root\",alarm=\"nospace\"} 2"), "{out}");
        assert!(out.contains("etcd_snapshotter_alarms{shard=\"root\",alarm=\"corrupt\"} 1"), "{out}");
        m.alarms_seen("root", &[]);
        assert!(text(&registry).contains("etcd_snapshotter_alarms{shard=\"root\",alarm=\"nospace\"} 0"));
    }
}
