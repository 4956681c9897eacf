//! The two foreign kinds the agent reads, typed just enough for reflector stores: kcp-operator's `Kubeconfig`
//! (`operator.kcp.io/v1alpha1`) and cert-manager's `Certificate` (`cert-manager.io/v1`). Only the fields the
//! agent uses are typed; the rest is kept as JSON.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

macro_rules! foreign_kind {
    ($ty:ident, $group:literal, $version:literal, $kind:literal, $plural:literal) => {
        #[derive(Clone, Debug, Default, Serialize, Deserialize)]
        pub struct $ty {
            pub metadata: ObjectMeta,
            #[serde(default)]
            pub spec: Value,
            #[serde(default)]
            pub status: Value,
        }

        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = concat!($group, "/", $version);
            const GROUP: &'static str = $group;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = k8s_openapi::NamespaceResourceScope;
        }

        impl k8s_openapi::ListableResource for $ty {
            const LIST_KIND: &'static str = concat!($kind, "List");
        }

        impl k8s_openapi::Metadata for $ty {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

foreign_kind!(KubeconfigObject, "operator.kcp.io", "v1alpha1", "Kubeconfig", "kubeconfigs");
foreign_kind!(Certificate, "cert-manager.io", "v1", "Certificate", "certificates");

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
