//! Helpers shared by the ca-syncer binary tests.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta};
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

#[allow(unused_imports)]
pub use testbed::scrape::{apply_yaml, metric, metrics, wait_for_metric};
