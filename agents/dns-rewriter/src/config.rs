//! The agent's configuration file, read strictly by the runtime's loader ([`kcp_keeper_runtime::config`]):
//! serde reads the raw form (unknown fields are errors), and [`Config::from_raw`] turns it into the validated
//! form the agent works with, or reports every error at once, each with its field path. A configured rule
//! that fails its checks is not an error of the file: it is left out ([`Config::rejected`]) and reported by
//! the plan as an error for that rule alone, at start and on reload alike. Parse, don't
//! validate: past `from_raw`, a host is a [`Hostname`], a mode an enum, a resolver a socket address.
//!
//! No error repeats a value from the file: a reason says what is wrong and where (the runtime's loader
//! reduces serde's own messages, which quote the offending value for a wrong type, to what was expected).
//! The doc comments of the raw types are the chart's `values.schema.json` descriptions.
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
//!   resolver: 10.43.0.10:53      # port defaults to 53; default: kube-system/kube-dns's ClusterIP
//!   timeout: 2s                  # default
//!   settle: 2m                   # default: after a write, how long until every name must answer
//! nodeLocalDns:                  # optional; these are the defaults
//!   enabled: true                # manage node-local-dns's Corefile when its ConfigMap exists
//!   namespace: kube-system
//!   name: node-local-dns
//!   key: Corefile
//! resyncInterval: 5m             # default
//! ```

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kcp_keeper_runtime::config::{AgentConfig, FieldError};
use kcp_keeper_runtime::field::{Checked, GoDuration, Parse};
use kcp_keeper_runtime::names;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::discovery::{Kind, wanted_kinds};
use crate::hostname::{Domain, Hostname, HostnameError};
use crate::rules::ServiceRef;

pub const DEFAULT_K3S_NAMESPACE: &str = "kube-system";
pub const DEFAULT_K3S_NAME: &str = "coredns-custom";
pub const DEFAULT_K3S_KEY: &str = "kcp-split-horizon.override";
pub const DEFAULT_COREFILE_NAME: &str = "coredns";
pub const DEFAULT_COREFILE_KEY: &str = "Corefile";
pub const DEFAULT_SERVER_BLOCK: &str = ".:53";
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";
/// NodeLocal DNSCache's ConfigMap as kubernetes/dns's `nodelocaldns.yaml` (and kubeadm's docs) name it.
pub const DEFAULT_NODE_LOCAL_NAME: &str = "node-local-dns";
/// The default of `verify.timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// The default of `verify.settle`: 60s of projection delay plus 30s of reload interval, rounded up.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(120);
/// The cluster DNS Service asked when `verify.resolver` is not set (namespace, name).
pub const CLUSTER_DNS_SERVICE: (&str, &str) = ("kube-system", "kube-dns");
/// The default of `resyncInterval`.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(300);
/// The shortest `resyncInterval` allowed.
pub const MIN_RESYNC: Duration = Duration::from_secs(10);

/// dns-rewriter's configuration (the agent checks it again, with field paths, at start).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawConfig {
    /// Where the rules go: `k3s` (a key of our own in k3s's `coredns-custom`, imported into the main server
    /// block) or `corefile` (a marked block inside one server block of a Corefile someone else owns).
    #[schemars(extend("enum" = ["k3s", "corefile"]))]
    pub mode: Checked<Mode>,
    /// k3s mode's ConfigMap key (defaults: `kube-system`, `coredns-custom`, `kcp-split-horizon.override`);
    /// not allowed in corefile mode.
    #[serde(default)]
    pub k3s: Option<RawK3s>,
    /// The Corefile's ConfigMap and server block; required in corefile mode, not allowed in k3s mode.
    #[serde(default)]
    pub corefile: Option<RawCorefile>,
    /// The cluster's DNS domain (default `cluster.local`); no public name may lie inside it.
    #[serde(default)]
    pub cluster_domain: Option<String>,
    /// Public names and the Service each answers with, written as configured. A rule that fails its checks
    /// (its name, its Service reference, its port, a name an earlier rule has) is an error for that rule alone:
    /// reported (log, Event, metric) and left out, the others written.
    #[serde(default)]
    pub rules: Vec<RawRule>,
    /// Rules found in the kcp-operator's objects in one namespace; a configured rule wins over a discovered one.
    #[serde(default)]
    pub discovery: Option<RawDiscovery>,
    /// Proof through DNS: the resolver asked for every name in each cycle.
    #[serde(default)]
    pub verify: Option<RawVerify>,
    /// NodeLocal DNSCache: when its ConfigMap exists, a marked server block in its Corefile forwards the rules'
    /// public names to the cluster DNS, so pods behind it get the rewritten answers too (on by default).
    #[serde(default)]
    pub node_local_dns: Option<RawNodeLocalDns>,
    /// How often a cycle runs without a change to wake it (a Go duration, default `5m`, at least `10s`).
    #[serde(default)]
    // schemars writes a `#[serde(default)]` field's default only for a type that is `Serialize`, which
    pub resync_interval: Option<Checked<GoDuration>>,
}

/// node-local-dns's Corefile, managed when its ConfigMap exists.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawNodeLocalDns {
    /// Manage node-local-dns's Corefile when its ConfigMap exists (default `true`); `false` never reads it.
    pub enabled: Option<bool>,
    /// The ConfigMap's namespace (default `kube-system`).
    pub namespace: Option<String>,
    /// The ConfigMap (default `node-local-dns`); never created.
    pub name: Option<String>,
    /// The key holding its Corefile (default `Corefile`).
    pub key: Option<String>,
}

/// One key of k3s's `coredns-custom`, written whole.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawK3s {
    /// The ConfigMap's namespace (default `kube-system`).
    pub namespace: Option<String>,
    /// The ConfigMap (default `coredns-custom`); it is never created, only written into.
    pub name: Option<String>,
    /// The key (default `kcp-split-horizon.override`); must end in `.override`, the keys k3s imports into its
    /// main server block.
    pub key: Option<String>,
}

/// The Corefile our marked block goes into.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawCorefile {
    /// The ConfigMap's namespace (default `kube-system`).
    pub namespace: Option<String>,
    /// The ConfigMap holding the Corefile (default `coredns`); never created.
    pub name: Option<String>,
    /// The key holding the Corefile (default `Corefile`); never created.
    pub key: Option<String>,
    /// The server block our block goes into, by its key (default `.:53`).
    pub server_block: Option<String>,
}

/// One public name and the Service it answers with.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawRule {
    /// The public name (no wildcard, not inside the cluster domain; unique among the rules).
    pub host: String,
    /// The Service whose ClusterIP the name answers with.
    pub service: RawServiceRef,
    /// The public URL's port, to warn when the Service does not expose it (DNS cannot change ports).
    #[serde(default)]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
}

/// A Service by namespace and name.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawServiceRef {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
}

/// Which of the kcp-operator's kinds to read public names from (at least one switched on).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawDiscovery {
    /// The namespace of the operator's objects and their Services.
    pub namespace: String,
    /// Read RootShards (their virtual-workspace URL and certificate DNS names).
    #[serde(default)]
    pub root_shards: bool,
    /// Read Shards (their virtual-workspace URL and certificate DNS names).
    #[serde(default)]
    pub shards: bool,
    /// Read FrontProxies (their external hostname).
    #[serde(default)]
    pub front_proxies: bool,
}

/// How the names are checked through DNS.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawVerify {
    /// The cluster DNS to ask: an IP address with an optional port (default 53). Without it the agent asks
    /// the cluster DNS Service, `kube-system/kube-dns`'s ClusterIP on port 53 (what kubeadm, k3s and most
    /// distributions name it).
    pub resolver: Option<Checked<Resolver>>,
    /// How long one query may take (a Go duration, default `2s`).
    pub timeout: Option<Checked<GoDuration>>,
    /// After a write, how long until every name must answer (a Go duration, default `2m`: the kubelet's
    /// projection delay plus CoreDNS's reload interval).
    #[serde(default)]
    // schemars writes a `#[serde(default)]` field's default only for a type that is `Serialize`, which
    pub settle: Option<Checked<GoDuration>>,
}

/// `mode` as read: where the rules go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    K3s,
    Corefile,
}

impl Parse for Mode {
    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "k3s" => Ok(Mode::K3s),
            "corefile" => Ok(Mode::Corefile),
            _ => Err("must be k3s or corefile".into()),
        }
    }
}

/// `verify.resolver` as read: an IP address with an optional port ([`parse_resolver`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolver(pub SocketAddr);

impl Parse for Resolver {
    fn parse(text: &str) -> Result<Self, String> {
        parse_resolver(text)
            .map(Resolver)
            .ok_or_else(|| "must be an IP address with an optional port, e.g. 10.43.0.10:53".into())
    }
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub target: Target,
    pub cluster_domain: Domain,
    /// The valid rules, in the file's order.
    pub rules: Vec<Rule>,
    /// The configured rules that failed their checks: each an error for that rule alone, reported by the plan.
    pub rejected: Vec<RejectedRule>,
    pub discovery: Option<Discovery>,
    pub verify: Verify,
    /// node-local-dns's Corefile key, when managed (`nodeLocalDns.enabled`, the default).
    pub node_local_dns: Option<ConfigMapKey>,
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

/// `rules[index]` of the file, left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedRule {
    pub index: usize,
    pub problem: RuleProblem,
}

/// Why a configured rule was left out. Like every error here, it never repeats a value from the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleProblem {
    /// `host` is not a name a rule may carry.
    Host(HostnameError),
    /// `host` lies inside the cluster domain.
    InClusterDomain,
    /// Another field (`service.namespace`, `service.name`, `port`), or `host` repeating an earlier rule's.
    Field { field: String, reason: String },
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

/// The runtime loads and reloads the file through this; the daemon gets a [`Config`].
impl AgentConfig for Config {
    type Raw = RawConfig;

    fn from_raw(raw: RawConfig) -> Result<Self, Vec<FieldError>> {
        Config::from_raw(raw)
    }
}

impl Config {
    /// Every error at once, each with its field path, in the order of the file's sections. A rule's own
    /// problems are not among them: they leave that rule out ([`Config::rejected`]), not the file.
    pub fn from_raw(raw: RawConfig) -> Result<Self, Vec<FieldError>> {
        let mut errors = Vec::new();
        let target = target(&mut errors, raw.mode, raw.k3s, raw.corefile);
        let cluster_domain = cluster_domain(&mut errors, raw.cluster_domain.as_deref());
        let (rules, rejected) = rules(raw.rules, cluster_domain.as_ref());
        let discovery = raw.discovery.map(|d| discovery(&mut errors, d));
        let verify = verify(&mut errors, raw.verify.unwrap_or_default());
        let node_local_dns = node_local_dns(&mut errors, raw.node_local_dns.unwrap_or_default());
        let min_resync = (MIN_RESYNC, "must be at least 10s");
        let resync_interval =
            duration_at_least(&mut errors, "resyncInterval", raw.resync_interval, DEFAULT_RESYNC, min_resync);
        match (target, cluster_domain) {
            (Some(target), Some(cluster_domain)) if errors.is_empty() => Ok(Config {
                target,
                cluster_domain,
                rules,
                rejected,
                discovery,
                verify,
                node_local_dns,
                resync_interval,
            }),
            _ => Err(errors),
        }
    }
}

/// `mode` with its section: `k3s` (optional) or `corefile` (required), never the other one.
fn target(
    errors: &mut Vec<FieldError>,
    mode: Checked<Mode>,
    k3s: Option<RawK3s>,
    corefile: Option<RawCorefile>,
) -> Option<Target> {
    match mode.value("mode", errors)? {
        Mode::K3s => {
            if corefile.is_some() {
                errors.push(FieldError::new("corefile", "only allowed when mode is corefile"));
            }
            Some(k3s_target(errors, k3s.unwrap_or_default()))
        }
        Mode::Corefile => {
            if k3s.is_some() {
                errors.push(FieldError::new("k3s", "only allowed when mode is k3s"));
            }
            let Some(corefile) = corefile else {
                errors.push(FieldError::new(
                    "corefile",
                    "required when mode is corefile (it names the Corefile's ConfigMap)",
                ));
                return None;
            };
            Some(corefile_target(errors, corefile))
        }
    }
}

fn k3s_target(errors: &mut Vec<FieldError>, k3s: RawK3s) -> Target {
    let defaults = (DEFAULT_K3S_NAMESPACE, DEFAULT_K3S_NAME, DEFAULT_K3S_KEY);
    let key = configmap_key(errors, "k3s", k3s.namespace, k3s.name, k3s.key, defaults);
    if !key.key.ends_with(".override") || key.key == ".override" {
        errors.push(FieldError::new(
            "k3s.key",
            "must end in .override: k3s imports only those keys into its main server block",
        ));
    }
    Target::K3s(key)
}

fn corefile_target(errors: &mut Vec<FieldError>, corefile: RawCorefile) -> Target {
    let defaults = (DEFAULT_K3S_NAMESPACE, DEFAULT_COREFILE_NAME, DEFAULT_COREFILE_KEY);
    let key = configmap_key(errors, "corefile", corefile.namespace, corefile.name, corefile.key, defaults);
    let server_block = corefile.server_block.unwrap_or_else(|| DEFAULT_SERVER_BLOCK.into());
    // One key as Corefiles write them: nothing that could open, close or comment out a block.
    let odd = |c: char| c.is_whitespace() || matches!(c, '{' | '}' | '#' | '"');
    if server_block.is_empty() || server_block.chars().any(odd) {
        errors.push(FieldError::new("corefile.serverBlock", "must be one server block key such as .:53"));
    }
    Target::Corefile { key, server_block }
}

/// A ConfigMap key from a section's optional fields and their defaults (namespace, name, key).
fn configmap_key(
    errors: &mut Vec<FieldError>,
    section: &str,
    namespace: Option<String>,
    name: Option<String>,
    key: Option<String>,
    defaults: (&str, &str, &str),
) -> ConfigMapKey {
    let namespace = namespace.unwrap_or_else(|| defaults.0.into());
    let name = name.unwrap_or_else(|| defaults.1.into());
    let key = key.unwrap_or_else(|| defaults.2.into());
    let checks = [
        ("namespace", names::check_dns_label(&namespace)),
        ("name", names::check_dns_subdomain(&name)),
        ("key", names::check_data_key(&key)),
    ];
    for (field, check) in checks {
        if let Err(reason) = check {
            errors.push(FieldError::new(format!("{section}.{field}"), reason));
        }
    }
    ConfigMapKey { namespace, name, key }
}

fn cluster_domain(errors: &mut Vec<FieldError>, text: Option<&str>) -> Option<Domain> {
    Domain::parse(text.unwrap_or(DEFAULT_CLUSTER_DOMAIN))
        .map_err(|e| errors.push(FieldError::new("clusterDomain", e.to_string())))
        .ok()
}

/// The rules that are valid, and the others with why: a rule that fails its checks is an error for that rule
/// alone (the plan reports it and writes the rest), never for the file. Without a valid cluster domain the
/// hosts are not checked against it (its own error is reported already, and that one is the file's).
fn rules(raw: Vec<RawRule>, domain: Option<&Domain>) -> (Vec<Rule>, Vec<RejectedRule>) {
    let mut rules = Vec::new();
    let mut rejected = Vec::new();
    let mut seen: BTreeMap<Hostname, usize> = BTreeMap::new();
    for (index, r) in raw.into_iter().enumerate() {
        let mut problems = Vec::new();
        let host = rule_host(&mut problems, &r.host, domain, &seen);
        let service = ServiceRef::parse(&r.service.namespace, &r.service.name)
            .map_err(|(field, reason)| problems.push(RuleProblem::Field { field: format!("service.{field}"), reason }))
            .ok();
        if r.port == Some(0) {
            problems.push(RuleProblem::Field { field: "port".into(), reason: "must be between 1 and 65535".into() });
        }
        match (host, service) {
            (Some(host), Some(service)) if problems.is_empty() => {
                seen.insert(host.clone(), index);
                rules.push(Rule { host, service, port: r.port });
            }
            _ => rejected.extend(problems.into_iter().map(|problem| RejectedRule { index, problem })),
        }
    }
    (rules, rejected)
}

/// `rules[i].host`: a valid name, outside the cluster domain, and the first rule for it (`seen` holds the
/// valid rules' names: a rule left out claims no name).
fn rule_host(
    problems: &mut Vec<RuleProblem>,
    text: &str,
    domain: Option<&Domain>,
    seen: &BTreeMap<Hostname, usize>,
) -> Option<Hostname> {
    let host = match Hostname::parse(text) {
        Ok(host) => host,
        Err(e) => {
            problems.push(RuleProblem::Host(e));
            return None;
        }
    };
    if domain.is_some_and(|d| host.is_within(d)) {
        problems.push(RuleProblem::InClusterDomain);
        return None;
    }
    match seen.get(&host) {
        Some(first) => {
            problems
                .push(RuleProblem::Field { field: "host".into(), reason: format!("duplicates rules[{first}].host") });
            None
        }
        None => Some(host),
    }
}

fn discovery(errors: &mut Vec<FieldError>, raw: RawDiscovery) -> Discovery {
    if let Err(reason) = names::check_dns_label(&raw.namespace) {
        errors.push(FieldError::new("discovery.namespace", reason));
    }
    let kinds = wanted_kinds(raw.root_shards, raw.shards, raw.front_proxies);
    if kinds.is_empty() {
        errors.push(FieldError::new(
            "discovery",
            "enable at least one of rootShards, shards, frontProxies (or leave discovery out)",
        ));
    }
    Discovery { namespace: raw.namespace, kinds }
}

fn verify(errors: &mut Vec<FieldError>, raw: RawVerify) -> Verify {
    let resolver = raw.resolver.and_then(|r| r.value("verify.resolver", errors)).map(|r| r.0);
    let more_than_0 = (Duration::from_nanos(1), "must be more than 0");
    let timeout = duration_at_least(errors, "verify.timeout", raw.timeout, DEFAULT_TIMEOUT, more_than_0);
    let settle = duration_at_least(errors, "verify.settle", raw.settle, DEFAULT_SETTLE, more_than_0);
    Verify { resolver, timeout, settle }
}

fn node_local_dns(errors: &mut Vec<FieldError>, raw: RawNodeLocalDns) -> Option<ConfigMapKey> {
    let defaults = (DEFAULT_K3S_NAMESPACE, DEFAULT_NODE_LOCAL_NAME, DEFAULT_COREFILE_KEY);
    let key = configmap_key(errors, "nodeLocalDns", raw.namespace, raw.name, raw.key, defaults);
    raw.enabled.unwrap_or(true).then_some(key)
}

/// The field's duration: `default` when it is absent, and `default` after an error at `path` with the parser's
/// reason when its text is not a duration; shorter than `min`, an error at `path` with `reason` too.
fn duration_at_least(
    errors: &mut Vec<FieldError>,
    path: &str,
    field: Option<Checked<GoDuration>>,
    default: Duration,
    (min, reason): (Duration, &str),
) -> Duration {
    let d = field.and_then(|f| f.value(path, errors)).map_or(default, |GoDuration(d)| d);
    if d < min {
        errors.push(FieldError::new(path, reason));
    }
    d
}

/// `10.43.0.10`, `10.43.0.10:53`, `[fd00::10]:53` or `fd00::10`.
pub fn parse_resolver(text: &str) -> Option<SocketAddr> {
    text.parse::<SocketAddr>().ok().or_else(|| text.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use kcp_keeper_runtime::config::{ConfigError, load, parse};

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
        let config: Config = load(&path).unwrap();
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
        let node_local =
            ConfigMapKey { namespace: "kube-system".into(), name: "node-local-dns".into(), key: "Corefile".into() };
        assert_eq!(config.node_local_dns, Some(node_local), "NodeLocal DNSCache is looked for by default");
    }

    #[test]
    fn node_local_dns_can_be_renamed_or_switched_off_and_a_bad_name_is_a_field_error() {
        let off = parse_text("mode: k3s\nnodeLocalDns: {enabled: false}\n").unwrap();
        assert_eq!(off.node_local_dns, None);
        let renamed = parse_text("mode: k3s\nnodeLocalDns: {namespace: dns, name: nodelocal}\n").unwrap();
        let key = renamed.node_local_dns.unwrap();
        assert_eq!((key.namespace.as_str(), key.name.as_str(), key.key.as_str()), ("dns", "nodelocal", "Corefile"));
        assert!(err("mode: k3s\nnodeLocalDns: {name: Not_A_Name}\n").contains("nodeLocalDns.name"));
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
    fn every_semantic_error_of_the_file_is_reported_with_its_path() {
        let msg = err("mode: k3s\nk3s: {key: custom.server}\ncorefile: {}\nclusterDomain: Cluster.Local\nrules:\n\
                       - host: '*.example.com'\n  service: {namespace: kcp-system, name: root-kcp}\n\
                       discovery: {namespace: kcp-system}\nverify: {resolver: 'dns.example.com', timeout: 5x}\nresyncInterval: 1s\n");
        assert_eq!(
            msg,
            "c.yaml: corefile: only allowed when mode is corefile; \
             k3s.key: must end in .override: k3s imports only those keys into its main server block; \
             clusterDomain: must be lowercase; \
             discovery: enable at least one of rootShards, shards, frontProxies (or leave discovery out); \
             verify.resolver: must be an IP address with an optional port, e.g. 10.43.0.10:53; \
             verify.timeout: has an unknown unit (use ns, us, ms, s, m or h); \
             resyncInterval: must be at least 10s"
        );
    }

    #[test]
    fn a_rule_failing_its_checks_is_left_out_with_why_and_the_file_loads() {
        let config = parse_text(
            "mode: k3s\nrules:\n\
             - host: '*.example.com'\n  service: {namespace: kcp-system, name: root-kcp}\n\
             - host: a.example.com\n  service: {namespace: Kcp, name: 0-root}\n  port: 0\n\
             - host: a.example.com\n  service: {namespace: kcp-system, name: root-kcp}\n\
             - host: a.example.com\n  service: {namespace: kcp-system, name: alpha}\n\
             - host: x.kcp-system.svc.cluster.local\n  service: {namespace: kcp-system, name: root-kcp}\n",
        )
        .unwrap();
        assert_eq!(config.rules.len(), 1, "only rules[2] is valid: {:?}", config.rules);
        assert_eq!((config.rules[0].host.as_str(), config.rules[0].service.name()), ("a.example.com", "root-kcp"));
        let field = |field: &str, reason: &str| RuleProblem::Field { field: field.into(), reason: reason.into() };
        let label =
            "must be a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit";
        let rejected: Vec<(usize, RuleProblem)> = config.rejected.into_iter().map(|r| (r.index, r.problem)).collect();
        assert_eq!(
            rejected,
            vec![
                (0, RuleProblem::Host(HostnameError::Wildcard)),
                (1, field("service.namespace", label)),
                (1, field("port", "must be between 1 and 65535")),
                (3, field("host", "duplicates rules[2].host")),
                (4, RuleProblem::InClusterDomain),
            ]
        );
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
        // The runtime's loader keeps serde_yaml's position of the field (a position, never a value).
        assert!(msg.ends_with("unknown field `nmae`, expected `namespace` or `name` at line 4 column 36"), "{msg}");
    }

    #[test]
    fn no_error_repeats_a_value_from_the_file() {
        let secretish = "sekrit-Value";
        for text in [
            format!("mode: {secretish}\n"),
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
        for text in [
            format!("mode: k3s\nrules:\n- host: {secretish}.example.com\n  service: {{namespace: a, name: b}}\n"),
            format!("mode: k3s\nrules:\n- host: a.example.com\n  service: {{namespace: {secretish}, name: b}}\n"),
        ] {
            let config = parse_text(&text).unwrap();
            let errors = crate::plan::rejected_errors(&config.rejected);
            assert_eq!(errors.len(), 1, "{text}");
            assert!(!errors[0].to_string().to_lowercase().contains("sekrit"), "{}", errors[0]);
        }
        let msg = err("mode: k3s\nrules:\n- host: a.example.com\n  service: {namespace: a, name: b}\n  port: many\n");
        assert_eq!(msg, "c.yaml: rules[0].port: expected u16, found string at line 5 column 9");
    }
}
