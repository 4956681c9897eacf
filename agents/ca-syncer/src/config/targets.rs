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
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Namespace(String),
    /// `matchLabels`, at least one.
    Selector(BTreeMap<String, String>),
}

impl Placement {
    /// The selector as a label selector string (`a=b,c=d`), for a watch.
    pub fn label_selector(labels: &BTreeMap<String, String>) -> String {
        labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
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
    /// Write in every namespace these labels select.
    #[serde(default)]
    pub namespace_selector: Option<NamespaceSelector>,
}

/// Namespaces by their labels.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamespaceSelector {
    /// Labels a namespace must all carry; at least one (an empty selector would select every namespace,
    /// kube-system included).
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
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
            validate_selector(selector, &format!("{path}.namespaceSelector"), errors);
            (Placement::Selector(selector.match_labels.clone()), None)
        }
        (namespace, _) => {
            let has = if namespace.is_some() { "; has both" } else { "" };
            errors.push(FieldError::new(path, format!("must set exactly one of namespace, namespaceSelector{has}")));
            return None;
        }
    };
    let destination = Destination { kind, namespace, name: &object.name, key: &object.key };
    let target = Target { kind, name: object.name.clone(), key: object.key.clone(), placement, adopt: target.adopt };
    // Returned even when a name or key is malformed, so conflicts with it are reported too; the bundle is
    // refused because of the errors recorded.
    Some((target, destination))
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
