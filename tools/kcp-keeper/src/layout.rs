//! The kcp-operator objects and etcd StatefulSets as the checks see them: parsed from what the cluster returns
//! into exactly the fields a rule reads. Anyone who may edit these objects controls their content, so nothing
//! else is kept (an OIDC `clientSecret` in particular is never read, so it can never be printed).

use serde::Deserialize;

/// `spec.image` of a kcp component; both parts absent means the operator's default image.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Image {
    pub repository: Option<String>,
    pub tag: Option<String>,
}

impl Image {
    /// `repository:tag` as the operator would run it, `<default>` for a missing part.
    pub fn describe(&self) -> String {
        format!(
            "{}:{}",
            self.repository.as_deref().unwrap_or("<operator default>"),
            self.tag.as_deref().unwrap_or("<operator default>")
        )
    }
}

/// The OIDC settings a shard or front proxy authenticates with, without the client secret.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Oidc {
    #[serde(rename = "issuerURL")]
    pub issuer_url: Option<String>,
    #[serde(rename = "clientID")]
    pub client_id: Option<String>,
    pub username_claim: Option<String>,
    pub username_prefix: Option<String>,
    pub groups_claim: Option<String>,
    pub groups_prefix: Option<String>,
}

impl Oidc {
    /// Each compared field: its name as the CRD spells it, and its value.
    pub fn fields(&self) -> [(&'static str, Option<&str>); 6] {
        [
            ("issuerURL", self.issuer_url.as_deref()),
            ("clientID", self.client_id.as_deref()),
            ("usernameClaim", self.username_claim.as_deref()),
            ("usernamePrefix", self.username_prefix.as_deref()),
            ("groupsClaim", self.groups_claim.as_deref()),
            ("groupsPrefix", self.groups_prefix.as_deref()),
        ]
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Auth {
    oidc: Option<Oidc>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct External {
    hostname: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Etcd {
    #[serde(default)]
    endpoints: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Proxy {
    image: Option<Image>,
}

/// `spec.certificateTemplates.server.spec.dnsNames`: the names the shard's serving certificate is for.
#[derive(Debug, Clone, Default, Deserialize)]
struct CertificateTemplates {
    server: Option<CertificateTemplate>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct CertificateTemplate {
    spec: Option<CertificateSpec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CertificateSpec {
    #[serde(default)]
    dns_names: Vec<String>,
}

/// The union of the fields the rules read from a RootShard, Shard or FrontProxy `spec`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSpec {
    image: Option<Image>,
    proxy: Option<Proxy>,
    #[serde(rename = "shardBaseURL")]
    shard_base_url: Option<String>,
    #[serde(default)]
    extra_args: Vec<String>,
    external: Option<External>,
    auth: Option<Auth>,
    etcd: Option<Etcd>,
    cluster_domain: Option<String>,
    certificate_templates: Option<CertificateTemplates>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    RootShard,
    Shard,
    FrontProxy,
}

impl Kind {
    pub fn lower(self) -> &'static str {
        match self {
            Kind::RootShard => "rootshard",
            Kind::Shard => "shard",
            Kind::FrontProxy => "frontproxy",
        }
    }
}

/// One kcp component as the rules see it.
#[derive(Debug, Clone)]
pub struct Component {
    pub kind: Kind,
    pub name: String,
    pub image: Image,
    /// The root shard's proxy image; `None` for a RootShard without `spec.proxy.image` and for the others.
    pub proxy_image: Option<Image>,
    pub shard_base_url: Option<String>,
    pub extra_args: Vec<String>,
    pub external_hostname: Option<String>,
    pub oidc: Option<Oidc>,
    pub etcd_endpoints: Vec<String>,
    pub cluster_domain: String,
    /// The names in the server certificate's template (where the operator puts a shard's public name).
    pub server_names: Vec<String>,
}

impl Component {
    /// `spec` of an object of `kind` named `name` (the object's JSON `spec`; `null` when absent).
    pub fn parse(kind: Kind, name: &str, spec: &serde_json::Value) -> Result<Self, serde_json::Error> {
        let raw: RawSpec = if spec.is_null() { RawSpec::default() } else { RawSpec::deserialize(spec)? };
        Ok(Self {
            kind,
            name: name.into(),
            image: raw.image.unwrap_or_default(),
            proxy_image: raw.proxy.and_then(|p| p.image),
            shard_base_url: raw.shard_base_url.filter(|u| !u.is_empty()),
            extra_args: raw.extra_args,
            external_hostname: raw.external.and_then(|e| e.hostname).filter(|h| !h.is_empty()),
            oidc: raw.auth.and_then(|a| a.oidc),
            etcd_endpoints: raw.etcd.map(|e| e.endpoints).unwrap_or_default(),
            cluster_domain: raw.cluster_domain.unwrap_or_else(|| "cluster.local".into()),
            server_names: raw
                .certificate_templates
                .and_then(|t| t.server)
                .and_then(|t| t.spec)
                .map(|s| s.dns_names)
                .unwrap_or_default(),
        })
    }

    /// `rootshard/root`.
    pub fn subject(&self) -> String {
        format!("{}/{}", self.kind.lower(), self.name)
    }

    pub fn is_shard(&self) -> bool {
        matches!(self.kind, Kind::RootShard | Kind::Shard)
    }

    /// The value of `--<flag>=V` (or `--<flag> V`) in `spec.extraArgs`, the last one winning as with pflag.
    pub fn flag(&self, flag: &str) -> Option<String> {
        let long = format!("--{flag}");
        let mut found = None;
        let mut args = self.extra_args.iter();
        while let Some(arg) = args.next() {
            if let Some(v) = arg.strip_prefix(&format!("{long}=")) {
                found = Some(v.to_string());
            } else if *arg == long {
                found = args.next().cloned();
            }
        }
        found
    }
}

/// An etcd StatefulSet: its members and how they are spread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdSet {
    pub namespace: String,
    pub name: String,
    /// `spec.serviceName`: the headless Service the members' names are under.
    pub service: String,
    pub replicas: i32,
    pub spread: Vec<Spread>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spread {
    pub topology_key: String,
    pub min_domains: Option<i32>,
    pub when_unsatisfiable: String,
}

impl EtcdSet {
    pub fn from_statefulset(s: &k8s_openapi::api::apps::v1::StatefulSet) -> Option<Self> {
        let spec = &s.spec;
        let spread = spec
            .template
            .spec
            .as_ref()
            .and_then(|p| p.topology_spread_constraints.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|c| Spread {
                topology_key: c.topology_key,
                min_domains: c.min_domains,
                when_unsatisfiable: c.when_unsatisfiable,
            })
            .collect();
        Some(Self {
            namespace: s.metadata.namespace.clone()?,
            name: s.metadata.name.clone()?,
            service: spec.service_name.clone().unwrap_or_default(),
            replicas: spec.replicas.unwrap_or(1),
            spread,
        })
    }
}

/// Everything the object rules read.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    pub components: Vec<Component>,
    pub etcds: Vec<EtcdSet>,
}

impl Layout {
    pub fn shards(&self) -> impl Iterator<Item = &Component> {
        self.components.iter().filter(|c| c.is_shard())
    }

    /// The public hostnames: every RootShard's and FrontProxy's `spec.external.hostname`.
    pub fn public_hostnames(&self) -> Vec<&str> {
        self.components.iter().filter_map(|c| c.external_hostname.as_deref()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_spec_is_read_into_the_fields_the_rules_need_and_the_oidc_client_secret_is_dropped() {
        let spec = json!({
            "image": {"repository": "ghcr.io/kcp-dev/kcp", "tag": "v0.32.3"},
            "proxy": {"image": {"repository": "ghcr.io/kcp-dev/kcp", "tag": "v0.32.3"}},
            "extraArgs": ["--feature-gates=CacheAPIs=true", "--shard-base-url", "https://x"],
            "external": {"hostname": "kcp.example.com", "port": 443},
            "auth": {"oidc": {"issuerURL": "https://idp", "clientID": "kcp", "clientSecret": "hunter2",
                              "usernameClaim": "email", "usernamePrefix": "railgrid:"}},
            "etcd": {"endpoints": ["http://etcd-root-0.etcd-root.kcp-system.svc.cluster.local:2379"]},
            "certificateTemplates": {"server": {"spec": {"dnsNames": ["root.kcp.example.com"],
                                                         "privateKey": {"algorithm": "ECDSA"}}}},
            "somethingNew": {"ignored": true},
        });
        let c = Component::parse(Kind::RootShard, "root", &spec).unwrap();
        assert_eq!(c.subject(), "rootshard/root");
        assert_eq!(c.image.tag.as_deref(), Some("v0.32.3"));
        assert_eq!(c.proxy_image.as_ref().and_then(|i| i.tag.as_deref()), Some("v0.32.3"));
        assert_eq!(c.flag("feature-gates").as_deref(), Some("CacheAPIs=true"));
        assert_eq!(c.flag("shard-base-url").as_deref(), Some("https://x"));
        assert_eq!(c.external_hostname.as_deref(), Some("kcp.example.com"));
        assert_eq!(c.oidc.as_ref().unwrap().username_prefix.as_deref(), Some("railgrid:"));
        assert!(!format!("{c:?}").contains("hunter2"), "{c:?}");
        assert_eq!(c.etcd_endpoints.len(), 1);
        assert_eq!(c.cluster_domain, "cluster.local");
        assert_eq!(c.server_names, ["root.kcp.example.com"]);
    }

    #[test]
    fn a_spec_of_the_wrong_shape_is_an_error_not_a_default() {
        assert!(Component::parse(Kind::Shard, "a", &json!({"image": "kcp:latest"})).is_err());
        assert!(Component::parse(Kind::Shard, "a", &json!({"extraArgs": "--x"})).is_err());
        let empty = Component::parse(Kind::Shard, "a", &serde_json::Value::Null).unwrap();
        assert_eq!(empty.image, Image::default());
    }
}
