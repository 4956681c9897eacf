//! `restore-installation`: the whole kcp installation back to one point in time. The plan is `plan --at`'s (every
//! shard's snapshot and deltas to a time every shard reaches); carrying it out, with `--yes`:
//!
//! 1. **Stop** kcp through the kcp-operator's objects ([`operator`]): the front proxies, the Shards and the RootShard
//!    (and its proxy) scaled to 0 by `spec.replicas`, after the replicas each asked for are recorded.
//! 2. **Restore** every shard: its point rebuilt in a throwaway etcd (the snapshot proven, the deltas replayed, as
//!    the installation drill does), then written into the shard's running etcd cluster through the etcd API
//!    ([`crate::restore::live`]): every key replaced in one pass, the replaced history compacted. The members,
//!    their volumes and the cluster's identity stay; revisions only grow, so a client holding a newer one relists.
//! 3. **Start** kcp in the order it needs: the root shard, then the Shards, then the front proxies, each waited
//!    for until its pods are Ready.
//! 4. **Prove** it through kcp (the front proxy, with `--kcp-kubeconfig`): in every logical cluster that existed at
//!    the point, exactly the workspaces it held then, none created after it, and each workspace's logical cluster
//!    reachable on whichever shard it lives.
//!
//! Every step is recorded in the bucket (`<prefix>/installation-restore.json`) before the next begins, so an
//! interrupted restore (SIGTERM, a failure, the machine restarting) is carried on by running the command again:
//! it resumes at the recorded step with the recorded point and replicas. A shard's etcd whose replacement did not
//! finish carries a marker key, and the command names it until it is done.

pub mod operator;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use kcp_keeper_runtime::shutdown::stop_signal;

use crate::clock::stamp;
use crate::config::{Config, ROOT_SHARD};
use crate::drill::installation::{self as drill_installation, Tools};
use crate::plan::{self, At};
use crate::restore::live::{self, Marker};
use crate::storage::Store;
use operator::{Installation, Kind, Saved};

const FORMAT_VERSION: u32 = 1;
/// How long kcp gets to stop, and each kind of object to start.
const STOP_WAIT: Duration = Duration::from_secs(10 * 60);
const START_WAIT: Duration = Duration::from_secs(15 * 60);

/// `restore-installation`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[arg(long, env = "KCP_KEEPER_CONFIG")]
    pub config: PathBuf,
    /// The installation's RootShard, `<namespace>/<name>`: it, and the Shards and FrontProxies in its namespace
    /// that name it, are stopped and started. The configuration's shard `root` is the RootShard's etcd; every
    /// other shard is the Shard of its name.
    #[arg(long)]
    pub root_shard: String,
    /// The point: an RFC 3339 time, or `latest-consistent` (the newest time every shard reaches). Needed to start
    /// a restore; a run that resumes one takes the recorded point (and refuses another).
    #[arg(long, value_parser = parse_at)]
    pub at: Option<At>,
    /// Carry the plan out. Without it the plan and what would be stopped are printed, and nothing changes.
    #[arg(long)]
    pub yes: bool,
    /// A kubeconfig for kcp through the front proxy (an admin's, such as the one kubeconfig-rotator publishes):
    /// the proof reads the workspaces through it. Needed with --yes.
    #[arg(long, required_if_eq("yes", "true"))]
    pub kcp_kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    pub tools: crate::restore::ToolFlags,
}

fn parse_at(text: &str) -> Result<At, String> {
    text.parse()
}

/// Where a restore is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Step {
    Stopping,
    Restoring,
    Starting,
    Proving,
    Done,
}

/// One shard of a restore: its plan, and once its etcd holds the point, what the proof expects of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardRecord {
    pub shard: String,
    pub snapshot: String,
    pub revision: u64,
    /// Set once the shard's running etcd holds the point: the workspaces it held then, `<cluster>/<name>`, and
    /// the logical clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<Held>,
}

/// What a shard held at the point, read from its restored etcd.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Held {
    pub workspaces: Vec<String>,
    pub logical_clusters: Vec<String>,
    pub keys: u64,
}

/// The restore's record in the bucket.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Record {
    pub format_version: u32,
    pub id: String,
    pub at: DateTime<Utc>,
    pub root_shard: String,
    pub step: Step,
    /// The replicas every object asked for before the restore, recorded before any was changed.
    pub objects: Vec<Saved>,
    pub shards: Vec<ShardRecord>,
    pub updated_at: DateTime<Utc>,
}

fn record_key(store: &Store) -> String {
    format!("{}installation-restore.json", crate::manifest::root(&store.prefix))
}

async fn read_record(store: &Store) -> anyhow::Result<Option<Record>> {
    let Some(stored) = store.get_versioned(&record_key(store)).await? else { return Ok(None) };
    let record: Record = serde_json::from_slice(&stored.body)
        .with_context(|| format!("the installation restore's record {} is unreadable", record_key(store)))?;
    Ok(Some(record))
}

async fn save(store: &Store, record: &mut Record, step: Step) -> anyhow::Result<()> {
    record.step = step;
    record.updated_at = crate::clock::now();
    let body = serde_json::to_vec_pretty(record)?;
    store.put(&record_key(store), body).await.context("recording the installation restore's step in the bucket")?;
    Ok(())
}

/// Runs `restore-installation` (see the module).
pub async fn run(args: Args) -> anyhow::Result<()> {
    let config: Config = kcp_keeper_runtime::config::load(&args.config)?;
    let store = Store::new(&config.storage)?;
    store.reachable().await?;
    let (namespace, root_name) =
        args.root_shard.split_once('/').context("--root-shard is <namespace>/<name>, e.g. kcp-system/root")?;
    let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
    let installation = operator::discover(&client, namespace, root_name).await?;
    check_shards(&config, &installation)?;

    let mut record = match read_record(&store).await? {
        Some(record) if record.step != Step::Done => {
            if let Some(At::Time(t)) = args.at
                && t != record.at
            {
                anyhow::bail!(
                    "restore {} to {} is not finished (step {:?}): run again with --at {} (or without --at) to carry \
                     it on; a restore to another point starts only once it is done",
                    record.id,
                    stamp(record.at),
                    record.step,
                    stamp(record.at)
                );
            }
            println!("resuming restore {} to {} at step {:?}", record.id, stamp(record.at), record.step);
            record
        }
        _ => {
            let at = args.at.context("--at is needed to start a restore")?;
            let names = shard_names(&config);
            let keys = keys(&args, &config)?;
            let plan = plan::plan(&store, &names, at, (keys.as_deref(), config.delta_key.as_ref())).await?;
            print!("{}", plan::text(&plan));
            for saved in &installation.objects {
                println!("stop and start {}", saved.describe());
            }
            if !args.yes {
                println!("nothing changed: run again with --yes to carry this out");
                return Ok(());
            }
            for shard_plan in &plan.shards {
                let configured = config.shards.iter().find(|s| s.name == shard_plan.shard).context("planned")?;
                let mut live = connect_live(configured)
                    .await
                    .with_context(|| format!("shard {}: its running etcd; nothing was changed", shard_plan.shard))?;
                same_identity_lower_revision(&store, shard_plan, &mut live)
                    .await
                    .with_context(|| format!("shard {}: nothing was changed", shard_plan.shard))?;
            }
            let now = crate::clock::now();
            Record {
                format_version: FORMAT_VERSION,
                id: format!("restore-{}", now.format("%Y%m%dT%H%M%SZ")),
                at: plan.at,
                root_shard: args.root_shard.clone(),
                step: Step::Stopping,
                objects: installation.objects.clone(),
                shards: plan
                    .shards
                    .iter()
                    .map(|s| ShardRecord {
                        shard: s.shard.clone(),
                        snapshot: s.snapshot.clone(),
                        revision: s.revision,
                        restored: None,
                    })
                    .collect(),
                updated_at: now,
            }
        }
    };
    anyhow::ensure!(args.yes, "restore {} is not finished: run again with --yes to carry it on", record.id);
    let kcp_kubeconfig = args.kcp_kubeconfig.clone().context("--kcp-kubeconfig is needed with --yes")?;
    let kcp = kcp_client(&kcp_kubeconfig).await?;
    if record.step == Step::Stopping {
        // The proof's client must work before anything is stopped.
        list_names(&kcp, &format!("/clusters/{ROOT_SHARD}/apis/tenancy.kcp.io/v1alpha1/workspaces"))
            .await
            .context("kcp did not answer through --kcp-kubeconfig; nothing was changed")?;
    }
    // The replicas given back are the recorded ones: after a stop, the objects say 0.
    let installation = Installation { objects: record.objects.clone(), ..installation };
    let carried = tokio::select! {
        result = carry_out(&args, &config, &store, &installation, &mut record, &kcp) => result,
        signal = stop_signal() => Err(anyhow::anyhow!("interrupted by {signal}")),
    };
    if let Err(error) = carried {
        let half = half_restored(&config, &record).await;
        anyhow::bail!(
            "restore {} stopped at step {:?}: {error:#}{half}; run the same command again to carry it on",
            record.id,
            record.step
        );
    }
    println!("restore {} done: every shard is at {}, proven through kcp", record.id, stamp(record.at));
    Ok(())
}

/// Every Shard object must be a configured shard (and the root shard configured): a shard left out would keep
/// another time than the rest.
fn check_shards(config: &Config, installation: &Installation) -> anyhow::Result<()> {
    let configured: Vec<&str> = config.shards.iter().map(|s| s.name.as_str()).collect();
    anyhow::ensure!(configured.contains(&ROOT_SHARD), "no shard named {ROOT_SHARD:?} in the configuration");
    let missing: Vec<&str> = installation.shard_names().into_iter().filter(|n| !configured.contains(n)).collect();
    anyhow::ensure!(
        missing.is_empty(),
        "Shard(s) {} of the installation are not in the configuration: every shard must go back to the point",
        missing.join(", ")
    );
    Ok(())
}

fn shard_names(config: &Config) -> Vec<String> {
    let mut names: Vec<String> = config.shards.iter().map(|s| s.name.clone()).collect();
    names.sort_by_key(|n| n != ROOT_SHARD);
    names
}

fn keys(args: &Args, config: &Config) -> anyhow::Result<Option<Vec<crate::encode::Identity>>> {
    let drills = args.tools.over(&config.drills);
    drills.identity_file.as_deref().map(crate::restore::read_identities).transpose()
}

/// The steps from the recorded one on, each recorded before the next.
async fn carry_out(
    args: &Args,
    config: &Config,
    store: &Store,
    installation: &Installation,
    record: &mut Record,
    kcp: &kube::Client,
) -> anyhow::Result<()> {
    if record.step == Step::Stopping {
        save(store, record, Step::Stopping).await?;
        println!("stopping kcp through the operator's objects");
        installation.stop(STOP_WAIT).await?;
        save(store, record, Step::Restoring).await?;
    }
    if record.step == Step::Restoring {
        restore_shards(args, config, store, record).await?;
        save(store, record, Step::Starting).await?;
    }
    if record.step == Step::Starting {
        for kind in [Kind::RootShard, Kind::Shard, Kind::FrontProxy] {
            println!("starting the {kind:?} objects");
            installation.start(kind, START_WAIT).await?;
        }
        save(store, record, Step::Proving).await?;
    }
    if record.step == Step::Proving {
        // A kubeconfig in a file (a mounted Secret a rotator renews) is read again: its credentials may have been
        // renewed while kcp was down. One read from stdin is what there is.
        let renewed = match args.kcp_kubeconfig.as_deref() {
            Some(path) if path != std::path::Path::new("-") => Some(kcp_client(path).await?),
            _ => None,
        };
        let proven = prove(renewed.as_ref().unwrap_or(kcp), record).await?;
        println!("{proven}");
        save(store, record, Step::Done).await?;
    }
    Ok(())
}

/// Every shard not yet restored: its point rebuilt in a throwaway etcd, what it held read, then written into
/// its running etcd.
async fn restore_shards(args: &Args, config: &Config, store: &Store, record: &mut Record) -> anyhow::Result<()> {
    let drills = args.tools.over(&config.drills);
    let tools = Tools {
        etcdutl: &drills.etcdutl,
        etcd: &drills.etcd,
        kcp: None,
        scratch_root: &drills.directory,
        identity_file: drills.identity_file.as_deref(),
        signing: config.delta_key.as_ref(),
    };
    let identities = keys(args, config)?;
    let names: Vec<String> = record.shards.iter().filter(|s| s.restored.is_none()).map(|s| s.shard.clone()).collect();
    if names.is_empty() {
        return Ok(());
    }
    // The plan again, at the recorded point: the same snapshots and deltas (the bucket only grows behind it).
    let plan =
        plan::plan(store, &names, At::Time(record.at), (identities.as_deref(), config.delta_key.as_ref())).await?;
    for shard_plan in plan.shards {
        let shard = shard_plan.shard.clone();
        let configured = config.shards.iter().find(|s| s.name == shard).context("a planned shard is configured")?;
        println!("shard {shard}: rebuilding {} up to revision {}", shard_plan.snapshot, shard_plan.revision);
        let mut live = connect_live(configured).await.with_context(|| format!("shard {shard}: its running etcd"))?;
        same_identity_lower_revision(store, &shard_plan, &mut live).await.with_context(|| format!("shard {shard}"))?;
        let restored = drill_installation::restore_shard(
            store,
            shard_plan,
            record.at,
            &tools,
            (identities.as_deref(), config.delta_key.as_ref()),
        )
        .await
        .map_err(|e| anyhow::anyhow!("shard {shard}: {e}"))?;
        let mut source = crate::member::connect(&restored.etcd_url, None).await?;
        let held = held(&mut source).await.with_context(|| format!("shard {shard}: reading what it held"))?;
        let marker = Marker { restore: record.id.clone(), shard: shard.clone(), at: stamp(record.at) };
        let copied = live::replace_keyspace(&mut source, &mut live, &marker)
            .await
            .with_context(|| format!("shard {shard}: writing the point into its running etcd"))?;
        if let Some(earlier) = &copied.interrupted {
            println!("shard {shard}: finished the replacement {} had left half done", earlier.restore);
        }
        println!(
            "shard {shard}: its etcd holds the point: {} keys ({} bytes, {} leases), revision {} -> {}",
            copied.keys, copied.bytes, copied.leases, copied.source_revision, copied.live_revision
        );
        let entry = record.shards.iter_mut().find(|s| s.shard == shard).context("the shard is recorded")?;
        entry.restored = Some(Held { keys: copied.keys, ..held });
        save(store, record, Step::Restoring).await?;
    }
    Ok(())
}

/// Refuses a running cluster with the identity of the snapshot's but a revision below the point's: an etcd
/// re-created from empty volumes with the same members and token gets the same cluster id, and its revisions
/// start again at 1. Written into by the API, it would stay below the snapshots already stored for that id, which
/// then order (and keep) before anything it takes. Such a cluster is restored with `restore` (etcdutl, which
/// bumps the revision) as the runbook says, or re-created under another `--initial-cluster-token`.
async fn same_identity_lower_revision(
    store: &Store,
    plan: &plan::ShardPlan,
    live: &mut etcd_client::Client,
) -> anyhow::Result<()> {
    let manifest = crate::drill::run::read_target(store, &plan.snapshot).await?.manifest;
    let own = crate::generation::of_member(live).await?;
    let revision = crate::member::revision(live).await?;
    anyhow::ensure!(
        manifest.cluster_id.as_deref() != Some(own.cluster_id.as_str()) || revision as u64 >= plan.revision,
        "its running etcd is cluster {} at revision {revision}, the snapshot's cluster, but below the point's revision \
         {}: it was re-created from empty volumes under the same identity. Restore each member with `restore` \
         (which bumps the revision), or re-create the cluster under another --initial-cluster-token, then run again",
        own.cluster_id,
        plan.revision
    );
    Ok(())
}

/// A client of the shard's running cluster, through the first configured endpoint that answers with a leader.
async fn connect_live(shard: &crate::config::Shard) -> anyhow::Result<etcd_client::Client> {
    let mut errors = Vec::new();
    for endpoint in &shard.endpoints {
        match crate::member::connect_led(endpoint, shard.tls.as_ref()).await {
            Ok(mut client) => match client.status().await {
                Ok(_) => return Ok(client),
                Err(e) => errors.push(format!("{endpoint}: {e}")),
            },
            Err(e) => errors.push(format!("{endpoint}: {e:#}")),
        }
    }
    anyhow::bail!("no member answered: {}", errors.join("; "))
}

const WORKSPACES: &str = "/registry/tenancy.kcp.io/workspaces/";
const LOGICAL_CLUSTERS: &str = "/registry/core.kcp.io/logicalclusters/";

/// The workspaces (`<cluster>/<name>`) and logical clusters a restored shard holds, from its keys.
async fn held(source: &mut etcd_client::Client) -> anyhow::Result<Held> {
    let mut out = Held::default();
    for (prefix, into) in [(WORKSPACES, &mut out.workspaces), (LOGICAL_CLUSTERS, &mut out.logical_clusters)] {
        let options = etcd_client::GetOptions::new().with_prefix().with_keys_only();
        let response = source.get(prefix, Some(options)).await?;
        for kv in response.kvs() {
            let key = String::from_utf8_lossy(kv.key());
            if let Some(found) = key.strip_prefix(prefix).and_then(|rest| cluster_and_name(rest, prefix == WORKSPACES))
            {
                into.push(found);
            }
        }
        into.sort();
        into.dedup();
    }
    Ok(out)
}

/// `[<segment>/]<cluster>/<name>` (kcp's key layout: a segment for resources served from an export): the
/// workspace as `<cluster>/<name>`, or the logical cluster's name.
fn cluster_and_name(rest: &str, workspace: bool) -> Option<String> {
    let parts: Vec<&str> = rest.split('/').collect();
    let (cluster, name) = match parts.as_slice() {
        [cluster, name] | [_, cluster, name] => (*cluster, *name),
        _ => return None,
    };
    Some(if workspace { format!("{cluster}/{name}") } else { cluster.to_string() })
}

/// Through kcp: in every logical cluster at the point exactly its workspaces then, and each workspace's own
/// logical cluster served.
async fn prove(client: &kube::Client, record: &Record) -> anyhow::Result<String> {
    let held: Vec<&Held> = record.shards.iter().filter_map(|s| s.restored.as_ref()).collect();
    // kcp's own `system:` clusters are not served through the front proxy.
    let mut clusters: Vec<&str> = held
        .iter()
        .flat_map(|h| h.logical_clusters.iter().map(String::as_str))
        .filter(|c| !c.starts_with("system:"))
        .collect();
    clusters.sort_unstable();
    clusters.dedup();
    let expected = |cluster: &str| -> Vec<String> {
        let mut names: Vec<String> = held
            .iter()
            .flat_map(|h| h.workspaces.iter())
            .filter_map(|w| w.split_once('/').filter(|(c, _)| *c == cluster).map(|(_, n)| n.to_string()))
            .collect();
        names.sort();
        names
    };
    let deadline = tokio::time::Instant::now() + START_WAIT;
    let mut checked = 0;
    for cluster in &clusters {
        let want = expected(cluster);
        let path = format!("/clusters/{cluster}/apis/tenancy.kcp.io/v1alpha1/workspaces");
        // kcp's controllers start up to a minute after /readyz (their Lease names a holder gone with the restore),
        // and the front proxy learns each shard's clusters after its own start: asked again until the deadline.
        let found = loop {
            match list_names(client, &path).await {
                Ok(found) if found == want => break found,
                result if tokio::time::Instant::now() >= deadline => {
                    anyhow::bail!("through kcp, {path} holds {result:?}; at the point it held {want:?}")
                }
                _ => tokio::time::sleep(Duration::from_secs(2)).await,
            }
        };
        checked += found.len();
    }
    Ok(format!(
        "proven through kcp: {} logical cluster(s) hold exactly their {checked} workspace(s) at {}",
        clusters.len(),
        stamp(record.at)
    ))
}

/// A client of kcp from the kubeconfig at `path` (`-`: read from stdin, so none is left in a file), at its
/// server's origin: requests name their `/clusters/<cluster>` path themselves, whatever workspace the
/// kubeconfig's server URL points into.
async fn kcp_client(path: &std::path::Path) -> anyhow::Result<kube::Client> {
    let text = if path == std::path::Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("reading --kcp-kubeconfig from stdin")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading --kcp-kubeconfig {}", path.display()))?
    };
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).context("--kcp-kubeconfig is no kubeconfig")?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .context("--kcp-kubeconfig names no usable context")?;
    let origin = {
        let parts = config.cluster_url.clone().into_parts();
        let mut origin = http::uri::Builder::new();
        if let Some(scheme) = parts.scheme {
            origin = origin.scheme(scheme);
        }
        if let Some(authority) = parts.authority {
            origin = origin.authority(authority);
        }
        origin.path_and_query("/").build().context("--kcp-kubeconfig's server")?
    };
    config.cluster_url = origin;
    Ok(kube::Client::try_from(config)?)
}

async fn list_names(client: &kube::Client, path: &str) -> anyhow::Result<Vec<String>> {
    let request = http::Request::get(path).body(Vec::new())?;
    let listed: serde_json::Value = client.request(request).await?;
    let mut names: Vec<String> = listed["items"]
        .as_array()
        .context("a list without items")?
        .iter()
        .filter_map(|item| item["metadata"]["name"].as_str().map(String::from))
        .collect();
    names.sort();
    Ok(names)
}

/// The shards whose running etcd carries a replacement's marker: `; shard x's etcd is half restored (...)`.
async fn half_restored(config: &Config, record: &Record) -> String {
    let mut half = Vec::new();
    for shard in &record.shards {
        let Some(configured) = config.shards.iter().find(|s| s.name == shard.shard) else { continue };
        let Ok(mut live) = connect_live(configured).await else { continue };
        if let Ok(Some(marker)) = live::marker(&mut live).await {
            half.push(format!(
                "; shard {}'s etcd is half restored (its keys replaced only in part by {}): the next run replaces them again",
                shard.shard, marker.restore
            ));
        }
    }
    half.concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_and_logical_cluster_keys_are_read_with_or_without_a_segment() {
        assert_eq!(cluster_and_name("root/ws-a", true).as_deref(), Some("root/ws-a"));
        assert_eq!(cluster_and_name("customresources/root/ws-a", true).as_deref(), Some("root/ws-a"));
        assert_eq!(cluster_and_name("2x8ab/cluster", false).as_deref(), Some("2x8ab"));
        assert_eq!(cluster_and_name("a/b/c/d", true), None);
    }
}
