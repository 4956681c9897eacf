//! What ca-syncer watches, built from its configuration, and the reflector stores it reads through.
//!
//! Every watch names what the configuration names, so RBAC can be limited by `resourceNames` and a change
//! elsewhere in the cluster wakes nothing:
//! - each source Secret or ConfigMap: a watch in its namespace with a `metadata.name` field selector;
//! - each selector source: a watch in its namespace with its label selector (RBAC cannot narrow a list by
//!   label, so that namespace's Role grants list/watch on that kind without names; no `get`);
//! - each target in a named namespace: the same; so is each Secret a trust store's password is read from;
//! - each target by namespace selector: a cluster-wide watch of that object name (`metadata.name` field
//!   selector; a ClusterRole with `resourceNames` allows exactly that, as trust-manager does), and a watch of
//!   Namespaces by the selector's labels. Namespaces are watched only when a selector is configured.
//!
//! [`rbac`] renders the Roles these watches (and the writes) need, from the same [`Plan`].

pub mod rbac;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kcp_keeper_runtime::watch::{Watches, by_name};
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use crate::config::{Config, PasswordFrom, Pick, Placement, Selection, Selector, Source, TargetKind};

/// One object the configuration names: its kind, namespace (`None`: every namespace) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Named {
    pub kind: TargetKind,
    pub namespace: Option<String>,
    pub name: String,
}

impl Named {
    fn new(kind: TargetKind, namespace: &str, name: &str) -> Self {
        Self { kind, namespace: Some(namespace.to_string()), name: name.to_string() }
    }
}

/// Everything the configuration reads or writes, deduplicated.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Objects in named namespaces (sources, and targets by namespace).
    pub named: BTreeSet<Named>,
    /// Targets by namespace selector, and cluster-scoped targets: object names watched cluster-wide.
    pub cluster_wide: BTreeSet<(TargetKind, String)>,
    /// The label selectors of namespace-selector targets (`a=b,c=d`).
    pub namespace_selectors: BTreeSet<String>,
    /// Selector sources: kind, namespace and label selector.
    pub selected: BTreeSet<(TargetKind, String, String)>,
}

impl Plan {
    /// What `config` names. Pure, so the scope and the RBAC rendered from it agree by construction.
    pub fn of(config: &Config) -> Self {
        let mut plan = Plan::default();
        for bundle in &config.bundles {
            for source in &bundle.sources {
                let (kind, namespace, name) = match source {
                    Source::Secret(r) => (TargetKind::Secret, &r.namespace, &r.name),
                    Source::ConfigMap(r) => (TargetKind::ConfigMap, &r.namespace, &r.name),
                    Source::Selected(Selection { kind, namespace, pick: Pick::Name(name), .. }) => {
                        (*kind, namespace, name)
                    }
                    Source::Selected(Selection { kind, namespace, pick: Pick::Labels(selector), .. }) => {
                        plan.selected.insert((*kind, namespace.clone(), selector.label_selector()));
                        continue;
                    }
                    Source::Inline(_) | Source::File(_) | Source::PublicRoots => continue,
                };
                plan.named.insert(Named::new(kind, namespace, name));
            }
            for target in &bundle.targets {
                // A trust store's password Secret is read like a source: watched by name in its namespace.
                for format in &target.formats {
                    if let PasswordFrom::Secret { namespace, name, .. } = &format.password {
                        plan.named.insert(Named::new(TargetKind::Secret, namespace, name));
                    }
                }
                match &target.placement {
                    Placement::Namespace(ns) => {
                        plan.named.insert(Named::new(target.kind, ns, &target.name));
                    }
                    Placement::Selector(selector) => {
                        plan.cluster_wide.insert((target.kind, target.name.clone()));
                        plan.namespace_selectors.insert(selector.label_selector());
                    }
                    Placement::Cluster => {
                        plan.cluster_wide.insert((target.kind, target.name.clone()));
                    }
                }
            }
        }
        plan
    }
}

/// The stores ca-syncer reads through.
#[derive(Default)]
pub struct Scope {
    secrets: BTreeMap<(Option<String>, String), Store<Secret>>,
    config_maps: BTreeMap<(Option<String>, String), Store<ConfigMap>>,
    namespaces: BTreeMap<String, Store<Namespace>>,
    /// Selector sources' stores, by namespace and label selector.
    selected_secrets: BTreeMap<(String, String), Store<Secret>>,
    selected_config_maps: BTreeMap<(String, String), Store<ConfigMap>>,
    /// ClusterTrustBundle targets, by name.
    trust_bundles: BTreeMap<String, Store<ClusterTrustBundle>>,
}

impl Scope {
    /// Builds the watches for `config`; their stores fill once the returned [`Watches`] run.
    pub fn build(client: &kube::Client, config: &Config) -> (Self, Watches) {
        let plan = Plan::of(config);
        let mut watches = Watches::new();
        let mut scope = Scope::default();
        let objects = plan
            .named
            .iter()
            .map(|n| (n.kind, n.namespace.clone(), n.name.clone()))
            .chain(plan.cluster_wide.iter().map(|(kind, name)| (*kind, None, name.clone())));
        for (kind, namespace, name) in objects {
            let what = format!("{} {}/{name}", kind.as_str(), namespace.as_deref().unwrap_or("*"));
            match kind {
                TargetKind::Secret => {
                    let api = match &namespace {
                        Some(ns) => Api::<Secret>::namespaced(client.clone(), ns),
                        None => Api::all(client.clone()),
                    };
                    scope.secrets.insert((namespace, name.clone()), watches.add(what, api, by_name(&name)));
                }
                TargetKind::ConfigMap => {
                    let api = match &namespace {
                        Some(ns) => Api::<ConfigMap>::namespaced(client.clone(), ns),
                        None => Api::all(client.clone()),
                    };
                    scope.config_maps.insert((namespace, name.clone()), watches.add(what, api, by_name(&name)));
                }
                TargetKind::ClusterTrustBundle => {
                    let api = Api::<ClusterTrustBundle>::all(client.clone());
                    scope.trust_bundles.insert(name.clone(), watches.add(what, api, by_name(&name)));
                }
            }
        }
        for (kind, namespace, selector) in plan.selected {
            let what = format!("{}s {namespace} {selector}", kind.as_str());
            let by_labels = watcher::Config::default().labels(&selector);
            match kind {
                TargetKind::Secret => {
                    let api = Api::<Secret>::namespaced(client.clone(), &namespace);
                    scope.selected_secrets.insert((namespace, selector), watches.add(what, api, by_labels));
                }
                TargetKind::ConfigMap => {
                    let api = Api::<ConfigMap>::namespaced(client.clone(), &namespace);
                    scope.selected_config_maps.insert((namespace, selector), watches.add(what, api, by_labels));
                }
                // Never a source: the configuration has no such field.
                TargetKind::ClusterTrustBundle => {}
            }
        }
        for selector in plan.namespace_selectors {
            let api = Api::<Namespace>::all(client.clone());
            let store =
                watches.add(format!("Namespaces {selector}"), api, watcher::Config::default().labels(&selector));
            scope.namespaces.insert(selector, store);
        }
        (scope, watches)
    }

    pub fn secret(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Secret>> {
        lookup(&self.secrets, namespace, name)
    }

    pub fn config_map(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<ConfigMap>> {
        lookup(&self.config_maps, namespace, name)
    }

    pub fn trust_bundle(&self, name: &str) -> Option<std::sync::Arc<ClusterTrustBundle>> {
        self.trust_bundles.get(name).and_then(|store| store.get(&ObjectRef::new(name)))
    }

    /// The Secrets a selection reads (by name or by label), from its watch.
    pub fn selected_secrets(&self, selection: &Selection) -> Vec<std::sync::Arc<Secret>> {
        match &selection.pick {
            Pick::Name(name) => self.secret(&selection.namespace, name).into_iter().collect(),
            Pick::Labels(selector) => selected(&self.selected_secrets, &selection.namespace, selector),
        }
    }

    /// The ConfigMaps a selection reads (by name or by label), from its watch.
    pub fn selected_config_maps(&self, selection: &Selection) -> Vec<std::sync::Arc<ConfigMap>> {
        match &selection.pick {
            Pick::Name(name) => self.config_map(&selection.namespace, name).into_iter().collect(),
            Pick::Labels(selector) => selected(&self.selected_config_maps, &selection.namespace, selector),
        }
    }

    /// The namespaces `labels` selects, sorted: those that take new objects, and those being deleted (they
    /// refuse new objects, so their targets are skipped and counted as such).
    pub fn namespaces(&self, selector: &Selector) -> (Vec<String>, Vec<String>) {
        let Some(store) = self.namespaces.get(&selector.label_selector()) else { return Default::default() };
        let (mut active, mut terminating) = (Vec::new(), Vec::new());
        for ns in store.state() {
            let Some(name) = ns.metadata.name.clone() else { continue };
            let deleting = ns.metadata.deletion_timestamp.is_some()
                || ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating");
            if deleting { terminating.push(name) } else { active.push(name) }
        }
        active.sort();
        terminating.sort();
        (active, terminating)
    }
}

/// Everything a label-selector watch holds.
fn selected<K>(
    stores: &BTreeMap<(String, String), Store<K>>,
    namespace: &str,
    selector: &Selector,
) -> Vec<std::sync::Arc<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    stores.get(&(namespace.to_string(), selector.label_selector())).map(Store::state).unwrap_or_default()
}

/// The object from its namespaced store, or from the cluster-wide store of that name.
fn lookup<K>(
    stores: &BTreeMap<(Option<String>, String), Store<K>>,
    namespace: &str,
    name: &str,
) -> Option<std::sync::Arc<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let key = ObjectRef::new(name).within(namespace);
    [Some(namespace.to_string()), None]
        .into_iter()
        .filter_map(|ns| stores.get(&(ns, name.to_string())))
        .find_map(|store| store.get(&key))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(yaml: &str) -> Config {
        kcp_keeper_runtime::config::parse(Path::new("c.yaml"), yaml).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn plan_names_every_source_and_target_and_watches_namespaces_only_for_selectors() {
        let by_name = config(
            "bundles:\n- name: a\n  sources:\n  - secret: {namespace: src, name: ca, key: ca.crt}\n  - secret: {namespace: src, name: ca, key: tls.crt}\n  - configMap: {namespace: src, name: extra, key: ca.crt}\n  - publicRoots: {}\n  targets:\n  - secret: {namespace: dst, name: bundle, key: ca.crt}\n",
        );
        let plan = Plan::of(&by_name);
        let named = |kind, ns: &str, name: &str| Named { kind, namespace: Some(ns.into()), name: name.into() };
        assert_eq!(
            plan.named,
            BTreeSet::from([
                named(TargetKind::Secret, "src", "ca"),
                named(TargetKind::ConfigMap, "src", "extra"),
                named(TargetKind::Secret, "dst", "bundle"),
            ]),
            "one watch per object, however many keys are read"
        );
        assert!(plan.cluster_wide.is_empty() && plan.namespace_selectors.is_empty(), "no Namespace watch");

        let selector = config(
            "bundles:\n- name: a\n  sources:\n  - publicRoots: {}\n  targets:\n  - configMap: {name: kcp-ca, key: ca.crt, namespaceSelector: {matchLabels: {b: '2', a: '1'}}}\n",
        );
        let plan = Plan::of(&selector);
        assert_eq!(plan.cluster_wide, BTreeSet::from([(TargetKind::ConfigMap, "kcp-ca".to_string())]));
        assert_eq!(plan.namespace_selectors, BTreeSet::from(["a=1,b=2".to_string()]));
    }
}
