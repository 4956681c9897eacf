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
//! Each store keeps only what a pass reads ([`Reads`]): of a source, the keys it names; of a target, the keys
//! it writes, kcp-keeper's own labels and annotations and the configured ones, and (only when the target has
//! configured labels or annotations) which of those kcp-keeper set. Namespaces are watched metadata-only: a
//! pass reads their names and whether they are being deleted. So the stores grow with the targets' bundles,
//! not with whatever else those objects and namespaces carry.
//!
//! [`rbac`] renders the Roles these watches (and the writes) need, from the same [`Plan`].

pub mod rbac;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kcp_keeper_runtime::apply::{MANAGED_BY_LABEL, OWNED_KEYS_ANNOTATION};
use kcp_keeper_runtime::watch::{Trim, Watches, by_name, keep_keys};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use crate::config::{Config, Keys, PasswordFrom, Pick, Placement, Selection, Selector, Source, Target, TargetKind};
use crate::rotation::STATE_ANNOTATION;

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
    /// What a pass reads of each object watched by name (`named` and `cluster_wide`; namespace `None`: every
    /// namespace), and of the objects each selector source's watch holds.
    pub reads: BTreeMap<(TargetKind, Option<String>, String), Reads>,
    pub selected_reads: BTreeMap<(TargetKind, String, String), Reads>,
}

/// What a pass reads of the objects one watch holds: what its store keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reads {
    /// The data keys read (`None`: every key, for a selection of all keys).
    pub keys: Option<BTreeSet<String>>,
    /// Labels and annotations read: a target's own marks and configured keys; a source's none.
    pub labels: BTreeSet<String>,
    pub annotations: BTreeSet<String>,
    /// Which configured labels and annotations kcp-keeper set (`managedFields`): read only to decide a
    /// configured key another manager changed.
    pub ownership: bool,
}

impl Default for Reads {
    fn default() -> Self {
        Self { keys: Some(BTreeSet::new()), labels: BTreeSet::new(), annotations: BTreeSet::new(), ownership: false }
    }
}

impl Reads {
    fn key(&mut self, key: &str) {
        if let Some(keys) = &mut self.keys {
            keys.insert(key.to_string());
        }
    }

    fn keys(&mut self, keys: &Keys) {
        match keys {
            Keys::One(key) => self.key(key),
            Keys::All => self.keys = None,
        }
    }

    /// A target: the keys it writes, and the labels and annotations a write is compared with and decided on.
    fn target(&mut self, target: &Target) {
        self.key(&target.key);
        for format in &target.formats {
            self.key(&format.key);
        }
        self.labels.insert(MANAGED_BY_LABEL.to_string());
        self.labels.extend(target.metadata.labels.keys().cloned());
        self.annotations.extend([STATE_ANNOTATION.to_string(), OWNED_KEYS_ANNOTATION.to_string()]);
        self.annotations.extend(target.metadata.annotations.keys().cloned());
        self.ownership |= !target.metadata.labels.is_empty() || !target.metadata.annotations.is_empty();
    }

    /// The store's trim: metadata as read, and `data` (the kind's data keys) cut to the keys read.
    fn trim<K: kube::Resource + 'static>(&self, data: fn(&mut K, &BTreeSet<String>)) -> Trim<K> {
        let trim = Trim::default()
            .labels(self.labels.iter().cloned())
            .annotations(self.annotations.iter().cloned())
            .own_metadata_ownership(self.ownership);
        match self.keys.clone() {
            Some(keys) => trim.object(move |object| data(object, &keys)),
            None => trim,
        }
    }
}

fn secret_data(secret: &mut Secret, keys: &BTreeSet<String>) {
    keep_keys(&mut secret.data, keys);
    keep_keys(&mut secret.string_data, keys);
}

fn config_map_data(config_map: &mut ConfigMap, keys: &BTreeSet<String>) {
    keep_keys(&mut config_map.data, keys);
    keep_keys(&mut config_map.binary_data, keys);
}

/// A ClusterTrustBundle's content is its `spec.trustBundle`, whatever the key: nothing to cut.
fn no_data(_: &mut ClusterTrustBundle, _: &BTreeSet<String>) {}

impl Plan {
    /// What `config` names. Pure, so the scope and the RBAC rendered from it agree by construction.
    pub fn of(config: &Config) -> Self {
        let mut plan = Plan::default();
        for bundle in &config.bundles {
            for source in &bundle.sources {
                let (kind, namespace, name, keys) = match source {
                    Source::Secret(r) => (TargetKind::Secret, &r.namespace, &r.name, Keys::One(r.key.clone())),
                    Source::ConfigMap(r) => (TargetKind::ConfigMap, &r.namespace, &r.name, Keys::One(r.key.clone())),
                    Source::Selected(Selection { kind, namespace, pick: Pick::Name(name), keys }) => {
                        (*kind, namespace, name, keys.clone())
                    }
                    Source::Selected(Selection { kind, namespace, pick: Pick::Labels(selector), keys }) => {
                        let watch = (*kind, namespace.clone(), selector.label_selector());
                        plan.selected_reads.entry(watch.clone()).or_default().keys(keys);
                        plan.selected.insert(watch);
                        continue;
                    }
                    Source::Inline(_) | Source::File(_) | Source::PublicRoots => continue,
                };
                plan.reads.entry((kind, Some(namespace.clone()), name.clone())).or_default().keys(&keys);
                plan.named.insert(Named::new(kind, namespace, name));
            }
            for target in &bundle.targets {
                // A trust store's password Secret is read like a source: watched by name in its namespace.
                for format in &target.formats {
                    if let PasswordFrom::Secret { namespace, name, key } = &format.password {
                        let watch = (TargetKind::Secret, Some(namespace.clone()), name.clone());
                        plan.reads.entry(watch).or_default().key(key);
                        plan.named.insert(Named::new(TargetKind::Secret, namespace, name));
                    }
                }
                let namespace = match &target.placement {
                    Placement::Namespace(ns) => {
                        plan.named.insert(Named::new(target.kind, ns, &target.name));
                        Some(ns.clone())
                    }
                    Placement::Selector(selector) => {
                        plan.cluster_wide.insert((target.kind, target.name.clone()));
                        plan.namespace_selectors.insert(selector.label_selector());
                        None
                    }
                    Placement::Cluster => {
                        plan.cluster_wide.insert((target.kind, target.name.clone()));
                        None
                    }
                };
                plan.reads.entry((target.kind, namespace, target.name.clone())).or_default().target(target);
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
    namespaces: BTreeMap<String, Store<PartialObjectMeta<Namespace>>>,
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
            let reads = plan.reads.get(&(kind, namespace.clone(), name.clone())).cloned().unwrap_or_default();
            match kind {
                TargetKind::Secret => {
                    let api = match &namespace {
                        Some(ns) => Api::<Secret>::namespaced(client.clone(), ns),
                        None => Api::all(client.clone()),
                    };
                    let store = watches.add_trimmed(what, api, by_name(&name), reads.trim(secret_data));
                    scope.secrets.insert((namespace, name.clone()), store);
                }
                TargetKind::ConfigMap => {
                    let api = match &namespace {
                        Some(ns) => Api::<ConfigMap>::namespaced(client.clone(), ns),
                        None => Api::all(client.clone()),
                    };
                    let store = watches.add_trimmed(what, api, by_name(&name), reads.trim(config_map_data));
                    scope.config_maps.insert((namespace, name.clone()), store);
                }
                TargetKind::ClusterTrustBundle => {
                    let api = Api::<ClusterTrustBundle>::all(client.clone());
                    let store = watches.add_trimmed(what, api, by_name(&name), reads.trim(no_data));
                    scope.trust_bundles.insert(name.clone(), store);
                }
            }
        }
        for (kind, namespace, selector) in plan.selected {
            let what = format!("{}s {namespace} {selector}", kind.as_str());
            let by_labels = watcher::Config::default().labels(&selector);
            let reads = plan.selected_reads.get(&(kind, namespace.clone(), selector.clone())).cloned();
            let reads = reads.unwrap_or_default();
            match kind {
                TargetKind::Secret => {
                    let api = Api::<Secret>::namespaced(client.clone(), &namespace);
                    let store = watches.add_trimmed(what, api, by_labels, reads.trim(secret_data));
                    scope.selected_secrets.insert((namespace, selector), store);
                }
                TargetKind::ConfigMap => {
                    let api = Api::<ConfigMap>::namespaced(client.clone(), &namespace);
                    let store = watches.add_trimmed(what, api, by_labels, reads.trim(config_map_data));
                    scope.selected_config_maps.insert((namespace, selector), store);
                }
                // Never a source: the configuration has no such field.
                TargetKind::ClusterTrustBundle => {}
            }
        }
        for selector in plan.namespace_selectors {
            let api = Api::<PartialObjectMeta<Namespace>>::all(client.clone());
            let store = watches.add_metadata(
                format!("Namespaces {selector}"),
                api,
                watcher::Config::default().labels(&selector),
            );
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
    /// refuse new objects, so their targets are skipped and counted as such). A namespace is being deleted once
    /// it has a deletion timestamp (its `Terminating` phase follows from that; the watch is metadata-only).
    pub fn namespaces(&self, selector: &Selector) -> (Vec<String>, Vec<String>) {
        let Some(store) = self.namespaces.get(&selector.label_selector()) else { return Default::default() };
        let (mut active, mut terminating) = (Vec::new(), Vec::new());
        for ns in store.state() {
            let Some(name) = ns.metadata.name.clone() else { continue };
            if ns.metadata.deletion_timestamp.is_some() { terminating.push(name) } else { active.push(name) }
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
