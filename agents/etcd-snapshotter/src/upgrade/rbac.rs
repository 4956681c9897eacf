//! The RBAC the watch of `beforeUpgrade` needs, beside the agent's own Role: in each namespace of a watched
//! object, get/list/watch on exactly the RootShards and Shards named (a watch by name is authorised against
//! `resourceNames`: its field selector names the object), and create on Events (about those objects). In the
//! agent's own namespace these rules join its Role, which already creates Events.

use std::collections::BTreeMap;

use kcp_keeper_runtime::rbac::{Rbac, Subjects, rule};

use super::Kind;
use crate::config::Config;
use crate::scope::rbac::ROLE;

/// Adds the rules for every shard's `beforeUpgrade` to `rbac`.
pub fn add(rbac: &mut Rbac, config: &Config, agent: &str, who: &Subjects) {
    // namespace -> kind -> names, sorted, so the rendering is stable.
    let mut by_namespace: BTreeMap<&str, BTreeMap<&str, Vec<&str>>> = BTreeMap::new();
    for watched in config.shards.iter().filter_map(|s| s.before_upgrade.as_ref()) {
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

    use super::*;

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
        let mut rbac = crate::scope::rbac::render("etcd-snapshotter", &who);
        add(&mut rbac, &config, "etcd-snapshotter", &who);
        let yaml = rbac.to_yaml().unwrap();
        assert_eq!(rbac.roles.len(), 2, "{yaml}");
        let other = rbac.roles.iter().find(|r| r.metadata.namespace.as_deref() == Some("kcp-system")).unwrap();
        let rules = other.rules.as_ref().unwrap();
        assert_eq!(rules[0].resources.as_deref(), Some(&["rootshards".to_string()][..]));
        assert_eq!(rules[0].resource_names.as_deref(), Some(&["root".to_string()][..]));
        assert_eq!(rules[0].verbs, ["get", "list", "watch"]);
        assert_eq!(rules[1].resources.as_deref(), Some(&["events".to_string()][..]));
        let own = rbac.roles.iter().find(|r| r.metadata.namespace.as_deref() == Some("kcp-keeper")).unwrap();
        let shards = own.rules.as_ref().unwrap().last().unwrap();
        assert_eq!(shards.resources.as_deref(), Some(&["shards".to_string()][..]), "{yaml}");
        assert_eq!(shards.resource_names.as_deref(), Some(&["alpha".to_string()][..]));
        assert_eq!(rbac.role_bindings.len(), 2);
    }
}
