//! Why a bundle's reconcile failed: the daemon's error enum. The runtime registers
//! `ca_syncer_reconcile_errors_total{reason}` from it (every variant at 0 from the start); the reconciler
//! ([`crate::reconcile`]) returns it. Its own file so that neither imports the other for it.

use kcp_keeper_runtime::apply::ApplyError;

use crate::live_check::Failures;
use crate::sources::SourceFailure;
use crate::state::StateError;

/// Why a bundle's reconcile failed; `ca_syncer_reconcile_errors_total{reason}` is the variant's name.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum SyncError {
    /// A source is missing or was rejected: nothing is written, targets keep their last good bundle.
    #[error("sources[{index}] not used: {failure}")]
    SourceUnusable { index: usize, failure: SourceFailure },
    /// An endpoint did not verify the bundle as it would be published: nothing is written for the bundle.
    #[error("live check failed: {0}")]
    LiveCheckFailed(Failures),
    #[error("{failed} of {total} targets not written; first: {first}")]
    TargetNotOwned { failed: usize, total: usize, first: ApplyError },
    #[error("{failed} of {total} targets not written; first: {first}")]
    TargetWriteFailed { failed: usize, total: usize, first: ApplyError },
    #[error("rotation state too large to record; not written")]
    RotationStateTooLarge,
    /// The bundle's rotation record could not be read or written: nothing is written for the bundle.
    #[error("rotation record: {0}")]
    StateUnavailable(StateError),
    /// A target's read-once consumer (Deployment, StatefulSet, DaemonSet) does not exist: its restart stays
    /// pending and is retried.
    #[error("{0}")]
    ConsumerMissing(String),
    /// Reading or rolling a read-once consumer failed: retried with backoff.
    #[error("restarting a consumer: {0}")]
    ConsumerRestartFailed(Box<ApplyError>),
    /// A trust store's password Secret is missing, lacks its key, or holds an unusable password: nothing is
    /// written for the bundle.
    #[error("{0}")]
    PasswordUnusable(PasswordError),
}

/// Why a trust store's password (`passwordSecretRef`) cannot be used. Names the Secret and key, never the value.
#[derive(Debug, thiserror::Error)]
pub enum PasswordError {
    #[error("trust store password: Secret {0} not found")]
    NoSecret(String),
    #[error("trust store password: Secret {secret} has no key {key}")]
    NoKey { secret: String, key: String },
    #[error("trust store password in Secret {secret} key {key}: {reason}")]
    Invalid { secret: String, key: String, reason: String },
}
