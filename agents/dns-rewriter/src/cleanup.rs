//! `dns-rewriter cleanup`: takes the agent's rules out of the cluster DNS configuration, for uninstalling (the
//! chart runs it as a pre-delete hook): in Corefile mode the marked block is removed, every other byte kept
//! (the Corefile is as it was before the agent's first write); in k3s mode the agent's own key is removed from
//! `coredns-custom`, every other key kept. Conditional on the resourceVersion read, like every write of the
//! agent; a ConfigMap, key or block that is not there is nothing to do. The ConfigMap itself is never deleted.
//! With `nodeLocalDns` on, the agent's server block in node-local-dns's Corefile goes the same way.
//!
//! A pre-delete hook runs while the agent still runs, and the agent watches its ConfigMap: it would put its
//! block back at once. So cleanup first marks each ConfigMap with [`CLEANED_ANNOTATION`] (the time, in Unix
//! seconds), and a running agent never writes into a ConfigMap marked at or after its own start
//! ([`cleaned_since`]); an agent started later (a new install) writes as usual.

use k8s_openapi::api::core::v1::ConfigMap;
use kcp_keeper_runtime::marked_block::configmap::write_key;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::block;
use crate::config::{Config, Target};

/// Set by `cleanup` on the ConfigMaps it takes the rules out of: when (Unix seconds).
pub const CLEANED_ANNOTATION: &str = "kcp-keeper.io/dns-rewriter-cleanup";

/// When `cm` was marked by a cleanup at or after `started` (Unix seconds): an agent started before a cleanup
/// must not write its rules back.
pub fn cleaned_since(cm: &ConfigMap, started: u64) -> Option<u64> {
    let at = cm.metadata.annotations.as_ref()?.get(CLEANED_ANNOTATION)?.parse::<u64>().ok()?;
    (at >= started).then_some(at)
}

pub fn unix_seconds() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// ConfigMap `name` as cleanup sees it, `None` when it does not exist. It is first marked as cleaned now, so
/// the running agent stops writing into it, and read again after the mark. The mark is left alone when the
/// ConfigMap already carries one and `ours` finds nothing of the agent's in it: a second cleanup is then no
/// write at all (re-marking it each second would be a write per run, and idempotent means none).
async fn marked(
    api: &Api<ConfigMap>,
    name: &str,
    ours: impl Fn(&ConfigMap) -> anyhow::Result<bool>,
) -> anyhow::Result<Option<ConfigMap>> {
    let Some(live) = api.get_opt(name).await? else { return Ok(None) };
    let already = live.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(CLEANED_ANNOTATION));
    if already && !ours(&live)? {
        return Ok(Some(live));
    }
    let patch = json!({"metadata": {"annotations": {CLEANED_ANNOTATION: unix_seconds().to_string()}}});
    let params = PatchParams { field_manager: Some(kcp_keeper_runtime::FIELD_MANAGER.into()), ..Default::default() };
    match api.patch(name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => Ok(api.get_opt(name).await?),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(anyhow::anyhow!("marking ConfigMap {name} as cleaned: {e}")),
    }
}

/// What cleanup did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cleaned {
    /// The block or key was removed.
    Removed,
    /// There was nothing of ours (no ConfigMap, no key, no block).
    Nothing,
}

pub async fn cleanup(client: &kube::Client, config: &Config) -> anyhow::Result<Cleaned> {
    let target = cleanup_target(client, config).await?;
    let node_local = cleanup_node_local(client, config).await?;
    Ok(if target == Cleaned::Removed || node_local == Cleaned::Removed { Cleaned::Removed } else { Cleaned::Nothing })
}

/// Our block in node-local-dns's Corefile removed, every other byte kept.
async fn cleanup_node_local(client: &kube::Client, config: &Config) -> anyhow::Result<Cleaned> {
    let Some(key) = &config.node_local_dns else { return Ok(Cleaned::Nothing) };
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &key.namespace);
    let ours = |cm: &ConfigMap| match cm.data.as_ref().and_then(|d| d.get(&key.key)) {
        Some(current) => Ok(crate::node_local::removed(current)? != *current),
        None => Ok(false),
    };
    let Some(live) = marked(&api, &key.name, ours).await? else { return Ok(Cleaned::Nothing) };
    let Some(current) = live.data.as_ref().and_then(|d| d.get(&key.key)) else { return Ok(Cleaned::Nothing) };
    if crate::node_local::removed(current)? == *current {
        return Ok(Cleaned::Nothing);
    }
    let compute =
        |text: Option<&str>| crate::node_local::removed(text.ok_or(crate::node_local::NodeLocalError::NoCorefile)?);
    write_key(&api, &key.name, &key.key, Some(live), compute)
        .await
        .map_err(|e| anyhow::anyhow!("removing the block from {}/{} key {}: {e}", key.namespace, key.name, key.key))?;
    Ok(Cleaned::Removed)
}

async fn cleanup_target(client: &kube::Client, config: &Config) -> anyhow::Result<Cleaned> {
    let key = config.target.configmap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &key.namespace);
    let object = format!("{}/{}", key.namespace, key.name);
    let ours = |cm: &ConfigMap| {
        let Some(current) = cm.data.as_ref().and_then(|d| d.get(&key.key)) else { return Ok(false) };
        Ok(match &config.target {
            Target::Corefile { server_block, .. } => block::content(current, server_block)?.is_some(),
            Target::K3s(_) => true,
        })
    };
    let Some(live) = marked(&api, &key.name, ours).await? else { return Ok(Cleaned::Nothing) };
    let current = live.data.as_ref().and_then(|d| d.get(&key.key)).cloned();
    match &config.target {
        Target::Corefile { server_block, .. } => {
            let Some(current) = current else { return Ok(Cleaned::Nothing) };
            if block::content(&current, server_block)?.is_none() {
                return Ok(Cleaned::Nothing);
            }
            let compute = |text: Option<&str>| match text {
                Some(text) => block::set(text, server_block, None).map_err(|e| e.to_string()),
                None => Err("the Corefile key is gone".to_string()),
            };
            write_key(&api, &key.name, &key.key, Some(live), compute)
                .await
                .map_err(|e| anyhow::anyhow!("removing the block from {object} key {}: {e}", key.key))?;
            Ok(Cleaned::Removed)
        }
        Target::K3s(_) => {
            if current.is_none() {
                return Ok(Cleaned::Nothing);
            }
            // A merge patch with null removes the one key; the resourceVersion makes it conditional.
            let patch = json!({
                "metadata": {"resourceVersion": live.metadata.resource_version},
                "data": {key.key.as_str(): null},
            });
            let params =
                PatchParams { field_manager: Some(kcp_keeper_runtime::FIELD_MANAGER.into()), ..Default::default() };
            api.patch(&key.name, &params, &Patch::Merge(&patch))
                .await
                .map_err(|e| anyhow::anyhow!("removing key {} from {object}: {e}", key.key))?;
            Ok(Cleaned::Removed)
        }
    }
}
