//! `helm install` of this repository's chart (charts/kcp-keeper) into the test bed, with the real helm and its
//! cache and config kept inside the bed's directory.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::ControlPlane;

/// Installs release `kcp-keeper` of charts/kcp-keeper into `namespace` with `values` (YAML), as the admin.
pub fn install(bed: &ControlPlane, namespace: &str, values: &str) -> Result<()> {
    let home = bed.subdir("helm")?;
    let values_file = home.join("values.yaml");
    std::fs::write(&values_file, values)?;
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/kcp-keeper");
    let out = Command::new(bed.peers.path("helm"))
        .args(["install", "kcp-keeper"])
        .arg(&chart)
        .args(["--namespace", namespace, "--kubeconfig"])
        .arg(&bed.apiserver.admin_kubeconfig)
        .arg("--values")
        .arg(&values_file)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()?;
    anyhow::ensure!(out.status.success(), "helm install: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// A kubeconfig with a TokenRequest token for ServiceAccount `namespace/name`, which the chart created, and the
/// user name the apiserver (and its audit log) knows the token by.
pub async fn chart_account_kubeconfig(
    bed: &ControlPlane,
    namespace: &str,
    name: &str,
) -> Result<(std::path::PathBuf, String)> {
    use anyhow::Context;
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
        ..Default::default()
    };
    let minted = kube::Api::<ServiceAccount>::namespaced(bed.client(), namespace)
        .create_token_request(name, &kube::api::PostParams::default(), &request)
        .await
        .context("TokenRequest for the chart's ServiceAccount")?;
    let token = minted.status.and_then(|s| s.token).context("the TokenRequest has no token")?;
    let user = format!("system:serviceaccount:{namespace}:{name}");
    Ok((bed.apiserver.token_kubeconfig(&user, &token)?, user))
}
