//! Helpers shared by the kubeconfig-rotator process tests: the kcp-operator layout on a test bed, run by the real
//! cert-manager controller and kcp-operator, and reads of the target.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, ObjectMeta};
use serde_json::json;
use testbed::ControlPlane;
use testbed::agent_process::{AgentProcess, AgentUnderTest};
use testbed::kcp::Kcp;
use testbed::operators::{KubeconfigSpec, Operators};

pub const BINARY: &str = env!("CARGO_BIN_EXE_kubeconfig-rotator");
pub const KUBECONFIG: &str = "hub-admin";
pub const RENDERED: &str = "hub-admin-kubeconfig";
pub const TARGET: &str = "railgrid-kcp";
pub const TARGET_KEY: &str = "admin.kubeconfig";

/// The port of the shared front proxy (its URL is `https://127.0.0.1:<port>`).
pub fn front_proxy_port(kcp: &Kcp) -> u16 {
    kcp.front_proxy.url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("front proxy URL has a port")
}

pub fn secret(name: &str, data: &[(&str, &[u8])]) -> Secret {
    Secret {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        data: Some(data.iter().map(|(k, v)| (k.to_string(), ByteString(v.to_vec()))).collect()),
        ..Default::default()
    }
}

/// A test bed laid out as the kcp-operator lays out a Kubeconfig for the hub: namespace `src` (kcp-system), where
/// [`Layout::operator`] puts the operator's objects and a Kubeconfig `hub-admin` (user `kcp-admin`, group
/// `system:kcp:admin`) targeting the FrontProxy; `dst` (railgrid-system) for the target; `agent` for the agent's
/// Lease.
pub struct Layout {
    pub bed: ControlPlane,
    pub kcp: &'static Kcp,
    pub src: String,
    pub dst: String,
    pub agent: String,
    /// cert-manager's controller and the kcp-operator, once [`Layout::operator`] started them.
    pub operators: Option<Operators>,
}

impl Layout {
    pub async fn new() -> Result<Self> {
        let kcp = testbed::kcp::shared();
        let bed = ControlPlane::start().await?;
        let (src, dst, agent) = (bed.namespace().await?, bed.namespace().await?, bed.namespace().await?);
        Ok(Self { bed, kcp, src, dst, agent, operators: None })
    }

    /// Starts the real cert-manager controller and kcp-operator against this bed and seeds the operator's objects
    /// for the Kubeconfig `hub-admin` with `validity` (testbed::operators): a FrontProxy `frontproxy` whose
    /// external hostname is `localhost` on the real front proxy's port, its RootShard `root`, the client Certificate
    /// signed by the client CA the real front proxy trusts. `renew_before`, the client Certificate's own, sets when
    /// cert-manager renews on its own (None: its default, a third of the lifetime). Returns once the operator has
    /// rendered the kubeconfig.
    pub async fn operator(&mut self, validity: &str, renew_before: Option<&str>) -> Result<()> {
        let client = self.bed.client();
        let operators = Operators::start(&self.bed, Some(&self.src)).await?;
        let mut spec = KubeconfigSpec::admin(KUBECONFIG, RENDERED, validity);
        spec.renew_before = renew_before.map(String::from);
        let external = ("localhost", front_proxy_port(self.kcp));
        let seeded =
            testbed::operators::seed_front_proxy_kubeconfig(&client, &self.src, &self.kcp.pki, external, &spec);
        let seeded = seeded.await.map_err(|e| operators.with_logs(e));
        self.operators = Some(operators);
        seeded
    }

    pub fn write_config(&self, config: &str) -> Result<PathBuf> {
        let path = self.bed.subdir("kubeconfig-rotator")?.join("config.yaml");
        std::fs::write(&path, config)?;
        Ok(path)
    }

    /// The agent as this layout runs it: its Lease in the agent namespace, as replica `kubeconfig-rotator-0`.
    pub fn rotator(&self, config: &Path) -> AgentUnderTest<'_> {
        AgentUnderTest::new(&self.bed, BINARY, config).namespace(&self.agent).identity("kubeconfig-rotator-0")
    }

    /// Starts the agent as the admin and waits (up to [`WAIT`]) until it is ready.
    pub async fn start(&self, config: &Path) -> Result<AgentProcess> {
        self.rotator(config).ready_within(WAIT).start().await
    }

    pub async fn target(&self) -> Option<Secret> {
        Api::<Secret>::namespaced(self.bed.client(), &self.dst).get_opt(TARGET).await.ok()?
    }

    /// The target's serial annotation, once it exists.
    pub async fn target_serial(&self) -> Option<String> {
        annotation(&self.target().await?, "kcp-keeper.io/serial")
    }

    /// Events in `namespace` with `reason`: their notes.
    pub async fn events(&self, namespace: &str, reason: &str) -> Vec<String> {
        let events = Api::<Event>::namespaced(self.bed.client(), namespace).list(&ListParams::default()).await;
        events
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.note)
            .collect()
    }

    /// Every Event note in the namespaces of this layout, for the leak check.
    pub async fn all_event_notes(&self) -> String {
        let mut out = String::new();
        for ns in [&self.src, &self.dst, &self.agent] {
            let events = Api::<Event>::namespaced(self.bed.client(), ns).list(&ListParams::default()).await;
            for e in events.map(|l| l.items).unwrap_or_default() {
                out.push_str(&format!("{:?} {:?}\n", e.reason, e.note));
            }
        }
        out
    }
}

pub fn annotation(secret: &Secret, key: &str) -> Option<String> {
    secret.metadata.annotations.as_ref()?.get(key).cloned()
}

pub fn key(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    secret.data.as_ref()?.get(key).map(|v| v.0.clone())
}

/// The outcome of one SelfSubjectReview with a kubeconfig, as the probe records it.
pub async fn self_subject_review(kubeconfig: &[u8]) -> Result<String> {
    let client = testbed::kcp::client_from_yaml(std::str::from_utf8(kubeconfig)?).await?;
    let body = serde_json::to_vec(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}))?;
    let request = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
        .header("content-type", "application/json")
        .body(body)?;
    let answer: serde_json::Value = client.request(request).await?;
    Ok(answer["status"]["userInfo"]["username"].as_str().unwrap_or_default().to_string())
}

pub const WAIT: Duration = Duration::from_secs(60);
