//! Reading an agent's `/metrics` (on [`crate::metrics`]) and applying rendered YAML, for tests of agent processes.

use anyhow::{Context, Result};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde::Deserialize;

use crate::agent_process::AgentProcess;

/// How long [`wait_for_metric`] waits.
pub const WAIT: std::time::Duration = std::time::Duration::from_secs(30);

pub use crate::metrics::value as metric;

/// The agent's `/metrics` text ("" when it cannot be read: a missing series then fails the check).
pub async fn metrics(agent: &AgentProcess) -> String {
    agent.metrics().await
}

/// Waits (up to [`WAIT`]) until the agent's series `series` satisfies `check`; returns its value.
pub async fn wait_for_metric(agent: &AgentProcess, series: &str, what: &str, check: impl Fn(f64) -> bool) -> f64 {
    crate::eventually(WAIT, what, || async {
        let text = metrics(agent).await;
        metric(&text, series).ok().filter(|v| check(*v))
    })
    .await
}

/// Applies multi-document YAML (what an agent's `rbac` one-shot prints) as `client`; returns how many objects.
pub async fn apply_yaml(client: &kube::Client, yaml: &str) -> Result<usize> {
    let mut applied = 0;
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_yaml::Value::deserialize(doc)?;
        let object: DynamicObject = serde_yaml::from_value(value)?;
        let types = object.types.clone().context("apiVersion and kind")?;
        let (group, version) = types.api_version.split_once('/').unwrap_or(("", &types.api_version));
        let resource = ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: types.api_version.clone(),
            kind: types.kind.clone(),
            plural: format!("{}s", types.kind.to_lowercase()),
        };
        let name = object.metadata.name.clone().context("name")?;
        let namespaced = !types.kind.starts_with("Cluster");
        let api: Api<DynamicObject> = match (&object.metadata.namespace, namespaced) {
            (Some(ns), true) => Api::namespaced_with(client.clone(), ns, &resource),
            _ => Api::all_with(client.clone(), &resource),
        };
        api.patch(&name, &PatchParams::apply("test"), &Patch::Apply(&object)).await?;
        applied += 1;
    }
    Ok(applied)
}
