//! The configuration file (YAML): raw serde types with unknown fields refused, turned into the validated
//! [`Config`] with every semantic error reported at once with its field path. The raw types' doc comments are
//! the descriptions in the chart's values schema (generated from them), so they speak to whoever writes the file.
//!
//! ```yaml
//! resyncInterval: 30s
//! kubeconfigs:
//! - name: hub-admin
//!   source:                       # exactly one of kubeconfig, secret, certificateSecret
//!     kubeconfig: {namespace: kcp-system, name: hub-admin, renderedSecret: hub-admin-kubeconfig,
//!                  serverCA: {namespace: kcp-system, name: root-server-ca, key: tls.crt}}
//!   renewBefore: 720h             # force a renewal (the cmctl way) when less than this is left
//!   server: https://front-proxy.kcp-system.svc:6443   # optional: publish (and prove) with this server
//!   targets:
//!   - {namespace: railgrid-system, name: railgrid-kcp, key: admin.kubeconfig, restartDeployments: [railgrid-hub]}
//! ```

use std::collections::BTreeSet;
use std::time::Duration;

use kcp_keeper_runtime::config::{AgentConfig, FieldError};
use kcp_keeper_runtime::field::{Checked, GoDuration};
use kcp_keeper_runtime::label_selector::{NamespaceSelector, Selector};
use kcp_keeper_runtime::names;
use schemars::JsonSchema;
use serde::Deserialize;

pub const DEFAULT_RESYNC: Duration = Duration::from_secs(60);
/// The key the kcp-operator renders, and the default target key.
pub const KUBECONFIG_KEY: &str = "kubeconfig";
/// The annotation naming the kubeconfig a target Secret was written for ([`crate::target`]): with kcp-keeper's
/// label, what makes a selector target's copy one the agent may withdraw ([`crate::scope`]).
pub const KUBECONFIG_ANNOTATION: &str = "kcp-keeper.io/kubeconfig";

// ---- validated ----------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub resync_interval: Duration,
    pub kubeconfigs: Vec<Kubeconfig>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kubeconfig {
    /// A DNS label, unique: names the kubeconfig in logs, Events, metrics and `rotate NAME`.
    pub name: String,
    pub source: Source,
    /// Who a candidate must prove to be. `None` only for a `kubeconfig` source: then the Kubeconfig's spec says
    /// (username; groups plus `kubeconfig:<name>`, as the operator puts them into the certificate).
    pub expect: Option<Identity>,
    /// Force a renewal when less than this is left and none is under way; `None`: a quarter of the lifetime.
    pub renew_before: Option<Duration>,
    /// Scheme, host and port every cluster's server is rewritten to (the path, e.g. `/clusters/root`, is kept).
    pub server: Option<String>,
    /// Keep every previous server CA a target holds that is still valid beside the candidate's ([`crate::overlap`]).
    pub ca_overlap: bool,
    /// Rights a candidate must hold, each proven with a SelfSubjectAccessReview ([`crate::prove`]).
    pub rights: Vec<Right>,
    pub targets: Vec<TargetSpec>,
}

/// A right a credential must hold: `verb` on `group`/`resource` in a kcp workspace, optionally in one namespace
/// and on one object by name (a right granted by a RoleBinding, or by a Role with `resourceNames`, holds only
/// there).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Right {
    /// The verb (get, list, create, ...).
    pub verb: String,
    /// The resource (configmaps, workspaces, ...), optionally with a subresource (deployments/scale).
    pub resource: String,
    /// The API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// The kcp workspace path (root, root:org:team): asked at <server>/clusters/<workspace>. Absent: at the
    /// server the kubeconfig names, as it is.
    #[serde(default)]
    pub workspace: Option<String>,
    /// The namespace the right must hold in (a DNS label). Absent: across all namespaces (or for a
    /// cluster-scoped resource), which a RoleBinding in one namespace does not grant.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The one object, by name, the right must hold on. Absent: on every object of the resource, which a Role
    /// with resourceNames does not grant.
    #[serde(default)]
    pub name: Option<String>,
}

impl std::fmt::Display for Right {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let resource =
            if self.group.is_empty() { self.resource.clone() } else { format!("{}.{}", self.resource, self.group) };
        write!(f, "{} {resource}", self.verb)?;
        if let Some(name) = &self.name {
            write!(f, " named {name}")?;
        }
        if let Some(ns) = &self.namespace {
            write!(f, " in namespace {ns}")?;
        }
        match &self.workspace {
            Some(ws) => write!(f, " in workspace {ws}"),
            None => write!(f, " at the kubeconfig's server"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A kcp-operator `Kubeconfig`: its Certificate `kubeconfig-cert-<name>`, the certificate Secret of the same
    /// name, and the Secret it renders (`renderedSecret`, which must be its `spec.secretRef.name`). With
    /// `server_ca` (the current server CA, `tls.crt` of `<rootshard>-server-ca`), a render whose CA data lacks it
    /// is stale too.
    Operator { namespace: String, name: String, rendered_secret: String, server_ca: Option<KeyRef> },
    /// Any Secret holding a kubeconfig under `key`.
    Secret(KeyRef),
    /// A cert-manager certificate Secret (`tls.crt`, `tls.key`); the agent builds the kubeconfig itself.
    CertificateSecret { namespace: String, name: String, server: String, ca: KeyRef },
}

impl Source {
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Operator { .. } => "kubeconfig",
            Source::Secret(_) => "secret",
            Source::CertificateSecret { .. } => "certificateSecret",
        }
    }
}

/// A key of a Secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KeyRef {
    /// The Secret's namespace (a DNS label).
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
    /// The key in the Secret's data.
    pub key: String,
}

/// Who a candidate must prove to be, as a SelfSubjectReview with it reports.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Identity {
    /// The username the server must report; not empty.
    pub username: String,
    /// Groups the server must report (it may report more, e.g. system:authenticated).
    #[serde(default)]
    pub groups: Vec<String>,
}

/// A configured target: a Secret by name in one namespace, or in every namespace a selector selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSpec {
    pub placement: Placement,
    /// What it is in each namespace it is placed in (its `namespace` is the named one, or empty for a selector).
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Namespace(String),
    /// Every namespace the selector selects (and is not being deleted), found by a watch of Namespaces, that
    /// `allowed` names: a label anyone who may patch a namespace can set, so the label alone never decides where
    /// an admin kubeconfig goes. A copy in a namespace that is not both selected and allowed is deleted.
    Selector {
        selector: Selector,
        allowed: BTreeSet<String>,
    },
}

impl TargetSpec {
    /// The target in namespace `namespace`.
    pub fn at(&self, namespace: &str) -> Target {
        Target { namespace: namespace.to_string(), ..self.target.clone() }
    }
}

/// One target Secret in one namespace: what a pass reads, writes and restarts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub namespace: String,
    pub name: String,
    pub key: String,
    /// Also write `tls.crt`, `tls.key` and `ca.crt`, for consumers that reload files.
    pub split_keys: bool,
    /// Take over a Secret (or key) kcp-keeper did not create.
    pub adopt: bool,
    /// Workloads in the target's namespace that read the kubeconfig once at start: restarted on a real change.
    pub consumers: Vec<Consumer>,
    /// When consumers may be restarted; `None`: at once.
    pub restart_window: Option<RestartWindow>,
}

// Consumers and restart windows are the runtime's, shared with ca-syncer.
pub use kcp_keeper_runtime::consumer_restart::{
    Consumer, DEFAULT_MARGIN as DEFAULT_RESTART_MARGIN, Kind as ConsumerKind, RawRestartWindow, RestartWindow,
};

/// The Certificate and certificate Secret the kcp-operator creates for a Kubeconfig.
pub fn certificate_name(kubeconfig: &str) -> String {
    format!("kubeconfig-cert-{kubeconfig}")
}

impl Config {
    pub fn find(&self, name: &str) -> Option<&Kubeconfig> {
        self.kubeconfigs.iter().find(|k| k.name == name)
    }
}

// ---- raw ----------------------------------------------------------------------------------------------------

/// kubeconfig-rotator's configuration (the agent checks it again, with field paths, at start)
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawConfig {
    /// How often every kubeconfig is looked at (a duration such as 60s; at least 1s; default 60s).
    #[serde(default)]
    resync_interval: Option<Checked<GoDuration>>,
    /// The kubeconfigs to keep fresh.
    kubeconfigs: Vec<RawKubeconfig>,
}

/// One kubeconfig: where it comes from, who it must prove to be, and the Secrets it is published to.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawKubeconfig {
    /// A DNS label of at most 40 characters, unique: names the kubeconfig in logs, Events, metrics and
    /// `rotate NAME`.
    name: String,
    /// exactly one of kubeconfig, secret, certificateSecret
    source: RawSource,
    /// Who a candidate must prove to be. Optional for a kubeconfig source (then the Kubeconfig's username, and
    /// its groups plus kubeconfig:<name>); required for secret and certificateSecret.
    #[serde(default)]
    expect: Option<Identity>,
    /// kubeconfig source only: force a renewal (Issuing=True, the cmctl way) when less than this is left and
    /// none is under way. Default: the Certificate's spec.renewBefore, else a quarter of the lifetime.
    #[serde(default)]
    renew_before: Option<Checked<GoDuration>>,
    /// Rewrite every cluster's scheme, host and port to this one (https://host:port, no path: paths such as
    /// /clusters/root are kept); the candidate is proven with it.
    #[serde(default)]
    server: Option<String>,
    /// When the candidate's server CA differs from the one a target holds, keep the target's previous CAs that are
    /// still valid in the published CA data beside the new one, until each expires (default true).
    #[serde(default, rename = "caOverlap")]
    ca_overlap: Option<bool>,
    /// Proof beyond the identity.
    #[serde(default)]
    verify: Option<RawVerify>,
    /// At least one; a Secret is the target of one kubeconfig only.
    targets: Vec<RawTarget>,
}

// "Exactly one of these keys": optional fields, so a mistake names the field path rather than a YAML tag.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSource {
    /// A kcp-operator Kubeconfig: its Certificate and certificate Secret kubeconfig-cert-<name>, and the Secret
    /// it renders.
    kubeconfig: Option<RawOperatorSource>,
    /// Any Secret holding a kubeconfig under key.
    secret: Option<KeyRef>,
    /// A cert-manager certificate Secret (tls.crt, tls.key): the agent builds the kubeconfig itself.
    certificate_secret: Option<RawCertificateSecret>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawOperatorSource {
    /// The Kubeconfig's namespace (a DNS label).
    namespace: String,
    /// The Kubeconfig's name.
    name: String,
    /// The Secret the operator renders: must be the Kubeconfig's spec.secretRef.name (checked).
    rendered_secret: String,
    /// The current server CA (e.g. tls.crt of <rootshard>-server-ca): a render whose CA data lacks it is stale
    /// too (a server-CA rotation).
    #[serde(default, rename = "serverCA")]
    server_ca: Option<KeyRef>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawCertificateSecret {
    /// The certificate Secret's namespace (a DNS label).
    namespace: String,
    /// The certificate Secret's name.
    name: String,
    /// The https:// URL the built kubeconfig points at; a path may name a workspace (/clusters/root).
    server: String,
    /// The CA the server's certificate is verified with.
    ca: KeyRef,
}

/// A target Secret: by name, in exactly one of namespace, namespaceSelector.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawTarget {
    /// The target Secret's namespace (a DNS label).
    #[serde(default)]
    namespace: Option<String>,
    /// Write the Secret in every namespace this selector selects (matchLabels, matchExpressions) that
    /// allowedNamespaces names: a namespace labelled later gets it; from one no longer selected, or no longer
    /// allowed, the copy is deleted (with an Event).
    #[serde(default)]
    namespace_selector: Option<NamespaceSelector>,
    /// Required with namespaceSelector: the namespaces, by name, the selector may place the Secret in (at least
    /// one). Whoever may patch a namespace may set any label on it, so a label alone never decides who receives
    /// an admin kubeconfig; the Roles that let the agent write the Secret exist only in these namespaces.
    #[serde(default)]
    allowed_namespaces: Option<Vec<String>>,
    /// The target Secret's name.
    name: String,
    /// The key the kubeconfig is written under (default: kubeconfig).
    #[serde(default)]
    key: Option<String>,
    /// Also write tls.crt, tls.key and ca.crt, for consumers that reload files.
    #[serde(default)]
    split_keys: bool,
    /// Take over a Secret (or key) kcp-keeper did not create.
    #[serde(default)]
    adopt: bool,
    /// Deployments in the target's namespace that read the kubeconfig once at start: restarted once per real
    /// change.
    #[serde(default)]
    restart_deployments: Vec<String>,
    /// StatefulSets in the target's namespace that read the kubeconfig once at start: restarted once per real
    /// change.
    #[serde(default)]
    restart_stateful_sets: Vec<String>,
    /// DaemonSets in the target's namespace that read the kubeconfig once at start: restarted once per real
    /// change.
    #[serde(default)]
    restart_daemon_sets: Vec<String>,
    /// Restart the consumers only inside this window (default: at once), but never later than the notAfter of
    /// the credential they hold minus the margin.
    #[serde(default)]
    restart_window: Option<RawRestartWindow>,
}

/// What a candidate must prove besides who it is.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawVerify {
    /// Rights the candidate must hold, each asked with a SelfSubjectAccessReview sent with the candidate at the
    /// URL it will be published with; a candidate missing one is refused (missing_right), naming it.
    #[serde(default)]
    rights: Vec<Right>,
}

impl AgentConfig for Config {
    type Raw = RawConfig;

    fn from_raw(raw: RawConfig) -> Result<Self, Vec<FieldError>> {
        let mut errors = Vec::new();
        let mut seen = Seen::default();
        let mut kubeconfigs = Vec::new();
        for (i, k) in raw.kubeconfigs.into_iter().enumerate() {
            let at = format!("kubeconfigs[{i}]");
            let mut err = |field: &str, reason: String| errors.push(FieldError::new(format!("{at}.{field}"), reason));
            kubeconfigs.extend(kubeconfig(k, &mut seen, &mut err));
        }
        let resync_interval = resync_interval(raw.resync_interval, &mut errors);
        if errors.is_empty() { Ok(Config { resync_interval, kubeconfigs }) } else { Err(errors) }
    }
}

/// What the kubeconfigs checked so far use, which a later one may not use again.
#[derive(Default)]
struct Seen {
    names: BTreeSet<String>,
    /// Every target Secret: its namespace (`None` for a selector, which may select any) and name.
    targets: BTreeSet<(Option<String>, String)>,
}

/// `resyncInterval`: a Go duration of at least 1s; [`DEFAULT_RESYNC`] when absent (or when it is not one).
fn resync_interval(field: Option<Checked<GoDuration>>, errors: &mut Vec<FieldError>) -> Duration {
    let resync_interval = field.and_then(|f| f.value("resyncInterval", errors)).map_or(DEFAULT_RESYNC, |d| d.0);
    if resync_interval < Duration::from_secs(1) {
        errors.push(FieldError::new("resyncInterval", "must be at least 1s"));
    }
    resync_interval
}

/// One kubeconfig, its errors reported through `err` with paths relative to it; `None` when its source is not
/// one (every other field is checked all the same).
fn kubeconfig(k: RawKubeconfig, seen: &mut Seen, err: &mut impl FnMut(&str, String)) -> Option<Kubeconfig> {
    check_name(&k.name, &mut seen.names, err);
    let source = source(k.source, err);
    if let Some(source) = &source {
        if k.expect.is_none() && !matches!(source, Source::Operator { .. }) {
            err("expect", "required for this source: the username (and groups) a candidate must prove".into());
        }
        if k.renew_before.is_some() && !matches!(source, Source::Operator { .. }) {
            err("renewBefore", "only a kubeconfig source can be renewed by the agent".into());
        }
    }
    let renew_before = relay(err, |errors| k.renew_before.and_then(|d| d.value("renewBefore", errors)));
    if let Some(expect) = &k.expect
        && expect.username.is_empty()
    {
        err("expect.username", "must not be empty".into());
    }
    if let Some(server) = &k.server
        && let Err(e) = check_server(server, false)
    {
        err("server", e);
    }
    let rights = k.verify.map(|v| v.rights).unwrap_or_default();
    check_rights(&rights, err);
    if k.targets.is_empty() {
        err("targets", "at least one target is needed".into());
    }
    let mut targets = Vec::new();
    for (j, t) in k.targets.into_iter().enumerate() {
        targets.extend(target_spec(&format!("targets[{j}]"), t, &mut seen.targets, err));
    }
    let source = source?;
    Some(Kubeconfig {
        name: k.name,
        source,
        expect: k.expect,
        renew_before: renew_before.map(|d| d.0),
        server: k.server.map(|s| s.trim_end_matches('/').to_string()),
        ca_overlap: k.ca_overlap.unwrap_or(true),
        rights,
        targets,
    })
}

/// A kubeconfig's name: a DNS label, kept short (it is part of a Deployment annotation key, 63 characters at
/// most), used by no other kubeconfig.
fn check_name(name: &str, names: &mut BTreeSet<String>, err: &mut impl FnMut(&str, String)) {
    if let Err(e) = names::check_dns_label(name) {
        err("name", e);
    } else if name.len() > 40 {
        err("name", "must be at most 40 characters".into());
    } else if !names.insert(name.to_string()) {
        err("name", "is used by another kubeconfig".into());
    }
}

/// Exactly one of the source's keys, checked.
fn source(raw: RawSource, err: &mut impl FnMut(&str, String)) -> Option<Source> {
    match (raw.kubeconfig, raw.secret, raw.certificate_secret) {
        (Some(o), None, None) => {
            check_object(err, "source.kubeconfig", &o.namespace, &o.name);
            if let Err(e) = names::check_dns_subdomain(&o.rendered_secret) {
                err("source.kubeconfig.renderedSecret", e);
            }
            if let Some(ca) = &o.server_ca {
                check_key_ref(err, "source.kubeconfig.serverCA", ca);
            }
            Some(Source::Operator {
                namespace: o.namespace,
                name: o.name,
                rendered_secret: o.rendered_secret,
                server_ca: o.server_ca,
            })
        }
        (None, Some(s), None) => {
            check_key_ref(err, "source.secret", &s);
            Some(Source::Secret(s))
        }
        (None, None, Some(c)) => {
            check_object(err, "source.certificateSecret", &c.namespace, &c.name);
            if let Err(e) = check_server(&c.server, true) {
                err("source.certificateSecret.server", e);
            }
            check_key_ref(err, "source.certificateSecret.ca", &c.ca);
            Some(Source::CertificateSecret { namespace: c.namespace, name: c.name, server: c.server, ca: c.ca })
        }
        _ => {
            err("source", "set exactly one of kubeconfig, secret, certificateSecret".into());
            None
        }
    }
}

/// `verify.rights`: each a verb and a resource, an API group, a workspace path, a namespace and an object name as
/// Kubernetes and kcp spell them.
fn check_rights(rights: &[Right], err: &mut impl FnMut(&str, String)) {
    for (r, right) in rights.iter().enumerate() {
        let field = |f: &str| format!("verify.rights[{r}].{f}");
        for (name, value) in [("verb", &right.verb), ("resource", &right.resource)] {
            if value.is_empty() || !value.chars().all(|c| c.is_ascii_alphanumeric() || "-_./*".contains(c)) {
                err(&field(name), "must be a non-empty Kubernetes name".into());
            }
        }
        if !right.group.chars().all(|c| c.is_ascii_alphanumeric() || "-.*".contains(c)) {
            err(&field("group"), "must be an API group name".into());
        }
        if let Some(ws) = &right.workspace
            && (ws.is_empty() || !ws.split(':').all(|p| names::check_dns_label(p).is_ok()))
        {
            err(&field("workspace"), "must be a workspace path such as root or root:org".into());
        }
        if let Some(ns) = &right.namespace
            && let Err(e) = names::check_dns_label(ns)
        {
            err(&field("namespace"), e);
        }
        // An object name is a path segment of its URL: any other constraint is the resource's own.
        if let Some(name) = &right.name
            && (name.is_empty() || name == "." || name == ".." || name.contains(['/', '%']))
        {
            err(&field("name"), "must be an object name (not empty, no / or %, not . or ..)".into());
        }
    }
}

/// One target at `tat` (`targets[j]`), a Secret no other target names (`seen`, which it is added to); `None`
/// when its placement is not exactly one of namespace, namespaceSelector (then nothing more is checked).
fn target_spec(
    tat: &str,
    t: RawTarget,
    seen: &mut BTreeSet<(Option<String>, String)>,
    err: &mut impl FnMut(&str, String),
) -> Option<TargetSpec> {
    if let Err(e) = names::check_dns_subdomain(&t.name) {
        err(&format!("{tat}.name"), e);
    }
    let placement = placement(tat, t.namespace, t.namespace_selector.as_ref(), t.allowed_namespaces, err)?;
    let namespace = match &placement {
        Placement::Namespace(ns) => Some(ns.clone()),
        Placement::Selector { .. } => None,
    };
    let key = t.key.unwrap_or_else(|| KUBECONFIG_KEY.into());
    if let Err(e) = names::check_data_key(&key) {
        err(&format!("{tat}.key"), e);
    } else if t.split_keys && ["tls.crt", "tls.key", "ca.crt"].contains(&key.as_str()) {
        err(&format!("{tat}.key"), "collides with a split key (tls.crt, tls.key, ca.crt)".into());
    }
    // A selector may select any namespace, so a selector target shares its name with no other target.
    let clash = seen.iter().any(|(ns, name): &(Option<String>, String)| {
        *name == t.name && (ns.is_none() || namespace.is_none() || *ns == namespace)
    });
    if clash {
        err(tat, "this Secret is already a target (of this or another kubeconfig)".into());
    }
    seen.insert((namespace.clone(), t.name.clone()));
    let consumers = consumers(
        tat,
        [
            ("restartDeployments", ConsumerKind::Deployment, t.restart_deployments),
            ("restartStatefulSets", ConsumerKind::StatefulSet, t.restart_stateful_sets),
            ("restartDaemonSets", ConsumerKind::DaemonSet, t.restart_daemon_sets),
        ],
        err,
    );
    let restart_window =
        relay(err, |errors| t.restart_window.and_then(|w| w.validate(&format!("{tat}.restartWindow"), errors)));
    Some(TargetSpec {
        placement,
        target: Target {
            namespace: namespace.unwrap_or_default(),
            name: t.name,
            key,
            split_keys: t.split_keys,
            adopt: t.adopt,
            consumers,
            restart_window,
        },
    })
}

/// Exactly one of a target's namespace and namespaceSelector, checked, a selector with the namespaces it may
/// place the Secret in; `None` (and an error at `tat`) otherwise.
fn placement(
    tat: &str,
    namespace: Option<String>,
    selector: Option<&NamespaceSelector>,
    allowed: Option<Vec<String>>,
    err: &mut impl FnMut(&str, String),
) -> Option<Placement> {
    match (namespace, selector) {
        (Some(ns), None) => {
            if let Err(e) = names::check_dns_label(&ns) {
                err(&format!("{tat}.namespace"), e);
            }
            if allowed.is_some() {
                err(&format!("{tat}.allowedNamespaces"), "only with namespaceSelector".into());
            }
            Some(Placement::Namespace(ns))
        }
        (None, Some(selector)) => {
            let selector = relay(err, |errors| selector.validate(&format!("{tat}.namespaceSelector"), errors));
            let allowed = allowed.unwrap_or_default();
            if allowed.is_empty() {
                err(
                    &format!("{tat}.allowedNamespaces"),
                    "required with namespaceSelector: name the namespaces the Secret may be written to (a label \
                     anyone may set on their namespace never decides alone who receives an admin kubeconfig)"
                        .into(),
                );
            }
            for (i, ns) in allowed.iter().enumerate() {
                if let Err(e) = names::check_dns_label(ns) {
                    err(&format!("{tat}.allowedNamespaces[{i}]"), e);
                }
            }
            Some(Placement::Selector { selector, allowed: allowed.into_iter().collect() })
        }
        (ns, _) => {
            let has = if ns.is_some() { "; has both" } else { "" };
            err(tat, format!("set exactly one of namespace, namespaceSelector{has}"));
            None
        }
    }
}

/// A target's workloads to restart, each list under its field, each name a DNS subdomain.
fn consumers(
    tat: &str,
    lists: [(&str, ConsumerKind, Vec<String>); 3],
    err: &mut impl FnMut(&str, String),
) -> Vec<Consumer> {
    let mut consumers = Vec::new();
    for (field, kind, list) in lists {
        for (d, name) in list.into_iter().enumerate() {
            if let Err(e) = names::check_dns_subdomain(&name) {
                err(&format!("{tat}.{field}[{d}]"), e);
            }
            consumers.push(Consumer { kind, name });
        }
    }
    consumers
}

/// Runs a check that collects its own [`FieldError`]s (the runtime's validators, a [`Checked`] field) and reports
/// each through `err`, whose paths are relative to the same place.
fn relay<T>(err: &mut impl FnMut(&str, String), check: impl FnOnce(&mut Vec<FieldError>) -> T) -> T {
    let mut errors = Vec::new();
    let value = check(&mut errors);
    for e in errors {
        err(&e.path, e.reason);
    }
    value
}

fn check_object(err: &mut impl FnMut(&str, String), at: &str, namespace: &str, name: &str) {
    if let Err(e) = names::check_dns_label(namespace) {
        err(&format!("{at}.namespace"), e);
    }
    if let Err(e) = names::check_dns_subdomain(name) {
        err(&format!("{at}.name"), e);
    }
}

fn check_key_ref(err: &mut impl FnMut(&str, String), at: &str, r: &KeyRef) {
    check_object(err, at, &r.namespace, &r.name);
    if let Err(e) = names::check_data_key(&r.key) {
        err(&format!("{at}.key"), e);
    }
}

/// An `https://host[:port]` URL; a path only where `path_allowed` (a source's server may name a workspace).
fn check_server(server: &str, path_allowed: bool) -> Result<(), String> {
    let rest = server.strip_prefix("https://").ok_or("must start with https://")?;
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    if authority.is_empty() || authority.contains(['@', '?', '#', ' ']) {
        return Err("must name a host".into());
    }
    if !path_allowed && !path.is_empty() {
        return Err("must be scheme, host and port only: the path of each cluster's server is kept".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use kcp_keeper_runtime::config::parse;

    use super::*;

    fn parse_ok(text: &str) -> Config {
        parse::<Config>(Path::new("c.yaml"), text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn parse_err(text: &str) -> String {
        parse::<Config>(Path::new("c.yaml"), text).unwrap_err().to_string()
    }

    #[test]
    fn an_operator_source_needs_no_expect_and_targets_default_to_the_kubeconfig_key() {
        let c = parse_ok(
            "kubeconfigs:\n- name: hub\n  source: {kubeconfig: {namespace: kcp, name: hub, renderedSecret: hub-kc}}\n  renewBefore: 1h\n  server: https://fp.kcp.svc:6443/\n  targets:\n  - {namespace: rg, name: railgrid-kcp, restartDeployments: [hub]}\n",
        );
        let k = &c.kubeconfigs[0];
        assert_eq!(
            k.source,
            Source::Operator {
                namespace: "kcp".into(),
                name: "hub".into(),
                rendered_secret: "hub-kc".into(),
                server_ca: None
            }
        );
        assert_eq!(k.targets[0].target.key, "kubeconfig");
        assert_eq!(k.renew_before, Some(Duration::from_secs(3600)));
        assert_eq!(k.server.as_deref(), Some("https://fp.kcp.svc:6443"));
        assert_eq!(c.resync_interval, DEFAULT_RESYNC);
    }

    #[test]
    fn every_mistake_is_reported_with_its_path() {
        let err = parse_err(
            "resyncInterval: 0s\nkubeconfigs:\n- name: Hub\n  source: {secret: {namespace: a, name: b, key: k}, kubeconfig: {namespace: a, name: b, renderedSecret: c}}\n  targets: []\n- name: x\n  source: {secret: {namespace: a, name: b, key: k}}\n  renewBefore: 1h\n  server: http://plain\n  targets:\n  - {namespace: a, name: t, key: tls.crt, splitKeys: true}\n  - {namespace: a, name: t}\n",
        );
        for expected in [
            "kubeconfigs[0].name:",
            "kubeconfigs[0].source: set exactly one",
            "kubeconfigs[0].targets: at least one",
            "kubeconfigs[1].expect: required",
            "kubeconfigs[1].renewBefore: only a kubeconfig source",
            "kubeconfigs[1].server: must start with https://",
            "kubeconfigs[1].targets[0].key: collides",
            "kubeconfigs[1].targets[1]: this Secret is already a target",
            "resyncInterval: must be at least 1s",
        ] {
            assert!(err.contains(expected), "missing {expected:?} in {err}");
        }
    }

    #[test]
    fn a_bad_duration_is_reported_with_its_path_beside_every_other_mistake_and_never_echoed() {
        let err = parse_err(
            "resyncInterval: s3cr3t-token\nkubeconfigs:\n- name: a\n  source: {kubeconfig: {namespace: a, name: b, renderedSecret: c}}\n  renewBefore: forever\n  targets: []\n",
        );
        for expected in [
            "kubeconfigs[0].renewBefore: is not a duration like 720h, 1h30m or 90s",
            "kubeconfigs[0].targets: at least one",
            "resyncInterval: is not a duration like 720h, 1h30m or 90s",
        ] {
            assert!(err.contains(expected), "missing {expected:?} in {err}");
        }
        assert!(!err.contains("s3cr3t") && !err.contains("forever"), "{err}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = parse_err("kubeconfigs:\n- name: a\n  sauce: {}\n  targets: []\n");
        assert!(err.contains("unknown field `sauce`"), "{err}");
    }

    #[test]
    fn a_rewritten_server_must_not_carry_a_path() {
        let err = parse_err(
            "kubeconfigs:\n- name: a\n  source: {kubeconfig: {namespace: a, name: b, renderedSecret: c}}\n  server: https://fp:6443/clusters/root\n  targets: [{namespace: a, name: t}]\n",
        );
        assert!(err.contains("kubeconfigs[0].server: must be scheme, host and port only"), "{err}");
    }

    #[test]
    fn consumers_restart_windows_and_rights_are_checked_with_their_paths() {
        let c = parse_ok(
            "kubeconfigs:\n- name: a\n  source: {kubeconfig: {namespace: a, name: b, renderedSecret: c}}\n  verify: {rights: [{verb: get, resource: configmaps, workspace: \"root:org\"}, {verb: get, resource: configmaps, namespace: team-a, name: hub, workspace: root}]}\n  targets:\n  - {namespace: a, name: t, restartDeployments: [web], restartStatefulSets: [db], restartDaemonSets: [agent], restartWindow: {cron: \"0 2 * * *\", duration: 2h}}\n",
        );
        let k = &c.kubeconfigs[0];
        assert!(k.ca_overlap, "CA overlap is on by default");
        assert_eq!(k.rights[0].to_string(), "get configmaps in workspace root:org");
        assert_eq!(k.rights[1].to_string(), "get configmaps named hub in namespace team-a in workspace root");
        let kinds: Vec<ConsumerKind> = k.targets[0].target.consumers.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, ConsumerKind::ALL);
        let window = k.targets[0].target.restart_window.as_ref().expect("a window");
        assert_eq!((window.duration, window.margin), (Duration::from_secs(7200), DEFAULT_RESTART_MARGIN));

        let err = parse_err(
            "kubeconfigs:\n- name: a\n  source: {kubeconfig: {namespace: a, name: b, renderedSecret: c}}\n  caOverlap: false\n  verify: {rights: [{verb: \"\", resource: configmaps, workspace: \"Root:\"}, {verb: get, resource: configmaps, namespace: Team_A, name: \"a/b\"}]}\n  targets:\n  - {namespace: a, name: t, restartStatefulSets: [Bad_Name], restartWindow: {cron: \"not cron\", duration: 0s}}\n  - {namespace: a, name: u, restartWindow: {cron: \"0 2 * * *\", timeZone: Mars/Olympus, duration: 1h}}\n",
        );
        for expected in [
            "kubeconfigs[0].verify.rights[0].verb: must be a non-empty Kubernetes name",
            "kubeconfigs[0].verify.rights[0].workspace: must be a workspace path",
            "kubeconfigs[0].verify.rights[1].namespace:",
            "kubeconfigs[0].verify.rights[1].name: must be an object name",
            "kubeconfigs[0].targets[0].restartStatefulSets[0]:",
            "kubeconfigs[0].targets[0].restartWindow.duration: must be more than 0",
            "kubeconfigs[0].targets[0].restartWindow: cron:",
            "kubeconfigs[0].targets[1].restartWindow: timeZone: unknown zone",
        ] {
            assert!(err.contains(expected), "missing {expected:?} in {err}");
        }
    }

    #[test]
    fn a_target_by_namespace_selector_needs_namespaces_allowed_by_name_and_shares_its_name_with_no_other_target() {
        let c = parse_ok(
            "kubeconfigs:\n- name: a\n  source: {kubeconfig: {namespace: a, name: b, renderedSecret: c}}\n  targets:\n  - {name: kcp, namespaceSelector: {matchLabels: {kcp: hub}, matchExpressions: [{key: tier, operator: In, values: [prod]}]}, allowedNamespaces: [team-a, team-b], restartDeployments: [hub]}\n",
        );
        let spec = &c.kubeconfigs[0].targets[0];
        let Placement::Selector { selector, allowed } = &spec.placement else { panic!("a selector target") };
        assert_eq!(selector.label_selector(), "kcp=hub,tier in (prod)");
        assert_eq!(allowed.iter().collect::<Vec<_>>(), ["team-a", "team-b"]);
        assert_eq!(spec.at("team-a").namespace, "team-a");

        let err = parse_err(
            "kubeconfigs:\n- name: a\n  source: {kubeconfig: {namespace: a, name: b, renderedSecret: c}}\n  targets:\n  - {name: kcp, namespaceSelector: {matchExpressions: [{key: x, operator: DoesNotExist}]}, allowedNamespaces: [a]}\n  - {name: kcp, namespace: team-a}\n  - {name: other, namespace: a, namespaceSelector: {matchLabels: {a: b}}}\n  - {name: none}\n  - {name: unbounded, namespaceSelector: {matchLabels: {a: b}}}\n  - {name: empty, namespaceSelector: {matchLabels: {a: b}}, allowedNamespaces: []}\n  - {name: bad, namespaceSelector: {matchLabels: {a: b}}, allowedNamespaces: [Team_A]}\n  - {name: named, namespace: a, allowedNamespaces: [a]}\n",
        );
        for expected in [
            "kubeconfigs[0].targets[0].namespaceSelector.matchLabels: must name at least one label",
            "kubeconfigs[0].targets[1]: this Secret is already a target",
            "kubeconfigs[0].targets[2]: set exactly one of namespace, namespaceSelector; has both",
            "kubeconfigs[0].targets[3]: set exactly one of namespace, namespaceSelector",
            "kubeconfigs[0].targets[4].allowedNamespaces: required with namespaceSelector",
            "kubeconfigs[0].targets[5].allowedNamespaces: required with namespaceSelector",
            "kubeconfigs[0].targets[6].allowedNamespaces[0]:",
            "kubeconfigs[0].targets[7].allowedNamespaces: only with namespaceSelector",
        ] {
            assert!(err.contains(expected), "missing {expected:?} in {err}");
        }
    }
}
