//! Each target as a pass sees it, and what makes that view trustworthy right after our own writes.
//!
//! Targets are read through reflector stores, which lag behind the apiserver: the driver does not consume the
//! watches while a pass writes, so after a fan-out to many new targets the next pass (woken by the first of
//! their watch events) can find the store without most of them, or at the version before our write. Comparing
//! with that view re-applies what was just written: a no-op for the apiserver, but a write all the same (two
//! per target on a first fan-out). So every write's `resourceVersion` is remembered ([`Written`]); while the
//! store does not hold that version for the object, the object is read fresh (a GET, never a write) and the pass
//! decides on what the apiserver holds. Once the store has caught up (it holds our version, or the same
//! version a fresh read returns) the entry is forgotten and the store is trusted again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;

use crate::config::TargetKind;
use crate::scope::Scope;

/// One target object as a pass sees it; `None` inside: it does not exist.
#[derive(Debug, Clone)]
pub enum Observed {
    Secret(Option<Arc<Secret>>),
    ConfigMap(Option<Arc<ConfigMap>>),
    /// Its content is `spec.trustBundle`, whatever the key.
    ClusterTrustBundle(Option<Arc<ClusterTrustBundle>>),
}

impl Observed {
    pub fn exists(&self) -> bool {
        self.meta().is_some()
    }

    /// The key's content if the object exists (empty when the key is absent).
    pub fn content(&self, key: &str) -> Option<Vec<u8>> {
        match self {
            Observed::Secret(s) => {
                s.as_ref().map(|s| s.data.as_ref().and_then(|d| d.get(key)).map(|v| v.0.clone()).unwrap_or_default())
            }
            Observed::ConfigMap(c) => c
                .as_ref()
                .map(|c| c.data.as_ref().and_then(|d| d.get(key)).map(|v| v.clone().into_bytes()).unwrap_or_default()),
            Observed::ClusterTrustBundle(b) => b.as_ref().map(|b| b.spec.trust_bundle.clone().into_bytes()),
        }
    }

    pub fn meta(&self) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta> {
        match self {
            Observed::Secret(s) => s.as_ref().map(|s| &s.metadata),
            Observed::ConfigMap(c) => c.as_ref().map(|c| &c.metadata),
            Observed::ClusterTrustBundle(b) => b.as_ref().map(|b| &b.metadata),
        }
    }

    pub fn resource_version(&self) -> Option<&str> {
        self.meta()?.resource_version.as_deref()
    }
}

/// A target object: kind, namespace, name.
pub type ObjectKey = (TargetKind, String, String);

/// The `resourceVersion` of each target this generation of the agent wrote, until its store has seen it.
#[derive(Default, Clone)]
pub struct Written(Arc<Mutex<HashMap<ObjectKey, String>>>);

impl Written {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a write that produced `version`.
    pub fn wrote(&self, key: ObjectKey, version: String) {
        self.map().insert(key, version);
    }

    /// The object as this pass must see it: from `scope`'s store, unless the store has not caught up with our
    /// last write of it; then read fresh through `client`. A failed read falls back to the store (at worst one
    /// write the apiserver finds to be a no-op).
    pub async fn observe(&self, client: &kube::Client, scope: &Scope, key: &ObjectKey) -> Observed {
        let (kind, namespace, name) = key;
        let cached = match kind {
            TargetKind::Secret => Observed::Secret(scope.secret(namespace, name)),
            TargetKind::ConfigMap => Observed::ConfigMap(scope.config_map(namespace, name)),
            TargetKind::ClusterTrustBundle => Observed::ClusterTrustBundle(scope.trust_bundle(name)),
        };
        let Some(ours) = self.map().get(key).cloned() else { return cached };
        if cached.resource_version() == Some(ours.as_str()) {
            self.map().remove(key);
            return cached;
        }
        let client = client.clone();
        let fresh = match kind {
            TargetKind::Secret => get(Api::namespaced(client, namespace), name).await.map(Observed::Secret),
            TargetKind::ConfigMap => get(Api::namespaced(client, namespace), name).await.map(Observed::ConfigMap),
            TargetKind::ClusterTrustBundle => get(Api::all(client), name).await.map(Observed::ClusterTrustBundle),
        };
        match fresh {
            Ok(fresh) => {
                // The store holds what the apiserver holds (a change after ours, seen by both): trusted again.
                if fresh.resource_version() == cached.resource_version() {
                    self.map().remove(key);
                }
                fresh
            }
            Err(e) => {
                tracing::warn!(namespace = %namespace, name = %name, error = %e, "fresh read of a target failed; using the cache");
                cached
            }
        }
    }
}

async fn get<K>(api: Api<K>, name: &str) -> kube::Result<Option<Arc<K>>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api.get_opt(name).await?.map(Arc::new))
}
