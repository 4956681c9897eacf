//! `etcd_snapshotter_pre_upgrade_*`: the metrics of snapshots before kcp upgrades ([`super::watch`] records
//! them), declared here so the crate's metrics can compose them without importing the watch.

use kcp_keeper_runtime::metrics::{GaugeF64, at_zero};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::config::Shard;
use crate::labels::ShardLabel;

/// Results of `etcd_snapshotter_pre_upgrade_snapshots_total`.
pub const RESULTS: [&str; 3] = ["passed", "drill_failed", "snapshot_failed"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct UpgradeLabels {
    pub shard: String,
    /// `passed`, `drill_failed` or `snapshot_failed` ([`RESULTS`]).
    pub result: String,
}

kcp_keeper_runtime::metrics! {
    /// `etcd_snapshotter_pre_upgrade_*`: snapshots before kcp upgrades, by the leader only (followers export 0).
    pub struct UpgradeMetrics {
        pub snapshots: Family<UpgradeLabels, Counter> => "pre_upgrade_snapshots",
            "Snapshots taken because the shard's kcp image changed, by result (passed, drill_failed, snapshot_failed)";
        pub late: Family<ShardLabel, Counter> => "pre_upgrade_late",
            "kcp image changes found only when the watch (re)started: their snapshot may come after the roll began";
        pub malformed: Family<ShardLabel, Counter> => "pre_upgrade_invalid_image",
            "Readings of the operator's object whose kcp image is not valid (no snapshot was taken for them)";
        pub watch_errors: Family<ShardLabel, Counter> => "pre_upgrade_watch_errors",
            "Errors watching the operator's object (RBAC, the apiserver); the watch retries";
        pub last: Family<ShardLabel, GaugeF64> => "pre_upgrade_last_snapshot_timestamp" [Seconds],
            "When the shard's last snapshot before a kcp upgrade was published (0: none since start)";
    }
}

impl UpgradeMetrics {
    /// Every series of a shard with `beforeUpgrade`, at 0.
    pub fn init(&self, shard: &Shard) {
        if shard.before_upgrade.is_none() {
            return;
        }
        let results = RESULTS.map(|result| UpgradeLabels { shard: shard.name.clone(), result: result.into() });
        at_zero(&self.snapshots, results);
        let one = || [ShardLabel { shard: shard.name.clone() }];
        for family in [&self.late, &self.malformed, &self.watch_errors] {
            at_zero(family, one());
        }
        at_zero(&self.last, one());
    }
}
