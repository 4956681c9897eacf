//! The second store (`secondary`) against two real versitygw servers, the failing one behind a fault proxy:
//! everything published lands verified on both with each store's own retention; a second store answering 503s
//! and resets is counted without holding back the primary and catches up once it is back; restore (full and
//! deltas, `--at`) from it with the primary stopped; a copy replaced out of band is found by its hash and copied
//! again, and a copy written whose read-back failed is verified, not written twice; a snapshot of several parts is
//! copied as a multipart upload through memory, the spill directory empty throughout; a primary object that
//! does not match its record is never made visible there and leaves no upload; no credential in any output.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::*;
use sha2::{Digest, Sha256};
use testbed::fault_proxy::{Fault, FaultProxy};

const EVERY_FIVE_SECONDS: &str = "*/5 * * * * *";
const BUMP: i64 = 1_000_000_000;

/// Every object under `prefix` by its key below the prefix, with its sha256.
async fn objects(s3: &aws_sdk_s3::Client, bucket: &str, prefix: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let under = format!("{prefix}/");
    for key in keys(s3, bucket).await {
        let Some(relative) = key.strip_prefix(&under) else { continue };
        let Ok(object) = s3.get_object().bucket(bucket).key(&key).send().await else { continue };
        let Ok(body) = object.body.collect().await else { continue };
        out.insert(relative.to_string(), hex::encode(Sha256::digest(body.into_bytes())));
    }
    out
}

/// The snapshot ids (`<shard>/<name>`) whose manifest is among `objects`, sorted (names sort by time).
fn snapshot_ids(objects: &BTreeMap<String, String>) -> Vec<String> {
    objects.keys().filter_map(|k| k.strip_suffix("/manifest.json")).map(str::to_string).collect()
}

/// The objects of the snapshots `ids`.
fn of_snapshots(objects: &BTreeMap<String, String>, ids: &[String]) -> BTreeMap<String, String> {
    objects
        .iter()
        .filter(|(k, _)| ids.iter().any(|id| k.starts_with(&format!("{id}/"))))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn sync(config: &Path) -> std::process::Output {
    cli(&["sync-secondary", "--config", config.to_str().unwrap()])
}

fn sync_ok(config: &Path) -> String {
    let out = sync(config);
    assert!(out.status.success(), "sync-secondary: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The number after `word` in a `sync-secondary` line.
fn count(line: &str, word: &str) -> usize {
    let rest = line.split(word).nth(1).unwrap_or_else(|| panic!("{word} in {line}"));
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_published_object_lands_verified_on_both_stores_and_each_store_keeps_by_its_own_retention() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    let second = SecondStore::start(&bed).await;
    // The primary keeps 2, the second store 3: it keeps one the primary deleted, and deletes by its own count.
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]).with_drills(&bed);
    options.keep_last = 2;
    let config = write_config(&bed, &options).unwrap();
    second.configure(&config, &second.s3.endpoint, 3);
    let (primary, offsite) = (bed.s3.client(), second.s3.client());

    for round in 0..5 {
        load(&mut client, &format!("/registry/round-{round}"), 20, 500).await.unwrap();
        snapshot_ok(&config);
        if round == 3 {
            // A drill report is published beside the newest manifest: it is copied too.
            let out = cli(&["drill", "--config", config.to_str().unwrap(), "--shard", "root"]);
            assert!(out.status.success(), "drill: {}", text(&out));
        }
        sync_ok(&config);
        let on_primary = objects(&primary, &bed.s3.bucket, PREFIX).await;
        let on_second = objects(&offsite, &second.s3.bucket, SECOND_PREFIX).await;
        let (primary_ids, second_ids) = (snapshot_ids(&on_primary), snapshot_ids(&on_second));
        assert_eq!(primary_ids.len(), (round + 1).min(2), "the primary keeps 2: {primary_ids:?}");
        assert_eq!(second_ids.len(), (round + 1).min(3), "the second store keeps 3: {second_ids:?}");
        // The second store holds the newest 3 of every snapshot published (names sort by time)...
        assert!(primary_ids.iter().all(|id| second_ids.contains(id)), "{primary_ids:?} within {second_ids:?}");
        // ...and every object of the snapshots both hold, byte for byte.
        assert_eq!(of_snapshots(&on_second, &primary_ids), of_snapshots(&on_primary, &primary_ids));
        // Nothing else: no object of a snapshot the second store does not list.
        assert_eq!(of_snapshots(&on_second, &second_ids), on_second, "no stray object on the second store");
        if round >= 3 {
            let reports = on_second.keys().filter(|k| k.ends_with("/drill.json")).count();
            assert_eq!(reports, 1, "the drill report is copied: {:?}", on_second.keys());
        }
    }
    // A second pass over a store in sync copies nothing.
    let line = sync_ok(&config);
    assert_eq!(count(&line, "copied"), 0, "{line}");
    // `list --store secondary` reads the second store: its three, not the primary's two.
    let out = cli(&["list", "--config", config.to_str().unwrap(), "--store", "secondary"]);
    assert!(out.status.success(), "{}", text(&out));
    let listed = String::from_utf8_lossy(&out.stdout);
    let on_second = objects(&offsite, &second.s3.bucket, SECOND_PREFIX).await;
    for id in snapshot_ids(&on_second) {
        assert!(listed.contains(&id), "{id} in {listed}");
    }
    assert_eq!(listed.lines().count(), 4, "a header and three snapshots: {listed}");
}

fn deltas_options(bed: &Bed, endpoint: &str) -> Options<'static> {
    let mut options = Options::new(bed, "root", vec![endpoint.to_string()]).with_deltas("1s", Some("64Ki"));
    options.keep_last = 100;
    options
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_store_answering_503_and_resets_is_counted_while_primary_snapshots_keep_publishing_and_every_missed_object_is_copied_once_it_is_back()
 {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/base", 20, 200).await.unwrap();
    let second = SecondStore::start(&bed).await;
    let proxy = FaultProxy::start(&second.s3.endpoint).await.unwrap();
    let mut options = deltas_options(&bed, &etcd.members[0].client_url);
    options.cron = EVERY_FIVE_SECONDS;
    let config = write_config(&bed, &options).unwrap();
    second.configure(&config, &proxy.url, 100);
    // The second store fails everything: writes reset mid-body, everything else 503 SlowDown.
    proxy.inject("PUT", "", Fault::Reset, usize::MAX);
    proxy.inject("", "", Fault::SlowDown, usize::MAX);

    let writes = Load::start(etcd.member_client(0).await.unwrap(), "/registry/load", Duration::from_millis(50));
    let agent = agent(cluster, &config, &ns).start().await.unwrap();
    let primary = bed.s3.client();
    let failures = "etcd_snapshotter_secondary_failures_total{shard=\"root\",kind=\"listing\"}";
    let behind = "etcd_snapshotter_secondary_objects_behind{shard=\"root\"}";
    // Scheduled snapshots and deltas keep publishing while every pass on the second store fails.
    let failed_before = testbed::eventually(Duration::from_secs(120), "ticks published during the outage", || async {
        let ticks = manifests(&primary, &bed.s3.bucket).await.iter().filter(|m| m["tick"].is_string()).count();
        let failed = agent.metric(failures).await.ok()?;
        let behind = agent.metric(behind).await.ok()?;
        (ticks >= 3 && failed >= 2.0 && behind > 0.0).then_some(failed)
    })
    .await;
    assert!(failed_before >= 2.0);
    assert_eq!(agent.metric("etcd_snapshotter_failures_total{shard=\"root\",reason=\"storage\"}").await.unwrap(), 0.0);
    assert!(agent.metric("etcd_snapshotter_delta_objects_total{shard=\"root\"}").await.unwrap() > 0.0);
    assert!(!proxy.injected().is_empty(), "the second store's requests met the faults");
    // What was published (snapshots with their manifest, their deltas): the shard's lock is the primary's own.
    let during = objects(&primary, &bed.s3.bucket, PREFIX).await;
    let during = of_snapshots(&during, &snapshot_ids(&during));
    assert!(during.keys().any(|k| k.contains("/deltas/")), "deltas among them: {:?}", during.keys());
    assert!(objects(&second.s3.client(), &second.s3.bucket, SECOND_PREFIX).await.is_empty(), "nothing got through");

    // The second store is back: every object published during the outage is copied, the gauge returns to 0.
    proxy.clear();
    let offsite = second.s3.client();
    testbed::eventually(Duration::from_secs(120), "every object of the outage on the second store", || async {
        let on_second = objects(&offsite, &second.s3.bucket, SECOND_PREFIX).await;
        during.iter().all(|(key, sha)| on_second.get(key) == Some(sha)).then_some(())
    })
    .await;
    let last = writes.finish_at_source(&mut client).await;
    testbed::eventually(Duration::from_secs(60), "the last write on the second store", || async {
        (stored_through(&offsite, &second.s3.bucket, SECOND_PREFIX).await >= last).then_some(())
    })
    .await;
    agent.wait_for_metric(behind, WAIT, |v| v == 0.0).await;
    // In sync is recorded just after the pass sets behind to 0: a scrape can fall in between.
    agent
        .wait_for_metric("etcd_snapshotter_secondary_in_sync_timestamp_seconds{shard=\"root\"}", WAIT, |v| v > 0.0)
        .await;
    for kind in ["snapshot", "manifest", "delta"] {
        let copied = format!("etcd_snapshotter_secondary_copied_total{{shard=\"root\",kind=\"{kind}\"}}");
        assert!(agent.metric(&copied).await.unwrap() > 0.0, "{kind} copied");
    }
    // Neither store's keys in the log or the metrics.
    let metrics = agent.metrics().await;
    let secrets = [&*bed.s3.secret_key, &*bed.s3.access_key, &*second.s3.secret_key, &*second.s3.access_key];
    testbed::assert_no_secret_material(&format!("{}\n{metrics}", agent.process.log()), &secrets);
}

/// Restores `config`'s shard root to `at` from `store` and starts an etcd on it; the process and a client.
async fn restore_from(
    bed: &Bed,
    config: &Path,
    store: &str,
    at: &str,
    name: &str,
) -> (testbed::process::Process, etcd_client::Client, String) {
    let (etcdutl, etcd) = (bed.etcdutl().to_str().unwrap(), bed.peers.path("etcd"));
    let options = ["--store", store, "--at", at, "--etcdutl", etcdutl, "--etcd", etcd.to_str().unwrap()];
    let (out, process, client) = restore_and_serve(bed, config, &options, name, |out| {
        assert!(out.status.success(), "restore from {store}: {}", text(out));
    })
    .await;
    (process, client, text(&out))
}

async fn hash_kv(client: &mut etcd_client::Client) -> u32 {
    client.hash_kv(0).await.unwrap().hash()
}

/// Every key under `prefix` with its mod revision.
async fn mod_revisions(client: &mut etcd_client::Client, prefix: &str) -> BTreeMap<String, i64> {
    let response = client.get(prefix, Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    response.kvs().iter().map(|kv| (kv.key_str().unwrap().to_string(), kv.mod_revision())).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn restore_at_from_the_second_store_with_the_primary_stopped_gives_the_primarys_revision_and_hash_kv() {
    let mut bed = Bed::with_cluster().await.unwrap();
    let ns = bed.cluster().namespace().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut source = etcd.member_client(0).await.unwrap();
    load(&mut source, "/registry/base", 20, 200).await.unwrap();
    let second = SecondStore::start(&bed).await;
    let config = write_config(&bed, &deltas_options(&bed, &etcd.members[0].client_url)).unwrap();
    second.configure(&config, &second.s3.endpoint, 100);
    // No tick: the delta writer takes the one full snapshot its chain needs, then deltas every second.
    let mut agent = agent(bed.cluster(), &config, &ns).start().await.unwrap();
    let writes = Load::start(etcd.member_client(0).await.unwrap(), "/registry/load", Duration::from_millis(30));
    // Writes acknowledged both before and after the agent's deltas began: a hundred past the first one.
    let first =
        testbed::eventually(WAIT, "a first acknowledged write", || async { writes.acked().last().map(|a| a.revision) })
            .await;
    testbed::eventually(WAIT, "a hundred more writes acknowledged", || async {
        writes.acked().last().map(|a| a.revision).filter(|r| *r >= first + 100)
    })
    .await;
    let last = writes.finish_at_source(&mut source).await;
    let offsite = second.s3.client();
    testbed::eventually(Duration::from_secs(90), "deltas through the last write on the second store", || async {
        (stored_through(&offsite, &second.s3.bucket, SECOND_PREFIX).await >= last).then_some(())
    })
    .await;
    agent.terminate(Duration::from_secs(20));
    let source_keys = mod_revisions(&mut source, "/registry/").await;
    let middle = source_keys.values().copied().filter(|r| *r > 0).max().unwrap() - 20;

    // From the primary first, then the primary stops and the same restore reads the second store alone.
    let (_a, mut from_primary, _) = restore_from(&bed, &config, "primary", "latest", "from-primary").await;
    bed.s3.process.kill();
    let (_b, mut from_second, out) = restore_from(&bed, &config, "secondary", "latest", "from-second").await;
    assert!(out.contains(&format!("the source's revision {last}")), "{out}");
    let revision = revision_and_keys(&mut from_second).await.0;
    assert_eq!(revision, last + BUMP, "the last write's revision, bumped");
    assert_eq!(revision, revision_and_keys(&mut from_primary).await.0);
    assert_eq!(
        hash_kv(&mut from_second).await,
        hash_kv(&mut from_primary).await,
        "the same HashKV as from the primary"
    );
    assert_eq!(mod_revisions(&mut from_second, "/registry/").await, source_keys, "every key at its source revision");

    // A point in time from the second store: the keys up to it, none after.
    let (_c, mut at_middle, _) = restore_from(&bed, &config, "secondary", &middle.to_string(), "at-middle").await;
    assert_eq!(revision_and_keys(&mut at_middle).await.0, middle + BUMP);
    let expected: BTreeMap<String, i64> = source_keys.into_iter().filter(|(_, r)| *r <= middle).collect();
    assert_eq!(mod_revisions(&mut at_middle, "/registry/").await, expected);
    // `list` reads the second store with the primary down.
    let out = cli(&["list", "--config", config.to_str().unwrap(), "--store", "secondary"]);
    assert!(out.status.success(), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_copy_replaced_out_of_band_is_found_by_its_hash_and_copied_again_and_a_copy_whose_read_back_failed_is_verified_not_rewritten()
 {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 30, 1000).await.unwrap();
    let second = SecondStore::start(&bed).await;
    let proxy = FaultProxy::start(&second.s3.endpoint).await.unwrap();
    let config = write_config(&bed, &Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()])).unwrap();
    second.configure(&config, &proxy.url, 10);
    snapshot_ok(&config);
    let line = sync_ok(&config);
    assert_eq!(count(&line, "copied"), 2, "the data object and the manifest: {line}");

    // Replaced out of band with other bytes of the same length, carrying the agent's metadata.
    let offsite = second.s3.client();
    let on_second = objects(&offsite, &second.s3.bucket, SECOND_PREFIX).await;
    let data = on_second.keys().find(|k| k.ends_with("snapshot.db.zst")).unwrap().clone();
    let key = format!("{SECOND_PREFIX}/{data}");
    let original = offsite.get_object().bucket(&second.s3.bucket).key(&key).send().await.unwrap();
    let mut bytes = original.body.collect().await.unwrap().into_bytes().to_vec();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    put_raw(&offsite, &second.s3.bucket, &key, bytes).await;
    // Each pass is a new process: the decision comes from the stores alone.
    let line = sync_ok(&config);
    assert_eq!(count(&line, "copied"), 1, "the replaced object only: {line}");
    assert_eq!(objects(&offsite, &second.s3.bucket, SECOND_PREFIX).await, on_second, "the copy is whole again");
    let line = sync_ok(&config);
    assert_eq!((count(&line, "copied"), count(&line, "already there")), (0, 2), "{line}");

    // A copy written whose read-back fails: the pass fails, the next verifies what was written and does not
    // write it again.
    load(&mut client, "/registry/more", 10, 1000).await.unwrap();
    snapshot_ok(&config);
    let before = proxy.seen("PUT", "snapshot.db");
    proxy.inject("GET", "snapshot.db", Fault::SlowDown, usize::MAX);
    let out = sync(&config);
    assert!(!out.status.success(), "a read-back that fails fails the pass: {}", text(&out));
    assert!(text(&out).contains("read back") || text(&out).contains("GetObject"), "{}", text(&out));
    proxy.clear();
    let puts = proxy.seen("PUT", "snapshot.db");
    assert_eq!(puts, before + 1, "the new data object was written once");
    let line = sync_ok(&config);
    assert_eq!(proxy.seen("PUT", "snapshot.db"), puts, "not written again: {line}");
    assert_eq!(count(&line, "copied"), 1, "its manifest, held back until the data object was proven: {line}");
    // Every object of both snapshots (the shard's lock object is the primary's own, not a published object).
    let on_primary = objects(&bed.s3.client(), &bed.s3.bucket, PREFIX).await;
    let ids = snapshot_ids(&on_primary);
    assert_eq!(ids.len(), 2);
    assert_eq!(objects(&offsite, &second.s3.bucket, SECOND_PREFIX).await, of_snapshots(&on_primary, &ids));
    // The restore from the second store proves the copies (both hashes and etcdutl).
    let id = snapshot_ids(&on_primary).pop().unwrap();
    verify_on_second(&bed, &config, &id);
}

async fn put_raw(s3: &aws_sdk_s3::Client, bucket: &str, key: &str, body: Vec<u8>) {
    let request = s3.put_object().bucket(bucket).key(key).metadata("written-by", "etcd-snapshotter");
    request.body(body.into()).send().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pass_with_refused_credentials_on_either_store_says_so_without_any_key_and_fails() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let second = SecondStore::start(&bed).await;
    let config = write_config(&bed, &Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()])).unwrap();
    second.configure(&config, &second.s3.endpoint, 10);
    snapshot_ok(&config);
    let right = [&*bed.s3.secret_key, &*bed.s3.access_key, &*second.s3.secret_key, &*second.s3.access_key];
    // The second store's Secret holds keys it refuses.
    let wrong_secret = format!("{:032x}", 0x5ec2e7u128 << 64 | 0xfeed);
    std::fs::write(second.secret_dir.join("AWS_SECRET_ACCESS_KEY"), &wrong_secret).unwrap();
    let out = sync(&config);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("listing the second store"), "{}", text(&out));
    let mut secrets = right.to_vec();
    secrets.push(&wrong_secret);
    testbed::assert_no_secret_material(&text(&out), &secrets);
    // The primary's refused: nothing is copied, and still no key.
    std::fs::write(second.secret_dir.join("AWS_SECRET_ACCESS_KEY"), &second.s3.secret_key).unwrap();
    std::fs::write(bed.secret_dir().unwrap().join("AWS_SECRET_ACCESS_KEY"), &wrong_secret).unwrap();
    let out = sync(&config);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("listing the primary"), "{}", text(&out));
    testbed::assert_no_secret_material(&text(&out), &secrets);
    let out = cli(&["list", "--config", config.to_str().unwrap(), "--store", "secondary"]);
    assert!(out.status.success(), "the second store alone answers: {}", text(&out));
    testbed::assert_no_secret_material(&text(&out), &secrets);
}

/// Files under `dir` (recursively) and their bytes.
fn files_under(dir: &Path) -> (usize, u64) {
    let Ok(entries) = std::fs::read_dir(dir) else { return (0, 0) };
    let (mut files, mut bytes) = (0, 0);
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            let (f, b) = files_under(&entry.path());
            (files, bytes) = (files + f, bytes + b);
        } else {
            (files, bytes) = (files + 1, bytes + meta.len());
        }
    }
    (files, bytes)
}

/// The UploadPart requests the proxy saw for the data object of snapshot `id` (the SDK's query starts with its
/// operation, then `partNumber`).
fn parts_seen(proxy: &FaultProxy, id: &str) -> usize {
    proxy.seen("PUT", &format!("{id}/snapshot.db.zst?x-id=UploadPart&partNumber="))
}

const MIB: u64 = 1 << 20;

/// Spill settings with 5 MiB parts and the spill directory capped at one part.
const SPILL_ONE_PART: &str = "memoryBudget: 64Mi\n  partSize: 5Mi\n  partsInFlight: 2\n  maxBytes: 5Mi";

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_of_several_parts_is_copied_as_a_multipart_upload_through_memory_and_the_spill_directory_stays_empty()
 {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    // About 20 MiB of incompressible values: a data object of four 5 MiB parts and more.
    load(&mut client, "/registry/big", 200, 100_000).await.unwrap();
    let second = SecondStore::start(&bed).await;
    let proxy = FaultProxy::start(&second.s3.endpoint).await.unwrap();
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.spill = SPILL_ONE_PART;
    let config = write_config(&bed, &options).unwrap();
    second.configure(&config, &proxy.url, 10);
    snapshot_ok(&config);
    let on_primary = objects(&bed.s3.client(), &bed.s3.bucket, PREFIX).await;
    let id = snapshot_ids(&on_primary).pop().unwrap();
    let data_key = format!("{PREFIX}/{id}/snapshot.db.zst");
    let primary = bed.s3.client();
    let size = primary.head_object().bucket(&bed.s3.bucket).key(&data_key).send().await.unwrap().content_length();
    let size = size.unwrap() as u64;
    assert!(size > 3 * 5 * MIB, "a data object of more than three parts, above spill.maxBytes: {size}");
    let spill = bed.path("spill");
    assert_eq!(files_under(&spill), (0, 0), "the snapshot left nothing in the spill directory");

    // What a copy killed mid-way leaves: an upload open at the key. The next copy of the object aborts it.
    let (offsite, second_key) = (second.s3.client(), format!("{SECOND_PREFIX}/{id}/snapshot.db.zst"));
    offsite.create_multipart_upload().bucket(&second.s3.bucket).key(&second_key).send().await.unwrap();
    // Every request writing the data object to the second store is held 300 ms: the copy takes seconds, and the
    // spill directory is sampled all along.
    proxy.inject("PUT", "snapshot.db", Fault::Delay(Duration::from_millis(300)), usize::MAX);
    // The pass runs off the runtime's workers, which the proxy's delays need.
    let sync = tokio::task::spawn_blocking({
        let config = config.clone();
        move || sync(&config)
    });
    let (mut samples, mut most) = (0usize, (0usize, 0u64));
    while !sync.is_finished() {
        let now = files_under(&spill);
        most = (most.0.max(now.0), most.1.max(now.1));
        samples += 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let out = sync.await.unwrap();
    assert!(out.status.success(), "sync-secondary: {}", text(&out));
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(count(&line, "copied"), 2, "the data object and the manifest: {line}");
    assert!(samples > 100, "sampled throughout the copy: {samples}");
    assert_eq!(most, (0, 0), "no file in the spill directory at any time during the copy");
    assert_eq!(files_under(&spill), (0, 0), "nor after it");

    // A multipart upload of 5 MiB parts, completed, none left open.
    let parts = size.div_ceil(5 * MIB) as usize;
    assert_eq!(parts_seen(&proxy, &id), parts, "one UploadPart per 5 MiB: {:?}", proxy.requests());
    assert_eq!(proxy.seen("POST", "snapshot.db"), 2, "CreateMultipartUpload and CompleteMultipartUpload");
    assert_eq!(proxy.seen("DELETE", "snapshot.db"), 1, "the upload left at the key aborted");
    let head = offsite.head_object().bucket(&second.s3.bucket).key(&second_key).send().await.unwrap();
    assert_eq!(head.content_length(), Some(size as i64));
    assert!(head.e_tag().unwrap_or_default().trim_matches('"').ends_with(&format!("-{parts}")), "{head:?}");
    assert_eq!(head.metadata().and_then(|m| m.get("written-by")).map(String::as_str), Some("etcd-snapshotter"));
    assert!(uploads(&offsite, &second.s3.bucket).await.is_empty(), "no multipart upload left");
    // Byte for byte the primary's (the sha256 of each object), and what `verify` reads from the second store.
    assert_eq!(
        objects(&offsite, &second.s3.bucket, SECOND_PREFIX).await,
        of_snapshots(&on_primary, std::slice::from_ref(&id))
    );
    verify_on_second(&bed, &config, &id);
}

/// `verify --store secondary` of `id` passes: both hashes and etcdutl read the second store's copy.
fn verify_on_second(bed: &Bed, config: &Path, id: &str) {
    let (config, etcdutl) = (config.to_str().unwrap(), bed.etcdutl());
    let out = cli(&["verify", "--config", config, "--store", "secondary", "--etcdutl", etcdutl.to_str().unwrap(), id]);
    assert!(out.status.success(), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_primary_object_that_does_not_match_its_record_is_never_made_visible_on_the_second_store_and_leaves_no_upload()
 {
    let bed = Bed::start().await.unwrap();
    // `root`'s data object takes several parts (a multipart copy), `small`'s one (a single put).
    let (big, small) = (bed.etcd("root", 1).await.unwrap(), bed.etcd("small", 1).await.unwrap());
    load(&mut big.member_client(0).await.unwrap(), "/registry/big", 120, 100_000).await.unwrap();
    load(&mut small.member_client(0).await.unwrap(), "/registry/small", 20, 1000).await.unwrap();
    let second = SecondStore::start(&bed).await;
    let proxy = FaultProxy::start(&second.s3.endpoint).await.unwrap();
    let mut options = Options::new(&bed, "root", vec![big.members[0].client_url.clone()]);
    options.shards.push(("small", vec![small.members[0].client_url.clone()]));
    options.spill = SPILL_ONE_PART;
    let config = write_config(&bed, &options).unwrap();
    second.configure(&config, &proxy.url, 10);
    snapshot_ok(&config);
    let on_primary = objects(&bed.s3.client(), &bed.s3.bucket, PREFIX).await;
    let ids = snapshot_ids(&on_primary);
    assert_eq!(ids.len(), 2, "{ids:?}");
    for id in &ids {
        bed.flip_middle_byte(&format!("{PREFIX}/{id}/snapshot.db.zst"), 0x80);
    }

    let out = sync(&config);
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let refused = stderr.lines().filter(|l| l.starts_with("error: shard") && l.contains("its record says")).count();
    assert_eq!(refused, 2, "both data objects refused: {}", text(&out));
    let offsite = second.s3.client();
    assert!(
        objects(&offsite, &second.s3.bucket, SECOND_PREFIX).await.is_empty(),
        "neither data object, nor the manifests held back behind them"
    );
    assert!(uploads(&offsite, &second.s3.bucket).await.is_empty(), "no multipart upload left");
    // The large one was streamed into an upload that was aborted, not completed; the small one never sent.
    let root_id = ids.iter().find(|id| id.starts_with("root/")).unwrap();
    let small_id = ids.iter().find(|id| id.starts_with("small/")).unwrap();
    assert!(parts_seen(&proxy, root_id) >= 3, "the parts streamed: {:?}", proxy.requests());
    assert_eq!(proxy.seen("POST", root_id), 1, "created, never completed: {:?}", proxy.requests());
    assert_eq!(proxy.seen("DELETE", root_id), 1, "aborted: {:?}", proxy.requests());
    assert_eq!(proxy.seen("PUT", small_id), 0, "the single put never sent: {:?}", proxy.requests());

    // The primary's bytes put right: the next pass copies both snapshots whole.
    for id in &ids {
        bed.flip_middle_byte(&format!("{PREFIX}/{id}/snapshot.db.zst"), 0x80);
    }
    sync_ok(&config);
    assert_eq!(objects(&offsite, &second.s3.bucket, SECOND_PREFIX).await, of_snapshots(&on_primary, &ids));
    assert!(uploads(&offsite, &second.s3.bucket).await.is_empty());
}
