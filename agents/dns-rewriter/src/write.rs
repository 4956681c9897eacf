//! The one write the daemon makes: the target key of the managed ConfigMap, and only when its bytes differ.
//!
//! An update is a merge patch of that one key carrying the `resourceVersion` the new value was computed from
//! (field manager `kcp-keeper`): if anyone changed the ConfigMap since (in Corefile mode, even a byte of the
//! Corefile outside our block), the apiserver refuses it with 409 and the next cycle recomputes from the fresh
//! object, so no one's change is lost.
//!
//! The ConfigMap is never created, in either mode: a Corefile ConfigMap is its owner's, and creating
//! `coredns-custom` would need `create` on every ConfigMap of `kube-system` (RBAC cannot limit a create by name;
//! the apiserver checks `create` even for a server-side apply that would create). It is created once at
//! install time instead (the chart, or `kubectl -n kube-system create configmap coredns-custom`).

use k8s_openapi::api::core::v1::ConfigMap;
use kcp_keeper_runtime::FIELD_MANAGER;
use kcp_keeper_runtime::apply::Outcome;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::config::ConfigMapKey;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("ConfigMap {0} changed since it was read; the next cycle recomputes from the new object")]
    Conflict(String),
    #[error("ConfigMap {0}: {1}")]
    Kube(String, kube::Error),
}

/// The value `key` holds in `live`, if any.
pub fn current_value<'a>(live: &'a ConfigMap, key: &ConfigMapKey) -> Option<&'a str> {
    live.data.as_ref()?.get(&key.key).map(String::as_str)
}

/// Sets `key` to `value` in the ConfigMap `live` (as last seen).
pub async fn write(
    client: &kube::Client,
    key: &ConfigMapKey,
    live: &ConfigMap,
    value: &str,
) -> Result<Outcome, WriteError> {
    let object = format!("{}/{}", key.namespace, key.name);
    if current_value(live, key) == Some(value) {
        return Ok(Outcome::Unchanged);
    }
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &key.namespace);
    // The resourceVersion makes the patch conditional.
    let patch = json!({
        "metadata": {"resourceVersion": live.metadata.resource_version},
        "data": {key.key.as_str(): value},
    });
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    match api.patch(&key.name, &params, &Patch::Merge(patch)).await {
        Ok(_) => Ok(Outcome::Updated),
        Err(kube::Error::Api(status)) if status.code == 409 => Err(WriteError::Conflict(object)),
        Err(e) => Err(WriteError::Kube(object, e)),
    }
}
