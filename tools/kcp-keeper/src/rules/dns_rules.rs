//! The DNS rules' verification as dns-rewriter reports it: whether each public kcp hostname it rewrites answered
//! its Service's ClusterIP through every resolver a pod can be given, read from the agent's own metrics. Only the
//! Lease holder plans, writes and verifies, so of the replicas read the leading one is judged.

use std::collections::BTreeMap;

use crate::verdict::Verdict;

pub const CHECK: &str = "dns-rules";
const AGENT: &str = "dns-rewriter";

/// What one replica's `/metrics` says (0 or empty for what it does not export).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Replica {
    /// `dns_rewriter_leader` was seen at all: the text is dns-rewriter's.
    pub seen: bool,
    pub leader: bool,
    pub verified_at: f64,
    /// Per host: verified (1) or not (0), and when it was last checked.
    pub hosts: BTreeMap<String, (f64, f64)>,
    /// Rules the last plan left out, by reason (only reasons with some).
    pub rule_errors: BTreeMap<String, f64>,
}

pub fn parse(text: &str) -> Replica {
    let mut r = Replica::default();
    for s in super::samples(text) {
        match (s.name, s.label("host"), s.label("reason")) {
            ("dns_rewriter_leader", ..) => {
                r.seen = true;
                r.leader = s.value >= 1.0;
            }
            ("dns_rewriter_verify_timestamp_seconds", ..) => r.verified_at = s.value,
            ("dns_rewriter_host_verified", Some(host), _) => r.hosts.entry(host).or_default().0 = s.value,
            ("dns_rewriter_host_check_timestamp_seconds", Some(host), _) => {
                r.hosts.entry(host).or_default().1 = s.value
            }
            ("dns_rewriter_rule_errors", _, Some(reason)) if s.value > 0.0 => {
                r.rule_errors.insert(reason, s.value);
            }
            _ => {}
        }
    }
    r
}

fn ago(now: f64, at: f64) -> String {
    format!("{:.0} s ago", (now - at).max(0.0))
}

/// The leading replica's verification: one line per host, and one for the agent when it has not verified,
/// leaves rules out or has none.
pub fn judge(replicas: &[Replica], now: f64) -> Vec<Verdict> {
    let ours: Vec<&Replica> = replicas.iter().filter(|r| r.seen).collect();
    if ours.is_empty() {
        return vec![Verdict::fail(
            CHECK,
            AGENT,
            format!("none of the {} endpoints read exports dns_rewriter_leader", replicas.len()),
            "point --rewriter-metrics at dns-rewriter's /metrics",
        )];
    }
    // Two replicas may both say they lead for a moment around a handover: the one that verified last.
    let Some(leader) = ours.iter().filter(|r| r.leader).max_by(|a, b| a.verified_at.total_cmp(&b.verified_at)) else {
        return vec![Verdict::fail(
            CHECK,
            AGENT,
            format!("none of its {} replicas read holds the Lease: no one writes or verifies the rules", ours.len()),
            "see the agent's logs and its Lease; read every replica (a headless Service's name)",
        )];
    };
    if leader.verified_at <= 0.0 {
        return vec![Verdict::fail(
            CHECK,
            AGENT,
            "the leader has not verified its rules: no cluster DNS known or answering",
            "see the agent's log and KcpKeeperDNSNotVerified's runbook entry",
        )];
    }
    let mut out = Vec::new();
    if !leader.rule_errors.is_empty() {
        let errors: Vec<String> = leader.rule_errors.iter().map(|(reason, n)| format!("{reason} {n}")).collect();
        out.push(Verdict::warn(
            CHECK,
            AGENT,
            format!("rules left out of the CoreDNS configuration: {}", errors.join(", ")),
            "the agent's Events name each rule (KcpKeeperDNSRuleRejected's runbook entry)",
        ));
    }
    if leader.hosts.is_empty() {
        out.push(Verdict::warn(
            CHECK,
            AGENT,
            format!("no rule planned (verified {})", ago(now, leader.verified_at)),
            "configure rules or discovery, or check that the operator's objects name public hostnames",
        ));
    }
    for (host, (verified, checked)) in &leader.hosts {
        out.push(if *verified >= 1.0 {
            Verdict::ok(CHECK, host, format!("answers its Service's ClusterIP (checked {})", ago(now, *checked)))
        } else {
            Verdict::fail(
                CHECK,
                host,
                format!("did not answer exactly its Service's ClusterIP when last checked ({})", ago(now, *checked)),
                "dns-rewriter check in the agent's pod (KcpKeeperDNSHostWrongAddress's runbook entry)",
            )
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Level;

    const LEADER: &str = "# TYPE dns_rewriter_leader gauge\n\
dns_rewriter_leader 1\n\
dns_rewriter_verify_timestamp_seconds 1000.5\n\
dns_rewriter_host_verified{host=\"root.kcp.example.com\"} 1\n\
dns_rewriter_host_check_timestamp_seconds{host=\"root.kcp.example.com\"} 1000.0\n\
dns_rewriter_host_verified{host=\"alpha.kcp.example.com\"} 0\n\
dns_rewriter_host_check_timestamp_seconds{host=\"alpha.kcp.example.com\"} 990.0\n\
dns_rewriter_rule_errors{reason=\"headless_service\"} 0\n\
dns_rewriter_rule_errors{reason=\"target_unresolved\"} 2\n";
    const FOLLOWER: &str = "dns_rewriter_leader 0\ndns_rewriter_verify_timestamp_seconds 0\n\
dns_rewriter_rule_errors{reason=\"target_unresolved\"} 0\n";

    fn get(v: &[Verdict], subject: &str) -> Level {
        v.iter().find(|x| x.subject == subject).map(|x| x.result).unwrap_or_else(|| panic!("{subject}: {v:?}"))
    }

    #[test]
    fn the_leaders_hosts_are_judged_each_and_its_rule_errors_warn() {
        let v = judge(&[parse(FOLLOWER), parse(LEADER)], 1010.0);
        assert_eq!(get(&v, "root.kcp.example.com"), Level::Ok);
        assert_eq!(get(&v, "alpha.kcp.example.com"), Level::Fail);
        assert_eq!(get(&v, AGENT), Level::Warn);
        let agent = v.iter().find(|x| x.subject == AGENT).unwrap();
        assert!(agent.saw.contains("target_unresolved 2") && !agent.saw.contains("headless"), "{}", agent.saw);
        assert_eq!(v.len(), 3, "{v:?}");
    }

    #[test]
    fn a_follower_alone_or_no_dns_rewriter_at_all_fails_and_says_which() {
        let alone = judge(&[parse(FOLLOWER)], 1010.0);
        assert_eq!(alone.len(), 1);
        assert_eq!(alone[0].result, Level::Fail);
        assert!(alone[0].saw.contains("holds the Lease"), "{}", alone[0].saw);
        let other = judge(&[parse("etcd_snapshotter_leader 1\n")], 1010.0);
        assert!(other[0].saw.contains("dns_rewriter_leader"), "{}", other[0].saw);
    }

    #[test]
    fn a_leader_that_never_verified_fails_and_one_with_no_rules_warns() {
        let never = judge(&[parse("dns_rewriter_leader 1\ndns_rewriter_verify_timestamp_seconds 0\n")], 10.0);
        assert_eq!((never.len(), never[0].result), (1, Level::Fail));
        let empty = judge(&[parse("dns_rewriter_leader 1\ndns_rewriter_verify_timestamp_seconds 5\n")], 10.0);
        assert_eq!((empty.len(), empty[0].result), (1, Level::Warn));
    }
}
