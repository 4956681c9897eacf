//! Why a cycle failed: [`CycleError`], whose variant names are the `reason` label of
//! `dns_rewriter_reconcile_errors_total` (the runtime registers every reason at 0 from this enum). The
//! reconciler returns it; nothing here depends on the reconciler.

use kcp_keeper_runtime::marked_block::configmap::KeyError;

use crate::output::OutputError;

/// Why a cycle failed. A rule error is not among them: it leaves that rule out, and the cycle writes the
/// others.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum CycleError {
    /// The ConfigMap to write into does not exist; it is never created.
    #[error(
        "ConfigMap {0} does not exist; dns-rewriter writes into it but never creates it: create it once (the chart does)"
    )]
    ConfigMapMissing(String),
    /// The value failed our own pre-write check, or the Corefile is not one we can safely edit: nothing written.
    #[error("nothing written: {0}")]
    Refused(OutputError),
    #[error("write failed: {0}")]
    WriteFailed(WriteError),
    /// node-local-dns's Corefile could not be written: its cluster domain block is not one we can read, our
    /// own check refused the value, or the write failed. The cluster DNS's rules are written regardless.
    #[error("node-local-dns: {0}")]
    NodeLocalDns(String),
    /// Some names did not answer exactly their Service's ClusterIP.
    #[error("{failed} of {total} names do not answer their Service's ClusterIP: {detail}")]
    NotVerified { failed: usize, total: usize, detail: String },
}

/// Why the write itself failed (after the value passed its check).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The ConfigMap kept changing between our read and our write (each time re-read and recomputed).
    #[error(
        "ConfigMap {0} changed {1} times in a row since it was read; the next cycle recomputes from the new object"
    )]
    Conflict(String, u32),
    #[error("ConfigMap {0}: {1}")]
    Kube(String, kube::Error),
}

impl From<KeyError<OutputError>> for CycleError {
    fn from(e: KeyError<OutputError>) -> Self {
        match e {
            KeyError::Missing(object) => CycleError::ConfigMapMissing(object),
            KeyError::Refused(e) => CycleError::Refused(e),
            KeyError::Conflict(object, n) => CycleError::WriteFailed(WriteError::Conflict(object, n)),
            KeyError::Kube(object, e) => CycleError::WriteFailed(WriteError::Kube(object, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycle_error_reasons_are_its_variant_names() {
        use kcp_keeper_runtime::driver::ErrorReason;
        assert_eq!(
            CycleError::reasons(),
            ["config_map_missing", "refused", "write_failed", "node_local_dns", "not_verified"]
        );
    }
}
