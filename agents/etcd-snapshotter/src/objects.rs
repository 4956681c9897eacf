//! Snapshots and shards as Kubernetes objects (`snapshotObjects: true`): one `EtcdSnapshot` per published
//! snapshot and one `EtcdShardBackup` per shard, in the agent's namespace, so `kubectl get etcdsnapshots` shows
//! what the bucket holds, as k3s's `ETCDSnapshotFile` does. The bucket stays the source of truth: every pass
//! lists it and makes the objects match (created, changed, and deleted when retention deleted the snapshot), so an
//! object deleted by hand comes back at the next pass. A pass runs when this replica starts to lead, after each
//! snapshot and drill (a nudge), when one of the objects is deleted, and every [`RESYNC`].
//!
//! What the objects say is read from manifests and drill reports in the bucket, which others can write: only
//! numbers, times, ids the catalog already validated and fixed words go into them, never a free-form message.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kcp_keeper_runtime::lease::Leadership;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::{CustomResource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::catalog::{self, Listed};
use crate::config::Config;
use crate::delta::recovery::{self, RecoveryPoint};
use crate::metrics::Metrics;
use crate::storage::Store;

/// The API group of the objects.
pub const GROUP: &str = "kcp-keeper.io";
/// How often a pass runs with nothing else asking for one.
pub const RESYNC: Duration = Duration::from_secs(300);
/// The field manager of every apply.
const MANAGER: &str = "etcd-snapshotter";
/// The label every object carries, and the one naming its shard.
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "etcd-snapshotter");
const SHARD_LABEL: &str = "kcp-keeper.io/shard";

/// A published snapshot, as the bucket holds it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "kcp-keeper.io",
    version = "v1alpha1",
    kind = "EtcdSnapshot",
    plural = "etcdsnapshots",
    shortname = "etcdsnap",
    namespaced,
    doc = "A published etcd snapshot, mirrored from the bucket by etcd-snapshotter (the bucket is the source of truth)",
    printcolumn = r#"{"name":"Shard","type":"string","jsonPath":".spec.shard"}"#,
    printcolumn = r#"{"name":"Revision","type":"integer","jsonPath":".spec.revision"}"#,
    printcolumn = r#"{"name":"Taken","type":"date","jsonPath":".spec.startedAt"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".spec.sizeBytes"}"#,
    printcolumn = r#"{"name":"Stores","type":"string","jsonPath":".spec.stores"}"#,
    printcolumn = r#"{"name":"Verified","type":"string","jsonPath":".spec.verification"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSnapshotSpec {
    /// The shard (its directory in the bucket).
    pub shard: String,
    /// The snapshot's id, as `list`, `verify`, `drill` and `restore` take it.
    pub snapshot_id: String,
    /// etcd's cluster id (hex) the snapshot was taken from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// A revision the snapshot holds (its lower bound; exact when no write raced the snapshot's start).
    pub revision: u64,
    /// When the snapshot started (RFC 3339): it holds nothing written after this.
    pub started_at: String,
    /// Bytes of the stored object (compressed, encrypted as configured).
    pub size_bytes: u64,
    /// Bytes of the etcd database it restores.
    pub database_bytes: u64,
    /// Keys at `revision`.
    pub keys: u64,
    /// The stores holding it: `primary`, `secondary`.
    pub stores: Vec<String>,
    /// `passed` (a drill report proves this manifest and object), `failed: <reason>`, `not drilled` or `report does
    /// not match`.
    pub verification: String,
    /// When the drill that proved it finished (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<String>,
}

/// A shard's backups at a glance.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "kcp-keeper.io",
    version = "v1alpha1",
    kind = "EtcdShardBackup",
    plural = "etcdshardbackups",
    namespaced,
    doc = "A shard's backups as etcd-snapshotter last saw them: recovery point, newest snapshot, newest drill",
    printcolumn = r#"{"name":"Recovery point","type":"date","jsonPath":".spec.recoveryPoint"}"#,
    printcolumn = r#"{"name":"Last snapshot","type":"string","jsonPath":".spec.lastSnapshot"}"#,
    printcolumn = r#"{"name":"Snapshots","type":"integer","jsonPath":".spec.snapshots"}"#,
    printcolumn = r#"{"name":"Last drill","type":"string","jsonPath":".spec.lastDrill"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EtcdShardBackupSpec {
    /// The newest time a restore can reach (RFC 3339), as `plan` reads it from the bucket: the shard's stored
    /// recovery point when it keeps deltas (the time every acknowledged write before it is stored), else the
    /// newest snapshot's start. Absent while nothing is stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_point: Option<String>,
    /// The newest snapshot's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_snapshot: Option<String>,
    /// Snapshots of the shard's etcd in the primary store.
    pub snapshots: u64,
    /// The newest drill: `passed <id>` or `failed <id>: <reason>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_drill: Option<String>,
    /// When that drill finished (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_drill_at: Option<String>,
}

/// The object name of a snapshot id (`root/20261206T055619Z-r21` → `root-20261206t055619z-r21`): shard names
/// are DNS labels and the rest of an id is digits, letters and `-`.
pub fn name_of(id: &str) -> String {
    id.replace('/', "-").to_ascii_lowercase()
}

/// A reason label from a drill report, kept to what a label may be (it was written by whoever could write the
/// bucket): lowercase letters, digits and `_`, at most 40 characters.
fn reason_word(reason: &str) -> String {
    let word: String = reason.chars().filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
    let word: String = word.chars().take(40).collect();
    if word.is_empty() { "unknown".into() } else { word }
}

fn verification(listed: &Listed) -> String {
    match (&listed.report, listed.verified_at) {
        (_, Some(_)) => "passed".into(),
        (None, None) => "not drilled".into(),
        (Some(report), None) if report.passed => "report does not match".into(),
        (Some(report), None) => {
            format!("failed: {}", reason_word(report.failure.as_ref().map(|f| f.reason.as_str()).unwrap_or("")))
        }
    }
}

/// The objects of one shard: a snapshot per id in either store (the primary's manifest first), and the shard's.
pub fn desired(
    shard: &str,
    primary: &[Listed],
    secondary: &[Listed],
    stored: Option<&RecoveryPoint>,
) -> (Vec<EtcdSnapshot>, EtcdShardBackup) {
    let in_secondary: BTreeSet<&str> = secondary.iter().map(|l| l.manifest.id.as_str()).collect();
    let in_primary: BTreeSet<&str> = primary.iter().map(|l| l.manifest.id.as_str()).collect();
    let mut snapshots = Vec::new();
    for listed in primary.iter().chain(secondary.iter().filter(|l| !in_primary.contains(l.manifest.id.as_str()))) {
        let m = &listed.manifest;
        let stores =
            [("primary", in_primary.contains(m.id.as_str())), ("secondary", in_secondary.contains(m.id.as_str()))]
                .into_iter()
                .filter(|(_, holds)| *holds)
                .map(|(store, _)| store.to_string())
                .collect();
        let spec = EtcdSnapshotSpec {
            shard: shard.into(),
            snapshot_id: m.id.clone(),
            cluster_id: m.cluster_id.clone(),
            revision: m.revision,
            started_at: m.started_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            size_bytes: m.object_size_bytes,
            database_bytes: m.db_size_bytes,
            keys: m.key_count,
            stores,
            verification: verification(listed),
            verified_at: listed.verified_at.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        };
        snapshots.push(labelled(EtcdSnapshot::new(&name_of(&m.id), spec), shard));
    }
    // By time, not revision: a re-created etcd's first snapshots have lower revisions than its predecessor's.
    let newest = primary.iter().map(|l| &l.manifest).max_by_key(|m| m.started_at);
    let drilled = primary
        .iter()
        .filter_map(|l| l.report.as_ref().map(|r| (r, &l.manifest.id)))
        .max_by_key(|(r, _)| r.finished_at);
    // As `plan` reads it: the stored recovery point, or the newest snapshot's start when that is later (or no
    // point is stored). A point whose snapshot retention deleted is no longer reachable and is not shown.
    let reachable = stored.filter(|p| primary.iter().any(|l| l.manifest.id == p.snapshot)).map(RecoveryPoint::time);
    let recovery_point = newest.map(|m| reachable.map_or(m.started_at, |t| t.max(m.started_at)));
    let spec = EtcdShardBackupSpec {
        recovery_point: recovery_point.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        last_snapshot: newest.map(|m| m.id.clone()),
        snapshots: primary.len() as u64,
        last_drill: drilled.map(|(r, id)| match (r.passed, &r.failure) {
            (true, _) => format!("passed {id}"),
            (false, failure) => {
                format!("failed {id}: {}", reason_word(failure.as_ref().map(|f| f.reason.as_str()).unwrap_or("")))
            }
        }),
        last_drill_at: drilled.map(|(r, _)| r.finished_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
    };
    (snapshots, labelled(EtcdShardBackup::new(shard, spec), shard))
}

fn labelled<K: kube::Resource>(mut object: K, shard: &str) -> K {
    let labels = object.meta_mut().labels.get_or_insert_with(BTreeMap::new);
    labels.insert(MANAGED_BY.0.into(), MANAGED_BY.1.into());
    labels.insert(SHARD_LABEL.into(), shard.into());
    object
}

/// What one pass changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub applied: usize,
    pub deleted: usize,
}

/// One pass over every shard: the objects made to match the stores. A store that cannot be listed fails the
/// pass before any object of that shard is touched (a listing error never reads as "no snapshots").
pub async fn pass(config: &Config, client: &kube::Client, namespace: &str) -> anyhow::Result<Changes> {
    let primary = Store::new(&config.storage)?;
    let secondary = config.secondary.as_ref().map(|s| Store::new(&s.storage)).transpose()?;
    let snapshots: Api<EtcdSnapshot> = Api::namespaced(client.clone(), namespace);
    let shards: Api<EtcdShardBackup> = Api::namespaced(client.clone(), namespace);
    let mut changes = Changes::default();
    for shard in &config.shards {
        let listed = catalog::list_with_drills(&primary, Some(&shard.name)).await?;
        let second = match &secondary {
            Some(store) => catalog::list_with_drills(store, Some(&shard.name)).await?,
            None => Vec::new(),
        };
        let stored = match recovery::read(&primary, &shard.name, config.delta_key.as_ref()).await {
            Ok(stored) => stored,
            Err(e) => {
                // Shown as the newest snapshot's start, the point a restore reaches without it.
                tracing::warn!(shard = %shard.name, "{e:#}");
                None
            }
        };
        let (wanted, backup) = desired(&shard.name, &listed, &second, stored.as_ref());
        let selector = format!("{}={},{SHARD_LABEL}={}", MANAGED_BY.0, MANAGED_BY.1, shard.name);
        let existing: BTreeMap<String, EtcdSnapshot> = snapshots
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .into_iter()
            .map(|o| (o.name_any(), o))
            .collect();
        let apply = PatchParams::apply(MANAGER).force();
        for object in &wanted {
            let name = object.name_any();
            if existing.get(&name).is_some_and(|o| o.spec == object.spec) {
                continue;
            }
            snapshots.patch(&name, &apply, &Patch::Apply(object)).await?;
            changes.applied += 1;
        }
        let names: BTreeSet<String> = wanted.iter().map(ResourceExt::name_any).collect();
        for name in existing.keys().filter(|n| !names.contains(*n)) {
            match snapshots.delete(name, &DeleteParams::default()).await {
                Ok(_) => changes.deleted += 1,
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        if shards.get_opt(&shard.name).await?.is_none_or(|o| o.spec != backup.spec) {
            shards.patch(&shard.name, &apply, &Patch::Apply(&backup)).await?;
            changes.applied += 1;
        }
    }
    Ok(changes)
}

/// The daemon's passes while this replica leads, until `token` is cancelled: at the start of each leadership,
/// on `nudge`, when an object is deleted, and every [`RESYNC`]. A failed pass is counted
/// (`object_sync_failures_total`) and retried at the next occasion.
pub async fn run(
    config: Arc<Config>,
    metrics: Metrics,
    client: kube::Client,
    namespace: String,
    mut leadership: Leadership,
    nudge: Arc<Notify>,
    token: CancellationToken,
) {
    let api: Api<EtcdSnapshot> = Api::namespaced(client.clone(), &namespace);
    let watch = kube::runtime::watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
    let mut deletions = kube::runtime::watcher(api, watch)
        .default_backoff()
        .filter_map(|event| async move { matches!(event, Ok(kube::runtime::watcher::Event::Delete(_))).then_some(()) })
        .boxed();
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            () = leadership.wait_until_leader() => {}
        }
        let outcome = tokio::select! {
            () = token.cancelled() => return,
            outcome = pass(&config, &client, &namespace) => outcome,
        };
        match outcome {
            Ok(changes) if changes != Changes::default() => {
                tracing::info!(applied = changes.applied, deleted = changes.deleted, "snapshot objects updated");
            }
            Ok(_) => {}
            Err(error) => {
                metrics.object_sync_failures.inc();
                tracing::warn!(
                    error = format!("{error:#}"),
                    "the snapshot objects could not be brought in line with the bucket"
                );
            }
        }
        tokio::select! {
            () = token.cancelled() => return,
            () = nudge.notified() => {}
            Some(()) = deletions.next() => {}
            () = tokio::time::sleep(RESYNC) => {}
        }
    }
}

/// The CustomResourceDefinitions the chart ships (`crds/`), as YAML.
pub fn crds_yaml() -> String {
    use kube::CustomResourceExt;
    let mut out = String::new();
    for crd in [EtcdSnapshot::crd(), EtcdShardBackup::crd(), crate::requests::EtcdSnapshotRequest::crd()] {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd).expect("a CRD serialises"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_becomes_a_dns_subdomain_name_and_a_reason_from_the_bucket_only_a_bounded_word() {
        assert_eq!(name_of("root/20261206T055619Z-r21"), "root-20261206t055619z-r21");
        assert_eq!(reason_word("hash_kv_mismatch"), "hash_kv_mismatch");
        assert_eq!(reason_word("<script>\nEVIL secret=x"), "scriptsecretx");
        assert_eq!(reason_word(&"a".repeat(100)).len(), 40);
        assert_eq!(reason_word("!!"), "unknown");
    }

    #[test]
    fn the_shards_recovery_point_is_the_stored_one_while_its_snapshot_is_kept_else_the_newest_snapshots_start() {
        let manifest = crate::manifest::sample();
        let listed = [Listed { manifest: manifest.clone(), report: None, verified_at: None }];
        let point = |snapshot: &str, after: i64| {
            let proven_ms = manifest.started_at.timestamp_millis() + after;
            RecoveryPoint::new("root", (proven_ms, 1010, 1012), (snapshot, "cdf818194e3a8c32"), None)
        };
        let shown = |stored: Option<&RecoveryPoint>| desired("root", &listed, &[], stored).1.spec.recovery_point;
        let started = Some("2026-11-30T12:00:00Z".to_string());
        assert_eq!(shown(None), started, "no stored point: the newest snapshot's start");
        assert_eq!(shown(Some(&point(&manifest.id, 90_000))), Some("2026-11-30T12:01:30Z".into()));
        assert_eq!(shown(Some(&point("root/20261130T110000Z-r900", 90_000))), started, "its snapshot is gone");
        assert_eq!(shown(Some(&point(&manifest.id, -60_000))), started, "never before the newest snapshot");
        assert_eq!(desired("root", &[], &[], Some(&point(&manifest.id, 1))).1.spec.recovery_point, None);
    }
}
