//! Asking for a fresh credential: the nudge that makes the kcp-operator re-render a Kubeconfig (an annotation,
//! repeated only when unanswered), and the forced renewal that makes cert-manager re-issue its Certificate
//! (`Issuing=True` on its status, as `cmctl renew` does). The daemon and `rotate` force renewals the same way.

use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use time::OffsetDateTime;

use crate::credential::rfc3339;
use crate::error::SyncError;
use crate::objects::{Certificate, KubeconfigObject, RENDER_REQUESTED};

/// A nudge not answered within this long is repeated.
const NUDGE_REPEAT: time::Duration = time::Duration::seconds(30);

/// Whether to nudge again: not yet for this serial, or the last nudge went unanswered for a while.
pub fn nudge_due(previous: Option<&str>, serial: &str, now: OffsetDateTime) -> bool {
    let Some((prev_serial, at)) = previous.and_then(|p| p.split_once(' ')) else { return true };
    let at = OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok();
    prev_serial != serial || at.is_none_or(|at| now - at > NUDGE_REPEAT)
}

/// Annotates Kubeconfig `namespace/name` with `RENDER_REQUESTED` = `<serial> <now>`, which makes the operator
/// re-render it at once.
pub async fn nudge(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    serial: &str,
    now: OffsetDateTime,
) -> Result<(), SyncError> {
    let value = format!("{serial} {}", rfc3339(now));
    let patch = json!({"metadata": {"annotations": {RENDER_REQUESTED: value}}});
    Api::<KubeconfigObject>::namespaced(client.clone(), namespace)
        .patch(name, &merge_params(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| SyncError::NudgeFailed { object: format!("{namespace}/{name}"), source })
}

/// Merge patches (the nudge, the renewal) carry kcp-keeper's field manager too, so managedFields say who wrote.
fn merge_params() -> PatchParams {
    PatchParams { field_manager: Some(kcp_keeper_runtime::FIELD_MANAGER.into()), ..PatchParams::default() }
}

/// `Issuing=True`, reason `ManuallyTriggered`, on the status subresource, guarded by the resourceVersion read.
pub async fn force_renewal(client: &kube::Client, certificate: &Certificate) -> Result<(), SyncError> {
    let namespace = certificate.metadata.namespace.clone().unwrap_or_default();
    let name = certificate.metadata.name.clone().unwrap_or_default();
    let mut conditions: Vec<serde_json::Value> =
        certificate.conditions().into_iter().filter(|c| c["type"] != "Issuing").collect();
    conditions.push(json!({
        "type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
        "message": "Certificate re-issuance manually triggered by kcp-keeper kubeconfig-rotator",
        "lastTransitionTime": rfc3339(OffsetDateTime::now_utc().replace_nanosecond(0).unwrap_or(OffsetDateTime::UNIX_EPOCH)),
        "observedGeneration": certificate.metadata.generation,
    }));
    let patch = json!({
        "metadata": {"resourceVersion": certificate.metadata.resource_version},
        "status": {"conditions": conditions},
    });
    Api::<Certificate>::namespaced(client.clone(), &namespace)
        .patch_status(&name, &merge_params(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| SyncError::RenewalFailed { object: format!("{namespace}/{name}"), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nudge_is_repeated_only_for_a_new_serial_or_after_going_unanswered() {
        let now = OffsetDateTime::now_utc();
        let at = |t: OffsetDateTime| format!("0a:01 {}", rfc3339(t));
        assert!(nudge_due(None, "0a:01", now));
        assert!(!nudge_due(Some(&at(now - time::Duration::seconds(5))), "0a:01", now));
        assert!(nudge_due(Some(&at(now - time::Duration::seconds(5))), "0b:02", now));
        assert!(nudge_due(Some(&at(now - time::Duration::seconds(60))), "0a:01", now));
        assert!(nudge_due(Some("garbage"), "0a:01", now));
    }
}
