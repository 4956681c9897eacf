//! Metrics, prefix `kubeconfig_rotator_`. Labels are bounded by the configuration (kubeconfigs, targets) and by
//! the error enums (reasons). Every series of a configured kubeconfig is created at its first reconcile, with a
//! value, so a kubeconfig that never succeeds still shows (notAfter 0, failures counting).

use kcp_keeper_runtime::driver::ReconcileMetrics;
use kcp_keeper_runtime::metrics::GaugeF64;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeconfigLabel {
    pub kubeconfig: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabels {
    pub kubeconfig: String,
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub kubeconfig: String,
    pub reason: String,
}

#[derive(Clone, Debug)]
pub struct Metrics {
    /// `reconcile_duration_seconds`, `reconcile_errors_total{reason}` (reasons: [`crate::controller::SyncError`]).
    pub reconcile: ReconcileMetrics,
    pub not_after: Family<KubeconfigLabel, GaugeF64>,
    pub expiry: Family<KubeconfigLabel, GaugeF64>,
    pub target_not_after: Family<TargetLabels, GaugeF64>,
    pub target_in_sync: Family<TargetLabels, Gauge>,
    pub last_sync: Family<KubeconfigLabel, GaugeF64>,
    pub rotations: Family<KubeconfigLabel, Counter>,
    pub verification_failures: Family<ReasonLabels, Counter>,
    pub nudges: Family<KubeconfigLabel, Counter>,
    pub forced_renewals: Family<KubeconfigLabel, Counter>,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            reconcile: ReconcileMetrics::register::<crate::controller::SyncError>(registry),
            not_after: Family::default(),
            expiry: Family::default(),
            target_not_after: Family::default(),
            target_in_sync: Family::default(),
            last_sync: Family::default(),
            rotations: Family::default(),
            verification_failures: Family::default(),
            nudges: Family::default(),
            forced_renewals: Family::default(),
        };
        registry.register_with_unit(
            "certificate_not_after_timestamp",
            "notAfter of the current source credential of each kubeconfig (0 while none is usable)",
            Unit::Seconds,
            m.not_after.clone(),
        );
        registry.register_with_unit(
            "certificate_expiry",
            "Seconds until the current source credential expires, as of the last reconcile (0 while none is usable)",
            Unit::Seconds,
            m.expiry.clone(),
        );
        registry.register_with_unit(
            "target_not_after_timestamp",
            "notAfter of the credential each target holds (0 when it holds none usable)",
            Unit::Seconds,
            m.target_not_after.clone(),
        );
        registry.register("target_in_sync", "1 when the target holds the current credential", m.target_in_sync.clone());
        registry.register_with_unit(
            "last_sync_timestamp",
            "When each kubeconfig was last proven and synced to all its targets",
            Unit::Seconds,
            m.last_sync.clone(),
        );
        registry.register("rotations", "Targets that received a new certificate", m.rotations.clone());
        registry.register(
            "verification_failures",
            "Candidates not published because they failed a check or the proof, by reason",
            m.verification_failures.clone(),
        );
        registry.register("nudges", "Kubeconfig objects annotated to make the operator re-render", m.nudges.clone());
        registry.register(
            "forced_renewals",
            "Renewals forced through the Certificate's Issuing condition",
            m.forced_renewals.clone(),
        );
        m
    }

    /// Creates every series of a kubeconfig and its targets with a value, so none appears only on its first
    /// event (a kubeconfig whose candidates are all rejected still shows its targets).
    pub fn touch(&self, kc: &crate::config::Kubeconfig) {
        let kubeconfig = kc.name.as_str();
        for t in &kc.targets {
            let labels =
                TargetLabels { kubeconfig: kubeconfig.into(), namespace: t.namespace.clone(), name: t.name.clone() };
            let _ = self.target_in_sync.get_or_create(&labels);
            let _ = self.target_not_after.get_or_create(&labels);
        }
        let label = KubeconfigLabel { kubeconfig: kubeconfig.into() };
        let _ = self.not_after.get_or_create(&label);
        let _ = self.expiry.get_or_create(&label);
        let _ = self.last_sync.get_or_create(&label);
        let _ = self.rotations.get_or_create(&label);
        let _ = self.nudges.get_or_create(&label);
        let _ = self.forced_renewals.get_or_create(&label);
        for reason in crate::controller::verification_reasons() {
            let _ = self
                .verification_failures
                .get_or_create(&ReasonLabels { kubeconfig: kubeconfig.into(), reason: (*reason).into() });
        }
    }

    pub fn verification_failed(&self, kubeconfig: &str, reason: &str) {
        self.verification_failures
            .get_or_create(&ReasonLabels { kubeconfig: kubeconfig.into(), reason: reason.into() })
            .inc();
    }
}
