//! What the agent reads, scoped by the configuration: every object is watched by name (a `metadata.name` field
//! selector in its namespace), so RBAC can name each one (`resourceNames`) and nothing else wakes the agent.
//! A target by namespace selector is watched as ca-syncer watches its selector targets: its Secret name across
//! the cluster (the same field selector, so a ClusterRole with `resourceNames` allows exactly that), and the
//! Namespaces by the selector's labels (only when a selector is configured). The one-shots read the same objects
//! with plain GETs and a Namespace list ([`Reader::Client`]), and [`rbac`] grants exactly them.

pub mod rbac;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kcp_keeper_runtime::watch::{Namespaced, Watches, by_name};
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use crate::config::{Config, Kubeconfig, Placement, Source, Target, certificate_name};
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
            Placement::Selector(selector) => {
                n.cluster_targets.insert(spec.target.name.clone());
                n.selectors.insert(selector.label_selector());
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
    /// Namespaces, by label selector.
    namespaces: BTreeMap<String, Store<Namespace>>,
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
                    let api = Api::<Namespace>::all(client.clone());
                    let config = watcher::Config::default().labels(selector);
                    stores
                        .namespaces
                        .insert(selector.clone(), watches.add(format!("Namespaces {selector}"), api, config));
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
}

impl Snapshot {
    /// Every target Secret of `kc` this pass: the named ones, and a selector target in each namespace its
    /// selector selects now. A namespace no longer selected is not a target: the copy it holds is left as it is.
    pub fn targets(&self, kc: &Kubeconfig) -> Vec<Target> {
        let mut out = Vec::new();
        for spec in &kc.targets {
            match &spec.placement {
                Placement::Namespace(ns) => out.push(spec.at(ns)),
                Placement::Selector(selector) => {
                    let selected = self.selected.get(&selector.label_selector()).into_iter().flatten();
                    out.extend(selected.map(|ns| spec.at(ns)));
                }
            }
        }
        out
    }

    pub fn secret(&self, namespace: &str, name: &str) -> Option<&Secret> {
        self.secrets.get(&(namespace.to_string(), name.to_string()))
    }

    /// A key of a Secret, if both exist.
    pub fn key(&self, namespace: &str, name: &str, key: &str) -> Option<&[u8]> {
        secret_key(self.secret(namespace, name), key)
    }
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
            snap.selected.insert(selector.clone(), self.selected(selector).await?);
        }
        for spec in &kc.targets {
            let Placement::Selector(selector) = &spec.placement else { continue };
            let name = &spec.target.name;
            for ns in snap.selected.get(&selector.label_selector()).into_iter().flatten() {
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

    /// The namespaces `selector` selects, without those being deleted (they refuse new objects), sorted.
    async fn selected(&self, selector: &str) -> Result<Vec<String>, kube::Error> {
        let namespaces: Vec<Namespace> = match self {
            Reader::Stores(stores) => stores
                .namespaces
                .get(selector)
                .map(|s| s.state().iter().map(|n| (**n).clone()).collect())
                .unwrap_or_default(),
            Reader::Client(client) => {
                Api::<Namespace>::all((*client).clone()).list(&ListParams::default().labels(selector)).await?.items
            }
        };
        let mut names: Vec<String> = namespaces
            .into_iter()
            .filter(|ns| {
                ns.metadata.deletion_timestamp.is_none()
                    && ns.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Terminating")
            })
            .filter_map(|ns| ns.metadata.name)
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
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
