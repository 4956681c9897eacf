//! Public names and Services found in the kcp-operator's objects (`operator.kcp.io/v1alpha1`), as pure
//! functions over the objects' `spec` (field names from the operator's v0.9.0 CRDs):
//!
//! - `RootShard` and `Shard`: the host of `--shard-virtual-workspace-url=<url>` in `spec.extraArgs` (also the
//!   two-argument form `--shard-virtual-workspace-url <url>`), and every name in
//!   `spec.certificateTemplates.server.spec.dnsNames`;
//! - `FrontProxy`: `spec.external.hostname` (port `spec.external.port`), else the deprecated
//!   `spec.externalHostname` (which the operator pairs with port 6443).
//!
//! A RootShard's own `spec.external.hostname` is not used: the CRD documents it as the kcp instance's external
//! name, served by the front proxy, not by the shard.
//!
//! The Service of each object is the one in its namespace labelled as the operator labels its Services:
//! `app.kubernetes.io/component` (`rootshard`, `shard`, `front-proxy`) and `app.kubernetes.io/instance`
//! (the object's name).

use std::fmt;
use std::net::IpAddr;

use serde_json::Value;

use crate::services::ServiceFacts;

pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
const VW_FLAG: &str = "--shard-virtual-workspace-url";

/// The operator kinds we discover from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    RootShard,
    Shard,
    FrontProxy,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::RootShard, Kind::Shard, Kind::FrontProxy];

    /// The kind's name, plural, and the `app.kubernetes.io/component` label value of the operator's Service
    /// for it.
    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Kind::RootShard => ("RootShard", "rootshards", "rootshard"),
            Kind::Shard => ("Shard", "shards", "shard"),
            Kind::FrontProxy => ("FrontProxy", "frontproxies", "front-proxy"),
        }
    }

    pub fn name(self) -> &'static str {
        self.names().0
    }

    pub fn plural(self) -> &'static str {
        self.names().1
    }

    pub fn component(self) -> &'static str {
        self.names().2
    }
}

/// Which kinds a discovery configuration asks for, in [`Kind::ALL`]'s order.
pub fn wanted_kinds(root_shards: bool, shards: bool, front_proxies: bool) -> Vec<Kind> {
    let wanted = [root_shards, shards, front_proxies];
    Kind::ALL.into_iter().zip(wanted).filter_map(|(kind, on)| on.then_some(kind)).collect()
}

/// One RootShard, Shard or FrontProxy as read from the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorObject {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    pub spec: Value,
}

/// Where a rule came from, for errors, Events and logs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Origin {
    /// `rules[i]` of the configuration.
    Rule(usize),
    /// A field of an operator object (`field` is a path such as `spec.extraArgs[2]`; empty for the object).
    Object { kind: Kind, namespace: String, name: String, field: String },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Rule(i) => write!(f, "rules[{i}]"),
            Origin::Object { kind, namespace, name, field } if field.is_empty() => {
                write!(f, "{} {namespace}/{name}", kind.name())
            }
            Origin::Object { kind, namespace, name, field } => write!(f, "{} {namespace}/{name} {field}", kind.name()),
        }
    }
}

impl OperatorObject {
    pub fn origin(&self, field: impl Into<String>) -> Origin {
        Origin::Object {
            kind: self.kind,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            field: field.into(),
        }
    }
}

/// A public name found in an object, not yet checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub origin: Origin,
    pub host: String,
    /// The public URL's port, when the field says (a URL, `spec.external.port`).
    pub port: Option<u16>,
    /// Certificate DNS names may hold wildcards or in-cluster names that no rule can serve; those are skipped,
    /// not errors. A name from a URL or the external hostname must be valid.
    pub from_certificate: bool,
}

/// A field we could not read a name from (e.g. a URL without a host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableField(pub Origin);

/// Every public name `obj` declares. IP addresses are left out: they need no DNS.
pub fn public_names(obj: &OperatorObject) -> (Vec<Candidate>, Vec<UnreadableField>) {
    let mut names = Vec::new();
    let mut unreadable = Vec::new();
    let spec = &obj.spec;
    match obj.kind {
        Kind::RootShard | Kind::Shard => {
            let args: Vec<Option<&str>> =
                spec.pointer("/extraArgs").and_then(Value::as_array).into_iter().flatten().map(Value::as_str).collect();
            for (i, arg) in args.iter().enumerate() {
                let Some(arg) = arg else { continue };
                let (value, at) = if let Some(v) = arg.strip_prefix(VW_FLAG).and_then(|r| r.strip_prefix('=')) {
                    (Some(v), i)
                } else if *arg == VW_FLAG {
                    let value = args.get(i + 1).copied().flatten();
                    (value, if value.is_some() { i + 1 } else { i })
                } else {
                    continue;
                };
                let origin = obj.origin(format!("spec.extraArgs[{at}]"));
                match value.and_then(url_host_port) {
                    Some((host, _)) if is_ip(&host) => {}
                    Some((host, port)) => {
                        names.push(Candidate { origin, host, port: Some(port), from_certificate: false })
                    }
                    None => unreadable.push(UnreadableField(origin)),
                }
            }
            let dns_names = spec.pointer("/certificateTemplates/server/spec/dnsNames").and_then(Value::as_array);
            for (i, name) in dns_names.into_iter().flatten().enumerate() {
                let origin = obj.origin(format!("spec.certificateTemplates.server.spec.dnsNames[{i}]"));
                match name.as_str() {
                    Some(host) if is_ip(host) => {}
                    Some(host) => {
                        names.push(Candidate { origin, host: host.into(), port: None, from_certificate: true })
                    }
                    None => unreadable.push(UnreadableField(origin)),
                }
            }
        }
        Kind::FrontProxy => {
            let external = spec.pointer("/external/hostname").and_then(Value::as_str).filter(|h| !h.is_empty());
            let deprecated = spec.pointer("/externalHostname").and_then(Value::as_str).filter(|h| !h.is_empty());
            let found = match (external, deprecated) {
                (Some(host), _) => {
                    let port =
                        spec.pointer("/external/port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok());
                    Some((host, port, "spec.external.hostname"))
                }
                (None, Some(host)) => Some((host, Some(6443), "spec.externalHostname")),
                (None, None) => None,
            };
            if let Some((host, port, field)) = found
                && !is_ip(host)
            {
                names.push(Candidate { origin: obj.origin(field), host: host.into(), port, from_certificate: false });
            }
        }
    }
    (names, unreadable)
}

/// The Services in `obj`'s namespace carrying the operator's labels for it (normally exactly one).
pub fn services_of<'a>(obj: &OperatorObject, services: &'a [ServiceFacts]) -> Vec<&'a ServiceFacts> {
    services
        .iter()
        .filter(|s| {
            s.namespace == obj.namespace
                && s.labels.get(COMPONENT_LABEL).map(String::as_str) == Some(obj.kind.component())
                && s.labels.get(INSTANCE_LABEL) == Some(&obj.name)
        })
        .collect()
}

/// `https://host:port/path` to its host (lowercase as written; checked later) and port (443 by default).
fn url_host_port(url: &str) -> Option<(String, u16)> {
    let uri: http::Uri = url.parse().ok()?;
    let default = match uri.scheme_str()? {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let host = uri.host().filter(|h| !h.is_empty())?;
    Some((host.trim_start_matches('[').trim_end_matches(']').to_string(), uri.port_u16().unwrap_or(default)))
}

fn is_ip(host: &str) -> bool {
    host.parse::<IpAddr>().is_ok()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(kind: Kind, name: &str, spec: Value) -> OperatorObject {
        OperatorObject { kind, namespace: "kcp-system".into(), name: name.into(), spec }
    }

    fn hosts(names: &[Candidate]) -> Vec<(&str, Option<u16>, String)> {
        names.iter().map(|c| (c.host.as_str(), c.port, c.origin.to_string())).collect()
    }

    #[test]
    fn a_shard_names_itself_by_its_virtual_workspace_url_and_certificate_dns_names() {
        let shard = obj(
            Kind::Shard,
            "alpha",
            json!({
                "rootShard": {"ref": {"name": "root"}},
                "extraArgs": ["--v=2", "--shard-virtual-workspace-url=https://alpha.kcp.example.com:6443/services"],
                "certificateTemplates": {"server": {"spec": {"dnsNames": ["alpha.kcp.example.com", "alpha-2.kcp.example.com", "10.0.0.1"]}}},
            }),
        );
        let (names, unreadable) = public_names(&shard);
        assert!(unreadable.is_empty());
        assert_eq!(
            hosts(&names),
            vec![
                ("alpha.kcp.example.com", Some(6443), "Shard kcp-system/alpha spec.extraArgs[1]".to_string()),
                (
                    "alpha.kcp.example.com",
                    None,
                    "Shard kcp-system/alpha spec.certificateTemplates.server.spec.dnsNames[0]".into()
                ),
                (
                    "alpha-2.kcp.example.com",
                    None,
                    "Shard kcp-system/alpha spec.certificateTemplates.server.spec.dnsNames[1]".into()
                ),
            ]
        );
        assert!(!names[0].from_certificate && names[1].from_certificate);
    }

    #[test]
    fn the_flag_may_be_split_over_two_arguments_and_defaults_to_port_443() {
        let root = obj(
            Kind::RootShard,
            "root",
            json!({"extraArgs": ["--shard-virtual-workspace-url", "https://root.kcp.example.com"], "external": {"hostname": "kcp.example.com", "port": 443}}),
        );
        let (names, _) = public_names(&root);
        assert_eq!(
            hosts(&names),
            vec![("root.kcp.example.com", Some(443), "RootShard kcp-system/root spec.extraArgs[1]".into())]
        );
    }

    #[test]
    fn an_unreadable_url_is_reported_by_its_field() {
        let shard = obj(
            Kind::Shard,
            "alpha",
            json!({"extraArgs": ["--shard-virtual-workspace-url=not a url", "--shard-virtual-workspace-url=ftp://x.example.com", "--shard-virtual-workspace-url"]}),
        );
        let (names, unreadable) = public_names(&shard);
        assert!(names.is_empty());
        let fields: Vec<String> = unreadable.iter().map(|u| u.0.to_string()).collect();
        assert_eq!(
            fields,
            vec![
                "Shard kcp-system/alpha spec.extraArgs[0]",
                "Shard kcp-system/alpha spec.extraArgs[1]",
                "Shard kcp-system/alpha spec.extraArgs[2]"
            ]
        );
    }

    #[test]
    fn a_front_proxy_names_itself_by_its_external_hostname_then_the_deprecated_field() {
        let fp = obj(
            Kind::FrontProxy,
            "frontproxy",
            json!({"external": {"hostname": "kcp.example.com", "port": 443}, "externalHostname": "old.example.com"}),
        );
        assert_eq!(
            hosts(&public_names(&fp).0),
            vec![("kcp.example.com", Some(443), "FrontProxy kcp-system/frontproxy spec.external.hostname".into())]
        );
        let old = obj(Kind::FrontProxy, "frontproxy", json!({"externalHostname": "old.example.com"}));
        assert_eq!(
            hosts(&public_names(&old).0),
            vec![("old.example.com", Some(6443), "FrontProxy kcp-system/frontproxy spec.externalHostname".into())]
        );
        let none = obj(Kind::FrontProxy, "frontproxy", json!({"rootShard": {"ref": {"name": "root"}}}));
        assert!(public_names(&none).0.is_empty());
    }

    #[test]
    fn services_are_matched_by_the_operators_component_and_instance_labels_in_the_same_namespace() {
        let svc = |ns: &str, name: &str, component: &str, instance: &str| ServiceFacts {
            namespace: ns.into(),
            name: name.into(),
            labels: [(COMPONENT_LABEL, component), (INSTANCE_LABEL, instance)]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cluster_ip: crate::services::ClusterIp::Missing,
            ports: vec![],
        };
        let services = vec![
            svc("kcp-system", "root-kcp", "rootshard", "root"),
            svc("kcp-system", "root-proxy", "rootshard-proxy", "root"),
            svc("other", "root-kcp", "rootshard", "root"),
            svc("kcp-system", "alpha-shard-kcp", "shard", "alpha"),
        ];
        let found = services_of(&obj(Kind::RootShard, "root", json!({})), &services);
        assert_eq!(found.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), vec!["root-kcp"]);
        assert!(services_of(&obj(Kind::Shard, "root", json!({})), &services).is_empty());
    }
}
