//! The kcp-operator's kinds as typed resources (`operator.kcp.io/v1alpha1`, through the runtime's
//! [`kcp_keeper_runtime::foreign_kind!`]), so they can be watched through the runtime's
//! [`kcp_keeper_runtime::watch::Watches`] (which needs a static `DynamicType`; a `DynamicObject`'s
//! `ApiResource` is not one). What discovery reads is in `spec`, handed over as plain JSON to
//! [`crate::discovery`]'s pure functions.

use kube::Resource;
use serde_json::Value;

use crate::discovery::{Kind, OperatorObject};

kcp_keeper_runtime::foreign_kind!(RootShard, "operator.kcp.io", "v1alpha1", "RootShard", "rootshards");
kcp_keeper_runtime::foreign_kind!(Shard, "operator.kcp.io", "v1alpha1", "Shard", "shards");
kcp_keeper_runtime::foreign_kind!(FrontProxy, "operator.kcp.io", "v1alpha1", "FrontProxy", "frontproxies");

/// The operator's API group and version, as the typed kinds above address them.
pub const OPERATOR_GROUP: &str = <RootShard as k8s_openapi::Resource>::GROUP;
pub const OPERATOR_VERSION: &str = <RootShard as k8s_openapi::Resource>::VERSION;

/// One operator object as read from the cluster.
pub trait OperatorKind: Resource<DynamicType = ()> {
    const KIND: Kind;
    fn spec(&self) -> &Value;

    /// The object as discovery reads it.
    fn to_object(&self) -> OperatorObject {
        let meta = self.meta();
        OperatorObject {
            kind: Self::KIND,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            spec: self.spec().clone(),
        }
    }
}

macro_rules! operator_kind {
    ($ty:ident, $kind:expr) => {
        impl OperatorKind for $ty {
            const KIND: Kind = $kind;

            fn spec(&self) -> &Value {
                &self.spec
            }
        }
    };
}

operator_kind!(RootShard, Kind::RootShard);
operator_kind!(Shard, Kind::Shard);
operator_kind!(FrontProxy, Kind::FrontProxy);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_typed_kinds_address_the_operators_resources() {
        assert_eq!(
            RootShard::url_path(&(), Some("kcp-system")),
            "/apis/operator.kcp.io/v1alpha1/namespaces/kcp-system/rootshards"
        );
        assert_eq!(Shard::url_path(&(), Some("ns")), "/apis/operator.kcp.io/v1alpha1/namespaces/ns/shards");
        assert_eq!(FrontProxy::url_path(&(), Some("ns")), "/apis/operator.kcp.io/v1alpha1/namespaces/ns/frontproxies");
        assert_eq!(FrontProxy::api_version(&()), "operator.kcp.io/v1alpha1");
    }

    #[test]
    fn each_typed_kind_is_the_discovery_kind_of_the_same_name_and_plural() {
        fn same<K: OperatorKind>() {
            assert_eq!((K::kind(&()), K::plural(&())), (K::KIND.name().into(), K::KIND.plural().into()));
        }
        same::<RootShard>();
        same::<Shard>();
        same::<FrontProxy>();
    }

    #[test]
    fn an_object_keeps_its_spec_for_discovery() {
        let json = serde_json::json!({"apiVersion": "operator.kcp.io/v1alpha1", "kind": "FrontProxy",
            "metadata": {"name": "fp", "namespace": "kcp-system"}, "spec": {"external": {"hostname": "kcp.example.com"}},
            "status": {"phase": "Running"}});
        let fp: FrontProxy = serde_json::from_value(json).unwrap();
        let obj = fp.to_object();
        assert_eq!((obj.kind, obj.namespace.as_str(), obj.name.as_str()), (Kind::FrontProxy, "kcp-system", "fp"));
        assert_eq!(obj.spec["external"]["hostname"], "kcp.example.com");
    }
}
