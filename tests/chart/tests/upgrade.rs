//! `helm upgrade` from the previous release to this tree's, on a real node (`testbed::node`, its own), the way a
//! user upgrades: both charts and both sets of images from the bed's registry (`cargo xtask images` builds the
//! previous release once from its commit and publishes it beside this tree's build), the same values, all four
//! agents at work before the upgrade (snapshots taken, a CA synced, a kubeconfig published and its consumer
//! restarted once). After the upgrade every agent runs the new image and has done a pass, and what users rely on
//! is kept: every snapshot the previous release took is still listed and one of them restores (a drill by the
//! new agent), the synced CA and the published kubeconfig are not rewritten, and the consumer is not restarted.
//! The CRDs new in this version are applied first, as the changelog says, and every snapshot, the previous
//! release's included, then shows as an `EtcdSnapshot`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, ensure};
use chart::NAMESPACE;
use chart::on_node::{self, AGENTS, agent_pods, exec_in_agent, pod_metric, settled_hub, version};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::ListParams;
use testbed::node;

/// Keys written to the shard's etcd before the previous release snapshots it.
const KEYS: usize = 20;

/// The newest version in the bed's registry below `current`: the release users upgrade from.
fn previous_version(current: &str) -> Result<String> {
    let key = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    peers::registry::bed_tags("charts/kcp-keeper")
        .into_iter()
        .filter(|t| key(t) < key(current))
        .max_by_key(|t| key(t))
        .context(
            "no release older than this tree's in the bed's registry: `cargo xtask images` publishes the previous one",
        )
}

/// The shard's snapshot ids, as the agent in its pod lists them.
fn snapshot_ids(node: &node::Node) -> Option<Vec<String>> {
    let out = exec_in_agent(node, "etcd-snapshotter", &["/etcd-snapshotter", "list", "--shard", "root"]).ok()?;
    Some(
        out.lines()
            .filter(|l| l.starts_with("root/"))
            .filter_map(|l| l.split_whitespace().next())
            .map(String::from)
            .collect(),
    )
}

/// A Secret's resourceVersion and data.
async fn secret_state(client: &kube::Client, namespace: &str, name: &str, key: &str) -> Option<(String, String)> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace).get_opt(name).await.ok()??;
    let value = String::from_utf8(secret.data?.get(key)?.0.clone()).ok()?;
    Some((secret.metadata.resource_version?, value))
}

/// The newest `<agent>_reconcile_pass_timestamp_seconds` among the agent's pods (the leader's).
fn last_pass(node: &node::Node, pods: &[(String, String, i32, bool)], agent: &str) -> f64 {
    let prefix = format!("{}_reconcile_pass_timestamp", agent.replace('-', "_"));
    pods.iter()
        .filter_map(|(pod, ..)| pod_metric(node, pod, &prefix, "").ok().flatten())
        .map(|(_, v)| v)
        .fold(0.0, f64::max)
}

/// Creates (or leaves) the CustomResourceDefinitions in this tree's chart, as `kubectl apply -f crds/` would.
async fn apply_chart_crds(client: &kube::Client) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let text = std::fs::read_to_string(chart::chart_dir().join("crds/etcd-snapshotter.yaml"))?;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    for doc in text.split("\n---\n").filter(|d| d.contains("kind: CustomResourceDefinition")) {
        let crd: CustomResourceDefinition = serde_yaml::from_str(doc)?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(&name, &kube::api::PatchParams::apply("upgrade-test").force(), &kube::api::Patch::Apply(&crd))
            .await?;
    }
    Ok(())
}

#[tokio::test]
async fn helm_upgrade_from_the_previous_release_keeps_every_snapshot_restorable_the_synced_targets_and_restarts_no_consumer()
-> Result<()> {
    let node = node::shared();
    let client = node.client().await?;
    let current = version()?;
    let previous = previous_version(&current)?;
    eprintln!("upgrading from {previous} to {current}");
    let _peers = on_node::seed(node, &client).await?;
    // Data in the shard's etcd, so a restore proves it came back.
    let etcdctl = peers::locate_only(&["etcdctl"])?.path("etcdctl").to_path_buf();
    let endpoint = format!("--endpoints=http://{}:{}", testbed::node::NODE_IP, on_node::ETCD_PORT);
    for i in 0..KEYS {
        let args = [endpoint.clone(), "put".into(), format!("/upgrade/key-{i:02}"), format!("value-{i}")];
        node.run_inside("etcdctl put", &[etcdctl.as_path()], &args)?;
    }
    let values = on_node::values();

    let out = on_node::helm_release_of(node, "install", Some(&previous), &values, "5m")?;
    ensure!(out.success, "helm install of {previous} failed: {}", out.stderr);
    on_node::pulled_from_the_registry(node, &AGENTS, &previous)?;

    // The previous release at work.
    let before = testbed::eventually(Duration::from_secs(240), "two snapshots by the previous release", || async {
        snapshot_ids(node).filter(|ids| ids.len() >= 2)
    })
    .await;
    let ca_before = testbed::eventually(Duration::from_secs(120), "the CA synced", || async {
        secret_state(&client, "railgrid-system", "kcp-ca", "ca.crt").await
    })
    .await;
    let kubeconfig_before = testbed::eventually(Duration::from_secs(180), "the kubeconfig published", || async {
        secret_state(&client, "railgrid-system", "railgrid-kcp", "admin.kubeconfig").await
    })
    .await;
    let hub_before =
        testbed::eventually(Duration::from_secs(180), "the consumer restarted once and settled", || async {
            settled_hub(&client).await
        })
        .await;
    eprintln!("before: {} snapshots, CA and kubeconfig published, consumer {hub_before:?}", before.len());

    // What the changelog tells users to do first: `helm upgrade` installs no CRD that came with a new version.
    apply_chart_crds(&client).await?;
    let upgraded_at = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
    let out = on_node::helm_release_of(node, "upgrade", Some(&current), &values, "5m")?;
    ensure!(out.success, "helm upgrade to {current} failed: {}", out.stderr);
    on_node::pulled_from_the_registry(node, &AGENTS, &current)?;

    // The new release at work: every agent's pods run the new image, a snapshot after the upgrade, and a pass
    // by ca-syncer's and kubeconfig-rotator's leaders since the upgrade.
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/part-of=kcp-keeper"))
        .await?;
    for pod in pods.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        for c in pod.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default() {
            let image = c.image.unwrap_or_default();
            ensure!(image.ends_with(&format!(":{current}")), "{:?} still runs {image}", pod.metadata.name);
        }
    }
    let after = testbed::eventually(Duration::from_secs(240), "a snapshot by the new release", || async {
        snapshot_ids(node).filter(|ids| ids.iter().any(|id| !before.contains(id)))
    })
    .await;
    for agent in ["ca-syncer", "kubeconfig-rotator"] {
        testbed::eventually(Duration::from_secs(180), &format!("{agent}'s pass since the upgrade"), || async {
            let pods = agent_pods(&client, agent).await.ok()?;
            (last_pass(node, &pods, agent) > upgraded_at).then_some(())
        })
        .await;
    }

    // The new release mirrors every snapshot, the previous release's too, as an EtcdSnapshot.
    let objects = Api::<etcd_snapshotter::objects::EtcdSnapshot>::namespaced(client.clone(), NAMESPACE);
    testbed::eventually(Duration::from_secs(180), "an EtcdSnapshot for every snapshot listed", || async {
        let shown: Vec<String> =
            objects.list(&ListParams::default()).await.ok()?.items.into_iter().map(|o| o.spec.snapshot_id).collect();
        let listed = snapshot_ids(node)?;
        listed.iter().all(|id| shown.contains(id)).then_some(())
    })
    .await;

    // What users rely on, kept.
    let lost: Vec<&String> = before.iter().filter(|id| !after.contains(id)).collect();
    ensure!(lost.is_empty(), "snapshots of {previous} no longer listed after the upgrade: {lost:?}");
    let oldest = before.iter().min().context("no snapshot")?;
    let drilled = exec_in_agent(node, "etcd-snapshotter", &["/etcd-snapshotter", "drill", oldest])?;
    eprintln!("the new agent's drill of {oldest}, taken by {previous}:\n{drilled}");
    let listed = exec_in_agent(node, "etcd-snapshotter", &["/etcd-snapshotter", "list", "--shard", "root"])?;
    let row = listed
        .lines()
        .find(|l| l.starts_with(&format!("{oldest} ")))
        .with_context(|| format!("{oldest} gone:\n{listed}"))?;
    ensure!(!row.ends_with(" no") && !row.contains("no ("), "the drill does not prove {oldest}:\n{listed}");
    let restored_keys: usize = drilled
        .split(" keys")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("the drill did not say how many keys it restored: {drilled}"))?;
    ensure!(restored_keys >= KEYS, "the drill restored {restored_keys} keys, the shard held {KEYS}: {drilled}");
    let ca_after = secret_state(&client, "railgrid-system", "kcp-ca", "ca.crt").await;
    ensure!(ca_after.as_ref() == Some(&ca_before), "the synced CA was rewritten by the upgrade");
    let kubeconfig_after = secret_state(&client, "railgrid-system", "railgrid-kcp", "admin.kubeconfig").await;
    ensure!(
        kubeconfig_after.as_ref() == Some(&kubeconfig_before),
        "the published kubeconfig was rewritten by the upgrade"
    );
    let hub_after = settled_hub(&client).await;
    ensure!(
        hub_after.as_ref() == Some(&hub_before),
        "the consumer was restarted by the upgrade: {hub_before:?} -> {hub_after:?}"
    );
    Ok(())
}
