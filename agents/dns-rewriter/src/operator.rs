//! The kcp-operator's kinds as typed resources (`operator.kcp.io/v1alpha1`), so they can be watched through the
//! runtime's [`kcp_keeper_runtime::watch::Watches`] (which needs a static `DynamicType`; a `DynamicObject`'s
//! `ApiResource` is not one). Only `metadata` and `spec` are kept: what discovery reads is in `spec`, as plain
//! JSON for [`crate::discovery`]'s pure functions.

use std::borrow::Cow;

use k8s_openapi::NamespaceResourceScope;
use kube::Resource;
use kube::api::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cluster::{OPERATOR_GROUP, OPERATOR_VERSION};
use crate::discovery::{Kind, OperatorObject};

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
        #[derive(Clone, Debug, Default, Deserialize, Serialize)]
        pub struct $ty {
            pub metadata: ObjectMeta,
            #[serde(default)]
            pub spec: Value,
        }

        impl Resource for $ty {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                $kind.name().into()
            }

            fn group(_: &()) -> Cow<'_, str> {
                OPERATOR_GROUP.into()
            }

            fn version(_: &()) -> Cow<'_, str> {
                OPERATOR_VERSION.into()
            }

            fn plural(_: &()) -> Cow<'_, str> {
                $kind.plural().into()
            }

            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }

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
