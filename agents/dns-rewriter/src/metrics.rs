//! dns-rewriter's metrics, prefix `dns_rewriter_`, updated by the reconciler. Every series an alert reads exists
//! with a value from the start and stays when something fails: a rule error reason reads 0 until it happens, a
//! host that stops answering reads `verified 0` with the time of its last check. A host's series go only when
//! the host leaves the rules.
//!
//! - `dns_rewriter_rules`: rules in the last planned value;
//! - `dns_rewriter_rule_errors{reason}`: rules left out by the last plan, by [`RuleError::reason`];
//! - `dns_rewriter_write_timestamp_seconds`: the last successful write of the target key;
//! - `dns_rewriter_adopted_lines_total`: rule lines found without our markers (after a kubeadm CoreDNS
//!   upgrade) and adopted into the block by a write;
//! - `dns_rewriter_node_local_dns_detected`: 1 when node-local-dns's ConfigMap exists (NodeLocal DNSCache is
//!   in the cluster and its Corefile is managed), else 0;
//! - `dns_rewriter_node_local_dns_write_timestamp_seconds`: the last successful write of node-local-dns's
//!   Corefile;
//! - `dns_rewriter_host_verified{host}`: 1 when the last check of `host` answered exactly its Service's
//!   ClusterIP under its own name through every resolver a pod can be given (the cluster DNS Service and
//!   node-local-dns's listen addresses), else 0;
//! - `dns_rewriter_host_check_timestamp_seconds{host}`: when `host` was last checked;
//! - `dns_rewriter_verify_timestamp_seconds`: when verification last ran (a resolver known and answering);
//!   0 until then, so `time() - x` alerts when it never ran;
//! - the runtime's `dns_rewriter_reconcile_duration_seconds`, `dns_rewriter_reconcile_errors_total{reason}`
//!   (reasons: [`crate::error::CycleError`], registered by the runtime from that enum),
//!   `dns_rewriter_reconcile_pass_timestamp_seconds` (when the last cycle finished) and `dns_rewriter_leader`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use kcp_keeper_runtime::metrics::{GaugeF64, ReasonLabel, Register, at_zero, unix_now};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::plan::{Plan, RuleError};
use crate::verify::{HostCheck, Outcome};

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct HostLabel {
    pub host: String,
}

kcp_keeper_runtime::metrics! {
    /// dns-rewriter's series; [`Metrics`] adds which hosts have series.
    pub struct RewriterMetrics {
        pub rules: Gauge => "rules", "Rules in the last planned value";
        pub rule_errors: Family<ReasonLabel, Gauge> => "rule_errors", "Rules left out by the last plan, by reason";
        pub write_timestamp: GaugeF64 => "write_timestamp" [Seconds],
            "When the target key was last written successfully";
        pub adopted: Counter => "adopted_lines",
            "Rule lines found without kcp-keeper's markers (after a kubeadm CoreDNS upgrade) and adopted into the block";
        pub node_local_detected: Gauge => "node_local_dns_detected",
            "1 when node-local-dns's ConfigMap exists and its Corefile is managed";
        pub node_local_written: GaugeF64 => "node_local_dns_write_timestamp" [Seconds],
            "When node-local-dns's Corefile was last written successfully";
        pub verified: GaugeF64 => "verify_timestamp" [Seconds],
            "When verification through the cluster DNS last ran (a resolver known and answering)";
        pub host_verified: Family<HostLabel, Gauge> => "host_verified",
            "1 when the host last answered exactly its Service's ClusterIP under its own name";
        pub host_checked: Family<HostLabel, GaugeF64> => "host_check_timestamp" [Seconds],
            "When the host was last checked through the resolver";
    }
}

#[derive(Clone, Debug)]
pub struct Metrics {
    series: RewriterMetrics,
    /// The hosts with series, so a host that left the rules can be removed.
    hosts: Arc<Mutex<BTreeSet<HostLabel>>>,
}

impl Register for Metrics {
    /// Registers under `registry` (the agent's prefixed sub-registry), every rule error reason at 0.
    fn register(registry: &mut Registry) -> Self {
        let series = RewriterMetrics::register(registry);
        at_zero(&series.rule_errors, RuleError::REASONS.iter().map(|reason| ReasonLabel { reason: (*reason).into() }));
        Self { series, hosts: Arc::default() }
    }
}

impl Metrics {
    /// Records a plan: rule count, and errors by reason (every reason keeps a value).
    pub fn observe_plan(&self, plan: &Plan) {
        self.series.rules.set(i64::try_from(plan.rules.len()).unwrap_or(i64::MAX));
        for reason in RuleError::REASONS {
            let n = plan.errors.iter().filter(|e| e.reason() == *reason).count();
            self.series.rule_errors.get_or_create(&ReasonLabel { reason: (*reason).into() }).set(n as i64);
        }
        let current: BTreeSet<HostLabel> =
            plan.rules.iter().map(|(host, _)| HostLabel { host: host.as_str().into() }).collect();
        let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        for gone in hosts.difference(&current) {
            self.series.host_verified.remove(gone);
            self.series.host_checked.remove(gone);
        }
        // A new host reads "not verified" until its first check.
        at_zero(&self.series.host_verified, current.iter().cloned());
        *hosts = current;
    }

    pub fn wrote(&self) {
        self.series.write_timestamp.set(unix_now());
    }

    pub fn node_local_detected(&self, detected: bool) {
        self.series.node_local_detected.set(i64::from(detected));
    }

    pub fn node_local_wrote(&self) {
        self.series.node_local_written.set(unix_now());
    }

    pub fn verification_ran(&self) {
        self.series.verified.set(unix_now());
    }

    pub fn adopted(&self, lines: usize) {
        self.series.adopted.inc_by(lines as u64);
    }

    /// Records checks: 1 for a match, 0 for anything else, and the time of the check.
    pub fn observe_checks(&self, checks: &[HostCheck]) {
        let now = unix_now();
        for c in checks {
            let label = HostLabel { host: c.host.as_str().into() };
            self.series.host_verified.get_or_create(&label).set(i64::from(c.outcome == Outcome::Match));
            self.series.host_checked.get_or_create(&label).set(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostname::Hostname;
    use crate::rules::{RuleSet, ServiceRef, Target};

    fn registry() -> (Registry, Metrics) {
        let mut root = Registry::default();
        let m = Metrics::register(root.sub_registry_with_prefix("dns_rewriter"));
        (root, m)
    }

    fn plan(hosts: &[&str], errors: Vec<RuleError>) -> Plan {
        let mut rules = RuleSet::new();
        for h in hosts {
            let target = Target { service: ServiceRef::parse("kcp-system", "root-kcp").unwrap(), cluster_ip: None };
            rules.insert(Hostname::parse(h).unwrap(), target).unwrap();
        }
        Plan { rules, errors, warnings: vec![] }
    }

    fn check(host: &str, outcome: Outcome) -> HostCheck {
        HostCheck {
            host: Hostname::parse(host).unwrap(),
            expected: None,
            answered: vec![],
            other_names: vec![],
            outcome,
            resolver: None,
        }
    }

    #[test]
    fn every_rule_error_reason_is_exported_at_zero_from_the_start() {
        let (root, _) = registry();
        let text = kcp_keeper_runtime::metrics::encode(&root);
        for reason in RuleError::REASONS {
            assert!(text.contains(&format!("dns_rewriter_rule_errors{{reason=\"{reason}\"}} 0")), "{reason}\n{text}");
        }
        assert!(text.contains("dns_rewriter_rules 0"), "{text}");
        assert!(text.contains("dns_rewriter_write_timestamp_seconds 0"), "{text}");
        assert!(text.contains("dns_rewriter_adopted_lines_total 0"), "{text}");
        assert!(text.contains("dns_rewriter_verify_timestamp_seconds 0"), "{text}");
        assert!(text.contains("dns_rewriter_node_local_dns_detected 0"), "{text}");
        assert!(text.contains("dns_rewriter_node_local_dns_write_timestamp_seconds 0"), "{text}");
    }

    #[test]
    fn a_failing_host_keeps_its_series_at_zero_and_a_removed_host_loses_them() {
        let (root, m) = registry();
        let error = RuleError::InvalidUrl { origin: crate::discovery::Origin::Rule(0) };
        m.observe_plan(&plan(&["a.example.com", "b.example.com"], vec![error]));
        let text = kcp_keeper_runtime::metrics::encode(&root);
        assert!(text.contains("dns_rewriter_rules 2"), "{text}");
        assert!(text.contains("dns_rewriter_rule_errors{reason=\"invalid_url\"} 1"), "{text}");
        assert!(
            text.contains("dns_rewriter_host_verified{host=\"b.example.com\"} 0"),
            "not verified until checked\n{text}"
        );

        m.observe_checks(&[check("a.example.com", Outcome::Match), check("b.example.com", Outcome::Mismatch)]);
        let text = kcp_keeper_runtime::metrics::encode(&root);
        assert!(text.contains("dns_rewriter_host_verified{host=\"a.example.com\"} 1"), "{text}");
        assert!(text.contains("dns_rewriter_host_verified{host=\"b.example.com\"} 0"), "{text}");
        assert!(text.contains("dns_rewriter_host_check_timestamp_seconds{host=\"b.example.com\"}"), "{text}");

        m.observe_plan(&plan(&["a.example.com"], vec![]));
        let text = kcp_keeper_runtime::metrics::encode(&root);
        assert!(!text.contains("b.example.com"), "{text}");
        assert!(text.contains("dns_rewriter_rule_errors{reason=\"invalid_url\"} 0"), "{text}");
        assert!(text.contains("dns_rewriter_host_verified{host=\"a.example.com\"} 1"), "{text}");
    }
}
