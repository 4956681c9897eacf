//! Where targets go and what they carry, against a real apiserver: namespace selectors with `matchExpressions`,
//! and the labels and annotations the configuration gives a target, applied with kcp-keeper's field manager and
//! never over a key someone else holds.

mod common;

use std::collections::BTreeMap;

use anyhow::Result;
use common::*;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use testbed::certs::Ca;
use testbed::{ControlPlane, eventually};

async fn labelled_namespace(bed: &ControlPlane, name: &str, labels: &[(&str, &str)]) -> Result<()> {
    let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let ns = Namespace {
        metadata: ObjectMeta { name: Some(name.into()), labels: Some(labels), ..Default::default() },
        ..Default::default()
    };
    Api::<Namespace>::all(bed.client()).create(&PostParams::default(), &ns).await?;
    Ok(())
}

/// A pass's `MetadataNotOwned` Event (on the bundle's source, in `src`) that names `target` (`namespace/name`).
async fn not_owned_event(client: &kube::Client, src: &str, target: &str) -> Option<Event> {
    let events = Api::<Event>::namespaced(client.clone(), src).list(&ListParams::default()).await.ok()?;
    events.items.into_iter().find(|e| {
        e.reason.as_deref() == Some("MetadataNotOwned") && e.note.as_deref().is_some_and(|n| n.contains(target))
    })
}

#[tokio::test]
async fn match_expressions_select_namespaces_and_target_metadata_is_ours_but_never_over_a_foreign_key() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let src = bed.namespace().await?;
    let ca = Ca::new("kcp-ca", YEAR)?;
    Api::<Secret>::namespaced(bed.client(), &src)
        .create(&PostParams::default(), &secret("source", &[("ca.crt", &ca.cert_pem())]))
        .await?;
    labelled_namespace(&bed, "expr-prod", &[("tier", "prod")]).await?;
    labelled_namespace(&bed, "expr-staging", &[("tier", "staging")]).await?;
    labelled_namespace(&bed, "expr-staging-out", &[("tier", "staging"), ("opt-out", "true")]).await?;
    labelled_namespace(&bed, "expr-dev", &[("tier", "dev")]).await?;
    // An existing Secret the agent is told to adopt, already labelled by its owner.
    let adopted = bed.namespace().await?;
    let mut theirs = secret("kcp-ca", &[]);
    theirs.metadata.labels = Some(BTreeMap::from([("team".to_string(), "theirs".to_string())]));
    Api::<Secret>::namespaced(bed.client(), &adopted).create(&PostParams::default(), &theirs).await?;
    let metadata = "metadata: {labels: {team: platform}, annotations: {example.com/owner: ca-syncer}}";
    let config = format!(
        "resyncInterval: 1s\nbundles:\n- name: fleet\n  sources:\n  - secret: {{namespace: {src}, name: source, key: ca.crt}}\n  targets:\n  - secret:\n      name: kcp-ca\n      key: ca.crt\n      namespaceSelector:\n        matchExpressions:\n        - {{key: tier, operator: In, values: [prod, staging]}}\n        - {{key: opt-out, operator: DoesNotExist}}\n      {metadata}\n  - secret: {{namespace: {adopted}, name: kcp-ca, key: ca.crt, {metadata}}}\n    adopt: true\n"
    );
    let mut agent = start_agent(&bed, &src, &config)?;
    agent.wait_ready(WAIT).await?;
    let client = bed.client();

    for ns in ["expr-prod", "expr-staging"] {
        let target = Api::<Secret>::namespaced(client.clone(), ns).get("kcp-ca").await?;
        assert!(key(&client, ns, "kcp-ca", "ca.crt").await.is_some_and(|k| k.contains("BEGIN CERTIFICATE")), "{ns}");
        assert_eq!(target.metadata.labels.as_ref().and_then(|l| l.get("team")).map(String::as_str), Some("platform"));
        let annotations = target.metadata.annotations.unwrap_or_default();
        assert_eq!(annotations.get("example.com/owner").map(String::as_str), Some("ca-syncer"), "{ns}");
        // Applied as kcp-keeper's own fields: the apiserver records the field manager per key.
        let ours = target
            .metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .find(|m| m.manager.as_deref() == Some("kcp-keeper"));
        let fields = ours.and_then(|m| m.fields_v1).map(|f| f.0).unwrap_or_default();
        assert!(fields["f:metadata"]["f:labels"].get("f:team").is_some(), "{ns}: {fields}");
    }
    for ns in ["expr-staging-out", "expr-dev"] {
        let api = Api::<Secret>::namespaced(client.clone(), ns);
        assert!(api.get_opt("kcp-ca").await?.is_none(), "{ns} is not selected");
    }

    // The adopted Secret gets its key and our annotation, and keeps its owner's label.
    assert!(key(&client, &adopted, "kcp-ca", "ca.crt").await.is_some_and(|k| k.contains("BEGIN CERTIFICATE")));
    let target = Api::<Secret>::namespaced(client.clone(), &adopted).get("kcp-ca").await?;
    assert_eq!(target.metadata.labels.unwrap_or_default()["team"], "theirs", "a foreign key is never overwritten");
    assert_eq!(target.metadata.annotations.unwrap_or_default()["example.com/owner"], "ca-syncer");
    let adopted_target = format!("{adopted}/kcp-ca");
    let event = eventually(WAIT, "a MetadataNotOwned Event", || not_owned_event(&client, &src, &adopted_target)).await;
    let note = event.note.unwrap_or_default();
    assert!(note.contains(&format!("{adopted}/kcp-ca (label team)")), "names the target and the key: {note}");
    assert!(!note.contains("theirs"), "never the value: {note}");

    // Someone else changes our label on a target: from then on it is theirs, and stays as they set it.
    let prod = Api::<Secret>::namespaced(client.clone(), "expr-prod");
    let edit = json!({"metadata": {"labels": {"team": "edited"}}});
    prod.patch(
        "kcp-ca",
        &PatchParams { field_manager: Some("someone".into()), ..Default::default() },
        &Patch::Merge(edit),
    )
    .await?;
    eventually(WAIT, "a MetadataNotOwned Event naming the edited target", || {
        not_owned_event(&client, &src, "expr-prod/kcp-ca (label team)")
    })
    .await;
    let series = "ca_syncer_last_sync_timestamp_seconds{bundle=\"fleet\"}";
    let mut last = wait_for_metric(&agent, series, "a synced bundle", |v| v > 0.0).await;
    for _ in 0..2 {
        last = wait_for_metric(&agent, series, "another cycle", |v| v > last).await;
    }
    let labels = prod.get("kcp-ca").await?.metadata.labels.unwrap_or_default();
    assert_eq!(labels["team"], "edited", "left as they set it");
    Ok(())
}
