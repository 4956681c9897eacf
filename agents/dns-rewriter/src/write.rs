//! The one write the daemon makes: the target key of the managed ConfigMap, and only when its bytes differ.
//!
//! An update is a merge patch of that one key carrying the `resourceVersion` the new value was computed from
//! (field manager `kcp-keeper`): if anyone changed the ConfigMap since (in Corefile mode, even a byte of the
//! Corefile outside our block), the apiserver refuses it with 409 and the next cycle recomputes from the fresh
//! object, so no one's change is lost. Only in k3s mode, and only when `coredns-custom` does not exist, is the
//! ConfigMap created (server-side apply of the one key: RBAC's `resourceNames` can allow a patch by name, not
//! a create). A Corefile ConfigMap is never created: it is its owner's.

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
pub fn current_value<'a>(live: Option<&'a ConfigMap>, key: &ConfigMapKey) -> Option<&'a str> {
    live?.data.as_ref()?.get(&key.key).map(String::as_str)
}

/// Sets `key` to `value` in the ConfigMap `live` (as last seen; `None`: it does not exist and is created).
pub async fn write(
    client: &kube::Client,
    key: &ConfigMapKey,
    live: Option<&ConfigMap>,
    value: &str,
) -> Result<Outcome, WriteError> {
    let object = format!("{}/{}", key.namespace, key.name);
    if current_value(live, key) == Some(value) {
        return Ok(Outcome::Unchanged);
    }
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &key.namespace);
    let (patch, params, outcome) = match live {
        Some(live) => {
            // The resourceVersion makes the patch conditional.
            let patch = json!({
                "metadata": {"resourceVersion": live.metadata.resource_version},
                "data": {key.key.as_str(): value},
            });
            let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
            (Patch::Merge(patch), params, Outcome::Updated)
        }
        None => {
            let patch = json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": key.name, "namespace": key.namespace},
                "data": {key.key.as_str(): value},
            });
            (Patch::Apply(patch), PatchParams::apply(FIELD_MANAGER), Outcome::Created)
        }
    };
    match api.patch(&key.name, &params, &patch).await {
        Ok(_) => Ok(outcome),
        Err(kube::Error::Api(status)) if status.code == 409 => Err(WriteError::Conflict(object)),
        Err(e) => Err(WriteError::Kube(object, e)),
    }
}
