//! What the agent reads, scoped by the configuration: every object is watched by name (a `metadata.name` field
//! selector in its namespace), so RBAC can name each one (`resourceNames`) and nothing else wakes the agent.
//! The one-shots read the same objects with plain GETs ([`Reader::Client`]), and [`rbac`] grants exactly them.

pub mod rbac;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kcp_keeper_runtime::watch::{Watches, by_name};
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::config::{Config, Kubeconfig, Source, certificate_name};
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
    /// Target Secrets (read for the never-worse comparison, written).
    pub target_secrets: Vec<Key>,
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
    n.target_secrets = kc.targets.iter().map(|t| key(&t.namespace, &t.name)).collect();
    n
}

/// Reflector stores, one per watched object.
#[derive(Default, Clone)]
pub struct Stores {
    kubeconfigs: BTreeMap<Key, Store<KubeconfigObject>>,
    certificates: BTreeMap<Key, Store<Certificate>>,
    secrets: BTreeMap<Key, Store<Secret>>,
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
}

impl Snapshot {
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
        Ok(snap)
    }

    async fn get<K>(
        &self,
        key: &Key,
        store: impl Fn(&Stores) -> &BTreeMap<Key, Store<K>>,
    ) -> Result<Option<K>, kube::Error>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + 'static,
    {
        let (ns, name) = key;
        match self {
            Reader::Stores(stores) => {
                Ok(store(stores).get(key).and_then(|s| s.get(&ObjectRef::new(name).within(ns))).map(|o| (*o).clone()))
            }
            Reader::Client(client) => Api::<K>::namespaced((*client).clone(), ns).get_opt(name).await,
        }
    }
}
