//! Where a bundle's certificates come from: `sources[]`, each "exactly one of" `secret`, `configMap`,
//! `inline`, `file`, `publicRoots`.

use std::path::PathBuf;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::names;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer};

use super::targets::{Destination, TargetKind, check};
use crate::certs::{self, Certificate, EmptyPolicy};

/// Where certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Secret(KeyRef),
    ConfigMap(KeyRef),
    /// Parsed at load, with the same strict parser as every other source.
    Inline(Vec<Certificate>),
    /// An absolute path, re-read every cycle.
    File(PathBuf),
    PublicRoots,
}

/// A key of a Secret or ConfigMap in a named namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KeyRef {
    /// The object's namespace (a DNS label).
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The data key holding the PEM certificates; a key ending in `.key` (a private key) is refused.
    pub key: String,
}

/// One source of certificates: exactly one of its keys is set. Every source is parsed strictly: only
/// CERTIFICATE blocks, and a source holding anything else is rejected whole.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawSource {
    /// A key of a Secret.
    #[serde(default)]
    pub secret: Option<KeyRef>,
    /// A key of a ConfigMap (`data` or `binaryData`).
    #[serde(default)]
    pub config_map: Option<KeyRef>,
    /// PEM certificates written into the configuration, checked at load time.
    #[serde(default)]
    pub inline: Option<String>,
    /// An absolute path to a PEM file, re-read every cycle (at most 4 MiB).
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// `{}`: the public roots (Mozilla's list, compiled in).
    #[serde(default, deserialize_with = "present")]
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
    let set: Vec<&str> = [
        source.secret.as_ref().map(|_| "secret"),
        source.config_map.as_ref().map(|_| "configMap"),
        source.inline.as_ref().map(|_| "inline"),
        source.file.as_ref().map(|_| "file"),
        source.public_roots.map(|_| "publicRoots"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if set.len() != 1 {
        let reason = if set.is_empty() {
            "must set one of secret, configMap, inline, file, publicRoots".to_owned()
        } else {
            format!("must set exactly one of secret, configMap, inline, file, publicRoots; has {}", set.join(", "))
        };
        errors.push(FieldError::new(path, reason));
        return None;
    }
    let key_ref = |key_ref: &'a KeyRef, kind: TargetKind, errors: &mut Vec<FieldError>| {
        let path = format!("{path}.{}", kind.field());
        let before = errors.len();
        check(errors, format!("{path}.namespace"), names::check_dns_label(&key_ref.namespace));
        check(errors, format!("{path}.name"), names::check_dns_subdomain(&key_ref.name));
        check(errors, format!("{path}.key"), names::check_data_key(&key_ref.key));
        if key_ref.key.ends_with(".key") {
            errors.push(FieldError::new(
                format!("{path}.key"),
                "names a private key (like tls.key); ca-syncer copies certificates only, use tls.crt or ca.crt",
            ));
        }
        let destination =
            Destination { kind, namespace: Some(&key_ref.namespace), name: &key_ref.name, key: &key_ref.key };
        (errors.len() == before).then_some(destination)
    };
    if let Some(r) = &source.secret {
        let destination = key_ref(r, TargetKind::Secret, errors)?;
        return Some((Source::Secret(r.clone()), Some(destination)));
    }
    if let Some(r) = &source.config_map {
        let destination = key_ref(r, TargetKind::ConfigMap, errors)?;
        return Some((Source::ConfigMap(r.clone()), Some(destination)));
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
