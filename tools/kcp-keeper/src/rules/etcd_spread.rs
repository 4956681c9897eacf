//! etcd members spread across zones with `minDomains: 3`: without it the scheduler may put two of three
//! members in one zone (or all of them on one node), and one outage takes the quorum.

use crate::layout::{EtcdSet, Layout};
use crate::verdict::Verdict;

pub const CHECK: &str = "etcd-spread";
pub const ZONE: &str = "topology.kubernetes.io/zone";

/// `(namespace, service)` a member URL names: `http://<pod>.<service>.<namespace>.svc[...]:2379` or
/// `http://<service>.<namespace>.svc[...]:2379`.
fn service_of(endpoint: &str) -> Option<(String, String)> {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let host = rest.split(['/', ':']).next()?;
    let labels: Vec<&str> = host.split('.').collect();
    let svc = labels.iter().position(|l| *l == "svc")?;
    match svc {
        3.. => Some((labels[svc - 1].to_string(), labels[svc - 2].to_string())),
        2 => Some((labels[1].to_string(), labels[0].to_string())),
        _ => None,
    }
}

fn judge(shard: &str, set: &EtcdSet) -> Verdict {
    let subject = format!("{shard} statefulset/{}", set.name);
    let todo = "add a topologySpreadConstraint on topology.kubernetes.io/zone with minDomains: 3 and whenUnsatisfiable: DoNotSchedule, and 3 members";
    if set.replicas < 3 {
        return Verdict::warn(
            CHECK,
            subject,
            format!("{} member(s): one zone or node outage loses the shard", set.replicas),
            todo,
        );
    }
    let zone = set.spread.iter().find(|s| s.topology_key == ZONE);
    match zone {
        None => Verdict::warn(CHECK, subject, format!("{} members, no spread across {ZONE}", set.replicas), todo),
        Some(s) if s.when_unsatisfiable != "DoNotSchedule" || s.min_domains.unwrap_or(0) < 3 => Verdict::warn(
            CHECK,
            subject,
            format!(
                "zone spread with minDomains {} and whenUnsatisfiable {}: members may share a zone",
                s.min_domains.map_or("unset".into(), |m| m.to_string()),
                s.when_unsatisfiable
            ),
            todo,
        ),
        Some(_) => {
            Verdict::ok(CHECK, subject, format!("{} members spread across zones, minDomains >= 3", set.replicas))
        }
    }
}

pub fn spread(layout: &Layout) -> Vec<Verdict> {
    let mut out = Vec::new();
    for c in layout.shards() {
        let mut services: Vec<(String, String)> = c.etcd_endpoints.iter().filter_map(|e| service_of(e)).collect();
        services.sort();
        services.dedup();
        if services.is_empty() {
            out.push(Verdict::warn(
                CHECK,
                c.subject(),
                format!(
                    "etcd endpoints {:?} name no Service in this cluster: not checked",
                    c.etcd_endpoints.iter().map(|e| kcp_keeper_runtime::redact::url(e)).collect::<Vec<_>>()
                ),
                "check the etcd members' spread where they run",
            ));
        }
        for (namespace, service) in services {
            match layout.etcds.iter().find(|s| s.namespace == namespace && s.service == service) {
                Some(set) => out.push(judge(&c.subject(), set)),
                None => out.push(Verdict::warn(
                    CHECK,
                    c.subject(),
                    format!("no StatefulSet serves {service}.{namespace}: not checked"),
                    "check the etcd members' spread where they run",
                )),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Component, Kind, Spread};
    use crate::verdict::Level;
    use serde_json::json;

    fn layout(replicas: i32, spread: Vec<Spread>) -> Layout {
        let spec = json!({"etcd": {"endpoints": ["http://etcd-root-0.etcd-root.kcp-system.svc.cluster.local:2379",
                                                 "http://etcd-root-1.etcd-root.kcp-system.svc.cluster.local:2379"]}});
        Layout {
            components: vec![Component::parse(Kind::RootShard, "root", &spec).unwrap()],
            etcds: vec![EtcdSet {
                namespace: "kcp-system".into(),
                name: "etcd-root".into(),
                service: "etcd-root".into(),
                replicas,
                spread,
            }],
        }
    }

    fn zone(min: Option<i32>, when: &str) -> Spread {
        Spread { topology_key: ZONE.into(), min_domains: min, when_unsatisfiable: when.into() }
    }

    #[test]
    fn three_members_spread_across_zones_with_min_domains_three_is_ok() {
        let v = spread(&layout(3, vec![zone(Some(3), "DoNotSchedule")]));
        assert_eq!(v.len(), 1, "one verdict per StatefulSet, not per member: {v:?}");
        assert_eq!(v[0].result, Level::Ok);
    }

    #[test]
    fn no_spread_a_low_min_domains_or_a_single_member_warns() {
        assert_eq!(spread(&layout(3, vec![]))[0].result, Level::Warn);
        assert_eq!(spread(&layout(3, vec![zone(None, "DoNotSchedule")]))[0].result, Level::Warn);
        assert_eq!(spread(&layout(3, vec![zone(Some(3), "ScheduleAnyway")]))[0].result, Level::Warn);
        assert_eq!(spread(&layout(1, vec![zone(Some(3), "DoNotSchedule")]))[0].result, Level::Warn);
    }

    #[test]
    fn member_urls_name_their_service_and_namespace() {
        assert_eq!(service_of("http://etcd-0.etcd.ns.svc.cluster.local:2379"), Some(("ns".into(), "etcd".into())));
        assert_eq!(service_of("http://etcd.ns.svc:2379"), Some(("ns".into(), "etcd".into())));
        assert_eq!(service_of("https://10.0.0.1:2379"), None);
        let mut l = layout(3, vec![]);
        l.etcds.clear();
        assert!(spread(&l)[0].saw.contains("not checked"));
    }

    #[test]
    fn endpoints_naming_no_service_are_shown_without_their_userinfo() {
        let spec = json!({"etcd": {"endpoints": ["https://root:hunter2@10.0.0.1:2379", "https://10.0.0.2:2379"]}});
        let l = Layout { components: vec![Component::parse(Kind::RootShard, "root", &spec).unwrap()], etcds: vec![] };
        let v = spread(&l).remove(0);
        assert_eq!(
            v.saw,
            "etcd endpoints [\"https://REDACTED@10.0.0.1:2379\", \"https://10.0.0.2:2379\"] name no Service in this cluster: not checked"
        );
    }
}
