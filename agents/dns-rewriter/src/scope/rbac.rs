//! `dns-rewriter rbac` (the runtime's subcommand, through [`kcp_keeper_runtime::agent::Agent::rbac`]): the exact
//! Roles a configuration needs, from the same plan the watches are built from ([`crate::scope`]). docs/dns-rewriter.md shows this command's output for `example.yaml` (a test
//! keeps them identical), and the RBAC test runs the agent with a ServiceAccount holding exactly this.
//!
//! What is granted, all namespaced:
//! - the managed ConfigMap's namespace: get/list/watch/patch on that one ConfigMap (`resourceNames`; list and
//!   watch are narrowed by the `metadata.name` field selector; it is never created, so no `create`), and
//!   create on Events (they are about that ConfigMap);
//! - with `nodeLocalDns` on (the default): get/list/watch/patch on node-local-dns's one ConfigMap, by name;
//! - each namespace whose Services the rules or discovery read: list/watch on Services;
//! - without `verify.resolver`: get on the cluster DNS Service, `kube-system/kube-dns` (by name);
//! - the discovery namespace: list/watch on the operator kinds switched on;
//! - the agent's own namespace: its Lease (create cannot be limited by name: the name is not in the URL).

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::PolicyRule;
use kcp_keeper_runtime::rbac::{Rbac, Subjects, lease_rules, rule};

use super::service_scopes;
use crate::config::Config;
use crate::operator::OPERATOR_GROUP;

pub const ROLE_NAME: &str = "kcp-keeper-dns-rewriter";

pub fn render(config: &Config, who: &Subjects) -> Rbac {
    let mut by_namespace: BTreeMap<String, Vec<PolicyRule>> = BTreeMap::new();
    let mut add = |ns: &str, rule: PolicyRule| by_namespace.entry(ns.to_string()).or_default().push(rule);
    let key = config.target.configmap();
    add(&key.namespace, rule("", &["configmaps"], &[&key.name], &["get", "list", "watch", "patch"]));
    add(&key.namespace, rule("events.k8s.io", &["events"], &[], &["create"]));
    if let Some(node_local) = &config.node_local_dns {
        add(&node_local.namespace, rule("", &["configmaps"], &[&node_local.name], &["get", "list", "watch", "patch"]));
        if node_local.namespace != key.namespace {
            add(&node_local.namespace, rule("events.k8s.io", &["events"], &[], &["create"]));
        }
    }
    for ns in service_scopes(config).keys() {
        add(ns, rule("", &["services"], &[], &["list", "watch"]));
    }
    if config.verify.resolver.is_none() {
        // Verification defaults to the cluster DNS Service's ClusterIP: get on that one Service.
        let (ns, name) = crate::config::CLUSTER_DNS_SERVICE;
        add(ns, rule("", &["services"], &[name], &["get"]));
    }
    if let Some(d) = &config.discovery {
        let plurals: Vec<&str> = d.kinds.iter().map(|k| k.plural()).collect();
        add(&d.namespace, rule(OPERATOR_GROUP, &plurals, &[], &["list", "watch"]));
    }
    for lease in lease_rules(who) {
        add(&who.namespace, lease);
    }
    let mut roles = Rbac::default();
    for (ns, rules) in by_namespace {
        roles.add(&ns, ROLE_NAME, "dns-rewriter", rules, who);
    }
    roles
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn who() -> Subjects {
        Subjects::defaults("kcp-keeper", "dns-rewriter")
    }

    fn example() -> Config {
        kcp_keeper_runtime::config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("example.yaml")).unwrap()
    }

    #[test]
    fn configmaps_are_only_ever_granted_by_name_and_nothing_is_cluster_wide() {
        let roles = render(&example(), &who());
        let rules: Vec<&PolicyRule> = roles.roles.iter().flat_map(|r| r.rules.iter().flatten()).collect();
        let configmaps: Vec<&&PolicyRule> =
            rules.iter().filter(|r| r.resources.iter().flatten().any(|res| res == "configmaps")).collect();
        assert_eq!(configmaps.len(), 2);
        assert_eq!(configmaps[0].resource_names.as_deref(), Some(&["coredns-custom".to_string()][..]));
        assert_eq!(configmaps[1].resource_names.as_deref(), Some(&["node-local-dns".to_string()][..]));
        assert!(
            rules.iter().all(|r| !r.verbs.iter().any(|v| v == "delete" || v == "update" && r.resource_names.is_none()))
        );
        let namespaces: Vec<&str> = roles.roles.iter().filter_map(|r| r.metadata.namespace.as_deref()).collect();
        assert_eq!(namespaces, ["kcp-keeper", "kcp-system", "kube-system"]);
    }

    #[test]
    fn the_docs_show_exactly_what_the_command_renders_for_the_example() {
        let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/dns-rewriter.md"))
            .expect("docs/dns-rewriter.md");
        let rendered = render(&example(), &who()).to_yaml().expect("renders");
        assert!(
            docs.contains(&format!("```yaml\n{rendered}```")),
            "docs/dns-rewriter.md must show `dns-rewriter rbac --config example.yaml` verbatim:\n{rendered}"
        );
    }
}
