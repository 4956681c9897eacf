//! ca-syncer's metrics, prefix `ca_syncer_`. Label sets are bounded by the configuration: bundles, their
//! certificates and their targets.

use kcp_keeper_runtime::driver::ReconcileMetrics;
use kcp_keeper_runtime::metrics::GaugeF64;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BundleLabel {
    pub bundle: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct CertLabels {
    pub bundle: String,
    pub subject: String,
    /// First 16 hex digits of the SHA-256 of the DER: tells two CAs with the same subject apart.
    pub sha256: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct TargetLabels {
    pub bundle: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub bundle: String,
    pub reason: String,
}

#[derive(Clone, Debug)]
pub struct Metrics {
    /// `reconcile_duration_seconds`, `reconcile_errors_total{reason}` (reasons: [`crate::controller::SyncError`]).
    pub reconcile: ReconcileMetrics,
    pub certificates: Family<BundleLabel, Gauge>,
    pub not_after: Family<CertLabels, GaugeF64>,
    pub target_in_sync: Family<TargetLabels, Gauge>,
    pub source_errors: Family<ReasonLabels, Counter>,
    pub live_check_failures: Family<ReasonLabels, Counter>,
    pub writes: Family<BundleLabel, Counter>,
    pub last_sync: Family<BundleLabel, GaugeF64>,
    /// Targets not attempted this cycle, by reason (`terminating`); every reason present from the first cycle.
    pub skipped_targets: Family<ReasonLabels, Gauge>,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            reconcile: ReconcileMetrics::register::<crate::controller::SyncError>(registry),
            certificates: Family::default(),
            not_after: Family::default(),
            target_in_sync: Family::default(),
            source_errors: Family::default(),
            live_check_failures: Family::default(),
            writes: Family::default(),
            last_sync: Family::default(),
            skipped_targets: Family::default(),
        };
        registry.register(
            "bundle_certificates",
            "Certificates in each bundle as last built (sources plus retained)",
            m.certificates.clone(),
        );
        registry.register_with_unit(
            "certificate_not_after_timestamp",
            "notAfter of each certificate in each bundle",
            Unit::Seconds,
            m.not_after.clone(),
        );
        registry.register(
            "target_in_sync",
            "1 when the target holds the bundle, 0 otherwise",
            m.target_in_sync.clone(),
        );
        registry.register("source_errors", "Sources that could not be used, by reason", m.source_errors.clone());
        registry.register(
            "live_check_failures",
            "Bundles not published because they did not verify the live endpoint",
            m.live_check_failures.clone(),
        );
        registry.register(
            "target_writes",
            "Writes to targets (a cycle with nothing to do writes nothing)",
            m.writes.clone(),
        );
        registry.register_with_unit(
            "last_sync_timestamp",
            "When each bundle was last synced to all its targets",
            Unit::Seconds,
            m.last_sync.clone(),
        );
        registry.register(
            "skipped_targets",
            "Targets not attempted in the last cycle, by reason (terminating: the namespace is being deleted)",
            m.skipped_targets.clone(),
        );
        m
    }
}
