//! Kinds of other projects (kcp-operator's `Kubeconfig`, `RootShard`, ...; cert-manager's `Certificate`),
//! typed just enough for the runtime's watches and reflector stores (which need a static `DynamicType`, so a
//! `DynamicObject` will not do): `metadata` typed, `spec` and `status` kept as JSON for the agents' pure
//! functions. One macro for every agent, so each such kind is declared in one line.

/// Declares a namespaced foreign kind: `foreign_kind!(Certificate, "cert-manager.io", "v1", "Certificate",
/// "certificates");`. The type implements `k8s_openapi::Resource`, `ListableResource` and `Metadata` (and so
/// `kube::Resource`), and (de)serializes `metadata`, `spec` and `status`.
#[macro_export]
macro_rules! foreign_kind {
    ($(#[$attr:meta])* $ty:ident, $group:literal, $version:literal, $kind:literal, $plural:literal) => {
        $(#[$attr])*
        #[derive(Clone, Debug, Default, ::serde::Serialize, ::serde::Deserialize)]
        pub struct $ty {
            pub metadata: ::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
            #[serde(default)]
            pub spec: ::serde_json::Value,
            #[serde(default)]
            pub status: ::serde_json::Value,
        }

        impl ::k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = concat!($group, "/", $version);
            const GROUP: &'static str = $group;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = ::k8s_openapi::NamespaceResourceScope;
        }

        impl ::k8s_openapi::ListableResource for $ty {
            const LIST_KIND: &'static str = concat!($kind, "List");
        }

        impl ::k8s_openapi::Metadata for $ty {
            type Ty = ::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
            fn metadata(&self) -> &Self::Ty {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut Self::Ty {
                &mut self.metadata
            }
        }
    };
}

#[cfg(test)]
mod tests {
    crate::foreign_kind!(Widget, "example.io", "v1", "Widget", "widgets");

    #[test]
    fn a_foreign_kind_addresses_its_resource_and_keeps_spec_and_status() {
        use kube::Resource;
        assert_eq!(Widget::url_path(&(), Some("ns")), "/apis/example.io/v1/namespaces/ns/widgets");
        let w: Widget = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w"}, "spec": {"a": 1}, "status": {"phase": "Ready"}
        }))
        .unwrap();
        assert_eq!((w.spec["a"].as_i64(), w.status["phase"].as_str()), (Some(1), Some("Ready")));
    }
}
