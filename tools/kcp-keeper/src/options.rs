//! What the doctor is told: where the kcp objects are, where the hub's settings and credentials are, what it
//! may reach. Parsed from the command line into these types (a bad reference fails before anything is read).

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use crate::rules::expiry::Margins;

/// `namespace/name:key` of a Secret or ConfigMap key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRef {
    pub namespace: String,
    pub name: String,
    pub key: String,
}

impl KeyRef {
    /// `ns/name:key`, or `ns/name` with `default_key`.
    pub fn parse(text: &str, default_key: &str) -> Result<Self, String> {
        let (object, key) = text.split_once(':').map_or((text, default_key), |(o, k)| (o, k));
        let (namespace, name) =
            object.split_once('/').ok_or_else(|| format!("{text:?}: expected NAMESPACE/NAME[:KEY]"))?;
        let ok = |s: &str| {
            !s.is_empty() && s.len() <= 253 && s.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
        };
        if !ok(namespace) || !ok(name) || !ok(key) {
            return Err(format!("{text:?}: expected NAMESPACE/NAME[:KEY] of Kubernetes names"));
        }
        Ok(Self { namespace: namespace.into(), name: name.into(), key: key.into() })
    }
}

impl std::fmt::Display for KeyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.name, self.key)
    }
}

/// `namespace/name` of an object (a Deployment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    pub namespace: String,
    pub name: String,
}

impl FromStr for ObjectRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.contains(':') {
            return Err(format!("{s:?}: expected NAMESPACE/NAME"));
        }
        let r = KeyRef::parse(s, "-").map_err(|_| format!("{s:?}: expected NAMESPACE/NAME of Kubernetes names"))?;
        Ok(Self { namespace: r.namespace, name: r.name })
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Where a CA bundle (certificates only) is read from: a ConfigMap key, or a Secret key. A Secret is refused by
/// [`Options::check_no_secrets`] where the doctor must read none (the in-cluster doctor): RBAC cannot grant one
/// key of a Secret, and the Secrets that hold a CA's certificate usually hold its private key beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaSource {
    ConfigMap(KeyRef),
    Secret(KeyRef),
}

impl CaSource {
    /// `configmap:NS/NAME[:KEY]`, `secret:NS/NAME[:KEY]`, or `NS/NAME[:KEY]` (a Secret, as before ConfigMaps were
    /// accepted); `default_key` when no key is given.
    pub fn parse(text: &str, default_key: &str) -> Result<Self, String> {
        if let Some(r) = text.strip_prefix("configmap:") {
            Ok(Self::ConfigMap(KeyRef::parse(r, default_key)?))
        } else if let Some(r) = text.strip_prefix("secret:") {
            Ok(Self::Secret(KeyRef::parse(r, default_key)?))
        } else {
            KeyRef::parse(text, default_key)
                .map(Self::Secret)
                .map_err(|e| format!("{e} (or configmap:NAMESPACE/NAME[:KEY], secret:NAMESPACE/NAME[:KEY])"))
        }
    }
}

impl std::fmt::Display for CaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ConfigMap(r) => write!(f, "configmap {r}"),
            Self::Secret(r) => write!(f, "secret {r}"),
        }
    }
}

/// Where the hub's OIDC settings are read from: a YAML/JSON document with `issuerURL`, `clientID`,
/// `usernameClaim`, `usernamePrefix`, `groupsClaim`, `groupsPrefix` (other keys ignored, never read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HubOidc {
    File(std::path::PathBuf),
    ConfigMap(KeyRef),
}

impl FromStr for HubOidc {
    type Err = String;
    /// `configmap:NS/NAME[:KEY]` (key default `oidc.yaml`) or `file:PATH`.
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(r) = s.strip_prefix("configmap:") {
            Ok(Self::ConfigMap(KeyRef::parse(r, "oidc.yaml")?))
        } else if let Some(p) = s.strip_prefix("file:") {
            Ok(Self::File(p.into()))
        } else {
            Err(format!("{s:?}: expected configmap:NAMESPACE/NAME[:KEY] or file:PATH"))
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    /// The namespace of the RootShard, Shards and FrontProxy.
    pub namespace: String,
    pub hub_oidc: Option<HubOidc>,
    /// The hub's kubeconfig Secret key (e.g. `railgrid-system/railgrid-kcp:admin.kubeconfig`).
    pub hub_kubeconfig: Option<KeyRef>,
    /// ConfigMap or Secret keys holding CA certificates the agents manage (`ca.crt` by default).
    pub cas: Vec<CaSource>,
    /// etcd-snapshotter's metrics endpoints (`http://host:port/metrics`), each host read at every address it
    /// resolves to (a headless Service: every replica).
    pub snapshotter_metrics: Vec<String>,
    /// dns-rewriter's, likewise.
    pub rewriter_metrics: Vec<String>,
    /// kubeconfig-rotator's, likewise: the expiry of what each of its targets holds, without reading one.
    pub rotator_metrics: Vec<String>,
    /// ca-syncer's, likewise: the expiry of every certificate of each bundle, without reading a source.
    pub ca_syncer_metrics: Vec<String>,
    /// The kcp-operator's Deployment, whose image version must pair with kcp's.
    pub operator_deployment: Option<ObjectRef>,
    /// The infrastructure provider's Deployment, likewise.
    pub provider_deployment: Option<ObjectRef>,
    /// A kcp kubeconfig's Secret key: the APIExportEndpointSlices are listed in its server's workspace.
    pub kcp_kubeconfig: Option<KeyRef>,
    /// The CA bundle the slices' URLs must verify with (`ca.crt` by default); default: the kcp kubeconfig's CA.
    pub endpoint_ca: Option<CaSource>,
    /// The CA the Verify requests verify kcp's serving certificates with; default: the `tls.crt` of the first
    /// RootShard's `<name>-server-ca` Secret, unless `no_secrets`.
    pub server_ca: Option<CaSource>,
    /// Read no Secret at all (the in-cluster doctor, whose Roles grant none): a reference to one is refused at
    /// start ([`Options::check_no_secrets`]), and a check that would need one is reported "not checked".
    pub no_secrets: bool,
    /// Run the Verify section (requests from where the doctor runs: inside the cluster's network).
    pub verify: bool,
    /// The cluster DNS to ask; default `kube-system/kube-dns`'s ClusterIP on 53.
    pub cluster_dns: Option<SocketAddr>,
    /// node-local-dns addresses to ask as well (its link-local address, e.g. 169.254.20.10).
    pub node_local_dns: Vec<IpAddr>,
    /// Reach the Services' ready endpoints instead of their ClusterIPs (where ClusterIPs are not routed).
    pub via_endpoints: bool,
    /// The namespace whose kcp-keeper NetworkPolicies are checked for egress to any address on 443 and 6443.
    pub network_policies: Option<String>,
    /// The namespace of the kcp-keeper release whose pods are checked (`agent-pods`); none: not checked.
    pub release_namespace: Option<String>,
    /// The Helm release's name: its pods carry `app.kubernetes.io/instance=<release>`.
    pub release: String,
    pub margins: Margins,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            namespace: "kcp-system".into(),
            hub_oidc: None,
            hub_kubeconfig: None,
            cas: Vec::new(),
            snapshotter_metrics: Vec::new(),
            rewriter_metrics: Vec::new(),
            rotator_metrics: Vec::new(),
            ca_syncer_metrics: Vec::new(),
            operator_deployment: None,
            provider_deployment: None,
            kcp_kubeconfig: None,
            endpoint_ca: None,
            server_ca: None,
            no_secrets: false,
            verify: true,
            cluster_dns: None,
            node_local_dns: Vec::new(),
            via_endpoints: false,
            network_policies: None,
            release_namespace: None,
            release: crate::rules::agent_pods::DEFAULT_RELEASE.into(),
            margins: Margins::default(),
        }
    }
}

impl Options {
    /// With `no_secrets`, every reference to a Secret is an error naming its flag, why, and what replaces it.
    pub fn check_no_secrets(&self) -> Result<(), String> {
        if !self.no_secrets {
            return Ok(());
        }
        let mut refused = Vec::new();
        if let Some(r) = &self.hub_kubeconfig {
            refused.push(format!(
                "--hub-kubeconfig {r}: a kubeconfig Secret holds a client key; read the expiry from kubeconfig-rotator's \
                 metrics (--rotator-metrics)"
            ));
        }
        if let Some(r) = &self.kcp_kubeconfig {
            refused.push(format!(
                "--kcp-kubeconfig {r}: a kubeconfig Secret holds a credential; check the endpoint slices from your own \
                 machine (kcp-keeper doctor --kcp-kubeconfig, without --no-secrets)"
            ));
        }
        let secret = |s: &Option<CaSource>| matches!(s, Some(CaSource::Secret(_)));
        for (flag, source) in [("--endpoint-ca", &self.endpoint_ca), ("--server-ca", &self.server_ca)] {
            if secret(source) {
                refused.push(format!(
                    "{flag} {}: name a ConfigMap (configmap:NAMESPACE/NAME[:KEY], e.g. a ca-syncer target)",
                    source.as_ref().map(ToString::to_string).unwrap_or_default()
                ));
            }
        }
        for ca in self.cas.iter().filter(|c| matches!(c, CaSource::Secret(_))) {
            refused.push(format!(
                "--ca {ca}: name a ConfigMap (configmap:NAMESPACE/NAME[:KEY]) or read ca-syncer's metrics \
                 (--ca-syncer-metrics)"
            ));
        }
        if refused.is_empty() {
            Ok(())
        } else {
            Err(format!("--no-secrets: the doctor reads no Secret, and these name one: {}", refused.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_with_and_without_a_key_and_junk_is_refused() {
        let r = KeyRef::parse("railgrid-system/railgrid-kcp:admin.kubeconfig", "kubeconfig").unwrap();
        assert_eq!(
            (r.namespace.as_str(), r.name.as_str(), r.key.as_str()),
            ("railgrid-system", "railgrid-kcp", "admin.kubeconfig")
        );
        assert_eq!(KeyRef::parse("a/b", "ca.crt").unwrap().key, "ca.crt");
        for bad in ["ab", "/b", "a/", "a/b:", "a/b c", "a/../b/c"] {
            assert!(KeyRef::parse(bad, "k").is_err(), "{bad}");
        }
        assert_eq!("file:/x.yaml".parse::<HubOidc>().unwrap(), HubOidc::File("/x.yaml".into()));
        assert!(
            matches!("configmap:ns/hub".parse::<HubOidc>().unwrap(), HubOidc::ConfigMap(r) if r.key == "oidc.yaml")
        );
        assert!("ns/hub".parse::<HubOidc>().is_err());
        let d: ObjectRef = "kcp-operator/kcp-operator".parse().unwrap();
        assert_eq!((d.namespace.as_str(), d.name.as_str()), ("kcp-operator", "kcp-operator"));
        for bad in ["kcp-operator", "a/b:c", "a/b c", "/b"] {
            assert!(bad.parse::<ObjectRef>().is_err(), "{bad}");
        }
        let cm = CaSource::parse("configmap:apps/kcp-ca", "ca.crt").unwrap();
        assert!(matches!(&cm, CaSource::ConfigMap(r) if r.name == "kcp-ca" && r.key == "ca.crt"), "{cm:?}");
        assert!(
            matches!(CaSource::parse("apps/kcp-ca:tls.crt", "ca.crt").unwrap(), CaSource::Secret(r) if r.key == "tls.crt")
        );
        assert!(matches!(CaSource::parse("secret:apps/kcp-ca", "ca.crt").unwrap(), CaSource::Secret(_)));
        assert!(CaSource::parse("configmap:apps", "ca.crt").is_err());
    }

    #[test]
    fn without_secrets_every_secret_reference_is_refused_naming_its_flag_and_configmaps_and_metrics_are_not() {
        let key = |s: &str| KeyRef::parse(s, "kubeconfig").unwrap();
        let o = Options {
            no_secrets: true,
            hub_kubeconfig: Some(key("hub/admin")),
            kcp_kubeconfig: Some(key("kcp-system/kcp-admin")),
            cas: vec![
                CaSource::parse("configmap:apps/kcp-ca", "ca.crt").unwrap(),
                CaSource::parse("kcp-system/root-ca", "ca.crt").unwrap(),
            ],
            endpoint_ca: Some(CaSource::parse("providers/ca", "ca.crt").unwrap()),
            server_ca: Some(CaSource::parse("configmap:kcp-system/server-ca", "ca.crt").unwrap()),
            ..Options::default()
        };
        let e = o.check_no_secrets().unwrap_err();
        for flag in
            ["--hub-kubeconfig hub/admin", "--kcp-kubeconfig", "--ca secret kcp-system/root-ca", "--endpoint-ca"]
        {
            assert!(e.contains(flag), "{flag}: {e}");
        }
        assert!(!e.contains("apps/kcp-ca") && !e.contains("--server-ca"), "ConfigMaps are fine: {e}");
        let allowed = Options {
            no_secrets: true,
            cas: vec![CaSource::parse("configmap:apps/kcp-ca", "ca.crt").unwrap()],
            server_ca: o.server_ca.clone(),
            rotator_metrics: vec!["http://r/metrics".into()],
            ..Options::default()
        };
        assert_eq!(allowed.check_no_secrets(), Ok(()));
        assert_eq!(Options { no_secrets: false, ..o }.check_no_secrets(), Ok(()));
    }
}
