//! The sidecar's metrics, under `ca_syncer_sidecar_`. Freshness is exported as timestamps so alerts compute
//! `time() - x`; error reasons are a closed set.

use kcp_keeper_runtime::metrics::{GaugeF64, ReasonLabel, at_zero, unix_now};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use strum::VariantNames as _;

/// Every `reason` label value of `errors_total`, created at zero so `increase()` works from the first scrape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
#[expect(dead_code, reason = "the parser's variants are only names: its labels come from `SourceError::metric_label`")]
pub(super) enum Reason {
    // reading the keys
    Read,
    MissingKey,
    NoCertificates,
    AllExpired,
    // the strict parser (`SourceError::metric_label`)
    TooLarge,
    TextOutsideBlocks,
    PrivateKey,
    ForbiddenBlock,
    PemHeaders,
    MalformedPem,
    InvalidBase64,
    InvalidCertificate,
    // the output and the watch
    Write,
    Watch,
    // telling the process
    Signal,
    ProcessNotFound,
    Http,
}

kcp_keeper_runtime::metrics! {
    pub(super) struct SidecarMetrics {
        pub certificates: Gauge => "certificates", "Certificates in the bundle file";
        pub earliest_not_after: GaugeF64 => "earliest_not_after_timestamp" [Seconds],
            "notAfter of the first certificate in the bundle to expire";
        pub last_write: GaugeF64 => "last_write_timestamp" [Seconds],
            "When the bundle file was last written with new content";
        pub last_sync: GaugeF64 => "last_sync_timestamp" [Seconds],
            "When the inputs were last read, valid, and the bundle file found or made up to date";
        pub reloads: Counter => "reloads", "Notifications delivered to the process (signal or HTTP call)";
        pub errors: Family<ReasonLabel, Counter> => "errors",
            "Rejected updates, failed writes and failed notifications, by reason";
    }
}

impl SidecarMetrics {
    /// The sidecar's series in `registry`, every error reason at 0.
    pub(super) fn start(registry: &mut kcp_keeper_runtime::metrics::Registry) -> Self {
        let m = Self::register(registry);
        at_zero(&m.errors, Reason::VARIANTS.iter().copied().map(label));
        m
    }

    pub(super) fn set_bundle(&self, certificates: usize, earliest_not_after: Option<time::OffsetDateTime>) {
        self.certificates.set(i64::try_from(certificates).unwrap_or(i64::MAX));
        // Precision below a second is irrelevant for an expiry; an empty bundle has none.
        #[allow(clippy::cast_precision_loss)]
        self.earliest_not_after.set(earliest_not_after.map_or(0.0, |t| t.unix_timestamp() as f64));
    }

    pub(super) fn mark_written(&self) {
        self.last_write.set(unix_now());
    }

    pub(super) fn mark_synced(&self) {
        self.last_sync.set(unix_now());
    }

    pub(super) fn mark_reloaded(&self) {
        self.reloads.inc();
    }

    pub(super) fn error(&self, reason: &'static str) {
        debug_assert!(Reason::VARIANTS.contains(&reason), "unlisted reason {reason}");
        self.errors.get_or_create(&label(reason)).inc();
    }
}

fn label(reason: &str) -> ReasonLabel {
    ReasonLabel { reason: reason.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_carry_the_sidecar_prefix_units_and_zeroed_reasons() {
        let mut registry = kcp_keeper_runtime::metrics::registry(super::super::METRICS_PREFIX);
        let m = SidecarMetrics::start(registry.sub_registry_with_prefix(super::super::METRICS_PREFIX));
        m.set_bundle(3, None);
        m.mark_written();
        m.mark_reloaded();
        m.error("private_key");
        let text = kcp_keeper_runtime::metrics::encode(&registry);
        for expected in [
            "ca_syncer_sidecar_certificates 3",
            "ca_syncer_sidecar_last_write_timestamp_seconds ",
            "ca_syncer_sidecar_last_sync_timestamp_seconds ",
            "ca_syncer_sidecar_earliest_not_after_timestamp_seconds ",
            "ca_syncer_sidecar_reloads_total 1",
            "ca_syncer_sidecar_errors_total{reason=\"private_key\"} 1",
            "ca_syncer_sidecar_errors_total{reason=\"http\"} 0",
        ] {
            assert!(text.contains(expected), "{expected} missing in\n{text}");
        }
    }

    #[test]
    fn every_input_error_reason_is_listed() {
        // The parser's labels must all be pre-created; a new parser error kind must be added here.
        use crate::certs::{BlockKind, SourceError};
        let errors = [
            SourceError::TooLarge { size: 0, limit: 0 },
            SourceError::TextOutsideBlocks { block: 1, line: 1 },
            SourceError::ForbiddenBlock { block: 1, line: 1, kind: BlockKind::PrivateKey },
            SourceError::ForbiddenBlock { block: 1, line: 1, kind: BlockKind::PublicKey },
            SourceError::HeadersPresent { block: 1, line: 1 },
            SourceError::InvalidBase64 { block: 1, line: 1 },
            SourceError::NoCertificates,
        ];
        for e in errors {
            assert!(Reason::VARIANTS.contains(&e.metric_label()), "{}", e.metric_label());
        }
    }
}
