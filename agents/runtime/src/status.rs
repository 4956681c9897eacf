//! Writes to an object's `/status` subresource by server-side apply, field manager `kcp-keeper`.
//!
//! Why a block of its own: kubeconfig-rotator forces a certificate renewal the way `cmctl renew` does, by
//! setting condition `Issuing=True` (reason `ManuallyTriggered`) on a cert-manager Certificate's status. The
//! spec belongs to kcp-operator (it overwrites it), the status to cert-manager; we own one condition in it.
//!
//! - Compare first, as [`crate::apply`] does: when the live status already holds every desired field, no
//!   request is sent (a no-op cycle makes zero writes). Lists of objects that all carry a `type` (conditions,
//!   `+listMapKey=type` by Kubernetes convention) compare by that key, so other writers' conditions do not
//!   count as a difference; any other list compares whole.
//! - Apply sends only `status` with the fields given. For condition lists the CRD declares as
//!   `x-kubernetes-list-type: map` (cert-manager's do), the apiserver merges our item with the others by
//!   `type`; an `atomic` list would be replaced whole, so use this only on map lists.
//! - `force`: the status has no human editors, only controllers that re-assert their own fields; a condition
//!   another controller last wrote (cert-manager flipping `Issuing` back) is ours again when we set it.
//! - [`condition`] keeps `lastTransitionTime` when the status did not change, as `meta.SetStatusCondition`
//!   does, so that re-applying the same condition is a no-op rather than a new timestamp every cycle.

use std::fmt::Debug;

use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::FIELD_MANAGER;
use crate::apply::{ApplyError, Outcome};

/// Applies `status` (a partial status) to object `name`'s status subresource. `dt` is the resource's dynamic
/// type: `&()` for k8s-openapi types, the `ApiResource` for a `DynamicObject` (custom resources).
///
/// Returns [`Outcome::Unchanged`] without writing when the live status already holds it, [`Outcome::Updated`]
/// otherwise. The object must exist (statuses are not created).
pub async fn apply_status<K>(
    api: &Api<K>,
    dt: &K::DynamicType,
    name: &str,
    status: Value,
) -> Result<Outcome, ApplyError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let kind = K::kind(dt).to_string();
    let object = match api.namespace() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    };
    let kube_err = |source| ApplyError::Kube { kind: kind.clone(), object: object.clone(), source };
    if !status.is_object() {
        return Err(ApplyError::Malformed("status must be an object".into()));
    }
    let live = api.get(name).await.map_err(kube_err)?;
    let live = serde_json::to_value(&live).map_err(|e| ApplyError::Malformed(e.to_string()))?;
    if contains_status(live.get("status").unwrap_or(&Value::Null), &status) {
        return Ok(Outcome::Unchanged);
    }
    let body = json!({
        "apiVersion": K::api_version(dt),
        "kind": K::kind(dt),
        "metadata": {"name": name},
        "status": status,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(name, &params, &Patch::Apply(&body)).await.map_err(kube_err)?;
    Ok(Outcome::Updated)
}

/// Whether `live` (a status) already holds everything in `desired`. Like [`crate::apply::contains`], except
/// that a desired list whose items all carry a string `type` matches live items by that key, in any order and
/// among others.
pub fn contains_status(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (Value::Object(l), Value::Object(d)) => d.iter().all(|(k, dv)| match l.get(k) {
            Some(lv) => contains_status(lv, dv),
            None => dv.is_null(),
        }),
        (Value::Array(l), Value::Array(d)) if keyed_by_type(d) => d.iter().all(|dv| {
            let key = &dv["type"];
            l.iter().find(|lv| lv.get("type") == Some(key)).is_some_and(|lv| contains_status(lv, dv))
        }),
        (Value::Array(l), Value::Array(d)) => {
            l.len() == d.len() && l.iter().zip(d).all(|(lv, dv)| contains_status(lv, dv))
        }
        (l, d) => l == d,
    }
}

fn keyed_by_type(items: &[Value]) -> bool {
    !items.is_empty() && items.iter().all(|item| item.get("type").is_some_and(Value::is_string))
}

/// A status condition as Kubernetes conventions shape it. `live_status` is the object's current status (if
/// any): when it holds a condition of this type with the same `status`, its `lastTransitionTime` is kept;
/// otherwise the transition is `now`, to the second.
pub fn condition(
    live_status: Option<&Value>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: Timestamp,
) -> Value {
    let previous = live_status
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .and_then(|conditions| conditions.iter().find(|c| c.get("type").and_then(Value::as_str) == Some(type_)))
        .filter(|c| c.get("status").and_then(Value::as_str) == Some(status))
        .and_then(|c| c.get("lastTransitionTime").cloned());
    let transition = previous.unwrap_or_else(|| {
        let second = Timestamp::from_second(now.as_second()).unwrap_or(now);
        json!(second.to_string())
    });
    let mut condition = json!({
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
    });
    if let Some(generation) = observed_generation {
        condition["observedGeneration"] = json!(generation);
    }
    condition
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_match_by_type_among_others_and_in_any_order() {
        let live = json!({"conditions": [
            {"type": "Ready", "status": "True", "reason": "Ready"},
            {"type": "Issuing", "status": "True", "reason": "ManuallyTriggered"},
        ]});
        assert!(contains_status(&live, &json!({"conditions": [{"type": "Issuing", "status": "True"}]})));
        assert!(!contains_status(&live, &json!({"conditions": [{"type": "Issuing", "status": "False"}]})));
        assert!(!contains_status(&live, &json!({"conditions": [{"type": "Renewing", "status": "True"}]})));
        assert!(!contains_status(&json!({}), &json!({"conditions": [{"type": "Issuing", "status": "True"}]})));
    }

    #[test]
    fn lists_without_a_type_key_compare_whole() {
        assert!(contains_status(&json!({"a": [1, 2]}), &json!({"a": [1, 2]})));
        assert!(!contains_status(&json!({"a": [1, 2, 3]}), &json!({"a": [1, 2]})));
        assert!(!contains_status(&json!({"a": [{"name": "x"}, {"name": "y"}]}), &json!({"a": [{"name": "x"}]})));
    }

    #[test]
    fn condition_keeps_its_transition_time_while_the_status_stays_and_moves_it_when_it_changes() {
        let now: Timestamp = "2026-11-30T14:00:00.75Z".parse().unwrap();
        let fresh = condition(None, "Issuing", "True", "ManuallyTriggered", "m", Some(3), now);
        assert_eq!(fresh["lastTransitionTime"], "2026-11-30T14:00:00Z", "whole seconds, as metav1.Time");
        assert_eq!(fresh["observedGeneration"], 3);

        let live = json!({"conditions": [fresh.clone()]});
        let later: Timestamp = "2026-11-30T15:00:00Z".parse().unwrap();
        let same = condition(Some(&live), "Issuing", "True", "ManuallyTriggered", "m", Some(3), later);
        assert_eq!(same, fresh, "re-applying the same condition is a no-op");
        let flipped = condition(Some(&live), "Issuing", "False", "Done", "m", Some(3), later);
        assert_eq!(flipped["lastTransitionTime"], "2026-11-30T15:00:00Z");
    }
}
