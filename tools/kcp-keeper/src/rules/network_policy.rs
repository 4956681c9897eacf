//! "A NetworkPolicy must not open the agents' credentials to any address": an egress rule that lets a pod reach
//! 443 or 6443 anywhere (no `to`, or an `ipBlock` of prefix length 0) is where an admin kubeconfig or an S3 key
//! can leave. The chart renders such a rule only when a value spells it out (`0.0.0.0/0`); this says so.

use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyEgressRule};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::verdict::Verdict;

pub const CHECK: &str = "network-policy";

/// The ports a credential goes out on: HTTPS (S3, STS, kcp's front proxy) and the apiserver's and kcp's 6443.
pub const WATCHED: [i32; 2] = [443, 6443];

/// The label every NetworkPolicy of the chart carries; the doctor lists those alone.
pub const SELECTOR: &str = "app.kubernetes.io/part-of=kcp-keeper";

/// Why `rule` (number `i`) lets a TCP connection to a watched port reach any address, or None.
fn anywhere(i: usize, rule: &NetworkPolicyEgressRule) -> Option<String> {
    let ports: Vec<i32> = match rule.ports.as_deref() {
        None | Some([]) => WATCHED.to_vec(),
        Some(ports) => WATCHED
            .into_iter()
            .filter(|w| {
                ports.iter().any(|p| {
                    let tcp = p.protocol.as_deref().is_none_or(|proto| proto == "TCP");
                    // A named port resolves per pod to anything: counted, since it may be a watched one.
                    let hit = match &p.port {
                        None | Some(IntOrString::String(_)) => true,
                        Some(IntOrString::Int(n)) => *w == *n || p.end_port.is_some_and(|end| *n <= *w && *w <= end),
                    };
                    tcp && hit
                })
            })
            .collect(),
    };
    if ports.is_empty() {
        return None;
    }
    let on = ports.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    let to = rule.to.as_deref().unwrap_or_default();
    if to.is_empty() {
        return Some(format!("egress rule {i} has no `to` (any address) on {on}"));
    }
    let open: Vec<&str> = to
        .iter()
        .filter_map(|peer| peer.ip_block.as_ref())
        .map(|b| b.cidr.as_str())
        .filter(|cidr| cidr.rsplit_once('/').is_some_and(|(_, prefix)| prefix.trim_start_matches('0').is_empty()))
        .collect();
    (!open.is_empty()).then(|| format!("egress rule {i} allows {} on {on}", open.join(", ")))
}

/// One line per policy of `namespace`: warn when an egress rule reaches any address on 443 or 6443, else ok. No
/// policy at all is a warning too: the doctor is told to look only when the chart renders them.
pub fn judge(namespace: &str, policies: &[NetworkPolicy]) -> Vec<Verdict> {
    if policies.is_empty() {
        return vec![Verdict::warn(
            CHECK,
            format!("networkpolicies in {namespace}"),
            format!("no NetworkPolicy labelled {SELECTOR}"),
            "check that the release rendered its policies (networkPolicy.enabled) and nobody deleted them",
        )];
    }
    policies
        .iter()
        .map(|p| {
            let subject = format!("networkpolicy/{namespace}/{}", p.metadata.name.as_deref().unwrap_or_default());
            let rules = p.spec.as_ref().and_then(|s| s.egress.as_deref()).unwrap_or_default();
            let open: Vec<String> = rules.iter().enumerate().filter_map(|(i, r)| anywhere(i, r)).collect();
            if open.is_empty() {
                Verdict::ok(CHECK, subject, "every egress rule on 443 and 6443 names its peers")
            } else {
                Verdict::warn(
                    CHECK,
                    subject,
                    open.join("; "),
                    "name the peers in the chart's networkPolicy values (the apiserver's endpoint addresses, the S3 \
                     store, kcp's Services) instead of 0.0.0.0/0 or ::/0: the pod holds a credential it could send \
                     to any address",
                )
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Level;
    use serde_json::json;

    fn policy(name: &str, egress: serde_json::Value) -> NetworkPolicy {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": egress},
        }))
        .unwrap()
    }

    #[test]
    fn anywhere_on_443_or_6443_warns_naming_the_rule_and_named_peers_are_ok() {
        let api = json!({"to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}], "ports": [{"port": 6443, "protocol": "TCP"}]});
        let dns = json!({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 53, "protocol": "UDP"}]});
        let lines = judge(
            "kcp-keeper",
            &[
                policy("named", json!([api, dns])),
                policy("v4", json!([api, {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 443}]}])),
                policy(
                    "v6",
                    json!([{"to": [{"ipBlock": {"cidr": "::/0"}}], "ports": [{"port": 6443, "protocol": "TCP"}]}]),
                ),
                policy("no-to", json!([{"ports": [{"port": 443, "protocol": "TCP"}]}])),
                policy("all-ports", json!([{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}]}])),
                policy(
                    "range",
                    json!([{"to": [{"ipBlock": {"cidr": "::/0"}}], "ports": [{"port": 400, "endPort": 500}]}]),
                ),
                policy("elsewhere", json!([{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 7070}]}])),
            ],
        );
        let got: Vec<_> = lines.iter().map(|v| (v.subject.as_str(), v.result)).collect();
        assert_eq!(
            got,
            [
                ("networkpolicy/kcp-keeper/named", Level::Ok),
                ("networkpolicy/kcp-keeper/v4", Level::Warn),
                ("networkpolicy/kcp-keeper/v6", Level::Warn),
                ("networkpolicy/kcp-keeper/no-to", Level::Warn),
                ("networkpolicy/kcp-keeper/all-ports", Level::Warn),
                ("networkpolicy/kcp-keeper/range", Level::Warn),
                ("networkpolicy/kcp-keeper/elsewhere", Level::Ok),
            ],
            "DNS (53) and other ports to anywhere are not this check's; 443/6443 to anywhere are"
        );
        assert_eq!(lines[1].saw, "egress rule 1 allows 0.0.0.0/0 on 443");
        assert_eq!(lines[2].saw, "egress rule 0 allows ::/0 on 6443");
        assert_eq!(lines[3].saw, "egress rule 0 has no `to` (any address) on 443");
        assert_eq!(lines[4].saw, "egress rule 0 allows 0.0.0.0/0 on 443, 6443");
        assert_eq!(lines[5].saw, "egress rule 0 allows ::/0 on 443");
        assert!(lines[1].runbook.ends_with("#doctor-network-policy"));
    }

    #[test]
    fn a_udp_rule_to_anywhere_on_443_is_not_a_tcp_path_and_no_policy_at_all_warns() {
        let udp = policy(
            "udp",
            json!([{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 443, "protocol": "UDP"}]}]),
        );
        assert_eq!(judge("ns", &[udp])[0].result, Level::Ok);
        let none = judge("ns", &[]);
        assert_eq!((none.len(), none[0].result), (1, Level::Warn));
        assert!(none[0].saw.contains(SELECTOR), "{}", none[0].saw);
    }
}
