//! The second store (`secondary`): every published object (a full snapshot's data object, its manifest, its
//! drill report, its deltas and their sessions' proofs) copied to a second bucket and verified there, with the
//! second store's own retention; `list`, `verify` and `restore` read from either store (`--store`).
//!
//! A copy pass runs every `secondary.interval` on the leader, apart from the snapshots: it never takes their
//! turn or their lock, and nothing it does can fail or delay a primary publish. It decides from state alone,
//! every pass: both stores are listed; every object the second store should hold ([`plan::kept`],
//! [`plan::objects_of`]) is in sync when both stores still list the ETags it was verified at; anything else
//! (missing, replaced out of band, a restart) is read back from the second store and its sha256 compared with
//! what the primary records for it (the manifest's `objectSha256`, a delta's `delta-sha256`, a manifest's or
//! report's bytes), and copied again when it differs. So an attempt that failed after writing, or a process
//! killed mid-copy, is repaired by the next pass, and a restart catches up.
//!
//! A copy streams the primary's object straight into the second store, one part (`spill.partSize`, larger only past
//! S3's 10,000 parts: [`parts::plan`]) in memory at a time and nothing on disk: an object of one part is put whole,
//! a larger one goes as a multipart upload, each with the metadata it carried (a delta keeps its chain). Its sha256
//! is taken as it streams and must be what the primary records for it before the copy becomes visible: a primary
//! object that does not match its record is not copied, it is a failure, and its multipart upload is aborted rather
//! than completed (as on any other failure; an upload a killed process left is aborted by the next copy of that
//! object). The copy is then read back from the second store and hashed before it counts. Read back, not the
//! store's checksum: the second store is often another provider, and stores differ in the checksums they keep and
//! return (multipart composites, CRC64 defaults, none at all), while reading the bytes proves what a restore from
//! it would read on any of them; `storage.integrity: checksums` on the second store additionally sends each
//! object's (or each part's) SHA-256 for the store to check on the way in.

pub mod metrics;
pub mod plan;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail, ensure};
use kcp_keeper_runtime::lease::Leadership;
use kcp_keeper_runtime::metrics::unix_now;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::catalog::{self, Listed};
use crate::config::{Config, Secondary, Shard};
use crate::generation::{self, Own};
use crate::labels::ShardLabel;
use crate::manifest;
use crate::metrics::Metrics;
use crate::parts;
use crate::retention::Entry;
use crate::storage::{Body, PartReader, StorageError, Store, StoredObject};
use plan::{Expected, Kind, Object, Verified};

/// Which store a one-shot reads (`--store`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreChoice {
    #[default]
    Primary,
    Secondary,
}

/// The store `choice` names; the second one only when the configuration has a `secondary` section.
pub fn open(config: &Config, choice: StoreChoice) -> anyhow::Result<Store> {
    let storage = match (choice, &config.secondary) {
        (StoreChoice::Primary, _) => &config.storage,
        (StoreChoice::Secondary, Some(secondary)) => &secondary.storage,
        (StoreChoice::Secondary, None) => bail!("--store secondary: the configuration has no secondary section"),
    };
    Ok(Store::new(storage)?)
}

/// What one pass did for one shard.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ShardPass {
    pub shard: String,
    /// Objects copied (and verified) in this pass.
    pub copied: usize,
    /// Objects found already on the second store with the right bytes (read back), not copied.
    pub checked: usize,
    /// Objects the second store should hold verified and does not after this pass.
    pub behind: usize,
    /// Snapshots the second store's retention deleted.
    pub deleted: Vec<String>,
    /// What failed, one line each (never a credential: storage errors carry codes and messages only).
    pub failures: Vec<String>,
}

/// The daemon's copy passes, while this replica leads, until `token` is cancelled.
pub async fn run(config: Arc<Config>, metrics: Metrics, mut leadership: Leadership, token: CancellationToken) {
    let Some(secondary) = config.secondary.clone() else { return };
    for shard in &config.shards {
        metrics.secondary.init_shard(&shard.name);
    }
    // Per process: a restart checks every copy again by hash once.
    let mut verified = Verified::default();
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            () = leadership.wait_until_leader() => {}
        }
        tokio::select! {
            // A pass dropped mid-copy leaves at most a copy the next pass checks; its multipart upload is aborted.
            () = token.cancelled() => return,
            passes = pass(&config, &secondary, &metrics, &mut verified) => {
                for p in passes {
                    tracing::info!(shard = p.shard, copied = p.copied, checked = p.checked, behind = p.behind,
                        deleted = p.deleted.len(), failures = p.failures.len(), "second store pass");
                }
            }
        }
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(secondary.interval) => {}
        }
    }
}

/// One pass over every shard: what [`ShardPass`] says, also in `metrics.secondary`.
pub async fn pass(
    config: &Config,
    secondary: &Secondary,
    metrics: &Metrics,
    verified: &mut Verified,
) -> Vec<ShardPass> {
    let mut out = Vec::new();
    // Both clients per pass: credentials are read now, so a rotated Secret is used without a restart.
    let stores = Store::new(&config.storage).and_then(|p| Ok((p, Store::new(&secondary.storage)?)));
    for shard in &config.shards {
        let mut report = ShardPass { shard: shard.name.clone(), ..Default::default() };
        match &stores {
            Ok((primary, second)) => {
                let run = ShardRun { config, secondary, shard, primary, second, metrics };
                run.pass(verified, &mut report).await;
            }
            Err(error) => {
                metrics.secondary.failed(&shard.name, Kind::Listing);
                report.failures.push(format!("the stores' clients: {error}"));
            }
        }
        for failure in &report.failures {
            tracing::warn!(shard = shard.name, failure, "second store");
        }
        out.push(report);
    }
    out
}

/// Where one pass finds each object: the primary's listing by key below its prefix, and the second store's
/// (`None` when it could not be listed).
struct Sources<'a> {
    by_relative: &'a HashMap<String, &'a StoredObject>,
    secondary: Option<&'a HashMap<String, StoredObject>>,
}

struct ShardRun<'a> {
    config: &'a Config,
    secondary: &'a Secondary,
    shard: &'a Shard,
    primary: &'a Store,
    second: &'a Store,
    metrics: &'a Metrics,
}

impl ShardRun<'_> {
    async fn pass(&self, verified: &mut Verified, report: &mut ShardPass) {
        let shard = self.shard.name.as_str();
        let label = self.metrics.shard(shard);
        let (primary_listed, primary_objects) = match self.listing(self.primary).await {
            Ok(listing) => listing,
            Err(error) => {
                // The primary's own failures are the snapshots' to count; nothing can be copied meanwhile.
                report.failures.push(format!("listing the primary: {error:#}"));
                return;
            }
        };
        let Some(own) = self.own_cluster(&primary_listed, &label, report).await else { return };
        let primary_own: Vec<&Listed> = primary_listed.iter().filter(|l| own.owns(&l.manifest)).collect();
        let (secondary_entries, secondary_objects) = self.second_state(&own, report).await;
        let primary_entries: Vec<_> = primary_own.iter().map(|l| l.manifest.entry(l.verified_at.is_some())).collect();
        let (kept, newest) = plan::kept(&primary_entries, &secondary_entries, &self.secondary.retention);
        let primary_root = manifest::root(&self.primary.prefix);
        let by_relative: HashMap<String, &StoredObject> =
            primary_objects.iter().filter_map(|o| Some((o.key.strip_prefix(&primary_root)?.to_string(), o))).collect();
        let sources = Sources { by_relative: &by_relative, secondary: secondary_objects.as_ref() };
        let mut newest_in_sync = false;
        for listed in primary_own.iter().filter(|l| kept.contains(&l.manifest.id) && plan::valid_id(&l.manifest.id)) {
            let objects = plan::objects_of(&primary_root, &listed.manifest, &primary_objects);
            let is_newest = Some(&listed.manifest.id) == newest.as_ref();
            newest_in_sync |= self.copy_snapshot(&objects, &sources, is_newest, verified, report).await;
        }
        let present: HashSet<String> = by_relative.keys().cloned().collect();
        verified.retain_shard(shard, &present);
        // Retention only once the newest snapshot is on the second store: a pass that could not copy it deletes
        // nothing there (as a primary run that did not publish deletes nothing).
        if let (true, Some(newest)) = (newest_in_sync, &newest) {
            self.second_retention(newest, &own, report).await;
        }
        self.metrics.secondary.behind.get_or_create(&label).set(report.behind as i64);
        if report.behind == 0 && secondary_objects.is_some() {
            self.metrics.secondary.in_sync.get_or_create(&label).set(unix_now());
        }
    }

    /// The etcd cluster whose snapshots are the shard's: the live one, else the only one the primary holds.
    /// `None` ends the pass: with no snapshot at all the second store is in sync (`label`'s gauges say so), and
    /// with several clusters and none live which one is the shard's is a failure in `report`.
    async fn own_cluster(&self, primary_listed: &[Listed], label: &ShardLabel, report: &mut ShardPass) -> Option<Own> {
        if let Some(own) = generation::live(self.shard).await {
            return Some(own);
        }
        let manifests: Vec<_> = primary_listed.iter().map(|l| l.manifest.clone()).collect();
        match generation::only_cluster(&manifests) {
            Ok(Some(cluster)) => Some(Own { cluster_id: cluster, member_ids: Vec::new() }),
            Ok(None) => {
                self.metrics.secondary.behind.get_or_create(label).set(0);
                self.metrics.secondary.in_sync.get_or_create(label).set(unix_now());
                None
            }
            Err(error) => {
                report.failures.push(format!("which etcd cluster is the shard's: {error}"));
                None
            }
        }
    }

    /// The second store's side of the shard: its retention entries of `own`'s snapshots, and its objects by
    /// their key below the store's prefix (`None` when it could not be listed: a failure in `report`).
    async fn second_state(
        &self,
        own: &Own,
        report: &mut ShardPass,
    ) -> (Vec<Entry>, Option<HashMap<String, StoredObject>>) {
        match self.listing(self.second).await {
            Ok((listed, objects)) => {
                let entries: Vec<_> = listed
                    .iter()
                    .filter(|l| own.owns(&l.manifest))
                    .map(|l| l.manifest.entry(l.verified_at.is_some()))
                    .collect();
                let root = manifest::root(&self.second.prefix);
                let objects: HashMap<String, StoredObject> =
                    objects.into_iter().filter_map(|o| Some((o.key.strip_prefix(&root)?.to_string(), o))).collect();
                (entries, Some(objects))
            }
            Err(error) => {
                self.metrics.secondary.failed(&self.shard.name, Kind::Listing);
                report.failures.push(format!("listing the second store: {error:#}"));
                (Vec::new(), None)
            }
        }
    }

    /// Brings one kept snapshot's `objects` (data object first) onto the second store, counting in `report`;
    /// whether its manifest is there, proven, when it is the newest snapshot (`is_newest`).
    async fn copy_snapshot(
        &self,
        objects: &[Object],
        sources: &Sources<'_>,
        is_newest: bool,
        verified: &mut Verified,
        report: &mut ShardPass,
    ) -> bool {
        let shard = self.shard.name.as_str();
        let mut newest_in_sync = false;
        let mut skip_rest = false;
        for (i, object) in objects.iter().enumerate() {
            let Some(source) = sources.by_relative.get(&object.relative) else {
                // Gone from the primary since it was listed (its retention): nothing to copy.
                continue;
            };
            if skip_rest {
                report.behind += 1;
                continue;
            }
            let Some(secondary_objects) = sources.secondary else {
                if !verified.in_sync(&object.relative, &source.etag, None) {
                    report.behind += 1;
                }
                continue;
            };
            let there = secondary_objects.get(&object.relative).map(|o| o.etag.as_str());
            if !verified.in_sync(&object.relative, &source.etag, there) {
                match self.sync(object, source.size, there).await {
                    Ok((etag, copied)) => {
                        verified.record(&object.relative, &source.etag, &etag);
                        if copied {
                            self.metrics.secondary.copied(shard, object.kind);
                            report.copied += 1;
                        } else {
                            report.checked += 1;
                        }
                    }
                    Err(error) => {
                        self.metrics.secondary.failed(shard, object.kind);
                        report.failures.push(format!("{} {}: {error:#}", object.kind.as_str(), object.relative));
                        report.behind += 1;
                        // Nothing after a data object whose copy is not proven (its manifest would publish it),
                        // and no delta after a missing one (the chain on the second store never has a hole).
                        skip_rest = i == 0 || object.kind == Kind::Delta;
                        continue;
                    }
                }
            }
            newest_in_sync |= object.kind == Kind::Manifest && is_newest;
        }
        newest_in_sync
    }

    /// The second store's retention, kept from `newest`; what it deleted (or its failure) in `report`.
    async fn second_retention(&self, newest: &str, own: &Own, report: &mut ShardPass) {
        let shard = self.shard.name.as_str();
        match catalog::apply_retention(self.second, shard, &self.secondary.retention, newest, own).await {
            Ok(retention) => report.deleted = retention.deleted,
            Err(error) => {
                self.metrics.secondary.failed(shard, Kind::Retention);
                report.failures.push(format!("retention on the second store: {error}"));
            }
        }
    }

    /// A store's published snapshots of the shard (with their drill reports) and every object under its
    /// directory.
    async fn listing(&self, store: &Store) -> anyhow::Result<(Vec<Listed>, Vec<StoredObject>)> {
        let listed = catalog::list_with_drills(store, Some(&self.shard.name)).await?;
        let objects = store.list_versions(&manifest::shard_dir(&store.prefix, &self.shard.name)).await?;
        Ok((listed, objects))
    }

    /// Makes the second store hold `object` (of `listed_size` bytes on the primary) with the bytes the primary
    /// records for it: read back when it has one (`there`), copied when it has none or other bytes. The second
    /// store's ETag of the proven copy, and whether it was copied.
    async fn sync(&self, object: &Object, listed_size: u64, there: Option<&str>) -> anyhow::Result<(String, bool)> {
        let key = |store: &Store| format!("{}{}", manifest::root(&store.prefix), object.relative);
        let (primary_key, secondary_key) = (key(self.primary), key(self.second));
        if let Some(etag) = there {
            let expected = self.expected(object, &primary_key).await?;
            if let Some((sha256, _)) = self.second.read_sha256(&secondary_key).await? {
                if hex::encode(sha256) == expected {
                    return Ok((etag.to_string(), false));
                }
                tracing::warn!(
                    key = secondary_key,
                    "the second store holds other bytes than the primary records; copying again"
                );
            }
        }
        let copied = self.copy(object, listed_size, (&primary_key, &secondary_key)).await?;
        let (stored, size) =
            self.second.read_sha256(&secondary_key).await?.context("read back: the copy is not there")?;
        ensure!(
            stored == copied.sha256 && size == copied.size,
            "read back: the second store holds sha256 {} ({size} bytes), {} ({} bytes) was put",
            hex::encode(stored),
            hex::encode(copied.sha256),
            copied.size
        );
        Ok((copied.etag, true))
    }

    /// Copies the primary's object at `primary_key` to `secondary_key` through memory, `spill.partSize` at a time
    /// (larger parts only when an object of `listed_size` bytes would need more than S3's 10,000): an object of
    /// one part as one PutObject, a larger one as a multipart upload. Nothing of it goes to disk. Its sha256 is
    /// taken as it streams and must be what the primary records for `object` before the copy becomes visible:
    /// before the put, before the upload is completed (else it is aborted).
    async fn copy(
        &self,
        object: &Object,
        listed_size: u64,
        (primary_key, secondary_key): (&str, &str),
    ) -> anyhow::Result<Copied> {
        let part_size = parts::plan(listed_size, &self.config.spill).map_err(anyhow::Error::msg)?.part_size;
        let Some(mut reader) = self.primary.read_parts(primary_key, part_size).await? else {
            bail!("gone from the primary");
        };
        let expected = match &object.expected {
            Expected::Sha256(hex) => Some(hex.clone()),
            Expected::DeltaMetadata => Some(delta_sha256(&reader.metadata)?),
            Expected::PrimaryBytes => None,
        };
        let metadata = reader.metadata.clone();
        if reader.size > part_size {
            return self.copy_multipart(reader, expected.as_deref(), secondary_key).await;
        }
        let body = reader.next_part().await?.unwrap_or_default();
        let (sha256, size) = streamed(reader, expected.as_deref()).await?;
        let etag = self.second.put_copy(secondary_key, body, &sha256, &metadata).await?;
        Ok(Copied { etag, sha256, size })
    }

    /// [`Self::copy`] of an object larger than one part: a multipart upload on the second store, one part in
    /// memory at a time, aborted on any failure (and when the copy is dropped mid-way), completed only once the
    /// whole object's sha256 is the one expected.
    async fn copy_multipart(
        &self,
        mut reader: PartReader,
        expected: Option<&str>,
        key: &str,
    ) -> anyhow::Result<Copied> {
        self.abort_left_uploads(key).await;
        let upload_id = self.second.create_upload_with(key, &reader.metadata).await?;
        let mut upload = OpenUpload { store: self.second, key, upload_id: Some(upload_id.clone()) };
        let uploaded = async {
            let mut parts = Vec::new();
            while let Some(part) = reader.next_part().await? {
                let number = i32::try_from(parts.len() + 1).context("the part number")?;
                ensure!(number as u64 <= parts::MAX_PARTS, "more than {} parts", parts::MAX_PARTS);
                parts.push(self.second.upload_part(key, &upload_id, number, Body::Memory(part)).await?);
            }
            let (sha256, size) = streamed(reader, expected).await?;
            Ok::<_, anyhow::Error>((parts, sha256, size))
        }
        .await;
        let (parts, sha256, size) = match uploaded {
            Ok(uploaded) => uploaded,
            Err(error) => {
                upload.abort().await;
                return Err(error);
            }
        };
        match self.second.complete_upload(key, &upload_id, parts).await {
            Ok(etag) => {
                upload.upload_id = None;
                Ok(Copied { etag, sha256, size })
            }
            // Completed, and the store's checksum of it is not ours: there is no upload left, and the next pass
            // reads the object back and copies it again.
            Err(error @ StorageError::Integrity(_)) => {
                upload.upload_id = None;
                Err(error.into())
            }
            Err(error) => {
                upload.abort().await;
                Err(error.into())
            }
        }
    }

    /// Aborts multipart uploads at exactly `key` on the second store: what a copy of this object killed
    /// mid-way left (a copy's upload is only ever at the key it copies to). Best effort: a store that refuses
    /// listing uploads still gets the copy.
    async fn abort_left_uploads(&self, key: &str) {
        let left = match self.second.uploads(key).await {
            Ok(uploads) => uploads,
            Err(error) => {
                tracing::warn!(key, %error, "listing the second store's multipart uploads left at the key");
                return;
            }
        };
        for left in left.into_iter().filter(|u| u.key == key) {
            tracing::warn!(key, "aborting a multipart upload an interrupted copy left on the second store");
            if let Err(error) = self.second.abort_upload(key, &left.upload_id).await {
                tracing::warn!(key, %error, "aborting a multipart upload left at the key");
            }
        }
    }

    /// The sha256 (hex) the primary records for `object` at `primary_key`.
    async fn expected(&self, object: &Object, primary_key: &str) -> anyhow::Result<String> {
        Ok(match &object.expected {
            Expected::Sha256(hex) => hex.clone(),
            Expected::DeltaMetadata => {
                delta_sha256(&self.primary.head_metadata(primary_key).await?.context("gone from the primary")?)?
            }
            Expected::PrimaryBytes => hex::encode(Sha256::digest(self.primary.get_bytes(primary_key).await?)),
        })
    }
}

/// A copy put on the second store: its ETag there, and the sha256 and size of the bytes streamed into it.
struct Copied {
    etag: String,
    sha256: [u8; 32],
    size: u64,
}

/// The sha256 and size of every byte `reader` received, once the rest of its body is read: the size it
/// announced, and the sha256 `expected` (hex) when the primary records one.
async fn streamed(reader: PartReader, expected: Option<&str>) -> anyhow::Result<([u8; 32], u64)> {
    let announced = reader.size;
    let (sha256, size) = reader.finish().await?;
    ensure!(size == announced, "the primary announced {announced} bytes and sent {size}: not copied");
    let hex = hex::encode(sha256);
    if let Some(expected) = expected {
        ensure!(
            hex == expected,
            "the primary's object has sha256 {hex}, its record says {expected}: not copied (a drill of the primary \
             would fail too)"
        );
    }
    Ok((sha256, size))
}

/// A multipart upload on the second store in progress. Dropped with its id still set (the copy dropped
/// mid-way: a pass cancelled at shutdown or on a configuration change), it is aborted from a task of its own;
/// what a killed process left is aborted by the next copy of the same object.
struct OpenUpload<'a> {
    store: &'a Store,
    key: &'a str,
    upload_id: Option<String>,
}

impl OpenUpload<'_> {
    async fn abort(&mut self) {
        let Some(upload_id) = self.upload_id.take() else { return };
        if let Err(error) = self.store.abort_upload(self.key, &upload_id).await {
            tracing::warn!(key = self.key, %error, "aborting the copy's multipart upload failed; the next copy aborts it");
        }
    }
}

impl Drop for OpenUpload<'_> {
    fn drop(&mut self) {
        let Some(upload_id) = self.upload_id.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (store, key) = (self.store.clone(), self.key.to_string());
        runtime.spawn(async move {
            let _ = store.abort_upload(&key, &upload_id).await;
        });
    }
}

/// The sha256 (hex) a delta's own metadata states (`delta-sha256`).
fn delta_sha256(metadata: &HashMap<String, String>) -> anyhow::Result<String> {
    let meta = crate::delta::Meta::from_metadata(metadata);
    Ok(meta.map_err(|e| anyhow::anyhow!("the primary's delta metadata: {e}"))?.sha256)
}

/// `etcd-snapshotter sync-secondary`: one pass now; prints a line per shard. Fails when any shard is behind.
pub async fn sync_once(config_path: &Path) -> anyhow::Result<()> {
    let config: Config = kcp_keeper_runtime::config::load(config_path)?;
    let secondary = config.secondary.clone().context("the configuration has no secondary section")?;
    let metrics = Metrics::default();
    let passes = pass(&config, &secondary, &metrics, &mut Verified::default()).await;
    let mut behind = 0;
    for p in &passes {
        println!(
            "{}\tcopied {}\talready there {}\tbehind {}\tdeleted {}",
            p.shard,
            p.copied,
            p.checked,
            p.behind,
            p.deleted.len()
        );
        for failure in &p.failures {
            eprintln!("error: shard {}: {failure}", p.shard);
        }
        behind += p.behind + p.failures.len();
    }
    ensure!(behind == 0, "the second store is not in sync");
    Ok(())
}
