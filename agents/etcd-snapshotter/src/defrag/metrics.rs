//! `etcd_snapshotter_defrag_*` and `member_defrag_*`: scheduled defragmentation, run by the leader only
//! (followers keep 0, so alerts take the max over replicas). Registered by `crate::metrics::Metrics`.

use kcp_keeper_runtime::metrics::{GaugeF64, unix_now};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use strum::VariantNames;

use super::{Outcome, Report, Stopped};
use crate::labels::{FailureLabels, MemberLabels, ShardLabel};

/// One result of one member's last defragmentation ([`Outcome::VARIANTS`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberResultLabels {
    pub shard: String,
    pub member: String,
    pub result: String,
}

kcp_keeper_runtime::metrics! {
    pub struct DefragMetrics {
        pub last_success: Family<ShardLabel, GaugeF64> => "defrag_last_success_timestamp" [Seconds],
            "When the shard's last scheduled defragmentation run finished without stopping early (0: never since start)";
        pub last_failure: Family<ShardLabel, GaugeF64> => "defrag_last_failure_timestamp" [Seconds],
            "When the shard's last scheduled defragmentation run stopped early (0: never since start)";
        /// Runs that stopped early, by [`Stopped`] reason.
        pub failures: Family<FailureLabels, Counter> => "defrag_failures",
            "Defragmentation runs that stopped early, by reason";
        /// 1 for the result of the member's last defragmentation, 0 for the others.
        pub member_result: Family<MemberResultLabels, Gauge> => "member_defrag_last_result",
            "1 for the result of the member's last defragmentation (defragmented, skipped_leader, timeout, failed)";
        /// The member's database size before its last defragmentation less after.
        pub reclaimed: Family<MemberLabels, Gauge> => "member_defrag_reclaimed" [Bytes],
            "The member's database size before its last defragmentation less after";
        pub duration: Family<MemberLabels, GaugeF64> => "member_defrag_duration" [Seconds],
            "How long the member's last defragmentation took";
    }
}

impl DefragMetrics {
    /// Every series of a shard with `defrag`, at 0 from the start.
    pub fn init(&self, config: &crate::config::Shard) {
        if config.defrag.is_none() {
            return;
        }
        let shard = config.name.as_str();
        let label = ShardLabel { shard: shard.into() };
        let _ = self.last_success.get_or_create(&label);
        let _ = self.last_failure.get_or_create(&label);
        for reason in Stopped::VARIANTS {
            let _ = self.failures.get_or_create(&FailureLabels { shard: shard.into(), reason: reason.to_string() });
        }
        for endpoint in &config.endpoints {
            let member = MemberLabels { shard: shard.into(), member: endpoint.clone() };
            let _ = self.reclaimed.get_or_create(&member);
            let _ = self.duration.get_or_create(&member);
            for &result in Outcome::VARIANTS {
                let labels =
                    MemberResultLabels { shard: shard.into(), member: endpoint.clone(), result: result.into() };
                let _ = self.member_result.get_or_create(&labels);
            }
        }
    }

    /// Records a run of `shard` (a snapshot failure before it included).
    pub fn finished(&self, shard: &str, report: &Report) {
        for done in &report.members {
            for &result in Outcome::VARIANTS {
                let labels =
                    MemberResultLabels { shard: shard.into(), member: done.member.clone(), result: result.into() };
                self.member_result.get_or_create(&labels).set((result == done.result.as_str()) as i64);
            }
            if !matches!(done.result, Outcome::SkippedLeader) {
                let member = MemberLabels { shard: shard.into(), member: done.member.clone() };
                self.reclaimed.get_or_create(&member).set(done.result.reclaimed());
                self.duration.get_or_create(&member).set(done.seconds);
            }
        }
        let label = ShardLabel { shard: shard.into() };
        match &report.stopped {
            None => {
                self.last_success.get_or_create(&label).set(unix_now());
            }
            Some(stopped) => {
                let reason: &'static str = stopped.into();
                self.failures.get_or_create(&FailureLabels { shard: shard.into(), reason: reason.into() }).inc();
                self.last_failure.get_or_create(&label).set(unix_now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defrag::Done;
    use kcp_keeper_runtime::metrics::Registry;

    #[test]
    fn a_run_sets_each_members_last_result_alone_and_a_stopped_run_counts_its_reason() {
        let mut registry = Registry::with_prefix("etcd_snapshotter");
        let m = DefragMetrics::register(&mut registry);
        let report = Report {
            members: vec![
                Done { member: "a".into(), result: Outcome::Defragmented { before: 100, after: 30 }, seconds: 1.5 },
                Done { member: "b".into(), result: Outcome::SkippedLeader, seconds: 0.0 },
                Done { member: "c".into(), result: Outcome::Timeout, seconds: 5.0 },
            ],
            stopped: Some(Stopped::Timeout { member: "c".into(), seconds: 5.0 }),
        };
        m.finished("root", &report);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        for line in [
            "etcd_snapshotter_member_defrag_last_result{shard=\"root\",member=\"a\",result=\"defragmented\"} 1",
            "etcd_snapshotter_member_defrag_last_result{shard=\"root\",member=\"a\",result=\"timeout\"} 0",
            "etcd_snapshotter_member_defrag_last_result{shard=\"root\",member=\"b\",result=\"skipped_leader\"} 1",
            "etcd_snapshotter_member_defrag_last_result{shard=\"root\",member=\"c\",result=\"timeout\"} 1",
            "etcd_snapshotter_member_defrag_reclaimed_bytes{shard=\"root\",member=\"a\"} 70",
            "etcd_snapshotter_defrag_failures_total{shard=\"root\",reason=\"timeout\"} 1",
        ] {
            assert!(out.contains(line), "{line} missing in {out}");
        }
        assert!(!out.contains("member_defrag_reclaimed_bytes{shard=\"root\",member=\"b\"}"), "{out}");
    }
}
