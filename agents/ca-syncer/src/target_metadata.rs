//! The labels and annotations a target object gets from the configuration, decided against the live object:
//! a key is applied as kcp-keeper's (server-side apply, field manager `kcp-keeper`) unless someone else holds it
//! with another value. The owner of a key is read from the object's `managedFields`, the apiserver's own record
//! of which manager set which field: kcp-keeper owns the keys its applies set, and loses one to whoever changes
//! it after (an update takes the field over). A key another manager holds is left as it is and reported; one
//! that holds our value already is simply shared.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kcp_keeper_runtime::FIELD_MANAGER;

use crate::config::TargetMetadata;

/// What one write sets, and the configured keys left alone because another manager holds them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Decided<'a> {
    pub labels: BTreeMap<&'a str, &'a str>,
    pub annotations: BTreeMap<&'a str, &'a str>,
    /// `label <key>` / `annotation <key>`, for the report (never the values).
    pub foreign: Vec<String>,
}

/// Decides every configured key against `live` (`None`: the object is about to be created).
pub fn decide<'a>(wanted: &'a TargetMetadata, live: Option<&ObjectMeta>) -> Decided<'a> {
    let mut decided = Decided::default();
    let fields = [
        ("labels", &wanted.labels, live.and_then(|m| m.labels.as_ref())),
        ("annotations", &wanted.annotations, live.and_then(|m| m.annotations.as_ref())),
    ];
    for (field, wanted, current) in fields {
        for (key, value) in wanted {
            let ours = match current.and_then(|c| c.get(key)) {
                None => true,
                Some(v) if v == value => true,
                Some(_) => live.is_some_and(|m| owned_by_us(m, field, key)),
            };
            if !ours {
                decided.foreign.push(format!("{} {key}", field.trim_end_matches('s')));
            } else if field == "labels" {
                decided.labels.insert(key, value);
            } else {
                decided.annotations.insert(key, value);
            }
        }
    }
    decided
}

/// Whether kcp-keeper's field manager holds `metadata.<field>.<key>` (`field`: `labels` or `annotations`).
fn owned_by_us(meta: &ObjectMeta, field: &str, key: &str) -> bool {
    meta.managed_fields.iter().flatten().filter(|m| m.manager.as_deref() == Some(FIELD_MANAGER)).any(|m| {
        m.fields_v1
            .as_ref()
            .and_then(|f| f.0.get("f:metadata"))
            .and_then(|m| m.get(format!("f:{field}")))
            .and_then(|l| l.get(format!("f:{key}")))
            .is_some()
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use serde_json::json;

    use super::*;

    fn wanted() -> TargetMetadata {
        TargetMetadata {
            labels: BTreeMap::from([("team".into(), "platform".into()), ("tier".into(), "ca".into())]),
            annotations: BTreeMap::from([("argocd.argoproj.io/compare-options".into(), "IgnoreExtraneous".into())]),
        }
    }

    fn manager(name: &str, fields: serde_json::Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry { manager: Some(name.into()), fields_v1: Some(FieldsV1(fields)), ..Default::default() }
    }

    #[test]
    fn a_new_object_gets_every_key() {
        let wanted = wanted();
        let decided = decide(&wanted, None);
        assert_eq!(decided.labels.len() + decided.annotations.len(), 3);
        assert!(decided.foreign.is_empty());
    }

    #[test]
    fn a_key_someone_else_set_to_another_value_is_left_alone_and_named_and_ours_is_put_back() {
        let wanted = wanted();
        let live = ObjectMeta {
            labels: Some(BTreeMap::from([("team".into(), "theirs".into()), ("tier".into(), "edited".into())])),
            annotations: Some(BTreeMap::from([(
                "argocd.argoproj.io/compare-options".into(),
                "IgnoreExtraneous".into(),
            )])),
            managed_fields: Some(vec![
                manager("kubectl-label", json!({"f:metadata": {"f:labels": {"f:team": {}}}})),
                manager(FIELD_MANAGER, json!({"f:metadata": {"f:labels": {"f:tier": {}}}})),
            ]),
            ..Default::default()
        };
        let decided = decide(&wanted, Some(&live));
        assert_eq!(decided.foreign, ["label team"], "another manager's value stays, named without it");
        assert_eq!(decided.labels.get("tier"), Some(&"ca"), "our own key is put back");
        assert_eq!(decided.annotations.len(), 1, "a key already holding our value is shared");
    }
}
