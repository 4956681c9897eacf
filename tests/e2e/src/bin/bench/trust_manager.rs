//! The `ca-sync` benchmark's anchor: cert-manager's trust-manager, what a user would install instead of
//! ca-syncer. Its controller (the bench-only peer, `go install` of v0.24.0) runs as a host process against the
//! bench's apiserver with its default flags except where running outside a pod needs otherwise (see [`start`]),
//! and distributes a `Bundle` (its own CRD, from its module's `deploy/crds`) whose sources are a Secret in its
//! trust namespace and whose target is picked by a namespace selector. It needs no cert-manager controller for a
//! Secret source.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use serde_json::json;
use testbed::process::{Process, free_port};

/// Its default `--trust-namespace`: where a Bundle's sources are read from.
pub const TRUST_NAMESPACE: &str = "cert-manager";
pub const USER: &str = "bench-trust-manager";

/// Installs the Bundle CRD (trust.cert-manager.io/v1alpha1) the controller serves.
pub async fn install_crd(client: &kube::Client, crds: &Path) -> Result<()> {
    let crds = testbed::crds::read(&crds.join("trust.cert-manager.io_bundles.yaml"))?;
    testbed::crds::install(client, crds).await
}

/// Starts the controller as the bench's `USER` (system:masters, so RBAC is not what is measured). Flags beyond
/// the defaults: the kubeconfig; `--leader-elect=false`, because out of a pod controller-runtime cannot find the
/// namespace of its lease (it reads the pod's service-account namespace file) and refuses to start, and one replica
/// leads anyway; `--secret-targets-enabled` for the Secret target, which is off by default; its three listening
/// ports moved to free ones (its defaults, 6060, 9402 and 6443, may be taken on a shared machine); and its
/// webhook's serving certificate, which it loads at start.
pub fn start(binary: &Path, bed: &testbed::ControlPlane, dir: &Path, secret_targets: bool) -> Result<Process> {
    std::fs::create_dir_all(dir)?;
    let ca = testbed::certs::Ca::new("bench trust-manager webhook CA", Duration::from_secs(24 * 3600))?;
    let serving =
        ca.issue_server(&["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)], Duration::from_secs(24 * 3600))?;
    let tls = dir.join("tls");
    std::fs::create_dir_all(&tls)?;
    std::fs::write(tls.join("tls.crt"), &serving.cert_pem)?;
    std::fs::write(tls.join("tls.key"), &serving.key_pem)?;
    let kubeconfig = bed.apiserver.user_kubeconfig(USER, &["system:masters"], Duration::from_secs(24 * 3600))?;
    let args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        "--leader-elect=false".into(),
        format!("--secret-targets-enabled={secret_targets}"),
        format!("--readiness-probe-port={}", free_port()?),
        format!("--metrics-port={}", free_port()?),
        "--webhook-host=127.0.0.1".into(),
        format!("--webhook-port={}", free_port()?),
        format!("--webhook-certificate-dir={}", tls.display()),
    ];
    Process::start("trust-manager", binary, args, dir.join("trust-manager.log"))
}

fn bundles(client: &kube::Client) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "trust.cert-manager.io".into(),
        version: "v1alpha1".into(),
        api_version: "trust.cert-manager.io/v1alpha1".into(),
        kind: "Bundle".into(),
        plural: "bundles".into(),
    };
    Api::all_with(client.clone(), &resource)
}

/// A Bundle named `name` (trust-manager names every target after its Bundle): both keys of the trust namespace's
/// `source` Secret (as ca-syncer's bundle has them), into key `key` of a ConfigMap or a Secret (`kind`) in every
/// namespace matching the label.
pub async fn create_bundle(
    client: &kube::Client,
    name: &str,
    source: &str,
    kind: &str,
    key: &str,
    label: (&str, &str),
) -> Result<()> {
    let target_kind = if kind == "Secret" { "secret" } else { "configMap" };
    let bundle: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "trust.cert-manager.io/v1alpha1",
        "kind": "Bundle",
        "metadata": {"name": name},
        "spec": {
            "sources": [
                {"secret": {"name": source, "key": "tls.crt"}},
                {"secret": {"name": source, "key": "ca.crt"}},
            ],
            "target": {
                target_kind: {"key": key},
                "namespaceSelector": {"matchLabels": {label.0: label.1}},
            },
        },
    }))?;
    bundles(client).create(&PostParams::default(), &bundle).await.context("creating the trust-manager Bundle")?;
    Ok(())
}

pub async fn delete_bundle(client: &kube::Client, name: &str) -> Result<()> {
    bundles(client).delete(name, &DeleteParams::default()).await?;
    Ok(())
}
