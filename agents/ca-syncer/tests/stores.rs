//! What ca-syncer's reflector stores hold, against a real apiserver: only what a pass reads. No object keeps
//! its `managedFields` (but for which configured labels and annotations kcp-keeper set, on a target that has
//! some), a source keeps only the keys it names (never the private key beside the CA), a target only the keys
//! it is written, kcp-keeper's marks and its configured labels and annotations, and the Namespaces a selector
//! chooses are watched metadata-only and keep their identity alone. The agent's behaviour on those stores is
//! what every other test of this crate proves.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use ca_syncer::config::Config;
use ca_syncer::scope::Scope;
use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kcp_keeper_runtime::watch::Watches;
use kube::api::{Api, ObjectMeta, PartialObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use testbed::ControlPlane;
use testbed::certs::Ca;

/// Runs `watches` until every one has synced, then `check` until it passes (the stores fill as events arrive),
/// within 30 s.
async fn synced(watches: Watches, mut check: impl FnMut() -> Result<()>) -> Result<()> {
    let mut set = watches.start();
    tokio::time::timeout(WAIT, async {
        loop {
            if set.all_synced() && check().is_ok() {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), set.next()).await;
        }
    })
    .await
    .map_err(|_| check().err().unwrap_or_else(|| anyhow::anyhow!("watches not synced: {:?}", set.pending())))
}

/// A ConfigMap written by server-side apply as `manager`.
async fn apply(client: &kube::Client, ns: &str, manager: &str, object: serde_json::Value) -> Result<()> {
    let name = object["metadata"]["name"].as_str().context("name")?.to_string();
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(&name, &PatchParams::apply(manager).force(), &Patch::Apply(&object))
        .await?;
    Ok(())
}

fn keys<V>(map: &Option<BTreeMap<String, V>>) -> Vec<&str> {
    map.iter().flatten().map(|(k, _)| k.as_str()).collect()
}

#[tokio::test]
async fn stores_keep_no_managed_fields_no_unread_key_or_annotation_and_namespaces_metadata_only() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let client = bed.client();
    let (src, dst) = (bed.namespace().await?, bed.namespace().await?);
    let root = Ca::new("kcp-root", YEAR)?;
    let server_ca = root.intermediate("root-server-ca", YEAR)?;
    // cert-manager's shape: the CA's private key beside the certificates.
    Api::<Secret>::namespaced(client.clone(), &src)
        .create(
            &PostParams::default(),
            &secret(
                "root-server-ca",
                &[("tls.crt", &server_ca.cert_pem()), ("ca.crt", &root.cert_pem()), ("tls.key", &server_ca.key_pem())],
            ),
        )
        .await?;
    // A selected namespace carrying what a platform's tooling puts there.
    let tenant = format!("{dst}-tenant");
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(tenant.clone()),
            labels: Some(BTreeMap::from([("trust".into(), dst.clone()), ("team".into(), "a".into())])),
            annotations: Some(BTreeMap::from([("owner".into(), "x".repeat(4096))])),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await?;
    // Targets as ca-syncer leaves them, plus what others added: another manager's key, annotation and label.
    let ours = |name: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name,
            "labels": {"app.kubernetes.io/managed-by": "kcp-keeper", "team": "platform"},
            "annotations": {"kcp-keeper.io/owned-keys": "ca.crt", "ca-syncer.kcp-keeper.io/rotation-state": "{}",
                "configured": "yes"}},
            "data": {"ca.crt": root.cert_pem()}})
    };
    let theirs = |name: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name,
            "labels": {"other": "label"}, "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x".repeat(2048)}},
            "data": {"app.properties": "y".repeat(2048)}})
    };
    for (ns, name) in [(&tenant, "selected-ca"), (&dst, "named-ca")] {
        apply(&client, ns, "kcp-keeper", ours(name)).await?;
        apply(&client, ns, "someone-else", theirs(name)).await?;
    }
    let config: Config = kcp_keeper_runtime::config::parse(
        Path::new("c.yaml"),
        &format!(
            "bundles:\n- name: kcp\n  sources:\n  - secret: {{namespace: {src}, name: root-server-ca, key: tls.crt}}\n  \
             - secret: {{namespace: {src}, name: root-server-ca, key: ca.crt}}\n  targets:\n  \
             - configMap: {{namespace: {dst}, name: named-ca, key: ca.crt, metadata: {{labels: {{team: platform}}, annotations: {{configured: 'yes'}}}}}}\n  \
             - configMap: {{name: selected-ca, key: ca.crt, namespaceSelector: {{matchLabels: {{trust: {dst}}}}}}}\n"
        ),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let (scope, watches) = Scope::build(&client, &config);
    let selector = match &config.bundles[0].targets[1].placement {
        ca_syncer::config::Placement::Selector(selector) => selector.clone(),
        other => anyhow::bail!("not a selector: {other:?}"),
    };
    synced(watches, || {
        anyhow::ensure!(scope.secret(&src, "root-server-ca").is_some(), "source not stored yet");
        anyhow::ensure!(scope.config_map(&dst, "named-ca").is_some(), "named target not stored yet");
        anyhow::ensure!(scope.config_map(&tenant, "selected-ca").is_some(), "selected target not stored yet");
        anyhow::ensure!(scope.namespaces(&selector).0 == [tenant.clone()], "namespace not stored yet");
        Ok(())
    })
    .await?;

    let source = scope.secret(&src, "root-server-ca").context("source")?;
    assert_eq!(keys(&source.data), ["ca.crt", "tls.crt"], "the CA's private key is never held");
    assert!(source.metadata.managed_fields.is_none() && source.metadata.annotations.is_none());

    let selected = scope.config_map(&tenant, "selected-ca").context("selected target")?;
    assert_eq!(keys(&selected.data), ["ca.crt"], "another manager's key is not held");
    assert_eq!(keys(&selected.metadata.labels), ["app.kubernetes.io/managed-by"]);
    assert_eq!(
        keys(&selected.metadata.annotations),
        ["ca-syncer.kcp-keeper.io/rotation-state", "kcp-keeper.io/owned-keys"],
        "kubectl's last-applied copy is not held"
    );
    assert!(selected.metadata.managed_fields.is_none(), "no configured metadata: no managedFields at all");

    let named = scope.config_map(&dst, "named-ca").context("named target")?;
    assert_eq!(keys(&named.metadata.labels), ["app.kubernetes.io/managed-by", "team"]);
    assert_eq!(
        keys(&named.metadata.annotations),
        ["ca-syncer.kcp-keeper.io/rotation-state", "configured", "kcp-keeper.io/owned-keys"]
    );
    let managed = named.metadata.managed_fields.as_ref().context("configured metadata: our ownership is kept")?;
    assert_eq!(managed.len(), 1, "only kcp-keeper's entry: {managed:?}");
    assert_eq!(managed[0].manager.as_deref(), Some("kcp-keeper"));
    let fields = &managed[0].fields_v1.as_ref().context("fields")?.0;
    let top: Vec<&str> = fields.as_object().into_iter().flat_map(|o| o.keys()).map(String::as_str).collect();
    assert_eq!(top, ["f:metadata"], "{fields}");
    assert!(fields["f:metadata"]["f:labels"].get("f:team").is_some(), "{fields}");
    assert!(fields["f:metadata"]["f:annotations"].get("f:configured").is_some(), "{fields}");

    // The Namespaces: a metadata-only watch, keeping the identity alone (the runtime's hook, as ca-syncer uses it).
    let mut watches = Watches::new();
    let store = watches.add_metadata(
        "Namespaces",
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        watcher::Config::default().labels(&format!("trust={dst}")),
    );
    synced(watches, || {
        anyhow::ensure!(store.state().len() == 1, "not stored yet");
        Ok(())
    })
    .await?;
    let meta = &store.state()[0].metadata;
    assert_eq!(meta.name.as_deref(), Some(tenant.as_str()));
    assert!(meta.resource_version.is_some() && meta.deletion_timestamp.is_none());
    assert!(
        meta.labels.is_none() && meta.annotations.is_none() && meta.managed_fields.is_none(),
        "labels, annotations and managedFields are not held: {meta:?}"
    );
    Ok(())
}

/// The runtime's default for every store: the object whole but for its `managedFields`.
#[tokio::test]
async fn a_plain_watch_store_keeps_the_object_without_managed_fields() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let client = bed.client();
    let ns = bed.namespace().await?;
    apply(
        &client,
        &ns,
        "someone",
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "annotations": {"k": "v"}},
            "data": {"x": "y"}}),
    )
    .await?;
    let live = Api::<ConfigMap>::namespaced(client.clone(), &ns).get("a").await?;
    assert!(live.metadata.managed_fields.is_some(), "the apiserver sends managedFields");
    let mut watches = Watches::new();
    let store = watches.add("a", Api::<ConfigMap>::namespaced(client.clone(), &ns), watcher::Config::default());
    synced(watches, || {
        anyhow::ensure!(store.state().len() == 1, "not stored yet");
        Ok(())
    })
    .await?;
    let stored = store.state()[0].clone();
    assert!(stored.metadata.managed_fields.is_none());
    assert_eq!(keys(&stored.metadata.annotations), ["k"]);
    assert_eq!(keys(&stored.data), ["x"]);
    Ok(())
}
