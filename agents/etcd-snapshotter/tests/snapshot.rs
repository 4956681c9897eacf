//! Snapshots against a real etcd and a real versitygw, through the binary's one-shots.

mod common;

use std::sync::atomic::Ordering;

use common::proxy::Proxy;
use common::*;

fn host_port(url: &str) -> &str {
    url.trim_start_matches("http://")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_encrypted_snapshot_is_proven_published_listed_verified_and_restores_into_a_serving_etcd() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 400, 20_000).await.unwrap();
    let (revision, key_count) = revision_and_keys(&mut client).await;

    let identity = age::x25519::Identity::generate();
    let identity_file = bed.path("identity.txt");
    std::fs::write(&identity_file, format!("{}\n", age::secrecy::ExposeSecret::expose_secret(&identity.to_string())))
        .unwrap();
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.recipients = vec![identity.to_public().to_string()];
    let config = write_config(&bed, &options).unwrap();
    let out = snapshot_ok(&config);
    assert!(out.contains(&format!("revision {revision}")), "{out}");

    let s3 = bed.s3.client();
    let manifests = manifests(&s3, &bed.s3.bucket).await;
    assert_eq!(manifests.len(), 1, "{manifests:?}");
    let m = &manifests[0];
    assert_eq!(m["revision"], revision);
    assert_eq!(m["keyCount"], key_count);
    assert_eq!(m["shard"], "root");
    assert_eq!(m["member"]["name"], "root-0");
    assert_eq!(m["etcdVersion"], "3.6.16");
    assert_eq!(m["compression"], "zstd");
    assert_eq!(m["object"], "snapshot.db.zst.age");
    assert_eq!(m["encryptionRecipients"][0], identity.to_public().to_string());
    assert_eq!(m["spilledBytes"], 0, "an unthrottled S3 spills nothing");
    let hash_kv = client.hash_kv(revision).await.unwrap().hash();
    assert_eq!(m["hashKv"], hash_kv);
    assert!(m["dbSizeBytes"].as_u64().unwrap() > 8_000_000, "{m}");
    assert!(uploads(&s3, &bed.s3.bucket).await.is_empty(), "no multipart upload left");
    let id = m["id"].as_str().unwrap().to_string();

    let out = cli(&["list", "--config", config.to_str().unwrap()]);
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && listing.contains(&id) && listing.contains(&revision.to_string()), "{}", text(&out));

    let etcdutl = bed.etcdutl().to_str().unwrap().to_string();
    let identity_arg = identity_file.to_str().unwrap();
    let verify =
        ["verify", "--config", config.to_str().unwrap(), &id, "--identity-file", identity_arg, "--etcdutl", &etcdutl];
    let out = cli(&verify);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("etcdutl reads revision {revision}")),
        "{}",
        text(&out)
    );
    // Without the identity an encrypted snapshot cannot be checked, and says so.
    let out = cli(&verify[..5]);
    assert!(!out.status.success() && text(&out).contains("--identity-file"), "{}", text(&out));

    let data_dir = bed.path("restored");
    let (client_port, peer_port) = (testbed::process::free_port().unwrap(), testbed::process::free_port().unwrap());
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let out = restore_root(&config, &["--identity-file", identity_arg, "--etcdutl", &etcdutl], &data_dir, &peer_url);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("next steps"), "{}", text(&out));

    let (_restored, mut restored) = serve_restored(&bed, "restored-etcd", &data_dir, client_port, &peer_url).await;
    let (restored_revision, restored_keys) = revision_and_keys(&mut restored).await;
    assert_eq!(restored_revision, revision + 1_000_000_000, "the snapshot's revision, bumped");
    assert_eq!(restored_keys, key_count);
    let original = client.get("/registry/things/000123", None).await.unwrap();
    let back = restored.get("/registry/things/000123", None).await.unwrap();
    assert_eq!(back.kvs()[0].value(), original.kvs()[0].value());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_byte_flipped_in_flight_is_a_hash_mismatch_that_publishes_nothing_and_the_clean_proxy_succeeds() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 100, 10_000).await.unwrap();
    let s3 = bed.s3.client();

    let flipping = Proxy::start(host_port(&etcd.members[0].client_url)).await;
    flipping.faults.flip.store(true, Ordering::SeqCst);
    let config = write_config(&bed, &Options::new(&bed, "root", vec![flipping.url.clone()])).unwrap();
    let out = cli(&["snapshot", "--config", config.to_str().unwrap()]);
    assert!(flipping.faults.flipped.load(Ordering::SeqCst), "the proxy flipped a byte");
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("hash_mismatch") && stderr.contains("trailing sha256"), "{}", text(&out));
    assert!(manifests(&s3, &bed.s3.bucket).await.is_empty(), "no manifest");
    // Only the shard's lock, released, is left (it is never deleted).
    let left: Vec<String> = keys(&s3, &bed.s3.bucket).await.into_iter().filter(|k| !k.ends_with("/run.lock")).collect();
    assert!(left.is_empty(), "no object at all: {left:?}");
    assert!(uploads(&s3, &bed.s3.bucket).await.is_empty(), "the multipart upload was aborted");

    let clean = Proxy::start(host_port(&etcd.members[0].client_url)).await;
    let config = write_config(&bed, &Options::new(&bed, "root", vec![clean.url.clone()])).unwrap();
    snapshot_ok(&config);
    assert_eq!(manifests(&s3, &bed.s3.bucket).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_s3_fails_after_bounded_retries_with_a_clear_error_and_the_next_run_succeeds() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let s3_proxy = Proxy::start(host_port(&bed.s3.endpoint)).await;
    s3_proxy.set_down(true);
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.s3_endpoint = s3_proxy.url.clone();
    let config = write_config(&bed, &options).unwrap();
    let started = std::time::Instant::now();
    let out = cli(&["snapshot", "--config", config.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(started.elapsed() < std::time::Duration::from_secs(30), "bounded: {:?}", started.elapsed());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("storage: S3 HeadBucket"), "{}", text(&out));
    assert!(!stderr.contains(&bed.s3.secret_key) && !stderr.contains(&bed.s3.access_key), "no credential in errors");

    s3_proxy.set_down(false);
    snapshot_ok(&config);
    assert_eq!(manifests(&bed.s3.client(), &bed.s3.bucket).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_s3_makes_the_stream_spill_to_disk_instead_of_holding_etcd() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/big", 300, 100_000).await.unwrap();
    let slow = Proxy::start(host_port(&bed.s3.endpoint)).await;
    slow.faults.throttle_bytes_per_second.store(4 * 1024 * 1024, Ordering::SeqCst);
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.s3_endpoint = slow.url.clone();
    options.compression = "none";
    // Room for two finished parts besides the one filling, one upload at a time, spill after 200 ms.
    options.spill = "memoryBudget: 15Mi\n  partSize: 5Mi\n  partsInFlight: 1\n  spillAfter: 200ms";
    let config = write_config(&bed, &options).unwrap();
    let out = snapshot_ok(&config);
    let manifests = manifests(&bed.s3.client(), &bed.s3.bucket).await;
    let spilled = manifests[0]["spilledBytes"].as_u64().unwrap();
    assert!(spilled >= 5 * 1024 * 1024, "at least one part spilled: {out}");
    assert!(std::fs::read_dir(bed.path("spill/root")).unwrap().next().is_none(), "spill files are removed");
    // The object is whole: it verifies against both hashes.
    let id = manifests[0]["id"].as_str().unwrap();
    let out = cli(&["verify", "--config", config.to_str().unwrap(), id, "--etcdutl", bed.etcdutl().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_down_member_and_a_learner_are_skipped_and_the_snapshot_comes_from_a_healthy_voter() {
    let bed = Bed::start().await.unwrap();
    let mut etcd = bed.etcd("alpha", 3).await.unwrap();
    let mut client = etcd.member_client(1).await.unwrap();
    load(&mut client, "/registry/things", 50, 1000).await.unwrap();
    etcd.kill_member(0);
    let endpoints: Vec<String> = etcd.members.iter().map(|m| m.client_url.clone()).collect();
    let config = write_config(&bed, &Options::new(&bed, "alpha", endpoints)).unwrap();
    let out = cli(&["snapshot", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("member skipped"), "{}", text(&out));
    let m = &manifests(&bed.s3.client(), &bed.s3.bucket).await[0];
    assert_ne!(m["member"]["name"], "alpha-0", "{m}");

    // A learner: added to a one-member cluster and started; listed first, it is still skipped.
    let single = bed.etcd("beta", 1).await.unwrap();
    let mut beta = single.member_client(0).await.unwrap();
    let peer_port = testbed::process::free_port().unwrap();
    let client_port = testbed::process::free_port().unwrap();
    let (peer_url, client_url) = (format!("http://127.0.0.1:{peer_port}"), format!("http://127.0.0.1:{client_port}"));
    beta.member_add([peer_url.clone()], Some(etcd_client::MemberAddOptions::new().with_is_learner())).await.unwrap();
    let _learner = testbed::process::Process::start(
        "beta-learner",
        bed.peers.path("etcd"),
        vec![
            "--name=beta-learner".into(),
            format!("--data-dir={}", bed.path("beta-learner").display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=beta-0={},beta-learner={peer_url}", single.members[0].peer_url),
            "--initial-cluster-state=existing".into(),
        ],
        bed.path("beta-learner.log"),
    )
    .unwrap();
    testbed::eventually(WAIT, "the learner answers", || {
        let url = client_url.clone();
        async move { etcd_client::Client::connect([url], None).await.ok()?.status().await.ok().filter(|s| s.is_learner()) }
    })
    .await;
    let config =
        write_config(&bed, &Options::new(&bed, "beta", vec![client_url.clone(), single.members[0].client_url.clone()]))
            .unwrap();
    let out = cli(&["snapshot", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("a learner"), "{}", text(&out));
    let all = manifests(&bed.s3.client(), &bed.s3.bucket).await;
    let m = all.iter().find(|m| m["shard"] == "beta").unwrap();
    assert_eq!(m["member"]["name"], "beta-0", "{m}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sigkill_mid_upload_leaves_nothing_listed_and_the_next_run_cleans_up_and_succeeds() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/big", 200, 100_000).await.unwrap();
    let slow = Proxy::start(host_port(&bed.s3.endpoint)).await;
    slow.faults.throttle_bytes_per_second.store(2 * 1024 * 1024, Ordering::SeqCst);
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.s3_endpoint = slow.url.clone();
    options.compression = "none";
    let config = write_config(&bed, &options).unwrap();
    let s3 = bed.s3.client();

    let mut agent = testbed::process::Process::start_with_env(
        "snapshot",
        std::path::Path::new(BINARY),
        vec!["snapshot".into(), "--config".into(), config.display().to_string()],
        &[NO_METADATA],
        bed.path("killed.log"),
    )
    .unwrap();
    testbed::eventually(WAIT, "a multipart upload is under way", || {
        let s3 = s3.clone();
        let bucket = bed.s3.bucket.clone();
        async move { (!uploads(&s3, &bucket).await.is_empty()).then_some(()) }
    })
    .await;
    agent.kill();
    assert!(manifests(&s3, &bed.s3.bucket).await.is_empty(), "nothing lists as a snapshot");
    let out = cli(&["list", "--config", config.to_str().unwrap()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1, "only the header: {}", text(&out));
    assert_eq!(uploads(&s3, &bed.s3.bucket).await.len(), 1, "the killed run left its upload");

    slow.faults.throttle_bytes_per_second.store(0, Ordering::SeqCst);
    snapshot_ok(&config);
    assert!(uploads(&s3, &bed.s3.bucket).await.is_empty(), "the next run aborted the abandoned upload");
    assert_eq!(manifests(&s3, &bed.s3.bucket).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_orders_by_revision_keeps_the_newest_and_skips_objects_under_object_lock() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    let s3 = bed.s3.client();
    let bucket = "locked-bucket";
    s3.create_bucket().bucket(bucket).object_lock_enabled_for_bucket(true).send().await.unwrap();
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.bucket = bucket.into();
    options.keep_last = 2;
    let config = write_config(&bed, &options).unwrap();

    // Revisions cross from 2 digits to 3 and 4 between snapshots.
    let mut ids = Vec::new();
    for count in [20, 200, 2000] {
        load(&mut client, &format!("/registry/n{count}"), count, 10).await.unwrap();
        snapshot_ok(&config);
        let all = manifests(&s3, bucket).await;
        let newest = all.iter().max_by_key(|m| m["revision"].as_u64().unwrap()).unwrap();
        ids.push(newest["id"].as_str().unwrap().to_string());
    }
    let revisions: Vec<u64> = manifests(&s3, bucket).await.iter().map(|m| m["revision"].as_u64().unwrap()).collect();
    assert_eq!(revisions.len(), 2, "keepLast 2");
    assert!(revisions.iter().all(|r| *r >= 100), "the two newest by revision are kept: {revisions:?}");

    // Lock the older of the two; the next run would delete it, but object lock forbids: skipped, not failed.
    let older = &ids[1];
    let until = aws_sdk_s3::primitives::DateTime::from_secs(chrono::Utc::now().timestamp() + 3600);
    let key = format!("{PREFIX}/{older}/snapshot.db.zst");
    s3.put_object_retention()
        .bucket(bucket)
        .key(&key)
        .retention(
            aws_sdk_s3::types::ObjectLockRetention::builder()
                .mode(aws_sdk_s3::types::ObjectLockRetentionMode::Governance)
                .retain_until_date(until)
                .build(),
        )
        .send()
        .await
        .unwrap();
    load(&mut client, "/registry/more", 5, 10).await.unwrap();
    let out = snapshot_ok(&config);
    assert!(out.contains("locked 1"), "{out}");
    let remaining: Vec<String> =
        manifests(&s3, bucket).await.iter().map(|m| m["id"].as_str().unwrap().to_string()).collect();
    assert!(remaining.contains(older), "the locked snapshot stays listed: {remaining:?}");
    assert_eq!(remaining.len(), 3, "{remaining:?}");
}

/// The object lock S3 reports on `key`: mode and the end of its retention (Unix seconds).
async fn lock_of(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> (Option<String>, Option<i64>) {
    let head = s3.head_object().bucket(bucket).key(key).send().await.unwrap();
    (head.object_lock_mode().map(|m| m.as_str().to_string()), head.object_lock_retain_until_date().map(|d| d.secs()))
}

#[tokio::test(flavor = "multi_thread")]
async fn with_object_lock_every_snapshot_and_manifest_is_locked_the_agents_own_key_cannot_delete_them_and_retention_waits_for_the_lock()
 {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    // The test's client signs with the same keys the agent is given: what it cannot delete, the agent cannot.
    let s3 = bed.s3.client();
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.keep_last = 1;

    // A bucket without object lock is refused before anything is written: backups the operator believes
    // immutable must not land deletable.
    s3.create_bucket().bucket("unlocked").send().await.unwrap();
    options.bucket = "unlocked".into();
    options.extra_storage = "  objectLock:\n    mode: compliance\n    retainFor: 1h\n";
    let refused = cli(&["snapshot", "--config", write_config(&bed, &options).unwrap().to_str().unwrap()]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(text(&refused).contains("bucket unlocked has no object lock enabled"), "{}", text(&refused));
    assert!(keys(&s3, "unlocked").await.is_empty(), "nothing written: {:?}", keys(&s3, "unlocked").await);

    s3.create_bucket().bucket("locked").object_lock_enabled_for_bucket(true).send().await.unwrap();
    options.bucket = "locked".into();
    let config = write_config(&bed, &options).unwrap();
    let mut ids = Vec::new();
    for round in 0..2 {
        load(&mut client, &format!("/registry/round{round}"), 20, 100).await.unwrap();
        let before = chrono::Utc::now().timestamp();
        let out = snapshot_ok(&config);
        let after = chrono::Utc::now().timestamp();
        let id =
            manifests(&s3, "locked").await.into_iter().map(|m| m["id"].as_str().unwrap().to_string()).max().unwrap();
        for object in ["snapshot.db.zst", "manifest.json"] {
            let (mode, until) = lock_of(&s3, "locked", &format!("{PREFIX}/{id}/{object}")).await;
            assert_eq!(mode.as_deref(), Some("COMPLIANCE"), "{object} of {id}");
            let until = until.expect("a retention date");
            assert!(
                (before + 3600 - 2..=after + 3600 + 2).contains(&until),
                "{object}: locked until {until}, written {before}..{after}"
            );
        }
        if round == 1 {
            // keepLast 1 would delete the first snapshot; its lock holds it, and retention says so.
            assert!(out.contains("locked 1"), "{out}");
        }
        ids.push(id);
    }
    let listed: Vec<String> =
        manifests(&s3, "locked").await.iter().map(|m| m["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(listed.len(), 2, "both snapshots stay while locked: {listed:?}");
    for object in ["snapshot.db.zst", "manifest.json"] {
        let key = format!("{PREFIX}/{}/{object}", ids[0]);
        let deleted = s3.delete_object().bucket("locked").key(&key).send().await;
        assert!(deleted.is_err(), "a delete of {key} with the agent's key went through during its lock");
        assert!(s3.head_object().bucket("locked").key(&key).send().await.is_ok(), "{key} is still there");
    }

    // Once the lock ends, retention deletes as configured.
    s3.create_bucket().bucket("short-lock").object_lock_enabled_for_bucket(true).send().await.unwrap();
    options.bucket = "short-lock".into();
    options.extra_storage = "  objectLock:\n    mode: governance\n    retainFor: 2s\n";
    let short = write_config(&bed, &options).unwrap();
    snapshot_ok(&short);
    // Until the store's own retention date of the first snapshot's objects has passed.
    let first = manifests(&s3, "short-lock").await[0]["id"].as_str().unwrap().to_string();
    testbed::eventually(WAIT, "the first snapshot's locks ended", || async {
        let mut latest = 0;
        for object in ["snapshot.db.zst", "manifest.json"] {
            latest = latest.max(lock_of(&s3, "short-lock", &format!("{PREFIX}/{first}/{object}")).await.1?);
        }
        (chrono::Utc::now().timestamp() > latest).then_some(())
    })
    .await;
    load(&mut client, "/registry/later", 5, 100).await.unwrap();
    let out = snapshot_ok(&short);
    assert!(!out.contains("locked 1"), "{out}");
    assert_eq!(manifests(&s3, "short-lock").await.len(), 1, "keepLast 1 once the first lock ended: {out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn static_credentials_come_from_the_environment_and_missing_ones_fail_clearly() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.credentials = Some("environment: {}");
    let config = write_config(&bed, &options).unwrap();
    let run = |keys: &[(&str, &str)]| {
        std::process::Command::new(BINARY)
            .args(["snapshot", "--config", config.to_str().unwrap()])
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env(NO_METADATA.0, NO_METADATA.1)
            .envs(keys.iter().copied())
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert!(!out.status.success() && text(&out).contains("AWS_ACCESS_KEY_ID is not set"), "{}", text(&out));
    let wrong = run(&[("AWS_ACCESS_KEY_ID", &bed.s3.access_key), ("AWS_SECRET_ACCESS_KEY", "not-the-secret")]);
    assert!(!wrong.status.success(), "{}", text(&wrong));
    assert!(!text(&wrong).contains("not-the-secret"), "the secret never reaches an error: {}", text(&wrong));
    let out = run(&[("AWS_ACCESS_KEY_ID", &bed.s3.access_key), ("AWS_SECRET_ACCESS_KEY", &bed.s3.secret_key)]);
    assert!(out.status.success(), "{}", text(&out));
    testbed::assert_no_secret_material(&text(&out), &[&bed.s3.secret_key]);
    assert_eq!(manifests(&bed.s3.client(), &bed.s3.bucket).await.len(), 1);
}

/// Writes 1 KiB values (a kcp shard's leases, events and status updates) to a ring of 10,000 keys at
/// `per_second` from its own tasks until dropped (at most 128 puts in flight; a tick with none free is
/// skipped, never queued). `done` counts the puts that landed.
struct Writer {
    done: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn start(client: etcd_client::Client, per_second: u64) -> Self {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = done.clone();
        let task = tokio::spawn(async move {
            if per_second == 0 {
                return;
            }
            let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(128));
            let mut ticks = tokio::time::interval(std::time::Duration::from_micros(1_000_000 / per_second));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            for i in 0u64.. {
                ticks.tick().await;
                let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
                let (mut client, counter) = (client.clone(), counter.clone());
                tokio::spawn(async move {
                    let value = format!("{i:08}").repeat(128);
                    if client.put(format!("/registry/leases/{:05}", i % 10_000), value, None).await.is_ok() {
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(slot);
                });
            }
        });
        Self { done, task }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One `snapshot` one-shot per run while `writer` writes: the outputs and each run's wall time, with the member's
/// revision read just before and just after each run.
async fn snapshots_under_load(
    binary: &str,
    config: &std::path::Path,
    client: &mut etcd_client::Client,
    runs: usize,
) -> Vec<(i64, std::process::Output, std::time::Duration, i64)> {
    let mut out = Vec::new();
    for _ in 0..runs {
        let before = client.status().await.unwrap().header().unwrap().revision();
        let (binary, config) = (binary.to_string(), config.to_str().unwrap().to_string());
        let started = std::time::Instant::now();
        let run = tokio::task::spawn_blocking(move || {
            std::process::Command::new(binary)
                .args(["snapshot", "--config", &config])
                .env(NO_METADATA.0, NO_METADATA.1)
                .output()
                .expect("the binary runs")
        })
        .await
        .unwrap();
        let took = started.elapsed();
        let after = client.status().await.unwrap().header().unwrap().revision();
        out.push((before, run, took, after));
    }
    out
}

/// What [`busy_shard`] saw at one write rate.
struct Busy {
    rate: u64,
    /// The runs that failed: their output.
    failed: Vec<String>,
    attempted: usize,
    /// The puts etcd acknowledged per second while the runs went on.
    written_per_second: f64,
    /// Each run's wall time, sorted.
    run_seconds: Vec<f64>,
    /// `revisionUpperBound - revision` of each published manifest, sorted.
    windows: Vec<i64>,
    /// The WAL fsyncs etcd did meanwhile, and their mean in milliseconds.
    fsyncs: f64,
    fsync_ms: f64,
}

impl Busy {
    /// The figures line (`cargo test ... -- --nocapture` shows it).
    fn print(&self) {
        let (runs, windows) = (&self.run_seconds, &self.windows);
        println!(
            "BUSY SHARD {} writes/s (fsync on): {} of {} published; {:.0} writes/s acknowledged; run {:.2} s median, \
             {:.2} s max; revision window {} median, {} max; {:.0} WAL fsyncs of {:.2} ms mean",
            self.rate,
            self.attempted - self.failed.len(),
            self.attempted,
            self.written_per_second,
            runs[runs.len() / 2],
            runs[runs.len() - 1],
            windows.get(windows.len() / 2).copied().unwrap_or_default(),
            windows.last().copied().unwrap_or_default(),
            self.fsyncs,
            self.fsync_ms
        );
    }
}

/// A busy shard: a member of 400 keys of 20 KB taking `rate` writes/s ([`Writer`]) while 20 `snapshot` one-shots
/// run one after the other. Every published snapshot is checked: its bounds within its run, key count and HashKV
/// the live member's at its `revision`, the database itself (`verify`) within `[revision, revisionUpperBound]`.
/// Times are measured, never asserted.
async fn busy_shard(rate: u64) -> Busy {
    let bed = Bed::start().await.unwrap();
    // fsync on, as production commits: the writes a busy shard takes while it is snapshotted pay the disk's latency
    // (docs/architecture.md, The test bed).
    let etcd = bed.etcd_fsync("root", 1).await.unwrap();
    let url = etcd.members[0].client_url.clone();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 400, 20_000).await.unwrap();
    let mut options = Options::new(&bed, "root", vec![url.clone()]);
    options.keep_last = 100;
    let config = write_config(&bed, &options).unwrap();

    let (fsyncs_before, fsync_seconds_before) = wal_fsyncs(&url).await;
    let writer = Writer::start(etcd.member_client(0).await.unwrap(), rate);
    let started = std::time::Instant::now();
    let runs = snapshots_under_load(BINARY, &config, &mut client, 20).await;
    let written_per_second = writer.done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    drop(writer);
    let (fsyncs_after, fsync_seconds_after) = wal_fsyncs(&url).await;
    let fsyncs = fsyncs_after - fsyncs_before;
    if rate > 0 {
        assert!(fsyncs > 0.0, "etcd fsynced none of {rate} writes/s: is it running with --unsafe-no-fsync?");
    }
    let failed: Vec<String> =
        runs.iter().filter(|(_, o, _, _)| !o.status.success()).map(|(_, o, _, _)| text(o)).collect();
    for (before, _, _, after) in &runs {
        assert!(rate == 0 || after > before, "the shard was written to during every run: {before} .. {after}");
    }

    let manifests = manifests(&bed.s3.client(), &bed.s3.bucket).await;
    assert_eq!(manifests.len(), runs.len() - failed.len(), "one manifest per published run");
    let etcdutl = bed.etcdutl().to_str().unwrap().to_string();
    let mut windows = Vec::new();
    for m in &manifests {
        let revision = m["revision"].as_i64().unwrap();
        let upper = m["revisionUpperBound"].as_i64().unwrap();
        assert!(revision <= upper, "{m}");
        assert!(
            runs.iter().any(|(before, _, _, after)| before <= &revision && &upper <= after),
            "bounds within a run: {m}"
        );
        windows.push(upper - revision);
        // Key count and HashKV are the live member's at the manifest's revision.
        let at = etcd_client::GetOptions::new().with_all_keys().with_count_only().with_revision(revision);
        assert_eq!(m["keyCount"], client.get("", Some(at)).await.unwrap().count(), "{m}");
        assert_eq!(m["hashKv"], client.hash_kv(revision).await.unwrap().hash(), "{m}");
        // What the database itself holds (etcdutl snapshot status) lies within the manifest's bounds.
        let id = m["id"].as_str().unwrap();
        let out = cli(&["verify", "--config", config.to_str().unwrap(), id, "--etcdutl", &etcdutl]);
        assert!(out.status.success(), "{}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let exact: i64 = stdout
            .split("etcdutl reads revision ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no revision in {stdout}"));
        assert!(revision <= exact && exact <= upper, "the database holds {exact}, outside [{revision}, {upper}]");
    }
    let mut run_seconds: Vec<f64> = runs.iter().map(|(_, _, took, _)| took.as_secs_f64()).collect();
    run_seconds.sort_by(f64::total_cmp);
    windows.sort();
    let fsync_ms = (fsync_seconds_after - fsync_seconds_before) * 1000.0 / fsyncs.max(1.0);
    Busy { rate, failed, attempted: runs.len(), written_per_second, run_seconds, windows, fsyncs, fsync_ms }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shard_taking_1000_writes_per_second_publishes_20_of_20_snapshots_each_holding_at_least_its_manifest_revision()
 {
    let busy = busy_shard(1000).await;
    busy.print();
    let failed = &busy.failed;
    assert!(failed.is_empty(), "{} of 20 failed under load; the first: {}", failed.len(), failed[0]);
}

/// The busy-shard figures below the test above's 1000 writes/s: 0 and 200 writes/s, fsync on (docs/architecture.md,
/// The test bed). Every snapshot published at each rate, each checked as above; the times are printed, never
/// asserted.
#[tokio::test(flavor = "multi_thread")]
async fn a_shard_at_0_and_200_writes_per_second_with_fsync_on_publishes_every_snapshot_and_prints_its_figures() {
    for rate in [0, 200] {
        let busy = busy_shard(rate).await;
        busy.print();
        let failed = &busy.failed;
        assert!(failed.is_empty(), "{} of 20 failed at {} writes/s; the first: {}", failed.len(), busy.rate, failed[0]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_whose_quota_raised_nospace_is_still_snapshotted_with_every_key() {
    let bed = Bed::start().await.unwrap();
    let (client_port, peer_port) = (testbed::process::free_port().unwrap(), testbed::process::free_port().unwrap());
    let (client_url, peer_url) = (format!("http://127.0.0.1:{client_port}"), format!("http://127.0.0.1:{peer_port}"));
    let _small = testbed::process::Process::start(
        "small-etcd",
        bed.peers.path("etcd"),
        vec![
            "--name=small-0".into(),
            format!("--data-dir={}", bed.path("small").display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=small-0={peer_url}"),
            "--quota-backend-bytes=16777216".into(),
            "--unsafe-no-fsync".into(),
        ],
        bed.path("small.log"),
    )
    .unwrap();
    let mut client = testbed::eventually(WAIT, "the small etcd serves", || {
        let url = client_url.clone();
        async move {
            let mut c = etcd_client::Client::connect([url], None).await.ok()?;
            c.status().await.ok()?;
            Some(c)
        }
    })
    .await;
    // Fill until etcd refuses a write and raises the alarm.
    let mut written: i64 = 0;
    let refused = loop {
        match load(&mut client, &format!("/registry/fill/{written:06}"), 1, 200_000).await {
            Ok(()) => written += 1,
            Err(error) => break error.to_string(),
        }
    };
    assert!(refused.contains("database space exceeded"), "{refused}");
    let alarms = client.alarm(etcd_client::AlarmAction::Get, etcd_client::AlarmType::None, None).await.unwrap();
    assert!(alarms.alarms().iter().any(|a| a.alarm() == etcd_client::AlarmType::Nospace), "NOSPACE is raised");

    let config = write_config(&bed, &Options::new(&bed, "small", vec![client_url.clone()])).unwrap();
    let out = cli(&["snapshot", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("etcd alarm active") && text(&out).contains("nospace"), "{}", text(&out));
    let m = &manifests(&bed.s3.client(), &bed.s3.bucket).await[0];
    // The write answered NOSPACE may be stored all the same: when the quota check before proposing lets it through,
    // etcd's apply layer stores the write that crosses the quota and then answers it NOSPACE (a full run saw 86
    // writes acknowledged, "failed to apply request ... no space" for the 87th, and 87 keys held). So the member
    // holds every acknowledged key and perhaps that one more, and the snapshot holds exactly what the member holds.
    let all = etcd_client::GetOptions::new().with_all_keys().with_count_only();
    let held = client.get("", Some(all)).await.unwrap().count();
    assert!(held == written || held == written + 1, "{written} writes acknowledged, the member holds {held} keys");
    assert_eq!(m["keyCount"].as_i64(), Some(held), "{m}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_corrupt_alarm_on_one_member_of_three_skips_that_member_only() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("alpha", 3).await.unwrap();
    let mut client = etcd.member_client(1).await.unwrap();
    load(&mut client, "/registry/things", 50, 1000).await.unwrap();
    let mut first = etcd.member_client(0).await.unwrap();
    let id = first.status().await.unwrap().header().unwrap().member_id();
    let mut on_first = etcd_client::AlarmOptions::new();
    on_first.with_member(id);
    first.alarm(etcd_client::AlarmAction::Activate, etcd_client::AlarmType::Corrupt, Some(on_first)).await.unwrap();
    let endpoints: Vec<String> = etcd.members.iter().map(|m| m.client_url.clone()).collect();
    let config = write_config(&bed, &Options::new(&bed, "alpha", endpoints)).unwrap();
    let out = cli(&["snapshot", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("has a CORRUPT alarm"), "the corrupt member is named as skipped: {}", text(&out));
    assert!(text(&out).contains("etcd alarm active") && text(&out).contains("corrupt"), "{}", text(&out));
    let m = &manifests(&bed.s3.client(), &bed.s3.bucket).await[0];
    assert_ne!(m["member"]["name"], "alpha-0", "{m}");
}

#[tokio::test(flavor = "multi_thread")]
async fn objects_this_agent_did_not_write_survive_every_run_and_retention_while_its_own_leftover_goes() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 20, 1000).await.unwrap();
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.keep_last = 1;
    let config = write_config(&bed, &options).unwrap();
    let (s3, bucket) = (bed.s3.client(), bed.s3.bucket.clone());
    let put = |key: String, written_by_us: bool| put_by_hand(&s3, &bucket, key, written_by_us);
    // An etcdctl snapshot uploaded by hand, one in this agent's own key shape without a manifest, a note at
    // the prefix and one in another shard's directory.
    let mut hand_placed = vec![
        put(format!("{PREFIX}/root/etcdctl-20261130.db"), false).await,
        put(format!("{PREFIX}/root/20250101T000000Z-r5/snapshot.db"), false).await,
        put(format!("{PREFIX}/notes.txt"), false).await,
        put(format!("{PREFIX}/alpha/20250101T000000Z-r5/snapshot.db.zst"), false).await,
    ];
    snapshot_ok(&config);
    let first = manifests(&s3, &bucket).await[0].clone();
    let first_id = first["id"].as_str().unwrap().to_string();
    // A note beside a snapshot retention will delete, and a manifest edited to name it as its object.
    hand_placed.push(put(format!("{PREFIX}/{first_id}/notes.txt"), false).await);
    let mut forged = first.clone();
    forged["id"] = "root/20250102T000000Z-r6".into();
    forged["object"] = "victim.txt".into();
    hand_placed.push(put(format!("{PREFIX}/root/20250102T000000Z-r6/victim.txt"), false).await);
    let forged_key = format!("{PREFIX}/root/20250102T000000Z-r6/manifest.json");
    s3.put_object()
        .bucket(&bucket)
        .key(&forged_key)
        .body(serde_json::to_vec(&forged).unwrap().into())
        .send()
        .await
        .unwrap();
    hand_placed.push(forged_key);
    // What an interrupted run of this agent leaves: its own shape, its own metadata, no manifest.
    let leftover = put(format!("{PREFIX}/root/20250103T000000Z-r7/snapshot.db.zst"), true).await;

    for _ in 0..3 {
        load(&mut client, "/registry/more", 5, 100).await.unwrap();
        let out = snapshot_ok(&config);
        assert!(out.contains("kept 1"), "{out}");
    }
    let left = keys(&s3, &bucket).await;
    for key in &hand_placed {
        assert!(left.contains(key), "{key} survived every run and retention: {left:?}");
    }
    assert!(!left.contains(&leftover), "the agent's own leftover was cleaned: {left:?}");
    assert!(!left.contains(&format!("{PREFIX}/{first_id}/manifest.json")), "retention ran: {left:?}");
    let published = manifests(&s3, &bucket).await.into_iter().filter(|m| m["object"] != "victim.txt").count();
    assert_eq!(published, 1, "keepLast 1: {left:?}");
}

/// A versitygw of its own with versioning on (the bed's has none), the bed's keys, a versioned bucket.
async fn versioned_s3(bed: &Bed) -> testbed::S3Server {
    let port = testbed::process::free_port().unwrap();
    let (data, versions) = (bed.path("versioned-data"), bed.path("versioned-versions"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&versions).unwrap();
    let process = testbed::process::Process::start_with_env(
        "versioned-versitygw",
        bed.peers.path("versitygw"),
        vec![
            "--port".into(),
            format!("127.0.0.1:{port}"),
            "--region".into(),
            testbed::s3::REGION.into(),
            "--quiet".into(),
            "posix".into(),
            "--versioning-dir".into(),
            versions.display().to_string(),
            data.display().to_string(),
        ],
        &[("ROOT_ACCESS_KEY", bed.s3.access_key.as_str()), ("ROOT_SECRET_KEY", bed.s3.secret_key.as_str())],
        bed.path("versioned-versitygw.log"),
    )
    .unwrap();
    let server = testbed::S3Server {
        endpoint: format!("http://127.0.0.1:{port}"),
        access_key: bed.s3.access_key.clone(),
        secret_key: bed.s3.secret_key.clone(),
        bucket: "versioned".into(),
        process,
    };
    let s3 = server.client();
    testbed::eventually(WAIT, "the versioned versitygw answers", || {
        let s3 = s3.clone();
        async move { s3.list_buckets().send().await.ok() }
    })
    .await;
    s3.create_bucket().bucket("versioned").send().await.unwrap();
    let enabled = aws_sdk_s3::types::VersioningConfiguration::builder()
        .status(aws_sdk_s3::types::BucketVersioningStatus::Enabled)
        .build();
    s3.put_bucket_versioning().bucket("versioned").versioning_configuration(enabled).send().await.unwrap();
    server
}

/// Versions of data objects (not delete markers) in the bucket.
async fn data_versions(s3: &aws_sdk_s3::Client, bucket: &str) -> usize {
    let out = s3.list_object_versions().bucket(bucket).send().await.unwrap();
    out.versions().iter().filter(|v| v.key().is_some_and(|k| k.contains("/snapshot.db"))).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_versioned_bucket_retention_leaves_delete_markers_unless_the_configuration_deletes_versions() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    let versioned = versioned_s3(&bed).await;
    let s3 = versioned.client();
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.s3_endpoint = versioned.endpoint.clone();
    options.bucket = "versioned".into();
    options.keep_last = 1;
    let keeping = write_config(&bed, &options).unwrap();
    for _ in 0..3 {
        load(&mut client, "/registry/things", 5, 100).await.unwrap();
        snapshot_ok(&keeping);
    }
    assert_eq!(manifests(&s3, "versioned").await.len(), 1, "keepLast 1");
    assert_eq!(data_versions(&s3, "versioned").await, 3, "the deleted snapshots' data stays as old versions");

    options.extra_storage = "  deleteVersions: true\n";
    let deleting = write_config(&bed, &options).unwrap();
    for _ in 0..2 {
        load(&mut client, "/registry/things", 5, 100).await.unwrap();
        snapshot_ok(&deleting);
    }
    assert_eq!(manifests(&s3, "versioned").await.len(), 1, "keepLast 1");
    // The two snapshots this configuration deleted went for good: the two old versions from before and the
    // one kept remain.
    assert_eq!(data_versions(&s3, "versioned").await, 3, "deleteVersions removes the versions it deletes");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_re_created_etcd_is_a_new_generation_with_its_own_latest_and_retention_and_other_clusters_are_kept() {
    let bed = Bed::start().await.unwrap();
    let s3 = bed.s3.client();
    // The shard's first etcd, written to well past the revisions its successor will reach.
    let first = bed.etcd("root-first", 1).await.unwrap();
    let mut client = first.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 1000, 100).await.unwrap();
    let mut options = Options::new(&bed, "root", vec![first.members[0].client_url.clone()]).with_drills(&bed);
    options.keep_last = 1;
    let config = write_config(&bed, &options).unwrap();
    snapshot_ok(&config);
    snapshot_ok(&config);
    let old: Vec<_> = manifests(&s3, &bed.s3.bucket).await;
    assert_eq!(old.len(), 1, "keepLast 1 within the first cluster");
    let old_cluster = old[0]["clusterId"].as_str().expect("the manifest records the cluster id").to_string();
    let old_id = old[0]["id"].as_str().unwrap().to_string();
    drop(client);
    drop(first);

    // Re-created from scratch: a new cluster id, revisions starting low again.
    let again = bed.etcd("root-again", 1).await.unwrap();
    let mut client = again.member_client(0).await.unwrap();
    load(&mut client, "/registry/fresh", 5, 100).await.unwrap();
    options.shards = vec![("root", vec![again.members[0].client_url.clone()])];
    let config = write_config(&bed, &options).unwrap();
    // A stray manifest of a third cluster with a huge revision under the same shard.
    let mut stray = old[0].clone();
    stray["clusterId"] = "00000000000bad00".into();
    stray["id"] = "root/20250101T000000Z-r999999999999".into();
    stray["revision"] = 999_999_999_999u64.into();
    stray["revisionUpperBound"] = 999_999_999_999u64.into();
    let stray_key = format!("{PREFIX}/root/20250101T000000Z-r999999999999/manifest.json");
    s3.put_object()
        .bucket(&bed.s3.bucket)
        .key(&stray_key)
        .body(serde_json::to_vec(&stray).unwrap().into())
        .send()
        .await
        .unwrap();

    let mut published = Vec::new();
    for _ in 0..2 {
        let out = cli(&["snapshot", "--config", config.to_str().unwrap()]);
        assert!(out.status.success(), "{}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("kept 1, deleted") && stdout.contains("other clusters 2"), "{}", text(&out));
        assert!(text(&out).contains("snapshot(s) of other etcd clusters"), "reported: {}", text(&out));
        published.push(stdout.split('\t').next().unwrap().to_string());
    }
    let all = manifests(&s3, &bed.s3.bucket).await;
    let new_cluster = all.iter().find(|m| m["id"] == published[1].as_str()).unwrap()["clusterId"].clone();
    assert_ne!(new_cluster, old_cluster.as_str(), "a re-created etcd is another cluster");
    let ids: Vec<&str> = all.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert!(ids.contains(&old_id.as_str()), "the first cluster's snapshot is kept: {ids:?}");
    assert!(ids.contains(&"root/20250101T000000Z-r999999999999"), "the stray one is kept: {ids:?}");
    assert!(!ids.contains(&published[0].as_str()), "the new generation keeps its own keepLast 1: {ids:?}");
    assert_eq!(all.len(), 3, "{ids:?}");

    // `latest`, as a drill of the shard picks it, is the new generation's newest.
    let out = cli(&["drill", "--config", config.to_str().unwrap(), "--shard", "root"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("ok {}:", published[1])), "{}", text(&out));
    let listing = String::from_utf8_lossy(&cli(&["list", "--config", config.to_str().unwrap()]).stdout).into_owned();
    assert!(listing.contains(&format!("{old_cluster} (other)")), "list marks other clusters: {listing}");

    // With the shard's etcd down, `latest` cannot tell its cluster among three and says so.
    drop(client);
    drop(again);
    let restore = cli(&[
        "restore",
        "--config",
        config.to_str().unwrap(),
        "--shard",
        "root",
        "--etcdutl",
        bed.etcdutl().to_str().unwrap(),
        "--name",
        "x",
        "--initial-cluster",
        "x=http://127.0.0.1:1",
        "--initial-advertise-peer-urls",
        "http://127.0.0.1:1",
        "--data-dir",
        bed.path("never").to_str().unwrap(),
    ]);
    assert!(!restore.status.success(), "{}", text(&restore));
    assert!(text(&restore).contains("come from 3 etcd clusters"), "{}", text(&restore));
    assert!(!bed.path("never").exists(), "nothing restored");
}

/// Bytes of files under `dir` (and its subdirectories) now.
fn bytes_under(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => bytes_under(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spill_cap_keeps_the_spill_directory_under_max_bytes_by_holding_etcd_back_and_the_snapshot_is_whole() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/big", 300, 100_000).await.unwrap();
    let slow = Proxy::start(host_port(&bed.s3.endpoint)).await;
    slow.faults.throttle_bytes_per_second.store(4 * 1024 * 1024, Ordering::SeqCst);
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]);
    options.s3_endpoint = slow.url.clone();
    options.compression = "none";
    // As the spill test, but at most one part (5 MiB) in the spill directory at once.
    options.spill = "memoryBudget: 15Mi\n  partSize: 5Mi\n  partsInFlight: 1\n  spillAfter: 200ms\n  maxBytes: 5Mi";
    let config = write_config(&bed, &options).unwrap();

    let spill = bed.path("spill");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (spill, done) = (spill.clone(), done.clone());
        tokio::spawn(async move {
            let mut most = 0;
            while !done.load(Ordering::SeqCst) {
                most = most.max(bytes_under(&spill));
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            most
        })
    };
    let path = config.clone();
    let out =
        tokio::task::spawn_blocking(move || cli(&["snapshot", "--config", path.to_str().unwrap()])).await.unwrap();
    done.store(true, Ordering::SeqCst);
    let most = sampler.await.unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let manifests = manifests(&bed.s3.client(), &bed.s3.bucket).await;
    let spilled = manifests[0]["spilledBytes"].as_u64().unwrap();
    assert!(spilled >= 5 * 1024 * 1024, "S3 lagged and parts spilled: {spilled}");
    assert!(most <= 5 * 1024 * 1024, "the spill directory held {most} bytes at most, the cap is 5 MiB");
    assert!(most > 0, "the sampler saw the spill directory in use");
    let id = manifests[0]["id"].as_str().unwrap();
    let out = cli(&["verify", "--config", config.to_str().unwrap(), id, "--etcdutl", bed.etcdutl().to_str().unwrap()]);
    assert!(out.status.success(), "the object is whole: {}", text(&out));
}
