//! The agent's configuration file, read strictly: serde reads the raw form (unknown fields are errors), and
//! [`Config::from_raw`] turns it into the validated form the agent works with, or reports every error at once,
//! each with its field path. Parse, don't validate: past [`parse`], a host is a [`Hostname`], a mode an enum,
//! a resolver a socket address.
//!
//! No error repeats a value from the file: a reason says what is wrong and where, and serde's own messages
//! (which quote the offending value for a wrong type) are reduced to what was expected.
//!
//! ```yaml
//! mode: k3s                      # or corefile
//! k3s:                           # optional; these are the defaults
//!   namespace: kube-system
//!   name: coredns-custom
//!   key: kcp-split-horizon.override
//! corefile:                      # required when mode is corefile
//!   namespace: kube-system       # default
//!   name: coredns                # default
//!   key: Corefile                # default
//!   serverBlock: ".:53"          # default
//! clusterDomain: cluster.local   # default
//! rules:
//! - host: kcp-root.example.com
//!   service: {namespace: kcp-system, name: root-kcp}
//!   port: 6443                   # optional: the public URL's port, to warn when the Service lacks it
//! discovery:                     # optional
//!   namespace: kcp-system
//!   rootShards: true
//!   shards: true
//!   frontProxies: true
//! verify:                        # optional
//!   resolver: 10.43.0.10:53      # port defaults to 53
//!   timeout: 2s                  # default
//!   settle: 2m                   # default: after a write, how long until every name must answer
//! resyncInterval: 5m             # default
//! ```

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use kcp_keeper_runtime::config::{ConfigError, FieldError};
use kcp_keeper_runtime::duration::parse_go_duration;
use kcp_keeper_runtime::names;
use serde::Deserialize;

use crate::discovery::Kind;
use crate::hostname::{Domain, Hostname};
use crate::rules::ServiceRef;

pub const DEFAULT_K3S_NAMESPACE: &str = "kube-system";
pub const DEFAULT_K3S_NAME: &str = "coredns-custom";
pub const DEFAULT_K3S_KEY: &str = "kcp-split-horizon.override";
pub const DEFAULT_COREFILE_NAME: &str = "coredns";
pub const DEFAULT_COREFILE_KEY: &str = "Corefile";
pub const DEFAULT_SERVER_BLOCK: &str = ".:53";
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// The file as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawConfig {
    pub mode: String,
    #[serde(default)]
    pub k3s: Option<RawK3s>,
    #[serde(default)]
    pub corefile: Option<RawCorefile>,
    #[serde(default)]
    pub cluster_domain: Option<String>,
    #[serde(default)]
    pub rules: Vec<RawRule>,
    #[serde(default)]
    pub discovery: Option<RawDiscovery>,
    #[serde(default)]
    pub verify: Option<RawVerify>,
    #[serde(default)]
    pub resync_interval: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawK3s {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub key: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawCorefile {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub key: Option<String>,
    pub server_block: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawRule {
    pub host: String,
    pub service: RawServiceRef,
    #[serde(default)]
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawServiceRef {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawDiscovery {
    pub namespace: String,
    #[serde(default)]
    pub root_shards: bool,
    #[serde(default)]
    pub shards: bool,
    #[serde(default)]
    pub front_proxies: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawVerify {
    pub resolver: Option<String>,
    pub timeout: Option<String>,
    #[serde(default)]
    pub settle: Option<String>,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub target: Target,
    pub cluster_domain: Domain,
    pub rules: Vec<Rule>,
    pub discovery: Option<Discovery>,
    pub verify: Verify,
    pub resync_interval: Duration,
}

/// One key of one ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMapKey {
    pub namespace: String,
    pub name: String,
    pub key: String,
}

/// Where the rules go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A key of our own in k3s's `coredns-custom`, imported into the main server block.
    K3s(ConfigMapKey),
    /// A marked block inside `server_block` of a Corefile in a ConfigMap someone else owns.
    Corefile { key: ConfigMapKey, server_block: String },
}

impl Target {
    pub fn configmap(&self) -> &ConfigMapKey {
        match self {
            Target::K3s(key) | Target::Corefile { key, .. } => key,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub host: Hostname,
    pub service: ServiceRef,
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    pub namespace: String,
    pub kinds: Vec<Kind>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verify {
    pub resolver: Option<SocketAddr>,
    pub timeout: Duration,
    /// After a write, how long the names may take to answer: the kubelet's ConfigMap projection delay (its
    /// sync period plus cache TTL, about a minute by default) plus CoreDNS's reload interval (30s by default).
    pub settle: Duration,
}

/// The default of `verify.settle`: 60s of projection delay plus 30s of reload interval, rounded up.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(120);

impl Config {
    /// Every error at once, each with its field path.
    pub fn from_raw(raw: RawConfig) -> Result<Self, Vec<FieldError>> {
        let mut errors = Vec::new();
        let mut err = |path: &str, reason: &str| errors.push(FieldError::new(path, reason));

        let key_of = |errs: &mut dyn FnMut(&str, &str),
                      section: &str,
                      ns: Option<String>,
                      name: Option<String>,
                      key: Option<String>,
                      defaults: (&str, &str, &str)| {
            let ns = ns.unwrap_or_else(|| defaults.0.into());
            let name = name.unwrap_or_else(|| defaults.1.into());
            let key = key.unwrap_or_else(|| defaults.2.into());
            if let Err(r) = names::check_dns_label(&ns) {
                errs(&format!("{section}.namespace"), &r);
            }
            if let Err(r) = names::check_dns_subdomain(&name) {
                errs(&format!("{section}.name"), &r);
            }
            if let Err(r) = names::check_data_key(&key) {
                errs(&format!("{section}.key"), &r);
            }
            ConfigMapKey { namespace: ns, name, key }
        };

        let target = match raw.mode.as_str() {
            "k3s" => {
                if raw.corefile.is_some() {
                    err("corefile", "only allowed when mode is corefile");
                }
                let k3s = raw.k3s.unwrap_or(RawK3s { namespace: None, name: None, key: None });
                let key = key_of(
                    &mut err,
                    "k3s",
                    k3s.namespace,
                    k3s.name,
                    k3s.key,
                    (DEFAULT_K3S_NAMESPACE, DEFAULT_K3S_NAME, DEFAULT_K3S_KEY),
                );
                if !key.key.ends_with(".override") || key.key == ".override" {
                    err("k3s.key", "must end in .override: k3s imports only those keys into its main server block");
                }
                Some(Target::K3s(key))
            }
            "corefile" => {
                if raw.k3s.is_some() {
                    err("k3s", "only allowed when mode is k3s");
                }
                match raw.corefile {
                    None => {
                        err("corefile", "required when mode is corefile (it names the Corefile's ConfigMap)");
                        None
                    }
                    Some(c) => {
                        let key = key_of(
                            &mut err,
                            "corefile",
                            c.namespace,
                            c.name,
                            c.key,
                            (DEFAULT_K3S_NAMESPACE, DEFAULT_COREFILE_NAME, DEFAULT_COREFILE_KEY),
                        );
                        let server_block = c.server_block.unwrap_or_else(|| DEFAULT_SERVER_BLOCK.into());
                        if server_block.is_empty()
                            || server_block
                                .chars()
                                .any(|c| c.is_whitespace() || c == '{' || c == '}' || c == '#' || c == '"')
                        {
                            err("corefile.serverBlock", "must be one server block key such as .:53");
                        }
                        Some(Target::Corefile { key, server_block })
                    }
                }
            }
            _ => {
                err("mode", "must be k3s or corefile");
                None
            }
        };

        let cluster_domain = match Domain::parse(raw.cluster_domain.as_deref().unwrap_or(DEFAULT_CLUSTER_DOMAIN)) {
            Ok(d) => Some(d),
            Err(e) => {
                err("clusterDomain", &e.to_string());
                None
            }
        };

        let mut rules = Vec::new();
        let mut seen: BTreeMap<Hostname, usize> = BTreeMap::new();
        for (i, r) in raw.rules.into_iter().enumerate() {
            let host = match Hostname::parse(&r.host) {
                Ok(h) => Some(h),
                Err(e) => {
                    err(&format!("rules[{i}].host"), &e.to_string());
                    None
                }
            };
            if let (Some(host), Some(domain)) = (&host, &cluster_domain)
                && host.is_within(domain)
            {
                err(&format!("rules[{i}].host"), "lies inside the cluster domain, where the kubernetes plugin answers");
            }
            if let Some(host) = &host {
                if let Some(first) = seen.get(host) {
                    err(&format!("rules[{i}].host"), &format!("duplicates rules[{first}].host"));
                } else {
                    seen.insert(host.clone(), i);
                }
            }
            let service = match ServiceRef::parse(&r.service.namespace, &r.service.name) {
                Ok(s) => Some(s),
                Err((field, reason)) => {
                    err(&format!("rules[{i}].service.{field}"), &reason);
                    None
                }
            };
            if r.port == Some(0) {
                err(&format!("rules[{i}].port"), "must be between 1 and 65535");
            }
            if let (Some(host), Some(service)) = (host, service) {
                rules.push(Rule { host, service, port: r.port });
            }
        }

        let discovery = raw.discovery.map(|d| {
            if let Err(r) = names::check_dns_label(&d.namespace) {
                err("discovery.namespace", &r);
            }
            let kinds = crate::plan::wanted_kinds(d.root_shards, d.shards, d.front_proxies);
            if kinds.is_empty() {
                err("discovery", "enable at least one of rootShards, shards, frontProxies (or leave discovery out)");
            }
            Discovery { namespace: d.namespace, kinds }
        });

        let raw_verify = raw.verify.unwrap_or(RawVerify { resolver: None, timeout: None, settle: None });
        let resolver = raw_verify.resolver.as_deref().and_then(|text| match parse_resolver(text) {
            Some(addr) => Some(addr),
            None => {
                err("verify.resolver", "must be an IP address with an optional port, e.g. 10.43.0.10:53");
                None
            }
        });
        let timeout = duration(&mut err, "verify.timeout", raw_verify.timeout.as_deref(), Duration::from_secs(2));
        if timeout.is_zero() {
            err("verify.timeout", "must be more than 0");
        }
        let settle = duration(&mut err, "verify.settle", raw_verify.settle.as_deref(), DEFAULT_SETTLE);
        if settle.is_zero() {
            err("verify.settle", "must be more than 0");
        }
        let resync_interval =
            duration(&mut err, "resyncInterval", raw.resync_interval.as_deref(), Duration::from_secs(300));
        if resync_interval < Duration::from_secs(10) {
            err("resyncInterval", "must be at least 10s");
        }

        match (target, cluster_domain) {
            (Some(target), Some(cluster_domain)) if errors.is_empty() => Ok(Config {
                target,
                cluster_domain,
                rules,
                discovery,
                verify: Verify { resolver, timeout, settle },
                resync_interval,
            }),
            _ => Err(errors),
        }
    }
}

fn duration(err: &mut impl FnMut(&str, &str), path: &str, text: Option<&str>, default: Duration) -> Duration {
    match text.map(parse_go_duration) {
        None => default,
        Some(Ok(d)) => d,
        Some(Err(e)) => {
            err(path, &e.to_string());
            default
        }
    }
}

/// `10.43.0.10`, `10.43.0.10:53`, `[fd00::10]:53` or `fd00::10`.
pub fn parse_resolver(text: &str) -> Option<SocketAddr> {
    text.parse::<SocketAddr>().ok().or_else(|| text.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)))
}

/// Parses and validates configuration text. `file` is only used in error messages.
pub fn parse(file: &Path, text: &str) -> Result<Config, ConfigError> {
    let raw = parse_raw(file, text)?;
    Config::from_raw(raw).map_err(|errors| ConfigError::Invalid { file: file.into(), errors })
}

/// Reads the raw form; a schema error names the field and what was expected, never the value found.
pub fn parse_raw(file: &Path, text: &str) -> Result<RawConfig, ConfigError> {
    let deserializer = serde_yaml::Deserializer::from_str(text);
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        ConfigError::Parse {
            file: file.into(),
            path: if path == "." { "(top level)".into() } else { path },
            reason: without_value(&e.into_inner().to_string()),
        }
    })
}

/// Loads the file.
pub fn load(file: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read { file: file.into(), source })?;
    parse(file, &text)
}

/// serde's "invalid type: string \"x\", expected u16" quotes the value; keep what was expected only.
/// Unknown and missing field messages name keys, which are kept.
fn without_value(message: &str) -> String {
    let message = message.split(" at line ").next().unwrap_or(message);
    // serde_yaml may put the path in front; the path is reported separately.
    for kept in ["unknown field", "missing field"] {
        if let Some(at) = message.find(kept) {
            return message[at..].to_string();
        }
    }
    match message.split_once(", expected ") {
        Some((_, expected)) => format!("invalid value, expected {expected}"),
        None => "invalid value".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(text: &str) -> Result<Config, ConfigError> {
        parse(Path::new("c.yaml"), text)
    }

    fn err(text: &str) -> String {
        parse_text(text).unwrap_err().to_string()
    }

    #[test]
    fn the_example_configuration_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("example.yaml");
        let config = load(&path).unwrap();
        assert!(!config.rules.is_empty());
    }

    #[test]
    fn k3s_mode_defaults_to_its_own_key_in_coredns_custom() {
        let config = parse_text("mode: k3s\n").unwrap();
        assert_eq!(
            config.target,
            Target::K3s(ConfigMapKey {
                namespace: "kube-system".into(),
                name: "coredns-custom".into(),
                key: "kcp-split-horizon.override".into()
            })
        );
        assert_eq!(config.cluster_domain.as_str(), "cluster.local");
        assert_eq!(config.resync_interval, Duration::from_secs(300));
        assert_eq!(config.verify, Verify { resolver: None, timeout: Duration::from_secs(2), settle: DEFAULT_SETTLE });
    }

    #[test]
    fn corefile_mode_names_the_configmap_and_server_block() {
        let config = parse_text(
            "mode: corefile\ncorefile:\n  name: coredns\n  serverBlock: '.:5353'\nclusterDomain: k8s.internal\n",
        )
        .unwrap();
        let Target::Corefile { key, server_block } = config.target else { panic!() };
        assert_eq!(
            (key.namespace.as_str(), key.name.as_str(), key.key.as_str()),
            ("kube-system", "coredns", "Corefile")
        );
        assert_eq!(server_block, ".:5353");
        assert_eq!(config.cluster_domain.as_str(), "k8s.internal");
    }

    #[test]
    fn rules_discovery_and_resolver_are_parsed_into_their_types() {
        let config = parse_text(
            "mode: k3s\nrules:\n- host: kcp-root.example.com.\n  service: {namespace: kcp-system, name: root-kcp}\n  port: 443\n\
             discovery: {namespace: kcp-system, shards: true, frontProxies: true}\nverify: {resolver: 10.43.0.10, timeout: 500ms}\n",
        )
        .unwrap();
        assert_eq!(config.rules[0].host.as_str(), "kcp-root.example.com");
        assert_eq!(config.rules[0].port, Some(443));
        assert_eq!(config.discovery.unwrap().kinds, vec![Kind::Shard, Kind::FrontProxy]);
        assert_eq!(config.verify.resolver, Some("10.43.0.10:53".parse().unwrap()));
        assert_eq!(config.verify.timeout, Duration::from_millis(500));
    }

    #[test]
    fn every_semantic_error_is_reported_with_its_path() {
        let msg = err("mode: k3s\nk3s: {key: custom.server}\ncorefile: {}\nclusterDomain: Cluster.Local\nrules:\n\
                       - host: '*.example.com'\n  service: {namespace: kcp-system, name: root-kcp}\n\
                       - host: a.example.com\n  service: {namespace: Kcp, name: 0-root}\n  port: 0\n\
                       - host: a.example.com\n  service: {namespace: kcp-system, name: root-kcp}\n\
                       discovery: {namespace: kcp-system}\nverify: {resolver: 'dns.example.com', timeout: 5x}\nresyncInterval: 1s\n");
        assert_eq!(
            msg,
            "c.yaml: corefile: only allowed when mode is corefile; \
             k3s.key: must end in .override: k3s imports only those keys into its main server block; \
             clusterDomain: must be lowercase; \
             rules[0].host: must not be a wildcard; \
             rules[1].service.namespace: must be a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit; \
             rules[1].port: must be between 1 and 65535; \
             rules[2].host: duplicates rules[1].host; \
             discovery: enable at least one of rootShards, shards, frontProxies (or leave discovery out); \
             verify.resolver: must be an IP address with an optional port, e.g. 10.43.0.10:53; \
             verify.timeout: has an unknown unit (use ns, us, ms, s, m or h); \
             resyncInterval: must be at least 10s"
        );
    }

    #[test]
    fn a_host_inside_the_cluster_domain_is_refused() {
        let msg = err(
            "mode: k3s\nrules:\n- host: x.kcp-system.svc.cluster.local\n  service: {namespace: kcp-system, name: root-kcp}\n",
        );
        assert!(msg.contains("rules[0].host: lies inside the cluster domain"), "{msg}");
    }

    #[test]
    fn mode_is_k3s_or_corefile_and_corefile_needs_its_section() {
        assert_eq!(err("mode: kubeadm\n"), "c.yaml: mode: must be k3s or corefile");
        assert!(err("mode: corefile\n").contains("corefile: required when mode is corefile"));
        assert!(err("mode: corefile\nk3s: {}\ncorefile: {}\n").contains("k3s: only allowed when mode is k3s"));
        assert!(err("mode: corefile\ncorefile: {serverBlock: '.:53 {'}\n").contains("corefile.serverBlock"));
    }

    #[test]
    fn unknown_fields_are_errors_naming_their_path() {
        let msg = err("mode: k3s\nrules:\n- host: a.example.com\n  service: {namespace: a, name: b, nmae: c}\n");
        assert!(msg.starts_with("c.yaml: rules[0].service"), "{msg}");
        assert!(msg.ends_with("unknown field `nmae`, expected `namespace` or `name`"), "{msg}");
    }

    #[test]
    fn no_error_repeats_a_value_from_the_file() {
        let secretish = "sekrit-Value";
        for text in [
            format!("mode: {secretish}\n"),
            format!("mode: k3s\nrules:\n- host: {secretish}.example.com\n  service: {{namespace: a, name: b}}\n"),
            format!("mode: k3s\nrules:\n- host: a.example.com\n  service: {{namespace: {secretish}, name: b}}\n"),
            format!(
                "mode: k3s\nrules:\n- host: a.example.com\n  service: {{namespace: a, name: b}}\n  port: {secretish}\n"
            ),
            format!("mode: k3s\nverify: {{resolver: {secretish}}}\n"),
            format!("mode: k3s\nverify: {{timeout: {secretish}}}\n"),
            format!("mode: k3s\nclusterDomain: {secretish}\n"),
            format!("mode: k3s\nk3s: {{name: {secretish}}}\n"),
            format!("mode: [{secretish}]\n"),
        ] {
            let msg = err(&text);
            assert!(!msg.to_lowercase().contains("sekrit"), "{msg}");
        }
        let msg = err("mode: k3s\nrules:\n- host: a.example.com\n  service: {namespace: a, name: b}\n  port: many\n");
        assert_eq!(msg, "c.yaml: rules[0].port: invalid value, expected u16");
    }
}
