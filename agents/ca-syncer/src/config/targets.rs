//! Where a bundle is written: `targets[]`, each a Secret or ConfigMap key in one namespace or in every
//! namespace a selector matches; and the object keys sources read and targets write, to find two that
//! would fight over one.

use std::collections::BTreeMap;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::consumer_restart::{Consumer, Kind as ConsumerKind, RawRestartWindow, RestartWindow};
pub use kcp_keeper_runtime::label_selector::{NamespaceSelector, Selector};
use kcp_keeper_runtime::names;
use schemars::JsonSchema;
use serde::Deserialize;

use super::field::{check, exactly_one};
use super::formats::{AdditionalFormat, RawAdditionalFormats, formats_from_raw};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, strum::IntoStaticStr)]
pub enum TargetKind {
    Secret,
    ConfigMap,
    /// Cluster-scoped (certificates.k8s.io/v1): a target only, never a source.
    ClusterTrustBundle,
}

impl TargetKind {
    /// The object's kind (`Secret`, `ConfigMap`).
    pub fn as_str(&self) -> &'static str {
        self.into()
    }

    /// The key naming this kind in the file (`secret`, `configMap`).
    pub(super) fn field(&self) -> &'static str {
        match self {
            TargetKind::Secret => "secret",
            TargetKind::ConfigMap => "configMap",
            TargetKind::ClusterTrustBundle => "clusterTrustBundle",
        }
    }
}

/// One object key the bundle is written to, in one namespace or in every namespace a selector matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub kind: TargetKind,
    pub name: String,
    pub key: String,
    pub placement: Placement,
    /// Take over an existing object (or key) that kcp-keeper did not create.
    pub adopt: bool,
    /// Labels and annotations the object carries (applied as ours, never over someone else's key).
    pub metadata: TargetMetadata,
    /// A ClusterTrustBundle's `spec.signerName`.
    pub signer_name: Option<String>,
    /// Read-once workloads in the target's (one, named) namespace, rolled when what the target holds changes.
    pub consumers: Vec<Consumer>,
    /// When the consumers may be rolled; `None`: at once.
    pub restart_window: Option<RestartWindow>,
    /// Trust stores written beside the PEM key, in other keys of the same object.
    pub formats: Vec<AdditionalFormat>,
}

/// The field of a ClusterTrustBundle the bundle is written to (its `key` for comparisons and metrics).
pub const TRUST_BUNDLE_KEY: &str = "trustBundle";

/// Labels and annotations of a target object.
// As written and as validated (`metadata_from_raw` checks the keys): one type, keeping the name the chart's
// values.schema.json gives its definition.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
#[schemars(rename = "RawTargetMetadata")]
pub struct TargetMetadata {
    /// Labels (valid label keys and values).
    pub labels: BTreeMap<String, String>,
    /// Annotations (valid annotation keys).
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Namespace(String),
    /// At least one requirement that selects by presence (a `matchLabels` entry, `In` or `Exists`).
    Selector(Selector),
    /// A cluster-scoped object (a ClusterTrustBundle).
    Cluster,
}

/// One target: exactly one of `secret` / `configMap`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RawTarget {
    /// Write the bundle into a key of a Secret.
    pub secret: Option<RawTargetObject>,
    /// Write the bundle into a key of a ConfigMap.
    pub config_map: Option<RawTargetObject>,
    /// Write the bundle into a ClusterTrustBundle's `spec.trustBundle` (certificates.k8s.io/v1), which pods
    /// project with `projected.sources[].clusterTrustBundle` without any Secret RBAC.
    pub cluster_trust_bundle: Option<RawClusterTrustBundle>,
    /// Take over an existing object (or key) kcp-keeper did not create; without it such a target is left
    /// alone and reported.
    pub adopt: bool,
}

/// The object a target writes: by name in one namespace, or in every namespace a selector matches (exactly
/// one of `namespace`, `namespaceSelector`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawTargetObject {
    /// The object's name (a DNS subdomain).
    pub name: String,
    /// The data key the bundle is written to; the object's other keys are left alone.
    pub key: String,
    /// The one namespace to write in.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Write in every namespace this selector selects.
    #[serde(default)]
    pub namespace_selector: Option<NamespaceSelector>,
    /// Labels and annotations the object gets (for GitOps tools and policy engines), applied as kcp-keeper's
    /// fields; a key someone else set to another value is left alone and reported.
    #[serde(default)]
    pub metadata: Option<TargetMetadata>,
    /// Deployments in `namespace` that read the bundle once at start: rolled (a pod-template annotation)
    /// once per real change of what this target holds. Only with `namespace`, not `namespaceSelector`.
    #[serde(default)]
    pub restart_deployments: Vec<String>,
    /// StatefulSets in `namespace` that read the bundle once at start: rolled once per real change.
    #[serde(default)]
    pub restart_stateful_sets: Vec<String>,
    /// DaemonSets in `namespace` that read the bundle once at start: rolled once per real change.
    #[serde(default)]
    pub restart_daemon_sets: Vec<String>,
    /// Roll the consumers only inside this window (default: at once), but never later than the earliest
    /// notAfter of the bundle they hold, nor than the end of the rotation overlap (when the previous CA leaves
    /// the bundle), minus the margin.
    #[serde(default)]
    pub restart_window: Option<RawRestartWindow>,
    /// The bundle also as a JKS and/or PKCS#12 trust store, in other keys of this object (trust-manager's
    /// `additionalFormats`; `binaryData` in a ConfigMap). Same certificates, same order as the PEM key.
    #[serde(default)]
    pub additional_formats: Option<RawAdditionalFormats>,
}

/// A ClusterTrustBundle target.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawClusterTrustBundle {
    /// The object's name. With `signerName`, it must start with the signer name, `/` written as `:`, and a
    /// `:` (for `kcp-keeper.io/kcp-ca`: `kcp-keeper.io:kcp-ca:<anything>`); without, it must not contain `:`.
    pub name: String,
    /// `spec.signerName` (`<domain>/<path>`): pods can then project every bundle of this signer by its name.
    /// Writing a bundle with a signer needs the `attest` verb on that signer (`ca-syncer rbac` grants it).
    #[serde(default)]
    pub signer_name: Option<String>,
    /// Labels and annotations the object gets, applied as kcp-keeper's fields.
    #[serde(default)]
    pub metadata: Option<TargetMetadata>,
    /// Not for a ClusterTrustBundle (it holds PEM only): refused with a reason. Taken as any value, so the
    /// refusal says why instead of "unknown field".
    #[serde(default)]
    pub additional_formats: Option<serde_json::Value>,
}

/// One place an object key is read or written, for finding two targets that would fight over it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Destination<'a> {
    pub(super) kind: TargetKind,
    /// `None`: wherever a selector matches.
    pub(super) namespace: Option<&'a str>,
    pub(super) name: &'a str,
    pub(super) key: &'a str,
}

/// Two destinations can be the same object key: same kind, name and key, and either the same namespace or a
/// selector that might match the other's namespace (a selector's matches are only known at run time).
pub(super) fn may_overlap(a: &Destination<'_>, b: &Destination<'_>) -> bool {
    a.kind == b.kind
        && a.name == b.name
        && a.key == b.key
        && match (a.namespace, b.namespace) {
            (Some(x), Some(y)) => x == y,
            _ => true,
        }
}

/// The validated target and the object keys it writes (the PEM key first, then each format's).
pub(super) fn target_from_raw<'a>(
    target: &'a RawTarget,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Option<(Target, Vec<Destination<'a>>)> {
    let keys = [
        ("secret", target.secret.is_some()),
        ("configMap", target.config_map.is_some()),
        ("clusterTrustBundle", target.cluster_trust_bundle.is_some()),
    ];
    if !exactly_one(path, &keys, errors) {
        return None;
    }
    if let Some(bundle) = &target.cluster_trust_bundle {
        return cluster_trust_bundle_from_raw(bundle, target.adopt, &format!("{path}.clusterTrustBundle"), errors);
    }
    let (kind, object) = match (&target.secret, &target.config_map) {
        (Some(object), _) => (TargetKind::Secret, object),
        (_, Some(object)) => (TargetKind::ConfigMap, object),
        (None, None) => return None,
    };
    let path = format!("{path}.{}", kind.field());
    check(errors, format!("{path}.name"), names::check_dns_subdomain(&object.name));
    check(errors, format!("{path}.key"), names::check_data_key(&object.key));
    let (placement, namespace) = match (&object.namespace, &object.namespace_selector) {
        (Some(namespace), None) => {
            check(errors, format!("{path}.namespace"), names::check_dns_label(namespace));
            (Placement::Namespace(namespace.clone()), Some(namespace.as_str()))
        }
        (None, Some(selector)) => {
            let selector = selector.validate(&format!("{path}.namespaceSelector"), errors);
            (Placement::Selector(selector), None)
        }
        (namespace, _) => {
            let has = if namespace.is_some() { "; has both" } else { "" };
            errors.push(FieldError::new(path, format!("must set exactly one of namespace, namespaceSelector{has}")));
            return None;
        }
    };
    let metadata = metadata_from_raw(object.metadata.as_ref(), &format!("{path}.metadata"), errors);
    let (consumers, restart_window) = consumers_from_raw(object, namespace.is_some(), &path, errors);
    let formats =
        formats_from_raw(object.additional_formats.as_ref(), &object.key, &format!("{path}.additionalFormats"), errors);
    let keys = std::iter::once(object.key.as_str()).chain(
        [object.additional_formats.as_ref().and_then(|f| f.jks.as_ref()).map(|j| j.key.as_str())]
            .into_iter()
            .chain([object.additional_formats.as_ref().and_then(|f| f.pkcs12.as_ref()).map(|p| p.key.as_str())])
            .flatten(),
    );
    let destinations = keys.map(|key| Destination { kind, namespace, name: &object.name, key }).collect();
    let target = Target {
        kind,
        name: object.name.clone(),
        key: object.key.clone(),
        placement,
        adopt: target.adopt,
        metadata,
        signer_name: None,
        consumers,
        restart_window,
        formats,
    };
    // Returned even when a name or key is malformed, so conflicts with it are reported too; the bundle is
    // refused because of the errors recorded.
    Some((target, destinations))
}

/// The target's read-once consumers and their window. Only a target in one named namespace may have them: the
/// consumers are granted by name in that namespace (a selector's namespaces are known only at run time).
fn consumers_from_raw(
    object: &RawTargetObject,
    named_namespace: bool,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> (Vec<Consumer>, Option<RestartWindow>) {
    let mut consumers: Vec<Consumer> = Vec::new();
    for (field, kind, list) in [
        ("restartDeployments", ConsumerKind::Deployment, &object.restart_deployments),
        ("restartStatefulSets", ConsumerKind::StatefulSet, &object.restart_stateful_sets),
        ("restartDaemonSets", ConsumerKind::DaemonSet, &object.restart_daemon_sets),
    ] {
        for (i, name) in list.iter().enumerate() {
            let at = format!("{path}.{field}[{i}]");
            check(errors, at.clone(), names::check_dns_subdomain(name));
            let consumer = Consumer { kind, name: name.clone() };
            if consumers.contains(&consumer) {
                errors.push(FieldError::new(at, "named twice"));
            } else {
                consumers.push(consumer);
            }
        }
    }
    let restart_window =
        object.restart_window.clone().and_then(|w| w.validate(&format!("{path}.restartWindow"), errors));
    if !named_namespace && (!consumers.is_empty() || object.restart_window.is_some()) {
        errors.push(FieldError::new(
            path,
            "restartDeployments, restartStatefulSets, restartDaemonSets and restartWindow need `namespace`, not \
             `namespaceSelector`",
        ));
    }
    (consumers, restart_window)
}

/// A ClusterTrustBundle target, named as the apiserver requires for its signer (or lack of one).
fn cluster_trust_bundle_from_raw<'a>(
    raw: &'a RawClusterTrustBundle,
    adopt: bool,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Option<(Target, Vec<Destination<'a>>)> {
    let name_path = format!("{path}.name");
    if raw.additional_formats.is_some() {
        errors.push(FieldError::new(
            format!("{path}.additionalFormats"),
            "a ClusterTrustBundle holds PEM only (spec.trustBundle); write JKS or PKCS#12 to a Secret or ConfigMap \
             target",
        ));
    }
    match &raw.signer_name {
        Some(signer) => {
            let valid = signer.split_once('/').is_some_and(|(domain, rest)| {
                names::check_dns_subdomain(domain).is_ok() && !rest.is_empty() && !rest.contains(':')
            });
            if !valid {
                errors.push(FieldError::new(
                    format!("{path}.signerName"),
                    "must be <domain>/<path> with a DNS subdomain as the domain (like kcp-keeper.io/kcp-ca)",
                ));
            }
            let prefix = format!("{}:", signer.replace('/', ":"));
            if !raw.name.starts_with(&prefix) || raw.name.len() == prefix.len() {
                errors.push(FieldError::new(
                    name_path.clone(),
                    format!("must start with {prefix:?} and go on after it (the signer name, / written as :)"),
                ));
            }
        }
        None if raw.name.contains(':') => {
            errors.push(FieldError::new(name_path.clone(), "must not contain ':' without a signerName"))
        }
        None => {}
    }
    // `:` is allowed in a ClusterTrustBundle's name; the rest must be a DNS subdomain.
    check(errors, name_path, names::check_dns_subdomain(&raw.name.replace(':', "-")));
    let metadata = metadata_from_raw(raw.metadata.as_ref(), &format!("{path}.metadata"), errors);
    let kind = TargetKind::ClusterTrustBundle;
    let destination = Destination { kind, namespace: None, name: &raw.name, key: TRUST_BUNDLE_KEY };
    let target = Target {
        kind,
        name: raw.name.clone(),
        key: TRUST_BUNDLE_KEY.to_string(),
        placement: Placement::Cluster,
        adopt,
        metadata,
        signer_name: raw.signer_name.clone(),
        consumers: Vec::new(),
        restart_window: None,
        formats: Vec::new(),
    };
    Some((target, vec![destination]))
}

/// Keys kcp-keeper writes itself: configuring them would fight the agent's own bookkeeping.
const RESERVED_PREFIXES: [&str; 2] = ["kcp-keeper.io/", "ca-syncer.kcp-keeper.io/"];
const RESERVED_KEYS: [&str; 1] = ["app.kubernetes.io/managed-by"];

fn metadata_from_raw(raw: Option<&TargetMetadata>, path: &str, errors: &mut Vec<FieldError>) -> TargetMetadata {
    let Some(raw) = raw else { return TargetMetadata::default() };
    let reserved = |key: &str| RESERVED_KEYS.contains(&key) || RESERVED_PREFIXES.iter().any(|p| key.starts_with(p));
    for (field, map) in [("labels", &raw.labels), ("annotations", &raw.annotations)] {
        for (key, value) in map {
            let path = format!("{path}.{field}[{key:?}]");
            check(errors, path.clone(), names::check_label_key(key).map_err(|r| format!("key {r}")));
            if reserved(key) {
                errors.push(FieldError::new(path.clone(), "is written by kcp-keeper itself"));
            }
            if field == "labels" {
                check(errors, path, names::check_label_value(value).map_err(|r| format!("value {r}")));
            }
        }
    }
    raw.clone()
}
