//! ca-syncer's metrics, prefix `ca_syncer_`, and the bookkeeping that keeps their series true. Label sets are
//! bounded by the configuration: bundles, their certificates and their targets. The reconcile metrics
//! (`reconcile_duration_seconds`, `reconcile_errors_total{reason}` from [`crate::error::SyncError`]) are the
//! runtime's.
//!
//! Series follow what the targets hold: a bundle remembers the certificate and target series it set in its last
//! pass ([`Published`]), so those that no longer apply (a target gone from the configuration, a certificate
//! dropped) are removed rather than left stale, and a failing bundle reads 0 rather than vanishing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use kcp_keeper_runtime::consumer_restart::{Consumer, ConsumerMetrics};
use kcp_keeper_runtime::metrics::{GaugeF64, Register};
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use strum::VariantArray as _;

use crate::certs::Certificate;

/// Which public roots are compiled in: `ca_syncer_public_roots_info{package,version,certificates}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PublicRootsLabels {
    pub package: String,
    pub version: String,
    pub certificates: String,
}

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

/// A live-check endpoint of a bundle (its URL as configured) and why it failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub bundle: String,
    pub endpoint: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub bundle: String,
    pub reason: String,
}

/// Why a target was not attempted this cycle; `ca_syncer_skipped_targets{reason}` (every reason's series exists,
/// at 0, before anything is skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum SkipReason {
    /// Its namespace is being deleted: new objects are refused there.
    Terminating,
}

kcp_keeper_runtime::metrics! {
    /// The series of the bundles, their certificates and their targets.
    pub struct BundleMetrics {
        pub public_roots: PublicRoots => "public_roots",
            "The public roots compiled in (publicRoots sources): package, release and certificates";
        pub certificates: Family<BundleLabel, Gauge> => "bundle_certificates",
            "Certificates in each bundle as last built (sources plus retained)";
        pub not_after: Family<CertLabels, GaugeF64> => "certificate_not_after_timestamp" [Seconds],
            "notAfter of each certificate in each bundle";
        pub target_in_sync: Family<TargetLabels, Gauge> => "target_in_sync",
            "1 when the target holds the bundle, 0 otherwise";
        pub source_errors: Family<ReasonLabels, Counter> => "source_errors", "Sources that could not be used, by reason";
        pub live_check_failures: Family<EndpointLabels, Counter> => "live_check_failures",
            "Live-check endpoints that did not verify a bundle (which then was not published), by endpoint";
        pub writes: Family<BundleLabel, Counter> => "target_writes",
            "Writes to targets (a cycle with nothing to do writes nothing)";
        pub last_sync: Family<BundleLabel, GaugeF64> => "last_sync_timestamp" [Seconds],
            "When each bundle was last synced to all its targets";
        /// Targets not attempted this cycle, by reason (`terminating`); every reason present from the first cycle.
        pub skipped_targets: Family<ReasonLabels, Gauge> => "skipped_targets",
            "Targets not attempted in the last cycle, by reason (terminating: the namespace is being deleted)";
    }
}

/// `public_roots_info{package,version,certificates}`: the public roots compiled in, fixed for the process.
#[derive(Clone, Debug)]
pub struct PublicRoots(PublicRootsLabels);

impl Default for PublicRoots {
    fn default() -> Self {
        Self(PublicRootsLabels {
            package: crate::sources::PUBLIC_ROOTS_PACKAGE.into(),
            version: crate::sources::PUBLIC_ROOTS_VERSION.into(),
            certificates: crate::sources::public_roots().len().to_string(),
        })
    }
}

impl EncodeMetric for PublicRoots {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_info(&self.0)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Info
    }
}

/// ca-syncer's metrics and the bookkeeping that keeps their series true.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// The `ca_syncer_*` series of the bundles (declared in [`BundleMetrics`]).
    pub series: BundleMetrics,
    /// Read-once consumers of targets (the runtime's `consumer_restart_pending`,
    /// `consumer_restart_deferred_until_timestamp_seconds`), label `bundle`.
    pub consumers: ConsumerMetrics,
    /// The consumers of the configuration last applied (bundle, namespace, consumer): their series exist from
    /// the start, and those of a consumer no longer configured go (a stale pending 1 would keep its alert up).
    configured_consumers: Arc<Mutex<BTreeSet<(String, String, Consumer)>>>,
    /// Per bundle, the series its last pass set. One map for the process: it outlives a configuration reload,
    /// so a bundle's series are still cleaned up after one.
    published: Arc<Mutex<BTreeMap<String, Published>>>,
}

/// The series one pass of a bundle set.
#[derive(Default, Debug)]
pub struct Published {
    certs: BTreeSet<CertLabels>,
    targets: BTreeSet<TargetLabels>,
}

impl Published {
    /// The target's `target_in_sync` series is this pass's (whatever value it gets).
    pub fn target(&mut self, labels: &TargetLabels) {
        self.targets.insert(labels.clone());
    }
}

impl Register for Metrics {
    fn register(registry: &mut Registry) -> Self {
        Self {
            series: BundleMetrics::register(registry),
            consumers: ConsumerMetrics::register(registry, "bundle"),
            configured_consumers: Arc::default(),
            published: Arc::default(),
        }
    }
}

impl Metrics {
    fn published(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Published>> {
        self.published.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A bundle that cannot be published leaves every target out of sync: each reads 0 (the certificates it
    /// still holds keep their notAfter series).
    pub fn out_of_sync(&self, bundle: &str, targets: impl IntoIterator<Item = TargetLabels>) {
        let mut published = self.published();
        let entry = published.entry(bundle.to_string()).or_default();
        for labels in targets {
            self.series.target_in_sync.get_or_create(&labels).set(0);
            entry.targets.insert(labels);
        }
    }

    /// Sets `skipped_targets{bundle,reason}` (every reason, 0 when none) and drops the in-sync series of the
    /// skipped targets: a target in a namespace being deleted is neither in sync nor out of it.
    pub fn record_skipped(&self, bundle: &str, skipped: &[(TargetLabels, SkipReason)]) {
        for &reason in SkipReason::VARIANTS {
            let count = skipped.iter().filter(|(_, r)| *r == reason).count();
            let labels = ReasonLabels { bundle: bundle.to_string(), reason: <&str>::from(reason).into() };
            self.series.skipped_targets.get_or_create(&labels).set(count as i64);
        }
        let mut published = self.published();
        for (labels, _) in skipped {
            self.series.target_in_sync.remove(labels);
            if let Some(entry) = published.get_mut(bundle) {
                entry.targets.remove(labels);
            }
        }
    }

    /// A target found skipped in the middle of this pass (its namespace refused the create): counted now, not
    /// only from the next cycle on (which may be a resyncInterval away), and without an in-sync series.
    pub fn skipped_now(&self, bundle: &str, labels: &TargetLabels, reason: SkipReason, now: &mut Published) {
        let reason = <&str>::from(reason).into();
        self.series.skipped_targets.get_or_create(&ReasonLabels { bundle: bundle.to_string(), reason }).inc();
        self.series.target_in_sync.remove(labels);
        now.targets.remove(labels);
    }

    /// The notAfter series of each certificate a target now holds.
    pub fn holds(&self, bundle: &str, certificates: &[Certificate], now: &mut Published) {
        for cert in certificates {
            let labels = CertLabels {
                bundle: bundle.to_string(),
                subject: cert.subject().to_string(),
                sha256: cert.fingerprint().to_string()[..16].to_string(),
            };
            self.series.not_after.get_or_create(&labels).set(cert.not_after().unix_timestamp() as f64);
            now.certs.insert(labels);
        }
    }

    /// A configuration was applied: every consumer it names has its series (0 until a pass says otherwise), and
    /// those of consumers it no longer names are removed.
    pub fn consumers_configured(&self, config: &crate::config::Config) {
        let now: BTreeSet<(String, String, Consumer)> = config
            .bundles
            .iter()
            .flat_map(|b| b.targets.iter().map(move |t| (b, t)))
            .filter_map(|(b, t)| match &t.placement {
                crate::config::Placement::Namespace(ns) => Some((b, ns, t)),
                _ => None,
            })
            .flat_map(|(b, ns, t)| t.consumers.iter().map(move |c| (b.name.clone(), ns.clone(), c.clone())))
            .collect();
        let mut last = self.configured_consumers.lock().unwrap_or_else(|e| e.into_inner());
        for (bundle, ns, consumer) in last.difference(&now) {
            self.consumers.forget(bundle, ns, consumer);
        }
        for (bundle, ns, consumer) in &now {
            self.consumers.touch(bundle, ns, consumer);
        }
        *last = now;
    }

    /// Removes the series this bundle set last time and not this time. After a failed write the certificates
    /// published before may still be in that target, so none of their series is removed then.
    pub fn forget_stale(&self, bundle: &str, mut now: Published, some_failed: bool) {
        let mut published = self.published();
        if let Some(before) = published.get(bundle) {
            if some_failed {
                now.certs.extend(before.certs.iter().cloned());
            }
            for gone in before.certs.difference(&now.certs) {
                self.series.not_after.remove(gone);
            }
            for gone in before.targets.difference(&now.targets) {
                self.series.target_in_sync.remove(gone);
            }
        }
        published.insert(bundle.to_string(), now);
    }
}

#[cfg(test)]
mod tests {
    use kcp_keeper_runtime::config::parse;

    use super::*;

    fn config(consumers: &str) -> crate::config::Config {
        let yaml = format!(
            "bundles:\n- name: kcp\n  sources: [{{secret: {{namespace: a, name: ca, key: ca.crt}}}}]\n  targets:\n  - {{configMap: {{namespace: hub, name: kcp-ca, key: ca.crt{consumers}}}}}\n"
        );
        parse(std::path::Path::new("ca-syncer.yaml"), &yaml).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_configured_consumer_has_its_series_at_zero_and_a_removed_one_loses_them_even_while_pending() {
        let mut registry = Registry::with_prefix("ca_syncer");
        let metrics = Metrics::register(&mut registry);
        let text = |registry: &Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, registry).expect("encodes");
            out
        };
        let series = |name: &str| {
            format!(
                "ca_syncer_consumer_restart_pending{{bundle=\"kcp\",namespace=\"hub\",kind=\"Deployment\",name=\"{name}\"}}"
            )
        };
        metrics.consumers_configured(&config(", restartDeployments: [hub, gone]"));
        let out = text(&registry);
        assert!(out.contains(&format!("{} 0", series("hub"))), "{out}");
        let gone = Consumer { kind: kcp_keeper_runtime::consumer_restart::Kind::Deployment, name: "gone".into() };
        metrics.consumers.series.pending.get_or_create(&metrics.consumers.labels("kcp", "hub", &gone)).set(1);
        metrics.consumers_configured(&config(", restartDeployments: [hub]"));
        let out = text(&registry);
        assert!(out.contains(&format!("{} 0", series("hub"))), "{out}");
        assert!(!out.contains(&series("gone")), "{out}");
    }
}
