//! The sidecar's metrics, under `ca_syncer_sidecar_`. Freshness is exported as timestamps so alerts compute
//! `time() - x`; error reasons are a closed set.

use kcp_keeper_runtime::metrics::{GaugeF64, ReasonLabel, unix_now};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

/// Every `reason` label value, created at zero so `increase()` works from the first scrape.
const REASONS: &[&str] = &[
    // reading the keys
    "read",
    "missing_key",
    "no_certificates",
    "all_expired",
    // the strict parser (`SourceError::metric_label`)
    "too_large",
    "text_outside_blocks",
    "private_key",
    "forbidden_block",
    "pem_headers",
    "malformed_pem",
    "invalid_base64",
    "invalid_certificate",
    // the output and the watch
    "write",
    "watch",
    // telling the process
    "signal",
    "process_not_found",
    "http",
];

#[derive(Clone, Debug, Default)]
pub(super) struct SidecarMetrics {
    certificates: Gauge,
    earliest_not_after: GaugeF64,
    last_write: GaugeF64,
    last_sync: GaugeF64,
    reloads: Counter,
    errors: Family<ReasonLabel, Counter>,
}

impl SidecarMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register("certificates", "Certificates in the bundle file", m.certificates.clone());
        registry.register_with_unit(
            "earliest_not_after_timestamp",
            "notAfter of the first certificate in the bundle to expire",
            Unit::Seconds,
            m.earliest_not_after.clone(),
        );
        registry.register_with_unit(
            "last_write_timestamp",
            "When the bundle file was last written with new content",
            Unit::Seconds,
            m.last_write.clone(),
        );
        registry.register_with_unit(
            "last_sync_timestamp",
            "When the inputs were last read, valid, and the bundle file found or made up to date",
            Unit::Seconds,
            m.last_sync.clone(),
        );
        registry.register("reloads", "Notifications delivered to the process (signal or HTTP call)", m.reloads.clone());
        registry.register(
            "errors",
            "Rejected updates, failed writes and failed notifications, by reason",
            m.errors.clone(),
        );
        for reason in REASONS {
            let _ = m.errors.get_or_create(&label(reason));
        }
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
        debug_assert!(REASONS.contains(&reason), "unlisted reason {reason}");
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
        let m = SidecarMetrics::register(registry.sub_registry_with_prefix(super::super::METRICS_PREFIX));
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
            assert!(REASONS.contains(&e.metric_label()), "{}", e.metric_label());
        }
    }
}
