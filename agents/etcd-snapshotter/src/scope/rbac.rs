//! The RBAC the daemon needs, printed by `etcd-snapshotter rbac`, for the [`Lease`] it names: get, update and
//! patch on that Lease by name (leader election, and each schedule's tick patched onto it), create on Leases
//! (a create cannot be limited by name: the name is not in its URL), and create on Events. With a
//! configuration, the objects `beforeUpgrade` watches ([`super::watched`]): in each namespace of a watched
//! object, get/list/watch on exactly the RootShards and Shards named (a watch by name is authorised against
//! `resourceNames`: its field selector names the object), list on Pods (the shard's pods, to tell whether the
//! operator's roll began before the snapshot), and create on Events (about those objects). In the
//! agent's own namespace these rules join its Role, which already creates Events. With `snapshotObjects`, the
//! Role also manages the `EtcdSnapshot` and `EtcdShardBackup` objects of its namespace.

use std::collections::BTreeMap;

use kcp_keeper_runtime::rbac::{Rbac, Subjects, rule};

use super::Lease;
use crate::config::Config;
use crate::upgrade::Kind;

/// The Role's (and its binding's) name, which the chart's Role keeps.
pub const ROLE: &str = "etcd-snapshotter";

/// One Role in the agent's namespace, bound to its ServiceAccount, and with a configuration the watched
/// objects' rules ([`watched`]).
pub fn render(agent: &str, who: &Subjects, config: Option<&Config>) -> Rbac {
    let lease = Lease::of(who);
    let mut rules = vec![
        rule("coordination.k8s.io", &["leases"], &[&lease.name], &["get", "update", "patch"]),
        rule("coordination.k8s.io", &["leases"], &[], &["create"]),
        rule("events.k8s.io", &["events"], &[], &["create"]),
    ];
    if config.is_some_and(|c| c.snapshot_objects) {
        // The objects mirroring the bucket, in the agent's namespace (`crate::objects`): applied (create and
        // patch), listed, watched for deletions, and deleted after retention.
        let verbs = ["get", "list", "watch", "create", "patch", "delete"];
        rules.push(rule(crate::objects::GROUP, &["etcdsnapshots", "etcdshardbackups"], &[], &verbs));
        // On-demand snapshot requests: read, and their status written (`crate::requests`).
        rules.push(rule(crate::objects::GROUP, &["etcdsnapshotrequests"], &[], &["get", "list", "watch"]));
        rules.push(rule(crate::objects::GROUP, &["etcdsnapshotrequests/status"], &[], &["patch"]));
    }
    let mut rbac = Rbac::default();
    rbac.add(&lease.namespace, ROLE, agent, rules, who);
    if let Some(config) = config {
        watched(&mut rbac, config, agent, who);
    }
    rbac
}

/// Adds the rules for every object `beforeUpgrade` watches to `rbac`.
fn watched(rbac: &mut Rbac, config: &Config, agent: &str, who: &Subjects) {
    // namespace -> kind -> names, sorted, so the rendering is stable.
    let mut by_namespace: BTreeMap<&str, BTreeMap<&str, Vec<&str>>> = BTreeMap::new();
    for (_, watched) in super::watched(config) {
        let names = by_namespace.entry(&watched.namespace).or_default().entry(watched.kind.plural()).or_default();
        if !names.contains(&watched.name.as_str()) {
            names.push(&watched.name);
            names.sort_unstable();
        }
    }
    for (namespace, kinds) in by_namespace {
        let mut rules: Vec<_> = [Kind::RootShard, Kind::Shard]
            .iter()
            .filter_map(|kind| kinds.get(kind.plural()).map(|names| (kind.plural(), names)))
            .map(|(plural, names)| rule("operator.kcp.io", &[plural], names, &["get", "list", "watch"]))
            .collect();
        // The shards' pods, listed by the operator's labels after a snapshot before an upgrade (`upgrade::roll`):
        // whether the roll may have begun before it. A list cannot be limited by name.
        rules.push(rule("", &["pods"], &[], &["list"]));
        match rbac.roles.iter_mut().find(|r| r.metadata.namespace.as_deref() == Some(namespace)) {
            Some(own) => own.rules.get_or_insert_with(Vec::new).extend(rules),
            None => {
                rules.push(rule("events.k8s.io", &["events"], &[], &["create"]));
                rbac.add(namespace, ROLE, agent, rules, who);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use kcp_keeper_runtime::config::parse;
    use kcp_keeper_runtime::rbac::Subjects;

    use crate::config::Config;

    #[test]
    fn the_docs_show_exactly_what_rbac_prints() {
        let docs = include_str!("../../../../docs/etcd-snapshotter.md");
        let who = Subjects::defaults("kcp-keeper", "etcd-snapshotter");
        let printed = super::render("etcd-snapshotter", &who, None).to_yaml().unwrap();
        assert!(docs.contains(&format!("```yaml\n{printed}```")), "docs/etcd-snapshotter.md#rbac is stale:\n{printed}");
    }

    #[test]
    fn each_watched_objects_namespace_gets_reads_by_name_and_events_and_the_own_namespace_joins_the_role() {
        // The example's first shard already watches RootShard kcp-system/root; its second gets a Shard elsewhere.
        let example = include_str!("../../example.yaml");
        let text = example.replace(
                "    schedule:\n      cron: \"30 */6 * * *\"",
                "    beforeUpgrade: {kind: Shard, namespace: kcp-keeper, name: alpha}\n    schedule:\n      cron: \"30 */6 * * *\"",
            );
        let config: Config = parse(Path::new("c.yaml"), &text).unwrap();
        let who = Subjects::defaults("kcp-keeper", "etcd-snapshotter");
        let rbac = super::render("etcd-snapshotter", &who, Some(&config));
        let yaml = rbac.to_yaml().unwrap();
        assert_eq!(rbac.roles.len(), 2, "{yaml}");
        let other = rbac.roles.iter().find(|r| r.metadata.namespace.as_deref() == Some("kcp-system")).unwrap();
        let rules = other.rules.as_ref().unwrap();
        assert_eq!(rules[0].resources.as_deref(), Some(&["rootshards".to_string()][..]));
        assert_eq!(rules[0].resource_names.as_deref(), Some(&["root".to_string()][..]));
        assert_eq!(rules[0].verbs, ["get", "list", "watch"]);
        assert_eq!(rules[1].resources.as_deref(), Some(&["pods".to_string()][..]));
        assert_eq!(rules[1].verbs, ["list"]);
        assert_eq!(rules[2].resources.as_deref(), Some(&["events".to_string()][..]));
        let own = rbac.roles.iter().find(|r| r.metadata.namespace.as_deref() == Some("kcp-keeper")).unwrap();
        let own_rules = own.rules.as_ref().unwrap();
        let shards = own_rules.iter().find(|r| r.resources.as_deref() == Some(&["shards".to_string()][..])).unwrap();
        assert_eq!(shards.resource_names.as_deref(), Some(&["alpha".to_string()][..]), "{yaml}");
        assert!(own_rules.iter().any(|r| r.resources.as_deref() == Some(&["pods".to_string()][..])), "{yaml}");
        assert_eq!(rbac.role_bindings.len(), 2);
    }
}
