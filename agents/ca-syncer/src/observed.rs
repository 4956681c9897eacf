//! Each target as a pass sees it, and what makes that view trustworthy right after our own writes.
//!
//! Targets are read through reflector stores, which lag behind the apiserver: the driver does not consume the
//! watches while a pass writes, so the next pass (woken by the first watch events of those writes) can find the
//! store without most of them, or at the version before our write; after a fan-out to thousands of targets the
//! watch may even be restarted, and the store stays behind for seconds. Comparing with that view would
//! re-apply what was just written (a no-op for the apiserver, but a write all the same), and reading every
//! such target back costs a GET each. So every write is remembered ([`Written`]): the version it replaced, the
//! version it made, and a digest of the object it sent. A pass then sees each target as follows:
//! - the store holds the version our last write made: the store has caught up; the entry is forgotten;
//! - the store still holds the version our last write replaced (a [`View`] with `behind`): the pass plans from
//!   the very view that write was planned from, so when it arrives at the same object (the same digest), that
//!   object is what the apiserver holds and the target is settled with no read and no write. A change someone
//!   else made after our write reaches the store after our own, and its event wakes another pass, which sees it.
//!   Only a plan that differs (the sources changed again before the store caught up) reads the target fresh
//!   (a GET) and plans again from what the apiserver holds, so nothing our last write put there is lost;
//! - a target we created that the store does not show yet is taken the same way, but only for
//!   [`CREATED_TRUSTED`] after the write: the store cannot tell "not seen yet" from "seen, then deleted by
//!   someone else", so a pass is due by the end of that time, and from then on such a target is read fresh;
//! - anything else (a version that is neither, or a created target the store still does not show after that
//!   time): the target is read fresh, and the pass decides on what the apiserver holds. Once the store holds
//!   what a fresh read returns, the entry is forgotten and the store is trusted again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// A digest of the object a write sent ([`digest`]).
pub type Digest = [u8; 32];

/// The SHA-256 of `desired` as JSON: equal for equal objects built the same way.
pub fn digest(desired: &serde_json::Value) -> Digest {
    use sha2::Digest as _;
    sha2::Sha256::digest(serde_json::to_vec(desired).unwrap_or_default()).into()
}

/// Our last write of one target.
#[derive(Clone)]
struct Wrote {
    /// The version it was planned from and held to (`None`: it created the object).
    over: Option<String>,
    /// The version it made.
    version: String,
    sent: Digest,
    at: Instant,
}

/// How long a target we created and the store does not show yet is taken to be as we created it. The store
/// cannot tell "not seen yet" from "seen, then deleted by someone else": past this, it is read fresh, and a pass
/// is due by then so that such a deletion is undone within it.
pub const CREATED_TRUSTED: Duration = Duration::from_secs(20);

/// One target as a pass sees it ([`Written::observe`]).
pub struct View {
    pub observed: Observed,
    /// The store still holds the version our last write of the target replaced: the digest of what it sent.
    pub behind: Option<Digest>,
    /// The target is one we created that the store does not show yet: look again within this, when it is read
    /// fresh if the store still does not show it ([`CREATED_TRUSTED`]).
    pub recheck: Option<Duration>,
}

/// Each target this generation of the agent wrote, until its store has seen the write.
#[derive(Default, Clone)]
pub struct Written(Arc<Mutex<HashMap<ObjectKey, Wrote>>>);

impl Written {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, Wrote>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a write that was planned from version `over` (`None`: a create), sent an object of digest `sent`
    /// and produced `version`.
    pub fn wrote(&self, key: ObjectKey, over: Option<String>, version: String, sent: Digest) {
        self.map().insert(key, Wrote { over, version, sent, at: Instant::now() });
    }

    /// The object as this pass must see it: from `scope`'s store, marked `behind` while the store still holds
    /// what our last write replaced, else read fresh where the store shows neither that nor our write.
    pub async fn observe(&self, client: &kube::Client, scope: &Scope, key: &ObjectKey) -> View {
        let (kind, namespace, name) = key;
        let cached = match kind {
            TargetKind::Secret => Observed::Secret(scope.secret(namespace, name)),
            TargetKind::ConfigMap => Observed::ConfigMap(scope.config_map(namespace, name)),
            TargetKind::ClusterTrustBundle => Observed::ClusterTrustBundle(scope.trust_bundle(name)),
        };
        let store = |observed| View { observed, behind: None, recheck: None };
        let Some(ours) = self.map().get(key).cloned() else { return store(cached) };
        if cached.resource_version() == Some(ours.version.as_str()) {
            self.map().remove(key);
            return store(cached);
        }
        if ours.over.is_some() && cached.resource_version() == ours.over.as_deref() {
            return View { observed: cached, behind: Some(ours.sent), recheck: None };
        }
        let trusted = CREATED_TRUSTED.saturating_sub(ours.at.elapsed());
        if ours.over.is_none() && !cached.exists() && !trusted.is_zero() {
            return View { observed: cached, behind: Some(ours.sent), recheck: Some(trusted) };
        }
        store(self.read(client, key, cached).await)
    }

    /// The object read fresh through `client` (`cached`: as the store holds it). A failed read falls back to the
    /// store (at worst one write the apiserver finds to be a no-op, or refuses as a conflict).
    pub async fn read(&self, client: &kube::Client, key: &ObjectKey, cached: Observed) -> Observed {
        let (kind, namespace, name) = key;
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
