//! The two foreign kinds the agent reads, declared with the runtime's `foreign_kind!` (metadata typed, spec and
//! status kept as JSON): kcp-operator's `Kubeconfig` (`operator.kcp.io/v1alpha1`) and cert-manager's
//! `Certificate` (`cert-manager.io/v1`), with typed helpers for the few fields the agent reads.

use serde_json::Value;

kcp_keeper_runtime::foreign_kind!(
    /// kcp-operator's `Kubeconfig`: renders a kubeconfig Secret from a Certificate it requests.
    KubeconfigObject,
    "operator.kcp.io",
    "v1alpha1",
    "Kubeconfig",
    "kubeconfigs"
);
kcp_keeper_runtime::foreign_kind!(
    /// cert-manager's `Certificate`, the one the operator requests for a `Kubeconfig`.
    Certificate,
    "cert-manager.io",
    "v1",
    "Certificate",
    "certificates"
);

/// Annotation the agent sets on a Kubeconfig to make the operator re-render (`<serial> <RFC 3339 time>`).
pub const RENDER_REQUESTED: &str = "kcp-keeper.io/render-requested";

impl KubeconfigObject {
    pub fn secret_ref(&self) -> Option<&str> {
        self.spec["secretRef"]["name"].as_str()
    }

    pub fn username(&self) -> Option<&str> {
        self.spec["username"].as_str()
    }

    pub fn groups(&self) -> Vec<String> {
        strings(&self.spec["groups"])
    }
}

impl Certificate {
    /// Whether cert-manager is issuing (condition `Issuing=True`): a renewal is under way.
    pub fn issuing(&self) -> bool {
        self.conditions().iter().any(|c| c["type"] == "Issuing" && c["status"] == "True")
    }

    pub fn conditions(&self) -> Vec<Value> {
        self.status["conditions"].as_array().cloned().unwrap_or_default()
    }

    /// `spec.renewBefore`, as cert-manager reads it.
    pub fn renew_before(&self) -> Option<std::time::Duration> {
        self.spec["renewBefore"].as_str().and_then(|d| kcp_keeper_runtime::duration::parse_go_duration(d).ok())
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect()).unwrap_or_default()
}
