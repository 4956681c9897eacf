//! The label sets of `etcd_snapshotter_*` metrics: plain types at the bottom of the crate, so every feature's
//! metrics (snapshots, drills, deltas, health, the second store, upgrades, defragmentation, S3 retries) name
//! the same labels without importing one another.

use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabel {
    pub shard: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub shard: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AlarmLabels {
    pub shard: String,
    /// `nospace` or `corrupt`.
    pub alarm: String,
}

/// `etcd_snapshotter_retries_total`: `op` is `upload_part`, `s3_request` or `snapshot_run`; `reason` is why
/// the attempt failed (`retries::Reason` for S3, the run's failure reason for a run).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabels {
    pub op: String,
    pub reason: String,
}

/// One member of a shard's etcd: `member` is its endpoint as configured.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabels {
    pub shard: String,
    pub member: String,
}

/// The alarms the `alarms` gauge counts, each exported at 0 for every shard from the start.
pub const ALARMS: [&str; 2] = ["nospace", "corrupt"];
