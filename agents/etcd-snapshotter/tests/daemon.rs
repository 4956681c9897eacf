//! `etcd-snapshotter run` as processes against a real kube-apiserver, etcd and versitygw: schedules on the
//! Lease, two replicas, metrics, Events, RBAC with a real ServiceAccount token, S3 failures.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::proxy::Proxy;
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, PostParams};
use testbed::agent_process::AgentProcess;
use testbed::metrics::{scrape, value};

const LEASE: &str = "kcp-keeper-etcd-snapshotter";
const EVERY_FIVE_SECONDS: &str = "*/5 * * * * *";

/// Applies what `etcd-snapshotter rbac` prints for `namespace`.
async fn apply_documented_rbac(client: &kube::Client, namespace: &str) {
    let out = cli(&["rbac", "--namespace", namespace, "--service-account", "etcd-snapshotter"]);
    assert!(out.status.success(), "{}", text(&out));
    let yaml = String::from_utf8(out.stdout).unwrap();
    let mut docs = yaml.split("\n---\n");
    let role: Role = serde_yaml::from_str(docs.next().unwrap()).unwrap();
    let binding: RoleBinding = serde_yaml::from_str(docs.next().unwrap()).unwrap();
    Api::<Role>::namespaced(client.clone(), namespace).create(&PostParams::default(), &role).await.unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), namespace).create(&PostParams::default(), &binding).await.unwrap();
}

async fn events(client: &kube::Client, namespace: &str, reason: &str) -> Vec<Event> {
    let all = Api::<Event>::namespaced(client.clone(), namespace).list(&ListParams::default()).await.unwrap();
    all.items.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_with_the_documented_rbac_take_exactly_one_snapshot_per_tick() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 50, 1000).await.unwrap();
    apply_documented_rbac(&cluster.client(), &ns).await;
    let (kubeconfig, user) = cluster.service_account_kubeconfig(&ns, "etcd-snapshotter").await.unwrap();
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.cron = EVERY_FIVE_SECONDS;
    let config = write_config(&bed, &options).unwrap();

    let start =
        |identity: &str| agent(cluster, &config, &ns).identity(identity).kubeconfig(&kubeconfig).spawn().unwrap();
    let (mut a, mut b) = (start("replica-a"), start("replica-b"));
    a.wait_ready(WAIT).await.unwrap();
    b.wait_ready(WAIT).await.unwrap();

    let s3 = bed.s3.client();
    let by_tick = testbed::eventually(Duration::from_secs(90), "snapshots for three ticks", || {
        let (s3, bucket) = (s3.clone(), bed.s3.bucket.clone());
        async move {
            let mut by_tick: BTreeMap<String, usize> = BTreeMap::new();
            for m in manifests(&s3, &bucket).await {
                *by_tick
                    .entry(m["tick"].as_str().expect("a scheduled snapshot names its tick").to_string())
                    .or_default() += 1;
            }
            (by_tick.len() >= 3).then_some(by_tick)
        }
    })
    .await;
    assert!(by_tick.values().all(|n| *n == 1), "one snapshot per tick across two replicas: {by_tick:?}");

    let leases = Api::<Lease>::namespaced(cluster.client(), &ns);
    let lease = leases.get(LEASE).await.unwrap();
    let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap();
    let recorded =
        lease.metadata.annotations.as_ref().and_then(|a| a.get("schedule.kcp-keeper.io/snapshot-root").cloned());
    assert!(recorded.is_some(), "the tick is recorded on the Lease: {:?}", lease.metadata.annotations);
    let leader = if holder == "replica-a" { &a } else { &b };
    let text = scrape(&leader.admin_url).await;
    assert!(value(&text, "etcd_snapshotter_last_success_timestamp_seconds{shard=\"root\"}").unwrap() > 0.0);
    assert!(value(&text, "etcd_snapshotter_revision{shard=\"root\"}").unwrap() > 50.0);
    assert!(value(&text, "etcd_snapshotter_object_bytes{shard=\"root\"}").unwrap() > 0.0);
    // The kept count is set after the publish the bucket already shows: on a loaded machine it can lag it.
    leader.wait_for_metric("etcd_snapshotter_snapshots_kept{shard=\"root\"}", WAIT, |v| v >= 3.0).await;
    assert_eq!(value(&text, "etcd_snapshotter_failures_total{shard=\"root\",reason=\"hash_mismatch\"}").unwrap(), 0.0);
    assert_eq!(value(&text, "etcd_snapshotter_storage_reachable").unwrap(), 1.0);
    assert_eq!(value(&text, "etcd_snapshotter_memory_budget_bytes").unwrap(), 64.0 * 1024.0 * 1024.0);
    assert_eq!(value(&text, "etcd_snapshotter_parts_in_flight_max").unwrap(), 2.0);
    assert!(!events(&cluster.client(), &ns, "SnapshotTaken").await.is_empty(), "an Event says a snapshot was taken");

    // With exactly the documented RBAC, nothing the agent asked for was refused.
    stop_with_nothing_refused(&bed, &user, [&mut a, &mut b]);
    let lease = leases.get(LEASE).await.unwrap();
    assert!(lease.spec.and_then(|s| s.holder_identity).is_none(), "the Lease is released on the way out");
    assert!(uploads(&s3, &bed.s3.bucket).await.is_empty(), "no multipart upload left behind");
}

#[tokio::test(flavor = "multi_thread")]
async fn s3_going_away_is_counted_with_an_event_while_every_series_stays_and_the_next_tick_recovers() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let s3_proxy = Proxy::start(bed.s3.endpoint.trim_start_matches("http://")).await;
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.cron = EVERY_FIVE_SECONDS;
    options.s3_endpoint = s3_proxy.url.clone();
    let config = write_config(&bed, &options).unwrap();
    let mut agent = agent(cluster, &config, &ns).identity("replica-a").spawn().unwrap();
    agent.wait_ready(WAIT).await.unwrap();

    let last_success = "etcd_snapshotter_last_success_timestamp_seconds{shard=\"root\"}";
    let storage_failures = "etcd_snapshotter_failures_total{shard=\"root\",reason=\"storage\"}";
    let before = scrape(&agent.admin_url).await;
    assert_eq!(value(&before, storage_failures).unwrap(), 0.0, "every reason is exported from the start");
    assert_eq!(value(&before, last_success).unwrap(), 0.0, "a shard that never succeeded reads 0, not missing");
    let first = testbed::eventually(WAIT, "a first snapshot", || async {
        value(&scrape(&agent.admin_url).await, last_success).ok().filter(|v| *v > 0.0)
    })
    .await;

    s3_proxy.set_down(true);
    let during = testbed::eventually(WAIT, "a storage failure counted", || async {
        let text = scrape(&agent.admin_url).await;
        value(&text, storage_failures).ok().filter(|v| *v >= 1.0).map(|_| text)
    })
    .await;
    // A storage failure is counted just before the bucket is marked unreachable: a scrape can fall in between.
    agent.wait_for_metric("etcd_snapshotter_storage_reachable", WAIT, |v| v == 0.0).await;
    assert_eq!(value(&during, last_success).unwrap(), first, "the last success stays, with its value");
    let failed = testbed::eventually(WAIT, "a SnapshotFailed Event", || async {
        let found = events(&cluster.client(), &ns, "SnapshotFailed").await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    let note = failed[0].note.clone().unwrap_or_default();
    assert!(note.contains("(storage)") && note.contains("HeadBucket"), "{note}");

    s3_proxy.set_down(false);
    testbed::eventually(WAIT, "a snapshot after S3 came back", || async {
        let text = scrape(&agent.admin_url).await;
        (value(&text, last_success).ok()? > first && value(&text, "etcd_snapshotter_storage_reachable").ok()? == 1.0)
            .then_some(())
    })
    .await;
    let status = agent.terminate(Duration::from_secs(20));
    assert!(status.is_some_and(|s| s.success()), "SIGTERM: {status:?}");
    testbed::assert_no_secret_material(&agent.process.log(), &[&bed.s3.secret_key, &bed.s3.access_key]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_corrupted_stream_is_counted_as_a_hash_mismatch_with_an_event_and_publishes_nothing() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 100, 10_000).await.unwrap();
    let flipping = Proxy::start(etcd.members[0].client_url.trim_start_matches("http://")).await;
    flipping.faults.flip.store(true, std::sync::atomic::Ordering::SeqCst);
    let cron = daily_cron_in(30);
    let mut options = Options::new(&bed, "root", vec![flipping.url.clone()]);
    // One tick and one run: the stream is flipped once, and a second run (the next tick, or a retry within
    // this one) would publish a good snapshot while this test checks that nothing was published.
    options.cron = &cron;
    let config = write_config(&bed, &options).unwrap();
    let text = std::fs::read_to_string(&config).unwrap() + "retry:\n  maxRuns: 1\n";
    std::fs::write(&config, text).unwrap();
    let mut agent = agent(cluster, &config, &ns).identity("replica-a").spawn().unwrap();
    agent.wait_ready(WAIT).await.unwrap();

    let text = testbed::eventually(Duration::from_secs(90), "a hash mismatch counted", || async {
        let text = scrape(&agent.admin_url).await;
        value(&text, "etcd_snapshotter_failures_total{shard=\"root\",reason=\"hash_mismatch\"}")
            .ok()
            .filter(|v| *v >= 1.0)
            .map(|_| text)
    })
    .await;
    assert_eq!(value(&text, "etcd_snapshotter_last_success_timestamp_seconds{shard=\"root\"}").unwrap(), 0.0);
    let failed = testbed::eventually(WAIT, "a SnapshotFailed Event", || async {
        let found = events(&cluster.client(), &ns, "SnapshotFailed").await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    let note = failed[0].note.clone().unwrap_or_default();
    assert!(note.contains("(hash_mismatch)") && note.contains("trailing sha256"), "{note}");
    let s3 = bed.s3.client();
    // Only the shard's lock, released, is left (it is never deleted).
    let left: Vec<String> = keys(&s3, &bed.s3.bucket).await.into_iter().filter(|k| !k.ends_with("/run.lock")).collect();
    assert!(left.is_empty(), "no manifest and no object: {left:?}");
    assert!(uploads(&s3, &bed.s3.bucket).await.is_empty(), "the upload was aborted");
    let status = agent.terminate(Duration::from_secs(20));
    assert!(status.is_some_and(|s| s.success()), "SIGTERM: {status:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_a_slow_upload_aborts_it_after_the_grace_and_exits_cleanly() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/big", 300, 100_000).await.unwrap();
    let slow = Proxy::start(bed.s3.endpoint.trim_start_matches("http://")).await;
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.cron = EVERY_FIVE_SECONDS;
    options.s3_endpoint = slow.url.clone();
    options.compression = "none";
    let config = write_config(&bed, &options).unwrap();
    let mut agent = agent(cluster, &config, &ns).identity("replica-a").spawn().unwrap();
    agent.wait_ready(WAIT).await.unwrap();
    // Ready needed the bucket at full speed; from now on 30 MB at 1 MiB/s cannot finish within the 15 s grace.
    slow.faults.throttle_bytes_per_second.store(1024 * 1024, std::sync::atomic::Ordering::SeqCst);
    let s3 = bed.s3.client();
    testbed::eventually(WAIT, "an upload under way", || {
        let (s3, bucket) = (s3.clone(), bed.s3.bucket.clone());
        async move { (!uploads(&s3, &bucket).await.is_empty()).then_some(()) }
    })
    .await;
    let status = agent.terminate(Duration::from_secs(40));
    assert!(status.is_some_and(|s| s.success()), "SIGTERM: {status:?}\n{}", agent.process.log_tail());
    assert!(agent.process.log().contains("multipart upload aborted"), "{}", agent.process.log_tail());
    assert!(uploads(&s3, &bed.s3.bucket).await.is_empty(), "no multipart upload left behind");
    assert!(manifests(&s3, &bed.s3.bucket).await.is_empty(), "nothing published");
}

/// Messages of a replica's JSON log lines.
fn log_messages(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["message"].as_str().map(str::to_string))
        .collect()
}

/// Starts the daemon with `options`, uploading through `slow` every 20 s (a slowed run, ~8 s, ends well before
/// the next tick), slows its uploads to 4 MiB/s and returns once one is under way (30 MB: several seconds).
async fn daemon_with_a_slowed_upload(bed: &Bed, ns: &str, mut options: Options<'_>, slow: &Proxy) -> AgentProcess {
    options.cron = "*/20 * * * * *";
    options.s3_endpoint = slow.url.clone();
    let config = write_config(bed, &options).unwrap();
    let mut agent = agent(bed.cluster(), &config, ns).identity("replica-a").spawn().unwrap();
    agent.wait_ready(WAIT).await.unwrap();
    slow.faults.throttle_bytes_per_second.store(4 * 1024 * 1024, std::sync::atomic::Ordering::SeqCst);
    let s3 = bed.s3.client();
    testbed::eventually(WAIT, "the daemon's slowed upload under way", || {
        let (s3, bucket) = (s3.clone(), bed.s3.bucket.clone());
        async move { (!uploads(&s3, &bucket).await.is_empty()).then_some(()) }
    })
    .await;
    agent
}

#[tokio::test(flavor = "multi_thread")]
async fn a_one_shot_during_the_daemons_slow_upload_waits_for_the_shard_lock_and_both_publish_with_nothing_lost() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/big", 300, 100_000).await.unwrap();
    let slow = Proxy::start(bed.s3.endpoint.trim_start_matches("http://")).await;
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.compression = "none";
    // The one-shot talks to S3 directly; the daemon through the proxy that slows its upload.
    let one_shot_config = write_config(&bed, &options).unwrap();
    let mut agent = daemon_with_a_slowed_upload(&bed, &ns, options, &slow).await;
    let s3 = bed.s3.client();

    let config = one_shot_config.to_str().unwrap().to_string();
    let out =
        tokio::task::spawn_blocking(move || cli(&["snapshot", "--config", &config, "--wait", "5m"])).await.unwrap();
    assert!(out.status.success(), "{}\n{}", text(&out), agent.process.log_tail());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("shard root: another run holds the shard's lock: run (pid"),
        "the one-shot waited for the daemon's run and said so: {}",
        text(&out)
    );
    let messages = testbed::eventually(WAIT, "the daemon's snapshot published", || {
        let messages = log_messages(&agent.process.log());
        async move { messages.iter().any(|m| m == "snapshot published").then_some(messages) }
    })
    .await;
    slow.faults.throttle_bytes_per_second.store(0, std::sync::atomic::Ordering::SeqCst);
    let status = agent.terminate(Duration::from_secs(40));
    assert!(status.is_some_and(|s| s.success()), "SIGTERM: {status:?}\n{}", agent.process.log_tail());
    let failed: Vec<_> =
        log_messages(&agent.process.log()).into_iter().filter(|m| m.contains("snapshot failed")).collect();
    assert!(failed.is_empty(), "the daemon's run was never disturbed: {failed:?}\n{messages:?}");

    // Both published; every manifest has its object and every object its manifest; nothing half done is left.
    let manifests = manifests(&s3, &bed.s3.bucket).await;
    assert!(manifests.iter().any(|m| m["tick"].is_string()), "the daemon's snapshot: {manifests:?}");
    assert!(manifests.iter().any(|m| m["tick"].is_null()), "the one-shot's snapshot: {manifests:?}");
    let keys = keys(&s3, &bed.s3.bucket).await;
    let objects: Vec<_> = keys.iter().filter(|k| k.ends_with("/snapshot.db")).collect();
    assert_eq!(objects.len(), manifests.len(), "{keys:?}");
    for m in &manifests {
        let object = format!("{PREFIX}/{}/{}", m["id"].as_str().unwrap(), m["object"].as_str().unwrap());
        assert!(keys.contains(&object), "{object} is in the bucket: {keys:?}");
    }
    assert!(uploads(&s3, &bed.s3.bucket).await.is_empty(), "no multipart upload left");
    let lock = s3.get_object().bucket(&bed.s3.bucket).key(format!("{PREFIX}/root/run.lock")).send().await.unwrap();
    let lock: serde_json::Value = serde_json::from_slice(&lock.body.collect().await.unwrap().into_bytes()).unwrap();
    assert_eq!(lock["released"], true, "the lock is released: {lock}");
}

/// The ticks of the drills a replica ran, from its JSON log.
fn drilled_ticks(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "drill passed" || v["message"] == "restore drill failed")
        .filter_map(|v| v["tick"].as_str().map(str::to_string))
        .collect()
}

/// Where the drill tests start: a one-member root etcd with 100 keys, the documented RBAC in a fresh
/// namespace, a configuration with a drill every five seconds, and its first snapshot published.
struct Drilled {
    _etcd: testbed::Etcd,
    ns: String,
    kubeconfig: std::path::PathBuf,
    user: String,
    config: std::path::PathBuf,
    /// The published snapshot's id.
    id: String,
}

async fn drilled_every_five_seconds(bed: &Bed) -> Drilled {
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 100, 1000).await.unwrap();
    apply_documented_rbac(&cluster.client(), &ns).await;
    let (kubeconfig, user) = cluster.service_account_kubeconfig(&ns, "etcd-snapshotter").await.unwrap();
    let mut options = Options::new(bed, "root", vec![etcd.members[0].client_url.clone()]).with_drills(bed);
    options.shard_extra = format!("drill:\n  schedule:\n    cron: \"{EVERY_FIVE_SECONDS}\"\n");
    let config = write_config(bed, &options).unwrap();
    snapshot_ok(&config);
    let id = manifests(&bed.s3.client(), &bed.s3.bucket).await[0]["id"].as_str().unwrap().to_string();
    Drilled { _etcd: etcd, ns, kubeconfig, user, config, id }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_run_each_scheduled_drill_once_and_a_flipped_byte_fails_it_with_an_event_and_the_metric() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let Drilled { _etcd, ns, kubeconfig, user, config, id } = drilled_every_five_seconds(&bed).await;

    let start =
        |identity: &str| agent(cluster, &config, &ns).identity(identity).kubeconfig(&kubeconfig).spawn().unwrap();
    let (mut a, mut b) = (start("replica-a"), start("replica-b"));
    a.wait_ready(WAIT).await.unwrap();
    b.wait_ready(WAIT).await.unwrap();
    for agent in [&a, &b] {
        let text = scrape(&agent.admin_url).await;
        assert_eq!(value(&text, "etcd_snapshotter_drill_schedule_interval_seconds{shard=\"root\"}").unwrap(), 5.0);
        let yearly = value(&text, "etcd_snapshotter_schedule_interval_seconds{shard=\"root\"}").unwrap();
        assert!(yearly >= 365.0 * 86400.0, "{yearly}");
        for series in [
            "etcd_snapshotter_drill_last_failure_timestamp_seconds{shard=\"root\"}",
            "etcd_snapshotter_drill_failures_total{shard=\"root\",reason=\"object_hash_mismatch\"}",
            "etcd_snapshotter_drill_failures_total{shard=\"root\",reason=\"kcp\"}",
        ] {
            assert_eq!(value(&text, series).unwrap(), 0.0, "{series} exists from the start at 0");
        }
    }

    let ticks = testbed::eventually(Duration::from_secs(120), "three drilled ticks", || {
        let ticks = [drilled_ticks(&a.process.log()), drilled_ticks(&b.process.log())].concat();
        async move { (ticks.len() >= 3).then_some(ticks) }
    })
    .await;
    let mut unique = ticks.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ticks.len(), "each tick drilled once across two replicas: {ticks:?}");
    let lease = Api::<Lease>::namespaced(cluster.client(), &ns).get(LEASE).await.unwrap();
    let annotations = lease.metadata.annotations.unwrap_or_default();
    assert!(annotations.contains_key("schedule.kcp-keeper.io/drill-root"), "{annotations:?}");
    let holder = lease.spec.and_then(|s| s.holder_identity).unwrap();
    let leader = if holder == "replica-a" { &a } else { &b };
    let text = scrape(&leader.admin_url).await;
    assert!(value(&text, "etcd_snapshotter_drill_last_success_timestamp_seconds{shard=\"root\"}").unwrap() > 0.0);
    assert!(value(&text, "etcd_snapshotter_drill_restore_seconds{shard=\"root\"}").unwrap() > 0.0);
    assert!(value(&text, "etcd_snapshotter_drill_duration_seconds{shard=\"root\"}").unwrap() > 0.0);
    let list = cli(&["list", "--config", config.to_str().unwrap()]);
    let listing = String::from_utf8_lossy(&list.stdout);
    assert!(listing.lines().any(|l| l.starts_with(&id) && !l.ends_with(" no")), "verified by the drill: {listing}");

    // A byte flipped in the stored object: the next drill fails, with an Event and the metric.
    bed.flip_middle_byte(&format!("{PREFIX}/{id}/snapshot.db.zst"), 0x80);
    leader
        .wait_for_metric(
            "etcd_snapshotter_drill_failures_total{shard=\"root\",reason=\"object_hash_mismatch\"}",
            WAIT,
            |v| v >= 1.0,
        )
        .await;
    // The failure's time is set just after it is counted: a scrape can fall in between.
    leader
        .wait_for_metric("etcd_snapshotter_drill_last_failure_timestamp_seconds{shard=\"root\"}", WAIT, |v| v > 0.0)
        .await;
    let failed = testbed::eventually(WAIT, "a DrillFailed Event", || async {
        let found = events(&cluster.client(), &ns, "DrillFailed").await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    let note = failed[0].note.clone().unwrap_or_default();
    assert!(note.contains("(object_hash_mismatch)") && note.contains("object hash mismatch"), "{note}");
    let listing = String::from_utf8_lossy(&cli(&["list", "--config", config.to_str().unwrap()]).stdout).into_owned();
    assert!(listing.contains("drill failed: object_hash_mismatch"), "{listing}");

    stop_with_nothing_refused(&bed, &user, [&mut a, &mut b]);
    let left: Vec<_> = std::fs::read_dir(bed.drills_dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "drill directories left behind: {left:?}");
}

/// What `kcp-keeper doctor --snapshotter-metrics` says of the root shard's restore proof, read from the
/// running replicas' metrics endpoints: its `restore-proven` line's result and what it saw.
async fn restore_proven(
    cluster: &testbed::ControlPlane,
    admin_urls: &[&str],
) -> (kcp_keeper_doctor::verdict::Level, String) {
    let options = kcp_keeper_doctor::options::Options {
        snapshotter_metrics: admin_urls.iter().map(|u| format!("{u}/metrics")).collect(),
        verify: false,
        ..Default::default()
    };
    let report = kcp_keeper_doctor::run(&cluster.client(), &options).await;
    let line = report
        .checks
        .into_iter()
        .find(|v| v.check == kcp_keeper_doctor::rules::restore::DRILL && v.subject == "shard root")
        .expect("a restore-proven line for shard root");
    (line.result, line.saw)
}

/// The doctor's "prove one restore before relying on it" against a running agent of two replicas, each way it
/// can turn: with the stored snapshot corrupted from the start no drill passes and the line is FAIL; put right,
/// the next drill passes and it is ok; corrupted again, drills keep failing and once the last pass is older than
/// two drill intervals it is FAIL; put right again, ok. The follower alone exports no drill of its own (FAIL):
/// the doctor reads every replica, as the chart's headless Service gives it them, and the leader's proof wins.
#[tokio::test(flavor = "multi_thread")]
async fn doctor_restore_proven_reads_both_replicas_and_fails_until_a_drill_passes_and_once_drills_keep_failing() {
    use kcp_keeper_doctor::verdict::Level;
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let Drilled { _etcd, ns, kubeconfig, user, config, id } = drilled_every_five_seconds(&bed).await;
    let file = bed.s3_file(&format!("{PREFIX}/{id}/snapshot.db.zst"));
    let good = std::fs::read(&file).unwrap();
    let mut bad = good.clone();
    let middle = bad.len() / 2;
    bad[middle] ^= 0x80;
    std::fs::write(&file, &bad).unwrap();

    let mut agent = agent(cluster, &config, &ns).kubeconfig(&kubeconfig).spawn().unwrap();
    agent.wait_ready(WAIT).await.unwrap();
    let mut follower =
        common::agent(cluster, &config, &ns).identity("replica-b").kubeconfig(&kubeconfig).spawn().unwrap();
    follower.wait_ready(WAIT).await.unwrap();
    let both = [follower.admin_url.as_str(), agent.admin_url.as_str()];
    let failures = "etcd_snapshotter_drill_failures_total{shard=\"root\",reason=\"object_hash_mismatch\"}";
    agent.wait_for_metric(failures, WAIT, |v| v >= 1.0).await;
    let (result, saw) = restore_proven(cluster, &both).await;
    assert_eq!(result, Level::Fail, "a drill failed and none passed: {saw}");
    assert!(saw.contains("no restore drill has passed"), "{saw}");

    std::fs::write(&file, &good).unwrap();
    let saw = testbed::eventually_seen(Duration::from_secs(60), "restore-proven ok after a passing drill", || async {
        let (result, saw) = restore_proven(cluster, &both).await;
        Ok(if result == Level::Ok { Ok(saw) } else { Err(format!("{result:?}: {saw}")) })
    })
    .await
    .unwrap();
    assert!(saw.contains("a restore drill passed"), "{saw}");
    let (result, saw) = restore_proven(cluster, &both[..1]).await;
    assert_eq!(result, Level::Fail, "the follower alone has drilled nothing: {saw}");

    std::fs::write(&file, &bad).unwrap();
    let seen = agent.metric(failures).await.unwrap();
    let saw =
        testbed::eventually_seen(Duration::from_secs(60), "restore-proven FAIL once drills keep failing", || async {
            let (result, saw) = restore_proven(cluster, &both).await;
            Ok(if result == Level::Fail { Ok(saw) } else { Err(format!("{result:?}: {saw}")) })
        })
        .await
        .unwrap();
    assert!(saw.contains("last passing drill") && saw.contains("schedule every 5 s"), "{saw}");
    assert!(agent.metric(failures).await.unwrap() >= seen + 2.0, "at least two drills failed in between");

    std::fs::write(&file, &good).unwrap();
    testbed::eventually_seen(Duration::from_secs(60), "restore-proven ok again", || async {
        let (result, saw) = restore_proven(cluster, &both).await;
        Ok(if result == Level::Ok { Ok(()) } else { Err(format!("{result:?}: {saw}")) })
    })
    .await
    .unwrap();
    stop_with_nothing_refused(&bed, &user, [&mut agent, &mut follower]);
}

/// Processes whose command line mentions `needle` (a drill's processes all run inside its directory).
fn processes_mentioning(needle: &str, except: u32) -> Vec<(u32, String)> {
    let lines = testbed::process::command_lines().into_iter();
    lines.filter(|(pid, cmd)| *pid != except && cmd.contains(needle)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_mid_drill_stops_it_and_leaves_no_process_and_no_directory_behind() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 200, 5_000).await.unwrap();
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]).with_drills(&bed);
    options.shard_extra = format!("drill:\n  schedule:\n    cron: \"{EVERY_FIVE_SECONDS}\"\n");
    let config = write_config(&bed, &options).unwrap();
    snapshot_ok(&config);
    let mut agent = agent(cluster, &config, &ns).identity("replica-a").spawn().unwrap();
    agent.wait_ready(WAIT).await.unwrap();

    // The throwaway etcd lives for well under a second per drill: poll /proc tightly for it.
    let drills_dir = bed.drills_dir().display().to_string();
    let agent_pid = agent.process.pid().unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    let drill_etcd = loop {
        let found = processes_mentioning(&drills_dir, agent_pid);
        if let Some(found) = found.into_iter().find(|(_, cmd)| cmd.contains("--name=drill")) {
            break found;
        }
        assert!(std::time::Instant::now() < deadline, "no drill ran:\n{}", agent.process.log_tail());
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let status = agent.terminate(Duration::from_secs(20));
    assert!(status.is_some_and(|s| s.success()), "SIGTERM: {status:?}\n{}", agent.process.log_tail());
    assert!(
        agent.process.log().contains("the drill in flight was stopped and cleaned up"),
        "SIGTERM came mid-drill:\n{}",
        agent.process.log_tail()
    );
    let state = std::fs::read_to_string(format!("/proc/{}/stat", drill_etcd.0)).unwrap_or_default();
    let state = state.rsplit_once(") ").map(|(_, rest)| rest.chars().next().unwrap_or('?')).unwrap_or('-');
    assert!(matches!(state, '-' | 'Z'), "the drill's etcd (pid {}) still runs: state {state}", drill_etcd.0);
    assert_eq!(processes_mentioning(&drills_dir, agent_pid), vec![], "no drill process is left");
    let left: Vec<_> = std::fs::read_dir(bed.drills_dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "drill directories left behind: {left:?}");
}

/// With exactly the documented RBAC nothing the replicas asked for was refused; both stop cleanly on SIGTERM
/// and their logs hold no S3 key.
fn stop_with_nothing_refused<const N: usize>(bed: &Bed, user: &str, agents: [&mut AgentProcess; N]) {
    let cluster = bed.cluster();
    let refused: Vec<_> = testbed::audit::by_user(&cluster.apiserver.audit_log, user)
        .unwrap()
        .into_iter()
        .filter(|r| r.code == Some(403))
        .collect();
    assert!(refused.is_empty(), "refused requests: {refused:?}");
    for agent in agents {
        let status = agent.terminate(Duration::from_secs(20));
        assert!(status.is_some_and(|s| s.success()), "SIGTERM: {status:?}\n{}", agent.process.log_tail());
        testbed::assert_no_secret_material(&agent.process.log(), &[&bed.s3.secret_key, &bed.s3.access_key]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_of_another_etcd_cluster_under_the_shard_are_reported_by_metric_and_event_and_never_deleted() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 20, 1000).await.unwrap();
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.keep_last = 1;
    let config = write_config(&bed, &options).unwrap();
    snapshot_ok(&config);
    // Another installation's snapshot under the same shard, with a revision far above this cluster's.
    let s3 = bed.s3.client();
    let mut foreign = manifests(&s3, &bed.s3.bucket).await[0].clone();
    foreign["clusterId"] = "00000000000bad00".into();
    foreign["id"] = "root/20250101T000000Z-r999999999".into();
    foreign["revision"] = 999_999_999u64.into();
    foreign["revisionUpperBound"] = 999_999_999u64.into();
    let foreign_key = format!("{PREFIX}/root/20250101T000000Z-r999999999/manifest.json");
    s3.put_object()
        .bucket(&bed.s3.bucket)
        .key(&foreign_key)
        .body(serde_json::to_vec(&foreign).unwrap().into())
        .send()
        .await
        .unwrap();

    options.cron = EVERY_FIVE_SECONDS;
    let config = write_config(&bed, &options).unwrap();
    let mut agent = agent(cluster, &config, &ns).identity("replica-a").spawn().unwrap();
    agent.wait_ready(WAIT).await.unwrap();
    let series = "etcd_snapshotter_other_cluster_snapshots{shard=\"root\"}";
    assert!(agent.metric(series).await.is_ok(), "exported from the start");
    agent.wait_for_metric(series, WAIT, |v| v == 1.0).await;
    let found = testbed::eventually(WAIT, "an OtherClusterSnapshots Event", || async {
        let found = events(&cluster.client(), &ns, "OtherClusterSnapshots").await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    let note = found[0].note.clone().unwrap_or_default();
    assert!(note.contains("1 snapshot(s) of other etcd clusters under shard root"), "{note}");
    // This cluster's own keepLast 1 ran (the revision far above it did not stop retention), the foreign one stays.
    testbed::eventually(WAIT, "retention kept this cluster's newest only", || async {
        let text = scrape(&agent.admin_url).await;
        (value(&text, "etcd_snapshotter_snapshots_kept{shard=\"root\"}").ok()? == 1.0).then_some(())
    })
    .await;
    let status = agent.terminate(Duration::from_secs(20));
    assert!(status.is_some_and(|s| s.success()), "SIGTERM: {status:?}");
    let left: Vec<String> =
        manifests(&s3, &bed.s3.bucket).await.iter().map(|m| m["id"].as_str().unwrap().to_string()).collect();
    assert!(left.contains(&"root/20250101T000000Z-r999999999".to_string()), "never deleted: {left:?}");
    assert_eq!(left.len(), 2, "one of this cluster's, one foreign: {left:?}");
}

/// Creates the CustomResourceDefinitions the chart ships and waits until the apiserver serves them.
async fn install_chart_crds(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/kcp-keeper/crds/etcd-snapshotter.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    for doc in text.split("\n---\n").filter(|d| d.contains("kind: CustomResourceDefinition")) {
        let crd: CustomResourceDefinition = serde_yaml::from_str(doc).unwrap();
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    testbed::eventually(WAIT, "the CRDs served", || async {
        let snapshots = Api::<etcd_snapshotter::objects::EtcdSnapshot>::all(client.clone());
        let shards = Api::<etcd_snapshotter::objects::EtcdShardBackup>::all(client.clone());
        (snapshots.list(&ListParams::default()).await.is_ok() && shards.list(&ListParams::default()).await.is_ok())
            .then_some(())
    })
    .await;
}

/// `options` written with `snapshotObjects: true`, and a ServiceAccount in `ns` holding exactly the Role
/// `rbac --config` prints for it: the file, the account's kubeconfig and its user.
async fn with_snapshot_objects(
    bed: &Bed,
    options: &Options<'_>,
    ns: &str,
) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let config = write_config(bed, options).unwrap();
    let mut file = std::fs::read_to_string(&config).unwrap();
    file.push_str("snapshotObjects: true\n");
    std::fs::write(&config, file).unwrap();
    let out = cli(&[
        "rbac",
        "--config",
        config.to_str().unwrap(),
        "--namespace",
        ns,
        "--service-account",
        "etcd-snapshotter",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert!(yaml.contains("etcdsnapshots") && yaml.contains("etcdsnapshotrequests/status"), "{yaml}");
    let mut docs = yaml.split("\n---\n");
    let role: Role = serde_yaml::from_str(docs.next().unwrap()).unwrap();
    let binding: RoleBinding = serde_yaml::from_str(docs.next().unwrap()).unwrap();
    let admin = bed.cluster().client();
    Api::<Role>::namespaced(admin.clone(), ns).create(&PostParams::default(), &role).await.unwrap();
    Api::<RoleBinding>::namespaced(admin, ns).create(&PostParams::default(), &binding).await.unwrap();
    let (kubeconfig, user) = bed.cluster().service_account_kubeconfig(ns, "etcd-snapshotter").await.unwrap();
    (config, kubeconfig, user)
}

/// `(name, snapshot id, revision)` of every EtcdSnapshot in `ns`, sorted.
async fn snapshot_objects(client: &kube::Client, ns: &str) -> Vec<(String, String, u64)> {
    let api = Api::<etcd_snapshotter::objects::EtcdSnapshot>::namespaced(client.clone(), ns);
    let mut out: Vec<_> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| (kube::ResourceExt::name_any(&o), o.spec.snapshot_id, o.spec.revision))
        .collect();
    out.sort();
    out
}

/// `(name, id, revision)` the objects must show for the bucket's manifests.
async fn expected_objects(s3: &aws_sdk_s3::Client, bucket: &str) -> Vec<(String, String, u64)> {
    let mut out: Vec<_> = manifests(s3, bucket)
        .await
        .iter()
        .map(|m| {
            let id = m["id"].as_str().unwrap().to_string();
            (etcd_snapshotter::objects::name_of(&id), id, m["revision"].as_u64().unwrap())
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshot_objects_follow_the_bucket_through_retention_come_back_when_deleted_and_need_only_the_documented_rbac()
{
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 20, 100).await.unwrap();
    install_chart_crds(&cluster.client()).await;
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.cron = EVERY_FIVE_SECONDS;
    options.keep_last = 2;
    let (config, kubeconfig, user) = with_snapshot_objects(&bed, &options, &ns).await;
    let admin = cluster.client();
    let mut agent = agent(cluster, &config, &ns).identity("replica-a").kubeconfig(&kubeconfig).spawn().unwrap();
    agent.wait_ready(WAIT).await.unwrap();

    // Snapshots every five seconds, keepLast 2: after the fourth, two snapshots were deleted by retention, and the
    // objects are exactly the two the bucket keeps.
    let s3 = bed.s3.client();
    let shown =
        testbed::eventually(Duration::from_secs(120), "objects equal to the bucket after retention", || async {
            let taken = agent.metric("etcd_snapshotter_revision{shard=\"root\"}").await.ok()?;
            let expected = expected_objects(&s3, &bed.s3.bucket).await;
            let shown = snapshot_objects(&admin, &ns).await;
            let published = events(&admin, &ns, "SnapshotTaken").await.len();
            (taken > 0.0 && published >= 4 && expected.len() == 2 && shown == expected).then_some(shown)
        })
        .await;
    let shards = Api::<etcd_snapshotter::objects::EtcdShardBackup>::namespaced(admin.clone(), &ns);
    testbed::eventually(WAIT, "the shard's object names the newest snapshot", || async {
        let expected = expected_objects(&s3, &bed.s3.bucket).await;
        let newest = expected.iter().map(|(_, id, _)| id.clone()).max()?;
        let shard = shards.get("root").await.ok()?;
        (shard.spec.last_snapshot.as_ref() == Some(&newest)
            && shard.spec.snapshots == 2
            && shard.spec.recovery_point.is_some())
        .then_some(())
    })
    .await;

    // An object deleted by hand comes back from the bucket, long before the periodic pass.
    let gone = &shown[0].0;
    let api = Api::<etcd_snapshotter::objects::EtcdSnapshot>::namespaced(admin.clone(), &ns);
    let uid = api.get(gone).await.unwrap().metadata.uid;
    api.delete(gone, &Default::default()).await.unwrap();
    testbed::eventually(Duration::from_secs(60), "the deleted object rebuilt", || async {
        let rebuilt = api.get_opt(gone).await.ok()??;
        (rebuilt.metadata.uid != uid).then_some(())
    })
    .await;
    let metrics = scrape(&agent.admin_url).await;
    assert_eq!(value(&metrics, "etcd_snapshotter_object_sync_failures_total").unwrap(), 0.0);
    stop_with_nothing_refused(&bed, &user, [&mut agent]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_request_object_is_carried_out_now_with_its_ids_and_one_naming_an_unknown_shard_fails_at_once() {
    use etcd_snapshotter::requests::EtcdSnapshotRequest;
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 20, 100).await.unwrap();
    install_chart_crds(&cluster.client()).await;
    // No schedule fires during the test (1 January, midnight): every snapshot is a requested one.
    let options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    let (config, kubeconfig, user) = with_snapshot_objects(&bed, &options, &ns).await;
    let admin = cluster.client();
    let mut agent = agent(cluster, &config, &ns).identity("replica-a").kubeconfig(&kubeconfig).spawn().unwrap();
    agent.wait_ready(WAIT).await.unwrap();

    let requests = Api::<EtcdSnapshotRequest>::namespaced(admin.clone(), &ns);
    let request = |name: &str, shards: &[&str]| {
        let spec = etcd_snapshotter::requests::EtcdSnapshotRequestSpec {
            shards: shards.iter().map(|s| s.to_string()).collect(),
        };
        EtcdSnapshotRequest::new(name, spec)
    };
    requests.create(&PostParams::default(), &request("now", &["root"])).await.unwrap();
    requests.create(&PostParams::default(), &request("typo", &["roots"])).await.unwrap();
    let finished = |name: &'static str| {
        let requests = requests.clone();
        async move {
            testbed::eventually(Duration::from_secs(90), &format!("request {name} finished"), || async {
                let status = requests.get(name).await.ok()?.status?;
                matches!(status.phase.as_deref(), Some("Done" | "Failed")).then_some(status)
            })
            .await
        }
    };
    let done = finished("now").await;
    assert_eq!(done.phase.as_deref(), Some("Done"), "{done:?}");
    assert_eq!(done.snapshots.len(), 1, "{done:?}");
    let s3 = bed.s3.client();
    let published: Vec<String> =
        manifests(&s3, &bed.s3.bucket).await.iter().map(|m| m["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(published, done.snapshots, "the id the request names is the one snapshot in the bucket");
    let failed = finished("typo").await;
    assert_eq!(failed.phase.as_deref(), Some("Failed"), "{failed:?}");
    assert_eq!(failed.reason.as_deref(), Some("unknown shard roots: this agent snapshots root"), "{failed:?}");
    assert!(failed.snapshots.is_empty());
    // Not retried: a later request still runs, and the failed one keeps its status.
    requests.create(&PostParams::default(), &request("again", &["root"])).await.unwrap();
    assert_eq!(finished("again").await.phase.as_deref(), Some("Done"));
    assert_eq!(requests.get("typo").await.unwrap().status, Some(failed));
    assert_eq!(manifests(&s3, &bed.s3.bucket).await.len(), 2);
    stop_with_nothing_refused(&bed, &user, [&mut agent]);
}

/// By default a drill never runs beside a snapshot in the same process (the pod's memory and disk are sized for
/// one of them): drills due every 5 s while the daemon's upload is slowed to several seconds wait for it, and
/// run once it is published.
#[tokio::test(flavor = "multi_thread")]
async fn drills_due_during_the_daemons_slow_upload_wait_until_the_snapshot_is_published_and_then_run() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/big", 300, 100_000).await.unwrap();
    let slow = Proxy::start(bed.s3.endpoint.trim_start_matches("http://")).await;
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]).with_drills(&bed);
    options.compression = "none";
    options.shard_extra = format!("drill:\n  schedule:\n    cron: \"{EVERY_FIVE_SECONDS}\"\n");
    // A snapshot for the drills to restore, taken directly.
    snapshot_ok(&write_config(&bed, &options).unwrap());
    // Drills download unthrottled (the proxy slows client-to-server only), and fall due during each upload.
    let mut agent = daemon_with_a_slowed_upload(&bed, &ns, options, &slow).await;
    let drilled_after_a_publish = |messages: &[String]| {
        let published = messages.iter().rposition(|m| m == "snapshot published")?;
        messages[published..].iter().any(|m| m == "drill passed").then_some(())
    };
    testbed::eventually(Duration::from_secs(120), "a drill after a slowed snapshot was published", || {
        let messages = log_messages(&agent.process.log());
        async move { drilled_after_a_publish(&messages) }
    })
    .await;
    slow.faults.throttle_bytes_per_second.store(0, std::sync::atomic::Ordering::SeqCst);
    let status = agent.terminate(Duration::from_secs(40));
    assert!(status.is_some_and(|s| s.success()), "SIGTERM: {status:?}\n{}", agent.process.log_tail());

    // Between a snapshot's start and its end no drill finished (nor started: none ran beside it).
    let messages = log_messages(&agent.process.log());
    let mut in_snapshot = false;
    let mut snapshots = 0;
    for m in &messages {
        if m == "streaming from member" {
            in_snapshot = true;
        } else if m == "snapshot published" || m.starts_with("snapshot failed") {
            in_snapshot = false;
            snapshots += 1;
        } else if m == "drill passed" || m == "restore drill failed" {
            assert!(!in_snapshot, "a drill ran beside a snapshot: {messages:?}");
        }
    }
    assert!(snapshots >= 1, "{messages:?}");
}
