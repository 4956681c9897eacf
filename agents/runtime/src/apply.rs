//! Writes through server-side apply with field manager `kcp-keeper`, owning only the fields given.
//!
//! Three rules keep writes cheap and safe:
//! - compare first: when the live object already holds every desired field, nothing is written (a no-op cycle
//!   makes zero writes, so it neither bumps resourceVersion nor wakes every watcher of the object);
//! - never clobber: an object kcp-keeper did not create (no `app.kubernetes.io/managed-by: kcp-keeper` label), or a
//!   data key in it that kcp-keeper did not write (not listed in `kcp-keeper.io/owned-keys`), is refused unless the
//!   configuration says to adopt it;
//! - in objects that are ours, our fields win (`force`), so a hand edit of a key we own is put back.

use std::collections::BTreeSet;
use std::fmt::Debug;

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::FIELD_MANAGER;

pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The data keys kcp-keeper wrote into an object, comma-separated and sorted.
pub const OWNED_KEYS_ANNOTATION: &str = "kcp-keeper.io/owned-keys";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Updated,
    /// The live object already held every desired field: no request was sent.
    Unchanged,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// The whole object is kcp-keeper's (a target Secret or ConfigMap). `adopt` takes over an existing object or
    /// key someone else created.
    Owned { adopt: bool },
    /// A few fields in someone else's object (a restart annotation on a Deployment). Never forced: a field
    /// another manager owns is a conflict error, not an overwrite.
    Fields,
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{kind} {object} exists and was not created by kcp-keeper; set adopt to take it over")]
    Foreign { kind: String, object: String },
    #[error("{kind} {object}: key {key:?} was not written by kcp-keeper; set adopt to take it over")]
    ForeignKey { kind: String, object: String, key: String },
    #[error("{kind} {object}: a field is owned by another manager: {message}")]
    Conflict { kind: String, object: String, message: String },
    #[error("{kind} {object}: {source}")]
    Kube { kind: String, object: String, source: kube::Error },
    #[error("desired object is malformed: {0}")]
    Malformed(String),
}

impl ApplyError {
    /// Why the object was not written, in a few words (`not owned (adopt: false)`, `refused 403 Forbidden`): a
    /// group in a pass's Event note. The whole error is for the log.
    pub fn short_reason(&self) -> String {
        match self {
            ApplyError::Foreign { .. } => "not owned (adopt: false)".into(),
            ApplyError::ForeignKey { key, .. } => format!("key {key} not owned (adopt: false)"),
            ApplyError::Conflict { .. } => "conflict".into(),
            ApplyError::Kube { source, .. } => refused(source),
            ApplyError::Malformed(_) => "malformed".into(),
        }
    }
}

/// A failed request in a few words: `refused <code> [<reason>]` when the apiserver answered, else `request failed`.
pub fn refused(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if status.reason.is_empty() => format!("refused {}", status.code),
        kube::Error::Api(status) => format!("refused {} {}", status.code, status.reason),
        _ => "request failed".into(),
    }
}

impl ApplyError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            ApplyError::Foreign { .. } | ApplyError::ForeignKey { .. } => "not_owned",
            ApplyError::Conflict { .. } => "conflict",
            ApplyError::Kube { .. } => "apiserver",
            ApplyError::Malformed(_) => "malformed",
        }
    }
}

/// What [`apply`] writes: a kind whose `DynamicType` is known without a lookup, read and written whole.
pub trait Object: Resource<DynamicType: Default> + Clone + DeserializeOwned + Serialize + Debug {}

impl<K: Resource<DynamicType: Default> + Clone + DeserializeOwned + Serialize + Debug> Object for K {}

/// Applies `desired` (a partial object with `apiVersion`, `kind` and `metadata.name`) through `api`, reading
/// the live object first.
pub async fn apply<K: Object>(api: &Api<K>, desired: Value, ownership: Ownership) -> Result<Outcome, ApplyError> {
    let name = desired.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
    let live = if name.is_empty() {
        None
    } else {
        api.get_opt(&name).await.map_err(|source| ApplyError::Kube {
            kind: K::kind(&K::DynamicType::default()).to_string(),
            object: name.clone(),
            source,
        })?
    };
    apply_over(api, desired, ownership, live.as_ref()).await
}

/// Like [`apply`], comparing with `live` as the caller last saw it (from a reflector store) instead of reading
/// it again. A stale `live` costs at most one write the apiserver finds to be a no-op.
pub async fn apply_over<K: Object>(
    api: &Api<K>,
    desired: Value,
    ownership: Ownership,
    live: Option<&K>,
) -> Result<Outcome, ApplyError> {
    apply_over_returning(api, desired, ownership, live).await.map(|(outcome, _)| outcome)
}

/// [`apply_over`], also returning the object as the apiserver holds it after the write (`None` when nothing was
/// written), so a caller reading through a cache can tell whether the cache has seen its own write yet (its
/// `resourceVersion`), or take the object from there instead of reading it.
pub async fn apply_over_returning<K: Object>(
    api: &Api<K>,
    desired: Value,
    ownership: Ownership,
    live: Option<&K>,
) -> Result<(Outcome, Option<K>), ApplyError> {
    let name = desired
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .ok_or_else(|| ApplyError::Malformed("metadata.name is missing".into()))?
        .to_string();
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let object = match desired.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) => format!("{ns}/{name}"),
        None => name.clone(),
    };
    let kube_err = |source| ApplyError::Kube { kind: kind.clone(), object: object.clone(), source };

    let desired = match ownership {
        Ownership::Owned { .. } => mark_owned(desired),
        Ownership::Fields => desired,
    };
    if let Some(live) = live {
        let live_json = serde_json::to_value(live).map_err(|e| ApplyError::Malformed(e.to_string()))?;
        if let Ownership::Owned { adopt: false } = ownership {
            check_ownership(live, &live_json, &desired).map_err(|key| match key {
                None => ApplyError::Foreign { kind: kind.clone(), object: object.clone() },
                Some(key) => ApplyError::ForeignKey { kind: kind.clone(), object: object.clone(), key },
            })?;
        }
        if contains(&live_json, &desired) {
            return Ok((Outcome::Unchanged, None));
        }
    }
    let mut params = PatchParams::apply(FIELD_MANAGER);
    params.force = matches!(ownership, Ownership::Owned { .. });
    match api.patch(&name, &params, &Patch::Apply(&desired)).await {
        Ok(written) => {
            let outcome = if live.is_some() { Outcome::Updated } else { Outcome::Created };
            Ok((outcome, Some(written)))
        }
        Err(kube::Error::Api(status)) if status.code == 409 => {
            Err(ApplyError::Conflict { kind, object, message: status.message.clone() })
        }
        Err(e) => Err(kube_err(e)),
    }
}

/// Adds our label and the owned-keys annotation to a desired object.
fn mark_owned(mut desired: Value) -> Value {
    let keys = data_keys(&desired).into_iter().collect::<Vec<_>>().join(",");
    let meta = &mut desired["metadata"];
    meta["labels"][MANAGED_BY_LABEL] = json!(FIELD_MANAGER);
    meta["annotations"][OWNED_KEYS_ANNOTATION] = json!(keys);
    desired
}

/// Keys of `data` and `binaryData` (Secrets and ConfigMaps).
fn data_keys(object: &Value) -> BTreeSet<String> {
    ["data", "binaryData"]
        .iter()
        .filter_map(|field| object.get(*field).and_then(Value::as_object))
        .flat_map(|map| map.keys().cloned())
        .collect()
}

/// Ok when the live object is ours and every desired key that already exists is one we wrote.
/// Err(None): the object is foreign; Err(Some(key)): the key is.
fn check_ownership<K: Resource>(live: &K, live_json: &Value, desired: &Value) -> Result<(), Option<String>> {
    if live.labels().get(MANAGED_BY_LABEL).map(String::as_str) != Some(FIELD_MANAGER) {
        return Err(None);
    }
    let ours: BTreeSet<&str> =
        live.annotations().get(OWNED_KEYS_ANNOTATION).map(|v| v.split(',').collect()).unwrap_or_default();
    let existing = data_keys(live_json);
    for key in data_keys(desired) {
        if existing.contains(&key) && !ours.contains(key.as_str()) {
            return Err(Some(key));
        }
    }
    Ok(())
}

/// Whether `live` already holds everything in `desired`: objects compare key by key (extra live keys are
/// fine), lists element by element, scalars by value. A desired `null` means "absent".
pub fn contains(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (Value::Object(l), Value::Object(d)) => d.iter().all(|(k, dv)| match l.get(k) {
            Some(lv) => contains(lv, dv),
            None => dv.is_null(),
        }),
        (Value::Array(l), Value::Array(d)) => l.len() == d.len() && l.iter().zip(d).all(|(lv, dv)| contains(lv, dv)),
        (l, d) => l == d,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contains_ignores_extra_live_fields_but_not_changed_values() {
        let live = json!({"metadata": {"name": "a", "resourceVersion": "7"}, "data": {"k": "dg==", "other": "x"}});
        assert!(contains(&live, &json!({"metadata": {"name": "a"}, "data": {"k": "dg=="}})));
        assert!(!contains(&live, &json!({"data": {"k": "changed"}})));
        assert!(!contains(&live, &json!({"data": {"new": "x"}})));
        assert!(contains(&live, &json!({"data": {"gone": null}})));
    }

    #[test]
    fn lists_must_match_in_length_and_order() {
        assert!(contains(&json!({"a": [1, 2]}), &json!({"a": [1, 2]})));
        assert!(!contains(&json!({"a": [1, 2]}), &json!({"a": [2, 1]})));
        assert!(!contains(&json!({"a": [1, 2, 3]}), &json!({"a": [1, 2]})));
    }

    #[test]
    fn owned_objects_carry_our_label_and_their_sorted_keys() {
        let marked = mark_owned(json!({"metadata": {"name": "a"}, "data": {"z": "1", "a": "2"}}));
        assert_eq!(marked["metadata"]["labels"][MANAGED_BY_LABEL], "kcp-keeper");
        assert_eq!(marked["metadata"]["annotations"][OWNED_KEYS_ANNOTATION], "a,z");
    }
}
