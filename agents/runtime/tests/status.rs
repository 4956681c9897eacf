//! Status-subresource apply against a real apiserver, on the real cert-manager Certificate CRD: setting
//! `Issuing=True` (reason `ManuallyTriggered`) the way `cmctl renew` does, beside cert-manager's own `Ready`.

use anyhow::Result;
use k8s_openapi::jiff::Timestamp;
use kcp_keeper_runtime::apply::Outcome;
use kcp_keeper_runtime::status::{apply_status, condition};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NAME: &str = "kubeconfig-cert-admin";

fn certificates() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate"))
}

/// Write requests the apiserver served for Certificates (any subresource), from its own `/metrics`.
async fn certificate_writes(client: &kube::Client) -> Result<u64> {
    let text = client.request_text(http::Request::get("/metrics").body(Vec::new())?).await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("resource=\"certificates\""))
        .filter(|l| ["APPLY", "PATCH", "UPDATE", "POST", "CREATE"].iter().any(|v| l.contains(&format!("verb=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// A Certificate as kcp-operator creates it, with a Ready condition written by "cert-manager".
async fn certificate(api: &Api<DynamicObject>, ar: &ApiResource) -> Result<()> {
    let mut cert = DynamicObject::new(NAME, ar);
    cert.data = json!({"spec": {
        "secretName": NAME,
        "commonName": "admin",
        "duration": "8766h",
        "usages": ["client auth"],
        "issuerRef": {"name": "root-client-ca", "kind": "Issuer"},
    }});
    api.create(&PostParams::default(), &cert).await?;
    let ready = json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "Ready", "message": "Certificate is up to date and has not expired",
        "lastTransitionTime": "2026-11-30T10:00:00Z", "observedGeneration": 1,
    }]}});
    let cert_manager =
        PatchParams { field_manager: Some("cert-manager-certificates-readiness".into()), ..Default::default() };
    api.patch_status(NAME, &cert_manager, &Patch::Merge(&ready)).await?;
    Ok(())
}

fn conditions(object: &DynamicObject) -> Vec<Value> {
    object.data["status"]["conditions"].as_array().cloned().unwrap_or_default()
}

fn issuing(live: &DynamicObject, status: &str, reason: &str, now: Timestamp) -> Value {
    let generation = live.metadata.generation;
    let condition = condition(
        live.data.get("status"),
        "Issuing",
        status,
        reason,
        "Certificate re-issuance manually triggered",
        generation,
        now,
    );
    json!({"conditions": [condition]})
}

#[tokio::test]
async fn issuing_condition_is_applied_to_status_beside_ready_and_repeating_it_makes_no_write() -> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let ar = certificates();
    let api = Api::<DynamicObject>::namespaced_with(bed.client(), &ns, &ar);
    certificate(&api, &ar).await?;
    let before = api.get(NAME).await?;

    let outcome =
        apply_status(&api, &ar, NAME, issuing(&before, "True", "ManuallyTriggered", Timestamp::now())).await?;
    assert_eq!(outcome, Outcome::Updated);
    let live = api.get(NAME).await?;
    let types: Vec<_> = conditions(&live).iter().map(|c| c["type"].as_str().unwrap_or("").to_string()).collect();
    assert_eq!(types, ["Ready", "Issuing"], "cert-manager's Ready stays beside our Issuing");
    let ours = conditions(&live).into_iter().find(|c| c["type"] == "Issuing").unwrap();
    assert_eq!((ours["status"].as_str(), ours["reason"].as_str()), (Some("True"), Some("ManuallyTriggered")));
    assert_eq!(live.data["spec"], before.data["spec"], "the spec is not touched");
    assert_eq!(live.metadata.generation, before.metadata.generation, "a status write does not bump generation");
    let managers = live.metadata.managed_fields.clone().unwrap_or_default();
    assert!(
        managers.iter().any(|m| m.manager.as_deref() == Some("kcp-keeper")
            && m.operation.as_deref() == Some("Apply")
            && m.subresource.as_deref() == Some("status")),
        "applied to /status as kcp-keeper: {managers:?}"
    );

    // Later cycles build the same condition from the live object: nothing to write, and nothing written.
    let rv = live.metadata.resource_version.clone();
    let writes = certificate_writes(&bed.client()).await?;
    for _ in 0..3 {
        let live = api.get(NAME).await?;
        let outcome =
            apply_status(&api, &ar, NAME, issuing(&live, "True", "ManuallyTriggered", Timestamp::now())).await?;
        assert_eq!(outcome, Outcome::Unchanged);
    }
    assert_eq!(api.get(NAME).await?.metadata.resource_version, rv, "resourceVersion must not move");
    assert_eq!(certificate_writes(&bed.client()).await?, writes, "the apiserver saw no write to certificates");

    // cert-manager finishes the issuance and flips the condition with its own write; setting it again takes
    // it back (a real change, so a real write: the counter above can move).
    let done = json!({"status": {"conditions": [
        conditions(&live).into_iter().find(|c| c["type"] == "Ready").unwrap(),
        {"type": "Issuing", "status": "False", "reason": "Issued", "message": "done", "lastTransitionTime": "2026-11-30T11:00:00Z"},
    ]}});
    api.patch_status(NAME, &PatchParams::default(), &Patch::Merge(&done)).await?;
    let flipped = api.get(NAME).await?;
    let outcome =
        apply_status(&api, &ar, NAME, issuing(&flipped, "True", "ManuallyTriggered", Timestamp::now())).await?;
    assert_eq!(outcome, Outcome::Updated);
    assert!(certificate_writes(&bed.client()).await? > writes);
    let ours = conditions(&api.get(NAME).await?).into_iter().find(|c| c["type"] == "Issuing").unwrap();
    assert_eq!(ours["status"], "True");
    assert_ne!(ours["lastTransitionTime"], "2026-11-30T11:00:00Z", "a transition gets a new time");
    Ok(())
}

#[tokio::test]
async fn status_of_a_missing_object_is_an_error_not_a_create() -> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let ar = certificates();
    let api = Api::<DynamicObject>::namespaced_with(bed.client(), &ns, &ar);
    let status = json!({"conditions": [{"type": "Issuing", "status": "True"}]});
    let err = apply_status(&api, &ar, "absent", status).await.unwrap_err();
    assert_eq!(err.metric_label(), "apiserver", "{err}");
    assert!(api.get_opt("absent").await?.is_none());
    Ok(())
}
