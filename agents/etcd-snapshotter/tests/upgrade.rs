//! A snapshot before every kcp upgrade (`shards[].beforeUpgrade`), with the daemon as a process against a real
//! kube-apiserver serving the kcp-operator's CRDs (v0.9.0) and the seed layout's own RootShard and Shard, a real
//! etcd and a real versitygw: which changes of the object take a snapshot (and its drill), how the state in the
//! bucket carries across a restart, and what a malformed object does.
//!
//! No test waits for "nothing to happen": each shows that a change took no snapshot by making, after it, a change
//! that does take one (the watch delivers events in order) and counting the snapshots then.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testbed::agent_process::AgentProcess;
use testbed::seed::images::KCP_REPOSITORY;
use testbed::seed::layout;

const OLD: &str = "ghcr.io/kcp-dev/kcp:v0.32.3";
const STATE_KEY: &str = "kcp/etcd/root/kcp-image.json";

fn resource(kind: &str) -> ApiResource {
    let plural = format!("{}s", kind.to_ascii_lowercase());
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("operator.kcp.io", "v1alpha1", kind), &plural)
}

fn api(client: &kube::Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &resource(kind))
}

/// The seed layout's RootShard `root` and Shard `alpha`, in `ns`.
async fn operator_objects(cluster: &testbed::ControlPlane, ns: &str) {
    // The control plane serves the kcp-operator's CRDs from its start.
    let client = cluster.client();
    for object in [layout::root_shard(), layout::shard()] {
        let mut object: Value = serde_json::from_str(&object.to_string().replace(layout::NAMESPACE, ns)).unwrap();
        object["metadata"]["namespace"] = json!(ns);
        let (kind, name) =
            (object["kind"].as_str().unwrap().to_string(), object["metadata"]["name"].as_str().unwrap().to_string());
        api(&client, ns, &kind)
            .patch(&name, &PatchParams::apply("seed").force(), &Patch::Apply(&object))
            .await
            .unwrap();
    }
}

/// A merge patch of the object's `patch` (someone editing it: the operator's users, not the agent).
async fn edit(client: &kube::Client, ns: &str, kind: &str, name: &str, patch: Value) {
    api(client, ns, kind).patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

async fn set_tag(client: &kube::Client, ns: &str, kind: &str, name: &str, tag: &str) {
    edit(client, ns, kind, name, json!({"spec": {"image": {"repository": KCP_REPOSITORY, "tag": tag}}})).await;
}

/// A daemon configuration for shard `root` on `endpoint` watching `kind ns/name`, with drills, no schedule due.
fn config(bed: &Bed, endpoint: &str, kind: &str, ns: &str, name: &str) -> std::path::PathBuf {
    let mut options = Options::new(bed, "root", vec![endpoint.to_string()]).with_drills(bed);
    options.shard_extra = format!("beforeUpgrade: {{kind: {kind}, namespace: {ns}, name: {name}}}\n");
    write_config(bed, &options).unwrap()
}

/// The recorded state, once it names `image`.
async fn state_names(bed: &Bed, image: &str) -> Value {
    let s3 = bed.s3.client();
    testbed::eventually(WAIT, &format!("the recorded kcp image to be {image}"), || {
        let (s3, bucket) = (s3.clone(), bed.s3.bucket.clone());
        async move {
            let out = s3.get_object().bucket(&bucket).key(STATE_KEY).send().await.ok()?;
            let state: Value = serde_json::from_slice(&out.body.collect().await.ok()?.into_bytes()).ok()?;
            (state["image"] == image).then_some(state)
        }
    })
    .await
}

/// The manifests in the bucket, once there are `n` and each has its drill report.
async fn snapshots(bed: &Bed, n: usize) -> Vec<(Value, Value)> {
    let s3 = bed.s3.client();
    testbed::eventually(Duration::from_secs(120), &format!("{n} drilled snapshot(s)"), || {
        let (s3, bucket) = (s3.clone(), bed.s3.bucket.clone());
        async move {
            let listed = manifests(&s3, &bucket).await;
            if listed.len() < n {
                return None;
            }
            let mut out = Vec::new();
            for m in listed {
                let key = format!("{PREFIX}/{}/drill.json", m["id"].as_str()?);
                let body = s3.get_object().bucket(&bucket).key(&key).send().await.ok()?.body.collect().await.ok()?;
                out.push((m, serde_json::from_slice(&body.into_bytes()).ok()?));
            }
            Some(out)
        }
    })
    .await
}

async fn events(client: &kube::Client, ns: &str, reason: &str) -> Vec<Event> {
    let all = Api::<Event>::namespaced(client.clone(), ns).list(&ListParams::default()).await.unwrap();
    all.items.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).collect()
}

async fn started(cluster: &testbed::ControlPlane, config: &std::path::Path, ns: &str) -> AgentProcess {
    let mut process = agent(cluster, config, ns).identity("replica-a").spawn().unwrap();
    process.wait_ready(WAIT).await.unwrap();
    process
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rootshard_image_change_takes_one_snapshot_labelled_with_the_old_image_and_drills_it_with_the_documented_rbac()
 {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let (ns, objects) = (cluster.namespace().await.unwrap(), cluster.namespace().await.unwrap());
    operator_objects(cluster, &objects).await;
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 40, 500).await.unwrap();
    let config = config(&bed, &etcd.members[0].client_url, "RootShard", &objects, "root");

    // The Roles `rbac --config` prints (the Lease's namespace, and reads of exactly this RootShard and Events in
    // the objects' namespace), with a real ServiceAccount token.
    let out = cli(&[
        "rbac",
        "--config",
        config.to_str().unwrap(),
        "--namespace",
        &ns,
        "--service-account",
        "etcd-snapshotter",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert!(yaml.contains("rootshards") && yaml.contains(&format!("namespace: {objects}")), "{yaml}");
    let admin = cluster.client();
    for doc in yaml.split("\n---\n").filter(|d| !d.trim().is_empty()) {
        let value: Value = serde_yaml::from_str(doc).unwrap();
        let doc_ns = value["metadata"]["namespace"].as_str().unwrap().to_string();
        match value["kind"].as_str() {
            Some("Role") => {
                let role: Role = serde_json::from_value(value).unwrap();
                Api::<Role>::namespaced(admin.clone(), &doc_ns).create(&PostParams::default(), &role).await.unwrap();
            }
            Some("RoleBinding") => {
                let binding: RoleBinding = serde_json::from_value(value).unwrap();
                Api::<RoleBinding>::namespaced(admin.clone(), &doc_ns)
                    .create(&PostParams::default(), &binding)
                    .await
                    .unwrap();
            }
            other => panic!("rbac printed a {other:?}"),
        }
    }
    let (kubeconfig, _) = cluster.service_account_kubeconfig(&ns, "etcd-snapshotter").await.unwrap();
    let mut process = agent(cluster, &config, &ns).identity("replica-a").kubeconfig(&kubeconfig).spawn().unwrap();
    process.wait_ready(WAIT).await.unwrap();

    // The first reading is the baseline: nothing to compare it with, no snapshot.
    let baseline = state_names(&bed, OLD).await;
    assert_eq!(baseline["object"], format!("RootShard {objects}/root"));
    assert!(baseline.get("snapshot").is_none(), "{baseline}");

    let new = format!("{KCP_REPOSITORY}:v0.32.3-upgrade");
    set_tag(&admin, &objects, "RootShard", "root", "v0.32.3-upgrade").await;
    let taken = snapshots(&bed, 1).await;
    let (manifest, report) = &taken[0];
    let kcp = &manifest["kcp"];
    assert_eq!(kcp["image"], OLD, "labelled with the image it was taken under: {manifest}");
    assert_eq!(kcp["upgradeTo"], new.as_str());
    assert_eq!(kcp["object"], format!("RootShard {objects}/root"));
    assert!(kcp.get("afterRollMayHaveBegun").is_none(), "seen live, so before the roll: {kcp}");
    assert_eq!(report["passed"], true, "{report}");
    assert!(report["kcpVersion"].as_str().unwrap().contains(OLD), "{report}");
    let state = state_names(&bed, &new).await;
    assert_eq!(state["snapshot"], manifest["id"]);

    let series = "etcd_snapshotter_pre_upgrade_snapshots_total{shard=\"root\",result=\"passed\"}";
    assert_eq!(process.wait_for_metric(series, WAIT, |v| v >= 1.0).await, 1.0);
    let taken_events = testbed::eventually(WAIT, "the Event on the RootShard", || async {
        let found = events(&admin, &objects, "PreUpgradeSnapshotTaken").await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    let event = &taken_events[0];
    assert_eq!(event.regarding.as_ref().and_then(|r| r.kind.as_deref()), Some("RootShard"));
    assert!(event.note.as_deref().unwrap().contains(manifest["id"].as_str().unwrap()), "{event:?}");

    // `list` prints the kcp it was taken under.
    let listed = cli(&["list", "--config", config.to_str().unwrap()]);
    let listed = text(&listed);
    assert!(listed.contains(&format!("kcp {OLD} (before the upgrade to {new})")), "{listed}");

    // The roll won the next race: a pod of the RootShard on the image it is changed to exists before the
    // change (as one the operator created while the agent's snapshot waited on a loaded node). The agent lists
    // the shard's pods with the Role `rbac` printed, and the manifest says the roll may have begun. A pod of
    // the image the snapshot is taken under, or of another instance, does not count.
    let third = format!("{KCP_REPOSITORY}:v0.32.3-third");
    shard_pod(&admin, &objects, "root-kcp-running", "rootshard", "root", &new).await;
    shard_pod(&admin, &objects, "alpha-kcp-other", "shard", "alpha", &third).await;
    shard_pod(&admin, &objects, "root-kcp-new", "rootshard", "root", &third).await;
    set_tag(&admin, &objects, "RootShard", "root", "v0.32.3-third").await;
    let taken = snapshots(&bed, 2).await;
    let kcp =
        &taken.iter().find(|(m, _)| m["kcp"]["upgradeTo"] == third.as_str()).expect("the second snapshot").0["kcp"];
    assert_eq!(kcp["image"], new.as_str(), "{kcp}");
    assert_eq!(kcp["afterRollMayHaveBegun"], true, "a pod of the new image existed before it: {kcp}");
    let log = process.process.log();
    assert!(log.contains("pod root-kcp-new runs"), "the log names the pod: {}", process.process.log_tail());
    process.terminate(WAIT);
}

/// A pod as the kcp-operator labels a RootShard's or Shard's (`component` `rootshard` or `shard`), its `kcp`
/// container on `image`. The bare control plane runs no kubelet: the object is what the agent reads.
async fn shard_pod(admin: &kube::Client, ns: &str, name: &str, component: &str, instance: &str, image: &str) {
    use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
    // The ServiceAccount admission needs the namespace's default account; no controller creates it here.
    let _ = Api::<ServiceAccount>::namespaced(admin.clone(), ns).create(&PostParams::default(), &account).await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "app.kubernetes.io/managed-by": "kcp-operator", "app.kubernetes.io/name": "kcp",
            "app.kubernetes.io/component": component, "app.kubernetes.io/instance": instance}},
        "spec": {"automountServiceAccountToken": false, "containers": [{"name": "kcp", "image": image}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(admin.clone(), ns).create(&PostParams::default(), &pod).await.unwrap();
}

/// The operator's objects in a namespace of their own, a one-member etcd, and the agent watching the RootShard
/// `root` for it, past recording the image it started under: the namespace, the etcd and the agent.
async fn watching_root(bed: &Bed) -> (String, testbed::Etcd, AgentProcess) {
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    operator_objects(cluster, &ns).await;
    let etcd = bed.etcd("root", 1).await.unwrap();
    let config = config(bed, &etcd.members[0].client_url, "RootShard", &ns, "root");
    let process = started(cluster, &config, &ns).await;
    state_names(bed, OLD).await;
    (ns, etcd, process)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_label_or_replicas_change_and_image_changes_of_objects_not_configured_take_no_snapshot() {
    let bed = Bed::with_cluster().await.unwrap();
    let (ns, _etcd, mut process) = watching_root(&bed).await;
    let admin = bed.cluster().client();

    // None of these is a new kcp for shard root: a label, the replicas, the operator's defaults written out, the
    // Shard alpha's image (another shard's object) and its own object in another kind.
    edit(&admin, &ns, "RootShard", "root", json!({"metadata": {"labels": {"team": "platform"}}})).await;
    edit(&admin, &ns, "RootShard", "root", json!({"spec": {"replicas": 2}})).await;
    edit(&admin, &ns, "RootShard", "root", json!({"spec": {"image": {"repository": "", "tag": "v0.32.3"}}})).await;
    set_tag(&admin, &ns, "Shard", "alpha", "v0.32.3-alpha").await;
    // Then one that is: it is the only snapshot.
    set_tag(&admin, &ns, "RootShard", "root", "v0.32.3-upgrade").await;
    let taken = snapshots(&bed, 1).await;
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(taken[0].0["kcp"]["upgradeTo"], format!("{KCP_REPOSITORY}:v0.32.3-upgrade"));
    state_names(&bed, &format!("{KCP_REPOSITORY}:v0.32.3-upgrade")).await;
    let none_for_alpha = manifests(&bed.s3.client(), &bed.s3.bucket).await;
    assert_eq!(none_for_alpha.len(), 1, "{none_for_alpha:?}");
    process.terminate(WAIT);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_changed_while_the_agent_was_down_takes_exactly_one_snapshot_at_start_and_a_restart_takes_none() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    operator_objects(cluster, &ns).await;
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 20, 200).await.unwrap();
    let config = config(&bed, &etcd.members[0].client_url, "Shard", &ns, "alpha");
    let admin = cluster.client();

    let mut first = started(cluster, &config, &ns).await;
    state_names(&bed, OLD).await;
    first.terminate(WAIT).expect("the agent stops on SIGTERM");
    // The upgrade while no replica watches.
    let second_tag = format!("{KCP_REPOSITORY}:v0.32.3-second");
    set_tag(&admin, &ns, "Shard", "alpha", "v0.32.3-second").await;
    let mut second = started(cluster, &config, &ns).await;
    let taken = snapshots(&bed, 1).await;
    let kcp = &taken[0].0["kcp"];
    assert_eq!((kcp["image"].as_str(), kcp["upgradeTo"].as_str()), (Some(OLD), Some(second_tag.as_str())));
    assert_eq!(kcp["afterRollMayHaveBegun"], true, "found at start, the roll may have begun: {kcp}");
    assert_eq!(second.metric("etcd_snapshotter_pre_upgrade_late_total{shard=\"root\"}").await.unwrap(), 1.0);
    state_names(&bed, &second_tag).await;
    second.terminate(WAIT).expect("the agent stops on SIGTERM");

    // A restart with nothing changed takes none; the next change, made once it runs, is its only snapshot.
    let mut third = started(cluster, &config, &ns).await;
    let third_tag = format!("{KCP_REPOSITORY}:v0.32.3-third");
    set_tag(&admin, &ns, "Shard", "alpha", "v0.32.3-third").await;
    let taken = snapshots(&bed, 2).await;
    let to = |t: &str| taken.iter().filter(|(m, _)| m["kcp"]["upgradeTo"] == t).count();
    assert_eq!((to(&second_tag), to(&third_tag), taken.len()), (1, 1, 2), "{taken:?}");
    state_names(&bed, &third_tag).await;
    third.terminate(WAIT);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_image_is_reported_with_its_field_and_takes_no_snapshot_until_fixed() {
    let bed = Bed::with_cluster().await.unwrap();
    let (ns, _etcd, mut process) = watching_root(&bed).await;
    let admin = bed.cluster().client();

    // The CRD takes any string as a tag; the agent takes only a tag.
    set_tag(&admin, &ns, "RootShard", "root", "v0.33.0; echo pwned").await;
    let invalid = testbed::eventually(WAIT, "the KcpImageInvalid Event", || async {
        let found = events(&admin, &ns, "KcpImageInvalid").await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    let note = invalid[0].note.clone().unwrap();
    assert!(note.contains(&format!("RootShard {ns}/root: spec.image.tag: not an image tag")), "{note}");
    assert!(note.contains("no snapshot is taken") && !note.contains("pwned"), "{note}");
    assert_eq!(process.metric("etcd_snapshotter_pre_upgrade_invalid_image_total{shard=\"root\"}").await.unwrap(), 1.0);
    assert!(manifests(&bed.s3.client(), &bed.s3.bucket).await.is_empty());

    // Fixed: the change is from the last valid image, and it is the only snapshot.
    set_tag(&admin, &ns, "RootShard", "root", "v0.33.0").await;
    let taken = snapshots(&bed, 1).await;
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].0["kcp"]["image"], OLD);
    assert_eq!(taken[0].0["kcp"]["upgradeTo"], format!("{KCP_REPOSITORY}:v0.33.0"));
    process.terminate(WAIT);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_before_a_kcp_upgrade_sets_every_published_series_a_scheduled_snapshot_sets() {
    let bed = Bed::with_cluster().await.unwrap();
    let (ns, _etcd, mut process) = watching_root(&bed).await;
    set_tag(&bed.cluster().client(), &ns, "RootShard", "root", "v0.32.3-upgrade").await;
    let taken = snapshots(&bed, 1).await;
    let manifest = &taken[0].0;
    // The series a scheduled snapshot sets when it publishes (the schedule's path and this one share it): each
    // is 0 from the start, so a path that skipped one leaves it there.
    let series = |name: &str| format!("etcd_snapshotter_{name}{{shard=\"root\"}}");
    let value = |name: &'static str| {
        let (process, series) = (&process, series(name));
        async move { process.wait_for_metric(&series, WAIT, |v| v > 0.0).await }
    };
    assert!(value("last_success_timestamp_seconds").await > 0.0);
    assert!(value("duration_seconds").await > 0.0);
    assert_eq!(value("object_bytes").await, manifest["objectSizeBytes"].as_f64().unwrap());
    assert_eq!(value("database_bytes").await, manifest["dbSizeBytes"].as_f64().unwrap());
    assert_eq!(value("revision").await, manifest["revision"].as_f64().unwrap());
    assert_eq!(value("snapshots_kept").await, 1.0);
    process.terminate(WAIT);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_before_an_upgrade_that_waited_for_the_shards_lock_is_marked_after_roll_may_have_begun() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    operator_objects(cluster, &ns).await;
    let etcd = bed.etcd("root", 1).await.unwrap();
    let config = config(&bed, &etcd.members[0].client_url, "RootShard", &ns, "root");
    let mut process = started(cluster, &config, &ns).await;
    state_names(&bed, OLD).await;
    // Another run (a one-shot, an old leader in its grace) holds the shard while the image changes.
    let loaded: etcd_snapshotter::config::Config = kcp_keeper_runtime::config::load(&config).unwrap();
    let store = etcd_snapshotter::storage::Store::new(&loaded.storage).unwrap();
    let held =
        etcd_snapshotter::shard_lock::acquire(&store, "root", "snapshot", Duration::ZERO, |_: &str| {}).await.unwrap();
    let admin = cluster.client();
    set_tag(&admin, &ns, "RootShard", "root", "v0.32.3-upgrade").await;
    // The agent finds the lock held and says so on the RootShard; the snapshot comes once it is released.
    let waiting = testbed::eventually(WAIT, "the PreUpgradeSnapshotWaiting Event", || async {
        let found = events(&admin, &ns, "PreUpgradeSnapshotWaiting").await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert!(waiting[0].note.as_deref().unwrap().contains("snapshot (pid"), "names the holder: {waiting:?}");
    held.release().await;
    let taken = snapshots(&bed, 1).await;
    let kcp = &taken[0].0["kcp"];
    assert_eq!(kcp["afterRollMayHaveBegun"], true, "it waited for another run: {kcp}");
    process.terminate(WAIT);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upgrade_rolled_back_and_made_again_takes_a_fresh_snapshot_each_time_not_the_first_rounds_again() {
    let bed = Bed::with_cluster().await.unwrap();
    let (ns, _etcd, mut process) = watching_root(&bed).await;
    let admin = bed.cluster().client();
    let (old_tag, new_tag) = (OLD.rsplit_once(':').unwrap().1, "v0.32.3-upgrade");
    let new = format!("{KCP_REPOSITORY}:{new_tag}");

    set_tag(&admin, &ns, "RootShard", "root", new_tag).await;
    snapshots(&bed, 1).await;
    state_names(&bed, &new).await;
    // Rolled back: a snapshot of the change back.
    set_tag(&admin, &ns, "RootShard", "root", old_tag).await;
    snapshots(&bed, 2).await;
    state_names(&bed, OLD).await;
    // The same upgrade again: a snapshot of now, not the first round's (which holds nothing written since).
    set_tag(&admin, &ns, "RootShard", "root", new_tag).await;
    let taken = snapshots(&bed, 3).await;
    let upgrades: Vec<_> = taken.iter().filter(|(m, _)| m["kcp"]["upgradeTo"] == new.as_str()).collect();
    assert_eq!(upgrades.len(), 2, "{taken:?}");
    let state = state_names(&bed, &new).await;
    let latest = upgrades.iter().map(|(m, _)| m["id"].as_str().unwrap()).max().unwrap();
    assert_eq!(state["snapshot"], latest, "the state names the second round's snapshot: {state}");
    assert!(taken.iter().all(|(_, drill)| drill["passed"] == true), "{taken:?}");
    process.terminate(WAIT);
}
