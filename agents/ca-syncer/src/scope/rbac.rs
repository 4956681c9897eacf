//! `ca-syncer rbac`: the exact Roles a configuration needs, rendered from the same [`Plan`] the watches are
//! built from, so the RBAC and what the agent does cannot drift apart. [`crate::CaSyncer`]'s `Agent::rbac`
//! calls [`render`]; the runtime's [`Rbac`] gives the objects their shape and YAML.
//!
//! Why a subcommand and not a static file: the narrowing that matters (`resourceNames` on Secrets) comes from
//! the names in the configuration, so the configuration is the only exact source. docs/ca-syncer.md shows
//! this command's output for `example.yaml` (a test keeps it identical), the RBAC test applies the output
//! for its own configuration, and a chart renders the same from its values or ships the output.
//!
//! What is granted:
//! - in each namespace the configuration names: get/list/watch on exactly the Secrets and ConfigMaps named
//!   there, trust stores' password Secrets among them (list and watch are limited by `resourceNames` through
//!   the `metadata.name` field selector every watch uses), create/patch on the targets among them, get/patch on exactly the Deployments, StatefulSets
//!   and DaemonSets those targets roll (`restartDeployments`...), create on Events where a source is or a
//!   target rolls a consumer (a namespace that only holds targets gets none: a pass is told on its source);
//! - in a namespace a selector source reads from: list/watch on that kind without names (RBAC has no label
//!   narrowing; the watch carries the label selector, and there is no `get`, so no object is read by name);
//! - for namespace-selector targets: a ClusterRole with the same verbs on that object name only, list/watch on
//!   Namespaces (their labels are not secret), and no Events;
//! - in the agent's own namespace: each bundle's rotation record ([`crate::state`]: get/update by name, and
//!   create, which cannot be limited by name), create on Events (about file sources, on the Lease), and its
//!   Lease (create again not limited by name: the name of an object to create is not in the URL, so RBAC never
//!   sees it).

use std::collections::{BTreeMap, BTreeSet};

use kcp_keeper_runtime::consumer_restart::Kind as ConsumerKind;
use kcp_keeper_runtime::rbac::{Rbac, Subjects, lease_rules, named_rule as rule};

use crate::config::{Config, Placement, Source, TargetKind};
use crate::scope::Plan;

/// The name of every Role, ClusterRole and binding rendered.
pub const ROLE_NAME: &str = "kcp-keeper-ca-syncer";

/// The `app.kubernetes.io/name` label on each of them.
const APP: &str = "ca-syncer";

/// What a selector source of Secrets grants beyond what the agent reads: RBAC has no label narrowing.
fn every_secret_note(namespace: &str) -> String {
    format!(
        "Secret selector source: list/watch on every Secret of namespace {namespace}. The agent's own watch asks\n\
         with its label selector, but the token may list without one: a list returns every Secret there, private\n\
         keys and tokens included. Keep only CA Secrets in {namespace}."
    )
}

/// Per namespace: which Secrets and ConfigMaps are read, and which are written.
#[derive(Default)]
struct Access {
    read: BTreeMap<TargetKind, BTreeSet<String>>,
    /// Kinds listed and watched by label selector.
    by_label: BTreeSet<TargetKind>,
    write: BTreeMap<TargetKind, BTreeSet<String>>,
    /// Read-once consumers of targets there, rolled by name.
    consumers: BTreeMap<ConsumerKind, BTreeSet<String>>,
}

/// Everything `config` needs, for `who`: one Role per namespace (the agent's own among them), then the
/// ClusterRole the namespace-selector targets need, if any.
pub fn render(config: &Config, who: &Subjects) -> Rbac {
    let plan = Plan::of(config);
    let mut namespaces: BTreeMap<String, Access> = BTreeMap::new();
    for named in &plan.named {
        if let Some(ns) = &named.namespace {
            namespaces.entry(ns.clone()).or_default().read.entry(named.kind).or_default().insert(named.name.clone());
        }
    }
    for (kind, ns, _) in &plan.selected {
        namespaces.entry(ns.clone()).or_default().by_label.insert(*kind);
    }
    for bundle in &config.bundles {
        for target in &bundle.targets {
            if let Placement::Namespace(ns) = &target.placement {
                let access = namespaces.entry(ns.clone()).or_default();
                access.write.entry(target.kind).or_default().insert(target.name.clone());
                for consumer in &target.consumers {
                    access.consumers.entry(consumer.kind).or_default().insert(consumer.name.clone());
                }
            }
        }
    }
    namespaces.entry(who.namespace.clone()).or_default();
    let told = told_in(config, who);

    let mut rbac = Rbac::default();
    for (ns, access) in &namespaces {
        let mut rules = Vec::new();
        for kind in [TargetKind::Secret, TargetKind::ConfigMap] {
            if let Some(names) = access.read.get(&kind) {
                rules.push(rule("", resource(kind), names, &["get", "list", "watch"]));
            }
            if access.by_label.contains(&kind) {
                rules.push(rule("", resource(kind), &BTreeSet::new(), &["list", "watch"]));
            }
            if let Some(names) = access.write.get(&kind) {
                rules.push(rule("", resource(kind), names, &["create", "patch"]));
            }
        }
        // Consumers are read and rolled (one apply of two annotations) by name; nothing is listed or watched.
        for kind in ConsumerKind::ALL {
            if let Some(names) = access.consumers.get(&kind) {
                rules.push(rule("apps", kind.plural(), names, &["get", "patch"]));
            }
        }
        if *ns == who.namespace {
            let records: BTreeSet<String> = config.bundles.iter().map(|b| crate::state::object_name(&b.name)).collect();
            rules.push(rule("", "configmaps", &records, &["get", "update"]));
            rules.push(rule("", "configmaps", &BTreeSet::new(), &["create"]));
        }
        if told.contains(ns) {
            rules.push(rule("events.k8s.io", "events", &BTreeSet::new(), &["create"]));
        }
        if *ns == who.namespace {
            rules.extend(lease_rules(who));
        }
        rbac.add(ns, ROLE_NAME, APP, rules, who);
        if access.by_label.contains(&TargetKind::Secret) {
            rbac.note(ns, ROLE_NAME, every_secret_note(ns));
        }
    }

    if !plan.cluster_wide.is_empty() {
        let mut rules = Vec::new();
        for kind in [TargetKind::Secret, TargetKind::ConfigMap, TargetKind::ClusterTrustBundle] {
            let names: BTreeSet<String> =
                plan.cluster_wide.iter().filter(|(k, _)| *k == kind).map(|(_, n)| n.clone()).collect();
            if !names.is_empty() {
                rules.push(rule(group(kind), resource(kind), &names, &["get", "list", "watch", "create", "patch"]));
            }
        }
        // The ClusterTrustBundleAttest admission plugin: writing a bundle that names a signer needs `attest` on
        // exactly that signer.
        let signers: BTreeSet<String> =
            config.bundles.iter().flat_map(|b| &b.targets).filter_map(|t| t.signer_name.clone()).collect();
        if !signers.is_empty() {
            rules.push(rule("certificates.k8s.io", "signers", &signers, &["attest"]));
        }
        // Only namespace-selector targets watch Namespaces. No Event goes on a target (a pass is told on the
        // bundle's source or the Lease, [`told_in`]), so nothing is created in the namespaces they select.
        if !plan.namespace_selectors.is_empty() {
            rules.push(rule("", "namespaces", &BTreeSet::new(), &["list", "watch"]));
        }
        rbac.add_cluster(ROLE_NAME, APP, rules, who);
    }
    rbac
}

/// The namespaces the agent creates Events in: its own (the Lease), each source's (a bundle's pass and a rejected
/// source are told on the source object), and each one whose targets roll consumers (the runtime's restart Events
/// go on the workload, a missing one's on the target). Not a namespace that only holds targets.
fn told_in(config: &Config, who: &Subjects) -> BTreeSet<String> {
    let mut told = BTreeSet::from([who.namespace.clone()]);
    for bundle in &config.bundles {
        for source in &bundle.sources {
            match source {
                Source::Secret(r) | Source::ConfigMap(r) => told.insert(r.namespace.clone()),
                Source::Selected(selection) => told.insert(selection.namespace.clone()),
                Source::Inline(_) | Source::File(_) | Source::PublicRoots => continue,
            };
        }
        for target in &bundle.targets {
            if let Placement::Namespace(ns) = &target.placement
                && !target.consumers.is_empty()
            {
                told.insert(ns.clone());
            }
        }
    }
    told
}

fn resource(kind: TargetKind) -> &'static str {
    match kind {
        TargetKind::Secret => "secrets",
        TargetKind::ConfigMap => "configmaps",
        TargetKind::ClusterTrustBundle => "clustertrustbundles",
    }
}

fn group(kind: TargetKind) -> &'static str {
    match kind {
        TargetKind::Secret | TargetKind::ConfigMap => "",
        TargetKind::ClusterTrustBundle => "certificates.k8s.io",
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn who() -> Subjects {
        Subjects::defaults("kcp-keeper", "ca-syncer")
    }

    fn example() -> Config {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("example.yaml");
        kcp_keeper_runtime::config::load(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_selector_source_lists_and_watches_its_kind_in_its_namespace_only_and_gets_nothing() {
        let config: Config = kcp_keeper_runtime::config::parse(
            Path::new("c.yaml"),
            "bundles:\n- name: a\n  sources:\n  - secret: {namespace: trust, selector: {matchLabels: {ca: 'yes'}}, key: ca.crt}\n  - configMap: {namespace: roots, selector: {matchExpressions: [{key: ca, operator: Exists}]}, includeAllKeys: true}\n  targets:\n  - secret: {namespace: apps, name: kcp-ca, key: ca.crt}\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let rbac = render(&config, &who());
        let unnamed = |ns: &str| -> Vec<(Vec<String>, Vec<String>)> {
            let role = rbac.roles.iter().find(|r| r.metadata.namespace.as_deref() == Some(ns)).expect("a Role");
            role.rules
                .iter()
                .flatten()
                .filter(|r| r.resource_names.is_none() && r.api_groups.as_deref() == Some(&[String::new()]))
                .map(|r| (r.resources.clone().unwrap_or_default(), r.verbs.clone()))
                .collect()
        };
        let list_watch = vec!["list".to_string(), "watch".to_string()];
        assert_eq!(unnamed("trust"), [(vec!["secrets".to_string()], list_watch.clone())]);
        assert_eq!(unnamed("roots"), [(vec!["configmaps".to_string()], list_watch)]);
        assert!(unnamed("apps").is_empty(), "a target namespace lists nothing");
        assert!(rbac.cluster_roles.is_empty(), "nothing cluster-wide");
    }

    #[test]
    fn the_output_says_above_a_secret_selectors_role_that_its_list_returns_every_secret_of_that_namespace() {
        let config: Config = kcp_keeper_runtime::config::parse(
            Path::new("c.yaml"),
            "bundles:\n- name: a\n  sources:\n  - secret: {namespace: trust, selector: {matchLabels: {ca: 'yes'}}, key: ca.crt}\n  - configMap: {namespace: roots, selector: {matchLabels: {ca: 'yes'}}, key: ca.crt}\n  targets:\n  - secret: {namespace: apps, name: kcp-ca, key: ca.crt}\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let yaml = render(&config, &who()).to_yaml().unwrap();
        let documents: Vec<&str> = yaml.split("---\n").collect();
        let role_in = |ns: &str| {
            *documents.iter().find(|d| d.contains("kind: Role\n") && d.contains(&format!("namespace: {ns}\n"))).unwrap()
        };
        let trust = role_in("trust");
        assert!(
            trust.starts_with("# Secret selector source: list/watch on every Secret of namespace trust.")
                && trust.contains("# keys and tokens included. Keep only CA Secrets in trust.\napiVersion:"),
            "{trust}"
        );
        assert!(!role_in("roots").starts_with('#'), "a ConfigMap selector lists no Secret: {yaml}");
        assert!(!role_in("apps").starts_with('#'), "{yaml}");
        // Still the same objects to a YAML reader.
        for doc in documents {
            assert!(serde_yaml::from_str::<serde_yaml::Value>(doc).unwrap()["kind"].is_string());
        }
        // Secrets granted by name only: no note.
        assert!(!render(&example(), &who()).to_yaml().unwrap().contains("# Secret selector"));
    }

    #[test]
    fn secrets_are_only_ever_granted_by_name() {
        let rbac = render(&example(), &who());
        let rules = rbac
            .roles
            .iter()
            .flat_map(|r| r.rules.iter().flatten())
            .chain(rbac.cluster_roles.iter().flat_map(|r| r.rules.iter().flatten()));
        for rule in rules.filter(|r| r.resources.iter().flatten().any(|res| res == "secrets")) {
            assert!(rule.resource_names.as_ref().is_some_and(|n| !n.is_empty()), "secrets without names: {rule:?}");
        }
    }

    #[test]
    fn a_source_is_read_only_and_a_target_is_writable() {
        let rbac = render(&example(), &who());
        let role = |ns: &str| rbac.roles.iter().find(|r| r.metadata.namespace.as_deref() == Some(ns)).unwrap();
        let verbs = |ns: &str, names: &[&str]| -> Vec<String> {
            role(ns)
                .rules
                .iter()
                .flatten()
                .filter(|r| {
                    r.resource_names.as_deref() == Some(&names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                })
                .flat_map(|r| r.verbs.clone())
                .collect()
        };
        assert_eq!(verbs("kcp-system", &["frontproxy-ca", "root-server-ca"]), ["get", "list", "watch"]);
        assert_eq!(verbs("railgrid-system", &["kcp-ca"]), ["get", "list", "watch", "create", "patch"]);
        assert!(
            rbac.cluster_roles[0]
                .rules
                .iter()
                .flatten()
                .any(|r| r.resources.as_deref() == Some(&["namespaces".to_string()]))
        );
    }

    #[test]
    fn the_docs_show_exactly_what_the_command_renders_for_the_example() {
        let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ca-syncer.md"))
            .expect("docs/ca-syncer.md");
        // The page's worked example (the block opening with this line), loaded as the agent loads its file.
        let start =
            docs.find("```yaml\n# ca-syncer: a worked kcp example.").expect("the worked example") + "```yaml\n".len();
        let end = start + docs[start..].find("```").expect("the block ends");
        let documented: Config = kcp_keeper_runtime::config::parse(Path::new("worked example"), &docs[start..end])
            .unwrap_or_else(|e| panic!("{e}"));
        let rendered = render(&documented, &who()).to_yaml().expect("renders");
        assert!(
            docs.contains(&format!("```yaml\n{rendered}```")),
            "docs/ca-syncer.md must show `ca-syncer rbac` of its worked example verbatim:\n{rendered}"
        );
    }
}
