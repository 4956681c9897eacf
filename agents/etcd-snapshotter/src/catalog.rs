//! What the bucket holds: published snapshots (those with a manifest), and retention applied to them.

use std::collections::HashSet;

use chrono::{DateTime, Utc};

use crate::drill_report::{self, Report};
use crate::generation::{self, Own};
use crate::manifest::{self, Location, Manifest};
use crate::retention::{self, Policy, Trigger};
use crate::storage::{StorageError, Store};

/// Every published snapshot of `shard` (or of all shards under the prefix), newest revision first. A
/// manifest that does not parse is reported and left alone: it is neither listed nor deleted.
pub async fn list(store: &Store, shard: Option<&str>) -> Result<Vec<Manifest>, StorageError> {
    Ok(list_with_drills(store, shard).await?.into_iter().map(|l| l.manifest).collect())
}

/// A published snapshot with its drill report, if any.
#[derive(Debug, Clone)]
pub struct Listed {
    pub manifest: Manifest,
    /// The report beside the manifest (any outcome).
    pub report: Option<Report>,
    /// Set only when a passing report proves this manifest and its object ([`drill_report::verified_at`]).
    pub verified_at: Option<DateTime<Utc>>,
}

/// [`list`] with each snapshot's drill report and whether it is verified.
pub async fn list_with_drills(store: &Store, shard: Option<&str>) -> Result<Vec<Listed>, StorageError> {
    let dir = match shard {
        Some(shard) => manifest::shard_dir(&store.prefix, shard),
        None => manifest::root(&store.prefix),
    };
    let keys = store.list_keys(&dir).await?;
    let reports: HashSet<&str> =
        keys.iter().filter(|k| k.ends_with(drill_report::REPORT)).map(String::as_str).collect();
    let mut out = Vec::new();
    for key in &keys {
        let Some(id) = manifest::id_of_manifest_key(&store.prefix, key) else { continue };
        let bytes = store.get_bytes(key).await?;
        let manifest = match Manifest::from_json(&bytes) {
            Ok(m) if m.id == id => m,
            Ok(_) => {
                tracing::warn!(key, "a manifest whose id does not match its location; ignored");
                continue;
            }
            Err(error) => {
                tracing::warn!(key, %error, "a manifest that does not parse; ignored");
                continue;
            }
        };
        let report_key = format!("{}{}", key.strip_suffix(manifest::MANIFEST).unwrap_or(key), drill_report::REPORT);
        let report = match reports.contains(report_key.as_str()) {
            true => Report::from_json(&store.get_bytes(&report_key).await?)
                .inspect_err(|error| {
                    tracing::warn!(key = report_key, %error, "a drill report that does not parse; not verified");
                })
                .ok(),
            false => None,
        };
        let verified_at = report.as_ref().and_then(|r| drill_report::verified_at(r, &manifest, &bytes));
        out.push(Listed { manifest, report, verified_at });
    }
    out.sort_by(|a, b| {
        let (a, b) = (&a.manifest, &b.manifest);
        b.revision.cmp(&a.revision).then(b.started_at.cmp(&a.started_at))
    });
    Ok(out)
}

/// The snapshot with `id`, or the newest of `shard`'s own cluster when `id` is `latest` (see [`generation`]):
/// `own` as the shard's etcd serves it now, or, when it does not answer, the one cluster all its snapshots come
/// from (several: an error naming them).
pub async fn find(store: &Store, shard: Option<&str>, id: &str, own: Option<&Own>) -> anyhow::Result<Manifest> {
    if id == "latest" {
        let all = list(store, shard).await?;
        let newest = match own {
            Some(own) => all.into_iter().find(|m| own.owns(m)),
            None => {
                let only = generation::only_cluster(&all).map_err(|e| anyhow::anyhow!(e))?;
                all.into_iter().find(|m| Some(generation::cluster_of(m)) == only.as_deref())
            }
        };
        return newest.ok_or_else(|| anyhow::anyhow!("no published snapshot of the shard's etcd cluster found"));
    }
    let location = Location::from_id(&store.prefix, id)
        .ok_or_else(|| anyhow::anyhow!("{id:?} is not a snapshot id (<shard>/<time>-r<revision>)"))?;
    let bytes = store.get_bytes(&location.manifest_key()).await?;
    let manifest = Manifest::from_json(&bytes)?;
    anyhow::ensure!(manifest.id == id, "the manifest at {id} names another snapshot");
    Ok(manifest)
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct RetentionReport {
    pub kept: usize,
    pub deleted: Vec<String>,
    /// Snapshots retention would delete but object lock protects.
    pub locked: Vec<String>,
    /// Snapshots of other etcd clusters under the shard's directory: neither counted nor deleted.
    pub other_clusters: usize,
}

/// Applies the policy to the snapshots of the shard's own cluster (`own`) after `just_published` was
/// published (see [`Trigger`]): data object first (so a locked one keeps its manifest and stays listed), then
/// the manifest. Other clusters' snapshots are counted, never deleted.
pub async fn apply_retention(
    store: &Store,
    shard: &str,
    policy: &Policy,
    just_published: &str,
    own: &Own,
) -> Result<RetentionReport, StorageError> {
    let (listed, others) = generation::split(list_with_drills(store, Some(shard)).await?, own, |l| &l.manifest);
    let entries: Vec<_> = listed.iter().map(|l| l.manifest.entry(l.verified_at.is_some())).collect();
    let manifests: Vec<Manifest> = listed.into_iter().map(|l| l.manifest).collect();
    let decision = retention::plan(&entries, policy, &Trigger::AfterSuccess(just_published.into()));
    let mut report = RetentionReport { kept: decision.keep.len(), other_clusters: others.len(), ..Default::default() };
    for id in decision.delete {
        let manifest = manifests.iter().find(|m| m.id == id).expect("planned from this list");
        let location = Location::from_id(&store.prefix, &id).expect("listed ids are valid");
        let data = format!("{}{}", location.dir(), manifest.object);
        // Its deltas first, newest first: a run cut short leaves a chain that still starts at the snapshot, and a
        // locked delta keeps the snapshot (and the older deltas it needs).
        if delete_deltas(store, shard, &location).await?
            && store.delete_unless_locked(&data).await?
            && store.delete_unless_locked(&location.manifest_key()).await?
        {
            // The report last: a snapshot without its manifest is gone whatever its report says.
            store.delete_unless_locked(&format!("{}{}", location.dir(), drill_report::REPORT)).await?;
            tracing::info!(id, "retention deleted a snapshot");
            report.deleted.push(id);
        } else {
            tracing::info!(id, "retention skipped a snapshot under object lock");
            report.locked.push(id);
            report.kept += 1;
        }
    }
    Ok(report)
}

/// Deletes the deltas of the snapshot at `location`, newest first, then its sessions' proofs, each only if it
/// has this agent's shape and `written-by` metadata (a hand-placed file in `deltas/` stays); false when object
/// lock kept one (the proofs then stay with the deltas they prove).
async fn delete_deltas(store: &Store, shard: &str, location: &Location) -> Result<bool, StorageError> {
    let listed = store.list_keys(&crate::delta::dir(location)).await?;
    let mut deltas: Vec<(u64, String)> = listed
        .iter()
        .filter_map(|key| Some((crate::delta::location_of(&store.prefix, shard, key)?.1, key.clone())))
        .collect();
    deltas.sort();
    let proofs = listed.iter().filter(|key| crate::delta::proof_location_of(&store.prefix, shard, key).is_some());
    for key in deltas.iter().rev().map(|(_, key)| key).chain(proofs) {
        if !store.written_by_us(key).await? {
            tracing::info!(key, "a file in a snapshot's deltas this agent did not write; left alone");
            continue;
        }
        if !store.delete_unless_locked(key).await? {
            return Ok(false);
        }
    }
    Ok(true)
}
