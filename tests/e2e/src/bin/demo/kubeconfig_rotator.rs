//! What kubeconfig-rotator does in the demo: it keeps the hub's `railgrid-system/railgrid-kcp` (key
//! `admin.kubeconfig`) fresh from the seeded Kubeconfig `kcp-system/admin`, whose certificate lives five minutes.
//! cert-manager and the kcp-operator cannot run here, so the test bed's issuer and renderer stand-ins play them.
//! The agent forces a renewal (`renewBefore` is most of the lifetime), nudges the renderer, proves the new
//! kubeconfig through the real front proxy and publishes it: the summary names the old and new notAfter.

use std::borrow::Borrow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use e2e::layout::{HUB_NAMESPACE, KCP_NAMESPACE, Layout};
use k8s_openapi::api::core::v1::Secret;
use testbed::agent_process::AgentProcess;
use testbed::certs::Ca;
use testbed::standins::{self, StandIn, issuer};

const TARGET: &str = "railgrid-kcp";
const KEY: &str = "admin.kubeconfig";

/// The client CA, held through the layout for as long as the issuer stand-in runs.
struct ClientCa(Arc<Layout>);

impl Borrow<Ca> for ClientCa {
    fn borrow(&self) -> &Ca {
        self.0.client_ca()
    }
}

/// The operator renders the public hostname, which has no DNS here: the agent rewrites the server to the front
/// proxy's loopback address (as the hub's in-cluster Service) and proves the kubeconfig with it.
pub fn config(front_proxy_url: &str) -> String {
    format!(
        r#"resyncInterval: 10s
kubeconfigs:
- name: admin
  source:
    kubeconfig: {{namespace: {KCP_NAMESPACE}, name: admin, renderedSecret: admin-kubeconfig}}
  renewBefore: 285s
  server: {front_proxy_url}
  targets:
  - {{namespace: {HUB_NAMESPACE}, name: {TARGET}, key: {KEY}}}
"#
    )
}

/// Starts cert-manager's and the operator's stand-ins on the demo's layout.
pub fn stand_ins(bed: &testbed::ControlPlane, layout: &Arc<Layout>) -> Vec<StandIn> {
    let settings = issuer::Settings::default();
    vec![
        issuer::spawn(bed.client(), KCP_NAMESPACE, ClientCa(layout.clone()), settings),
        standins::renderer::spawn(bed.client(), KCP_NAMESPACE, Duration::from_secs(600)),
    ]
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
