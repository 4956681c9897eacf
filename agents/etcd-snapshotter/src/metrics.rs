//! `etcd_snapshotter_*` metrics. Every per-shard series is created at start with a value (failures by every
//! reason at 0, last success at 0), so a shard that never succeeds is visible to alerts as `time() - 0`
//! rather than missing.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use strum::VariantNames;

use kcp_keeper_runtime::metrics::GaugeF64;

use crate::error::{DrillError, SnapshotError};
use crate::labels::{ALARMS, AlarmLabels, FailureLabels, MemberLabels, RetryLabels, ShardLabel};

/// `etcd_snapshotter_member_*` and `leader_changes_total`: etcd health as `health` reads it.
#[derive(Clone, Debug, Default)]
pub struct HealthMetrics {
    pub db_size: Family<MemberLabels, Gauge>,
    pub db_size_in_use: Family<MemberLabels, Gauge>,
    pub quota: Family<MemberLabels, Gauge>,
    pub up: Family<MemberLabels, Gauge>,
    pub leader_changes: Family<ShardLabel, Counter>,
}

#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub last_success: Family<ShardLabel, GaugeF64>,
    pub duration: Family<ShardLabel, GaugeF64>,
    pub object_bytes: Family<ShardLabel, Gauge>,
    pub db_bytes: Family<ShardLabel, Gauge>,
    pub revision: Family<ShardLabel, Gauge>,
    pub failures: Family<FailureLabels, Counter>,
    pub kept: Family<ShardLabel, Gauge>,
    pub spilled: Family<ShardLabel, Counter>,
    pub locked_skipped: Family<ShardLabel, Counter>,
    pub storage_reachable: Gauge,
    pub memory_budget: Gauge,
    pub part_size: Gauge,
    pub parts_in_flight_max: Gauge,
    pub parts_in_flight: Gauge,
    /// The longest gap between firings of the shard's snapshot schedule (alerts: "no success within 2x").
    pub schedule_interval: Family<ShardLabel, GaugeF64>,
    /// Members of the shard's etcd cluster with the alarm active, as the last run's member probe read them.
    pub alarms: Family<AlarmLabels, Gauge>,
    /// Snapshots of other etcd clusters under the shard's directory (another installation, or the shard's etcd
    /// before it was re-created), as the last retention pass found them: never used or deleted.
    pub other_clusters: Family<ShardLabel, Gauge>,
    /// Retries of S3 requests and of whole runs, every label pair exported at 0 from the start.
    pub retries: Family<RetryLabels, Counter>,
    pub drill: DrillMetrics,
    pub delta: DeltaMetrics,
    pub health: HealthMetrics,
    pub secondary: crate::secondary::metrics::SecondaryMetrics,
    pub upgrade: crate::upgrade::metrics::UpgradeMetrics,
    pub defrag: crate::defrag::metrics::DefragMetrics,
}

/// `etcd_snapshotter_delta_*`: delta snapshots, written by the leader only (followers export 0).
#[derive(Clone, Debug, Default)]
pub struct DeltaMetrics {
    /// The time up to which every write of the shard is in the bucket (a full snapshot and its deltas): the
    /// recovery point is `time() - this`. 0 until the first delta session has caught up.
    pub stored_through: Family<ShardLabel, GaugeF64>,
    /// The newest source revision stored in a delta.
    pub revision: Family<ShardLabel, Gauge>,
    pub last_write_timestamp: Family<ShardLabel, GaugeF64>,
    pub objects: Family<ShardLabel, Counter>,
    pub bytes: Family<ShardLabel, Counter>,
    /// Sessions whose start revision was compacted away (a full snapshot was taken to close the gap).
    pub compacted: Family<ShardLabel, Counter>,
    /// Sessions that ended on an error (etcd, the bucket); the next starts after an interval.
    pub failures: Family<ShardLabel, Counter>,
    /// `deltas.interval`; 0 when the shard has no deltas (the alert's yardstick and selector).
    pub interval: Family<ShardLabel, GaugeF64>,
}

/// `etcd_snapshotter_drill_*`: restore drills (names fixed by contract with the chart's alerts).
#[derive(Clone, Debug, Default)]
pub struct DrillMetrics {
    pub last_success: Family<ShardLabel, GaugeF64>,
    pub last_failure: Family<ShardLabel, GaugeF64>,
    pub duration: Family<ShardLabel, GaugeF64>,
    /// The last measured restore time: `etcdutl snapshot restore` until the throwaway etcd answers.
    pub restore: Family<ShardLabel, GaugeF64>,
    pub failures: Family<FailureLabels, Counter>,
    /// The longest gap between firings of the shard's drill schedule; 0 when drills are not scheduled.
    pub schedule_interval: Family<ShardLabel, GaugeF64>,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let seconds = Unit::Seconds;
        registry.register_with_unit(
            "last_success_timestamp",
            "When the shard's last snapshot was published (0: never since start)",
            seconds.clone(),
            m.last_success.clone(),
        );
        registry.register_with_unit(
            "duration",
            "Duration of the shard's last snapshot run",
            seconds,
            m.duration.clone(),
        );
        registry.register_with_unit("object", "Size of the last published object", Unit::Bytes, m.object_bytes.clone());
        registry.register_with_unit(
            "database",
            "Size of the last streamed etcd database",
            Unit::Bytes,
            m.db_bytes.clone(),
        );
        registry.register("revision", "Revision of the last published snapshot", m.revision.clone());
        registry.register("failures", "Snapshot runs that failed, by reason", m.failures.clone());
        registry.register("snapshots_kept", "Published snapshots left after the last retention pass", m.kept.clone());
        registry.register_with_unit(
            "spilled",
            "Bytes written to the spill directory because S3 lagged",
            Unit::Bytes,
            m.spilled.clone(),
        );
        registry.register(
            "retention_locked_skipped",
            "Snapshots retention would delete but object lock protects",
            m.locked_skipped.clone(),
        );
        registry.register(
            "storage_reachable",
            "Whether the bucket answered the last request (1) or not (0)",
            m.storage_reachable.clone(),
        );
        registry.register_with_unit(
            "memory_budget",
            "Configured bound on snapshot bytes held in memory",
            Unit::Bytes,
            m.memory_budget.clone(),
        );
        registry.register_with_unit("part_size", "Configured multipart part size", Unit::Bytes, m.part_size.clone());
        registry.register(
            "parts_in_flight_max",
            "Configured bound on parts uploading at once",
            m.parts_in_flight_max.clone(),
        );
        registry.register("parts_in_flight", "Parts uploading now", m.parts_in_flight.clone());
        registry.register_with_unit(
            "schedule_interval",
            "Longest gap between consecutive firings of the shard's snapshot schedule",
            Unit::Seconds,
            m.schedule_interval.clone(),
        );
        registry.register(
            "alarms",
            "Members of the shard's etcd cluster with the alarm active (nospace, corrupt), read by the last run",
            m.alarms.clone(),
        );
        registry.register(
            "other_cluster_snapshots",
            "Snapshots of other etcd clusters under the shard's directory, found by the last retention pass",
            m.other_clusters.clone(),
        );
        registry.register(
            "retries",
            "Retries of S3 requests and of snapshot runs, by op and reason",
            m.retries.clone(),
        );
        for op in [crate::retries::OP_UPLOAD_PART, crate::retries::OP_REQUEST] {
            for reason in crate::retries::Reason::VARIANTS {
                let _ = m.retries.get_or_create(&RetryLabels { op: op.into(), reason: reason.to_string() });
            }
        }
        for reason in SnapshotError::VARIANTS {
            let labels = RetryLabels { op: crate::retries::OP_RUN.into(), reason: reason.to_string() };
            let _ = m.retries.get_or_create(&labels);
        }
        let d = &m.drill;
        registry.register_with_unit(
            "drill_last_success_timestamp",
            "When the shard's last restore drill passed (0: never since start)",
            Unit::Seconds,
            d.last_success.clone(),
        );
        registry.register_with_unit(
            "drill_last_failure_timestamp",
            "When the shard's last restore drill failed (0: never since start)",
            Unit::Seconds,
            d.last_failure.clone(),
        );
        registry.register_with_unit(
            "drill_duration",
            "Wall time of the shard's last restore drill",
            Unit::Seconds,
            d.duration.clone(),
        );
        registry.register_with_unit(
            "drill_restore",
            "Restore time measured by the shard's last drill (etcdutl restore until etcd answers): the RTO",
            Unit::Seconds,
            d.restore.clone(),
        );
        registry.register("drill_failures", "Restore drills that failed, by reason", d.failures.clone());
        registry.register_with_unit(
            "drill_schedule_interval",
            "Longest gap between consecutive firings of the shard's drill schedule (0: not scheduled)",
            Unit::Seconds,
            d.schedule_interval.clone(),
        );
        let delta = &m.delta;
        registry.register_with_unit(
            "delta_stored_through_timestamp",
            "Time up to which every write of the shard is stored (full snapshot and deltas); time() minus it is the RPO",
            Unit::Seconds,
            delta.stored_through.clone(),
        );
        registry.register("delta_revision", "Newest source revision stored in a delta", delta.revision.clone());
        registry.register_with_unit(
            "delta_last_write_timestamp",
            "When the shard's last delta object was written",
            Unit::Seconds,
            delta.last_write_timestamp.clone(),
        );
        registry.register("delta_objects", "Delta objects written", delta.objects.clone());
        registry.register_with_unit("delta", "Bytes of delta objects written", Unit::Bytes, delta.bytes.clone());
        registry.register(
            "delta_compacted",
            "Delta sessions whose start revision was compacted away, each closed by a full snapshot",
            delta.compacted.clone(),
        );
        registry.register("delta_failures", "Delta sessions that ended on an error", delta.failures.clone());
        registry.register_with_unit(
            "delta_interval",
            "The shard's deltas.interval (0: no deltas)",
            Unit::Seconds,
            delta.interval.clone(),
        );
        let h = &m.health;
        registry.register_with_unit(
            "member_db_size",
            "Size of the member's database file (etcd's dbSize), read every 15 s",
            Unit::Bytes,
            h.db_size.clone(),
        );
        registry.register_with_unit(
            "member_db_size_in_use",
            "Bytes of the member's database in use (what a defragmentation would leave)",
            Unit::Bytes,
            h.db_size_in_use.clone(),
        );
        registry.register_with_unit(
            "member_db_quota",
            "The member's --quota-backend-bytes as it reports it (0: not reported, etcd before 3.6)",
            Unit::Bytes,
            h.quota.clone(),
        );
        registry.register("member_up", "Whether the member answered the last health read (1) or not (0)", h.up.clone());
        registry.register(
            "leader_changes",
            "Changes of the shard's etcd leader seen by this replica's health reads",
            h.leader_changes.clone(),
        );
        m.upgrade.register(registry);
        m.secondary.register(registry);
        m.defrag.register(registry);
        m
    }

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
        let _ = self.drill.last_success.get_or_create(&label);
        let _ = self.drill.last_failure.get_or_create(&label);
        let _ = self.drill.duration.get_or_create(&label);
        let _ = self.drill.restore.get_or_create(&label);
        for reason in DrillError::VARIANTS {
            let _ =
                self.drill.failures.get_or_create(&FailureLabels { shard: shard.into(), reason: reason.to_string() });
        }
        let _ = self.last_success.get_or_create(&label);
        let _ = self.duration.get_or_create(&label);
        let _ = self.object_bytes.get_or_create(&label);
        let _ = self.db_bytes.get_or_create(&label);
        let _ = self.revision.get_or_create(&label);
        let _ = self.kept.get_or_create(&label);
        let _ = self.spilled.get_or_create(&label);
        let _ = self.locked_skipped.get_or_create(&label);
        for reason in SnapshotError::VARIANTS {
            let _ = self.failures.get_or_create(&FailureLabels { shard: shard.into(), reason: reason.to_string() });
        }
        for alarm in ALARMS {
            let _ = self.alarms.get_or_create(&AlarmLabels { shard: shard.into(), alarm: alarm.into() });
        }
        let _ = self.other_clusters.get_or_create(&label);
        let interval = config.deltas.as_ref().map(|d| d.interval.as_secs_f64()).unwrap_or(0.0);
        self.delta.interval.get_or_create(&label).set(interval);
        let _ = self.delta.stored_through.get_or_create(&label);
        let _ = self.delta.revision.get_or_create(&label);
        let _ = self.delta.last_write_timestamp.get_or_create(&label);
        let _ = self.delta.objects.get_or_create(&label);
        let _ = self.delta.bytes.get_or_create(&label);
        let _ = self.delta.compacted.get_or_create(&label);
        let _ = self.delta.failures.get_or_create(&label);
        let _ = self.health.leader_changes.get_or_create(&label);
        // The second store's and defragmentation's series too, at 0 where neither is configured: every alert's
        // metric is exported (the chart test checks it), and 0 fires none of them.
        self.secondary.init_shard(&config.name);
        let _ = self.defrag.last_success.get_or_create(&label);
        let _ = self.defrag.last_failure.get_or_create(&label);
        self.upgrade.init(config);
        self.defrag.init(config);
        for endpoint in &config.endpoints {
            let _ = self.health.up.get_or_create(&MemberLabels { shard: shard.into(), member: endpoint.clone() });
        }
    }

    /// Sets the shard's alarm gauges from what a member listed: `(member id, alarm)` pairs.
    pub fn alarms_seen(&self, shard: &str, alarms: &[(u64, crate::member::Alarm)]) {
        for alarm in ALARMS {
            let members = alarms.iter().filter(|(_, a)| a.as_str() == alarm).count();
            self.alarms.get_or_create(&AlarmLabels { shard: shard.into(), alarm: alarm.into() }).set(members as i64);
        }
    }

    pub fn configure(&self, spill: &crate::config::Spill) {
        self.memory_budget.set(spill.memory_budget as i64);
        self.part_size.set(spill.part_size as i64);
        self.parts_in_flight_max.set(spill.parts_in_flight as i64);
    }

    pub fn shard(&self, shard: &str) -> ShardLabel {
        ShardLabel { shard: shard.into() }
    }

    pub fn drill_failed(&self, shard: &str, error: &DrillError) {
        let reason: &'static str = error.into();
        self.drill.failures.get_or_create(&FailureLabels { shard: shard.into(), reason: reason.into() }).inc();
        self.drill.last_failure.get_or_create(&self.shard(shard)).set(kcp_keeper_runtime::metrics::unix_now());
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
