//! The stored recovery point and `plan` of a restore of every shard to one point in time, against two real etcds
//! (shards `root` and `alpha`), a real versitygw and a real kube-apiserver (the daemon's Lease): the point
//! advances on a quiet shard, `latest-consistent` is the older of the shards' points, a plan at a time between two
//! writes names what `restore --at` then does on each shard, and a point beyond a shard's reach fails naming it.

mod common;

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use common::*;
use etcd_snapshotter::delta::recovery::RecoveryPoint;

const SHARDS: [&str; 2] = ["root", "alpha"];

/// Two one-member etcds with five keys each under `/registry/base`, clients to them, and a configuration of both
/// shards with deltas every second (and `options` changed by `change`).
async fn two_shards(
    bed: &Bed,
    change: impl FnOnce(&mut Options),
) -> (Vec<testbed::Etcd>, Vec<etcd_client::Client>, PathBuf) {
    let (mut etcds, mut clients) = (Vec::new(), Vec::new());
    for shard in SHARDS {
        let etcd = bed.etcd(shard, 1).await.unwrap();
        let mut client = etcd.member_client(0).await.unwrap();
        load(&mut client, "/registry/base", 5, 100).await.unwrap();
        clients.push(client);
        etcds.push(etcd);
    }
    let mut options = Options::new(bed, "root", vec![etcds[0].members[0].client_url.clone()]).with_deltas("1s", None);
    options.shards.push(("alpha", vec![etcds[1].members[0].client_url.clone()]));
    change(&mut options);
    (etcds, clients, write_config(bed, &options).unwrap())
}

/// The stored recovery point of `shard`, if any (parsed as the agent reads it, without a key).
async fn stored_point(s3: &aws_sdk_s3::Client, bucket: &str, shard: &str) -> Option<RecoveryPoint> {
    let key = format!("{PREFIX}/{shard}/recovery-point.json");
    let body = s3.get_object().bucket(bucket).key(&key).send().await.ok()?.body.collect().await.unwrap();
    Some(RecoveryPoint::from_json(&body.into_bytes(), shard, None).unwrap())
}

/// Waits until `shard`'s stored point is proven after `after` (Unix ms).
async fn point_after(s3: &aws_sdk_s3::Client, bucket: &str, shard: &str, after: i64) -> RecoveryPoint {
    testbed::eventually(WAIT, &format!("{shard}'s stored recovery point past {after}"), || async {
        stored_point(s3, bucket, shard).await.filter(|p| p.proven_ms > after)
    })
    .await
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// `plan --config <config> <args>`: its output.
fn plan(config: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["plan", "--config", config.to_str().unwrap()];
    all.extend_from_slice(args);
    cli(&all)
}

/// `plan ... -o json`, which must succeed: the plan as JSON.
fn plan_json(config: &Path, at: &str) -> serde_json::Value {
    let out = plan(config, &["--at", at, "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
}

fn shard_of<'a>(plan: &'a serde_json::Value, shard: &str) -> &'a serde_json::Value {
    plan["shards"].as_array().unwrap().iter().find(|s| s["shard"] == shard).unwrap_or_else(|| panic!("{plan}"))
}

fn time_of(value: &serde_json::Value) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(value.as_str().unwrap()).unwrap().with_timezone(&Utc)
}

/// The manifest of `shard`'s only snapshot.
async fn only_snapshot(s3: &aws_sdk_s3::Client, bucket: &str, shard: &str) -> serde_json::Value {
    let of_shard: Vec<_> = manifests(s3, bucket).await.into_iter().filter(|m| m["shard"] == shard).collect();
    assert_eq!(of_shard.len(), 1, "{of_shard:?}");
    of_shard[0].clone()
}

/// `restore --shard <shard> --at <at>` into a fresh directory and an etcd started on it: the output and a client.
async fn restore_shard(
    bed: &Bed,
    config: &Path,
    shard: &str,
    at: &str,
) -> (std::process::Output, testbed::process::Process, etcd_client::Client) {
    let name = format!("restored-{shard}");
    let client_port = testbed::process::free_port().unwrap();
    let (out, data_dir, peer_url) = restore_command(bed, config, (shard, at), &name).await;
    assert!(out.status.success(), "{}", text(&out));
    let (process, client) = serve_restored(bed, &name, &data_dir, client_port, &peer_url).await;
    (out, process, client)
}

/// `restore --shard <shard> --at <at>` into the bed's fresh directory `name`: its output, the directory and the
/// member's peer URL.
async fn restore_command(
    bed: &Bed,
    config: &Path,
    (shard, at): (&str, &str),
    name: &str,
) -> (std::process::Output, PathBuf, String) {
    let data_dir = bed.path(name);
    let peer_port = testbed::process::free_port().unwrap();
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let (etcdutl, etcd) = (bed.etcdutl().display().to_string(), bed.peers.path("etcd").display().to_string());
    let owned: Vec<String> = [
        "restore",
        "--config",
        config.to_str().unwrap(),
        "--shard",
        shard,
        "--at",
        at,
        "--etcdutl",
        &etcdutl,
        "--etcd",
        &etcd,
        "--name",
        "restored",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "--initial-cluster".into(),
        format!("restored={peer_url}"),
        "--initial-advertise-peer-urls".into(),
        peer_url.clone(),
        "--data-dir".into(),
        data_dir.display().to_string(),
    ])
    .collect();
    let out =
        tokio::task::spawn_blocking(move || cli(&owned.iter().map(String::as_str).collect::<Vec<_>>())).await.unwrap();
    (out, data_dir, peer_url)
}

/// The keys under `/registry/` the member serves.
async fn registry_keys(client: &mut etcd_client::Client) -> Vec<String> {
    let response = client.get("/registry/", Some(etcd_client::GetOptions::new().with_prefix().with_keys_only())).await;
    response.unwrap().kvs().iter().map(|kv| kv.key_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_stored_recovery_point_advances_on_a_quiet_shard_latest_consistent_is_the_older_of_the_shards_points_and_an_altered_one_is_refused()
 {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let key_file = bed.path("delta-key");
    std::fs::write(&key_file, "a-secret-only-the-agent-and-its-restores-hold\n").unwrap();
    let (_etcds, mut clients, config) = two_shards(&bed, |o| {
        o.delta_signing_key = Some(key_file.clone());
        o.keep_last = 1;
    })
    .await;
    snapshot_ok(&config);
    let (s3, bucket) = (bed.s3.client(), bed.s3.bucket.clone());

    // No delta writer has run: each shard reaches only its snapshot's start, so the two shards, snapshotted one
    // after the other, share no point; one shard alone is its snapshot.
    let (root, alpha) = (only_snapshot(&s3, &bucket, "root").await, only_snapshot(&s3, &bucket, "alpha").await);
    let later = if time_of(&root["startedAt"]) > time_of(&alpha["startedAt"]) { "root" } else { "alpha" };
    let refused = plan(&config, &["--at", "latest-consistent"]);
    let said = text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(said.contains(&format!("shard {later}: ")) && said.contains("before its oldest snapshot"), "{said}");
    assert!(said.contains("no recovery point is stored"), "{said}");
    let root_alone = plan(&config, &["--at", "latest-consistent", "--shard", "root", "-o", "json"]);
    let root_alone: serde_json::Value = serde_json::from_slice(&root_alone.stdout).unwrap();
    assert_eq!(time_of(&root_alone["at"]), time_of(&root["startedAt"]), "{root_alone}");
    assert_eq!(shard_of(&root_alone, "root")["deltas"], 0, "{root_alone}");
    assert_eq!(shard_of(&root_alone, "root")["snapshot"], root["id"], "{root_alone}");

    // The agent: root written to, alpha quiet; alpha's stored point advances all the same, with no delta.
    let started = now_ms();
    let agent = agent(cluster, &config, &ns).start().await.unwrap();
    load(&mut clients[0], "/registry/after", 10, 100).await.unwrap();
    let first = point_after(&s3, &bucket, "alpha", started).await;
    let second = point_after(&s3, &bucket, "alpha", first.proven_ms + 1500).await;
    assert!(second.proven_ms > first.proven_ms, "{first:?} {second:?}");
    assert_eq!(second.snapshot, alpha["id"].as_str().unwrap());
    assert_eq!(second.cluster_id, alpha["clusterId"].as_str().unwrap());
    assert!(second.hmac_sha256.is_some(), "signed with the installation's delta key");
    let alpha_deltas = format!("{PREFIX}/{}/deltas/", second.snapshot);
    let listed = keys(&s3, &bucket).await;
    let proofs = format!("{alpha_deltas}proofs/");
    assert!(
        !listed.iter().any(|k| k.starts_with(&alpha_deltas) && !k.starts_with(&proofs)),
        "a quiet shard writes no delta: {listed:?}"
    );
    assert!(listed.iter().any(|k| k.starts_with(&proofs)), "its session's proof is kept beside: {listed:?}");
    let written = clients[0].get("/", None).await.unwrap().header().unwrap().revision() as u64;
    // Both points well past root's writes (received within milliseconds of being made).
    let after_writes = now_ms() + 2000;
    for shard in SHARDS {
        point_after(&s3, &bucket, shard, after_writes).await;
    }
    drop(agent);

    // Stopped: the stored points stay, and latest-consistent is the older of the two.
    let points: Vec<RecoveryPoint> = {
        let mut points = Vec::new();
        for shard in SHARDS {
            points.push(stored_point(&s3, &bucket, shard).await.unwrap());
        }
        points
    };
    let oldest = points.iter().min_by_key(|p| p.proven_ms).unwrap();
    let newest = points.iter().max_by_key(|p| p.proven_ms).unwrap();
    let consistent = plan_json(&config, "latest-consistent");
    assert_eq!(time_of(&consistent["at"]), oldest.time(), "{consistent}");
    assert_eq!(consistent["latestConsistent"], true);
    assert_eq!(shard_of(&consistent, &oldest.shard)["lostSeconds"], 0.0, "{consistent}");
    let lost = shard_of(&consistent, &newest.shard)["lostSeconds"].as_f64().unwrap();
    assert_eq!((lost * 1000.0).round() as i64, newest.proven_ms - oldest.proven_ms, "{consistent}");
    assert_eq!(shard_of(&consistent, "root")["revision"], written, "root's every write is before the point");
    let text_plan = plan(&config, &["--at", "latest-consistent"]);
    let printed = String::from_utf8_lossy(&text_plan.stdout);
    assert!(printed.contains("shard alpha") && printed.contains("data lost"), "{}", text(&text_plan));

    // A record altered by a bucket writer (a later point claimed) is refused with the delta key configured.
    let key = format!("{PREFIX}/alpha/recovery-point.json");
    let original = s3.get_object().bucket(&bucket).key(&key).send().await.unwrap().body.collect().await.unwrap();
    let mut forged: serde_json::Value = serde_json::from_slice(&original.clone().into_bytes()).unwrap();
    let later = points[1].proven_ms + 3_600_000;
    forged["provenMs"] = later.into();
    forged["provenAt"] = DateTime::from_timestamp_millis(later).unwrap().to_rfc3339().into();
    let body = serde_json::to_vec(&forged).unwrap();
    s3.put_object().bucket(&bucket).key(&key).body(body.into()).send().await.unwrap();
    let refused = plan(&config, &["--at", "latest-consistent"]);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(text(&refused).contains("shard alpha") && text(&refused).contains("altered"), "{}", text(&refused));
    s3.put_object().bucket(&bucket).key(&key).body(original.into_bytes().into()).send().await.unwrap();

    // The record is no snapshot: a new snapshot run's clean-up and retention (keepLast 1) delete the old
    // snapshots and their deltas and leave it, and `list` never shows it.
    snapshot_ok(&config);
    let left = keys(&s3, &bucket).await;
    for shard in SHARDS {
        assert!(left.contains(&format!("{PREFIX}/{shard}/recovery-point.json")), "{left:?}");
    }
    assert_eq!(manifests(&s3, &bucket).await.len(), 2, "retention kept one snapshot per shard: {left:?}");
    let listed = cli(&["list", "--config", config.to_str().unwrap()]);
    assert!(listed.status.success() && !text(&listed).contains("recovery-point"), "{}", text(&listed));
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_at_a_time_between_two_writes_names_the_base_and_deltas_that_restore_at_it_replays_on_each_shard_and_a_point_beyond_reach_names_the_shard()
 {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let (etcds, mut clients, config) = two_shards(&bed, |_| {}).await;
    snapshot_ok(&config);
    let (s3, bucket) = (bed.s3.client(), bed.s3.bucket.clone());
    let agent = agent(cluster, &config, &ns).start().await.unwrap();

    // Early writes on both shards, the point, late writes on both: each stored, and each shard's point past them.
    let mut early = Vec::new();
    for client in clients.iter_mut() {
        load(client, "/registry/early", 8, 100).await.unwrap();
        early.push(client.get("/", None).await.unwrap().header().unwrap().revision() as u64);
    }
    for (shard, revision) in SHARDS.iter().zip(&early) {
        testbed::eventually(WAIT, &format!("{shard}'s early writes stored"), || async {
            stored_point(&s3, &bucket, shard).await.filter(|p| p.stored_revision >= *revision)
        })
        .await;
    }
    // The point: after the early writes were received (they are stored), before the late ones are made (the clock
    // has left the point's millisecond first).
    let at = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let t = DateTime::parse_from_rfc3339(&at).unwrap().with_timezone(&Utc);
    testbed::eventually(WAIT, "the clock past the point", || async { (now_ms() > t.timestamp_millis()).then_some(()) })
        .await;
    for client in clients.iter_mut() {
        load(client, "/registry/late", 8, 100).await.unwrap();
    }
    // Each shard's stored point past the late writes, and at least 1.5 s past the point.
    let after_late = now_ms().max(t.timestamp_millis() + 1500);
    for shard in SHARDS {
        point_after(&s3, &bucket, shard, after_late).await;
    }
    drop(agent);

    let planned = plan_json(&config, &at);
    assert_eq!(time_of(&planned["at"]), t);
    let mut snapshots = Vec::new();
    for (i, shard) in SHARDS.iter().enumerate() {
        let snapshot = only_snapshot(&s3, &bucket, shard).await;
        snapshots.push(snapshot.clone());
        let p = shard_of(&planned, shard);
        assert_eq!(p["snapshot"], snapshot["id"], "{planned}");
        let base = snapshot["revision"].as_u64().unwrap();
        assert_eq!(p["firstDelta"]["from"], base + 1, "the chain starts after the base: {planned}");
        assert_eq!(p["revision"], early[i], "every early write and no late one: {planned}");
        assert!(time_of(&p["lastChangeReceivedAt"]) <= t, "{planned}");
        assert!(p["lostSeconds"].as_f64().unwrap() >= 1.5, "the late writes are lost: {planned}");

        // restore --at the same point does what the plan says: its base, its deltas, its revision, and exactly the
        // keys written by then.
        let (out, _process, mut restored) = restore_shard(&bed, &config, shard, &at).await;
        let said = text(&out);
        let deltas = p["deltas"].as_u64().unwrap();
        assert!(said.contains(&format!("restored snapshot {}", snapshot["id"].as_str().unwrap())), "{said}");
        assert!(said.contains(&format!("and {deltas} delta(s)")), "{said}");
        assert!(said.contains(&format!("the source's revision {}", early[i])), "{said}");
        let served = registry_keys(&mut restored).await;
        assert_eq!(served.iter().filter(|k| k.starts_with("/registry/early/")).count(), 8, "{served:?}");
        assert_eq!(served.iter().filter(|k| k.starts_with("/registry/base/")).count(), 5, "{served:?}");
        assert!(!served.iter().any(|k| k.starts_with("/registry/late/")), "{served:?}");
    }

    // Beyond reach: a point past every shard's recovery point names each shard and what it reaches; one before
    // the oldest snapshot too. Nothing is printed on stdout.
    let future = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let refused = plan(&config, &["--at", &future]);
    let said = text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(refused.stdout.is_empty(), "{said}");
    for shard in SHARDS {
        assert!(said.contains(&format!("shard {shard}: ")), "{said}");
    }
    assert!(said.contains("past its newest recovery point") && said.contains("it reaches from"), "{said}");
    let only_alpha = plan(&config, &["--at", &future, "--shard", "alpha"]);
    assert!(
        text(&only_alpha).contains("shard alpha") && !text(&only_alpha).contains("shard root"),
        "{}",
        text(&only_alpha)
    );
    let ancient = plan(&config, &["--at", "2001-01-01T00:00:00Z"]);
    assert_eq!(ancient.status.code(), Some(1), "{}", text(&ancient));
    assert!(text(&ancient).contains("before its oldest snapshot"), "{}", text(&ancient));

    // alpha's etcd re-created from empty volumes: another cluster where the shard's endpoint points (here a new
    // etcd the configuration names), snapshotted, its deltas written, its recovery point stored. A point of the
    // cluster before is still planned from that cluster's snapshot and deltas; latest-consistent is of the
    // clusters as they run now.
    let fresh = bed.etcd("alpha-recreated", 1).await.unwrap();
    let mut fresh_client = fresh.member_client(0).await.unwrap();
    load(&mut fresh_client, "/registry/fresh", 3, 100).await.unwrap();
    let mut options = Options::new(&bed, "root", vec![etcds[0].members[0].client_url.clone()]).with_deltas("1s", None);
    options.shards.push(("alpha", vec![fresh.members[0].client_url.clone()]));
    let config = write_config(&bed, &options).unwrap();
    snapshot_ok(&config);
    let second = common::agent(cluster, &config, &ns).start().await.unwrap();
    let old_cluster = snapshots[1]["clusterId"].as_str().unwrap().to_string();
    let renewed = now_ms();
    testbed::eventually(WAIT, "alpha's stored point of the re-created cluster", || async {
        stored_point(&s3, &bucket, "alpha").await.filter(|p| p.cluster_id != old_cluster && p.proven_ms > renewed)
    })
    .await;
    point_after(&s3, &bucket, "root", renewed).await;
    // Both shards' points past a time both new sessions were watching by: else one shard's newest point may lie in
    // the other's gap between its two sessions, and latest-consistent is lowered below it.
    let both_watching = now_ms();
    for shard in SHARDS {
        point_after(&s3, &bucket, shard, both_watching).await;
    }
    drop(second);
    let planned = plan_json(&config, &at);
    for (i, shard) in SHARDS.iter().enumerate() {
        let p = shard_of(&planned, shard);
        assert_eq!(p["snapshot"], snapshots[i]["id"], "the point's own cluster: {planned}");
        assert_eq!(p["revision"], early[i], "{planned}");
    }
    let latest = plan_json(&config, "latest-consistent");
    let alpha = shard_of(&latest, "alpha");
    assert_ne!(alpha["snapshot"], snapshots[1]["id"], "the re-created cluster's: {latest}");
    assert!(time_of(&latest["at"]) > t, "{latest}");
}

/// `restore-installation` replaces a live shard's keyspace through the etcd API ([`live::replace_keyspace`]: every
/// key deleted and its marker put in one transaction, the point's keys copied in many, the marker deleted), while
/// the agent records that shard's deltas. A point inside that window held part of the restored keys: `plan` and
/// `restore --at` refuse it, naming the restore, and write nothing; a point after it restores exactly the new
/// keyspace. A marker left there (a replacement that did not finish) stops snapshots, and the stored recovery
/// point does not advance into it.
#[tokio::test(flavor = "multi_thread")]
async fn a_point_inside_a_keyspace_replacement_is_refused_naming_the_restore_one_after_it_restores_the_new_keyspace_and_a_left_marker_stops_snapshots_and_the_recovery_point()
 {
    use etcd_snapshotter::restore::live::{self, MARKER_KEY, Marker};
    const COPIED: usize = 10_000;

    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let (_etcds, mut clients, config) = two_shards(&bed, |_| {}).await;
    snapshot_ok(&config);
    let (s3, bucket) = (bed.s3.client(), bed.s3.bucket.clone());
    let agent = agent(cluster, &config, &ns).start().await.unwrap();
    let before = now_ms();
    point_after(&s3, &bucket, "root", before).await;

    // The point's keyspace, in another etcd: enough keys that the copy takes many transactions.
    let source_etcd = bed.etcd("source", 1).await.unwrap();
    let mut source = source_etcd.member_client(0).await.unwrap();
    load(&mut source, "/registry/restored", COPIED, 800).await.unwrap();
    let marker = Marker { restore: "r-inside".into(), shard: "root".into(), at: "2026-12-01T00:00:00Z".into() };
    let mut live_client = clients[0].clone();
    let replacing = {
        let marker = marker.clone();
        tokio::spawn(async move { live::replace_keyspace(&mut source, &mut live_client, &marker).await })
    };
    // The point: once the marker and some copied keys are there, and while the marker still is.
    let live = &mut clients[0];
    testbed::eventually(WAIT, "the replacement under way", || {
        let mut live = live.clone();
        async move {
            let marked = live::marker(&mut live).await.ok()??;
            let copied =
                live.get("/registry/restored/", Some(etcd_client::GetOptions::new().with_prefix().with_count_only()));
            (copied.await.ok()?.count() > 0).then_some(marked)
        }
    })
    .await;
    let at = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let t = DateTime::parse_from_rfc3339(&at).unwrap().with_timezone(&Utc);
    testbed::eventually(WAIT, "the clock past the point", || async { (now_ms() > t.timestamp_millis()).then_some(()) })
        .await;
    assert!(
        live::marker(live).await.unwrap().is_some(),
        "the replacement finished before the point could be placed inside it: give it more keys"
    );
    let copied = replacing.await.unwrap().unwrap();
    assert_eq!(copied.keys as usize, COPIED);
    // A point is placed by when the agent received each change: the marker's delete is stored, then the point.
    testbed::eventually(WAIT, "root's stored point past the replacement", || async {
        stored_point(&s3, &bucket, "root").await.filter(|p| p.revision >= copied.live_revision as u64)
    })
    .await;
    let after_replacement = now_ms();
    testbed::eventually(WAIT, "the clock past the point", || async { (now_ms() > after_replacement).then_some(()) })
        .await;

    // Inside: refused by plan and by restore --at, naming the restore; no data directory written.
    let refused = plan(&config, &["--at", &at, "--shard", "root"]);
    let said = text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(said.contains("was being replaced by restore r-inside") && said.contains("shard root"), "{said}");
    let (out, data_dir, _) = restore_command(&bed, &config, ("root", &at), "restored-inside").await;
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("was being replaced by restore r-inside"), "{said}");
    assert!(!data_dir.exists(), "a refused restore wrote {}", data_dir.display());

    // After: exactly the replacement's keys, and no marker.
    let after = DateTime::from_timestamp_millis(after_replacement).unwrap().to_rfc3339();
    plan_json(&config, &after);
    let (_out, _process, mut restored) = restore_shard(&bed, &config, "root", &after).await;
    let served = registry_keys(&mut restored).await;
    assert_eq!(served.len(), COPIED, "only the replacement's keys: {:?}", &served[..served.len().min(5)]);
    assert!(served.iter().all(|k| k.starts_with("/registry/restored/")));
    assert_eq!(live::marker(&mut restored).await.unwrap(), None);

    // A marker left by a replacement that did not finish: no snapshot, and the stored point stays before it.
    let left = Marker { restore: "r-left".into(), ..marker };
    let put = live.put(MARKER_KEY, serde_json::to_vec(&left).unwrap(), None).await.unwrap();
    let marked_at = put.header().unwrap().revision() as u64;
    load(live, "/registry/after-marker", 5, 100).await.unwrap();
    let out = cli(&["snapshot", "--config", config.to_str().unwrap(), "--shard", "root"]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("being replaced by restore r-left") && said.contains("no snapshot"), "{said}");
    let root_snapshots = manifests(&s3, &bucket).await.into_iter().filter(|m| m["shard"] == "root").count();
    assert_eq!(root_snapshots, 1, "the refused run published nothing");
    // The writes after the marker stored, then one made after that stored too: the writer has had a tick with
    // everything stored and a claim to prove, and its point must still be before the marker.
    let stored = "etcd_snapshotter_delta_revision{shard=\"root\"}";
    let written = live.get("/", None).await.unwrap().header().unwrap().revision() as f64;
    agent.wait_for_metric(stored, WAIT, |v| v >= written).await;
    let later = live.put("/registry/after-marker/later", "v", None).await.unwrap().header().unwrap().revision() as f64;
    agent.wait_for_metric(stored, WAIT, |v| v >= later).await;
    let point = stored_point(&s3, &bucket, "root").await.unwrap();
    assert!(point.revision < marked_at, "the stored point {point:?} is past the marker put at {marked_at}");
    live.delete(MARKER_KEY, None).await.unwrap();
    let cleared = now_ms();
    point_after(&s3, &bucket, "root", cleared).await;
    drop(agent);
}
