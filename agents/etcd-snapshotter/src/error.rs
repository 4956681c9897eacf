//! Why a snapshot or a drill failed. The variant names are the bounded `reason` labels of
//! `etcd_snapshotter_failures_total` and `etcd_snapshotter_drill_failures_total` (the metrics export every
//! one at 0 from the start); the snapshot, the drill and the schedules produce them. Apart from both
//! sides, so that neither imports the other.

use crate::member::NoMember;
use crate::storage::StorageError;
use crate::trailer::TrailerError;

/// Why a snapshot run failed; the variant name is the `reason` label of the failure counter.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum SnapshotError {
    #[error(transparent)]
    NoMember(#[from] NoMember),
    #[error("etcd: {0}")]
    Etcd(String),
    #[error("snapshot hash mismatch, upload aborted: {0}")]
    HashMismatch(#[from] TrailerError),
    #[error(transparent)]
    Storage(StorageError),
    /// What the store holds is not what was streamed (`storage.integrity`).
    #[error("the stored object is not what was streamed, nothing was published: {0}")]
    Integrity(String),
    #[error("spill directory: {0}")]
    Spill(String),
    #[error("compressing or encrypting: {0}")]
    Encode(String),
    #[error("the stored object has {stored} bytes, {written} were uploaded")]
    SizeMismatch { stored: u64, written: u64 },
    #[error("shutdown: the snapshot did not finish within its grace and its upload was aborted")]
    Interrupted,
    #[error("retention: {0}")]
    Retention(StorageError),
    /// Another run held the shard's lock for as long as this one could wait.
    #[error("{0}")]
    Busy(String),
    /// The shard's lock was taken over mid-run: nothing was published.
    #[error("{0}")]
    LockLost(String),
    /// The database needs more parts than S3 takes (10,000) and the memory budget cannot hold larger ones.
    #[error("{0}")]
    PartLimit(String),
    /// `restore-installation` is replacing the shard's keyspace (its marker key is there): nothing was taken.
    #[error("{0}")]
    Restoring(String),
}

impl From<crate::shard_lock::LockError> for SnapshotError {
    fn from(error: crate::shard_lock::LockError) -> Self {
        use crate::shard_lock::LockError;
        match error {
            LockError::Storage(e) => SnapshotError::Storage(e),
            busy @ LockError::Busy { .. } => SnapshotError::Busy(busy.to_string()),
            lost @ (LockError::Lost { .. } | LockError::Unrenewed { .. }) => SnapshotError::LockLost(lost.to_string()),
        }
    }
}

impl From<StorageError> for SnapshotError {
    fn from(error: StorageError) -> Self {
        match error {
            StorageError::Integrity(detail) => SnapshotError::Integrity(detail),
            other => SnapshotError::Storage(other),
        }
    }
}

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
    /// The snapshot was taken while `restore-installation` replaced the shard's keyspace: it holds part of it.
    #[error("partial keyspace: {0}")]
    PartialKeyspace(String),
    #[error("kcp level: {0}")]
    Kcp(String),
    /// A delta of the drilled snapshot's chain is missing, altered or not linked to the one before.
    #[error("delta chain broken: {0}")]
    DeltaChainBroken(String),
    /// The replayed chain is not what the live member reported at a delta's end (key count or HashKV).
    #[error("delta mismatch: {0}")]
    DeltaMismatch(String),
    /// Replaying the chain failed for another reason (reading the store, the throwaway etcd).
    #[error("delta replay: {0}")]
    DeltaReplay(String),
    #[error("drill setup: {0}")]
    Setup(String),
    #[error("timeout: {0}")]
    Timeout(String),
    #[error("interrupted: the drill was stopped and cleaned up")]
    Interrupted,
}
