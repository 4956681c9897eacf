//! Helpers shared by the ca-syncer binary tests.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta};
use serde::Deserialize;
use testbed::ControlPlane;
use testbed::agent_process::AgentProcess;

pub const BINARY: &str = env!("CARGO_BIN_EXE_ca-syncer");
pub const WAIT: Duration = Duration::from_secs(30);
pub const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// Writes `config` into a fresh directory of the bed and returns its path.
pub fn write_config(bed: &ControlPlane, config: &str) -> Result<std::path::PathBuf> {
    let path = bed.subdir("ca-syncer")?.join("config.yaml");
    std::fs::write(&path, config)?;
    Ok(path)
}

/// Starts ca-syncer with `config` as the admin, its Lease in `lease_ns`.
pub fn start_agent(bed: &ControlPlane, lease_ns: &str, config: &str) -> Result<AgentProcess> {
    let path = write_config(bed, config)?;
    AgentProcess::start(bed, Path::new(BINARY), &path, lease_ns, "ca-syncer-0", &[])
}

pub fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        data: Some(data.iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect()),
        ..Default::default()
    }
}

pub async fn key(client: &kube::Client, ns: &str, name: &str, key: &str) -> Option<String> {
    let s = Api::<Secret>::namespaced(client.clone(), ns).get_opt(name).await.ok()??;
    s.data?.get(key).map(|v| String::from_utf8_lossy(&v.0).into_owned())
}

pub async fn metrics(agent: &AgentProcess) -> String {
    testbed::http::get(&format!("{}/metrics", agent.admin_url)).await.map(|(_, _, body)| body).unwrap_or_default()
}

/// The value of the one series starting with `series` (name and labels); a missing series is an error, never 0.
pub use testbed::agent_process::metric;

/// Waits until the agent's series `series` satisfies `check`; returns its value.
pub async fn wait_for_metric(agent: &AgentProcess, series: &str, what: &str, check: impl Fn(f64) -> bool) -> f64 {
    testbed::eventually(WAIT, what, || async {
        let text = metrics(agent).await;
        metric(&text, series).ok().filter(|v| check(*v))
    })
    .await
}

/// Applies multi-document YAML (what `ca-syncer rbac` prints) as the admin.
pub async fn apply_yaml(client: &kube::Client, yaml: &str) -> Result<usize> {
    use kube::api::{DynamicObject, Patch, PatchParams};
    use kube::discovery::ApiResource;
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
