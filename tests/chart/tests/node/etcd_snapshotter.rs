//! etcd-snapshotter's tests on the shared node and install (see main.rs), beyond the job test there: its pod
//! deleted mid-upload, and its spill volume when S3 is slow. Both make S3 slow the same way: a fault proxy inside
//! the node, in front of versitygw, with the S3 Service's endpoints pointed at it, so the agent's pods reach the
//! slow S3 by the same DNS name; and both grow the shard's etcd so that a snapshot takes several parts. The bucket
//! is checked with S3's own API (ListMultipartUploads, ListParts, HeadObject), from inside the node's network,
//! straight at versitygw.

#[allow(unused_imports)]
use super::*;

use std::io::Read;

use chart::on_node::{ETCD_PORT, S3_KEY, S3_PORT, S3_SECRET};
use testbed::fault_proxy::Fault;
use testbed::node::{NODE_IP, NodeFaultProxy};

/// etcd-snapshotter's Lease: its holder runs the schedules.
const LEASE: &str = "kcp-keeper-etcd-snapshotter";
/// Where the fault proxy listens, on the node's address (the S3 Service's endpoints point here while S3 is slow).
const PROXY_PORT: u16 = 7071;
const BUCKET: &str = "kcp-backups";
/// Shard root's directory under the chart's prefix `kcp/etcd`.
const SHARD_DIR: &str = "kcp/etcd/root/";
/// The shard's database grown to at least this: five parts at the chart's default partSize (8 MiB), eight at
/// 5 MiB.
const DB_BYTES: i64 = 40 << 20;

/// Grows shard root's etcd (inside the node) to [`DB_BYTES`]; its size then.
async fn grow_etcd(node: &Node) -> Result<i64> {
    node.in_network(|| async {
        let mut etcd = etcd_client::Client::connect([format!("http://{NODE_IP}:{ETCD_PORT}")], None).await?;
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut i = 0;
        loop {
            let size = etcd.status().await?.db_size();
            if size >= DB_BYTES {
                return Ok(size);
            }
            // 1 MiB of xorshift output per key: nothing for zstd to squeeze, so the object is as large as the
            // database and takes as many parts.
            let value: Vec<u8> = (0..1 << 17)
                .flat_map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state.to_le_bytes()
                })
                .collect();
            etcd.put(format!("/kcp-keeper-test/bulk/{i:04}"), value, None).await?;
            i += 1;
        }
    })
    .await?
}

/// versitygw's own address inside the node (not the proxy's).
fn s3_url() -> String {
    format!("http://{NODE_IP}:{S3_PORT}")
}

/// Multipart uploads open under shard root's directory (ListMultipartUploads): (key, upload id).
async fn open_uploads(node: &Node) -> Result<Vec<(String, String)>> {
    node.in_network(|| async {
        let s3 = testbed::s3::client(&s3_url(), S3_KEY, S3_SECRET);
        let listed = s3.list_multipart_uploads().bucket(BUCKET).prefix(SHARD_DIR).send().await?;
        Ok(listed
            .uploads()
            .iter()
            .map(|u| (u.key().unwrap_or_default().to_string(), u.upload_id().unwrap_or_default().to_string()))
            .collect())
    })
    .await?
}

/// Parts an open upload holds (ListParts).
async fn uploaded_parts(node: &Node, key: &str, upload_id: &str) -> Result<usize> {
    let (key, upload_id) = (key.to_string(), upload_id.to_string());
    node.in_network(move || async move {
        let s3 = testbed::s3::client(&s3_url(), S3_KEY, S3_SECRET);
        let parts = s3.list_parts().bucket(BUCKET).key(key).upload_id(upload_id).send().await?;
        Ok(parts.parts().len())
    })
    .await?
}

/// Every manifest under shard root's directory, after checking that the object it names is there, complete
/// (HeadObject's size is the manifest's `objectSizeBytes`): (manifest key, manifest).
async fn checked_manifests(node: &Node) -> Result<Vec<(String, Value)>> {
    node.in_network(|| async {
        let s3 = testbed::s3::client(&s3_url(), S3_KEY, S3_SECRET);
        let mut keys = Vec::new();
        let mut token = None;
        loop {
            let page =
                s3.list_objects_v2().bucket(BUCKET).prefix(SHARD_DIR).set_continuation_token(token).send().await?;
            keys.extend(page.contents().iter().filter_map(|o| o.key().map(str::to_string)));
            token = page.next_continuation_token().map(str::to_string);
            if token.is_none() {
                break;
            }
        }
        let mut manifests = Vec::new();
        for key in keys.iter().filter(|k| k.ends_with("/manifest.json")) {
            let body = s3.get_object().bucket(BUCKET).key(key).send().await?.body.collect().await?.into_bytes();
            let manifest: Value = serde_json::from_slice(&body).with_context(|| key.clone())?;
            let dir = key.trim_end_matches("manifest.json");
            let object = format!("{dir}{}", manifest["object"].as_str().context("no object")?);
            let head = s3.head_object().bucket(BUCKET).key(&object).send().await;
            let size = head.with_context(|| format!("{key} names {object}, which is not in the bucket"))?;
            let size = size.content_length().unwrap_or(-1);
            ensure!(
                Some(size) == manifest["objectSizeBytes"].as_i64(),
                "{key} records {} bytes, {object} holds {size}",
                manifest["objectSizeBytes"]
            );
            manifests.push((key.clone(), manifest));
        }
        Ok(manifests)
    })
    .await?
}

/// Whether `key` is an object in the bucket (HeadObject).
async fn object_exists(node: &Node, key: &str) -> Result<bool> {
    let key = key.to_string();
    node.in_network(move || async move {
        let s3 = testbed::s3::client(&s3_url(), S3_KEY, S3_SECRET);
        Ok::<_, anyhow::Error>(s3.head_object().bucket(BUCKET).key(key).send().await.is_ok())
    })
    .await?
}

/// S3 made slow: the fault proxy inside the node in front of versitygw, and the S3 Service's endpoints on it.
/// Dropped, the endpoints go back to versitygw first, then the proxy stops.
struct SlowS3 {
    node: &'static Node,
    proxy: NodeFaultProxy,
}

impl SlowS3 {
    async fn start(node: &'static Node) -> Result<Self> {
        let proxy = node
            .fault_proxy((NODE_IP, PROXY_PORT).into(), (NODE_IP, S3_PORT).into())
            .await
            .context("starting the fault proxy inside the node")?;
        let slow = Self { node, proxy };
        slow.point_service_at(PROXY_PORT)?;
        Ok(slow)
    }

    /// The S3 Service's endpoints (the EndpointSlice on_node made for it) on `port` of the node's address.
    fn point_service_at(&self, port: u16) -> Result<()> {
        let patch = json!({"ports": [{"name": "main", "port": port, "protocol": "TCP"}]}).to_string();
        let out =
            self.node.kubectl(&["patch", "endpointslice", "-n", "kcp-system", "s3", "--type=merge", "-p", &patch])?;
        ensure!(out.status.success(), "patching the S3 endpoints: {}", String::from_utf8_lossy(&out.stderr));
        Ok(())
    }
}

impl Drop for SlowS3 {
    fn drop(&mut self) {
        self.proxy.clear();
        if let Err(e) = self.point_service_at(S3_PORT) {
            eprintln!("the S3 Service could not be pointed back at versitygw: {e:#}");
        }
    }
}

/// `kubectl logs -f` of an agent pod's container, on a thread, until the container ends: all it printed.
fn follow_logs(node: &Node, pod: &str) -> Result<std::thread::JoinHandle<String>> {
    let mut child = std::process::Command::new(node.peers.path("kubectl"))
        .arg("--kubeconfig")
        .arg(&node.kubeconfig)
        .args(["logs", "-f", "-n", NAMESPACE, pod, "-c", "etcd-snapshotter"])
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting kubectl logs -f")?;
    let mut stdout = child.stdout.take().context("no stdout")?;
    Ok(std::thread::spawn(move || {
        let mut logs = String::new();
        let _ = stdout.read_to_string(&mut logs);
        let _ = child.wait();
        logs
    }))
}

/// etcd-snapshotter's two pods Ready (none terminating) and the Lease held by one of them: (leader, its uid).
async fn settled_snapshotters(client: &kube::Client) -> (String, String) {
    testbed::eventually(Duration::from_secs(180), "two Ready etcd-snapshotters, one holding the Lease", || async {
        let pods = agent_pods(client, "etcd-snapshotter").await.ok()?;
        let holder = lease_holder(client, LEASE).await?;
        let leader = pods.iter().find(|p| p.0 == holder)?;
        (pods.len() == 2 && pods.iter().all(|p| p.3)).then(|| (leader.0.clone(), leader.1.clone()))
    })
    .await
}

/// After a test that replaced etcd-snapshotter's pods: only its two current pods are left, Ready, none terminating
/// (the old ones have up to the chart's 45 s grace; the install test checks every pod of the release).
async fn no_pod_left_terminating(client: &kube::Client) {
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let of_agent = ListParams::default().labels("app.kubernetes.io/name=etcd-snapshotter");
    testbed::eventually(Duration::from_secs(180), "etcd-snapshotter's old pods gone", || async {
        let all = pods.list(&of_agent).await.ok()?.items;
        let ready = agent_pods(client, "etcd-snapshotter").await.ok()?.iter().filter(|p| p.3).count();
        (all.len() == 2 && ready == 2).then_some(())
    })
    .await;
}

/// `kubectl delete pod` of etcd-snapshotter's leader (the kubelet's SIGTERM, the chart's grace) while it uploads
/// a snapshot that S3 takes too slowly to finish within the agent's drain: the upload is aborted and the shard's
/// lock released before the container exits. Mid-upload is shown, not assumed: the upload is open in the bucket
/// (ListMultipartUploads) with none of its parts stored (ListParts; the proxy holds the two in flight for 40 s, past
/// the 15 s `Grace::finish`), when the pod is deleted. Then: the upload is gone, its object never appeared, the
/// pod's log shows the grace run out and the abort, every manifest names a complete object, and the next leader
/// publishes a snapshot a restore drill proves.
#[tokio::test]
async fn deleting_the_snapshotter_pod_mid_upload_aborts_the_multipart_upload_and_the_next_leader_publishes_a_good_snapshot()
-> Result<()> {
    installed();
    let _exclusive = RELEASE.write().await;
    let node = node::shared();
    let client = node.client().await?;
    let size = grow_etcd(node).await?;
    eprintln!("shard root's etcd holds {size} bytes");
    let (leader, _) = settled_snapshotters(&client).await;
    let before: Vec<String> = checked_manifests(node).await?.into_iter().map(|(k, _)| k).collect();

    let slow = SlowS3::start(node).await?;
    // No upload in progress when the fault goes in: a run already past its first parts would have its third held
    // instead, with two stored (it happened once in a full run).
    testbed::eventually(Duration::from_secs(120), "no upload in progress", || async {
        open_uploads(node).await.ok()?.is_empty().then_some(())
    })
    .await;
    // The first two parts of the next upload (partsInFlight 2): held past the finish grace; later parts, if any
    // run, pass, so the next leader's run is not slowed.
    slow.proxy.inject("PUT", "partNumber=", Fault::Delay(Duration::from_secs(40)), 2);
    let (key, upload_id) = testbed::eventually(Duration::from_secs(120), "a part held by the proxy", || async {
        let (_, _, path) = slow.proxy.injected().into_iter().next()?;
        let (key, query) = path.strip_prefix(&format!("/{BUCKET}/"))?.split_once('?')?;
        let id = query.split('&').find_map(|kv| kv.strip_prefix("uploadId="))?;
        Some((key.to_string(), id.to_string()))
    })
    .await;
    let open = open_uploads(node).await?;
    ensure!(open.contains(&(key.clone(), upload_id.clone())), "{key} ({upload_id}) is not open: {open:?}");
    let stored = uploaded_parts(node, &key, &upload_id).await?;
    ensure!(stored == 0, "{stored} part(s) of {key} already stored: not mid-upload");
    let holder = lease_holder(&client, LEASE).await.context("no Lease holder")?;
    ensure!(holder == leader, "the Lease moved from {leader} to {holder} before the delete");
    let in_flight = pod_metric(node, &leader, "etcd_snapshotter", "parts_in_flight")?;
    eprintln!("{leader} uploads {key}: open, no part stored, parts in flight {in_flight:?}");

    let logs = follow_logs(node, &leader)?;
    let deleted = Instant::now();
    let out = node.kubectl(&["delete", "pod", "-n", NAMESPACE, &leader, "--wait=false"])?;
    ensure!(out.status.success(), "kubectl delete pod: {}", String::from_utf8_lossy(&out.stderr));
    testbed::eventually(Duration::from_secs(90), "the deleted pod's container to end", || async {
        logs.is_finished().then_some(())
    })
    .await;
    let exited = deleted.elapsed();
    let logs = logs.join().map_err(|_| anyhow::anyhow!("the log thread panicked"))?;
    let line = |text: &str| logs.lines().find(|l| l.contains(text)).map(str::to_string);
    ensure!(line("shutdown: letting the job in flight finish").is_some(), "no drain in the log:\n{logs}");
    ensure!(
        line("the job did not finish within its grace; aborting it").is_some(),
        "the snapshot was not cut at the grace's end (delete too late?):\n{logs}"
    );
    let aborted = line("multipart upload aborted").with_context(|| format!("no abort in the log:\n{logs}"))?;
    ensure!(aborted.contains(&key), "aborted another upload than {key}: {aborted}");
    ensure!(line("abort hook did not finish in time").is_none(), "the abort overran its bound:\n{logs}");
    eprintln!("{leader}'s container ended {exited:.1?} after the delete: {aborted}");
    // Straight after the container ended: the abort reached the bucket, and no part of the upload made an object.
    let open = open_uploads(node).await?;
    ensure!(!open.iter().any(|(_, id)| id == &upload_id), "{key} ({upload_id}) is still open: {open:?}");
    ensure!(!object_exists(node, &key).await?, "{key} exists though its upload was aborted");
    drop(slow);

    let manifest = testbed::eventually(Duration::from_secs(240), "the next leader's published snapshot", || async {
        let manifests = checked_manifests(node).await.ok()?;
        manifests.into_iter().find(|(k, _)| !before.contains(k)).map(|(_, m)| m)
    })
    .await;
    let id = manifest["id"].as_str().context("no id")?.to_string();
    let manifests = checked_manifests(node).await?;
    eprintln!("{} manifests, each naming a complete object; the next snapshot is {id}", manifests.len());
    let drilled = exec_in_agent(node, "etcd-snapshotter", &["/etcd-snapshotter", "drill", &id])?;
    eprintln!("drill of {id}:\n{drilled}");
    // With S3 fast again no upload stays open (one may be open at an instant: the schedule runs every 20 s).
    testbed::eventually(Duration::from_secs(60), "no multipart upload open", || async {
        open_uploads(node).await.ok().filter(Vec::is_empty).map(|_| ())
    })
    .await;
    settled_snapshotters(&client).await;
    no_pod_left_terminating(&client).await;
    Ok(())
}

/// Bytes of parts in a run directory of the spill volume of the pod `uid`, as the kubelet's volume holds them.
fn spilled_on_disk(node: &Node, uid: &str) -> Result<u64> {
    let volume = node.kubelet_root().join(format!("pods/{uid}/volumes/kubernetes.io~empty-dir/spill"));
    let out = node.run_inside(
        "find the spilled parts",
        &[std::path::Path::new("/usr/bin/find")],
        &[volume.display().to_string(), "-name".into(), "part-*".into(), "-printf".into(), "%s\\n".into()],
    )?;
    Ok(out.lines().filter_map(|l| l.trim().parse::<u64>().ok()).sum())
}

/// The kubelet's Evicted Events about the pod `uid`: their messages.
async fn evictions(client: &kube::Client, uid: &str) -> Result<Vec<String>> {
    let events = Api::<Event>::namespaced(client.clone(), NAMESPACE).list(&ListParams::default()).await?;
    Ok(events
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Evicted") && e.involved_object.uid.as_deref() == Some(uid))
        .map(|e| e.message.unwrap_or_default())
        .collect())
}

/// With S3 slow (every part held 3 s by the proxy, one in flight), etcd-snapshotter in its pod spills the parts its
/// memory budget cannot hold into the chart's spill emptyDir, never more than `spill.maxBytes` there at once (the
/// pod's volume sampled through the kubelet's directory; the log shows the back-pressure engaged), under the
/// emptyDir's `sizeLimit`, so the kubelet does not evict the pod; and the snapshot publishes, its manifest
/// recording the spilled bytes, its object complete.
#[tokio::test]
async fn with_s3_slow_the_snapshotter_pod_spills_to_its_emptydir_under_max_bytes_is_not_evicted_and_publishes()
-> Result<()> {
    installed();
    let _exclusive = RELEASE.write().await;
    let node = node::shared();
    let client = node.client().await?;
    const PART: u64 = 5 << 20;
    const MAX_BYTES: u64 = 2 * PART;
    let mut values = values(node)?;
    // Two parts in memory (16 MiB holds three, one is always being filled), one uploading; two on disk at most,
    // under a 16 MiB volume: without the cap the eight parts of a 40 MiB database would overflow it.
    values["etcdSnapshotter"]["config"]["spill"] = json!({
        "directory": "/var/lib/etcd-snapshotter",
        "memoryBudget": "16Mi",
        "partSize": "5Mi",
        "partsInFlight": 1,
        "spillAfter": "200ms",
        "maxBytes": "10Mi",
    });
    values["etcdSnapshotter"]["spillSizeLimit"] = json!("16Mi");
    helm_upgrade(node, &values)?;
    let result = spills_under_max_bytes(node, &client, MAX_BYTES).await;
    helm_upgrade(node, &self::values(node)?)?;
    no_pod_left_terminating(&client).await;
    result
}

async fn spills_under_max_bytes(node: &'static Node, client: &kube::Client, max_bytes: u64) -> Result<()> {
    let size = grow_etcd(node).await?;
    eprintln!("shard root's etcd holds {size} bytes");
    let (leader, uid) = settled_snapshotters(client).await;
    let before: Vec<String> = checked_manifests(node).await?.into_iter().map(|(k, _)| k).collect();

    let slow = SlowS3::start(node).await?;
    slow.proxy.inject("PUT", "partNumber=", Fault::Delay(Duration::from_secs(3)), usize::MAX);
    // Sampled until a snapshot that spilled is published and the back-pressure has engaged. Not the first spilled
    // one alone: a snapshot under way as the endpoints moved, or one on the agent's pooled connections to the
    // old endpoint, sends only some parts through the proxy and may spill without reaching maxBytes.
    let log = || -> Result<String> {
        let out = node.kubectl(&["logs", "-n", NAMESPACE, &leader, "-c", "etcd-snapshotter"])?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (mut most, mut samples) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(300);
    let manifest = loop {
        let on_disk = match spilled_on_disk(node, &uid) {
            Ok(bytes) => bytes,
            // The volume goes with the pod: say why it went (an emptyDir over its sizeLimit evicts the pod).
            Err(e) => bail!("{leader}'s spill volume is gone: {e:#}\n{}", evictions(client, &uid).await?.join("\n")),
        };
        most = most.max(on_disk);
        samples += 1;
        if samples % 10 == 0 {
            let published = checked_manifests(node)
                .await?
                .into_iter()
                .find(|(k, m)| !before.contains(k) && m["spilledBytes"].as_u64().is_some_and(|b| b > 0));
            if let Some((_, manifest)) = published
                && log()?.contains("the spill directory is at spill.maxBytes; the part waits for memory")
            {
                break manifest;
            }
        }
        ensure!(
            Instant::now() < deadline,
            "no spilled snapshot published with spill.maxBytes holding a part back within 300s (most on disk: \
             {most}):\n{}",
            log()?
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let delayed = slow.proxy.injected().len();
    drop(slow);
    let spilled = manifest["spilledBytes"].as_u64().unwrap_or_default();
    eprintln!(
        "{} published with {spilled} bytes spilled ({delayed} parts held by the proxy); at most {most} bytes of \
         parts in the pod's spill volume in {samples} samples",
        manifest["id"]
    );
    ensure!(most > 0, "no part was ever seen in the pod's spill volume");
    ensure!(most <= max_bytes, "{most} bytes of parts in the spill volume, over spill.maxBytes {max_bytes}");
    let metric = pod_metric(node, &leader, "etcd_snapshotter_spilled", "shard=\"root\"}")?;
    ensure!(metric.as_ref().is_some_and(|(_, v)| *v > 0.0), "the pod's spilled metric: {metric:?}");

    // The pod was not evicted: the same pod, Running, Ready, its container never restarted.
    let pod = Api::<Pod>::namespaced(client.clone(), NAMESPACE).get(&leader).await?;
    ensure!(pod.metadata.uid.as_deref() == Some(uid.as_str()), "{leader} was replaced");
    let status = pod.status.clone().unwrap_or_default();
    ensure!(status.phase.as_deref() == Some("Running"), "{leader}: {:?} {:?}", status.phase, status.reason);
    let now = agent_pods(client, "etcd-snapshotter").await?;
    let this = now.iter().find(|p| p.1 == uid).context("the leader is gone")?;
    ensure!(this.3 && this.2 == 0, "{leader}: ready {}, restarts {}", this.3, this.2);
    let evicted = evictions(client, &uid).await?;
    ensure!(evicted.is_empty(), "the kubelet evicted {leader}: {evicted:?}");

    // The back-pressure engaged (the loop waited for it), and the spill is said.
    let text = log()?;
    ensure!(text.contains("S3 lagged: parts went through the spill directory"), "no spill in the log:\n{text}");
    Ok(())
}
