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
