//! The agent's configuration file (YAML), read strictly, and its validation.
//!
//! Serde rejects unknown fields and wrong types; [`Config::validate`] then returns every semantic error at once,
//! each with its field path (`bundles[1].targets[0].secret.key: must not be empty`), so one run of the agent
//! (or of `render`) shows everything that is wrong.
//!
//! Sources and targets are "exactly one of these keys" objects. They are plain structs with optional fields,
//! not serde enums, so that a mistake is reported with the field path and the list of keys that were set
//! rather than as a YAML tag error; [`SourceSpec::kind`] and [`TargetSpec::kind`] give the enum view.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::certs::{self, EmptyPolicy};
use kcp_keeper_runtime::config::{AgentConfig, FieldError};
use kcp_keeper_runtime::duration::{DurationError, parse_go_duration};
use kcp_keeper_runtime::names;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    pub bundles: Vec<BundleSpec>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BundleSpec {
    /// Names the bundle in logs, Events and metrics; a DNS label, unique.
    pub name: String,
    pub sources: Vec<SourceSpec>,
    pub targets: Vec<TargetSpec>,
    /// Go duration. How long a CA that left the sources stays published at most; without it, until its
    /// notAfter. See [`crate::rotation`].
    #[serde(default)]
    pub rotation_grace: Option<String>,
    /// Leave out certificates past their notAfter.
    #[serde(default = "default_true")]
    pub drop_expired: bool,
    /// A TLS endpoint whose presented chain the bundle must verify before it is published.
    #[serde(default)]
    pub live_check: Option<LiveCheck>,
    /// For consumers that read an empty key as "use the public roots" (KubeV's `kubev-kcp-front-proxy-ca`): an
    /// empty key may be written, and only when the public roots verify the `liveCheck` endpoint.
    #[serde(default)]
    pub empty_means_public_roots: bool,
}

fn default_true() -> bool {
    true
}

/// One source: exactly one of the fields is set.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SourceSpec {
    #[serde(default)]
    pub secret: Option<KeyRef>,
    #[serde(default)]
    pub config_map: Option<KeyRef>,
    /// PEM text in the configuration itself.
    #[serde(default)]
    pub inline: Option<String>,
    /// An absolute path to a PEM file (e.g. a mounted volume).
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// The public roots (`publicRoots: {}`).
    #[serde(default, deserialize_with = "present")]
    pub public_roots: Option<PublicRoots>,
}

/// `publicRoots: {}` has no options yet; the empty struct keeps the door open and refuses unknown ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublicRoots {}

/// A present key with a null value (`publicRoots:`) counts as present: someone who wrote it meant it.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<PublicRoots>, D::Error> {
    Ok(Some(Option::<PublicRoots>::deserialize(deserializer)?.unwrap_or_default()))
}

/// A key of a Secret or ConfigMap in a named namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KeyRef {
    pub namespace: String,
    pub name: String,
    pub key: String,
}

/// The enum view of a [`SourceSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source<'a> {
    Secret(&'a KeyRef),
    ConfigMap(&'a KeyRef),
    Inline(&'a str),
    File(&'a Path),
    PublicRoots,
}

impl SourceSpec {
    /// The one kind this source is, or `None` when not exactly one field is set (a validation error).
    pub fn kind(&self) -> Option<Source<'_>> {
        let mut set = self.set_fields();
        match (set.next(), set.next()) {
            (Some(kind), None) => Some(kind),
            _ => None,
        }
    }

    fn set_fields(&self) -> impl Iterator<Item = Source<'_>> {
        [
            self.secret.as_ref().map(Source::Secret),
            self.config_map.as_ref().map(Source::ConfigMap),
            self.inline.as_deref().map(Source::Inline),
            self.file.as_deref().map(Source::File),
            self.public_roots.map(|_| Source::PublicRoots),
        ]
        .into_iter()
        .flatten()
    }
}

impl Source<'_> {
    fn field(&self) -> &'static str {
        match self {
            Source::Secret(_) => "secret",
            Source::ConfigMap(_) => "configMap",
            Source::Inline(_) => "inline",
            Source::File(_) => "file",
            Source::PublicRoots => "publicRoots",
        }
    }
}

/// One target: exactly one of `secret` / `configMap`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TargetSpec {
    #[serde(default)]
    pub secret: Option<TargetObject>,
    #[serde(default)]
    pub config_map: Option<TargetObject>,
    /// Take over an existing object (or key) that kcp-keeper did not create. Off: such an object is left
    /// alone and reported.
    #[serde(default)]
    pub adopt: bool,
}

/// The object a target writes: its name and key, in one namespace or in every namespace a selector matches.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TargetObject {
    pub name: String,
    pub key: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub namespace_selector: Option<NamespaceSelector>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamespaceSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TargetKind {
    Secret,
    ConfigMap,
}

impl TargetKind {
    fn field(&self) -> &'static str {
        match self {
            TargetKind::Secret => "secret",
            TargetKind::ConfigMap => "configMap",
        }
    }
}

/// Where a target object lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement<'a> {
    Namespace(&'a str),
    Selector(&'a NamespaceSelector),
}

impl TargetSpec {
    /// The kind and object, or `None` when not exactly one of `secret` / `configMap` is set.
    pub fn kind(&self) -> Option<(TargetKind, &TargetObject)> {
        match (&self.secret, &self.config_map) {
            (Some(object), None) => Some((TargetKind::Secret, object)),
            (None, Some(object)) => Some((TargetKind::ConfigMap, object)),
            _ => None,
        }
    }
}

impl TargetObject {
    /// `None` when not exactly one of `namespace` / `namespaceSelector` is set.
    pub fn placement(&self) -> Option<Placement<'_>> {
        match (&self.namespace, &self.namespace_selector) {
            (Some(namespace), None) => Some(Placement::Namespace(namespace)),
            (None, Some(selector)) => Some(Placement::Selector(selector)),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LiveCheck {
    /// `https://host[:port][/path]`.
    pub url: String,
    /// The name to verify the server's certificate for, when it differs from the URL's host (e.g. the URL is
    /// an in-cluster Service, the certificate is for the public hostname).
    #[serde(default)]
    pub server_name: Option<String>,
}

impl BundleSpec {
    /// The parsed `rotationGrace`; `None` when not configured.
    pub fn rotation_grace(&self) -> Result<Option<Duration>, DurationError> {
        self.rotation_grace.as_deref().map(parse_go_duration).transpose()
    }
}

/// One place an object key is written, for finding two targets that would fight over it.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Destination<'a> {
    kind: TargetKind,
    namespace: Option<&'a str>,
    name: &'a str,
    key: &'a str,
}

/// Parsing (strict, with field paths) is the runtime's `config::load`/`config::parse`; this adds the checks only
/// ca-syncer knows.
impl AgentConfig for Config {
    /// Every semantic error, each with its field path; empty when the configuration is valid.
    fn validate(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if self.bundles.is_empty() {
            errors.push(FieldError::new("bundles", "at least one bundle is required"));
        }
        let mut names: HashMap<&str, usize> = HashMap::new();
        // Targets already seen in earlier bundles, for cross-bundle conflicts.
        let mut written: Vec<(Destination<'_>, String)> = Vec::new();
        for (i, bundle) in self.bundles.iter().enumerate() {
            let path = format!("bundles[{i}]");
            check(&mut errors, format!("{path}.name"), names::check_dns_label(&bundle.name));
            match names.entry(&bundle.name) {
                Entry::Occupied(first) => errors.push(FieldError::new(
                    format!("{path}.name"),
                    format!("duplicate of bundles[{}].name", first.get()),
                )),
                Entry::Vacant(slot) => {
                    slot.insert(i);
                }
            }
            validate_bundle(bundle, &path, &mut written, &mut errors);
        }
        errors
    }
}

fn check(errors: &mut Vec<FieldError>, path: String, result: Result<(), String>) {
    if let Err(reason) = result {
        errors.push(FieldError::new(path, reason));
    }
}

fn validate_bundle<'a>(
    bundle: &'a BundleSpec,
    path: &str,
    written: &mut Vec<(Destination<'a>, String)>,
    errors: &mut Vec<FieldError>,
) {
    if bundle.sources.is_empty() {
        errors.push(FieldError::new(format!("{path}.sources"), "at least one source is required"));
    }
    let mut read: Vec<(Destination<'a>, String)> = Vec::new();
    for (j, source) in bundle.sources.iter().enumerate() {
        let path = format!("{path}.sources[{j}]");
        if let Some(destination) = validate_source(source, &path, errors) {
            read.push((destination, path));
        }
    }

    if bundle.targets.is_empty() {
        errors.push(FieldError::new(format!("{path}.targets"), "at least one target is required"));
    }
    let earlier_bundles = written.len();
    for (j, target) in bundle.targets.iter().enumerate() {
        let path = format!("{path}.targets[{j}]");
        let Some(destination) = validate_target(target, &path, errors) else { continue };
        if let Some((_, source)) = read.iter().find(|(d, _)| *d == destination) {
            errors.push(FieldError::new(
                path.clone(),
                format!("writes the object and key that {source} reads; the bundle would feed on itself"),
            ));
        }
        for (index, (other, other_path)) in written.iter().enumerate() {
            let same_bundle = index >= earlier_bundles;
            if same_bundle && *other == destination {
                errors.push(FieldError::new(path.clone(), format!("duplicate of {other_path}")));
            } else if !same_bundle && may_overlap(other, &destination) {
                errors.push(FieldError::new(
                    path.clone(),
                    format!(
                        "may write the same {} and key as {other_path}; two bundles would overwrite each other",
                        destination.kind.field()
                    ),
                ));
            }
        }
        written.push((destination, path));
    }

    if let Err(reason) = bundle.rotation_grace() {
        errors.push(FieldError::new(format!("{path}.rotationGrace"), reason.to_string()));
    }
    if let Some(live) = &bundle.live_check {
        validate_live_check(live, &format!("{path}.liveCheck"), errors);
    }
    if bundle.empty_means_public_roots && bundle.live_check.is_none() {
        errors.push(FieldError::new(
            format!("{path}.emptyMeansPublicRoots"),
            "requires liveCheck: an empty key is written only when the public roots verify the live endpoint",
        ));
    }
}

/// Two destinations can be the same object key: same kind, name and key, and either the same namespace or a
/// selector that might match the other's namespace (a selector's matches are only known at run time).
fn may_overlap(a: &Destination<'_>, b: &Destination<'_>) -> bool {
    a.kind == b.kind
        && a.name == b.name
        && a.key == b.key
        && match (a.namespace, b.namespace) {
            (Some(x), Some(y)) => x == y,
            _ => true,
        }
}

/// Validates a source; returns the object key it reads when it reads one.
fn validate_source<'a>(source: &'a SourceSpec, path: &str, errors: &mut Vec<FieldError>) -> Option<Destination<'a>> {
    let set: Vec<Source<'_>> = source.set_fields().collect();
    let [kind] = set.as_slice() else {
        let reason = if set.is_empty() {
            "must set one of secret, configMap, inline, file, publicRoots".to_owned()
        } else {
            let fields: Vec<&str> = set.iter().map(Source::field).collect();
            format!("must set exactly one of secret, configMap, inline, file, publicRoots; has {}", fields.join(", "))
        };
        errors.push(FieldError::new(path, reason));
        return None;
    };
    match *kind {
        Source::Secret(key_ref) | Source::ConfigMap(key_ref) => {
            let kind = if matches!(kind, Source::Secret(_)) { TargetKind::Secret } else { TargetKind::ConfigMap };
            let path = format!("{path}.{}", kind.field());
            check(errors, format!("{path}.namespace"), names::check_dns_label(&key_ref.namespace));
            check(errors, format!("{path}.name"), names::check_dns_subdomain(&key_ref.name));
            check(errors, format!("{path}.key"), names::check_data_key(&key_ref.key));
            if key_ref.key.ends_with(".key") {
                errors.push(FieldError::new(
                    format!("{path}.key"),
                    "names a private key (like tls.key); ca-syncer copies certificates only, use tls.crt or ca.crt",
                ));
            }
            Some(Destination { kind, namespace: Some(&key_ref.namespace), name: &key_ref.name, key: &key_ref.key })
        }
        Source::Inline(text) => {
            // The same strict parser as at run time: a key pasted into the configuration fails at start. The
            // error names the block, never its content.
            if let Err(err) = certs::parse_certificates(text.as_bytes(), EmptyPolicy::Reject) {
                errors.push(FieldError::new(format!("{path}.inline"), err.to_string()));
            }
            None
        }
        Source::File(file) => {
            if !file.is_absolute() {
                errors.push(FieldError::new(format!("{path}.file"), "must be an absolute path"));
            }
            None
        }
        Source::PublicRoots => None,
    }
}

/// Validates a target; returns the object key it writes when it is well-formed enough to say.
fn validate_target<'a>(target: &'a TargetSpec, path: &str, errors: &mut Vec<FieldError>) -> Option<Destination<'a>> {
    let Some((kind, object)) = target.kind() else {
        let reason = if target.secret.is_some() {
            "must set exactly one of secret, configMap; has both"
        } else {
            "must set one of secret, configMap"
        };
        errors.push(FieldError::new(path, reason));
        return None;
    };
    let path = format!("{path}.{}", kind.field());
    check(errors, format!("{path}.name"), names::check_dns_subdomain(&object.name));
    check(errors, format!("{path}.key"), names::check_data_key(&object.key));
    let namespace = match object.placement() {
        Some(Placement::Namespace(namespace)) => {
            check(errors, format!("{path}.namespace"), names::check_dns_label(namespace));
            Some(namespace)
        }
        Some(Placement::Selector(selector)) => {
            validate_selector(selector, &format!("{path}.namespaceSelector"), errors);
            None
        }
        None => {
            let has = if object.namespace.is_some() { "; has both" } else { "" };
            errors.push(FieldError::new(path, format!("must set exactly one of namespace, namespaceSelector{has}")));
            return None;
        }
    };
    Some(Destination { kind, namespace, name: &object.name, key: &object.key })
}

fn validate_selector(selector: &NamespaceSelector, path: &str, errors: &mut Vec<FieldError>) {
    if selector.match_labels.is_empty() {
        errors.push(FieldError::new(
            format!("{path}.matchLabels"),
            "must name at least one label; an empty selector would select every namespace, kube-system included",
        ));
    }
    for (key, value) in &selector.match_labels {
        check(
            errors,
            format!("{path}.matchLabels[{key:?}]"),
            names::check_label_key(key).map_err(|r| format!("key {r}")),
        );
        check(
            errors,
            format!("{path}.matchLabels[{key:?}]"),
            names::check_label_value(value).map_err(|r| format!("value {r}")),
        );
    }
}

fn validate_live_check(live: &LiveCheck, path: &str, errors: &mut Vec<FieldError>) {
    match live.url.parse::<http::Uri>() {
        Err(_) => errors.push(FieldError::new(format!("{path}.url"), "is not a URL")),
        Ok(uri) => {
            if uri.scheme_str() != Some("https") {
                errors.push(FieldError::new(format!("{path}.url"), "must be an https:// URL"));
            }
            match uri.authority() {
                None => errors.push(FieldError::new(format!("{path}.url"), "must name a host")),
                Some(authority) if authority.as_str().contains('@') => {
                    errors.push(FieldError::new(format!("{path}.url"), "must not carry credentials"));
                }
                Some(authority) if authority.host().is_empty() => {
                    errors.push(FieldError::new(format!("{path}.url"), "must name a host"));
                }
                Some(_) => {}
            }
        }
    }
    if let Some(server_name) = &live.server_name {
        check(errors, format!("{path}.serverName"), names::check_server_name(server_name));
    }
}

#[cfg(test)]
mod tests {
    use kcp_keeper_runtime::config::ConfigError;

    use super::*;

    /// Parses and validates the way the agent does at start.
    fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        kcp_keeper_runtime::config::parse(Path::new("ca-syncer.yaml"), text)
    }
    use crate::testcerts::TestCa;

    const EXAMPLE: &str = include_str!("../example.yaml");

    fn errors_of(yaml: &str) -> Vec<String> {
        let config: Config = serde_yaml::from_str(yaml).expect("parses");
        config.validate().iter().map(ToString::to_string).collect()
    }

    /// A valid one-bundle configuration to break in tests.
    const MINIMAL: &str = r#"
bundles:
  - name: kcp-root-ca
    sources:
      - secret: {namespace: kcp-system, name: root-server-ca, key: ca.crt}
    targets:
      - secret: {namespace: railgrid-system, name: kcp-ca, key: ca.crt}
"#;

    #[test]
    fn example_yaml_parses_and_validates() {
        let config = from_yaml(EXAMPLE).unwrap_or_else(|e| panic!("{e}"));
        let bundle = &config.bundles[0];
        assert_eq!(bundle.name, "kcp-root-ca");
        let sources: Vec<_> = bundle.sources.iter().filter_map(SourceSpec::kind).collect();
        let key = |key: &str| KeyRef { namespace: "kcp-system".into(), name: "root-server-ca".into(), key: key.into() };
        assert_eq!(sources[..2], [Source::Secret(&key("tls.crt")), Source::Secret(&key("ca.crt"))]);
        let (kind, object) = bundle.targets[0].kind().expect("one kind");
        assert_eq!(kind, TargetKind::Secret);
        assert_eq!((object.name.as_str(), object.key.as_str()), ("kcp-ca", "ca.crt"));
        assert_eq!(object.placement(), Some(Placement::Namespace("railgrid-system")));
        let (_, selected) = bundle.targets[1].kind().expect("one kind");
        assert!(matches!(selected.placement(), Some(Placement::Selector(s)) if !s.match_labels.is_empty()));
        assert!(bundle.drop_expired);
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let config = from_yaml(MINIMAL).expect("valid");
        let bundle = &config.bundles[0];
        assert!(bundle.drop_expired, "dropExpired defaults to true");
        assert!(!bundle.empty_means_public_roots);
        assert_eq!(bundle.rotation_grace(), Ok(None));
        assert!(bundle.live_check.is_none());
        assert!(!bundle.targets[0].adopt);
    }

    #[test]
    fn unknown_fields_are_rejected_at_every_level() {
        let cases = [
            MINIMAL.replace("bundles:", "extra: 1\nbundles:"),
            MINIMAL.replace("  - name: kcp-root-ca", "  - name: kcp-root-ca\n    colour: blue"),
            MINIMAL.replace("key: ca.crt}\n    targets", "key: ca.crt, optional: true}\n    targets"),
            MINIMAL.replace("namespace: railgrid-system,", "namespace: railgrid-system, labels: {},"),
            MINIMAL.replace(
                "      - secret: {namespace: kcp-system",
                "      - publicRoots: {all: true}\n      - secret: {namespace: kcp-system",
            ),
        ];
        for yaml in cases {
            let err = from_yaml(&yaml).unwrap_err();
            assert!(matches!(err, ConfigError::Parse { .. }), "{yaml}\n{err}");
            assert!(err.to_string().contains("unknown field"), "{err}");
        }
    }

    #[test]
    fn all_sources_kinds_parse_including_bare_public_roots() {
        let yaml = MINIMAL.replace(
            "    targets:",
            "      - configMap: {namespace: kcp-system, name: extra-ca, key: ca.crt}\n      - file: /etc/ca/extra.pem\n      - publicRoots: {}\n      - publicRoots:\n    targets:",
        );
        let config = from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}"));
        let kinds: Vec<_> = config.bundles[0].sources.iter().map(|s| s.kind().map(|k| k.field())).collect();
        assert_eq!(kinds, [Some("secret"), Some("configMap"), Some("file"), Some("publicRoots"), Some("publicRoots")]);
    }

    #[test]
    fn inline_pem_source_is_checked_strictly_at_load_without_echoing_it() {
        let ca = TestCa::root("inline-root");
        let good = format!(
            "bundles:\n  - name: b\n    sources:\n      - inline: |\n{}    targets:\n      - secret: {{namespace: a, name: b, key: ca.crt}}\n",
            indent(&ca.pem())
        );
        assert_eq!(errors_of(&good), Vec::<String>::new());
        let with_key = format!(
            "bundles:\n  - name: b\n    sources:\n      - inline: |\n{}{}    targets:\n      - secret: {{namespace: a, name: b, key: ca.crt}}\n",
            indent(&ca.pem()),
            indent(&ca.key_pem())
        );
        let errors = errors_of(&with_key);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("bundles[0].sources[0].inline: block 2 "), "{}", errors[0]);
        assert!(errors[0].contains("private key"));
        let key_body = crate::testcerts::base64_body(&ca.key_pem());
        assert!(!errors[0].contains(&key_body[..20]));
    }

    fn indent(text: &str) -> String {
        text.lines().map(|l| format!("          {l}\n")).collect()
    }

    #[test]
    fn validate_returns_every_error_with_its_field_path() {
        let yaml = r#"
bundles:
  - name: Bad_Name
    sources:
      - secret: {namespace: kcp-system, name: root-server-ca, key: tls.key}
      - {}
      - file: relative/path.pem
      - secret: {namespace: a, name: b, key: c}
        inline: "x"
    targets:
      - secret: {name: kcp-ca, key: ""}
      - configMap: {namespace: "", name: "UPPER", key: "a/b"}
      - secret: {namespace: a, name: b, key: ca.crt, namespaceSelector: {matchLabels: {x: y}}}
      - {}
      - secret: {name: c, key: ca.crt, namespaceSelector: {matchLabels: {}}}
      - secret: {name: d, key: ca.crt, namespaceSelector: {matchLabels: {"-bad": "v a l"}}}
    rotationGrace: 30d
    emptyMeansPublicRoots: true
  - name: second
    sources: []
    targets: []
    liveCheck: {url: "http://kcp.example.com", serverName: "not a host"}
"#;
        let errors = errors_of(yaml);
        let expected = [
            "bundles[0].name: must be a DNS label",
            "bundles[0].sources[0].secret.key: names a private key",
            "bundles[0].sources[1]: must set one of secret, configMap, inline, file, publicRoots",
            "bundles[0].sources[2].file: must be an absolute path",
            "bundles[0].sources[3]: must set exactly one of secret, configMap, inline, file, publicRoots; has secret, inline",
            "bundles[0].targets[0].secret.key: must not be empty",
            "bundles[0].targets[0].secret: must set exactly one of namespace, namespaceSelector",
            "bundles[0].targets[1].configMap.name: must be a DNS subdomain",
            "bundles[0].targets[1].configMap.key: must consist of",
            "bundles[0].targets[1].configMap.namespace: must not be empty",
            "bundles[0].targets[2].secret: must set exactly one of namespace, namespaceSelector; has both",
            "bundles[0].targets[3]: must set one of secret, configMap",
            "bundles[0].targets[4].secret.namespaceSelector.matchLabels: must name at least one label",
            "bundles[0].targets[5].secret.namespaceSelector.matchLabels[\"-bad\"]: key name part",
            "bundles[0].targets[5].secret.namespaceSelector.matchLabels[\"-bad\"]: value must be",
            "bundles[0].rotationGrace: has an unknown unit",
            "bundles[0].emptyMeansPublicRoots: requires liveCheck",
            "bundles[1].sources: at least one source is required",
            "bundles[1].targets: at least one target is required",
            "bundles[1].liveCheck.url: must be an https:// URL",
            "bundles[1].liveCheck.serverName: must be a DNS hostname or an IP address",
        ];
        for prefix in expected {
            assert!(errors.iter().any(|e| e.starts_with(prefix)), "missing {prefix:?} in\n{}", errors.join("\n"));
        }
        assert_eq!(errors.len(), expected.len(), "{}", errors.join("\n"));
    }

    #[test]
    fn bundle_names_must_be_unique() {
        let yaml = format!("{MINIMAL}{}", MINIMAL.replace("bundles:\n", "").replace("railgrid-system", "other"));
        assert_eq!(errors_of(&yaml), ["bundles[1].name: duplicate of bundles[0].name"]);
    }

    #[test]
    fn no_bundles_is_an_error() {
        assert_eq!(errors_of("bundles: []"), ["bundles: at least one bundle is required"]);
    }

    #[test]
    fn target_that_is_also_a_source_is_refused() {
        let yaml = MINIMAL.replace(
            "{namespace: railgrid-system, name: kcp-ca, key: ca.crt}",
            "{namespace: kcp-system, name: root-server-ca, key: ca.crt}",
        );
        assert_eq!(
            errors_of(&yaml),
            [
                "bundles[0].targets[0]: writes the object and key that bundles[0].sources[0] reads; the bundle would feed on itself"
            ]
        );
    }

    #[test]
    fn two_bundles_writing_the_same_key_are_refused_even_through_a_selector() {
        let second = |target: &str| {
            format!(
                "{MINIMAL}  - name: other\n    sources:\n      - publicRoots: {{}}\n    targets:\n      - {target}\n"
            )
        };
        let same = second("secret: {namespace: railgrid-system, name: kcp-ca, key: ca.crt}");
        assert_eq!(
            errors_of(&same),
            [
                "bundles[1].targets[0]: may write the same secret and key as bundles[0].targets[0]; two bundles would overwrite each other"
            ]
        );
        let selector = second("secret: {name: kcp-ca, key: ca.crt, namespaceSelector: {matchLabels: {a: b}}}");
        assert_eq!(errors_of(&selector).len(), 1);
        // Another key, another namespace, or another kind is fine.
        for ok in [
            "secret: {namespace: railgrid-system, name: kcp-ca, key: other.crt}",
            "secret: {namespace: elsewhere, name: kcp-ca, key: ca.crt}",
            "configMap: {namespace: railgrid-system, name: kcp-ca, key: ca.crt}",
        ] {
            assert_eq!(errors_of(&second(ok)), Vec::<String>::new(), "{ok}");
        }
    }

    #[test]
    fn duplicate_target_within_a_bundle_is_refused() {
        let yaml = MINIMAL.replace(
            "      - secret: {namespace: railgrid-system, name: kcp-ca, key: ca.crt}\n",
            "      - secret: {namespace: railgrid-system, name: kcp-ca, key: ca.crt}\n      - secret: {namespace: railgrid-system, name: kcp-ca, key: ca.crt}\n",
        );
        assert_eq!(errors_of(&yaml), ["bundles[0].targets[1]: duplicate of bundles[0].targets[0]"]);
    }

    #[test]
    fn rotation_grace_takes_go_durations() {
        for (grace, expected) in [("720h", 720 * 3600), ("1h30m", 5400), ("90s", 90), ("0s", 0)] {
            let yaml = format!("{MINIMAL}    rotationGrace: {grace}\n");
            let config = from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(config.bundles[0].rotation_grace(), Ok(Some(Duration::from_secs(expected))));
        }
    }

    #[test]
    fn live_check_urls() {
        for url in ["https://kcp.example.com", "https://10.0.0.1:6443/healthz", "https://[::1]:443"] {
            let yaml = format!("{MINIMAL}    liveCheck: {{url: \"{url}\"}}\n");
            assert_eq!(errors_of(&yaml), Vec::<String>::new(), "{url}");
        }
        for url in ["kcp.example.com", "https://", "https://user:pw@kcp.example.com", "ftp://x", "https://a b"] {
            let yaml = format!("{MINIMAL}    liveCheck: {{url: \"{url}\"}}\n");
            let errors = errors_of(&yaml);
            assert!(errors.len() == 1 && errors[0].starts_with("bundles[0].liveCheck.url: "), "{url}: {errors:?}");
        }
    }

    #[test]
    fn empty_means_public_roots_with_live_check_is_valid() {
        let yaml =
            format!("{MINIMAL}    emptyMeansPublicRoots: true\n    liveCheck: {{url: https://kcp.example.com}}\n");
        assert_eq!(errors_of(&yaml), Vec::<String>::new());
    }

    #[test]
    fn invalid_config_error_lists_every_problem() {
        let err = from_yaml("bundles: [{name: X, sources: [], targets: []}]").unwrap_err();
        let ConfigError::Invalid { errors, .. } = &err else { panic!("{err}") };
        assert_eq!(errors.len(), 3);
        assert!(err.to_string().contains("bundles[0].sources: at least one source is required"), "{err}");
    }
}
