//! Restore drills: prove a published snapshot restores, and measure how long that takes (the shard's real
//! RTO). The steps and what each proves are in docs/etcd-snapshotter.md ("Restore drills").

/// Why a drill failed; the variant name is the `reason` label of `etcd_snapshotter_drill_failures_total`.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum DrillError {
    /// No published snapshot to drill (or the one named does not exist).
    #[error("no snapshot to drill: {0}")]
    NoSnapshot(String),
    #[error("storage: {0}")]
    Storage(String),
    #[error("object hash mismatch: {0}")]
    ObjectHashMismatch(String),
    #[error("decrypting or decompressing: {0}")]
    Decode(String),
    #[error("etcd hash mismatch: {0}")]
    EtcdHashMismatch(String),
    #[error("etcdutl snapshot restore: {0}")]
    Restore(String),
    #[error("throwaway etcd: {0}")]
    EtcdStart(String),
    #[error("revision mismatch: {0}")]
    RevisionMismatch(String),
    #[error("key count mismatch: {0}")]
    KeyCountMismatch(String),
    #[error("hash_kv mismatch: {0}")]
    HashKvMismatch(String),
    #[error("reading keys: {0}")]
    KeyRead(String),
    #[error("kcp level: {0}")]
    Kcp(String),
    #[error("drill setup: {0}")]
    Setup(String),
    #[error("interrupted: the drill was stopped and cleaned up")]
    Interrupted,
}
