//! Metrics, prefix `kubeconfig_rotator_`. Labels are bounded by the configuration (kubeconfigs, targets) and by
//! the error enums (reasons, [`crate::error`]). Every series of a configured kubeconfig is created at its first
//! reconcile, with a value, so a kubeconfig that never succeeds still shows (notAfter 0, failures counting). The
//! reconcile metrics (`reconcile_duration_seconds`, `reconcile_errors_total{reason}`, reasons from
//! [`crate::error::SyncError`]) are the runtime's. The reconciler says what happened ([`Metrics::proven`],
//! [`TargetSeries::holds`], ...); which series that moves is kept here.

use kcp_keeper_runtime::metrics::{GaugeF64, Register, at_zero, unix_now};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use time::OffsetDateTime;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kcp_keeper_runtime::consumer_restart::ConsumerMetrics;

use crate::config::{Kubeconfig, Target};
use crate::error::verification_reasons;

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

impl TargetLabels {
    fn of(kubeconfig: &str, target: &Target) -> Self {
        Self { kubeconfig: kubeconfig.into(), namespace: target.namespace.clone(), name: target.name.clone() }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub kubeconfig: String,
    pub reason: String,
}

kcp_keeper_runtime::metrics! {
    /// kubeconfig-rotator's own series; [`Metrics`] adds the consumers' and the targets last seen.
    pub struct RotatorMetrics {
        pub not_after: Family<KubeconfigLabel, GaugeF64> => "certificate_not_after_timestamp" [Seconds],
            "notAfter of the current source credential of each kubeconfig (0 while none is usable)";
        pub expiry: Family<KubeconfigLabel, GaugeF64> => "certificate_expiry" [Seconds],
            "Seconds until the current source credential expires, as of the last reconcile (0 while none is usable)";
        pub target_not_after: Family<TargetLabels, GaugeF64> => "target_not_after_timestamp" [Seconds],
            "notAfter of the credential each target holds (0 when it holds none usable)";
        pub target_in_sync: Family<TargetLabels, Gauge> => "target_in_sync",
            "1 when the target holds the current credential";
        pub last_sync: Family<KubeconfigLabel, GaugeF64> => "last_sync_timestamp" [Seconds],
            "When each kubeconfig was last proven and synced to all its targets";
        pub rotations: Family<KubeconfigLabel, Counter> => "rotations", "Targets that received a new certificate";
        pub verification_failures: Family<ReasonLabels, Counter> => "verification_failures",
            "Candidates not published because they failed a check or the proof, by reason";
        pub nudges: Family<KubeconfigLabel, Counter> => "nudges",
            "Kubeconfig objects annotated to make the operator re-render";
        pub forced_renewals: Family<KubeconfigLabel, Counter> => "forced_renewals",
            "Renewals forced through the Certificate's Issuing condition";
    }
}

#[derive(Clone, Debug)]
pub struct Metrics {
    pub series: RotatorMetrics,
    /// `consumer_restart_pending`, `consumer_restart_deferred_until_timestamp_seconds`, label `kubeconfig`. Kept
    /// out of [`RotatorMetrics`]: its `register` takes the owner label, and it has no `Default`.
    pub consumers: ConsumerMetrics,
    /// The targets each kubeconfig had at its last pass, to drop the series of those gone since.
    known: Arc<Mutex<BTreeMap<String, Vec<Target>>>>,
}

impl Register for Metrics {
    fn register(registry: &mut Registry) -> Self {
        let consumers = ConsumerMetrics::register(registry, "kubeconfig");
        Self { series: RotatorMetrics::register(registry), consumers, known: Arc::default() }
    }
}

impl Metrics {
    /// Creates every series of a kubeconfig with a value, so none appears only on its first event (a kubeconfig
    /// whose candidates are all rejected still shows); its targets' series are [`Metrics::targets`]'.
    pub fn touch(&self, kc: &Kubeconfig) {
        let kubeconfig = kc.name.as_str();
        let label = label(kubeconfig);
        let _ = self.series.not_after.get_or_create(&label);
        let _ = self.series.expiry.get_or_create(&label);
        let _ = self.series.last_sync.get_or_create(&label);
        let _ = self.series.rotations.get_or_create(&label);
        let _ = self.series.nudges.get_or_create(&label);
        let _ = self.series.forced_renewals.get_or_create(&label);
        at_zero(
            &self.series.verification_failures,
            verification_reasons()
                .map(|reason| ReasonLabels { kubeconfig: kubeconfig.into(), reason: (*reason).into() }),
        );
    }

    /// The targets of `kc` this pass (named ones, and a selector target in each namespace selected now): their
    /// series and their consumers' are created with a value, and those of a target no longer there (its
    /// namespace left the selector) are dropped, so no series speaks for a Secret the agent no longer keeps.
    pub fn targets(&self, kc: &Kubeconfig, targets: &[Target]) {
        let kubeconfig = kc.name.as_str();
        for t in targets {
            let labels = TargetLabels::of(kubeconfig, t);
            let _ = self.series.target_in_sync.get_or_create(&labels);
            let _ = self.series.target_not_after.get_or_create(&labels);
            for c in &t.consumers {
                self.consumers.touch(kubeconfig, &t.namespace, c);
            }
        }
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let previous = known.insert(kubeconfig.to_string(), targets.to_vec()).unwrap_or_default();
        for gone in previous.iter().filter(|p| !targets.iter().any(|t| t.namespace == p.namespace && t.name == p.name))
        {
            let labels = TargetLabels::of(kubeconfig, gone);
            self.series.target_in_sync.remove(&labels);
            self.series.target_not_after.remove(&labels);
            for c in &gone.consumers {
                self.consumers.forget(kubeconfig, &gone.namespace, c);
            }
        }
    }

    pub fn verification_failed(&self, kubeconfig: &str, reason: &str) {
        self.series
            .verification_failures
            .get_or_create(&ReasonLabels { kubeconfig: kubeconfig.into(), reason: reason.into() })
            .inc();
    }

    /// A candidate valid until `not_after` was proven at `now`: the source's notAfter and time left.
    pub fn proven(&self, kubeconfig: &str, not_after: OffsetDateTime, now: OffsetDateTime) {
        let label = label(kubeconfig);
        self.series.not_after.get_or_create(&label).set(not_after.unix_timestamp() as f64);
        self.series.expiry.get_or_create(&label).set((not_after - now).as_seconds_f64().max(0.0));
    }

    /// Proven and written to every target, now.
    pub fn synced(&self, kubeconfig: &str) {
        self.series.last_sync.get_or_create(&label(kubeconfig)).set(unix_now());
    }

    /// A target received a new certificate.
    pub fn rotated(&self, kubeconfig: &str) {
        self.series.rotations.get_or_create(&label(kubeconfig)).inc();
    }

    /// The Kubeconfig was annotated to re-render.
    pub fn nudged(&self, kubeconfig: &str) {
        self.series.nudges.get_or_create(&label(kubeconfig)).inc();
    }

    /// A renewal was forced through the Certificate's `Issuing` condition.
    pub fn renewal_forced(&self, kubeconfig: &str) {
        self.series.forced_renewals.get_or_create(&label(kubeconfig)).inc();
    }

    /// The series of one target of `kc`, created if they were not.
    pub fn target(&self, kc: &Kubeconfig, target: &Target) -> TargetSeries {
        let labels = TargetLabels::of(&kc.name, target);
        TargetSeries {
            in_sync: self.series.target_in_sync.get_or_create(&labels).clone(),
            not_after: self.series.target_not_after.get_or_create(&labels).clone(),
        }
    }
}

fn label(kubeconfig: &str) -> KubeconfigLabel {
    KubeconfigLabel { kubeconfig: kubeconfig.into() }
}

/// `target_in_sync` and `target_not_after_timestamp_seconds` of one target.
pub struct TargetSeries {
    in_sync: Gauge,
    not_after: GaugeF64,
}

impl TargetSeries {
    /// The target holds a credential valid until `not_after`; `in_sync` when it is the current one.
    pub fn holds(&self, not_after: OffsetDateTime, in_sync: bool) {
        self.in_sync.set(i64::from(in_sync));
        self.not_after.set(not_after.unix_timestamp() as f64);
    }

    /// The target could not be brought up to date; what it holds is unchanged.
    pub fn not_in_sync(&self) {
        self.in_sync.set(0);
    }
}
