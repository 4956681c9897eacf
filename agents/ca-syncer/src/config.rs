//! The agent's configuration file (YAML): parsed into raw types, then turned into the validated
//! [`Config`] the agent works with.
//!
//! Serde rejects unknown fields and wrong types in the raw form ([`RawConfig`]); [`Config::from_raw`] then
//! returns every semantic error at once, each with its field path (`bundles[1].targets[0].secret.key: must not
//! be empty`), so one run of the agent (or of `render`) shows everything that is wrong. What comes out has no
//! options left to interpret: sources and targets are enums, durations are durations, the live-check URL is
//! parsed into its address and server name, inline PEM is parsed into certificates.
//!
//! In the file, sources and targets are "exactly one of these keys" objects. They are plain structs with
//! optional fields, not serde enums, so that a mistake is reported with the field path and the list of keys
//! that were set rather than as a YAML tag error.
//!
//! One part per thing configured: [`sources`] (where certificates come from), [`targets`] (where bundles go,
//! and the object keys that must not be written twice) and [`live_check`] (the endpoint a bundle must
//! verify). This file holds the whole file and each bundle.

mod field;
mod formats;
mod live_check;
mod sources;
mod targets;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::Duration;

use kcp_keeper_runtime::config::{AgentConfig, FieldError};
use kcp_keeper_runtime::field::{Checked, GoDuration};
use kcp_keeper_runtime::names;
use schemars::JsonSchema;
use serde::Deserialize;

pub use formats::{AdditionalFormat, DEFAULT_JKS_PASSWORD, Format, MAX_PASSWORD, PasswordFrom, check_password};
pub use live_check::{Endpoint, LiveCheck, RawLiveCheck};
pub use sources::{KeyRef, Keys, Pick, PublicRoots, RawSource, Selection, Source};
pub use targets::{Placement, RawTarget, Selector, TRUST_BUNDLE_KEY, Target, TargetKind, TargetMetadata};

use field::{check, go_duration};
use live_check::live_check_from_raw;
use sources::source_from_raw;
use targets::{Destination, may_overlap, target_from_raw};

/// How often every bundle is reconciled without a change: file sources have no watch, and clocks move
/// certificates out.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(60);

// ---- The validated configuration -------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub bundles: Vec<Bundle>,
    pub resync_interval: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    /// A DNS label, unique; names the bundle in logs, Events and metrics.
    pub name: String,
    pub sources: Vec<Source>,
    pub targets: Vec<Target>,
    /// How long a CA that left the sources stays published at most; `None`: until its notAfter.
    pub rotation_grace: Option<Duration>,
    pub drop_expired: bool,
    pub live_check: Option<LiveCheck>,
    /// Sources may be empty; the key is then written empty, only once the public roots verify `live_check`
    /// (which is then always set).
    pub empty_means_public_roots: bool,
}

// ---- The file as written ---------------------------------------------------------------------------------
//
// A duration is an `Option<Checked<GoDuration>>`: its schema is an optional string's, and its
// `"default": null` is written by hand, as schemars writes a default only for a type it can serialize.

/// ca-syncer's configuration (the agent checks it again, with field paths, at start).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawConfig {
    /// The bundles to keep in sync; at least one.
    pub bundles: Vec<RawBundle>,
    /// How often every bundle is re-checked without a change (Go duration, at least 1s); default 60s.
    #[serde(default)]
    pub resync_interval: Option<Checked<GoDuration>>,
}

/// One CA bundle: its sources combined, deduplicated and written to every target.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawBundle {
    /// A DNS label, unique; names the bundle in logs, Events and metrics.
    pub name: String,
    /// Where the certificates come from; at least one.
    pub sources: Vec<RawSource>,
    /// Where the bundle is written; at least one.
    pub targets: Vec<RawTarget>,
    /// How long a CA that left the sources stays published at most (Go duration); without it, until its
    /// notAfter.
    #[serde(default)]
    pub rotation_grace: Option<Checked<GoDuration>>,
    /// Drop certificates past their notAfter; default true.
    #[serde(default = "default_true")]
    pub drop_expired: bool,
    /// Publish only if the bundle verifies the certificate chain of every endpoint named here.
    #[serde(default)]
    pub live_check: Option<RawLiveCheck>,
    /// Sources may be empty; the key is then written empty ("use the public roots"), only once the public
    /// roots verify `liveCheck`, which this requires.
    #[serde(default)]
    pub empty_means_public_roots: bool,
}

fn default_true() -> bool {
    true
}

// ---- Raw to validated ------------------------------------------------------------------------------------

impl AgentConfig for Config {
    type Raw = RawConfig;

    fn from_raw(raw: RawConfig) -> Result<Self, Vec<FieldError>> {
        let mut errors = Vec::new();
        if raw.bundles.is_empty() {
            errors.push(FieldError::new("bundles", "at least one bundle is required"));
        }
        // A text that is not a duration is an error already; the default stands in for it.
        let resync_interval = match go_duration(raw.resync_interval, "resyncInterval".into(), &mut errors) {
            None => DEFAULT_RESYNC,
            Some(d) if d >= Duration::from_secs(1) => d,
            Some(_) => {
                errors.push(FieldError::new("resyncInterval", "must be at least 1s"));
                DEFAULT_RESYNC
            }
        };
        let mut names: HashMap<&str, usize> = HashMap::new();
        // Targets already seen in earlier bundles, for cross-bundle conflicts.
        let mut written: Vec<(Destination<'_>, String)> = Vec::new();
        let mut bundles = Vec::new();
        for (i, bundle) in raw.bundles.iter().enumerate() {
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
            if let Some(bundle) = bundle_from_raw(bundle, &path, &mut written, &mut errors) {
                bundles.push(bundle);
            }
        }
        if errors.is_empty() { Ok(Config { bundles, resync_interval }) } else { Err(errors) }
    }
}

/// The validated bundle, or `None` with its errors recorded.
fn bundle_from_raw<'a>(
    bundle: &'a RawBundle,
    path: &str,
    written: &mut Vec<(Destination<'a>, String)>,
    errors: &mut Vec<FieldError>,
) -> Option<Bundle> {
    let errors_before = errors.len();
    let (sources, read) = bundle_sources(bundle, path, errors);
    let targets = bundle_targets(bundle, path, &read, written, errors);
    let rotation_grace = go_duration(bundle.rotation_grace.clone(), format!("{path}.rotationGrace"), errors);
    let live_check =
        bundle.live_check.as_ref().and_then(|live| live_check_from_raw(live, &format!("{path}.liveCheck"), errors));
    check_together(bundle, &targets, path, errors);
    (errors.len() == errors_before).then(|| Bundle {
        name: bundle.name.clone(),
        sources,
        targets,
        rotation_grace,
        drop_expired: bundle.drop_expired,
        live_check,
        empty_means_public_roots: bundle.empty_means_public_roots,
    })
}

/// The bundle's validated sources, and the object keys they read with each one's path (a target must not
/// write them).
fn bundle_sources<'a>(
    bundle: &'a RawBundle,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> (Vec<Source>, Vec<(Destination<'a>, String)>) {
    if bundle.sources.is_empty() {
        errors.push(FieldError::new(format!("{path}.sources"), "at least one source is required"));
    }
    let mut read: Vec<(Destination<'a>, String)> = Vec::new();
    let mut sources = Vec::new();
    for (j, source) in bundle.sources.iter().enumerate() {
        let path = format!("{path}.sources[{j}]");
        if let Some((source, destination)) = source_from_raw(source, &path, errors) {
            sources.push(source);
            if let Some(destination) = destination {
                read.push((destination, path));
            }
        }
    }
    (sources, read)
}

/// The bundle's validated targets. Each object key a target writes is added to `written` (every bundle's so
/// far), once checked against the keys the bundle's sources `read` and those earlier targets write.
fn bundle_targets<'a>(
    bundle: &'a RawBundle,
    path: &str,
    read: &[(Destination<'a>, String)],
    written: &mut Vec<(Destination<'a>, String)>,
    errors: &mut Vec<FieldError>,
) -> Vec<Target> {
    if bundle.targets.is_empty() {
        errors.push(FieldError::new(format!("{path}.targets"), "at least one target is required"));
    }
    let earlier_bundles = written.len();
    let mut targets = Vec::new();
    for (j, raw) in bundle.targets.iter().enumerate() {
        let path = format!("{path}.targets[{j}]");
        let Some((target, destinations)) = target_from_raw(raw, &path, errors) else { continue };
        targets.push(target);
        let before = written.len();
        for destination in destinations {
            check_destination(&destination, &path, read, &written[..before], earlier_bundles, errors);
            written.push((destination, path.clone()));
        }
    }
    targets
}

/// Checks one object key the target at `path` writes against the keys the bundle's sources `read` and those
/// `earlier` targets write: its own bundle's (from index `earlier_bundles` on) must not write the same key,
/// other bundles' must not possibly write it.
fn check_destination(
    destination: &Destination<'_>,
    path: &str,
    read: &[(Destination<'_>, String)],
    earlier: &[(Destination<'_>, String)],
    earlier_bundles: usize,
    errors: &mut Vec<FieldError>,
) {
    if let Some((_, source)) = read.iter().find(|(d, _)| d == destination) {
        errors.push(FieldError::new(
            path,
            format!("writes the object and key that {source} reads; the bundle would feed on itself"),
        ));
    }
    // A target's own keys are distinct (checked with its formats); only earlier targets' count.
    for (index, (other, other_path)) in earlier.iter().enumerate() {
        let same_bundle = index >= earlier_bundles;
        if same_bundle && other == destination {
            errors.push(FieldError::new(path, format!("duplicate of {other_path}")));
        } else if !same_bundle && may_overlap(other, destination) {
            errors.push(FieldError::new(
                path,
                format!(
                    "may write the same {} and key as {other_path}; two bundles would overwrite each other",
                    destination.kind.field()
                ),
            ));
        }
    }
}

/// Checks what the bundle's settings and targets allow together: `emptyMeansPublicRoots` needs `liveCheck`
/// and no ClusterTrustBundle or trust store target, restart consumers a short enough bundle name.
fn check_together(bundle: &RawBundle, targets: &[Target], path: &str, errors: &mut Vec<FieldError>) {
    if bundle.empty_means_public_roots
        && let Some(j) = targets.iter().position(|t: &Target| t.kind == TargetKind::ClusterTrustBundle)
    {
        errors.push(FieldError::new(
            format!("{path}.targets[{j}].clusterTrustBundle"),
            "cannot go with emptyMeansPublicRoots: a ClusterTrustBundle must hold at least one certificate",
        ));
    }
    if bundle.empty_means_public_roots
        && let Some(j) = targets.iter().position(|t: &Target| !t.formats.is_empty())
    {
        errors.push(FieldError::new(
            format!("{path}.targets[{j}]"),
            "additionalFormats cannot go with emptyMeansPublicRoots: an empty trust store would trust nothing, \
             not the public roots",
        ));
    }
    if targets.iter().any(|t| !t.consumers.is_empty()) && bundle.name.len() > crate::consumers::MAX_BUNDLE_NAME {
        errors.push(FieldError::new(
            format!("{path}.name"),
            format!(
                "at most {} characters for a bundle with restart consumers (it names their annotations)",
                crate::consumers::MAX_BUNDLE_NAME
            ),
        ));
    }
    if bundle.empty_means_public_roots && bundle.live_check.is_none() {
        errors.push(FieldError::new(
            format!("{path}.emptyMeansPublicRoots"),
            "requires liveCheck: an empty key is written only when the public roots verify the live endpoint",
        ));
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use kcp_keeper_runtime::config::ConfigError;
    use rustls::pki_types::ServerName;

    use super::*;

    /// Parses and validates the way the agent does at start.
    fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        kcp_keeper_runtime::config::parse(Path::new("ca-syncer.yaml"), text)
    }
    use crate::testcerts::TestCa;

    const EXAMPLE: &str = include_str!("../example.yaml");

    fn errors_of(yaml: &str) -> Vec<String> {
        let raw: RawConfig = serde_yaml::from_str(yaml).expect("parses");
        match Config::from_raw(raw) {
            Ok(_) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
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
    fn example_yaml_parses_into_enums_durations_and_a_parsed_url() {
        let config = from_yaml(EXAMPLE).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config.resync_interval, DEFAULT_RESYNC);
        let bundle = &config.bundles[0];
        assert_eq!(bundle.name, "kcp-root-ca");
        let key = |key: &str| KeyRef { namespace: "kcp-system".into(), name: "root-server-ca".into(), key: key.into() };
        assert_eq!(bundle.sources, [Source::Secret(key("tls.crt")), Source::Secret(key("ca.crt"))]);
        let target = &bundle.targets[0];
        assert_eq!(target.kind, TargetKind::Secret);
        assert_eq!((target.name.as_str(), target.key.as_str()), ("kcp-ca", "ca.crt"));
        assert_eq!(target.placement, Placement::Namespace("railgrid-system".into()));
        assert!(matches!(&bundle.targets[1].placement, Placement::Selector(s) if !s.labels.is_empty()));
        assert!(bundle.drop_expired);
        let live = &bundle.live_check.as_ref().expect("liveCheck").endpoints;
        let endpoint = |i: usize| (live[i].address.as_str(), live[i].server_name.to_str().into_owned());
        assert_eq!(endpoint(0), ("frontproxy-front-proxy.kcp-system.svc.cluster.local:6443", "kcp.example.com".into()));
        assert_eq!(endpoint(1), ("kcp-root.example.com:6443", "kcp-root.example.com".into()));
        assert_eq!(endpoint(2), ("kcp-alpha.example.com:6443", "kcp-alpha.example.com".into()));
        let kubev = &config.bundles[1].live_check.as_ref().expect("liveCheck").endpoints[0];
        assert_eq!(
            (kubev.address.as_str(), &kubev.server_name),
            ("kcp.example.com:443", &ServerName::try_from("kcp.example.com").unwrap())
        );
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let config = from_yaml(MINIMAL).expect("valid");
        let bundle = &config.bundles[0];
        assert!(bundle.drop_expired, "dropExpired defaults to true");
        assert!(!bundle.empty_means_public_roots);
        assert_eq!(bundle.rotation_grace, None);
        assert!(bundle.live_check.is_none());
        assert!(!bundle.targets[0].adopt);
    }

    #[test]
    fn resync_interval_is_a_duration_of_at_least_a_second() {
        let config = from_yaml(&format!("resyncInterval: 5s\n{MINIMAL}")).expect("valid");
        assert_eq!(config.resync_interval, Duration::from_secs(5));
        assert_eq!(errors_of(&format!("resyncInterval: 500ms\n{MINIMAL}")), ["resyncInterval: must be at least 1s"]);
        assert_eq!(errors_of(&format!("resyncInterval: soon\n{MINIMAL}")).len(), 1);
    }

    #[test]
    fn ipv6_live_check_connects_bracketed_and_verifies_the_bare_address() {
        let config = from_yaml(&format!("{MINIMAL}    liveCheck: {{url: \"https://[::1]:8443\"}}\n")).expect("valid");
        let live = config.bundles[0].live_check.clone().expect("liveCheck").endpoints.remove(0);
        assert_eq!(live.address, "[::1]:8443");
        assert_eq!(live.server_name, ServerName::try_from("::1").unwrap());
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
        let sources = &config.bundles[0].sources;
        assert!(matches!(
            sources[..],
            [Source::Secret(_), Source::ConfigMap(_), Source::File(_), Source::PublicRoots, Source::PublicRoots]
        ));
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
    fn match_expressions_render_as_a_label_selector_and_need_a_requirement_that_selects() {
        let target = |selector: &str| {
            format!("{MINIMAL}      - secret: {{name: t, key: ca.crt, namespaceSelector: {selector}}}\n")
        };
        let config = from_yaml(&target(
            "{matchLabels: {team: a}, matchExpressions: [{key: tier, operator: In, values: [staging, prod]}, {key: opt-out, operator: DoesNotExist}, {key: env, operator: NotIn, values: [dev]}, {key: kcp, operator: Exists}]}",
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let Placement::Selector(selector) = &config.bundles[0].targets[1].placement else { panic!("a selector") };
        assert_eq!(selector.label_selector(), "team=a,tier in (prod,staging),!opt-out,env notin (dev),kcp");
        let only = from_yaml(&target("{matchExpressions: [{key: tier, operator: In, values: [prod]}]}"));
        assert!(only.is_ok(), "In alone selects");
        let cases = [
            (
                "{matchExpressions: [{key: tier, operator: NotIn, values: [dev]}]}",
                "matchLabels: must name at least one label",
            ),
            ("{matchExpressions: [{key: tier, operator: In}]}", "matchExpressions[0].values: In and NotIn need"),
            (
                "{matchExpressions: [{key: tier, operator: Exists, values: [x]}, {key: a, operator: Exists}]}",
                "matchExpressions[0].values: Exists and DoesNotExist take no values",
            ),
            ("{matchExpressions: [{key: -bad, operator: Exists}]}", "matchExpressions[0].key"),
            ("{matchExpressions: [{key: t, operator: In, values: [\"a b\"]}]}", "matchExpressions[0].values[0]"),
        ];
        for (selector, expected) in cases {
            let errors = errors_of(&target(selector));
            let expected = format!("bundles[0].targets[1].secret.namespaceSelector.{expected}");
            assert!(errors.len() == 1 && errors[0].starts_with(&expected), "{selector}: {errors:?}");
        }
        let err = from_yaml(&target("{matchExpressions: [{key: t, operator: Equals, values: [a]}]}")).unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }), "an unknown operator is refused: {err}");
    }

    #[test]
    fn target_metadata_keys_are_checked_and_kcp_keepers_own_are_refused() {
        let yaml = MINIMAL.replace(
            "name: kcp-ca, key: ca.crt}\n",
            "name: kcp-ca, key: ca.crt, metadata: {labels: {team: platform, \"bad key!\": x, app.kubernetes.io/managed-by: me}, annotations: {ca-syncer.kcp-keeper.io/rotation-state: x, note: \"any text at all\"}}}\n",
        );
        let errors = errors_of(&yaml);
        let prefix = "bundles[0].targets[0].secret.metadata.";
        let expected = [
            "labels[\"app.kubernetes.io/managed-by\"]: is written by kcp-keeper itself",
            "labels[\"bad key!\"]: key",
            "annotations[\"ca-syncer.kcp-keeper.io/rotation-state\"]: is written by kcp-keeper itself",
        ];
        for e in expected {
            assert!(errors.iter().any(|got| got.starts_with(&format!("{prefix}{e}"))), "{e} in {errors:?}");
        }
        assert_eq!(errors.len(), expected.len(), "{errors:?}");
        let fine = MINIMAL.replace(
            "name: kcp-ca, key: ca.crt}\n",
            "name: kcp-ca, key: ca.crt, metadata: {labels: {team: platform}}}\n",
        );
        let config = from_yaml(&fine).expect("valid");
        assert_eq!(config.bundles[0].targets[0].metadata.labels["team"], "platform");
    }

    #[test]
    fn object_sources_by_selector_or_name_take_one_key_or_all_and_every_mistake_is_named() {
        let with = |source: &str| {
            MINIMAL.replace("secret: {namespace: kcp-system, name: root-server-ca, key: ca.crt}", source)
        };
        let config = from_yaml(&with(
            "configMap: {namespace: trust, selector: {matchLabels: {ca: 'yes'}}, includeAllKeys: true}",
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let Source::Selected(selection) = &config.bundles[0].sources[0] else { panic!("a selection") };
        assert_eq!(
            (selection.kind, selection.namespace.as_str(), &selection.keys),
            (TargetKind::ConfigMap, "trust", &Keys::All)
        );
        assert!(matches!(&selection.pick, Pick::Labels(s) if s.label_selector() == "ca=yes"));
        let named_all =
            from_yaml(&with("secret: {namespace: trust, name: roots, includeAllKeys: true}")).expect("valid");
        assert!(
            matches!(&named_all.bundles[0].sources[0], Source::Selected(Selection { pick: Pick::Name(n), keys: Keys::All, .. }) if n == "roots")
        );
        let by_key = from_yaml(&with("secret: {namespace: trust, selector: {matchLabels: {ca: 'yes'}}, key: ca.crt}"))
            .expect("valid");
        assert!(
            matches!(&by_key.bundles[0].sources[0], Source::Selected(Selection { keys: Keys::One(k), .. }) if k == "ca.crt")
        );
        let cases = [
            (
                "secret: {namespace: trust, key: ca.crt}",
                "bundles[0].sources[0].secret: must set exactly one of name, selector",
            ),
            (
                "secret: {namespace: trust, name: a, selector: {matchLabels: {a: b}}, key: ca.crt}",
                "bundles[0].sources[0].secret: must set exactly one of name, selector; has both",
            ),
            (
                "secret: {namespace: trust, name: a}",
                "bundles[0].sources[0].secret: must set exactly one of key, includeAllKeys",
            ),
            (
                "configMap: {namespace: trust, name: a, key: ca.crt, includeAllKeys: true}",
                "bundles[0].sources[0].configMap: must set exactly one of key, includeAllKeys; has both",
            ),
            (
                "secret: {namespace: trust, selector: {matchLabels: {a: b}}, key: tls.key}",
                "bundles[0].sources[0].secret.key: names a private key",
            ),
            (
                "secret: {namespace: trust, selector: {matchExpressions: [{key: a, operator: DoesNotExist}]}, key: ca.crt}",
                "bundles[0].sources[0].secret.selector.matchLabels: must name at least one label",
            ),
            (
                "secret: {namespace: Trust, selector: {matchLabels: {a: b}}, key: ca.crt}",
                "bundles[0].sources[0].secret.namespace",
            ),
        ];
        for (source, expected) in cases {
            let errors = errors_of(&with(source));
            assert!(errors.len() == 1 && errors[0].starts_with(expected), "{source}: {errors:?}");
        }
    }

    #[test]
    fn a_cluster_trust_bundle_target_is_named_for_its_signer_and_never_empty() {
        let with = |target: &str| format!("{MINIMAL}      - clusterTrustBundle: {target}\n");
        let config = from_yaml(&with("{name: \"kcp-keeper.io:kcp-ca:v1\", signerName: kcp-keeper.io/kcp-ca}"))
            .unwrap_or_else(|e| panic!("{e}"));
        let target = &config.bundles[0].targets[1];
        assert_eq!((target.kind, target.key.as_str()), (TargetKind::ClusterTrustBundle, TRUST_BUNDLE_KEY));
        assert_eq!(
            (&target.placement, target.signer_name.as_deref()),
            (&Placement::Cluster, Some("kcp-keeper.io/kcp-ca"))
        );
        assert!(from_yaml(&with("{name: kcp-root-ca}")).is_ok(), "no signer, no colon");
        let cases = [
            (
                "{name: \"other:kcp-ca:v1\", signerName: kcp-keeper.io/kcp-ca}",
                "clusterTrustBundle.name: must start with \"kcp-keeper.io:kcp-ca:\"",
            ),
            (
                "{name: \"kcp-keeper.io:kcp-ca:\", signerName: kcp-keeper.io/kcp-ca}",
                "clusterTrustBundle.name: must start with",
            ),
            ("{name: \"a:b\"}", "clusterTrustBundle.name: must not contain ':' without a signerName"),
            ("{name: \"x:y:z\", signerName: no-slash}", "clusterTrustBundle.signerName: must be <domain>/<path>"),
        ];
        for (target, expected) in cases {
            let errors = errors_of(&with(target));
            let expected = format!("bundles[0].targets[1].{expected}");
            assert!(errors.iter().any(|e| e.starts_with(&expected)), "{target}: {errors:?}");
        }
        let both = with("{name: kcp-root-ca}").replace(
            "      - clusterTrustBundle",
            "        configMap: {namespace: a, name: b, key: c}\n      - clusterTrustBundle",
        );
        let errors = errors_of(&both);
        assert!(
            errors
                .iter()
                .any(|e| e
                    .contains("must set exactly one of secret, configMap, clusterTrustBundle; has secret, configMap")),
            "{errors:?}"
        );
        let empty = format!(
            "{}    emptyMeansPublicRoots: true\n    liveCheck: {{url: https://kcp.example.com}}\n",
            with("{name: kcp-root-ca}")
        );
        assert_eq!(
            errors_of(&empty),
            [
                "bundles[0].targets[1].clusterTrustBundle: cannot go with emptyMeansPublicRoots: a ClusterTrustBundle must hold at least one certificate"
            ]
        );
    }

    #[test]
    fn restart_consumers_are_named_in_one_namespace_and_every_mistake_has_its_path() {
        let config = from_yaml(
            "bundles:\n- name: kcp\n  sources: [{secret: {namespace: a, name: ca, key: ca.crt}}]\n  targets:\n  - {configMap: {namespace: hub, name: kcp-ca, key: ca.crt, restartDeployments: [hub], restartStatefulSets: [db], restartDaemonSets: [agent], restartWindow: {cron: \"0 2 * * *\", duration: 2h}}}\n",
        )
        .expect("valid");
        let target = &config.bundles[0].targets[0];
        let kinds: Vec<_> = target.consumers.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, kcp_keeper_runtime::consumer_restart::Kind::ALL);
        assert!(target.restart_window.is_some());
        let long = "b".repeat(crate::consumers::MAX_BUNDLE_NAME + 1);
        let errors = errors_of(&format!(
            "bundles:\n- name: {long}\n  sources: [{{secret: {{namespace: a, name: ca, key: ca.crt}}}}]\n  targets:\n  - {{configMap: {{namespaceSelector: {{matchLabels: {{a: b}}}}, name: t, key: ca.crt, restartDeployments: [Bad_Name, web, web], restartWindow: {{cron: \"not cron\", duration: 0s}}}}}}\n  - {{secret: {{namespace: hub, name: t, key: ca.crt, restartDaemonSets: [agent]}}}}\n"
        ));
        for expected in [
            "bundles[0].name: at most 43 characters",
            "bundles[0].targets[0].configMap.restartDeployments[0]:",
            "bundles[0].targets[0].configMap.restartDeployments[2]: named twice",
            "bundles[0].targets[0].configMap.restartWindow.duration: must be more than 0",
            "bundles[0].targets[0].configMap.restartWindow: cron:",
            "bundles[0].targets[0].configMap: restartDeployments, restartStatefulSets, restartDaemonSets and restartWindow need `namespace`",
        ] {
            assert!(errors.iter().any(|e| e.starts_with(expected)), "{expected} not in {errors:#?}");
        }
    }

    #[test]
    fn a_pkcs12_password_outside_printable_ascii_is_refused_naming_its_field_never_the_password() {
        let with = |formats: &str| {
            MINIMAL.replace(
                "name: kcp-ca, key: ca.crt}\n",
                &format!("name: kcp-ca, key: ca.crt, additionalFormats: {formats}}}\n"),
            )
        };
        for password in ["pässwörd", "パスワード", "tab\\there", "nul\\0x"] {
            let errors = errors_of(&with(&format!("{{pkcs12: {{key: t.p12, password: \"{password}\"}}}}")));
            assert_eq!(errors.len(), 1, "{password}: {errors:?}");
            assert!(
                errors[0].starts_with(
                    "bundles[0].targets[0].secret.additionalFormats.pkcs12.password: must be printable ASCII"
                ) && errors[0].contains("Java's keytool and JSSE cannot open"),
                "{password}: {errors:?}"
            );
            let echoed = ["wörd", "パスワード", "tab\t", "nul\0"].iter().any(|p| errors[0].contains(p));
            assert!(!echoed, "the password is never echoed: {errors:?}");
        }
        let ascii = from_yaml(&with(
            "{pkcs12: {key: t.p12, password: \"Printable ASCII, space to ~: !#$%&()*+-./:;<=>?@[]^_`{|}~\"}}",
        ));
        assert!(ascii.is_ok(), "{ascii:?}");
        // JKS has no such limit in Java: only PKCS#12 is refused.
        assert!(from_yaml(&with("{jks: {key: t.jks, password: \"pässwörd\"}}")).is_ok());
        // A password read from a Secret goes through the same check.
        assert!(check_password(Format::Pkcs12, "pässwörd").unwrap_err().contains("printable ASCII"));
        assert_eq!(check_password(Format::Pkcs12, ""), Ok(()));
    }

    #[test]
    fn additional_formats_take_trust_managers_defaults_and_every_mistake_is_named_without_the_password() {
        let with = |formats: &str| {
            MINIMAL.replace(
                "name: kcp-ca, key: ca.crt}\n",
                &format!("name: kcp-ca, key: ca.crt, additionalFormats: {formats}}}\n"),
            )
        };
        let config = from_yaml(&with(
            "{jks: {key: truststore.jks}, pkcs12: {key: truststore.p12, passwordSecretRef: {namespace: a, name: p, key: password}}}",
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let formats = &config.bundles[0].targets[0].formats;
        assert_eq!(
            formats,
            &[
                AdditionalFormat {
                    format: Format::Jks,
                    key: "truststore.jks".into(),
                    password: PasswordFrom::Inline(DEFAULT_JKS_PASSWORD.into())
                },
                AdditionalFormat {
                    format: Format::Pkcs12,
                    key: "truststore.p12".into(),
                    password: PasswordFrom::Secret { namespace: "a".into(), name: "p".into(), key: "password".into() }
                },
            ]
        );
        let passwordless = from_yaml(&with("{pkcs12: {key: t.p12, profile: Modern2023}}")).expect("valid");
        assert_eq!(passwordless.bundles[0].targets[0].formats[0].password, PasswordFrom::Inline(String::new()));
        assert_eq!(format!("{:?}", PasswordFrom::Inline("hunter2".into())), "Inline(<redacted>)");

        let long = "p".repeat(MAX_PASSWORD + 1);
        let cases = [
            ("{jks: {key: ca.crt}}", "additionalFormats.jks.key: must differ from the target's key"),
            ("{jks: {key: t}, pkcs12: {key: t}}", "additionalFormats.pkcs12.key: must differ from jks.key"),
            ("{jks: {key: t, password: \"\"}}", "additionalFormats.jks.password: must not be empty for JKS"),
            (
                &format!("{{pkcs12: {{key: t, password: {long}}}}}"),
                "additionalFormats.pkcs12.password: must be at most 128",
            ),
            (
                "{pkcs12: {key: t, password: x, passwordSecretRef: {namespace: a, name: p, key: k}}}",
                "additionalFormats.pkcs12: must set at most one of password, passwordSecretRef",
            ),
            (
                "{pkcs12: {key: t, password: abc, profile: LegacyRC2}}",
                "additionalFormats.pkcs12.profile: only Modern2023",
            ),
            ("{pkcs12: {key: t, profile: LegacyDES}}", "additionalFormats.pkcs12.profile: only Modern2023"),
            ("{jks: {key: \"a/b\"}}", "additionalFormats.jks.key: must consist of"),
            (
                "{jks: {key: t, passwordSecretRef: {namespace: A, name: p, key: k}}}",
                "additionalFormats.jks.passwordSecretRef.namespace",
            ),
        ];
        for (formats, expected) in cases {
            let errors = errors_of(&with(formats));
            let expected = format!("bundles[0].targets[0].secret.{expected}");
            assert!(errors.len() == 1 && errors[0].starts_with(&expected), "{formats}: {errors:?}");
            assert!(!errors[0].contains(&long), "the password is never echoed");
        }
        // A format key another target (of this bundle or another) writes is caught like a PEM key.
        let clash = format!(
            "{}      - secret: {{namespace: railgrid-system, name: kcp-ca, key: truststore.jks}}\n",
            with("{jks: {key: truststore.jks}}")
        );
        assert_eq!(errors_of(&clash), ["bundles[0].targets[1]: duplicate of bundles[0].targets[0]"]);
        let ctb = format!(
            "{MINIMAL}      - clusterTrustBundle: {{name: kcp-root-ca, additionalFormats: {{jks: {{key: t.jks}}}}}}\n"
        );
        assert_eq!(
            errors_of(&ctb),
            [
                "bundles[0].targets[1].clusterTrustBundle.additionalFormats: a ClusterTrustBundle holds PEM only (spec.trustBundle); write JKS or PKCS#12 to a Secret or ConfigMap target"
            ]
        );
        let empty = format!(
            "{}    emptyMeansPublicRoots: true\n    liveCheck: {{url: https://kcp.example.com}}\n",
            with("{pkcs12: {key: t.p12}}")
        );
        assert!(
            errors_of(&empty)[0]
                .starts_with("bundles[0].targets[0]: additionalFormats cannot go with emptyMeansPublicRoots")
        );
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
            assert_eq!(config.bundles[0].rotation_grace, Some(Duration::from_secs(expected)));
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
    fn live_check_endpoints_each_carry_their_own_server_name_and_the_single_url_form_stays() {
        let yaml = format!(
            "{MINIMAL}    liveCheck:\n      endpoints:\n      - {{url: \"https://10.0.0.1:6443\", serverName: kcp-root.example.com}}\n      - {{url: \"https://kcp-alpha.example.com:6443\"}}\n"
        );
        let config = from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}"));
        let endpoints = &config.bundles[0].live_check.as_ref().expect("liveCheck").endpoints;
        let names: Vec<_> = endpoints.iter().map(|e| (e.url.as_str(), e.server_name.to_str().into_owned())).collect();
        assert_eq!(
            names,
            [
                ("https://10.0.0.1:6443", "kcp-root.example.com".to_string()),
                ("https://kcp-alpha.example.com:6443", "kcp-alpha.example.com".to_string())
            ]
        );
        let single =
            from_yaml(&format!("{MINIMAL}    liveCheck: {{url: \"https://kcp.example.com\"}}\n")).expect("valid");
        assert_eq!(single.bundles[0].live_check.as_ref().map(|l| l.endpoints.len()), Some(1));
    }

    #[test]
    fn live_check_endpoint_mistakes_are_named_by_their_path() {
        let cases = [
            ("{}", "bundles[0].liveCheck: must set one of url, endpoints"),
            ("{endpoints: []}", "bundles[0].liveCheck: must set one of url, endpoints"),
            (
                "{url: \"https://a.example.com\", endpoints: [{url: \"https://b.example.com\"}]}",
                "bundles[0].liveCheck: must set exactly one of url, endpoints; has both",
            ),
            (
                "{serverName: a.example.com, endpoints: [{url: \"https://b.example.com\"}]}",
                "bundles[0].liveCheck.serverName: goes with url",
            ),
            (
                "{endpoints: [{url: \"https://b.example.com\"}, {url: \"https://b.example.com\"}]}",
                "bundles[0].liveCheck.endpoints[1].url: duplicate of an earlier endpoint",
            ),
            (
                "{endpoints: [{url: \"https://ok.example.com\"}, {url: \"http://b\"}]}",
                "bundles[0].liveCheck.endpoints[1].url: must be an https:// URL",
            ),
            (
                "{endpoints: [{url: \"https://b\", serverName: \"not a host\"}]}",
                "bundles[0].liveCheck.endpoints[0].serverName: must be a DNS hostname or an IP address",
            ),
        ];
        for (live, expected) in cases {
            let errors = errors_of(&format!("{MINIMAL}    liveCheck: {live}\n"));
            assert!(errors.len() == 1 && errors[0].starts_with(expected), "{live}: {errors:?}");
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
