//! The drill of a whole installation at one point in time (`drill --installation --at <time|latest-consistent>`):
//! every configured shard restored as it was at the point ([`crate::plan`] chooses each shard's snapshot and
//! deltas, exactly as `plan --at` prints them) into a throwaway etcd of its own on loopback, the deltas replayed
//! into it up to the point, then a real kcp on each: the root shard first, then every other shard wired to it as
//! kcp's sharded mode needs (`--shard-name`, `--shard-base-url`, the root shard's admin kubeconfig as
//! `--root-shard-kubeconfig-file` and `--cache-kubeconfig`, the root shard's service-account key). Each shard's
//! `/readyz`, then the workspaces and objects its `drill.kcp` names, read through that shard.
//!
//! Every credential is made by the drill's own kcps (their admin tokens, serving certificates and service-account
//! key): nothing live trusts them, and nothing production is touched. Each shard lives in its own [`Scratch`];
//! dropping them (the end, an error, a timeout, SIGTERM dropping the future) kills every process and removes
//! every directory. Nothing is written to the bucket.

use std::path::{Path, PathBuf};
use std::time::Instant;

use chrono::{DateTime, Utc};
use tokio::process::Command;

use super::kcp;
use crate::config::{Config, KcpExpect};
use crate::delta::SigningKey;
use crate::delta::replay::{self, Outcome, Point};
use crate::encode::Identity;
use crate::error::DrillError;
use crate::plan::{At, ShardPlan};
use crate::restore;
use crate::storage::Store;
use crate::throwaway::{self, Scratch, free_port};

pub use crate::config::ROOT_SHARD;

/// The binaries and where the throwaway shards live.
pub struct Tools<'a> {
    pub etcdutl: &'a Path,
    pub etcd: &'a Path,
    /// The kcp binary of the drill (a restore of the running installation rebuilds shards without one).
    pub kcp: Option<&'a Path>,
    pub scratch_root: &'a Path,
    pub identity_file: Option<&'a Path>,
    pub signing: Option<&'a SigningKey>,
}

/// What one shard showed: the line printed for it, or why it failed.
pub struct ShardResult {
    pub shard: String,
    pub result: Result<String, DrillError>,
}

/// The installation's drill: the point every shard was restored to and each shard's result (root first).
pub struct Installation {
    pub at: DateTime<Utc>,
    pub shards: Vec<ShardResult>,
}

/// One shard restored to the point and served by its throwaway etcd (gone with it).
pub struct Restored {
    pub plan: ShardPlan,
    scratch: Scratch,
    pub etcd_url: String,
    restore_seconds: f64,
}

/// One shard's kcp, started: where its admin kubeconfig and log are.
struct Started {
    process: usize,
    root_directory: PathBuf,
    log: PathBuf,
    started: Instant,
}

/// Drills every configured shard at `at` (see the module). An error names the shard that could not be restored
/// (or every shard that cannot reach the point); a shard whose kcp fails is a failed [`ShardResult`].
pub async fn drill(store: &Store, config: &Config, at: At, tools: &Tools<'_>) -> anyhow::Result<Installation> {
    let binary = tools.kcp.ok_or_else(|| anyhow::anyhow!("the installation drill needs a kcp binary"))?;
    let mut names: Vec<String> = config.shards.iter().map(|s| s.name.clone()).collect();
    anyhow::ensure!(
        names.iter().any(|n| n == ROOT_SHARD),
        "no shard named {ROOT_SHARD:?} in the configuration: kcp's root shard must be drilled with the others"
    );
    // The root shard first: every other shard registers with it.
    names.sort_by_key(|n| n != ROOT_SHARD);
    let identities = tools.identity_file.map(restore::read_identities).transpose()?;
    let keys = (identities.as_deref(), tools.signing);
    let plan = crate::plan::plan(store, &names, at, keys).await?;
    let mut restored = Vec::new();
    for shard_plan in plan.shards {
        let shard = shard_plan.shard.clone();
        let one = restore_shard(store, shard_plan, plan.at, tools, keys).await;
        restored.push(one.map_err(|e| {
            let reason: &'static str = (&e).into();
            anyhow::anyhow!("shard {shard}: {reason}: {e}")
        })?);
    }
    let shards = serve(&mut restored, binary, config).await;
    Ok(Installation { at: plan.at, shards })
}

/// Restores `plan`'s snapshot into a throwaway etcd and replays its deltas up to `at`: the revision reached must
/// be the one the plan names.
pub async fn restore_shard(
    store: &Store,
    plan: ShardPlan,
    at: DateTime<Utc>,
    tools: &Tools<'_>,
    keys: (Option<&[Identity]>, Option<&SigningKey>),
) -> Result<Restored, DrillError> {
    let started = Instant::now();
    let manifest = super::run::read_target(store, &plan.snapshot).await?.manifest;
    let mut scratch = Scratch::new(tools.scratch_root, &plan.shard)?;
    // The snapshot's decryption takes identities of its own (they are not Clone): read again from the file.
    let identities = super::run::identities(tools.identity_file)?;
    let mut hashes = restore::Hashes::default();
    let fetched = restore::fetch(store, manifest.clone(), identities, scratch.path(), &mut hashes).await?;
    let quota = manifest.db_size_bytes.saturating_mul(4).max(4 << 30);
    let (mut client, etcd_url, _) =
        throwaway::restore_and_start(&mut scratch, (tools.etcdutl, tools.etcd), &fetched.db, quota).await?;
    let replay_error = |e: anyhow::Error| DrillError::DeltaReplay(format!("{e:#}"));
    let exact = crate::member::revision(&mut client).await.map_err(replay_error)?.max(0) as u64;
    let mut outcome = Outcome::new(&manifest, exact);
    replay::replay(store, &manifest, Point::Time(at), keys, Some(&mut client), &mut outcome)
        .await
        .map_err(replay_error)?;
    if let Some(broken) = outcome.broken {
        return Err(DrillError::DeltaChainBroken(broken));
    }
    if outcome.revision != plan.revision {
        return Err(DrillError::DeltaReplay(format!(
            "replayed to revision {}, the plan names revision {}",
            outcome.revision, plan.revision
        )));
    }
    let restore_seconds = started.elapsed().as_secs_f64();
    Ok(Restored { plan, scratch, etcd_url, restore_seconds })
}

/// Starts the root shard's kcp and waits for it, then every other shard's, wired to it; reads each shard's
/// expectations through it. A root shard that does not become ready fails every shard; one that is ready but
/// lacks what it must hold fails alone.
async fn serve(restored: &mut [Restored], binary: &Path, config: &Config) -> Vec<ShardResult> {
    let expect = |shard: &str| {
        let configured = config.shards.iter().find(|s| s.name == shard);
        configured.and_then(|s| s.drill.as_ref()?.kcp.clone()).unwrap_or_default()
    };
    let Some((root, others)) = restored.split_first_mut() else { return Vec::new() };
    let root_up = async {
        let started = start_shard(root, binary, None)?;
        let up = ready(root, started).await?;
        Ok::<_, DrillError>((up, root_shard_files(&root.scratch)?))
    };
    let (root_ready, files) = match root_up.await {
        Ok(ready) => ready,
        Err(error) => {
            let why = format!("the root shard did not serve: {error}");
            let mut results = vec![ShardResult { shard: ROOT_SHARD.into(), result: Err(error) }];
            results.extend(
                others
                    .iter()
                    .map(|o| ShardResult { shard: o.plan.shard.clone(), result: Err(DrillError::Kcp(why.clone())) }),
            );
            return results;
        }
    };
    let started: Vec<_> = others.iter_mut().map(|other| start_shard(other, binary, Some(&files))).collect();
    let root_result = read(root, root_ready, &expect(ROOT_SHARD)).await;
    let mut results = vec![ShardResult { shard: ROOT_SHARD.into(), result: root_result }];
    for (other, start) in others.iter_mut().zip(started) {
        let result = match start {
            Ok(started) => match ready(other, started).await {
                Ok(ready) => read(other, ready, &expect(&other.plan.shard)).await,
                Err(error) => Err(error),
            },
            Err(error) => Err(error),
        };
        results.push(ShardResult { shard: other.plan.shard.clone(), result });
    }
    results
}

/// What every other shard takes from the root shard: a kubeconfig of its shard admin at its base URL (the
/// `shard-base` context kcp reads, made current for the cache client) and its service-account key.
struct RootShardFiles {
    kubeconfig: PathBuf,
    service_account_key: PathBuf,
}

fn root_shard_files(root: &Scratch) -> Result<RootShardFiles, DrillError> {
    let kcp_dir = root.path().join("kcp");
    let read = |e: &dyn std::fmt::Display| DrillError::Kcp(format!("the root shard's admin kubeconfig: {e}"));
    let mut kubeconfig = kube::config::Kubeconfig::read_from(kcp_dir.join("admin.kubeconfig")).map_err(|e| read(&e))?;
    kubeconfig.current_context = Some("shard-base".into());
    let path = root.path().join("root-shard.kubeconfig");
    let json = serde_json::to_vec(&kubeconfig).map_err(|e| read(&e))?;
    std::fs::write(&path, json).map_err(|e| throwaway::setup("writing the root shard's kubeconfig", &e))?;
    Ok(RootShardFiles { kubeconfig: path, service_account_key: kcp_dir.join("sa.key") })
}

/// Starts `shard`'s kcp on its restored etcd: the root shard alone, any other with `root`'s files.
fn start_shard(shard: &mut Restored, binary: &Path, root: Option<&RootShardFiles>) -> Result<Started, DrillError> {
    let port = free_port()?;
    let root_directory = shard.scratch.path().join("kcp");
    let log = shard.scratch.path().join("kcp.log");
    let url = format!("https://127.0.0.1:{port}");
    let mut command = Command::new(binary);
    command
        .arg("start")
        .arg(format!("--shard-name={}", shard.plan.shard))
        .arg(format!("--root-directory={}", root_directory.display()))
        .arg(format!("--etcd-servers={}", shard.etcd_url))
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--secure-port={port}"))
        .arg(format!("--shard-base-url={url}"))
        .arg(format!("--shard-external-url={url}"));
    if let Some(root) = root {
        let file = |flag: &str, path: &Path| format!("--{flag}={}", path.display());
        command
            .arg(file("root-shard-kubeconfig-file", &root.kubeconfig))
            .arg(file("cache-kubeconfig", &root.kubeconfig))
            .arg(file("service-account-key-file", &root.service_account_key))
            .arg(file("service-account-private-key-file", &root.service_account_key))
            .arg(file("service-account-signing-key-file", &root.service_account_key));
    }
    let started = Instant::now();
    let process = shard.scratch.spawn(&mut command, &log, "kcp")?;
    Ok(Started { process, root_directory, log, started })
}

/// Waits for the shard's `/readyz`: its admin client and how long it took from the start.
async fn ready(shard: &mut Restored, started: Started) -> Result<(kube::Client, f64), DrillError> {
    let kubeconfig = started.root_directory.join("admin.kubeconfig");
    let client = kcp::wait_ready(&mut shard.scratch, started.process, &kubeconfig, &started.log).await?;
    Ok((client, started.started.elapsed().as_secs_f64()))
}

/// Reads what the shard must hold through it: the shard's line.
async fn read(
    shard: &Restored,
    (client, ready_seconds): (kube::Client, f64),
    expect: &KcpExpect,
) -> Result<String, DrillError> {
    let objects = kcp::read_expected(&client, expect).await?;
    Ok(line(&shard.plan, shard.restore_seconds, ready_seconds, (expect.workspaces.len(), objects.len())))
}

/// The line of a shard that passed.
fn line(plan: &ShardPlan, restore_seconds: f64, ready_seconds: f64, (workspaces, objects): (usize, usize)) -> String {
    format!(
        "snapshot {} and {} delta(s) replayed to revision {}; restore {restore_seconds:.1}s; kcp ready in \
         {ready_seconds:.1}s, {workspaces} workspace(s) and {objects} object(s) read",
        plan.snapshot, plan.deltas, plan.revision
    )
}

/// One line per shard, and a last line naming every shard that failed (with its reason).
pub fn summary(installation: &Installation) -> (Vec<String>, Option<String>) {
    let at = crate::clock::stamp(installation.at);
    let mut lines = Vec::new();
    let mut failed = Vec::new();
    for shard in &installation.shards {
        match &shard.result {
            Ok(line) => lines.push(format!("ok {} at {at}: {line}", shard.shard)),
            Err(error) => {
                let reason: &'static str = error.into();
                lines.push(format!("FAILED {} at {at}: {reason}: {error}", shard.shard));
                failed.push(format!("{} ({reason})", shard.shard));
            }
        }
    }
    let verdict = (!failed.is_empty())
        .then(|| format!("the installation drill at {at} failed on {} shard(s): {}", failed.len(), failed.join(", ")));
    (lines, verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn installation(results: Vec<(&str, Result<&str, DrillError>)>) -> Installation {
        let shards = results
            .into_iter()
            .map(|(shard, result)| ShardResult { shard: shard.into(), result: result.map(String::from) })
            .collect();
        Installation { at: DateTime::parse_from_rfc3339("2026-12-01T12:00:00Z").unwrap().with_timezone(&Utc), shards }
    }

    #[test]
    fn every_shard_has_its_line_and_the_verdict_names_each_failed_shard_with_its_reason() {
        let passed = installation(vec![("root", Ok("read")), ("alpha", Ok("read"))]);
        let (lines, verdict) = summary(&passed);
        assert!(verdict.is_none());
        assert_eq!(lines, ["ok root at 2026-12-01T12:00:00.000Z: read", "ok alpha at 2026-12-01T12:00:00.000Z: read"]);

        let failed = installation(vec![
            ("root", Ok("read")),
            ("alpha", Err(DrillError::Kcp("object /clusters/x/y: 404 NotFound".into()))),
            ("beta", Err(DrillError::DeltaChainBroken("at 7".into()))),
        ]);
        let (lines, verdict) = summary(&failed);
        assert_eq!(
            lines[1],
            "FAILED alpha at 2026-12-01T12:00:00.000Z: kcp: kcp level: object /clusters/x/y: 404 NotFound"
        );
        assert_eq!(
            verdict.unwrap(),
            "the installation drill at 2026-12-01T12:00:00.000Z failed on 2 shard(s): alpha (kcp), beta (delta_chain_broken)"
        );
    }
}
