//! What kubeconfig-rotator does in the demo: it keeps the hub's `railgrid-system/railgrid-kcp` (key
//! `admin.kubeconfig`) fresh from the Kubeconfig `kcp-operator-demo/admin`, whose certificate lives five minutes.
//! The real cert-manager controller and kcp-operator run as host processes on the demo's apiserver
//! (testbed::operators) and issue and render it, in a namespace of their own: cert-manager is limited to it
//! (`--namespace`), so the kcp-like layout the other agents read in `kcp-system` keeps the Secrets it was seeded
//! with. The agent forces a renewal (`renewBefore` is most of the lifetime), nudges the operator, proves the new
//! kubeconfig through the real front proxy and publishes it: the summary names the old and new notAfter.

use std::future::Future;
use std::time::Duration;

use anyhow::{Result, bail};
use e2e::layout::{HUB_NAMESPACE, Layout};
use k8s_openapi::api::core::v1::Secret;
use testbed::agent_process::AgentProcess;
use testbed::operators::{KubeconfigSpec, Operators};

const TARGET: &str = "railgrid-kcp";
const KEY: &str = "admin.kubeconfig";
/// Where cert-manager and the operator work for this agent.
pub const NAMESPACE: &str = "kcp-operator-demo";

/// The operator renders the FrontProxy's external hostname (`localhost` here, which the front proxy's certificate
/// names): the agent rewrites the server to the front proxy's loopback address (as the hub's in-cluster Service)
/// and proves the kubeconfig with it.
pub fn config(front_proxy_url: &str) -> String {
    format!(
        r#"resyncInterval: 10s
kubeconfigs:
- name: admin
  source:
    kubeconfig: {{namespace: {NAMESPACE}, name: admin, renderedSecret: admin-kubeconfig}}
  renewBefore: 285s
  server: {front_proxy_url}
  targets:
  - {{namespace: {HUB_NAMESPACE}, name: {TARGET}, key: {KEY}}}
"#
    )
}

/// Starts cert-manager's controller and the kcp-operator on the demo's apiserver, seeds the Kubeconfig `admin`
/// (`kcp-admin` in `system:kcp:admin`, five minutes) and waits for the operator's first render.
pub async fn operators(bed: &testbed::ControlPlane, layout: &Layout) -> Result<Operators> {
    bed.create_namespace(NAMESPACE).await?;
    let operators = Operators::start(bed, Some(NAMESPACE)).await?;
    let port = layout.kcp.front_proxy.url.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(443);
    let spec = KubeconfigSpec::admin("admin", "admin-kubeconfig", "5m");
    testbed::operators::seed_front_proxy_kubeconfig(
        &bed.client(),
        NAMESPACE,
        &layout.kcp.pki,
        ("localhost", port),
        &spec,
    )
    .await?;
    Ok(operators)
}

/// Waits for the first publication and then for a rotation, and checks the published kubeconfig authenticates
/// through the real front proxy.
pub async fn cycle(bed: &testbed::ControlPlane, agent: &mut AgentProcess) -> Result<String> {
    agent.wait_ready(Duration::from_secs(60)).await?;
    let secrets = kube::Api::<Secret>::namespaced(bed.client(), HUB_NAMESPACE);
    let annotations = || async {
        let s = secrets.get_opt(TARGET).await.ok()??;
        let a = s.metadata.annotations.unwrap_or_default();
        Some((a.get("kcp-keeper.io/not-after")?.clone(), a.get("kcp-keeper.io/serial")?.clone()))
    };
    let (old_not_after, old_serial) = wait("the first publication", Duration::from_secs(60), annotations).await?;
    let (new_not_after, new_serial) = wait("a rotation", Duration::from_secs(120), || async {
        annotations().await.filter(|(_, serial)| *serial != old_serial)
    })
    .await?;
    let target = secrets.get(TARGET).await?;
    let kubeconfig = target.data.and_then(|d| d.get(KEY).map(|v| v.0.clone())).unwrap_or_default();
    let client = testbed::kcp::client_from_yaml(std::str::from_utf8(&kubeconfig)?).await?;
    let review = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
        .header("content-type", "application/json")
        .body(br#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#.to_vec())?;
    let answer: serde_json::Value = client.request(review).await?;
    let user = answer["status"]["userInfo"]["username"].as_str().unwrap_or_default().to_string();
    anyhow::ensure!(user == "kcp-admin", "the published kubeconfig authenticates as {user:?}");
    Ok(format!(
        "rotated {HUB_NAMESPACE}/{TARGET} ({KEY}) from notAfter {old_not_after} (serial {old_serial}) to \
         {new_not_after} (serial {new_serial}): forced the renewal, nudged the render, proven as kcp-admin through \
         the kcp front proxy before publishing"
    ))
}

async fn wait<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("no {what} within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
