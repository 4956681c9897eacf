//! Delta snapshots and point-in-time restore against a real etcd, a real versitygw and a real kube-apiserver
//! (the daemon's Lease): the daemon's watch under a steady write load, an agent restart mid-stream, a
//! compacted start revision, a broken chain, and the recovery point when the shard's node is lost.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

const BUMP: i64 = 1_000_000_000;

/// One stored delta, as its metadata states it.
#[derive(Debug, Clone)]
struct Stored {
    key: String,
    from: u64,
    to: u64,
    sha256: String,
    previous: String,
}

/// The deltas under the snapshot `id`, by `from` (not the sessions' proofs beside them, in `deltas/proofs/`).
async fn deltas_of(s3: &aws_sdk_s3::Client, bucket: &str, id: &str) -> Vec<Stored> {
    let (dir, proofs) = (format!("{PREFIX}/{id}/deltas/"), format!("{PREFIX}/{id}/deltas/proofs/"));
    let mut out = Vec::new();
    for key in keys(s3, bucket).await.into_iter().filter(|k| k.starts_with(&dir) && !k.starts_with(&proofs)) {
        let head = s3.head_object().bucket(bucket).key(&key).send().await.unwrap();
        let m = head.metadata().unwrap();
        out.push(Stored {
            key: key.clone(),
            from: m["delta-from"].parse().unwrap(),
            to: m["delta-to"].parse().unwrap(),
            sha256: m["delta-sha256"].clone(),
            previous: m["delta-previous-sha256"].clone(),
        });
    }
    out.sort_by_key(|d| d.from);
    out
}

/// Every delta continues the one before: no gap, no revision twice, each naming its predecessor's hash.
fn assert_chain(deltas: &[Stored], snapshot_revision: u64) {
    assert!(!deltas.is_empty());
    assert_eq!(deltas[0].from, snapshot_revision + 1, "the chain starts right after its snapshot");
    assert_eq!(deltas[0].previous, "none");
    for pair in deltas.windows(2) {
        assert_eq!(pair[1].from, pair[0].to + 1, "no gap and no overlap: {pair:?}");
        assert_eq!(pair[1].previous, pair[0].sha256, "chained by hash: {pair:?}");
    }
}

fn only_manifest(manifests: &[serde_json::Value]) -> (String, u64) {
    assert_eq!(manifests.len(), 1, "{manifests:?}");
    (manifests[0]["id"].as_str().unwrap().to_string(), manifests[0]["revision"].as_u64().unwrap())
}

fn deltas_config(bed: &Bed, endpoint: &str, interval: &str) -> std::path::PathBuf {
    let options = Options::new(bed, "root", vec![endpoint.to_string()]).with_deltas(interval, Some("64Ki"));
    write_config(bed, &options).unwrap()
}

/// A one-member etcd with five keys under `/base`, a client to it and a configuration with deltas every second;
/// the namespace for the daemon's Lease.
async fn one_member_with_base(bed: &Bed) -> (String, testbed::Etcd, etcd_client::Client, std::path::PathBuf) {
    let ns = bed.cluster().namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/base", 5, 100).await.unwrap();
    let config = deltas_config(bed, &etcd.members[0].client_url, "1s");
    (ns, etcd, client, config)
}

/// Ten writes under `/registry/after`, stored in the chain under `id`, then the agent stopped and the bucket
/// restored at latest as `name`: the source's revision after the writes, and the restored member.
async fn ten_writes_stored_then_restored(
    bed: &Bed,
    client: &mut etcd_client::Client,
    config: &Path,
    id: &str,
    agent: testbed::agent_process::AgentProcess,
    name: &str,
) -> (i64, testbed::process::Process, etcd_client::Client, String) {
    load(client, "/registry/after", 10, 100).await.unwrap();
    let (now, _) = revision_and_keys(client).await;
    wait_until_stored(&bed.s3.client(), &bed.s3.bucket, id, now).await;
    drop(agent);
    let (process, restored, out) = restore_and_start(bed, config, "latest", name).await;
    (now, process, restored, out)
}

/// Restores to `at` and starts an etcd on the result; the process and a client to it.
async fn restore_and_start(
    bed: &Bed,
    config: &Path,
    at: &str,
    name: &str,
) -> (testbed::process::Process, etcd_client::Client, String) {
    let (process, client, out) = restored_allowing(bed, config, at, name, Some(0)).await;
    (process, client, out)
}

/// `restore --shard root --at <at>` into a fresh directory `name`, exiting `code`, and an etcd started on it.
async fn restored_allowing(
    bed: &Bed,
    config: &Path,
    at: &str,
    name: &str,
    code: Option<i32>,
) -> (testbed::process::Process, etcd_client::Client, String) {
    let (etcdutl, etcd) = (bed.etcdutl().to_str().unwrap(), bed.peers.path("etcd"));
    let options = ["--at", at, "--etcdutl", etcdutl, "--etcd", etcd.to_str().unwrap()];
    let (out, process, client) =
        restore_and_serve(bed, config, &options, name, |out| assert_eq!(out.status.code(), code, "{}", text(out)))
            .await;
    (process, client, text(&out))
}

/// The mod revision of every key under `prefix` the member serves.
async fn mod_revisions(client: &mut etcd_client::Client, prefix: &str) -> BTreeMap<String, i64> {
    let options = etcd_client::GetOptions::new().with_prefix();
    let response = client.get(prefix, Some(options)).await.unwrap();
    response.kvs().iter().map(|kv| (kv.key_str().unwrap().to_string(), kv.mod_revision())).collect()
}

async fn wait_for_deltas(s3: &aws_sdk_s3::Client, bucket: &str, id: &str, count: usize) -> Vec<Stored> {
    testbed::eventually(Duration::from_secs(90), &format!("{count} deltas under {id}"), || async {
        let deltas = deltas_of(s3, bucket, id).await;
        (deltas.len() >= count).then_some(deltas)
    })
    .await
}

async fn wait_until_stored(s3: &aws_sdk_s3::Client, bucket: &str, id: &str, revision: i64) -> Vec<Stored> {
    testbed::eventually(Duration::from_secs(90), &format!("deltas through revision {revision}"), || async {
        let deltas = deltas_of(s3, bucket, id).await;
        deltas.last().is_some_and(|d| d.to as i64 >= revision).then_some(deltas)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn deltas_under_a_steady_write_load_resume_after_an_agent_kill_with_no_gap_and_replay_to_the_source_revisions() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    // fsync on: the restarted agent must catch up behind 50 writes/s within a time, each of them fsynced.
    let etcd = bed.etcd_fsync("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/base", 20, 100).await.unwrap();
    let config = deltas_config(&bed, &etcd.members[0].client_url, "1s");
    snapshot_ok(&config);
    let s3 = bed.s3.client();
    let (id, snapshot_revision) = only_manifest(&manifests(&s3, &bed.s3.bucket).await);

    // The load first: 50 writes a second through the whole test, the agent killed and restarted under it.
    let writes = Load::start(client, "/registry/load", Duration::from_millis(20));
    let mut first = agent(cluster, &config, &ns).start().await.unwrap();
    wait_for_deltas(&s3, &bed.s3.bucket, &id, 3).await;
    first.process.kill();
    let killed_at = writes.acked().len();
    let second = agent(cluster, &config, &ns).start().await.unwrap();
    testbed::eventually(Duration::from_secs(90), "writes after the restart stored", || async {
        let after = writes.acked().get(killed_at + 100)?.revision;
        let deltas = deltas_of(&s3, &bed.s3.bucket, &id).await;
        deltas.last().is_some_and(|d| d.to as i64 >= after).then_some(())
    })
    .await;
    let acks = writes.finish().await;
    let last = acks.last().unwrap().revision;
    let deltas = wait_until_stored(&s3, &bed.s3.bucket, &id, last).await;
    assert_chain(&deltas, snapshot_revision);
    // Both agents wrote: deltas from before the kill, then the restarted agent's through the last write (its
    // revision metric below), chained without a gap. Not a count: a loaded machine flushes fewer, larger deltas.
    let killed_revision = acks[killed_at.saturating_sub(1)].revision;
    assert!(
        deltas.iter().filter(|d| d.to as i64 <= killed_revision).count() >= 3,
        "deltas before the kill: {deltas:?}"
    );
    let stored_through = second
        .wait_for_metric("etcd_snapshotter_delta_stored_through_timestamp_seconds{shard=\"root\"}", WAIT, |v| v > 0.0)
        .await;
    assert!(stored_through > 0.0);
    // The revision is recorded once the delta's PUT has returned, after the bucket shows it: waited for.
    second.wait_for_metric("etcd_snapshotter_delta_revision{shard=\"root\"}", WAIT, |v| v >= last as f64).await;
    drop(second);

    // Latest: every acknowledged write, at the revision the source gave it.
    let (_latest, mut restored, out) = restore_and_start(&bed, &config, "latest", "latest").await;
    assert!(out.contains(&format!("the source's revision {last}")), "{out}");
    let (revision, _) = revision_and_keys(&mut restored).await;
    assert_eq!(revision, last + BUMP, "the last replayed revision, bumped");
    let served = mod_revisions(&mut restored, "/registry/load/").await;
    assert_eq!(served.len(), acks.len(), "every acknowledged write and nothing else");
    for ack in &acks {
        assert_eq!(served.get(&ack.key), Some(&ack.revision), "{} keeps the source's mod revision", ack.key);
    }

    // A revision in the middle: the writes up to it, none after.
    let middle = acks[acks.len() / 2].revision;
    let (_middle, mut restored, _) = restore_and_start(&bed, &config, &middle.to_string(), "middle").await;
    let served = mod_revisions(&mut restored, "/registry/load/").await;
    let expected: BTreeMap<String, i64> =
        acks.iter().filter(|a| a.revision <= middle).map(|a| (a.key.clone(), a.revision)).collect();
    assert_eq!(served, expected);
    assert_eq!(revision_and_keys(&mut restored).await.0, middle + BUMP);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compacted_start_revision_forces_a_full_snapshot_counted_and_the_deltas_chain_to_it() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/base", 10, 100).await.unwrap();
    let config = deltas_config(&bed, &etcd.members[0].client_url, "1s");
    snapshot_ok(&config);
    let s3 = bed.s3.client();
    let (old, old_revision) = only_manifest(&manifests(&s3, &bed.s3.bucket).await);
    load(&mut client, "/registry/later", 10, 100).await.unwrap();
    let (now, _) = revision_and_keys(&mut client).await;
    client.compact(now, None).await.unwrap();

    let agent = agent(cluster, &config, &ns).start().await.unwrap();
    agent.wait_for_metric("etcd_snapshotter_delta_compacted_total{shard=\"root\"}", WAIT, |v| v == 1.0).await;
    let newer = testbed::eventually(WAIT, "a full snapshot taken for the gap", || async {
        let all = manifests(&s3, &bed.s3.bucket).await;
        all.into_iter().find(|m| m["id"] != old.as_str())
    })
    .await;
    assert!(newer["revision"].as_u64().unwrap() >= now as u64, "{newer}");
    client.put("/registry/after-the-gap", "x", None).await.unwrap();
    let id = newer["id"].as_str().unwrap();
    let deltas = wait_for_deltas(&s3, &bed.s3.bucket, id, 1).await;
    assert_chain(&deltas, newer["revision"].as_u64().unwrap());
    assert!(
        deltas_of(&s3, &bed.s3.bucket, &old).await.is_empty(),
        "nothing written after the old snapshot's {old_revision}"
    );
    assert_eq!(agent.metric("etcd_snapshotter_delta_compacted_total{shard=\"root\"}").await.unwrap(), 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_corrupted_or_deleted_middle_delta_stops_restore_at_the_last_good_revision_and_says_so_with_exit_2() {
    let bed = Bed::with_cluster().await.unwrap();
    let s3 = bed.s3.client();
    let chain = FlippedChain::build(&bed, |bed, endpoint| deltas_config(bed, endpoint, "1s")).await;
    let FlippedChain { config, snapshot_revision, good, broken, .. } = &chain;
    let snapshot_revision = *snapshot_revision;
    let (_p, mut restored, out) = restored_allowing(&bed, config, "latest", "flipped", Some(2)).await;
    assert!(out.contains(&format!("breaks at revision {}", broken.from)) && out.contains("sha256"), "{out}");
    assert!(out.contains(&format!("STOPPED AT THE LAST GOOD POINT, revision {}", good.to)), "{out}");
    assert_eq!(revision_and_keys(&mut restored).await.0, good.to as i64 + BUMP);
    assert_up_to(&mut restored, snapshot_revision, good.to).await;

    // Deleted: the same point, and the message says it is missing.
    s3.delete_object().bucket(&bed.s3.bucket).key(&broken.key).send().await.unwrap();
    let (_p, mut restored, out) = restored_allowing(&bed, config, "latest", "deleted", Some(2)).await;
    assert!(out.contains(&format!("breaks at revision {}", broken.from)) && out.contains("missing"), "{out}");
    assert_eq!(revision_and_keys(&mut restored).await.0, good.to as i64 + BUMP);
    assert_up_to(&mut restored, snapshot_revision, good.to).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn restore_at_a_revision_stops_at_it_before_a_broken_link_and_exits_2_when_the_chain_ends_before_it() {
    let bed = Bed::with_cluster().await.unwrap();
    let s3 = bed.s3.client();
    let chain = FlippedChain::build(&bed, |bed, endpoint| deltas_config(bed, endpoint, "1s")).await;
    let FlippedChain { config, id, snapshot_revision, good, .. } = &chain;
    // The point is the last intact delta's end: reached, though a broken delta follows it.
    let at = good.to.to_string();
    let (_p, mut restored, out) = restored_allowing(&bed, config, &at, "at-good-end", Some(0)).await;
    assert!(!out.contains("STOPPED"), "{out}");
    assert_eq!(revision_and_keys(&mut restored).await.0, good.to as i64 + BUMP);
    assert_up_to(&mut restored, *snapshot_revision, good.to).await;

    // Every delta after the intact one gone (retention, an outage): the chain ends at its end, and a point past
    // it is not restored short in silence.
    for stored in deltas_of(&s3, &bed.s3.bucket, id).await.into_iter().filter(|d| d.from > good.to) {
        s3.delete_object().bucket(&bed.s3.bucket).key(&stored.key).send().await.unwrap();
    }
    let past = (good.to + 1).to_string();
    let (_p, mut restored, out) = restored_allowing(&bed, config, &past, "past-the-end", Some(2)).await;
    assert!(out.contains(&format!("ends at revision {}, before the point {past}", good.to)), "{out}");
    assert!(out.contains(&format!("STOPPED AT THE LAST GOOD POINT, revision {}", good.to)), "{out}");
    assert_eq!(revision_and_keys(&mut restored).await.0, good.to as i64 + BUMP);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_full_snapshot_at_the_same_revision_carries_the_delta_chain_and_restore_at_latest_holds_every_write() {
    let bed = Bed::with_cluster().await.unwrap();
    let (ns, _etcd, mut client, config) = one_member_with_base(&bed).await;
    snapshot_ok(&config);
    let s3 = bed.s3.client();
    let agent = agent(bed.cluster(), &config, &ns).start().await.unwrap();
    // The writer's session runs under the first snapshot once it has caught up.
    let caught_up = "etcd_snapshotter_delta_stored_through_timestamp_seconds{shard=\"root\"}";
    agent.wait_for_metric(caught_up, WAIT, |v| v > 0.0).await;
    // The idle shard snapshotted again: the same revision, a later id, the base every restore now takes.
    snapshot_ok(&config);
    let listed = manifests(&s3, &bed.s3.bucket).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[0]["revision"], listed[1]["revision"], "{listed:?}");
    let newer = listed.iter().map(|m| m["id"].as_str().unwrap().to_string()).max().unwrap();
    let (now, _p, mut restored, out) =
        ten_writes_stored_then_restored(&bed, &mut client, &config, &newer, agent, "same-revision").await;
    assert!(out.contains(&newer), "{out}");
    assert_eq!(revision_and_keys(&mut restored).await.0, now + BUMP, "every write: {out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_taken_while_nospace_was_raised_replays_its_deltas_with_the_alarm_disarmed_and_says_so() {
    use etcd_client::{AlarmAction, AlarmType};
    let bed = Bed::with_cluster().await.unwrap();
    let (ns, _etcd, mut client, config) = one_member_with_base(&bed).await;
    // NOSPACE raised (the member refuses writes), a full snapshot taken meanwhile: the alarm is in its database.
    let member = client.status().await.unwrap().header().unwrap().member_id();
    nospace(&mut client, member, AlarmAction::Activate).await.unwrap();
    assert!(client.put("/registry/refused", "x", None).await.is_err(), "NOSPACE refuses writes");
    snapshot_ok(&config);
    let s3 = bed.s3.client();
    let (id, _) = only_manifest(&manifests(&s3, &bed.s3.bucket).await);
    // Space freed, the alarm disarmed, writes again: the deltas carry them.
    nospace(&mut client, member, AlarmAction::Deactivate).await.unwrap();
    let agent = agent(bed.cluster(), &config, &ns).start().await.unwrap();
    let (now, _p, mut restored, out) =
        ten_writes_stored_then_restored(&bed, &mut client, &config, &id, agent, "after-nospace").await;
    assert!(out.contains("NOSPACE alarm was raised; the alarm is disarmed"), "{out}");
    assert_eq!(revision_and_keys(&mut restored).await.0, now + BUMP, "every write: {out}");
    let alarms = restored.alarm(AlarmAction::Get, AlarmType::None, None).await.unwrap();
    assert!(alarms.alarms().is_empty(), "the restored member takes writes: {} alarm(s)", alarms.alarms().len());
    restored.put("/registry/written-after-restore", "y", None).await.unwrap();
}

/// A full snapshot and three deltas after it (three bursts of writes, each stored before the next: the first burst
/// wholly before the second delta), then a byte flipped in versitygw's file of the second delta.
struct FlippedChain {
    _etcd: testbed::Etcd,
    config: std::path::PathBuf,
    id: String,
    snapshot_revision: u64,
    good: Stored,
    broken: Stored,
}

impl FlippedChain {
    async fn build(bed: &Bed, config_for: fn(&Bed, &str) -> std::path::PathBuf) -> Self {
        let cluster = bed.cluster();
        let ns = cluster.namespace().await.unwrap();
        let etcd = bed.etcd("root", 1).await.unwrap();
        let mut client = etcd.member_client(0).await.unwrap();
        load(&mut client, "/base", 5, 100).await.unwrap();
        let config = config_for(bed, &etcd.members[0].client_url);
        snapshot_ok(&config);
        let s3 = bed.s3.client();
        let (id, snapshot_revision) = only_manifest(&manifests(&s3, &bed.s3.bucket).await);
        let agent = agent(cluster, &config, &ns).start().await.unwrap();
        for (burst, prefix) in ["/registry/one", "/registry/two", "/registry/three"].into_iter().enumerate() {
            load(&mut client, prefix, 5, 100).await.unwrap();
            let (now, _) = revision_and_keys(&mut client).await;
            let deltas = wait_until_stored(&s3, &bed.s3.bucket, &id, now).await;
            assert!(deltas.len() > burst, "{deltas:?}");
        }
        drop(agent);
        let deltas = deltas_of(&s3, &bed.s3.bucket, &id).await;
        let (good, broken) = (deltas[0].clone(), deltas[1].clone());
        bed.flip_middle_byte(&broken.key, 0x40);
        Self { _etcd: etcd, config, id, snapshot_revision, good, broken }
    }
}

/// The member serves exactly the writes (one new key each) from the snapshot's revision up to `to`.
async fn assert_up_to(restored: &mut etcd_client::Client, snapshot_revision: u64, to: u64) {
    let served = mod_revisions(restored, "/registry/").await;
    assert!(served.values().all(|r| *r as u64 <= to), "nothing past the last good revision: {served:?}");
    assert_eq!(served.len() as u64, to - snapshot_revision, "every write up to it: {served:?}");
}

/// What a delta's write may take on top of the interval on this machine (the progress answer, zstd, the PUT).
const FLUSH_ALLOWANCE: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread")]
async fn losing_the_shards_node_under_a_steady_write_load_loses_only_writes_of_the_last_interval() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    // fsync on: the RPO is measured against writes acknowledged as production acknowledges them, after the fsync.
    let mut etcd = bed.etcd_fsync("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/base", 5, 100).await.unwrap();
    let interval = Duration::from_secs(2);
    let config = deltas_config(&bed, &etcd.members[0].client_url, "2s");
    snapshot_ok(&config);
    let s3 = bed.s3.client();
    let (id, _) = only_manifest(&manifests(&s3, &bed.s3.bucket).await);
    let mut agent = agent(cluster, &config, &ns).start().await.unwrap();
    let writes = Load::start(client, "/registry/load", Duration::from_millis(10));
    wait_for_deltas(&s3, &bed.s3.bucket, &id, 4).await;
    // A delta was just written: the node goes most of an interval later (150 more writes at 100/s), not right
    // after a flush, so the loss measured is near the worst case.
    let seen = writes.acked().len();
    testbed::eventually(WAIT, "150 more writes", || async { (writes.acked().len() >= seen + 150).then_some(()) }).await;

    let (fsyncs, fsync_seconds) = wal_fsyncs(&etcd.members[0].client_url).await;

    // The node goes: the agent and the shard's etcd at once, mid-load (no flush on the way out).
    agent.process.kill();
    etcd.kill_member(0);
    let lost_at = Instant::now();
    let acks = writes.finish().await;
    assert!(acks.len() > 400, "a steady load ran: {}", acks.len());

    // The etcd does not answer, so the shard's only cluster in the bucket is restored.
    let (_p, mut restored, _) = restore_and_start(&bed, &config, "latest", "after-the-loss").await;
    let served = mod_revisions(&mut restored, "/registry/load/").await;
    let lost: Vec<&Ack> = acks.iter().filter(|a| !served.contains_key(&a.key)).collect();
    let oldest_lost = lost.iter().map(|a| lost_at.duration_since(a.at)).max().unwrap_or_default();
    println!(
        "RPO: {} of {} acknowledged writes lost, the oldest acknowledged {:.2}s before the loss (interval {:?}; \
         etcd's WAL fsyncs: {fsyncs}, {:.2} ms each on average)",
        lost.len(),
        acks.len(),
        oldest_lost.as_secs_f64(),
        interval,
        fsync_seconds * 1000.0 / fsyncs.max(1.0)
    );
    for ack in &acks {
        if lost_at.duration_since(ack.at) > interval + FLUSH_ALLOWANCE {
            assert_eq!(
                served.get(&ack.key),
                Some(&ack.revision),
                "{} was acknowledged before the last interval",
                ack.key
            );
        }
    }
    // What is served is a prefix of the source's history: nothing after a lost write survives.
    let newest_served = served.values().max().copied().unwrap_or_default();
    assert!(acks.iter().filter(|a| a.revision <= newest_served).all(|a| served.contains_key(&a.key)));
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_deletes_a_snapshots_deltas_with_it_and_clean_up_removes_orphaned_deltas_but_never_hand_placed_files()
{
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/base", 5, 100).await.unwrap();
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.keep_last = 1;
    let config = write_config(&bed, &options).unwrap();
    snapshot_ok(&config);
    let s3 = bed.s3.client();
    let (old, revision) = only_manifest(&manifests(&s3, &bed.s3.bucket).await);
    let put = |key: String, ours: bool| put_by_hand(&s3, &bed.s3.bucket, key, ours);
    let deltas = format!("{PREFIX}/{old}/deltas");
    let ours = format!("{deltas}/{:020}.delta.zst", revision + 1);
    let hand_placed_in_our_shape = format!("{deltas}/{:020}.delta.zst", revision + 7);
    let notes = format!("{deltas}/notes.txt");
    // A delta of ours whose snapshot retention deleted before the writer saw the newer one.
    let orphan = format!("{PREFIX}/root/20261130T120000Z-r3/deltas/{:020}.delta.zst", 4);
    let hand_placed_orphan = format!("{PREFIX}/root/20261130T120000Z-r3/deltas/{:020}.delta", 9);
    put(ours.clone(), true).await;
    put(hand_placed_in_our_shape.clone(), false).await;
    put(notes.clone(), true).await;
    put(orphan.clone(), true).await;
    put(hand_placed_orphan.clone(), false).await;

    load(&mut client, "/registry/later", 5, 100).await.unwrap();
    let out = snapshot_ok(&config);
    assert!(out.contains("deleted 1"), "{out}");
    let left = keys(&s3, &bed.s3.bucket).await;
    for gone in [&ours, &orphan] {
        assert!(!left.contains(gone), "{gone} is ours and goes: {left:?}");
    }
    for kept in [&hand_placed_in_our_shape, &notes, &hand_placed_orphan] {
        assert!(left.contains(kept), "{kept} was not written by the agent and stays: {left:?}");
    }
    assert!(!left.iter().any(|k| k.starts_with(&format!("{PREFIX}/{old}/snapshot.db"))), "the snapshot itself went");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_object_lock_every_delta_is_written_locked_and_the_agents_own_key_cannot_delete_it() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/base", 5, 100).await.unwrap();
    let s3 = bed.s3.client();
    s3.create_bucket().bucket("locked-deltas").object_lock_enabled_for_bucket(true).send().await.unwrap();
    let mut options =
        Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]).with_deltas("1s", Some("64Ki"));
    options.bucket = "locked-deltas".into();
    options.extra_storage = "  objectLock:\n    mode: compliance\n    retainFor: 1h\n";
    let config = write_config(&bed, &options).unwrap();
    snapshot_ok(&config);
    let (id, snapshot_revision) = only_manifest(&manifests(&s3, "locked-deltas").await);
    let _agent = agent(cluster, &config, &ns).start().await.unwrap();
    load(&mut client, "/registry/after", 10, 100).await.unwrap();
    let (now, _) = revision_and_keys(&mut client).await;
    let deltas = wait_until_stored(&s3, "locked-deltas", &id, now).await;
    assert_chain(&deltas, snapshot_revision);
    let written = chrono::Utc::now().timestamp();
    for delta in &deltas {
        let head = s3.head_object().bucket("locked-deltas").key(&delta.key).send().await.unwrap();
        assert_eq!(head.object_lock_mode().map(|m| m.as_str()), Some("COMPLIANCE"), "{}", delta.key);
        let until = head.object_lock_retain_until_date().expect("a retention date").secs();
        assert!(until > written + 3500 && until <= written + 3602, "{} locked until {until}", delta.key);
        let deleted = s3.delete_object().bucket("locked-deltas").key(&delta.key).send().await;
        assert!(deleted.is_err(), "a delete of {} with the agent's key went through during its lock", delta.key);
    }
    assert_eq!(deltas_of(&s3, "locked-deltas", &id).await.len(), deltas.len(), "every delta is still there");
}

/// A daemon writing deltas with the live member's record on every delta, and drills configured.
fn drilled_deltas_config(bed: &Bed, endpoint: &str) -> std::path::PathBuf {
    let mut options =
        Options::new(bed, "root", vec![endpoint.to_string()]).with_drills(bed).with_deltas("1s", Some("64Ki"));
    options.shard_extra.push_str("  hashKvInterval: 0s\n");
    write_config(bed, &options).unwrap()
}

async fn drill_report(s3: &aws_sdk_s3::Client, bucket: &str, id: &str) -> serde_json::Value {
    let key = format!("{PREFIX}/{id}/drill.json");
    let out = s3.get_object().bucket(bucket).key(&key).send().await.unwrap();
    serde_json::from_slice(&out.body.collect().await.unwrap().into_bytes()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_drill_replays_leased_transactional_compacted_deltas_and_matches_the_live_members_keys_and_hash_kv() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/base", 20, 500).await.unwrap();
    let config = drilled_deltas_config(&bed, &etcd.members[0].client_url);
    snapshot_ok(&config);
    let s3 = bed.s3.client();
    let (id, snapshot_revision) = only_manifest(&manifests(&s3, &bed.s3.bucket).await);
    let agent = agent(cluster, &config, &ns).start().await.unwrap();

    // What a kcp shard's etcd sees: keys under a lease (events), multi-key transactions, deletes, and the
    // apiserver's compaction, all after the full snapshot.
    let lease = client.lease_grant(600, None).await.unwrap().id();
    for i in 0..5 {
        let put = etcd_client::PutOptions::new().with_lease(lease);
        client.put(format!("/registry/events/e{i}"), vec![b'e'; 300], Some(put)).await.unwrap();
    }
    let ops = (0..4).map(|i| etcd_client::TxnOp::put(format!("/registry/txn/{i}"), vec![b't'; 100], None));
    client.txn(etcd_client::Txn::new().and_then(ops.collect::<Vec<_>>())).await.unwrap();
    client.delete("/registry/base/", Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
    load(&mut client, "/registry/more", 10, 200).await.unwrap();
    // Compacted as the apiserver compacts: revisions the watch has read already (compacting ahead of it would
    // force a new full snapshot, counted; its own test).
    let (compact_at, _) = revision_and_keys(&mut client).await;
    wait_until_stored(&s3, &bed.s3.bucket, &id, compact_at).await;
    client.compact(compact_at, Some(etcd_client::CompactionOptions::new().with_physical())).await.unwrap();
    load(&mut client, "/registry/after", 10, 200).await.unwrap();
    let lease_after = client.lease_grant(600, None).await.unwrap().id();
    let put = etcd_client::PutOptions::new().with_lease(lease_after);
    client.put("/registry/events/late", vec![b'l'; 100], Some(put)).await.unwrap();
    let (now, _) = revision_and_keys(&mut client).await;
    let deltas = wait_until_stored(&s3, &bed.s3.bucket, &id, now).await;
    drop(agent);
    assert_chain(&deltas, snapshot_revision);
    let last = deltas.last().unwrap();

    let out = cli(&["drill", "--config", config.to_str().unwrap(), &id]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let expected = format!(
        "chain of {} delta(s) replayed to revision {}: keys and HashKV at revision {} match the live member's",
        deltas.len(),
        last.to,
        last.to
    );
    assert!(stdout.contains(&expected), "{}", text(&out));
    let r = drill_report(&s3, &bed.s3.bucket, &id).await;
    assert_eq!(r["passed"], true, "{r}");
    let chain = &r["chain"];
    assert_eq!(
        (chain["hashKv"].as_str(), chain["comparedAt"].as_u64(), chain["revision"].as_u64()),
        (Some("match"), Some(last.to), Some(now as u64)),
        "{r}"
    );
    let (_, live_keys) = revision_and_keys(&mut client).await;
    assert_eq!(chain["keyCount"].as_i64(), Some(live_keys), "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_drill_of_a_snapshot_whose_middle_delta_is_corrupted_fails_with_delta_chain_broken_and_names_the_revision() {
    let bed = Bed::with_cluster().await.unwrap();
    let s3 = bed.s3.client();
    let chain = FlippedChain::build(&bed, drilled_deltas_config).await;
    let FlippedChain { config, id, good, broken, .. } = &chain;

    let out = cli(&["drill", "--config", config.to_str().unwrap(), id]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // The one line per drill goes to stderr when it failed.
    let stdout = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains(&format!("FAILED {id}: delta_chain_broken")), "{}", text(&out));
    assert!(
        stdout.contains(&format!("breaks at revision {}", broken.from))
            && stdout.contains(&format!("the last good revision is {}", good.to)),
        "{}",
        text(&out)
    );
    let r = drill_report(&s3, &bed.s3.bucket, id).await;
    assert_eq!(
        (r["passed"].clone(), r["failure"]["reason"].clone()),
        (false.into(), "delta_chain_broken".into()),
        "{r}"
    );
}

/// An idle shard loses nothing, so its recovery point must keep up with the clock: without this the RPO alert
/// fires on every quiet shard. No write after the full snapshot; the stored-through time must be set and then
/// advance past the moment the agent started.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_shard_with_no_write_after_its_full_snapshot_reports_a_recovery_point_that_keeps_up_with_the_clock() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    // No fsync needed: after its base nothing writes to this member (the writer only reads), so it never fsyncs.
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/base", 20, 100).await.unwrap();
    let config = deltas_config(&bed, &etcd.members[0].client_url, "1s");
    snapshot_ok(&config);
    let started = kcp_keeper_runtime::metrics::unix_now();
    let agent = agent(cluster, &config, &ns).start().await.unwrap();
    let series = "etcd_snapshotter_delta_stored_through_timestamp_seconds{shard=\"root\"}";
    let first = agent.wait_for_metric(series, WAIT, |v| v >= started).await;
    agent.wait_for_metric(series, WAIT, |v| v > first).await;
    let s3 = bed.s3.client();
    let (id, _) = only_manifest(&manifests(&s3, &bed.s3.bucket).await);
    assert!(deltas_of(&s3, &bed.s3.bucket, &id).await.is_empty(), "no write, so no delta object");
}

/// The newest revision the chain under `id` stores (the snapshot's own when no delta is stored yet): unlike
/// [`stored_through`], blind to any other snapshot's chain.
async fn chain_stored_through(s3: &aws_sdk_s3::Client, bucket: &str, id: &str, snapshot_revision: u64) -> i64 {
    deltas_of(s3, bucket, id).await.last().map_or(snapshot_revision, |d| d.to) as i64
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_cut_off_from_its_peers_neither_stalls_the_deltas_nor_lets_the_recovery_point_claim_writes_not_stored()
{
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    // fsync on (every partitionable cluster): the recovery point is sampled five times a second against the bucket.
    let etcd = bed.partitionable_etcd("root").await.unwrap();
    // Member 0 is listed first: the writer watches it until it is cut off.
    let endpoints = etcd.members.iter().map(|m| m.client_url.clone()).collect();
    let options = Options::new(&bed, "root", endpoints).with_deltas("1s", Some("64Ki"));
    let config = write_config(&bed, &options).unwrap();
    snapshot_ok(&config);
    let s3 = bed.s3.client();
    let (id, snapshot_revision) = only_manifest(&manifests(&s3, &bed.s3.bucket).await);
    let agent = agent(cluster, &config, &ns).start().await.unwrap();
    // The load goes to the two members that keep their quorum.
    let urls = [etcd.members[1].client_url.clone(), etcd.members[2].client_url.clone()];
    let writes = Load::start(
        etcd_client::Client::connect(urls, None).await.unwrap(),
        "/registry/load",
        Duration::from_millis(20),
    );
    wait_for_deltas(&s3, &bed.s3.bucket, &id, 2).await;
    let series = "etcd_snapshotter_delta_stored_through_timestamp_seconds{shard=\"root\"}";

    etcd.cut(0);
    let cut_at = kcp_keeper_runtime::metrics::unix_now();
    // Every claim of the metric is checked against the bucket right after it is read, five times a second,
    // until 25 claims have come after the cut (the deltas went on through the members with a quorum).
    let (mut samples, mut claims_after_cut) = (0, 0);
    let mut every = tokio::time::interval(Duration::from_millis(200));
    let deadline = Instant::now() + Duration::from_secs(120);
    while claims_after_cut < 25 {
        assert!(Instant::now() < deadline, "only {claims_after_cut} of {samples} claims came after the cut");
        every.tick().await;
        let claimed = agent.metric(series).await.unwrap();
        let stored = chain_stored_through(&s3, &bed.s3.bucket, &id, snapshot_revision).await;
        let acked = writes.acked();
        let missing: Vec<(i64, f64)> =
            claimed_but_unstored(acked.iter().map(|a| (a.revision, a.unix)), claimed, stored).collect();
        assert!(
            missing.is_empty(),
            "the metric claims the shard stored through {claimed:.3} ({:.1}s after the cut), but {} writes acknowledged before then are not stored (stored through revision {stored}, first missing {:?})",
            claimed - cut_at,
            missing.len(),
            missing.first().map(|(revision, _)| *revision),
        );
        samples += 1;
        claims_after_cut += usize::from(claimed > cut_at);
    }
    // The deltas went on through the members with a quorum: everything acknowledged is stored, and restores.
    let mut source = etcd.member_client(1).await.unwrap();
    let through = writes.finish_at_source(&mut source).await;
    wait_until_stored(&s3, &bed.s3.bucket, &id, through).await;
    println!(
        "{samples} samples of the recovery point after the cut, {claims_after_cut} of them claiming a time after it"
    );
    etcd.heal(0);
    let (_p, mut restored, _) = restore_and_start(&bed, &config, "latest", "after-the-cut").await;
    let served = mod_revisions(&mut restored, "/registry/load/").await;
    assert_eq!(served, mod_revisions(&mut source, "/registry/load/").await, "restore --at latest serves the source");
}

#[tokio::test(flavor = "multi_thread")]
async fn restore_at_a_time_inside_the_deleted_last_deltas_exits_2_since_the_next_snapshot_proves_the_chain_went_on() {
    let bed = Bed::with_cluster().await.unwrap();
    let (ns, _etcd, client, config) = one_member_with_base(&bed).await;
    snapshot_ok(&config);
    let s3 = bed.s3.client();
    let (id, snapshot_revision) = only_manifest(&manifests(&s3, &bed.s3.bucket).await);
    let agent = agent(bed.cluster(), &config, &ns).start().await.unwrap();
    let writes = Load::start(client, "/registry/load", Duration::from_millis(20));
    wait_for_deltas(&s3, &bed.s3.bucket, &id, 4).await;
    // A second full snapshot: the writer moves its chain under it, so the first chain ends past its revision.
    snapshot_ok(&config);
    let newer = manifests(&s3, &bed.s3.bucket).await.into_iter().find(|m| m["id"] != id.as_str()).unwrap();
    let newer_id = newer["id"].as_str().unwrap().to_string();
    wait_for_deltas(&s3, &bed.s3.bucket, &newer_id, 1).await;
    let acks = writes.finish().await;
    drop(agent);

    // The first chain's last deltas go (a bucket writer, a mistaken clean-up): every one that reaches the newer
    // snapshot's revision, so that snapshot proves the chain went on past where it now ends. (The writer moves
    // its chain under the newer snapshot at its next tick, so the first chain may hold several deltas past it.)
    let chain = deltas_of(&s3, &bed.s3.bucket, &id).await;
    assert_chain(&chain, snapshot_revision);
    let newer_revision = newer["revision"].as_u64().unwrap();
    let cut = chain.iter().position(|d| d.to >= newer_revision).expect("the first chain reaches the newer snapshot");
    let (kept, deleted) = chain.split_at(cut);
    for delta in deleted {
        s3.delete_object().bucket(&bed.s3.bucket).key(&delta.key).send().await.unwrap();
    }
    // A point inside what they held: just after a write the first of them held was acknowledged.
    let first = &deleted[0];
    let inside = acks.iter().find(|a| a.revision as u64 >= first.from).expect("a write the deleted deltas held");
    let at = chrono::DateTime::from_timestamp_millis((inside.unix * 1000.0) as i64 + 10).unwrap();
    let at = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let (_p, mut restored, out) = restored_allowing(&bed, &config, &at, "inside-the-deleted", Some(2)).await;
    let good = kept.last().map_or(snapshot_revision, |d| d.to);
    assert!(out.contains("the deltas between are missing") && out.contains(&newer_id), "{out}");
    assert!(out.contains(&format!("STOPPED AT THE LAST GOOD POINT, revision {good}")), "{out}");
    assert_up_to(&mut restored, snapshot_revision, good).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stray_delta_past_the_chain_is_passed_over_and_one_squatting_on_the_next_link_is_counted_and_a_full_snapshot_restarts_the_chain()
 {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let config = deltas_config(&bed, &etcd.members[0].client_url, "1s");
    snapshot_ok(&config);
    let s3 = bed.s3.client();
    let (id, snapshot_revision) = only_manifest(&manifests(&s3, &bed.s3.bucket).await);
    let mut agent = agent(cluster, &config, &ns).start().await.unwrap();
    let writes = Load::start(etcd.member_client(0).await.unwrap(), "/registry/load", Duration::from_millis(20));
    let chain = wait_for_deltas(&s3, &bed.s3.bucket, &id, 2).await;
    agent.process.kill();

    // A stray with a huge `from` whose metadata claims the chain (a bucket writer, a bug elsewhere): the writer
    // starts again after the chain's real end, not after the stray.
    let last = chain.last().unwrap().clone();
    let dir = format!("{PREFIX}/{id}/deltas/");
    let head = s3.head_object().bucket(&bed.s3.bucket).key(&last.key).send().await.unwrap();
    let mut claimed = head.metadata().unwrap().clone();
    claimed.insert("delta-from".into(), "90000000000".into());
    claimed.insert("delta-to".into(), "90000000010".into());
    claimed.insert("delta-previous-sha256".into(), last.sha256.clone());
    let stray = format!("{dir}{:020}.delta.zst", 90_000_000_000u64);
    s3.put_object()
        .bucket(&bed.s3.bucket)
        .key(&stray)
        .set_metadata(Some(claimed))
        .body(b"stray".to_vec().into())
        .send()
        .await
        .unwrap();
    agent.process.restart().unwrap();
    agent.wait_ready(WAIT).await.unwrap();
    let seen = writes.acked().last().unwrap().revision;
    let chain = wait_until_stored(&s3, &bed.s3.bucket, &id, seen).await;
    let on_chain: Vec<Stored> = chain.into_iter().filter(|d| d.key != stray).collect();
    assert_chain(&on_chain, snapshot_revision);

    // An object squatting on the next link's key that is not a link: counted, and a full snapshot starts a new
    // chain under which the deltas go on.
    agent.process.kill();
    let end =
        deltas_of(&s3, &bed.s3.bucket, &id).await.into_iter().filter(|d| d.key != stray).map(|d| d.to).max().unwrap();
    put_by_hand(&s3, &bed.s3.bucket, format!("{dir}{:020}.delta.zst", end + 1), true).await;
    agent.process.restart().unwrap();
    agent.wait_ready(WAIT).await.unwrap();
    agent.wait_for_metric("etcd_snapshotter_delta_failures_total{shard=\"root\"}", WAIT, |v| v >= 1.0).await;
    let newer = testbed::eventually(WAIT, "a new full snapshot", || async {
        manifests(&s3, &bed.s3.bucket).await.into_iter().find(|m| m["id"] != id.as_str())
    })
    .await;
    let newer_id = newer["id"].as_str().unwrap().to_string();
    let under_newer = wait_for_deltas(&s3, &bed.s3.bucket, &newer_id, 1).await;
    assert_chain(&under_newer, newer["revision"].as_u64().unwrap());
    drop(writes);
}

/// A delta a bucket writer appends to the chain under `id`: well formed, linked by hash to the last one, with a
/// write of its own, but not signed by the installation's key.
async fn forge_next_delta(s3: &aws_sdk_s3::Client, bucket: &str, id: &str, cluster_id: &str) -> u64 {
    use etcd_snapshotter::delta::{self, Event, Header, Kind, Meta};
    let last = deltas_of(s3, bucket, id).await.pop().expect("a chain to extend");
    let from = last.to + 1;
    let event = Event {
        kind: Kind::Put,
        revision: from,
        received_ms: chrono::Utc::now().timestamp_millis(),
        key: b"/registry/forged".to_vec(),
        value: b"planted".to_vec(),
        lease: 0,
    };
    let header = Header {
        from,
        to: from,
        snapshot: id.into(),
        cluster_id: cluster_id.into(),
        previous_sha256: Some(last.sha256.clone()),
        live: None,
        watching_since_ms: None,
    };
    let mut encoder =
        etcd_snapshotter::encode::Encoder::new(etcd_snapshotter::config::Compression::Zstd, &[], 1 << 20).unwrap();
    encoder.write(&delta::encode_payload(&header, &[event])).unwrap();
    let mut parts = encoder.take_parts();
    parts.extend(encoder.finish().unwrap().0);
    let object: Vec<u8> = parts.concat();
    let meta = Meta {
        from,
        to: from,
        sha256: hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&object)),
        previous: Some(last.sha256),
        snapshot: id.into(),
        cluster_id: cluster_id.into(),
        events: 1,
        live: None,
        watching_since_ms: None,
        hmac: None,
    };
    let key = format!("{PREFIX}/{id}/deltas/{}", delta::object_name(from, "zstd", false));
    let mut request =
        s3.put_object().bucket(bucket).key(key).body(object.into()).metadata("written-by", "etcd-snapshotter");
    for (name, value) in meta.to_metadata() {
        request = request.metadata(name, value);
    }
    request.send().await.unwrap();
    from
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_delta_key_a_delta_appended_by_a_bucket_writer_is_refused_by_restore_which_applies_it_without_one() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/base", 20, 100).await.unwrap();
    let key_file = bed.path("delta-key");
    std::fs::write(&key_file, "a-secret-only-the-agent-and-its-restores-hold\n").unwrap();
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]).with_deltas("1s", None);
    let unsigned = write_config(&bed, &options).unwrap();
    options.delta_signing_key = Some(key_file);
    let signed = write_config(&bed, &options).unwrap();
    snapshot_ok(&signed);
    let s3 = bed.s3.client();
    let (id, _) = only_manifest(&manifests(&s3, &bed.s3.bucket).await);
    let agent = agent(cluster, &signed, &ns).start().await.unwrap();
    load(&mut client, "/registry/after", 30, 100).await.unwrap();
    let written = client.get("/", None).await.unwrap().header().unwrap().revision();
    let chain = wait_until_stored(&s3, &bed.s3.bucket, &id, written).await;
    drop(agent);
    let signed_by_agent = s3.head_object().bucket(&bed.s3.bucket).key(&chain[0].key).send().await.unwrap();
    assert!(signed_by_agent.metadata().unwrap().contains_key("delta-hmac-sha256"), "the agent signs its deltas");

    let manifest = &manifests(&s3, &bed.s3.bucket).await[0];
    let cluster_id = manifest["clusterId"].as_str().unwrap().to_string();
    let forged = forge_next_delta(&s3, &bed.s3.bucket, &id, &cluster_id).await;

    // With the key: the chain stops before the forged link, and says so.
    let (_p, mut restored, out) = restored_allowing(&bed, &signed, "latest", "with-the-key", Some(2)).await;
    assert!(out.contains(&format!("breaks at revision {forged}")) && out.contains("not signed"), "{out}");
    assert!(restored.get("/registry/forged", None).await.unwrap().kvs().is_empty(), "the planted key is not restored");
    let source = mod_revisions(&mut client, "/registry/").await;
    assert_eq!(mod_revisions(&mut restored, "/registry/").await, source, "every signed delta, up to {written}");
    // The control: without the key the same forged link passes every other check and is applied.
    let (_p, mut restored, _) = restored_allowing(&bed, &unsigned, "latest", "without-the-key", Some(0)).await;
    assert_eq!(restored.get("/registry/forged", None).await.unwrap().kvs().len(), 1, "the forgery is well formed");
}

/// The sessions' proofs stored in the chain of snapshot `id`, by session: each one's (watchingSinceMs,
/// provenMs, revision).
async fn proofs_of(s3: &aws_sdk_s3::Client, bucket: &str, id: &str) -> Vec<(i64, i64, i64)> {
    let dir = format!("{PREFIX}/{id}/deltas/proofs/");
    let mut out = Vec::new();
    for key in keys(s3, bucket).await.into_iter().filter(|k| k.starts_with(&dir)) {
        let body = s3.get_object().bucket(bucket).key(&key).send().await.unwrap().body.collect().await.unwrap();
        let proof: serde_json::Value = serde_json::from_slice(&body.into_bytes()).unwrap();
        let number = |field: &str| proof[field].as_i64().unwrap_or_else(|| panic!("{key}: no {field}: {proof}"));
        out.push((number("watchingSinceMs"), number("provenMs"), number("revision")));
    }
    out.sort();
    out
}

fn rfc3339_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).unwrap().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The agent restarted: its first session's last event at T1 and last proof at T1p (the quorum read then still
/// returned that event's revision R1), then writes while no agent ran, then a second session whose watch opened
/// at `since` and received them in a burst. A time in [T1, T1p] is placed at R1 by the first session's proof,
/// which the second session's recovery point overwrote in `recovery-point.json` but not in the chain; a time in
/// (T1p, since) is refused, naming both.
#[tokio::test(flavor = "multi_thread")]
async fn a_time_between_a_sessions_last_event_and_its_last_proof_restores_that_revision_and_one_after_it_is_refused_naming_both()
 {
    let bed = Bed::with_cluster().await.unwrap();
    let (ns, _etcd, mut client, config) = one_member_with_base(&bed).await;
    snapshot_ok(&config);
    let (s3, bucket) = (bed.s3.client(), bed.s3.bucket.clone());
    let (id, snapshot_revision) = only_manifest(&manifests(&s3, &bucket).await);
    let first = agent(bed.cluster(), &config, &ns).start().await.unwrap();
    load(&mut client, "/registry/first", 10, 100).await.unwrap();
    let (r1, _) = revision_and_keys(&mut client).await;
    wait_until_stored(&s3, &bucket, &id, r1).await;
    // Every event of the first session was received before now (its delta is stored): T1 < stored_seen.
    let stored_seen = chrono::Utc::now().timestamp_millis();
    testbed::eventually(Duration::from_secs(60), "a proof of revision R1 two seconds after it was stored", || async {
        let proofs = proofs_of(&s3, &bucket, &id).await;
        proofs.iter().any(|p| p.2 == r1 && p.1 >= stored_seen + 2000).then_some(())
    })
    .await;
    drop(first);
    let proofs = proofs_of(&s3, &bucket, &id).await;
    assert_eq!(proofs.len(), 1, "one session so far: {proofs:?}");
    let (_, t1p, proven) = proofs[0];
    assert_eq!(proven, r1, "no write after R1: the last proof read R1");

    // Writes while no agent runs, two seconds past the last proof (a gap to place a time in), then the second
    // session's watch receives them in a burst.
    testbed::eventually(WAIT, "the clock two seconds past the first session's last proof", || async {
        (chrono::Utc::now().timestamp_millis() > t1p + 2000).then_some(())
    })
    .await;
    load(&mut client, "/registry/second", 10, 100).await.unwrap();
    let (r2, _) = revision_and_keys(&mut client).await;
    let second = agent(bed.cluster(), &config, &ns).start().await.unwrap();
    wait_until_stored(&s3, &bucket, &id, r2).await;
    let proofs = testbed::eventually(Duration::from_secs(60), "the second session's proof", || async {
        let proofs = proofs_of(&s3, &bucket, &id).await;
        (proofs.len() == 2 && proofs[1].2 >= r2).then_some(proofs)
    })
    .await;
    drop(second);
    assert_eq!(proofs[0], (proofs[0].0, t1p, r1), "the first session's proof stays as it was");
    let since = proofs[1].0;
    assert!(since > t1p + 2000, "the second watch opened after the writes: {proofs:?}");
    let point = s3.get_object().bucket(&bucket).key(format!("{PREFIX}/root/recovery-point.json")).send().await;
    let point: serde_json::Value =
        serde_json::from_slice(&point.unwrap().body.collect().await.unwrap().into_bytes()).unwrap();
    assert!(point["revision"].as_i64().unwrap() >= r2, "the shard's record is the second session's: {point}");

    // Inside [T1, T1p]: exactly R1, the first writes and none of the second.
    let inside = rfc3339_ms(t1p - 500);
    let (_p, mut restored, out) = restore_and_start(&bed, &config, &inside, "before-the-last-proof").await;
    assert!(out.contains(&format!("the source's revision {r1}")) && !out.contains("STOPPED"), "{out}");
    assert_eq!(revision_and_keys(&mut restored).await.0, r1 + BUMP);
    assert_eq!(mod_revisions(&mut restored, "/registry/first/").await.len(), 10);
    assert!(mod_revisions(&mut restored, "/registry/second/").await.is_empty(), "nothing the burst delivered");
    assert_up_to(&mut restored, snapshot_revision, r1 as u64).await;

    // Inside (T1p, since): no read proves what was committed by then; both nearest times are named.
    let gap = rfc3339_ms((t1p + since) / 2);
    let (_p, mut restored, out) = restored_allowing(&bed, &config, &gap, "in-the-gap", Some(2)).await;
    assert!(out.contains(&format!("STOPPED AT THE LAST GOOD POINT, revision {r1}")), "{out}");
    assert!(out.contains(&rfc3339_ms(t1p)) && out.contains(&rfc3339_ms(since)), "both nearest times: {out}");
    assert_eq!(revision_and_keys(&mut restored).await.0, r1 + BUMP);
}
