//! Installs CRDs from YAML files and waits until the apiserver serves them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use serde::Deserialize;

/// kcp-operator v0.9.0's CRDs, vendored unmodified (provenance and license beside them): the Go module proxy
/// refuses that module, so they cannot come from a module download as cert-manager's do.
pub fn kcp_operator() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crds").join("kcp-operator-v0.9.0")
}

/// Every CRD in a YAML file or in every `.yaml` file of a directory.
pub fn read(path: &Path) -> Result<Vec<CustomResourceDefinition>> {
    let mut files = Vec::new();
    if path.is_dir() {
        for entry in std::fs::read_dir(path).with_context(|| format!("reading {}", path.display()))? {
            let p = entry?.path();
            if p.extension().is_some_and(|e| e == "yaml") {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path.into());
    }
    let mut crds = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(doc).with_context(|| format!("parsing {}", file.display()))?;
            if value.is_null() {
                continue;
            }
            crds.push(serde_yaml::from_value(value).with_context(|| format!("a CRD in {}", file.display()))?);
        }
    }
    Ok(crds)
}

/// Creates the CRDs and waits until each is Established.
pub async fn install(client: &kube::Client, crds: Vec<CustomResourceDefinition>) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &crd).await.with_context(|| format!("creating CRD {name}"))?;
        names.push(name);
    }
    wait_established(client, names).await
}

/// Waits until each named CRD exists and is Established.
pub async fn wait_established(client: &kube::Client, names: Vec<String>) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for name in names {
        loop {
            let crd = api.get(&name).await.with_context(|| format!("reading CRD {name}"))?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                bail!("CRD {name} not Established within 30s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}
