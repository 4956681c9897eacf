//! Restore drills against a real etcd and a real versitygw, through the binary's `drill` one-shot: a good
//! snapshot passes and is verified, a flipped byte or an edited manifest fails with the failure named, and a
//! drill stopped by SIGTERM leaves no process and no directory behind.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

/// A bed with one etcd holding some keys, a configuration with drills, and one snapshot taken.
struct Drilled {
    bed: Bed,
    _etcd: testbed::Etcd,
    config: std::path::PathBuf,
    client: etcd_client::Client,
}

async fn bed_with_snapshot(retention_extra: &'static str, keep_last: usize) -> Drilled {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/things", 300, 2_000).await.unwrap();
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]).with_drills(&bed);
    options.retention_extra = retention_extra;
    options.keep_last = keep_last;
    let config = write_config(&bed, &options).unwrap();
    snapshot_ok(&config);
    Drilled { bed, _etcd: etcd, config, client }
}

fn drill(config: &Path, id: Option<&str>) -> std::process::Output {
    let mut args = vec!["drill", "--config", config.to_str().unwrap()];
    args.extend(id);
    cli(&args)
}

async fn newest_id(bed: &Bed) -> String {
    let mut all = manifests(&bed.s3.client(), &bed.s3.bucket).await;
    all.sort_by_key(|m| std::cmp::Reverse(m["revision"].as_u64().unwrap()));
    all[0]["id"].as_str().unwrap().to_string()
}

async fn report(bed: &Bed, id: &str) -> serde_json::Value {
    let key = format!("{PREFIX}/{id}/drill.json");
    let out = bed.s3.client().get_object().bucket(&bed.s3.bucket).key(&key).send().await.unwrap();
    serde_json::from_slice(&out.body.collect().await.unwrap().into_bytes()).unwrap()
}

fn list(config: &Path) -> String {
    let out = cli(&["list", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn listed_line<'a>(listing: &'a str, id: &str) -> &'a str {
    listing.lines().find(|l| l.starts_with(id)).unwrap_or_else(|| panic!("{id} not listed:\n{listing}"))
}

fn assert_drills_dir_empty(bed: &Bed) {
    let left: Vec<_> =
        std::fs::read_dir(bed.drills_dir()).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "drill directories left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_good_snapshot_passes_the_drill_gets_a_passing_report_and_is_listed_verified() {
    let d = bed_with_snapshot("", 10).await;
    let id = newest_id(&d.bed).await;
    assert!(listed_line(&list(&d.config), &id).ends_with(" no"), "not verified before a drill");

    let out = drill(&d.config, Some(&id));
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with(&format!("ok {id}: ")) && stdout.contains("HashKV matches"), "{}", text(&out));

    let manifest = manifests(&d.bed.s3.client(), &d.bed.s3.bucket).await.remove(0);
    let r = report(&d.bed, &id).await;
    assert_eq!(r["passed"], true, "{r}");
    assert_eq!(r["revision"], manifest["revision"]);
    assert_eq!(r["keyCount"], manifest["keyCount"]);
    assert_eq!(r["hashKv"], "match");
    assert_eq!(r["objectSha256"], manifest["objectSha256"]);
    assert_eq!(r["etcdSha256"], manifest["etcdSha256"]);
    assert_eq!(r["sampledKeys"], 50);
    assert!(r["restoreSeconds"].as_f64().unwrap() > 0.0, "{r}");
    let line = listed_line(&list(&d.config), &id).to_string();
    assert!(!line.ends_with(" no") && line.contains("20"), "verified with its time: {line}");
    assert_drills_dir_empty(&d.bed);

    // Without an id: each shard's newest snapshot.
    let out = drill(&d.config, None);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&id), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_manifest_edited_to_claim_verified_is_not_trusted_and_an_edit_after_a_passing_drill_unverifies_it() {
    let d = bed_with_snapshot("", 10).await;
    let id = newest_id(&d.bed).await;
    let key = format!("{PREFIX}/{id}/manifest.json");
    let file = d.bed.s3_file(&key);
    let original = std::fs::read_to_string(&file).unwrap();
    let claimed = original.replacen("{\n", "{\n  \"verifiedAt\": \"2026-11-30T00:00:00Z\",\n", 1);
    std::fs::write(&file, &claimed).unwrap();
    assert!(listed_line(&list(&d.config), &id).ends_with(" no"), "verifiedAt alone proves nothing");

    std::fs::write(&file, &original).unwrap();
    let out = drill(&d.config, Some(&id));
    assert!(out.status.success(), "{}", text(&out));
    assert!(!listed_line(&list(&d.config), &id).ends_with(" no"));
    // Edited after the drill: the report no longer proves what the manifest now says.
    std::fs::write(&file, original.replacen("\"spilledBytes\": 0", "\"spilledBytes\": 1", 1)).unwrap();
    let line = list(&d.config);
    assert!(listed_line(&line, &id).contains("report does not match the manifest"), "{line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flipped_byte_in_the_stored_object_fails_with_object_hash_mismatch_and_retention_keeps_the_last_verified() {
    let mut d = bed_with_snapshot("minVerified: 1", 1).await;
    let good = newest_id(&d.bed).await;
    let out = drill(&d.config, Some(&good));
    assert!(out.status.success(), "{}", text(&out));

    d.client.put("/registry/things/after", "x", None).await.unwrap();
    snapshot_ok(&d.config);
    let bad = newest_id(&d.bed).await;
    assert_ne!(bad, good);
    d.bed.flip_middle_byte(&format!("{PREFIX}/{bad}/snapshot.db.zst"), 0x01);

    let out = drill(&d.config, Some(&bad));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("FAILED {bad}: object_hash_mismatch: object hash mismatch")), "{}", text(&out));
    let r = report(&d.bed, &bad).await;
    assert_eq!(r["passed"], false);
    assert_eq!(r["failure"]["reason"], "object_hash_mismatch");
    assert!(listed_line(&list(&d.config), &bad).contains("drill failed: object_hash_mismatch"));
    assert_drills_dir_empty(&d.bed);

    // Two more snapshots with keepLast 1: the failed one goes, the verified one stays.
    for i in 0..2 {
        d.client.put(format!("/registry/things/more-{i}"), "x", None).await.unwrap();
        snapshot_ok(&d.config);
    }
    let ids: Vec<String> = manifests(&d.bed.s3.client(), &d.bed.s3.bucket)
        .await
        .iter()
        .map(|m| m["id"].as_str().unwrap().into())
        .collect();
    assert!(ids.contains(&good), "the verified snapshot is kept: {ids:?}");
    assert!(!ids.contains(&bad), "the snapshot that failed its drill is not: {ids:?}");
    assert_eq!(ids.len(), 2, "{ids:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_manifest_with_an_altered_key_count_or_revision_fails_with_the_field_named() {
    let d = bed_with_snapshot("", 10).await;
    let id = newest_id(&d.bed).await;
    let file = d.bed.s3_file(&format!("{PREFIX}/{id}/manifest.json"));
    let original = std::fs::read_to_string(&file).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&original).unwrap();
    let (keys, revision) = (manifest["keyCount"].as_u64().unwrap(), manifest["revision"].as_u64().unwrap());

    // A revision raised above what the database holds (and above the manifest's upper bound): `revision` is a
    // lower bound, so only a database below it (or above `revisionUpperBound`) contradicts the manifest.
    for (field, from, to, reason) in
        [("keyCount", keys, keys + 1, "key_count_mismatch"), ("revision", revision, revision + 1, "revision_mismatch")]
    {
        let altered = original.replacen(&format!("\"{field}\": {from},"), &format!("\"{field}\": {to},"), 1);
        assert_ne!(altered, original, "{field} was altered");
        std::fs::write(&file, &altered).unwrap();
        let out = drill(&d.config, Some(&id));
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&format!("FAILED {id}: {reason}:")) && stderr.contains(field), "{}", text(&out));
        assert_eq!(report(&d.bed, &id).await["failure"]["reason"], reason);
        assert_drills_dir_empty(&d.bed);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_drill_stopped_by_sigterm_leaves_no_process_and_no_directory_behind() {
    let d = bed_with_snapshot("", 10).await;
    let id = newest_id(&d.bed).await;
    let drills_dir = d.bed.drills_dir().display().to_string();
    let mut child = std::process::Command::new(BINARY)
        .args(["drill", "--config", d.config.to_str().unwrap(), &id])
        .env(NO_METADATA.0, NO_METADATA.1)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Mid-drill: the throwaway etcd runs on the restored copy inside the drill's directory. It lives for well
    // under a second here, so this polls /proc tightly rather than at eventually's pace.
    let deadline = std::time::Instant::now() + WAIT;
    let etcd = loop {
        if let Some(found) = processes_mentioning(&drills_dir).into_iter().find(|(_, cmd)| cmd.contains("--name=drill"))
        {
            break found;
        }
        if child.try_wait().unwrap().is_some() {
            panic!("the drill ended before its etcd was seen: {}", text(&child.wait_with_output().unwrap()));
        }
        assert!(std::time::Instant::now() < deadline, "the drill's etcd never ran");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    sigterm_interrupts(child).await;
    // Gone, or at most a zombie waiting for init to reap it (the agent exited right after killing it).
    let state = std::fs::read_to_string(format!("/proc/{}/stat", etcd.0)).unwrap_or_default();
    let state = state.rsplit_once(") ").map(|(_, rest)| rest.chars().next().unwrap_or('?')).unwrap_or('-');
    assert!(matches!(state, '-' | 'Z'), "the drill's etcd (pid {}) is still running: state {state}", etcd.0);
    assert_eq!(processes_mentioning(&drills_dir), vec![], "no drill process is left");
    assert_drills_dir_empty(&d.bed);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_encrypted_snapshot_drills_with_the_identity_file_and_fails_setup_without_it() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/secret-things", 100, 1_000).await.unwrap();
    let identity = age::x25519::Identity::generate();
    let identity_file = bed.path("identity.txt");
    std::fs::write(&identity_file, format!("{}\n", age::secrecy::ExposeSecret::expose_secret(&identity.to_string())))
        .unwrap();
    let mut options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]).with_drills(&bed);
    options.recipients = vec![identity.to_public().to_string()];
    let config = write_config(&bed, &options).unwrap();
    snapshot_ok(&config);
    let id = newest_id(&bed).await;

    let out = drill(&config, Some(&id));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains(": setup: "), "{}", text(&out));

    let with_identity =
        cli(&["drill", "--config", config.to_str().unwrap(), &id, "--identity-file", identity_file.to_str().unwrap()]);
    assert!(with_identity.status.success(), "{}", text(&with_identity));
    assert!(String::from_utf8_lossy(&with_identity.stdout).contains("HashKV matches"), "{}", text(&with_identity));
    assert_eq!(report(&bed, &id).await["passed"], true);
    assert_drills_dir_empty(&bed);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shard_of_values_near_etcds_request_limit_drills_like_any_other_with_every_sample_read() {
    let bed = Bed::start().await.unwrap();
    let etcd = bed.etcd("root", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    // Six values of 1.4 MiB, under etcd's 1.5 MiB request limit: one range over them would be 8.4 MiB, more
    // than twice the 4 MiB a gRPC client takes in one message.
    load(&mut client, "/registry/apiextensions.k8s.io/customresourcedefinitions", 6, 1_400 << 10).await.unwrap();
    load(&mut client, "/registry/things", 20, 1_000).await.unwrap();
    let options = Options::new(&bed, "root", vec![etcd.members[0].client_url.clone()]).with_drills(&bed);
    let config = write_config(&bed, &options).unwrap();
    snapshot_ok(&config);
    let id = newest_id(&bed).await;

    let out = drill(&config, Some(&id));
    assert!(out.status.success(), "{}", text(&out));
    let r = report(&bed, &id).await;
    assert_eq!(r["passed"], true, "{r}");
    assert_eq!(r["sampledKeys"], 26, "every key, the large values included: {r}");
    assert_drills_dir_empty(&bed);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_verified_snapshot_stays_verified_through_a_drill_its_environment_failed_and_only_its_own_fault_unverifies_it()
 {
    let d = bed_with_snapshot("", 10).await;
    let id = newest_id(&d.bed).await;
    let out = drill(&d.config, Some(&id));
    assert!(out.status.success(), "{}", text(&out));
    let verified = listed_line(&list(&d.config), &id).to_string();
    assert!(!verified.ends_with(" no"), "verified: {verified}");

    // The environment fails the next drill (no etcd to start): nothing about the snapshot changed.
    let text_of = std::fs::read_to_string(&d.config).unwrap();
    let etcd_line = text_of.lines().find(|l| l.trim_start().starts_with("etcd: ")).unwrap().to_string();
    let broken = d.bed.path("config-no-etcd.yaml");
    std::fs::write(&broken, text_of.replace(&etcd_line, "  etcd: /nonexistent/etcd")).unwrap();
    let out = drill(&broken, Some(&id));
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("(etcd_start)") || text(&out).contains("(setup)"), "{}", text(&out));
    assert_eq!(listed_line(&list(&d.config), &id), verified, "still verified, from the same passing drill");
    let r = report(&d.bed, &id).await;
    assert_eq!(r["passed"], true, "{r}");
    let reason = r["lastFailedAttempt"]["reason"].as_str().unwrap_or_default();
    assert!(reason == "etcd_start" || reason == "setup", "the failed attempt is recorded: {r}");
    assert_drills_dir_empty(&d.bed);

    // The snapshot's own fault takes it back: its object is no longer what was published.
    d.bed.flip_middle_byte(&format!("{PREFIX}/{id}/snapshot.db.zst"), 0x01);
    let out = drill(&d.config, Some(&id));
    assert!(!out.status.success() && text(&out).contains("object_hash_mismatch"), "{}", text(&out));
    let line = listed_line(&list(&d.config), &id).to_string();
    assert!(line.ends_with("no (drill failed: object_hash_mismatch)"), "unverified by its own fault: {line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compaction_between_the_snapshot_and_its_hash_kv_reads_not_comparable_and_the_drill_passes() {
    let mut d = bed_with_snapshot("", 10).await;
    // History to compact away: every key written again.
    load(&mut d.client, "/registry/things", 300, 2_000).await.unwrap();
    snapshot_ok(&d.config);
    let id = newest_id(&d.bed).await;
    let key = format!("{PREFIX}/{id}/manifest.json");
    let s3 = d.bed.s3.client();
    let body = s3.get_object().bucket(&d.bed.s3.bucket).key(&key).send().await.unwrap().body.collect().await.unwrap();
    let mut manifest: serde_json::Value = serde_json::from_slice(&body.into_bytes()).unwrap();
    let revision = manifest["revision"].as_i64().unwrap();

    // What the snapshot records when a compaction lands between its stream and its HashKV read: the live
    // member's HashKV after a compaction below the snapshot's revision, over another compact revision.
    d.client.compact(revision - 1, None).await.unwrap();
    let live = d.client.hash_kv(revision).await.unwrap();
    assert_ne!(Some(live.hash()), manifest["hashKv"].as_u64().map(|h| h as u32), "the compaction changed HashKV");
    assert_ne!(live.compact_version(), manifest["compactRevision"].as_i64().unwrap());
    manifest["hashKv"] = live.hash().into();
    manifest["compactRevision"] = live.compact_version().into();
    let edited = serde_json::to_vec_pretty(&manifest).unwrap();
    s3.put_object().bucket(&d.bed.s3.bucket).key(&key).body(edited.into()).send().await.unwrap();

    let out = drill(&d.config, Some(&id));
    assert!(out.status.success(), "a good snapshot is not failed by a compaction: {}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("not comparable"), "{}", text(&out));
    let r = report(&d.bed, &id).await;
    assert_eq!((r["passed"].clone(), r["hashKv"].clone()), (true.into(), "notComparable".into()), "{r}");
}
