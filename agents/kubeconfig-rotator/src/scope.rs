//! What the agent reads, scoped by the configuration: every object is watched by name (a `metadata.name` field
//! selector in its namespace), so RBAC can name each one (`resourceNames`) and nothing else wakes the agent.
//! A target by namespace selector is watched as ca-syncer watches its selector targets: its Secret name across
//! the cluster (the same field selector, so a ClusterRole with `resourceNames` allows exactly that), and the
//! Namespaces by the selector's labels (only when a selector is configured). It is a target only in a namespace
//! both selected and allowed by name; a copy the agent wrote anywhere else is found by that same watch and
//! deleted ([`Snapshot::withdrawals`]). The one-shots read the same objects with plain GETs and a Namespace list
//! ([`Reader::Client`]), and [`rbac`] grants exactly them. The stores keep no `managedFields`, and the Namespaces
//! are watched metadata-only (their names and whether they are being deleted are all a pass reads of them).

pub mod rbac;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kcp_keeper_runtime::watch::{Namespaced, Watches, by_name};
use kube::api::{Api, ListParams, ObjectMeta, PartialObjectMeta};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use kcp_keeper_runtime::FIELD_MANAGER;
use kcp_keeper_runtime::apply::MANAGED_BY_LABEL;

use crate::config::{Config, KUBECONFIG_ANNOTATION, Kubeconfig, Placement, Source, Target, certificate_name};
use crate::objects::{Certificate, KubeconfigObject};

type Key = (String, String);

/// The objects one kubeconfig needs, by role.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Needs {
    /// Kubeconfig and Certificate (operator source only), by namespace and name.
    pub kubeconfig: Option<Key>,
    pub certificate: Option<Key>,
    /// Secrets read as sources (certificate Secret, rendered Secret, plain Secret, CA Secret).
    pub source_secrets: Vec<Key>,
    /// Target Secrets in named namespaces (read for the never-worse comparison, written).
    pub target_secrets: Vec<Key>,
    /// Target Secret names placed by namespace selector: watched across the cluster.
    pub cluster_targets: BTreeSet<String>,
    /// Those targets in each namespace their allow list names: the only places they are written.
    pub allowed_targets: Vec<Key>,
    /// The label selectors (`a=b,c in (d)`) of those targets: Namespaces watched by each.
    pub selectors: BTreeSet<String>,
}

pub fn needs(kc: &Kubeconfig) -> Needs {
    let key = |ns: &str, name: &str| (ns.to_string(), name.to_string());
    let mut n = Needs::default();
    match &kc.source {
        Source::Operator { namespace, name, rendered_secret, server_ca } => {
            n.kubeconfig = Some(key(namespace, name));
            n.certificate = Some(key(namespace, &certificate_name(name)));
            n.source_secrets = vec![key(namespace, &certificate_name(name)), key(namespace, rendered_secret)];
            n.source_secrets.extend(server_ca.iter().map(|ca| key(&ca.namespace, &ca.name)));
        }
        Source::Secret(r) => n.source_secrets = vec![key(&r.namespace, &r.name)],
        Source::CertificateSecret { namespace, name, ca, .. } => {
            n.source_secrets = vec![key(namespace, name), key(&ca.namespace, &ca.name)];
        }
    }
    for spec in &kc.targets {
        match &spec.placement {
            Placement::Namespace(ns) => n.target_secrets.push(key(ns, &spec.target.name)),
            Placement::Selector { selector, allowed } => {
                n.cluster_targets.insert(spec.target.name.clone());
                n.selectors.insert(selector.label_selector());
                n.allowed_targets.extend(allowed.iter().map(|ns| key(ns, &spec.target.name)));
            }
        }
    }
    n
}

/// Reflector stores, one per watched object.
#[derive(Default, Clone)]
pub struct Stores {
    kubeconfigs: BTreeMap<Key, Store<KubeconfigObject>>,
    certificates: BTreeMap<Key, Store<Certificate>>,
    secrets: BTreeMap<Key, Store<Secret>>,
    /// Selector targets, by Secret name, across the cluster.
    cluster_secrets: BTreeMap<String, Store<Secret>>,
    /// Namespaces (metadata only), by label selector.
    namespaces: BTreeMap<String, Store<PartialObjectMeta<Namespace>>>,
}

impl Stores {
    /// One watch per object the configuration names.
    pub fn build(client: &kube::Client, config: &Config) -> (Stores, Watches) {
        let mut watches = Watches::new();
        let mut stores = Stores::default();
        for kc in &config.kubeconfigs {
            let n = needs(kc);
            if let Some((ns, name)) = n.kubeconfig.clone() {
                let api = Api::<KubeconfigObject>::namespaced(client.clone(), &ns);
                let store = watches.add(format!("kubeconfig {ns}/{name}"), api, by_name(&name));
                stores.kubeconfigs.insert((ns, name), store);
            }
            if let Some((ns, name)) = n.certificate.clone() {
                let api = Api::<Certificate>::namespaced(client.clone(), &ns);
                let store = watches.add(format!("certificate {ns}/{name}"), api, by_name(&name));
                stores.certificates.insert((ns, name), store);
            }
            for name in &n.cluster_targets {
                if !stores.cluster_secrets.contains_key(name) {
                    // Across namespaces but by this one name only: the ClusterRole grants these Secrets by
                    // resourceNames, so no other Secret can be listed or watched.
                    let store = watches.add_named_everywhere::<Secret>(client, name);
                    stores.cluster_secrets.insert(name.clone(), store);
                }
            }
            for selector in &n.selectors {
                if !stores.namespaces.contains_key(selector) {
                    let api = Api::<PartialObjectMeta<Namespace>>::all(client.clone());
                    let config = watcher::Config::default().labels(selector);
                    stores
                        .namespaces
                        .insert(selector.clone(), watches.add_metadata(format!("Namespaces {selector}"), api, config));
                }
            }
            for (ns, name) in n.source_secrets.into_iter().chain(n.target_secrets) {
                if stores.secrets.contains_key(&(ns.clone(), name.clone())) {
                    continue;
                }
                let api = Api::<Secret>::namespaced(client.clone(), &ns);
                let store = watches.add(format!("secret {ns}/{name}"), api, by_name(&name));
                stores.secrets.insert((ns, name), store);
            }
        }
        (stores, watches)
    }
}

/// Where reads come from: the daemon's stores, or the apiserver directly (one-shots).
pub enum Reader<'a> {
    Stores(&'a Stores),
    Client(&'a kube::Client),
}

/// Everything one kubeconfig's reconcile looks at, read once at its start.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub kubeconfig: Option<KubeconfigObject>,
    pub certificate: Option<Certificate>,
    pub secrets: BTreeMap<Key, Secret>,
    /// Per label selector, the namespaces it selects that are not being deleted, sorted.
    pub selected: BTreeMap<String, Vec<String>>,
    /// Namespaces a selector matches that are being deleted: their copies go with them.
    pub terminating: BTreeSet<String>,
    /// Every Secret named like one of the kubeconfig's selector targets, in any namespace (the daemon's stores
    /// only; the one-shots leave it empty): what [`Snapshot::withdrawals`] looks through.
    pub copies: Vec<Secret>,
}

impl Snapshot {
    /// Every target Secret of `kc` this pass: the named ones, and a selector target in each namespace its
    /// selector selects now that its allow list names. A namespace not both is not a target: the copy it holds,
    /// if the agent wrote one, is withdrawn ([`Snapshot::withdrawals`]).
    pub fn targets(&self, kc: &Kubeconfig) -> Vec<Target> {
        let mut out = Vec::new();
        for spec in &kc.targets {
            match &spec.placement {
                Placement::Namespace(ns) => out.push(spec.at(ns)),
                Placement::Selector { selector, allowed } => {
                    let selected = self.selected.get(&selector.label_selector()).into_iter().flatten();
                    out.extend(selected.filter(|ns| allowed.contains(*ns)).map(|ns| spec.at(ns)));
                }
            }
        }
        out
    }

    /// The copies of `kc`'s selector targets to delete: Secrets the agent wrote for this kubeconfig (kcp-keeper's
    /// label and the kubeconfig's annotation) in a namespace that is no longer both selected and allowed, and is
    /// not being deleted. A Secret of that name someone else wrote is never touched.
    pub fn withdrawals(&self, kc: &Kubeconfig) -> Vec<&Secret> {
        let targets: BTreeSet<(String, String)> = self.targets(kc).into_iter().map(|t| (t.namespace, t.name)).collect();
        let names: BTreeSet<&str> = kc
            .targets
            .iter()
            .filter(|spec| matches!(spec.placement, Placement::Selector { .. }))
            .map(|spec| spec.target.name.as_str())
            .collect();
        self.copies
            .iter()
            .filter(|s| {
                let (Some(ns), Some(name)) = (s.metadata.namespace.as_deref(), s.metadata.name.as_deref()) else {
                    return false;
                };
                names.contains(name)
                    && !targets.contains(&(ns.to_string(), name.to_string()))
                    && !self.terminating.contains(ns)
                    && s.metadata.deletion_timestamp.is_none()
                    && written_for(s, &kc.name)
            })
            .collect()
    }

    pub fn secret(&self, namespace: &str, name: &str) -> Option<&Secret> {
        self.secrets.get(&(namespace.to_string(), name.to_string()))
    }

    /// A key of a Secret, if both exist.
    pub fn key(&self, namespace: &str, name: &str, key: &str) -> Option<&[u8]> {
        secret_key(self.secret(namespace, name), key)
    }
}

/// Whether the agent wrote `secret` for kubeconfig `kubeconfig`: kcp-keeper's managed-by label and the
/// kubeconfig's name in its annotation.
fn written_for(secret: &Secret, kubeconfig: &str) -> bool {
    let meta = &secret.metadata;
    meta.labels.as_ref().and_then(|l| l.get(MANAGED_BY_LABEL)).map(String::as_str) == Some(FIELD_MANAGER)
        && meta.annotations.as_ref().and_then(|a| a.get(KUBECONFIG_ANNOTATION)).map(String::as_str) == Some(kubeconfig)
}

/// A key of a Secret, if both exist.
pub fn secret_key<'a>(secret: Option<&'a Secret>, key: &str) -> Option<&'a [u8]> {
    secret?.data.as_ref()?.get(key).map(|v| v.0.as_slice())
}

impl Reader<'_> {
    pub async fn snapshot(&self, kc: &Kubeconfig) -> Result<Snapshot, kube::Error> {
        let n = needs(kc);
        let mut snap = Snapshot::default();
        if let Some(key) = &n.kubeconfig {
            snap.kubeconfig = self.get(key, |s| &s.kubeconfigs).await?;
        }
        if let Some(key) = &n.certificate {
            snap.certificate = self.get(key, |s| &s.certificates).await?;
        }
        for key in n.source_secrets.iter().chain(&n.target_secrets) {
            if let Some(secret) = self.get(key, |s| &s.secrets).await? {
                snap.secrets.insert(key.clone(), secret);
            }
        }
        for selector in &n.selectors {
            let (selected, terminating) = self.selected(selector).await?;
            snap.selected.insert(selector.clone(), selected);
            snap.terminating.extend(terminating);
        }
        for spec in &kc.targets {
            let Placement::Selector { selector, allowed } = &spec.placement else { continue };
            let name = &spec.target.name;
            if let Reader::Stores(stores) = self {
                let copies = stores.cluster_secrets.get(name).map(|s| s.state()).unwrap_or_default();
                snap.copies.extend(copies.iter().map(|s| (**s).clone()));
            }
            let selected = snap.selected.get(&selector.label_selector()).into_iter().flatten();
            for ns in selected.filter(|ns| allowed.contains(*ns)) {
                let found = match self {
                    Reader::Stores(stores) => stores
                        .cluster_secrets
                        .get(name)
                        .and_then(|s| s.get(&ObjectRef::new(name).within(ns)))
                        .map(|o| (*o).clone()),
                    Reader::Client(client) => Api::<Secret>::namespaced((*client).clone(), ns).get_opt(name).await?,
                };
                if let Some(secret) = found {
                    snap.secrets.insert((ns.clone(), name.clone()), secret);
                }
            }
        }
        Ok(snap)
    }

    /// The namespaces `selector` selects, without those being deleted (they refuse new objects), sorted; and
    /// those being deleted.
    async fn selected(&self, selector: &str) -> Result<(Vec<String>, Vec<String>), kube::Error> {
        // A namespace being deleted has a deletion timestamp (its `Terminating` phase follows from it): the
        // metadata is all that is read.
        let namespaces: Vec<ObjectMeta> = match self {
            Reader::Stores(stores) => stores
                .namespaces
                .get(selector)
                .map(|s| s.state().iter().map(|n| n.metadata.clone()).collect())
                .unwrap_or_default(),
            Reader::Client(client) => Api::<Namespace>::all((*client).clone())
                .list(&ListParams::default().labels(selector))
                .await?
                .items
                .into_iter()
                .map(|ns| ns.metadata)
                .collect(),
        };
        let (live, terminating): (Vec<ObjectMeta>, Vec<ObjectMeta>) =
            namespaces.into_iter().partition(|ns| ns.deletion_timestamp.is_none());
        let names = |list: Vec<ObjectMeta>| {
            let mut names: Vec<String> = list.into_iter().filter_map(|ns| ns.name).collect();
            names.sort();
            names.dedup();
            names
        };
        Ok((names(live), names(terminating)))
    }

    async fn get<K: Namespaced>(
        &self,
        key: &Key,
        store: impl Fn(&Stores) -> &BTreeMap<Key, Store<K>>,
    ) -> Result<Option<K>, kube::Error> {
        let (ns, name) = key;
        match self {
            Reader::Stores(stores) => {
                Ok(store(stores).get(key).and_then(|s| s.get(&ObjectRef::new(name).within(ns))).map(|o| (*o).clone()))
            }
            Reader::Client(client) => Api::<K>::namespaced((*client).clone(), ns).get_opt(name).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use kube::api::ObjectMeta;

    use super::*;

    fn kubeconfig() -> Kubeconfig {
        let text = "kubeconfigs:\n- name: hub\n  source: {kubeconfig: {namespace: kcp, name: hub, renderedSecret: hub-kc}}\n  targets:\n  - {name: kc, namespaceSelector: {matchLabels: {hub: \"yes\"}}, allowedNamespaces: [a, b, gone, dying]}\n  - {name: named, namespace: c}\n";
        let config: Config =
            kcp_keeper_runtime::config::parse(Path::new("c.yaml"), text).unwrap_or_else(|e| panic!("{e}"));
        config.kubeconfigs[0].clone()
    }

    fn copy(ns: &str, name: &str, ours: bool, kubeconfig: &str) -> Secret {
        let labels = ours.then(|| [(MANAGED_BY_LABEL.to_string(), FIELD_MANAGER.to_string())].into());
        Secret {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels,
                annotations: Some([(KUBECONFIG_ANNOTATION.to_string(), kubeconfig.to_string())].into()),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        }
    }

    #[test]
    fn a_selector_target_is_placed_only_where_selected_and_allowed_and_withdrawn_only_where_the_agent_wrote_it() {
        let kc = kubeconfig();
        let snap = Snapshot {
            // `b` is allowed but not selected; `outsider` is selected but not allowed; `dying` is being deleted.
            selected: [("hub=yes".to_string(), vec!["a".to_string(), "outsider".to_string()])].into(),
            terminating: ["dying".to_string()].into(),
            copies: vec![
                copy("a", "kc", true, "hub"),
                copy("b", "kc", true, "hub"),
                copy("gone", "kc", true, "hub"),
                copy("outsider", "kc", true, "hub"),
                copy("dying", "kc", true, "hub"),
                copy("theirs", "kc", false, "hub"),
                copy("other", "kc", true, "another-kubeconfig"),
            ],
            ..Snapshot::default()
        };
        let targets: Vec<(String, String)> = snap.targets(&kc).into_iter().map(|t| (t.namespace, t.name)).collect();
        assert_eq!(targets, [("a".into(), "kc".into()), ("c".into(), "named".into())]);
        let withdrawn: Vec<&str> =
            snap.withdrawals(&kc).into_iter().filter_map(|s| s.metadata.namespace.as_deref()).collect();
        assert_eq!(withdrawn, ["b", "gone", "outsider"]);
    }
}
