//! Transient S3 faults between the agent and a real versitygw, injected by the test bed's fault proxy: a part
//! answered with 503 SlowDown, a reset connection or no answer at all is retried within its budget; a run
//! that fails past it is run again within its tick; every retry is counted.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use common::*;
use testbed::fault_proxy::{Fault, FaultProxy};
use testbed::metrics::{scrape, value};

/// UploadPart of part 1 (the SDK writes `partNumber` before `uploadId` in the query).
const PART_ONE: &str = "partNumber=1&";

/// A configuration through `proxy` with a short attempt timeout (a stalled request fails in seconds) and
/// `extra_storage` lines.
fn config_through(bed: &Bed, options: Options, proxy: &FaultProxy, extra_storage: &str) -> PathBuf {
    let options = Options { s3_endpoint: proxy.url.clone(), extra_storage, attempt_timeout: "3s", ..options };
    write_config(bed, &options).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_part_answered_slowdown_then_reset_then_stalled_is_retried_and_the_snapshot_publishes_and_verifies() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    // Two parts of 5 MiB: the faults hit part 1 while part 2 goes through.
    load(&mut client, "/registry/things", 300, 20_000).await.unwrap();
    let proxy = FaultProxy::start(&bed.s3.endpoint).await.unwrap();
    proxy.inject("PUT", PART_ONE, Fault::SlowDown, 1);
    proxy.inject("PUT", PART_ONE, Fault::Reset, 1);
    proxy.inject("PUT", PART_ONE, Fault::Stall(Duration::from_secs(20)), 1);
    let options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    let config = config_through(&bed, options, &proxy, "");

    let out = cli(&["snapshot", "--config", config.to_str().unwrap()]);
    let log = text(&out);
    assert!(out.status.success(), "three transient faults on one part are within its budget: {log}");
    let injected = proxy.injected();
    assert_eq!(injected.len(), 3, "every fault was applied: {injected:?}");
    assert_eq!(proxy.seen("PUT", PART_ONE), 4, "part 1 took four attempts");
    for reason in ["throttled", "connection", "timeout"] {
        assert!(log.contains(&format!("reason=\"{reason}\"")) || log.contains(reason), "{reason} not logged: {log}");
    }
    let s3 = bed.s3.client();
    let manifests = manifests(&s3, &bed.s3.bucket).await;
    assert_eq!(manifests.len(), 1, "{manifests:?}");
    assert!(uploads(&s3, &bed.s3.bucket).await.is_empty(), "no multipart upload left");
    // The retried part is the part that was streamed: etcdutl reads the object whole.
    let id = manifests[0]["id"].as_str().unwrap();
    let etcdutl = bed.etcdutl().to_str().unwrap();
    let out = cli(&["verify", "--config", config.to_str().unwrap(), id, "--etcdutl", etcdutl]);
    assert!(out.status.success(), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_failing_past_its_part_budget_is_run_again_within_its_tick_and_every_retry_is_counted() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 50, 2_000).await.unwrap();
    let proxy = FaultProxy::start(&bed.s3.endpoint).await.unwrap();
    // Four SlowDowns: the whole budget of part 1 in the first run; the second run goes through.
    proxy.inject("PUT", PART_ONE, Fault::SlowDown, 4);
    let cron = daily_cron_in(30);
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.cron = &cron;
    let config = config_through(&bed, options, &proxy, "  partMaxAttempts: 4\n");
    let text = std::fs::read_to_string(&config).unwrap() + "retry:\n  initialBackoff: 1s\n";
    std::fs::write(&config, text).unwrap();
    let mut agent = agent(cluster, &config, &ns).identity("replica-a").spawn().unwrap();
    agent.wait_ready(WAIT).await.unwrap();

    let throttled_parts = "etcd_snapshotter_retries_total{op=\"upload_part\",reason=\"throttled\"}";
    let storage_runs = "etcd_snapshotter_retries_total{op=\"snapshot_run\",reason=\"storage\"}";
    let before = scrape(&agent.admin_url).await;
    assert_eq!(value(&before, throttled_parts).unwrap(), 0.0, "exported at 0 from the start");
    assert_eq!(value(&before, storage_runs).unwrap(), 0.0, "exported at 0 from the start");
    let last_success = "etcd_snapshotter_last_success_timestamp_seconds{shard=\"root\"}";
    let after = testbed::eventually(Duration::from_secs(90), "a snapshot published within the tick", || async {
        let text = scrape(&agent.admin_url).await;
        value(&text, last_success).ok().filter(|v| *v > 0.0).map(|_| text)
    })
    .await;
    assert_eq!(value(&after, throttled_parts).unwrap(), 3.0, "part 1 was retried three times in the first run");
    assert_eq!(value(&after, storage_runs).unwrap(), 1.0, "the tick's run was run once more");
    assert_eq!(value(&after, "etcd_snapshotter_failures_total{shard=\"root\",reason=\"storage\"}").unwrap(), 1.0);
    assert_eq!(proxy.injected().len(), 4);
    let s3 = bed.s3.client();
    assert_eq!(manifests(&s3, &bed.s3.bucket).await.len(), 1, "one snapshot for the one tick");
    assert!(uploads(&s3, &bed.s3.bucket).await.is_empty(), "the failed run's upload was aborted");
    let status = agent.terminate(Duration::from_secs(20));
    assert!(status.is_some_and(|s| s.success()), "SIGTERM: {status:?}");
}

/// Runs the `snapshot` one-shot through `proxy` while, during its stalled CompleteMultipartUpload, one byte of
/// part 1 is flipped where versitygw keeps it: the store then holds other bytes than those streamed.
async fn snapshot_with_a_part_corrupted_in_the_store(bed: &Bed, proxy: &FaultProxy, config: &Path) -> Output {
    proxy.clear();
    // The first CompleteMultipartUpload gets no answer (the attempt times out and is sent again).
    proxy.inject("POST", "uploadId=", Fault::Stall(Duration::from_secs(6)), 1);
    let child = std::process::Command::new(BINARY)
        .args(["snapshot", "--config", config.to_str().unwrap()])
        .env(NO_METADATA.0, NO_METADATA.1)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    testbed::eventually(WAIT, "the upload being completed", || async {
        (proxy.seen("POST", "uploadId=") >= 1).then_some(())
    })
    .await;
    let part = stored_part_of_size(&bed.path("s3-data"), 5 << 20).expect("part 1 in versitygw's data directory");
    let mut bytes = std::fs::read(&part).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&part, bytes).unwrap();
    tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap()
}

/// The one file of `size` bytes under `dir` (versitygw keeps an upload's parts as plain files).
fn stored_part_of_size(dir: &Path, size: u64) -> Option<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            let meta = entry.metadata().ok()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.len() == size {
                found.push(entry.path());
            }
        }
    }
    (found.len() == 1).then(|| found.remove(0))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_part_corrupted_in_flight_or_in_the_store_publishes_nothing_and_whole_bytes_publish_and_verify() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 300, 20_000).await.unwrap();
    let proxy = FaultProxy::start(&bed.s3.endpoint).await.unwrap();
    let s3 = bed.s3.client();
    let endpoints = || vec![etcd.members[0].client_url.clone()];
    let nothing_published = |what: &'static str| {
        let (s3, bucket) = (s3.clone(), bed.s3.bucket.clone());
        async move {
            assert!(manifests(&s3, &bucket).await.is_empty(), "{what}: no manifest");
            assert!(uploads(&s3, &bucket).await.is_empty(), "{what}: the upload was aborted");
            // The shard's run lock (`run.lock`) stays between runs; nothing else may.
            let left: Vec<String> =
                keys(&s3, &bucket).await.into_iter().filter(|k| !k.ends_with("/run.lock")).collect();
            assert!(left.is_empty(), "{what}: no object left: {left:?}");
        }
    };
    let checksums = config_through(&bed, Options::new(&bed, "root", endpoints()), &proxy, "");
    let read_back = config_through(&bed, Options::new(&bed, "root", endpoints()), &proxy, "  integrity: readBack\n");

    // In flight: every attempt of part 1 loses one bit on the way; the store refuses it (its SHA-256).
    proxy.inject("PUT", PART_ONE, Fault::FlipBody, 100);
    let out = cli(&["snapshot", "--config", checksums.to_str().unwrap()]);
    assert!(!out.status.success() && !proxy.injected().is_empty(), "{}", text(&out));
    nothing_published("corrupted in flight").await;

    // In the store, after the part was accepted: reading the object back finds it.
    let out = snapshot_with_a_part_corrupted_in_the_store(&bed, &proxy, &read_back).await;
    let log = text(&out);
    assert!(!out.status.success(), "a corrupted object must not be published: {log}");
    assert!(log.contains("integrity") && log.contains("read back"), "the failure says why: {log}");
    nothing_published("corrupted in the store").await;

    // Bytes that arrive and stay whole are published both ways and verify.
    proxy.clear();
    for config in [&checksums, &read_back] {
        snapshot_ok(config);
    }
    let published = manifests(&s3, &bed.s3.bucket).await;
    assert_eq!(published.len(), 2, "{published:?}");
    let etcdutl = bed.etcdutl().to_str().unwrap();
    for manifest in &published {
        let id = manifest["id"].as_str().unwrap();
        let out = cli(&["verify", "--config", checksums.to_str().unwrap(), id, "--etcdutl", etcdutl]);
        assert!(out.status.success(), "{}", text(&out));
    }
}
