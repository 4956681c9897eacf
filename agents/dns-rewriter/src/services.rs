//! What the planner needs to know about a Service, read from the cluster once and then used as plain data.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;

/// The ClusterIP a rule's answer will be, as far as the Service says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterIp {
    Ip(IpAddr),
    /// `clusterIP: None`: DNS answers with pod addresses, there is no single address to rewrite to.
    Headless,
    /// No address: an `ExternalName` Service, or one the apiserver has not allocated an address for.
    Missing,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceFacts {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub cluster_ip: ClusterIp,
    /// The Service's ports (`spec.ports[].port`, what clients dial).
    pub ports: Vec<u16>,
}

impl ServiceFacts {
    pub fn from_service(svc: &Service) -> Self {
        let spec = svc.spec.as_ref();
        let ip = spec.and_then(|s| s.cluster_ip.as_deref());
        let external_name = spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName");
        let cluster_ip = match ip {
            _ if external_name => ClusterIp::Missing,
            Some("None") => ClusterIp::Headless,
            Some(ip) => ip.parse().map(ClusterIp::Ip).unwrap_or(ClusterIp::Missing),
            None => ClusterIp::Missing,
        };
        let ports = spec
            .and_then(|s| s.ports.as_ref())
            .map(|ports| ports.iter().filter_map(|p| u16::try_from(p.port).ok()).collect())
            .unwrap_or_default();
        Self {
            namespace: svc.metadata.namespace.clone().unwrap_or_default(),
            name: svc.metadata.name.clone().unwrap_or_default(),
            labels: svc.metadata.labels.clone().unwrap_or_default(),
            cluster_ip,
            ports,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use kube::api::ObjectMeta;

    use super::*;

    fn svc(type_: Option<&str>, ip: Option<&str>) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("root-kcp".into()),
                namespace: Some("kcp-system".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: type_.map(Into::into),
                cluster_ip: ip.map(Into::into),
                ports: Some(vec![ServicePort { port: 6443, ..Default::default() }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn cluster_ip_kinds_are_told_apart() {
        let facts = ServiceFacts::from_service(&svc(None, Some("10.96.100.20")));
        assert_eq!(facts.cluster_ip, ClusterIp::Ip("10.96.100.20".parse().unwrap()));
        assert_eq!(facts.ports, vec![6443]);
        assert_eq!(ServiceFacts::from_service(&svc(None, Some("None"))).cluster_ip, ClusterIp::Headless);
        assert_eq!(ServiceFacts::from_service(&svc(Some("ExternalName"), None)).cluster_ip, ClusterIp::Missing);
        assert_eq!(ServiceFacts::from_service(&svc(None, None)).cluster_ip, ClusterIp::Missing);
    }
}
