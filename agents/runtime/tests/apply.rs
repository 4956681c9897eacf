//! The write helper against a real apiserver: no-op cycles make no request, foreign objects and keys are left
//! alone unless adopted, our own keys are put back after a hand edit.

use anyhow::Result;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kcp_keeper_runtime::apply::{ApplyError, OWNED_KEYS_ANNOTATION, Outcome, Ownership, apply};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

fn desired(ns: &str, data: &[(&str, &str)]) -> serde_json::Value {
    let data: serde_json::Map<_, _> = data
        .iter()
        .map(|(k, v)| (k.to_string(), json!(base64::Engine::encode(&base64::engine::general_purpose::STANDARD, v))))
        .collect();
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ca-bundle", "namespace": ns}, "data": data})
}

/// Write requests the apiserver has served for Secrets, from its own `/metrics`.
async fn secret_writes(client: &kube::Client) -> Result<u64> {
    let text = client.request_text(http::Request::get("/metrics").body(Vec::new())?).await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("resource=\"secrets\""))
        .filter(|l| ["APPLY", "PATCH", "UPDATE", "POST", "CREATE"].iter().any(|v| l.contains(&format!("verb=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

#[tokio::test]
async fn applying_the_same_content_again_sends_no_write() -> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let api = Api::<Secret>::namespaced(bed.client(), &ns);
    let owned = Ownership::Owned { adopt: false };
    assert_eq!(apply(&api, desired(&ns, &[("ca.crt", "one")]), owned).await?, Outcome::Created);
    let rv = api.get("ca-bundle").await?.metadata.resource_version;
    let writes = secret_writes(&bed.client()).await?;

    for _ in 0..3 {
        assert_eq!(apply(&api, desired(&ns, &[("ca.crt", "one")]), owned).await?, Outcome::Unchanged);
    }
    assert_eq!(api.get("ca-bundle").await?.metadata.resource_version, rv, "resourceVersion must not move");
    assert_eq!(secret_writes(&bed.client()).await?, writes, "the apiserver saw no write to secrets");

    assert_eq!(apply(&api, desired(&ns, &[("ca.crt", "two")]), owned).await?, Outcome::Updated);
    assert!(secret_writes(&bed.client()).await? > writes, "a real change is written (the counter works)");
    Ok(())
}

#[tokio::test]
async fn a_foreign_object_is_refused_unless_adopted() -> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let api = Api::<Secret>::namespaced(bed.client(), &ns);
    let foreign = Secret {
        metadata: ObjectMeta { name: Some("ca-bundle".into()), ..Default::default() },
        data: Some([("ca.crt".to_string(), ByteString(b"theirs".to_vec()))].into()),
        ..Default::default()
    };
    api.create(&PostParams::default(), &foreign).await?;
    let err = apply(&api, desired(&ns, &[("ca.crt", "ours")]), Ownership::Owned { adopt: false }).await.unwrap_err();
    assert!(matches!(err, ApplyError::Foreign { .. }), "{err}");
    assert!(err.to_string().contains("set adopt"), "{err}");
    assert_eq!(api.get("ca-bundle").await?.data.unwrap()["ca.crt"].0, b"theirs", "left alone");

    let outcome = apply(&api, desired(&ns, &[("ca.crt", "ours")]), Ownership::Owned { adopt: true }).await?;
    assert_eq!(outcome, Outcome::Updated);
    assert_eq!(api.get("ca-bundle").await?.data.unwrap()["ca.crt"].0, b"ours");
    Ok(())
}

#[tokio::test]
async fn a_key_someone_else_wrote_into_our_object_is_refused_but_our_hand_edited_key_is_put_back() -> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let api = Api::<Secret>::namespaced(bed.client(), &ns);
    let owned = Ownership::Owned { adopt: false };
    apply(&api, desired(&ns, &[("ca.crt", "ours")]), owned).await?;

    // A person edits our key and adds one of their own, as `kubectl edit` would.
    let edit = json!({"data": {"ca.crt": "aGFuZC1lZGl0ZWQ=", "extra.crt": "dGhlaXJz"}});
    api.patch("ca-bundle", &PatchParams::default(), &Patch::Merge(&edit)).await?;

    assert_eq!(apply(&api, desired(&ns, &[("ca.crt", "ours")]), owned).await?, Outcome::Updated);
    let data = api.get("ca-bundle").await?.data.unwrap();
    assert_eq!(data["ca.crt"].0, b"ours", "our key is put back");
    assert_eq!(data["extra.crt"].0, b"theirs", "their key is left alone");

    let err = apply(&api, desired(&ns, &[("ca.crt", "ours"), ("extra.crt", "x")]), owned).await.unwrap_err();
    assert!(matches!(err, ApplyError::ForeignKey { ref key, .. } if key == "extra.crt"), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_key_we_stop_writing_is_removed_and_the_owned_keys_annotation_follows() -> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let api = Api::<Secret>::namespaced(bed.client(), &ns);
    let owned = Ownership::Owned { adopt: false };
    apply(&api, desired(&ns, &[("ca.crt", "a"), ("old.crt", "b")]), owned).await?;
    assert_eq!(apply(&api, desired(&ns, &[("ca.crt", "a")]), owned).await?, Outcome::Updated);
    let live = api.get("ca-bundle").await?;
    assert!(!live.data.unwrap().contains_key("old.crt"));
    assert_eq!(live.metadata.annotations.unwrap()[OWNED_KEYS_ANNOTATION], "ca.crt");
    Ok(())
}

/// kubeconfig-rotator's restart of a consumer it does not own (as `kubectl rollout restart` does): only the
/// pod-template annotation is applied, with field ownership, and every other field stays as its owner set it.
#[tokio::test]
async fn fields_ownership_sets_only_a_pod_template_annotation_on_a_foreign_deployment() -> Result<()> {
    use k8s_openapi::api::apps::v1::Deployment;
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let api = Api::<Deployment>::namespaced(bed.client(), &ns);
    let theirs: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "hub", "annotations": {"owner-note": "theirs"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "hub"}},
            "template": {
                "metadata": {"labels": {"app": "hub"}, "annotations": {"theirs": "kept"}},
                "spec": {"containers": [{"name": "hub", "image": "registry.example/hub:1"}]}
            }
        }
    }))?;
    let params = PostParams { field_manager: Some("hub-chart".into()), ..Default::default() };
    api.create(&params, &theirs).await?;
    let before = api.get("hub").await?;

    let restart = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "hub", "namespace": ns},
        "spec": {"template": {"metadata": {"annotations": {"kcp-keeper.io/restarted-for": "serial-2"}}}}
    });
    assert_eq!(apply(&api, restart.clone(), Ownership::Fields).await?, Outcome::Updated);
    let after = api.get("hub").await?;
    let template = after.spec.template.metadata.as_ref().unwrap().annotations.clone().unwrap();
    assert_eq!(template["kcp-keeper.io/restarted-for"], "serial-2");
    assert_eq!(template["theirs"], "kept", "their template annotation stays");
    let mut expected = before.spec.clone();
    expected
        .template
        .metadata
        .as_mut()
        .unwrap()
        .annotations
        .as_mut()
        .unwrap()
        .insert("kcp-keeper.io/restarted-for".into(), "serial-2".into());
    assert_eq!(after.spec, expected, "nothing else in the spec changed");
    assert_eq!(after.metadata.annotations, before.metadata.annotations, "object annotations untouched");
    assert!(
        !after.metadata.labels.unwrap_or_default().contains_key(kcp_keeper_runtime::apply::MANAGED_BY_LABEL),
        "a foreign object is not marked as ours"
    );
    let managers: Vec<_> = after.metadata.managed_fields.unwrap_or_default();
    let ours = managers.iter().find(|m| m.manager.as_deref() == Some("kcp-keeper")).expect("our field manager");
    let owned = serde_json::to_string(&ours.fields_v1)?;
    assert!(owned.contains("kcp-keeper.io/restarted-for") && !owned.contains("replicas"), "{owned}");

    // The same apply again is a no-op: no request at all.
    let user = testbed::apiserver::ADMIN_USER;
    let patches = |log: &std::path::Path| -> Result<usize> {
        Ok(testbed::audit::by_user(log, user)?.iter().filter(|r| r.resource == "deployments" && r.is_write()).count())
    };
    let writes = patches(&bed.apiserver.audit_log)?;
    assert!(writes >= 2, "the audit log sees the create and the apply ({writes})");
    assert_eq!(apply(&api, restart, Ownership::Fields).await?, Outcome::Unchanged);
    assert_eq!(api.get("hub").await?.metadata.resource_version, after.metadata.resource_version);
    assert_eq!(patches(&bed.apiserver.audit_log)?, writes, "no write to deployments");
    Ok(())
}
