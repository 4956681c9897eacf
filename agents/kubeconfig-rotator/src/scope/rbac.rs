//! `kubeconfig-rotator rbac` ([`crate::KubeconfigRotator`]'s `Agent::rbac`): the exact Roles a configuration
//! needs, rendered from the same [`needs`] the watches are built from, so the RBAC and what the agent reads
//! cannot drift apart. Every object the
//! configuration names is granted by name (`resourceNames`; list and watch are limited too, through the
//! `metadata.name` field selector every watch uses):
//! - source Secrets: get/list/watch; target Secrets: get/list/watch, create/patch;
//! - kcp-operator `Kubeconfig`s: get/list/watch, patch (the re-render nudge is an annotation);
//! - cert-manager `Certificate`s: get/list/watch, and patch on `certificates/status` (the forced renewal);
//! - consumer Deployments, StatefulSets, DaemonSets: get, patch (the restart annotations);
//! - Events: create, in every namespace it acts in; its own Lease in its own namespace;
//! - targets by namespace selector: create/patch on the Secret and get/patch on its consumers, by name, only in
//!   the namespaces the target's allow list names (a Role in each: even the agent cannot write an admin
//!   kubeconfig anywhere else); a ClusterRole with get/list/watch/delete on exactly those Secret names
//!   (`resourceNames`: the watch that finds the copies to withdraw, wherever they are), list/watch on Namespaces
//!   (their labels are not secret) and create on Events. Never Secrets across the cluster without a name.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::PolicyRule;
use kcp_keeper_runtime::rbac::{Rbac, Subjects, lease_rules, named_rule, rule};

use super::needs;
use crate::config::{Config, ConsumerKind, Placement};

pub const ROLE_NAME: &str = "kcp-keeper-kubeconfig-rotator";

/// Per namespace, the names granted per kind of access.
#[derive(Default)]
struct Access {
    read_secrets: BTreeSet<String>,
    write_secrets: BTreeSet<String>,
    kubeconfigs: BTreeSet<String>,
    certificates: BTreeSet<String>,
    /// Consumers, by kind (their resource name).
    consumers: BTreeMap<&'static str, BTreeSet<String>>,
}

fn at<'a>(namespaces: &'a mut BTreeMap<String, Access>, ns: &str) -> &'a mut Access {
    namespaces.entry(ns.to_string()).or_default()
}

/// One Role (and its binding) per namespace the configuration acts in, and one in the agent's own for its Lease.
pub fn render(config: &Config, who: &Subjects) -> Rbac {
    let mut namespaces: BTreeMap<String, Access> = BTreeMap::new();
    // Selector targets: their Secret names, read and withdrawn wherever a copy is.
    let mut cluster = Access::default();
    for kc in &config.kubeconfigs {
        let n = needs(kc);
        if let Some((ns, name)) = &n.kubeconfig {
            at(&mut namespaces, ns).kubeconfigs.insert(name.clone());
        }
        if let Some((ns, name)) = &n.certificate {
            at(&mut namespaces, ns).certificates.insert(name.clone());
        }
        for (ns, name) in n.source_secrets.iter().chain(&n.target_secrets) {
            at(&mut namespaces, ns).read_secrets.insert(name.clone());
        }
        for (ns, name) in &n.target_secrets {
            at(&mut namespaces, ns).write_secrets.insert(name.clone());
        }
        for (ns, name) in &n.allowed_targets {
            at(&mut namespaces, ns).write_secrets.insert(name.clone());
        }
        cluster.read_secrets.extend(n.cluster_targets.iter().cloned());
        for spec in &kc.targets {
            let placed: Vec<&String> = match &spec.placement {
                Placement::Namespace(ns) => vec![ns],
                Placement::Selector { allowed, .. } => allowed.iter().collect(),
            };
            for ns in placed {
                let access = at(&mut namespaces, ns);
                for c in &spec.target.consumers {
                    access.consumers.entry(c.kind.plural()).or_default().insert(c.name.clone());
                }
            }
        }
    }
    namespaces.entry(who.namespace.clone()).or_default();
    let read = ["get", "list", "watch"];
    let mut roles = Rbac::default();
    for (ns, a) in &namespaces {
        let mut rules: Vec<PolicyRule> = Vec::new();
        let mut add = |group: &str, resource: &str, names: &BTreeSet<String>, verbs: &[&str]| {
            if !names.is_empty() {
                rules.push(named_rule(group, resource, names, verbs));
            }
        };
        add("", "secrets", &a.read_secrets, &read);
        add("", "secrets", &a.write_secrets, &["create", "patch"]);
        add("operator.kcp.io", "kubeconfigs", &a.kubeconfigs, &["get", "list", "watch", "patch"]);
        add("cert-manager.io", "certificates", &a.certificates, &read);
        add("cert-manager.io", "certificates/status", &a.certificates, &["patch"]);
        for kind in ConsumerKind::ALL {
            if let Some(names) = a.consumers.get(kind.plural()) {
                add("apps", kind.plural(), names, &["get", "patch"]);
            }
        }
        if !rules.is_empty() {
            rules.push(rule("events.k8s.io", &["events"], &[], &["create"]));
        }
        if *ns == who.namespace {
            rules.extend(lease_rules(who));
        }
        roles.add(ns, ROLE_NAME, "kubeconfig-rotator", rules, who);
    }
    if !cluster.read_secrets.is_empty() {
        let mut rules = vec![named_rule("", "secrets", &cluster.read_secrets, &["get", "list", "watch", "delete"])];
        rules.push(rule("", &["namespaces"], &[], &["list", "watch"]));
        rules.push(rule("events.k8s.io", &["events"], &[], &["create"]));
        roles.add_cluster(ROLE_NAME, "kubeconfig-rotator", rules, who);
    }
    roles
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn who() -> Subjects {
        Subjects::defaults("kcp-keeper", "kubeconfig-rotator")
    }

    fn example() -> Config {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("example.yaml");
        kcp_keeper_runtime::config::load(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn every_named_kind_is_granted_by_name_only() {
        for role in render(&example(), &who()).roles {
            for rule in role.rules.iter().flatten() {
                let resource = rule.resources.as_ref().unwrap()[0].as_str();
                if !["events", "leases"].contains(&resource) {
                    assert!(rule.resource_names.as_ref().is_some_and(|n| !n.is_empty()), "{resource} without names");
                }
            }
        }
    }

    #[test]
    fn the_docs_show_exactly_what_the_command_renders_for_the_example() {
        let docs =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/kubeconfig-rotator.md"))
                .expect("docs/kubeconfig-rotator.md");
        // The page's worked example (the block opening with this line), loaded as the agent loads its file.
        let start = docs.find("```yaml\n# my-app's admin kubeconfig").expect("the worked example") + "```yaml\n".len();
        let end = start + docs[start..].find("```").expect("the block ends");
        let documented: Config = kcp_keeper_runtime::config::parse(Path::new("worked example"), &docs[start..end])
            .unwrap_or_else(|e| panic!("{e}"));
        let rendered = render(&documented, &who()).to_yaml().expect("renders");
        assert!(
            docs.contains(&format!("```yaml\n{rendered}```")),
            "docs/kubeconfig-rotator.md must show `kubeconfig-rotator rbac` of its worked example verbatim:\n{rendered}"
        );
    }
}
