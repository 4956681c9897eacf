//! One drill, the process side: download and prove the object, `etcdutl snapshot restore` (plain: no
//! `--bump-revision`, no `--mark-compacted`, so revision and HashKV compare exactly; no watcher ever sees this
//! copy), a throwaway etcd on loopback ports, the comparisons ([`super::compare`]) and a sample read, then the
//! kcp level when configured. Everything lives in one [`Scratch`]: its drop kills every process it started and
//! removes the directory ([`crate::throwaway`]), whether the drill passed, failed, timed out or was dropped by a shutdown.

use std::path::{Path, PathBuf};
use std::time::Instant;

use chrono::Utc;
use etcd_client::GetOptions;

use super::{HashKvResult, Observed, compare};
use crate::config::{Drills, KcpExpect};
use crate::drill_report::{Failure, Report, sha256_hex};
use crate::encode::Identity;
use crate::error::DrillError;
use crate::manifest::{Location, Manifest};
use crate::restore;
use crate::storage::Store;
use crate::throwaway::{self, Scratch};

/// A snapshot to drill, as read from the bucket.
#[derive(Debug, Clone)]
pub struct Target {
    pub manifest: Manifest,
    /// `manifest.json` exactly as stored: the report records its hash.
    pub manifest_bytes: Vec<u8>,
}

/// The drill's result and its report (written by the caller beside the manifest).
pub struct Outcome {
    pub result: Result<(), DrillError>,
    pub report: Report,
}

/// Runs one drill of `target`. Never leaves a process or a directory behind (see [`Scratch`]).
pub async fn drill(
    drills: &Drills,
    kcp: Option<&KcpExpect>,
    store: &Store,
    target: &Target,
    identities: Option<Vec<Identity>>,
) -> Outcome {
    let manifest = &target.manifest;
    let mut report = Report {
        manifest_sha256: sha256_hex(&target.manifest_bytes),
        kcp_version: manifest.kcp.as_ref().map(crate::upgrade::KcpVersion::describe),
        ..Report::started(&manifest.id, Utc::now())
    };
    let started = Instant::now();
    let steps = steps(drills, kcp, store, target, identities, &mut report);
    let result = match tokio::time::timeout(drills.timeout, steps).await {
        Ok(result) => result,
        Err(_) => Err(DrillError::Timeout(format!("the drill did not finish within {:?}", drills.timeout))),
    };
    report.passed = result.is_ok();
    report.failure = result.as_ref().err().map(Failure::from);
    report.finished_at = Utc::now();
    report.duration_seconds = started.elapsed().as_secs_f64();
    Outcome { result, report }
}

/// Writes the report beside the manifest.
pub async fn write_report(store: &Store, report: &Report) -> Result<(), DrillError> {
    let location = Location::from_id(&store.prefix, &report.id)
        .ok_or_else(|| DrillError::Setup("the manifest's id is not valid".into()))?;
    let key = format!("{}{}", location.dir(), crate::drill_report::REPORT);
    store.put(&key, report.to_json()).await.map_err(|e| DrillError::Storage(e.to_string()))
}

/// The drill's steps; what each measures goes into `measured` as it is taken (a field stays `None` when its step
/// did not run).
async fn steps(
    drills: &Drills,
    kcp: Option<&KcpExpect>,
    store: &Store,
    target: &Target,
    identities: Option<Vec<Identity>>,
    measured: &mut Report,
) -> Result<(), DrillError> {
    let manifest = &target.manifest;
    let mut scratch = Scratch::new(&drills.directory, &manifest.shard)?;
    let db = fetch(store, manifest, identities, scratch.path(), measured).await?;

    // Restore time: from etcdutl's start until the restored member answers.
    let restore_started = Instant::now();
    let quota = manifest.db_size_bytes.saturating_mul(2).max(2 << 30);
    let (mut client, client_url, _) =
        throwaway::restore_and_start(&mut scratch, (&drills.etcdutl, &drills.etcd), &db, quota).await?;
    measured.restore_seconds = Some(restore_started.elapsed().as_secs_f64());

    // A snapshot taken while restore-installation replaced the keyspace holds its marker and part of the keys.
    let marker = crate::restore::live::marker(&mut client).await.map_err(|e| DrillError::KeyRead(format!("{e:#}")))?;
    if let Some(marker) = marker {
        return Err(DrillError::PartialKeyspace(format!(
            "snapshot {} was taken while {} replaced the keyspace: it holds part of the keys, and restored on its \
             own it is no state the shard was in",
            manifest.id,
            marker.describe()
        )));
    }
    let observed = observe(&mut client, manifest).await?;
    (measured.revision, measured.key_count) = (Some(observed.revision), Some(observed.key_count));
    measured.hash_kv = Some(compare(manifest, &observed)?);
    measured.sampled_keys = Some(sample(&mut client, manifest, drills.sample_keys).await?);

    // The chain: the deltas replayed on top, compared with the live member; kcp then starts on the result.
    let chain_identities = self::identities(drills.identity_file.as_deref())?;
    measured.chain = super::chain::prove(
        &mut client,
        store,
        manifest,
        observed.revision,
        (chain_identities.as_deref(), drills.delta_key.as_ref()),
    )
    .await?;

    if let (Some(expect), Some(binary)) = (kcp, drills.kcp.as_deref()) {
        measured.kcp = Some(super::kcp::check(&mut scratch, binary, &client_url, expect).await?);
    }
    drop(client);
    scratch.finish().await;
    Ok(())
}

/// The snapshot downloaded and proven ([`restore::fetch`]), each hash recorded as measured before it is
/// compared.
async fn fetch(
    store: &Store,
    manifest: &Manifest,
    identities: Option<Vec<Identity>>,
    dir: &Path,
    measured: &mut Report,
) -> Result<PathBuf, DrillError> {
    let mut hashes = restore::Hashes::default();
    let fetched = restore::fetch(store, manifest.clone(), identities, dir, &mut hashes).await;
    measured.object_sha256 = hashes.object_sha256;
    measured.etcd_sha256 = hashes.etcd_sha256;
    Ok(fetched?.db)
}

/// The restored revision (exact), keys at the manifest's revision and `HashKV` there.
async fn observe(client: &mut etcd_client::Client, manifest: &Manifest) -> Result<Observed, DrillError> {
    let etcd = |what: &str, e: etcd_client::Error| DrillError::KeyRead(format!("{what}: {e}"));
    let status = client.status().await.map_err(|e| etcd("status", e))?;
    let current = status.header().map(|h| h.revision()).unwrap_or(0).max(0) as u64;
    // A revision outside the manifest's bounds fails on the revision, before any read at it.
    let at = manifest.revision as i64;
    let (key_count, hash_kv) = if manifest.holds_revision(current) {
        let options = GetOptions::new().with_all_keys().with_count_only().with_revision(at);
        let count = client.get("", Some(options)).await.map_err(|e| etcd("counting keys", e))?.count();
        let hash = client.hash_kv(at).await.map_err(|e| etcd("HashKV", e))?;
        (count.max(0) as u64, (hash.hash(), hash.compact_version()))
    } else {
        (0, (0, -1))
    };
    let (hash_kv, compact_revision) = hash_kv;
    Ok(Observed { revision: current, key_count, hash_kv, compact_revision })
}

/// Key names per keys-only page: a bound on one response whatever `sampleKeys` is.
const KEY_PAGE: usize = 1000;

/// Reads the first `n` keys with their values at the snapshot revision; all must come back. Names come in
/// keys-only pages and each value in a read of its own, so no response holds more than one value: one range
/// over many large values (kcp's CRDs and OpenAPI schemas, up to etcd's 1.5 MiB request limit each) would pass
/// the 4 MiB a gRPC client takes in one message and fail a good snapshot.
async fn sample(client: &mut etcd_client::Client, manifest: &Manifest, n: usize) -> Result<u64, DrillError> {
    let at = manifest.revision as i64;
    let read = |what: &str, e: etcd_client::Error| DrillError::KeyRead(format!("{what}: {e}"));
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let mut from = vec![0u8];
    while keys.len() < n {
        let limit = (n - keys.len()).min(KEY_PAGE) as i64;
        let options = GetOptions::new().with_from_key().with_keys_only().with_limit(limit).with_revision(at);
        let page = client.get(from.clone(), Some(options)).await.map_err(|e| read("listing keys", e))?;
        let Some(last) = page.kvs().last() else { break };
        from = after(last.key());
        keys.extend(page.kvs().iter().map(|kv| kv.key().to_vec()));
        if !page.more() {
            break;
        }
    }
    let mut got = 0u64;
    for key in keys {
        let options = GetOptions::new().with_revision(at);
        let value = client.get(key, Some(options)).await.map_err(|e| read("reading a value", e))?;
        got += value.kvs().len().min(1) as u64;
    }
    let want = (n as u64).min(manifest.key_count);
    if got != want {
        return Err(DrillError::KeyRead(format!("read {got} of the first {want} keys")));
    }
    Ok(got)
}

/// The first key after `key` in etcd's byte order.
fn after(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

/// Reads the manifest of `id` as stored (its bytes are what the report's hash covers).
pub async fn read_target(store: &Store, id: &str) -> Result<Target, DrillError> {
    let location = Location::from_id(&store.prefix, id)
        .ok_or_else(|| DrillError::NoSnapshot(format!("{id:?} is not a snapshot id (<shard>/<time>-r<revision>)")))?;
    let manifest_bytes = store
        .get_bytes(&location.manifest_key())
        .await
        .map_err(|e| DrillError::NoSnapshot(format!("reading the manifest of {id}: {e}")))?;
    let manifest = Manifest::from_json(&manifest_bytes)
        .map_err(|e| DrillError::NoSnapshot(format!("the manifest of {id} does not parse: {e}")))?;
    if manifest.id != id {
        return Err(DrillError::NoSnapshot(format!("the manifest at {id} names another snapshot")));
    }
    Ok(Target { manifest, manifest_bytes })
}

/// Reads the identity file, if one is configured.
pub fn identities(path: Option<&Path>) -> Result<Option<Vec<Identity>>, DrillError> {
    path.map(|p| crate::restore::read_identities(p).map_err(|_| DrillError::Setup("reading the identity file".into())))
        .transpose()
}

/// Drills `id` and writes its report beside the manifest; a report that cannot be written fails the drill
/// (nothing proves it). A failure the snapshot caused ([`super::caused_by_snapshot`]) replaces the report and
/// un-verifies it; a failure of the drill's environment (storage, setup, etcd start, a timeout...) leaves a
/// passing report that still proves this manifest and object in place, with the failed attempt recorded
/// beside it, so a verified snapshot stays verified while its object is unchanged.
pub async fn drill_and_record(drills: &Drills, kcp: Option<&KcpExpect>, store: &Store, id: &str) -> Outcome {
    let ready =
        async { Ok::<_, DrillError>((read_target(store, id).await?, identities(drills.identity_file.as_deref())?)) };
    let (target, identities) = match ready.await {
        Ok(ready) => ready,
        // A report for a drill that never reached its snapshot (not written: there is no manifest to stand beside).
        Err(error) => {
            let report = Report { failure: Some((&error).into()), ..Report::started(id, Utc::now()) };
            return Outcome { report, result: Err(error) };
        }
    };
    let mut outcome = drill(drills, kcp, store, &target, identities).await;
    let kept = match &outcome.result {
        Err(error) if !super::caused_by_snapshot(error) => still_proving(store, &target).await.map(|previous| Report {
            last_failed_attempt: Some(crate::drill_report::FailedAttempt {
                reason: <&'static str>::from(error).into(),
                message: error.to_string(),
                finished_at: outcome.report.finished_at,
            }),
            ..previous
        }),
        _ => None,
    };
    if let Err(error) = write_report(store, kept.as_ref().unwrap_or(&outcome.report)).await
        && outcome.result.is_ok()
    {
        outcome.result = Err(error);
    }
    outcome
}

/// The report beside `target` if it passed and still proves this manifest and its object.
async fn still_proving(store: &Store, target: &Target) -> Option<Report> {
    let location = Location::from_id(&store.prefix, &target.manifest.id)?;
    let bytes = store.get_bytes(&format!("{}{}", location.dir(), crate::drill_report::REPORT)).await.ok()?;
    let report = Report::from_json(&bytes).ok()?;
    crate::drill_report::verified_at(&report, &target.manifest, &target.manifest_bytes)?;
    Some(report)
}

/// One line saying what a drill proved or why it failed.
pub fn summary(outcome: &Outcome) -> String {
    let r = &outcome.report;
    match &outcome.result {
        Ok(()) => {
            let hash_kv = match r.hash_kv {
                Some(HashKvResult::Match) => "HashKV matches",
                _ => {
                    "HashKV not comparable (the manifest has none, or a compaction came between the snapshot and its HashKV)"
                }
            };
            let mut line = format!(
                "ok {}: object and etcd sha256 match the manifest; restored revision {}, {} keys, {hash_kv}; read {} keys; restore {:.1}s",
                r.id,
                r.revision.unwrap_or_default(),
                r.key_count.unwrap_or_default(),
                r.sampled_keys.unwrap_or_default(),
                r.restore_seconds.unwrap_or_default(),
            );
            if let Some(chain) = &r.chain {
                let compared = match (chain.compared_at, chain.hash_kv) {
                    (Some(at), HashKvResult::Match) => {
                        format!("keys and HashKV at revision {at} match the live member's")
                    }
                    (Some(at), HashKvResult::NotComparable) => format!(
                        "keys at revision {at} match the live member's, HashKV not comparable (another compaction)"
                    ),
                    (None, _) => "not comparable (no delta carries the live member's HashKV)".into(),
                };
                line.push_str(&format!(
                    "; chain of {} delta(s) replayed to revision {}: {compared}",
                    chain.deltas, chain.revision
                ));
            }
            if let Some(kcp) = &r.kcp {
                line.push_str(&format!(
                    "; kcp ready in {:.1}s, {} workspace(s) and {} object(s) read",
                    kcp.ready_seconds,
                    kcp.workspaces.len(),
                    kcp.objects.len()
                ));
            }
            if let Some(kcp) = &r.kcp_version {
                line.push_str(&format!("; taken under {kcp}"));
            }
            line.push_str(&format!("; drill {:.1}s", r.duration_seconds));
            line
        }
        Err(error) => {
            let reason: &'static str = error.into();
            format!("FAILED {}: {reason}: {error}", r.id)
        }
    }
}
