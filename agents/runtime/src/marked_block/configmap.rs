//! Writes one key of a ConfigMap that we never create: a whole key of our own ([`write_key`]: dns-rewriter's
//! key in k3s's `coredns-custom`), or a [`MarkedBlock`] inside a key another writer owns ([`write_block`]:
//! kubeadm's `kube-system/coredns`, key `Corefile`).
//!
//! Server-side apply is the wrong tool here: in someone else's key it would have to force ownership of the
//! whole key away from its owner, and applying to a ConfigMap that does not exist would create it (which
//! needs `create` on every ConfigMap of the namespace: RBAC cannot limit a create by name). Instead each write
//! is a merge patch of that one key carrying the `resourceVersion` the new text was computed from, as field
//! manager `kcp-keeper`: if anyone changed the ConfigMap since (even a byte outside our block), the apiserver
//! answers 409, we read again and compute again from the fresh text, so the other writer's change is never
//! lost. Unchanged text sends no request. We never create the ConfigMap.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::{BlockError, MarkedBlock};
use crate::FIELD_MANAGER;
use crate::apply::Outcome;

/// How many times a write re-reads after a conflict before giving up (the owner writing that often means
/// something is fighting us; the next reconcile tries again).
pub const ATTEMPTS: u32 = 5;

/// Why [`write_key`] wrote nothing; `E` is the caller's refusal from `compute`.
#[derive(Debug, thiserror::Error)]
pub enum KeyError<E> {
    #[error("ConfigMap {0} does not exist (it is not ours to create)")]
    Missing(String),
    /// `compute` refused the text it was given (nothing was written).
    #[error("{0}")]
    Refused(E),
    #[error("ConfigMap {0} kept changing under us: {1} conflicting writes in a row")]
    Conflict(String, u32),
    #[error("ConfigMap {0}: {1}")]
    Kube(String, kube::Error),
}

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("ConfigMap {0} does not exist (it is not ours to create)")]
    Missing(String),
    #[error("ConfigMap {0} has no key {1:?} (it is not ours to create)")]
    MissingKey(String, String),
    #[error("ConfigMap {0} key {1:?}: {2}")]
    Block(String, String, BlockError),
    #[error("ConfigMap {0} kept changing under us: {1} conflicting writes in a row")]
    Conflict(String, u32),
    #[error("ConfigMap {0}: {1}")]
    Kube(String, kube::Error),
}

impl WriteError {
    /// A low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Missing(_) | Self::MissingKey(..) => "missing",
            Self::Block(_, _, e) => e.metric_label(),
            Self::Conflict(..) => "conflict",
            Self::Kube(..) => "apiserver",
        }
    }
}

/// What a write did.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// [`Outcome::Updated`] or [`Outcome::Unchanged`] (never created).
    pub outcome: Outcome,
    /// How many writes the apiserver refused because the object had moved on (each followed by a re-read).
    pub conflicts: u32,
    /// When written: the resourceVersion written over and the object as the apiserver returned it. A caller
    /// whose store still shows the version written over has not seen its own write yet, and can take this one
    /// instead ([`fresher`]) rather than write again.
    pub written: Option<OwnWrite>,
}

/// A write of ours: the resourceVersion it was written over and the object as the apiserver returned it.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnWrite {
    pub over: Option<String>,
    pub after: ConfigMap,
}

/// `seen` (e.g. from a reflector store), unless it is the version `own` was written over: then the store has not
/// caught up with that write yet, and the object the write returned is the fresher.
pub fn fresher(seen: ConfigMap, own: Option<&OwnWrite>) -> ConfigMap {
    match own {
        Some(own) if own.over.is_some() && seen.metadata.resource_version == own.over => own.after.clone(),
        _ => seen,
    }
}

/// Sets `key` of ConfigMap `name` to what `compute` makes of its current text (`None` when the key is absent).
/// `seen` is the object as the caller last saw it (e.g. from a reflector store; it may be stale: a conflict
/// makes us re-read, and `compute` runs again on the fresh text); `None` reads it first. Text equal to the
/// current value sends no request; a refusal from `compute` sends none either.
pub async fn write_key<E>(
    api: &Api<ConfigMap>,
    name: &str,
    key: &str,
    mut seen: Option<ConfigMap>,
    mut compute: impl FnMut(Option<&str>) -> Result<String, E>,
) -> Result<Written, KeyError<E>> {
    let object = match api.namespace() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    };
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    for conflicts in 0..ATTEMPTS {
        let live = match seen.take() {
            Some(live) => live,
            None => api
                .get_opt(name)
                .await
                .map_err(|e| KeyError::Kube(object.clone(), e))?
                .ok_or_else(|| KeyError::Missing(object.clone()))?,
        };
        let text = live.data.as_ref().and_then(|data| data.get(key)).map(String::as_str);
        let desired = compute(text).map_err(KeyError::Refused)?;
        if text == Some(desired.as_str()) {
            return Ok(Written { outcome: Outcome::Unchanged, conflicts, written: None });
        }
        // The resourceVersion makes the patch conditional: the apiserver refuses it if the object moved on.
        let patch = json!({
            "metadata": {"resourceVersion": live.metadata.resource_version},
            "data": {key: desired},
        });
        match api.patch(name, &params, &Patch::Merge(&patch)).await {
            Ok(after) => {
                let over = live.metadata.resource_version;
                return Ok(Written { outcome: Outcome::Updated, conflicts, written: Some(OwnWrite { over, after }) });
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::debug!(configmap = %object, "the ConfigMap changed since it was read; reading it again");
            }
            Err(e) => return Err(KeyError::Kube(object, e)),
        }
    }
    Err(KeyError::Conflict(object, ATTEMPTS))
}

/// Sets `block` to `content` (`None` removes it) in `key` of ConfigMap `name`, through [`write_key`]; the key
/// must exist (it is the owner's: we never create it).
pub async fn write_block(
    api: &Api<ConfigMap>,
    name: &str,
    key: &str,
    block: &MarkedBlock,
    content: Option<&str>,
    seen: Option<ConfigMap>,
) -> Result<Written, WriteError> {
    let object = match api.namespace() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    };
    let set = |text: Option<&str>| {
        let text = text.ok_or_else(|| WriteError::MissingKey(object.clone(), key.into()))?;
        block.set(text, content).map_err(|e| WriteError::Block(object.clone(), key.into(), e))
    };
    write_key(api, name, key, seen, set).await.map_err(|e| match e {
        KeyError::Missing(object) => WriteError::Missing(object),
        KeyError::Refused(e) => e,
        KeyError::Conflict(object, n) => WriteError::Conflict(object, n),
        KeyError::Kube(object, e) => WriteError::Kube(object, e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(version: &str, text: &str) -> ConfigMap {
        let mut object = ConfigMap::default();
        object.metadata.resource_version = Some(version.into());
        object.data = Some([("k".to_string(), text.to_string())].into());
        object
    }

    #[test]
    fn a_store_still_at_the_version_our_write_replaced_yields_our_write_and_any_other_version_is_taken() {
        let own = OwnWrite { over: Some("7".into()), after: at("8", "ours") };
        assert_eq!(fresher(at("7", "old"), Some(&own)), at("8", "ours"), "the store lags our own write");
        assert_eq!(fresher(at("9", "theirs"), Some(&own)), at("9", "theirs"), "someone wrote after us");
        assert_eq!(fresher(at("8", "ours"), Some(&own)), at("8", "ours"), "the store caught up");
        assert_eq!(fresher(at("7", "old"), None), at("7", "old"), "nothing written yet");
    }
}
