//! Where a bundle is written: `targets[]`, each a Secret or ConfigMap key in one namespace or in every
//! namespace a selector matches; and the object keys sources read and targets write, to find two that
//! would fight over one.

use std::collections::BTreeMap;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::names;
use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TargetKind {
    Secret,
    ConfigMap,
}

impl TargetKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            TargetKind::Secret => "Secret",
            TargetKind::ConfigMap => "ConfigMap",
        }
    }

    /// The key naming this kind in the file (`secret`, `configMap`).
    pub(super) fn field(&self) -> &'static str {
        match self {
            TargetKind::Secret => "secret",
            TargetKind::ConfigMap => "configMap",
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
}

/// Labels and annotations of a target object, as configured (keys checked).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TargetMetadata {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Namespace(String),
    /// At least one requirement that selects by presence (a `matchLabels` entry, `In` or `Exists`).
    Selector(Selector),
}

/// A namespace selector, validated: `matchLabels` and `matchExpressions`, all of which must hold.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Selector {
    pub labels: BTreeMap<String, String>,
    pub expressions: Vec<Requirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Selector {
    /// As a label selector string (`a=b,tier in (prod,staging),!opt-out`), for a watch: the labels sorted, then
    /// the expressions in the configured order, each one's values sorted.
    pub fn label_selector(&self) -> String {
        let labels = self.labels.iter().map(|(k, v)| format!("{k}={v}"));
        let set = |values: &[String]| {
            let mut values = values.to_vec();
            values.sort();
            values.dedup();
            values.join(",")
        };
        let expressions = self.expressions.iter().map(|r| match r {
            Requirement::In(k, values) => format!("{k} in ({})", set(values)),
            Requirement::NotIn(k, values) => format!("{k} notin ({})", set(values)),
            Requirement::Exists(k) => k.clone(),
            Requirement::DoesNotExist(k) => format!("!{k}"),
        });
        labels.chain(expressions).collect::<Vec<_>>().join(",")
    }
}

/// One target: exactly one of `secret` / `configMap`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawTarget {
    /// Write the bundle into a key of a Secret.
    #[serde(default)]
    pub secret: Option<RawTargetObject>,
    /// Write the bundle into a key of a ConfigMap.
    #[serde(default)]
    pub config_map: Option<RawTargetObject>,
    /// Take over an existing object (or key) kcp-keeper did not create; without it such a target is left
    /// alone and reported.
    #[serde(default)]
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
    pub metadata: Option<RawTargetMetadata>,
}

/// Labels and annotations of a target object.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawTargetMetadata {
    /// Labels (valid label keys and values).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Annotations (valid annotation keys).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// Namespaces by their labels, as a Kubernetes label selector: every `matchLabels` entry and every
/// `matchExpressions` requirement must hold.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamespaceSelector {
    /// Labels a namespace must all carry.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements on a namespace's labels. The selector needs at least one entry that selects by presence (a
    /// `matchLabels` entry, `In` or `Exists`): one of only `NotIn`/`DoesNotExist` would select nearly every
    /// namespace, kube-system included.
    #[serde(default)]
    pub match_expressions: Vec<RawRequirement>,
}

/// One requirement on a namespace's labels.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawRequirement {
    /// The label key.
    pub key: String,
    pub operator: Operator,
    /// For `In` and `NotIn`: at least one value; for `Exists` and `DoesNotExist`: none.
    #[serde(default)]
    pub values: Vec<String>,
}

/// How a requirement relates the key to its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
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

/// Records `result`'s reason, if any, under `path`.
pub(super) fn check(errors: &mut Vec<FieldError>, path: String, result: Result<(), String>) {
    if let Err(reason) = result {
        errors.push(FieldError::new(path, reason));
    }
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

/// The validated target and the object key it writes.
pub(super) fn target_from_raw<'a>(
    target: &'a RawTarget,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Option<(Target, Destination<'a>)> {
    let (kind, object) = match (&target.secret, &target.config_map) {
        (Some(object), None) => (TargetKind::Secret, object),
        (None, Some(object)) => (TargetKind::ConfigMap, object),
        (Some(_), Some(_)) => {
            errors.push(FieldError::new(path, "must set exactly one of secret, configMap; has both"));
            return None;
        }
        (None, None) => {
            errors.push(FieldError::new(path, "must set one of secret, configMap"));
            return None;
        }
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
            let selector = selector_from_raw(selector, &format!("{path}.namespaceSelector"), errors);
            (Placement::Selector(selector), None)
        }
        (namespace, _) => {
            let has = if namespace.is_some() { "; has both" } else { "" };
            errors.push(FieldError::new(path, format!("must set exactly one of namespace, namespaceSelector{has}")));
            return None;
        }
    };
    let metadata = metadata_from_raw(object.metadata.as_ref(), &format!("{path}.metadata"), errors);
    let destination = Destination { kind, namespace, name: &object.name, key: &object.key };
    let target =
        Target { kind, name: object.name.clone(), key: object.key.clone(), placement, adopt: target.adopt, metadata };
    // Returned even when a name or key is malformed, so conflicts with it are reported too; the bundle is
    // refused because of the errors recorded.
    Some((target, destination))
}

/// Keys kcp-keeper writes itself: configuring them would fight the agent's own bookkeeping.
const RESERVED_PREFIXES: [&str; 2] = ["kcp-keeper.io/", "ca-syncer.kcp-keeper.io/"];
const RESERVED_KEYS: [&str; 1] = ["app.kubernetes.io/managed-by"];

fn metadata_from_raw(raw: Option<&RawTargetMetadata>, path: &str, errors: &mut Vec<FieldError>) -> TargetMetadata {
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
    TargetMetadata { labels: raw.labels.clone(), annotations: raw.annotations.clone() }
}

pub(super) fn selector_from_raw(selector: &NamespaceSelector, path: &str, errors: &mut Vec<FieldError>) -> Selector {
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
    let mut expressions = Vec::new();
    for (i, raw) in selector.match_expressions.iter().enumerate() {
        let path = format!("{path}.matchExpressions[{i}]");
        check(errors, format!("{path}.key"), names::check_label_key(&raw.key));
        for (j, value) in raw.values.iter().enumerate() {
            check(errors, format!("{path}.values[{j}]"), names::check_label_value(value));
        }
        let key = raw.key.clone();
        let values = raw.values.clone();
        match raw.operator {
            Operator::In | Operator::NotIn if values.is_empty() => {
                errors.push(FieldError::new(format!("{path}.values"), "In and NotIn need at least one value"));
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                errors.push(FieldError::new(format!("{path}.values"), "Exists and DoesNotExist take no values"));
            }
            Operator::In => expressions.push(Requirement::In(key, values)),
            Operator::NotIn => expressions.push(Requirement::NotIn(key, values)),
            Operator::Exists => expressions.push(Requirement::Exists(key)),
            Operator::DoesNotExist => expressions.push(Requirement::DoesNotExist(key)),
        }
    }
    let selects = !selector.match_labels.is_empty()
        || selector.match_expressions.iter().any(|r| matches!(r.operator, Operator::In | Operator::Exists));
    if !selects {
        errors.push(FieldError::new(
            format!("{path}.matchLabels"),
            "must name at least one label (or a matchExpressions entry with In or Exists); an empty selector, or one of only NotIn and DoesNotExist, would select nearly everything (every namespace, kube-system included)",
        ));
    }
    Selector { labels: selector.match_labels.clone(), expressions }
}
