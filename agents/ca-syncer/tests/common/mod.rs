//! Helpers shared by the ca-syncer binary tests.
#![allow(dead_code)]

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta};
use testbed::ControlPlane;
use testbed::agent_process::{AgentProcess, AgentUnderTest};

pub const BINARY: &str = env!("CARGO_BIN_EXE_ca-syncer");
pub const WAIT: Duration = Duration::from_secs(30);
pub const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// Writes `config` into a fresh directory of the bed and returns its path.
pub fn write_config(bed: &ControlPlane, config: &str) -> Result<std::path::PathBuf> {
    let path = bed.subdir("ca-syncer")?.join("config.yaml");
    std::fs::write(&path, config)?;
    Ok(path)
}

/// ca-syncer with the configuration file at `path`, its Lease in `lease_ns`, as replica `ca-syncer-0`: the
/// test bed's one builder, for the tests to add to (a token, environment) before they spawn it.
pub fn agent<'a>(bed: &'a ControlPlane, path: &std::path::Path, lease_ns: &str) -> AgentUnderTest<'a> {
    AgentUnderTest::new(bed, BINARY, path).namespace(lease_ns).identity("ca-syncer-0")
}

/// Starts ca-syncer with `config` as the admin, its Lease in `lease_ns` (not waiting for it to be ready).
pub fn start_agent(bed: &ControlPlane, lease_ns: &str, config: &str) -> Result<AgentProcess> {
    agent(bed, &write_config(bed, config)?, lease_ns).spawn()
}

/// Secret `source` (key `ca.crt`) holding `pem` in `ns`, and ca-syncer running, ready, with its Lease in
/// `lease_ns` and one bundle `name` from that Secret into Secret `bundle` in `ns`, after `prefix` (top-level
/// settings such as `resyncInterval: 1s\n`). Returns the namespace's Secrets and the agent.
pub async fn start_one_bundle(
    bed: &ControlPlane,
    ns: &str,
    lease_ns: &str,
    name: &str,
    pem: &str,
    prefix: &str,
) -> Result<(Api<Secret>, AgentProcess)> {
    let api = Api::<Secret>::namespaced(bed.client(), ns);
    api.create(&kube::api::PostParams::default(), &secret("source", &[("ca.crt", pem)])).await?;
    let config = format!(
        "{prefix}bundles:\n- name: {name}\n  sources:\n  - secret: {{namespace: {ns}, name: source, key: ca.crt}}\n  targets:\n  - secret: {{namespace: {ns}, name: bundle, key: ca.crt}}\n"
    );
    let mut agent = start_agent(bed, lease_ns, &config)?;
    agent.wait_ready(WAIT).await?;
    Ok((api, agent))
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

#[allow(unused_imports)]
pub use testbed::scrape::{apply_yaml, metric, metrics, wait_for_metric};
