//! A snapshot before a kcp upgrade on the seed's real layout: the Shard `alpha`'s kcp image is
//! changed to a second tag of the same build (`testbed::seed::images::tag_kcp`), so the kcp-operator really rolls
//! alpha's Deployment (a new ReplicaSet, a new pod starting kcp on etcd-alpha) and nothing else changes; the
//! etcd-snapshotter in its pod, installed by the chart with `beforeUpgrade` on both shards, snapshots alpha and
//! drills it. The race with the roll is measured:
//!
//! - a sampler in the test reads etcd-alpha's revision again and again (`etcdctl endpoint status` run inside the
//!   node's network against the member's pod address: tens of milliseconds a sample, where a `kubectl exec` took
//!   a second or more on a busy CI machine and left no sample between the change and the roll), each sample
//!   stamped with the host clock after its answer came back (the node, the agent, the kubelet and containerd
//!   share that clock: it is one machine);
//! - the first pod of the new image: its creation time (the apiserver's, whole seconds) and when containerd
//!   created its container (nanoseconds; kcp's process starts after it). The kubelet's `startedAt` is whole
//!   seconds, truncated: when the roll came within a second of the change it fell before the change itself, and
//!   no sample could precede it;
//! - the snapshot's `revisionUpperBound` (the member's revision read once etcd held the snapshot's read
//!   transaction) and `finishedAt`.
//!
//! What a snapshot holds is fixed when etcd opens its read transaction, before the stream's first message, not
//! when the upload finishes: the agent reads `revisionUpperBound` after that first message and stamps `startedAt`
//! after that read (same host clock). kcp in the new pod cannot write before its container was created, so
//! `startedAt <=` the container's creation proves the snapshot holds nothing the new pod wrote. The agent cannot
//! hold the operator back, and on a loaded machine the roll can win: the manifest must then say
//! `afterRollMayHaveBegun` (asserted either way: the snapshot came first, or it says it may not have; and it says so
//! whenever the new pod existed before the snapshot's start). A revision sample answered before the creation and
//! asked after `startedAt` witnesses the first case in revisions (`revisionUpperBound <=` it), asserted when one
//! exists. The margins (creation minus the snapshot's start and
//! finish, and in revisions) are printed. Afterwards the image is set back and the roll waited for.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use testbed::node::{self, Node};
use testbed::seed::images::{KCP_IMAGE, KCP_SECOND_TAG, KCP_TAG, tag_kcp};
use testbed::seed::layout::{NAMESPACE, SHARD};

const DEPLOYMENT: &str = "alpha-shard-kcp";

/// Reads etcd-alpha's revision from inside the node, straight to the member's pod address (no apiserver or
/// kubelet in the path, so samples are dense).
struct RevisionReader {
    etcdctl: std::path::PathBuf,
    endpoint: String,
}

impl RevisionReader {
    fn new(node: &Node) -> Result<Self> {
        let peers = peers::locate_only(&["etcdctl"])?;
        let ip = testbed::seed::kubectl_ok(
            node,
            &["get", "pod", "-n", NAMESPACE, &format!("etcd-{SHARD}-0"), "-o", "jsonpath={.status.podIP}"],
        )?;
        ensure!(!ip.trim().is_empty(), "etcd-{SHARD}-0 has no pod address");
        Ok(Self { etcdctl: peers.path("etcdctl").to_path_buf(), endpoint: format!("http://{}:2379", ip.trim()) })
    }

    fn revision(&self, node: &Node) -> Result<i64> {
        let args =
            [format!("--endpoints={}", self.endpoint), "endpoint".into(), "status".into(), "-w".into(), "json".into()];
        let out = node.run_inside("etcdctl endpoint status", &[&self.etcdctl], &args)?;
        let status: Value = serde_json::from_str(&out)?;
        status[0]["Status"]["header"]["revision"].as_i64().context("no revision in etcdctl's status")
    }
}

/// When containerd created the container `containerd://<id>` (nanoseconds, the host clock).
fn container_created(node: &Node, container_id: &str) -> Result<Timestamp> {
    let id = container_id.strip_prefix("containerd://").context("not a containerd container id")?;
    let info: Value = serde_json::from_str(&node.ctr("ctr containers info", &["containers", "info", id])?)?;
    Ok(info["CreatedAt"].as_str().context("no CreatedAt in ctr's container info")?.parse()?)
}

/// The recorded state of shard alpha's watch (`kcp-image.json` in the bucket), once it names `image`.
async fn state_names(node: &'static Node, image: &str) -> Value {
    let key = format!("{SHARD}/kcp-image.json");
    testbed::eventually(Duration::from_secs(240), &format!("alpha's recorded kcp image to be {image}"), || {
        let key = key.clone();
        async move {
            chart::on_seed::object(node, &key)
                .ok()
                .filter(|s| s["image"] == image && (s["snapshot"].is_string() || image == KCP_IMAGE))
        }
    })
    .await
}

/// A pod of the new image: its name, creation time (whole seconds) and, once it has one, its container's id and
/// restart count.
struct NewPod {
    name: String,
    created: Timestamp,
    container: Option<(String, i64)>,
}

/// The first pod (by creation) that runs `image` in the namespace.
fn first_pod_of(node: &Node, image: &str) -> Result<Option<NewPod>> {
    let out = node.kubectl(&["get", "pods", "-n", NAMESPACE, "-o", "json"])?;
    ensure!(out.status.success(), "kubectl get pods: {}", String::from_utf8_lossy(&out.stderr));
    let pods: Value = serde_json::from_slice(&out.stdout)?;
    let mut found = Vec::new();
    for pod in pods["items"].as_array().context("no items")? {
        let runs = pod["spec"]["containers"].as_array().is_some_and(|cs| cs.iter().any(|c| c["image"] == image));
        if !runs {
            continue;
        }
        let created: Timestamp =
            pod["metadata"]["creationTimestamp"].as_str().context("no creationTimestamp")?.parse()?;
        let container = pod["status"]["containerStatuses"].as_array().and_then(|cs| {
            cs.iter().find_map(|c| Some((c["containerID"].as_str()?.to_string(), c["restartCount"].as_i64()?)))
        });
        found.push(NewPod {
            name: pod["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            created,
            container,
        });
    }
    found.sort_by_key(|p| p.created);
    Ok(found.into_iter().next())
}

#[tokio::test]
async fn a_changed_shard_image_is_snapshotted_before_the_first_new_pod_wrote_to_etcd_or_marked_as_after_the_roll_and_the_margin_is_measured()
-> Result<()> {
    crate::keeper();
    let node = node::shared();
    // The layout is shared by the binary's tests: this one changes alpha's Deployment.
    let _changing = crate::LAYOUT_CHANGES.write().await;
    // The agent recorded the image alpha runs now (its baseline), so it is watching.
    state_names(node, KCP_IMAGE).await;
    let new_image = tag_kcp(node, KCP_SECOND_TAG)?;
    let reader = RevisionReader::new(node)?;
    // A first answer before the change. On a loaded machine one `etcdctl endpoint status` can miss its 2 s dial
    // (seen in a full run: "context deadline exceeded while waiting for connections to become ready"), so the
    // member gets two minutes to answer; the sampler below skips a missed sample the same way.
    testbed::eventually_seen(Duration::from_secs(120), "a first revision sample from etcd-alpha", || async {
        Ok(reader.revision(node).map_err(|e| format!("{e:#}")))
    })
    .await?;

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // (asked at, answered at, revision): the read happened somewhere between the two.
            let mut samples: Vec<(Timestamp, Timestamp, i64)> = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let asked = Timestamp::now();
                if let Ok(revision) = reader.revision(node) {
                    samples.push((asked, Timestamp::now(), revision));
                }
            }
            samples
        })
    };
    let patch = format!(r#"{{"spec":{{"image":{{"tag":"{KCP_SECOND_TAG}"}}}}}}"#);
    let changed_at = Timestamp::now();
    chart_kubectl(node, &["patch", "-n", NAMESPACE, "shard", SHARD, "--type=merge", "-p", &patch])?;

    let state = state_names(node, &new_image).await;
    let id = state["snapshot"].as_str().context("the state names its snapshot")?.to_string();
    let manifest = chart::on_seed::manifest(node, &id)?;
    ensure!(manifest["kcp"]["image"] == KCP_IMAGE && manifest["kcp"]["upgradeTo"] == new_image.as_str(), "{manifest}");
    let NewPod { name: pod, created, container } =
        testbed::eventually(Duration::from_secs(240), "the new pod's container to be created", || async {
            first_pod_of(node, &new_image).ok().flatten().filter(|p| p.container.is_some())
        })
        .await;
    let (container_id, restarts) = container.expect("filtered");
    stop.store(true, Ordering::SeqCst);
    // A restarted container's creation is not its first: fall back to the pod's creation (whole seconds).
    let started = if restarts == 0 { container_created(node, &container_id)? } else { created };
    let samples = sampler.join().expect("the sampler thread");

    let upper = manifest["revisionUpperBound"].as_i64().or(manifest["revision"].as_i64()).context("no revision")?;
    let finished: Timestamp = manifest["finishedAt"].as_str().context("no finishedAt")?.parse()?;
    let snapshot_started: Timestamp = manifest["startedAt"].as_str().context("no startedAt")?.parse()?;
    let before_start: Vec<_> = samples.iter().filter(|(_, at, _)| *at <= started).collect();
    let (asked_at, last_at, at_start) =
        **before_start.last().context("no revision sample answered before the new container was created")?;
    let seconds = |a: Timestamp, b: Timestamp| a.duration_since(b).as_secs_f64();
    eprintln!(
        "kcp upgrade race on alpha ({} revision samples): image changed at {changed_at}; snapshot {id} started {snapshot_started} \
         ({:.2} s after the change), finished {finished} ({:.2} s after), revision <= {upper}; first new pod {pod} created {created} \
         (whole seconds), its container created {started}; margin: container created {:.2} s after the snapshot's content \
         was fixed, pod created {:.2} s and container created {:.2} s after the snapshot finished (lower bounds of when kcp \
         in it could write); etcd-alpha was at revision {at_start} at {last_at}, \
         before the container was created: \
         {} revision(s) above the snapshot's upper bound",
        samples.len(),
        seconds(snapshot_started, changed_at),
        seconds(finished, changed_at),
        seconds(started, snapshot_started),
        seconds(created, finished),
        seconds(started, finished),
        at_start - upper,
    );
    // The manifest says when the roll may have begun before the snapshot (`afterRollMayHaveBegun`): it must when the
    // first new pod existed before the snapshot's content was fixed (its whole-second creation time plus a second
    // is at or before `startedAt`); the agent lists the shard's pods after the snapshot to know. It also says so
    // when its snapshot waited for another run (a scheduled snapshot in flight), which a loaded machine makes
    // likely.
    let marked = manifest["kcp"].get("afterRollMayHaveBegun").is_some();
    let pod_first = seconds(snapshot_started, created) >= 1.0;
    eprintln!("afterRollMayHaveBegun: {marked} (the first new pod created before the snapshot's start: {pod_first})");
    ensure!(!pod_first || marked, "the new pod existed before the snapshot, unmarked: {manifest}");
    if snapshot_started > started {
        // The roll won the race (the agent cannot hold the operator back): the snapshot must say so.
        ensure!(
            marked,
            "the snapshot's content was fixed at {snapshot_started} (its startedAt), after the new pod's container \
             was created at {started}, and the manifest does not say the roll may have begun: {manifest}"
        );
    } else if asked_at >= snapshot_started {
        // The revision witness: a sample asked after the snapshot's content was fixed and answered before the
        // container was created read what etcd-alpha held then, so the snapshot holds no write the new pod made.
        ensure!(
            upper <= at_start,
            "the snapshot's revision (<= {upper}) is not below what etcd-alpha held before the new pod's container \
             was created ({at_start} at {last_at}): the roll won the race"
        );
    } else {
        // Each sample starts a process in the node, so on a loaded machine none may fall in a short margin: then
        // only the times above say it (they come from the same clock).
        eprintln!(
            "no revision sample fell between the snapshot's start ({snapshot_started}) and the container's creation ({started}): \
             the last one before it was asked at {asked_at}; the order is proven by the times alone"
        );
    }
    let report = chart::on_seed::object(node, &format!("{id}/drill.json"))?;
    ensure!(report["passed"] == true, "the drill of the snapshot before the upgrade: {report}");

    // Back to the pinned tag; the agent takes its snapshot of that change too, and the roll finishes.
    let back = format!(r#"{{"spec":{{"image":{{"tag":"{KCP_TAG}"}}}}}}"#);
    chart_kubectl(node, &["patch", "-n", NAMESPACE, "shard", SHARD, "--type=merge", "-p", &back])?;
    testbed::seed::rollout(node, NAMESPACE, &format!("deployment/{DEPLOYMENT}"), "240s")?;
    testbed::eventually(Duration::from_secs(240), "the state back on the pinned image", || async {
        chart::on_seed::object(node, &format!("{SHARD}/kcp-image.json")).ok().filter(|s| s["image"] == KCP_IMAGE)
    })
    .await;
    // The other tests of the binary use alpha once this one lets go of the layout.
    testbed::seed::settled(node, &node.client().await?, Duration::from_secs(20)).await
}

fn chart_kubectl(node: &Node, args: &[&str]) -> Result<()> {
    testbed::seed::kubectl_ok(node, args).map(|_| ())
}
