//! `etcd_snapshotter_secondary_*`: the second store's copy passes (leader only; followers export 0).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use kcp_keeper_runtime::metrics::{GaugeF64, at_zero};
use strum::VariantNames;

use super::plan::Kind;
use crate::labels::ShardLabel;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub shard: String,
    /// [`Kind`]: `listing`, `snapshot`, `delta`, `manifest`, `drill_report`, `retention`.
    pub kind: String,
}

kcp_keeper_runtime::metrics! {
    pub struct SecondaryMetrics {
        /// Failed attempts on the second store (listing it, copying or verifying an object, its retention).
        pub failures: Family<KindLabels, Counter> => "secondary_failures",
            "Failures on the second store (listing, copying or verifying an object, retention), by kind";
        /// Objects copied to the second store and verified there.
        pub copied: Family<KindLabels, Counter> => "secondary_copied",
            "Objects copied to the second store and verified there";
        /// Objects of published snapshots the second store should hold and does not hold verified, as the last
        /// pass left it: 0 when it is in sync.
        pub behind: Family<ShardLabel, Gauge> => "secondary_objects_behind",
            "Objects the second store should hold verified and does not, after the last copy pass";
        /// When a pass last found the second store in sync for the shard (0: never since start).
        pub in_sync: Family<ShardLabel, GaugeF64> => "secondary_in_sync_timestamp" [Seconds],
            "When a copy pass last found the second store holding every object it should (0: never since start)";
    }
}

impl SecondaryMetrics {
    /// Every series of `shard` at 0, so alerts see the shard before its first pass.
    pub fn init_shard(&self, shard: &str) {
        let kinds = Kind::VARIANTS.iter().map(|kind| KindLabels { shard: shard.into(), kind: kind.to_string() });
        at_zero(&self.failures, kinds.clone());
        at_zero(&self.copied, kinds);
        let _ = self.behind.get_or_create(&ShardLabel { shard: shard.into() });
        let _ = self.in_sync.get_or_create(&ShardLabel { shard: shard.into() });
    }

    pub fn failed(&self, shard: &str, kind: Kind) {
        self.failures.get_or_create(&KindLabels { shard: shard.into(), kind: kind.as_str().into() }).inc();
    }

    pub fn copied(&self, shard: &str, kind: Kind) {
        self.copied.get_or_create(&KindLabels { shard: shard.into(), kind: kind.as_str().into() }).inc();
    }
}
