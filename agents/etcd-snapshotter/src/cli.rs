//! The one-shots for operators: `snapshot` (now), `list`, `verify ID`, `drill [ID]`, `restore` and `plan`,
//! beside the runtime's `run` and `rbac`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use kcp_keeper_runtime::config::load;
use kcp_keeper_runtime::logging::{self, LogFormat};
use kcp_keeper_runtime::shutdown::{Grace, stop_signal};
use tokio_util::sync::CancellationToken;

use crate::catalog;
use crate::config::{Config, KcpExpect};
use crate::delta::replay::{self, Point};
use crate::drill::run::{drill_and_record, summary};
use crate::error::SnapshotError;
use crate::generation;
use crate::metrics::Metrics;
use crate::restore::{self, MemberFlags};
use crate::secondary::StoreChoice;
use crate::snapshot;
use crate::storage::Store;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Take a snapshot of every shard (or those named) now; prints one line per snapshot.
    Snapshot {
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
        /// Only these shards (repeatable).
        #[arg(long)]
        shard: Vec<String>,
        /// How long to wait while another run (the daemon, another one-shot) holds a shard's lock, as a Go
        /// duration; `0s` refuses at once.
        #[arg(long, default_value = "30m", value_parser = parse_wait)]
        wait: std::time::Duration,
    },
    /// List published snapshots, newest revision first.
    List {
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
        #[arg(long)]
        shard: Option<String>,
        /// The store to list: `primary` (`storage`) or `secondary` (the `secondary` section's).
        #[arg(long, value_enum, default_value = "primary")]
        store: StoreChoice,
    },
    /// Download a snapshot and check both hashes and its structure (etcdutl snapshot status).
    Verify {
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
        /// `<shard>/<time>-r<revision>`, as `list` prints it.
        id: String,
        #[arg(long)]
        identity_file: Option<PathBuf>,
        #[arg(long, env = "ETCDUTL", default_value = "etcdutl")]
        etcdutl: PathBuf,
        /// The store to read: `primary` or `secondary`.
        #[arg(long, value_enum, default_value = "primary")]
        store: StoreChoice,
    },
    /// Restore drill: prove a snapshot restores (hashes, etcdutl restore, a throwaway etcd compared with the
    /// manifest, optionally a real kcp on it) and record the report beside its manifest. Exit 0 when it passed.
    Drill(DrillArgs),
    /// Download, verify and `etcdutl snapshot restore` a snapshot into a new member data directory.
    Restore(RestoreArgs),
    /// Plan a restore of every shard (or those named) to one point in time, from the bucket alone: per shard
    /// the snapshot, the deltas to replay, the time reached and the data lost. Exit 1 when a shard cannot reach
    /// the point, naming it and what it reaches.
    Plan(PlanArgs),
    /// Restore the whole installation to one point: the plan of `plan --at`, and with --yes kcp stopped through
    /// the kcp-operator's objects, every shard's running etcd given the point, kcp started root first, and the
    /// result proven through the front proxy. Interrupted, the same command carries it on.
    RestoreInstallation(crate::installation_restore::Args),
    /// One copy pass to the second store now (the daemon runs one every secondary.interval): copies and
    /// verifies what it lacks, applies its retention; one line per shard. Exit 1 when a shard is behind.
    SyncSecondary {
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
    },
}

/// Runs one one-shot; exit 0 when it did what it says, an error (exit 1) otherwise.
pub async fn run(command: Command) -> anyhow::Result<ExitCode> {
    // One-shots say what they skipped or cleaned (a member down, an abandoned upload) in plain text.
    let level = std::env::var("KCP_KEEPER_LOG_LEVEL").unwrap_or_else(|_| "warn".into());
    logging::init(&level, LogFormat::Plain)?;
    match command {
        Command::Snapshot { config, shard, wait } => snapshot(&config, &shard, wait).await,
        Command::List { config, shard, store } => list(&config, shard.as_deref(), store).await,
        Command::Verify { config, id, identity_file, etcdutl, store } => {
            verify(&config, &id, identity_file.as_deref(), &etcdutl, store).await
        }
        Command::SyncSecondary { config } => crate::secondary::sync_once(&config).await,
        Command::Drill(args) => drill(args).await,
        Command::Restore(args) => return restore(args).await,
        Command::Plan(args) => plan(args).await,
        Command::RestoreInstallation(args) => crate::installation_restore::run(args).await,
    }?;
    Ok(ExitCode::SUCCESS)
}

fn parse_wait(text: &str) -> Result<std::time::Duration, String> {
    kcp_keeper_runtime::duration::parse_go_duration(text).map_err(|_| "must be a Go duration like 10m or 0s".into())
}

fn open(config: &Path) -> anyhow::Result<(Config, Store)> {
    open_store(config, StoreChoice::Primary)
}

/// The configuration and the store `choice` names (`--store`).
fn open_store(config: &Path, choice: StoreChoice) -> anyhow::Result<(Config, Store)> {
    let config: Config = load(config)?;
    let store = crate::secondary::open(&config, choice)?;
    Ok((config, store))
}

/// A progress line on stderr, only on a terminal.
fn progress_line(received: u64, total: u64) {
    let percent = (received * 100).checked_div(total).unwrap_or(100);
    eprint!("\r  {:>4}%  {:>8.1} MiB of {:.1} MiB", percent, received as f64 / 1048576.0, total as f64 / 1048576.0);
}

/// A one-shot's Ctrl-C: the run in flight is dropped at once, then up to 30 s to abort its upload and release
/// the shard's lock.
const NO_GRACE: Grace = Grace { finish: std::time::Duration::ZERO, abort: std::time::Duration::from_secs(30) };

/// Takes one snapshot of each selected shard now, then applies retention as a scheduled tick does, each under
/// the shard's lock (waiting up to `wait` for a run in progress). Fails if any failed.
pub async fn snapshot(config: &Path, shards: &[String], wait: std::time::Duration) -> anyhow::Result<()> {
    let (config, store) = open(config)?;
    for name in shards {
        anyhow::ensure!(config.shards.iter().any(|s| &s.name == name), "no shard named {name:?} in the configuration");
    }
    let metrics = Metrics::default();
    let terminal = std::io::stderr().is_terminal();
    let mut failed = 0;
    // Ctrl-C aborts the upload in flight at once (no grace: the operator asked to stop) and releases the lock.
    let interrupted = CancellationToken::new();
    tokio::spawn({
        let interrupted = interrupted.clone();
        async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                interrupted.cancel();
            }
        }
    });
    for shard in config.shards.iter().filter(|s| shards.is_empty() || shards.contains(&s.name)) {
        let progress: Option<snapshot::Progress<'_>> = terminal.then_some(&progress_line);
        let name = shard.name.clone();
        let waiting = move |holder: &str| {
            eprintln!("shard {name}: another run holds the shard's lock: {holder}; waiting up to {wait:?}")
        };
        let run = snapshot::Run {
            tick: None,
            progress,
            command: "snapshot",
            lock_wait: wait,
            waiting: &waiting,
            kcp: None,
            roll: None,
        };
        let result = snapshot::take_until(&config, shard, &store, &metrics, run, &interrupted, NO_GRACE).await;
        if let Err(SnapshotError::Interrupted) = result {
            anyhow::bail!("interrupted: the upload in flight was aborted");
        }
        if terminal {
            eprintln!();
        }
        match result {
            Ok(snapshot::Taken { manifest: m, retention }) => {
                println!(
                    "{}\trevision {}\t{} keys\t{} bytes ({} in etcd)\t{:.1}s\tspilled {} bytes",
                    m.id,
                    m.revision_bounds(),
                    m.key_count,
                    m.object_size_bytes,
                    m.db_size_bytes,
                    m.total_seconds,
                    m.spilled_bytes
                );
                let report = retention?;
                println!(
                    "retention {}: kept {}, deleted {}, locked {}, other clusters {}",
                    shard.name,
                    report.kept,
                    report.deleted.len(),
                    report.locked.len(),
                    report.other_clusters
                );
                if report.other_clusters > 0 {
                    eprintln!(
                        "warning: shard {}: {} snapshot(s) of other etcd clusters under its directory (another \
                         installation, or this etcd before it was re-created): not used by latest, drills or \
                         retention, never deleted; `list` shows them",
                        shard.name, report.other_clusters
                    );
                }
            }
            Err(error) => {
                let reason: &'static str = (&error).into();
                eprintln!("error: shard {}: {reason}: {error}", shard.name);
                failed += 1;
            }
        }
    }
    anyhow::ensure!(failed == 0, "{failed} snapshot(s) failed");
    Ok(())
}

/// Prints every published snapshot, newest revision first, with the etcd cluster it was taken of: a snapshot of
/// another cluster than the one its shard's endpoints serve now is marked `(other)`.
pub async fn list(config: &Path, shard: Option<&str>, choice: StoreChoice) -> anyhow::Result<()> {
    let (config, store) = open_store(config, choice)?;
    let listed = catalog::list_with_drills(&store, shard).await?;
    let mut own = std::collections::HashMap::new();
    for configured in config.shards.iter().filter(|s| shard.is_none_or(|name| name == s.name)) {
        if let Some(live) = generation::live(configured).await {
            own.insert(configured.name.clone(), live);
        }
    }
    println!(
        "{:<40} {:<10} {:<20} {:>12} {:>8} {:>12} {:<24} VERIFIED",
        "ID", "SHARD", "TIME", "REVISION", "KEYS", "SIZE", "CLUSTER"
    );
    for catalog::Listed { manifest: m, report, verified_at } in listed {
        // Verified only by a passing report that proves this manifest and object; a failed drill says why.
        let verified = match (verified_at, report) {
            (Some(t), _) => t.format("%Y-%m-%dT%H:%MZ").to_string(),
            (None, Some(r)) if !r.passed => {
                format!("no (drill failed: {})", r.failure.map(|f| f.reason).unwrap_or_default())
            }
            (None, Some(_)) => "no (report does not match the manifest)".into(),
            (None, None) => "no".into(),
        };
        let cluster = match own.get(&m.shard) {
            Some(own) if !own.owns(&m) => format!("{} (other)", generation::cluster_of(&m)),
            _ => generation::cluster_of(&m).to_string(),
        };
        println!(
            "{:<40} {:<10} {:<20} {:>12} {:>8} {:>12} {:<24} {}",
            m.id,
            m.shard,
            m.started_at.format("%Y-%m-%dT%H:%M:%SZ"),
            m.revision_bounds(),
            m.key_count,
            m.object_size_bytes,
            cluster,
            verified
        );
        // A snapshot before a kcp upgrade says which kcp it was taken under, on a line of its own.
        if let Some(kcp) = &m.kcp {
            println!("  {}", kcp.describe());
        }
    }
    Ok(())
}

/// The cluster the configured shard `name` serves now (`None`: not configured, or its etcd does not answer).
async fn live_cluster(config: &Config, name: Option<&str>) -> Option<generation::Own> {
    let shard = config.shards.iter().find(|s| Some(s.name.as_str()) == name)?;
    generation::live(shard).await
}

fn identities(path: Option<&Path>) -> anyhow::Result<Option<Vec<crate::encode::Identity>>> {
    path.map(restore::read_identities).transpose()
}

/// A scratch directory for a download: inside the spill directory, which is sized for snapshots.
fn scratch(config: &Config) -> anyhow::Result<tempfile::TempDir> {
    std::fs::create_dir_all(&config.spill.directory).context("creating the spill directory")?;
    Ok(tempfile::Builder::new().prefix("fetch-").tempdir_in(&config.spill.directory)?)
}

/// Downloads `id` and proves it: the object's sha256, etcd's trailing sha256, and etcdutl reading the
/// database at the manifest's revision.
pub async fn verify(
    config: &Path,
    id: &str,
    identity_file: Option<&Path>,
    etcdutl: &Path,
    choice: StoreChoice,
) -> anyhow::Result<()> {
    let (config, store) = open_store(config, choice)?;
    let manifest = catalog::find(&store, None, id, None).await?;
    let dir = scratch(&config)?;
    let (fetched, status) =
        restore::fetch_proven(&store, manifest, identities(identity_file)?, dir.path(), etcdutl).await?;
    println!(
        "ok {}: object sha256 and etcd's sha256 match the manifest; etcdutl reads revision {} ({} bytes)",
        fetched.manifest.id, status.revision, status.total_size
    );
    Ok(())
}

#[derive(Debug, Clone, clap::Args)]
pub struct RestoreArgs {
    #[arg(long, env = "KCP_KEEPER_CONFIG")]
    pub config: PathBuf,
    /// A snapshot id (`<shard>/<time>-r<revision>`) or `latest` (then --shard is required).
    #[arg(long, default_value = "latest")]
    pub id: String,
    /// The shard whose latest snapshot to restore.
    #[arg(long)]
    pub shard: Option<String>,
    /// age identity file for encrypted snapshots.
    #[arg(long)]
    pub identity_file: Option<PathBuf>,
    #[arg(long, env = "ETCDUTL", default_value = "etcdutl")]
    pub etcdutl: PathBuf,
    /// A point in time: `latest` (everything stored), a revision, or an RFC 3339 time. The newest full snapshot
    /// at or before it, then its deltas replayed up to it, each verified; needs --shard. A broken delta chain
    /// restores up to its last good revision and exits 2, saying where it broke.
    #[arg(long, value_parser = parse_point)]
    pub at: Option<Point>,
    /// etcd binary for the scratch member the deltas are replayed into (default: the configuration's
    /// drills.etcd).
    #[arg(long, env = "ETCD")]
    pub etcd: Option<PathBuf>,
    #[command(flatten)]
    pub member: MemberFlags,
    /// The store to restore from: `primary` or `secondary` (which needs nothing of the primary).
    #[arg(long, value_enum, default_value = "primary")]
    pub store: StoreChoice,
}

fn parse_point(text: &str) -> Result<Point, String> {
    text.parse()
}

/// Exit code of a point-in-time restore that stopped at a broken delta chain.
pub const EXIT_CHAIN_BROKEN: u8 = 2;

/// Downloads, proves and restores a snapshot into a new member data directory; prints the next steps. With
/// `--at`, a point in time (see [`replay`]); exit 2 when its delta chain broke before the point.
pub async fn restore(args: RestoreArgs) -> anyhow::Result<ExitCode> {
    let (config, store) = open_store(&args.config, args.store)?;
    anyhow::ensure!(args.id != "latest" || args.shard.is_some(), "--id latest needs --shard");
    // `latest` of the shard's own cluster (as its etcd serves it now, if it answers).
    let own = live_cluster(&config, args.shard.as_deref()).await;
    if let Some(point) = args.at {
        anyhow::ensure!(args.id == "latest", "--at chooses the snapshot itself: give --shard, not --id");
        let shard = args.shard.as_deref().expect("checked above");
        let base = replay::base(&store, shard, own.as_ref(), point).await?;
        let etcd = args.etcd.clone().unwrap_or_else(|| config.drills.etcd.clone());
        let tools = replay::Tools {
            etcdutl: &args.etcdutl,
            etcd: &etcd,
            scratch_root: &config.drills.directory,
            identity_file: args.identity_file.as_deref(),
            signing: config.delta_key.as_ref(),
        };
        let outcome = replay::restore_at(&store, base.clone(), point, tools, &args.member).await?;
        print!("{}", replay::summary(&outcome, point));
        if let Some(kcp) = &base.kcp {
            println!("taken under {}", kcp.describe());
        }
        print!("{}", restore::next_steps(&base, &args.member));
        if let Some(broken) = &outcome.broken {
            eprintln!("error: {broken}; restored up to revision {} only", outcome.revision);
            return Ok(ExitCode::from(EXIT_CHAIN_BROKEN));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let manifest = catalog::find(&store, args.shard.as_deref(), &args.id, own.as_ref()).await?;
    let dir = scratch(&config)?;
    let identities = identities(args.identity_file.as_deref())?;
    let (fetched, _) = restore::fetch_proven(&store, manifest, identities, dir.path(), &args.etcdutl).await?;
    restore::restore_member(&args.etcdutl, &fetched.db, &args.member).await?;
    if let Some(kcp) = &fetched.manifest.kcp {
        println!("{} was taken under {}", fetched.manifest.id, kcp.describe());
    }
    print!("{}", restore::next_steps(&fetched.manifest, &args.member));
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Clone, clap::Args)]
pub struct PlanArgs {
    #[arg(long, env = "KCP_KEEPER_CONFIG")]
    pub config: PathBuf,
    /// The point: an RFC 3339 time, or `latest-consistent` (the newest time every shard reaches).
    #[arg(long, value_parser = parse_plan_point)]
    pub at: crate::plan::At,
    /// Only these shards (repeatable; default: every configured shard).
    #[arg(long)]
    pub shard: Vec<String>,
    /// age identity file for encrypted deltas (default: the configuration's drills.identityFile).
    #[arg(long)]
    pub identity_file: Option<PathBuf>,
    /// `text` or `json`.
    #[arg(short, long, value_enum, default_value = "text")]
    pub output: Output,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

fn parse_plan_point(text: &str) -> Result<crate::plan::At, String> {
    text.parse()
}

/// Prints the plan of a restore of the shards to one point (see [`crate::plan`]); fails naming every shard
/// that cannot reach it.
pub async fn plan(args: PlanArgs) -> anyhow::Result<()> {
    let (config, store) = open(&args.config)?;
    for name in &args.shard {
        anyhow::ensure!(config.shards.iter().any(|s| &s.name == name), "no shard named {name:?} in the configuration");
    }
    let shards: Vec<String> = config
        .shards
        .iter()
        .filter(|s| args.shard.is_empty() || args.shard.contains(&s.name))
        .map(|s| s.name.clone())
        .collect();
    let identities = identities(args.identity_file.as_deref().or(config.drills.identity_file.as_deref()))?;
    let keys = (identities.as_deref(), config.delta_key.as_ref());
    let plan = crate::plan::plan(&store, &shards, args.at, keys).await?;
    match args.output {
        Output::Text => print!("{}", crate::plan::text(&plan)),
        Output::Json => println!("{}", serde_json::to_string_pretty(&plan)?),
    }
    Ok(())
}

#[derive(Debug, Clone, clap::Args)]
pub struct DrillArgs {
    #[arg(long, env = "KCP_KEEPER_CONFIG")]
    pub config: PathBuf,
    /// A snapshot id (`<shard>/<time>-r<revision>`, as `list` prints it); without one, the newest snapshot of
    /// every shard (or of --shard).
    pub id: Option<String>,
    #[arg(long)]
    pub shard: Option<String>,
    #[command(flatten)]
    pub tools: restore::ToolFlags,
    /// kcp binary for the kcp level (default: the configuration's drills.kcp). The level runs for shards whose
    /// drill has `kcp` (reading what it names); given here, it runs for every drilled shard (`/readyz` alone where
    /// the configuration names nothing).
    #[arg(long, env = "KCP")]
    pub kcp: Option<PathBuf>,
    /// Drill the whole installation at one point (--at): every configured shard restored to it (its snapshot and
    /// deltas, as `plan --at` names them) on a throwaway etcd of its own, a real kcp on each (the shard named
    /// `root` as the root shard, every other wired to it), each shard's `drill.kcp` read through it. Needs a kcp
    /// binary (--kcp or drills.kcp); writes no report. Exit 1 naming every shard that failed.
    #[arg(long, requires = "at", conflicts_with_all = ["id", "shard"])]
    pub installation: bool,
    /// The point of --installation: an RFC 3339 time, or `latest-consistent` (the newest time every shard reaches).
    #[arg(long, value_parser = parse_plan_point, requires = "installation")]
    pub at: Option<crate::plan::At>,
}

/// Drills the snapshot named (or each shard's newest), writes each report beside its manifest, prints one
/// line per drill. Fails (exit 1) if any drill failed, naming the failure; SIGTERM or Ctrl-C stop the drill in
/// flight and clean up its processes and directory first.
pub async fn drill(args: DrillArgs) -> anyhow::Result<()> {
    let (config, store) = open(&args.config)?;
    let mut drills = args.tools.over(&config.drills);
    let kcp_everywhere = args.kcp.is_some();
    drills.kcp = args.kcp.or(drills.kcp);
    if let Some(at) = args.installation.then_some(args.at).flatten() {
        return drill_installation(&config, &store, &drills, at).await;
    }
    let readyz_only = KcpExpect::default();
    if let Some(name) = &args.shard {
        anyhow::ensure!(config.shards.iter().any(|s| &s.name == name), "no shard named {name:?} in the configuration");
    }
    let ids = match &args.id {
        Some(id) => vec![id.clone()],
        None => {
            let mut ids = Vec::new();
            for shard in config.shards.iter().filter(|s| args.shard.as_ref().is_none_or(|n| n == &s.name)) {
                let all = catalog::list(&store, Some(&shard.name)).await?;
                // The newest of the shard's own cluster (as its etcd serves it now, else the only one).
                let own: Vec<_> = match generation::live(shard).await {
                    Some(own) => all.into_iter().filter(|m| own.owns(m)).collect(),
                    None => {
                        generation::only_cluster(&all).map_err(|e| anyhow::anyhow!("shard {}: {e}", shard.name))?;
                        all
                    }
                };
                match own.first() {
                    Some(newest) => ids.push(newest.id.clone()),
                    None => eprintln!("shard {}: no published snapshot to drill", shard.name),
                }
            }
            anyhow::ensure!(!ids.is_empty(), "no published snapshot to drill");
            ids
        }
    };
    let mut failed = Vec::new();
    for id in ids {
        let shard = id.split('/').next().unwrap_or_default();
        let configured = config.shards.iter().find(|s| s.name == shard).and_then(|s| s.drill.as_ref()?.kcp.as_ref());
        let kcp = configured.or(kcp_everywhere.then_some(&readyz_only));
        let run = drill_and_record(&drills, kcp, &store, &id);
        let outcome = tokio::select! {
            outcome = run => outcome,
            signal = stop_signal() => {
                // The drill's future is dropped here: its Scratch kills its processes and removes its directory.
                anyhow::bail!("interrupted by {signal}: the drill of {id} was stopped and cleaned up (no report written)");
            }
        };
        let line = summary(&outcome);
        match outcome.result {
            Ok(()) => println!("{line}"),
            Err(error) => {
                eprintln!("{line}");
                let reason: &'static str = (&error).into();
                failed.push(format!("{id} ({reason})"));
            }
        }
    }
    anyhow::ensure!(failed.is_empty(), "{} drill(s) failed: {}", failed.len(), failed.join(", "));
    Ok(())
}

/// `drill --installation --at`: every shard at one point, with kcp on each (see [`crate::drill::installation`]);
/// one line per shard. SIGTERM or Ctrl-C stop it and clean up every shard's processes and directory first.
async fn drill_installation(
    config: &Config,
    store: &Store,
    drills: &crate::config::Drills,
    at: crate::plan::At,
) -> anyhow::Result<()> {
    use crate::drill::installation;
    let kcp = drills.kcp.as_deref().context("the installation drill needs a kcp binary: --kcp or drills.kcp")?;
    let tools = installation::Tools {
        etcdutl: &drills.etcdutl,
        etcd: &drills.etcd,
        kcp: Some(kcp),
        scratch_root: &drills.directory,
        identity_file: drills.identity_file.as_deref(),
        signing: config.delta_key.as_ref(),
    };
    let run = tokio::time::timeout(drills.timeout, installation::drill(store, config, at, &tools));
    let drilled = tokio::select! {
        drilled = run => drilled,
        signal = stop_signal() => {
            // The drill's future is dropped here: every shard's Scratch kills its processes and removes its directory.
            anyhow::bail!("interrupted by {signal}: the installation drill was stopped and cleaned up");
        }
    };
    let installation = drilled
        .map_err(|_| anyhow::anyhow!("timeout: the installation drill did not finish within {:?}", drills.timeout))??;
    let (lines, verdict) = installation::summary(&installation);
    for line in lines {
        if line.starts_with("ok ") { println!("{line}") } else { eprintln!("{line}") }
    }
    match verdict {
        Some(verdict) => anyhow::bail!(verdict),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_boolean_environment_variable_takes_1_0_true_false_yes_no() {
        let command = kcp_keeper_runtime::cli::command::<crate::EtcdSnapshotter>();
        let checked = kcp_keeper_runtime::args::boolean_env::check(&command).unwrap();
        assert!(checked.iter().any(|c| c == "KCP_KEEPER_LEADER_ELECTION"), "{checked:?}");
    }
}
