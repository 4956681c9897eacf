//! The daemon's errors: why a kubeconfig's reconcile failed ([`SyncError`], whose variant names are the
//! `reason` of `kubeconfig_rotator_reconcile_errors_total`), and every reason a candidate can be refused
//! ([`verification_reasons`], the `reason` of `kubeconfig_rotator_verification_failures_total`). Here, apart from
//! the reconciler and the metrics, because both read them.

use kcp_keeper_runtime::apply::ApplyError;
use kcp_keeper_runtime::driver::ErrorReason;

use crate::credential::CredentialError;
use crate::prove::ProofError;

/// Why a kubeconfig's reconcile failed; `kubeconfig_rotator_reconcile_errors_total{reason}` is the variant name.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum SyncError {
    #[error("{0} not found")]
    SourceMissing(String),
    #[error("Kubeconfig {0}: spec.secretRef.name is not the configured renderedSecret")]
    SecretRefMismatch(String),
    #[error("candidate rejected: {0}")]
    CandidateRejected(CredentialError),
    #[error("candidate not proven: {0}")]
    ProofFailed(ProofError),
    #[error("nudging Kubeconfig {object}: {source}")]
    NudgeFailed { object: String, source: kube::Error },
    #[error("forcing a renewal of Certificate {object}: {source}")]
    RenewalFailed { object: String, source: kube::Error },
    #[error("{failed} of {total} targets not written; first: {first}")]
    TargetNotOwned { failed: usize, total: usize, first: Box<ApplyError> },
    #[error("{failed} of {total} targets not written; first: {first}")]
    TargetWriteFailed { failed: usize, total: usize, first: Box<ApplyError> },
    #[error("restarting a consumer: {0}")]
    RestartFailed(Box<ApplyError>),
    /// A configured consumer (Deployment, StatefulSet, DaemonSet) does not exist: its restart stays pending and is retried.
    #[error("consumer {0} not found; its restart is pending")]
    ConsumerMissing(String),
    #[error("reading the source: {0}")]
    ReadFailed(kube::Error),
    /// A copy of a selector target in a namespace no longer selected or allowed could not be deleted.
    #[error("withdrawing the copy {object}: {source}")]
    WithdrawFailed { object: String, source: kube::Error },
}

/// Every `reason` of the verification-failure counter: the candidate checks' and the proof's.
pub fn verification_reasons() -> impl Iterator<Item = &'static &'static str> {
    CredentialError::reasons().iter().chain(ProofError::reasons())
}
