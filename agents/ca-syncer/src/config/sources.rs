//! Where a bundle's certificates come from: `sources[]`, each "exactly one of" `secret`, `configMap`,
//! `inline`, `file`, `publicRoots`. A `secret` or `configMap` names one object (`name`) or selects objects by
//! their labels in one namespace (`selector`), and reads one `key` or every key (`includeAllKeys`).

use std::path::PathBuf;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::names;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer};

use super::field::{check, exactly_one};
use super::targets::{Destination, NamespaceSelector, Selector, TargetKind};
use crate::certs::{self, Certificate, EmptyPolicy};

/// Where certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Secret(KeyRef),
    ConfigMap(KeyRef),
    /// Secrets or ConfigMaps by label selector, or one key of each (or every key of one object by name).
    Selected(Selection),
    /// Parsed at load, with the same strict parser as every other source.
    Inline(Vec<Certificate>),
    /// An absolute path, re-read every cycle.
    File(PathBuf),
    PublicRoots,
}

/// A key of a Secret or ConfigMap in a named namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyRef {
    /// The object's namespace (a DNS label).
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The data key holding the PEM certificates; a key ending in `.key` (a private key) is refused.
    pub key: String,
}

/// Objects of one kind in one namespace, by name or by label selector, and which of their keys to read.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Selection {
    pub kind: TargetKind,
    pub namespace: String,
    pub pick: Pick,
    pub keys: Keys,
}

/// Which objects a [`Selection`] reads.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pick {
    /// One object by name (with `includeAllKeys`).
    Name(String),
    /// Every object whose labels the selector matches.
    Labels(Selector),
}

/// Which keys of each object a [`Selection`] reads.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Keys {
    One(String),
    /// Every key, in key order; a key holding anything but certificates rejects the source whole.
    All,
}

/// A Secret or ConfigMap source as written: `namespace`, exactly one of `name` and `selector`, exactly one of
/// `key` and `includeAllKeys`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawObjectSource {
    /// The objects' namespace (a DNS label).
    pub namespace: String,
    /// One object, by name.
    #[serde(default)]
    pub name: Option<String>,
    /// Every object in the namespace whose labels this selector matches (`matchLabels`, `matchExpressions`); an
    /// object gaining or losing a label joins or leaves the bundle. Needs at least one entry that selects by
    /// presence.
    #[serde(default)]
    pub selector: Option<NamespaceSelector>,
    /// The data key holding PEM certificates; a key ending in `.key` (a private key) is refused.
    #[serde(default)]
    pub key: Option<String>,
    /// Read every key of each object (`data`, and a ConfigMap's `binaryData`): each must hold only
    /// certificates, so an object with a private key (a `kubernetes.io/tls` Secret's `tls.key`) rejects the
    /// source.
    #[serde(default)]
    pub include_all_keys: bool,
}

/// One source of certificates: exactly one of its keys is set. Every source is parsed strictly: only
/// CERTIFICATE blocks, and a source holding anything else is rejected whole.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RawSource {
    /// A key (or every key) of a Secret, or of every Secret a label selector matches in one namespace.
    pub secret: Option<RawObjectSource>,
    /// A key (or every key) of a ConfigMap (`data` or `binaryData`), or of every ConfigMap a label selector
    /// matches in one namespace.
    pub config_map: Option<RawObjectSource>,
    /// PEM certificates written into the configuration, checked at load time.
    pub inline: Option<String>,
    /// An absolute path to a PEM file, re-read every cycle (at most 4 MiB).
    pub file: Option<PathBuf>,
    /// `{}`: the public roots (Mozilla's list, compiled in).
    #[serde(deserialize_with = "present")]
    pub public_roots: Option<PublicRoots>,
}

/// `publicRoots: {}` has no options yet; the empty struct keeps the door open and refuses unknown ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PublicRoots {}

/// A present key with a null value (`publicRoots:`) counts as present: someone who wrote it meant it.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<PublicRoots>, D::Error> {
    Ok(Some(Option::<PublicRoots>::deserialize(deserializer)?.unwrap_or_default()))
}

/// The validated source and the object key it reads (when it reads one).
pub(super) fn source_from_raw<'a>(
    source: &'a RawSource,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Option<(Source, Option<Destination<'a>>)> {
    let keys = [
        ("secret", source.secret.is_some()),
        ("configMap", source.config_map.is_some()),
        ("inline", source.inline.is_some()),
        ("file", source.file.is_some()),
        ("publicRoots", source.public_roots.is_some()),
    ];
    if !exactly_one(path, &keys, errors) {
        return None;
    }
    for (kind, object) in [(TargetKind::Secret, &source.secret), (TargetKind::ConfigMap, &source.config_map)] {
        if let Some(object) = object {
            return object_source(object, kind, &format!("{path}.{}", kind.field()), errors);
        }
    }
    if let Some(text) = &source.inline {
        // The same strict parser as at run time: a key pasted into the configuration fails at start. The
        // error names the block, never its content.
        return match certs::parse_certificates(text.as_bytes(), EmptyPolicy::Reject) {
            Ok(certs) => Some((Source::Inline(certs), None)),
            Err(err) => {
                errors.push(FieldError::new(format!("{path}.inline"), err.to_string()));
                None
            }
        };
    }
    if let Some(file) = &source.file {
        if !file.is_absolute() {
            errors.push(FieldError::new(format!("{path}.file"), "must be an absolute path"));
            return None;
        }
        return Some((Source::File(file.clone()), None));
    }
    Some((Source::PublicRoots, None))
}

/// A `secret` or `configMap` source: by name and key stays a [`KeyRef`] (and reads the object key a target
/// must not write); anything else is a [`Selection`].
fn object_source<'a>(
    object: &'a RawObjectSource,
    kind: TargetKind,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Option<(Source, Option<Destination<'a>>)> {
    let before = errors.len();
    check(errors, format!("{path}.namespace"), names::check_dns_label(&object.namespace));
    let pick = match (&object.name, &object.selector) {
        (Some(name), None) => {
            check(errors, format!("{path}.name"), names::check_dns_subdomain(name));
            Pick::Name(name.clone())
        }
        (None, Some(selector)) => Pick::Labels(selector.validate(&format!("{path}.selector"), errors)),
        (name, _) => {
            let has = if name.is_some() { "; has both" } else { "" };
            errors.push(FieldError::new(path, format!("must set exactly one of name, selector{has}")));
            return None;
        }
    };
    let keys = match (&object.key, object.include_all_keys) {
        (Some(key), false) => {
            check(errors, format!("{path}.key"), names::check_data_key(key));
            if key.ends_with(".key") {
                errors.push(FieldError::new(
                    format!("{path}.key"),
                    "names a private key (like tls.key); ca-syncer copies certificates only, use tls.crt or ca.crt",
                ));
            }
            Keys::One(key.clone())
        }
        (None, true) => Keys::All,
        (key, _) => {
            let has = if key.is_some() { "; has both" } else { "" };
            errors.push(FieldError::new(path, format!("must set exactly one of key, includeAllKeys{has}")));
            return None;
        }
    };
    if errors.len() != before {
        return None;
    }
    let namespace = object.namespace.clone();
    match (pick, keys, &object.name, &object.key) {
        (Pick::Name(name), Keys::One(key), Some(raw_name), Some(raw_key)) => {
            let destination = Destination { kind, namespace: Some(&object.namespace), name: raw_name, key: raw_key };
            let r = KeyRef { namespace, name, key };
            let source = if kind == TargetKind::Secret { Source::Secret(r) } else { Source::ConfigMap(r) };
            Some((source, Some(destination)))
        }
        (pick, keys, _, _) => Some((Source::Selected(Selection { kind, namespace, pick, keys }), None)),
    }
}
