//! One snapshot of one shard, proven before it is published:
//!
//! 1. take the shard's lock ([`shard_lock`]: one run per shard at a time, across processes), then clean what an
//!    interrupted run left: only what is provably abandoned and ours (see [`clean_interrupted`]);
//! 2. pick a healthy voting member and bound the revision the stream will hold (`bracket`);
//! 3. stream `Maintenance.Snapshot` through the trailer check, zstd and age into parts; parts go to a
//!    multipart upload, a bounded number in memory, the rest through the spill directory when S3 lags;
//! 4. at the end compare etcd's trailing sha256 with ours; on any failure abort the upload;
//! 5. confirm the lock, complete the upload, check the stored size, confirm the lock again, then write the
//!    manifest, last; apply retention, still under the lock; release it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_s3::types::CompletedPart;
use bytes::Bytes;
use chrono::Utc;
use kcp_keeper_runtime::shutdown::{Grace, JobEnd, finish_or_abort};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::catalog::{self, RetentionReport};
use crate::config::{Config, Shard};
use crate::encode::Encoder;
use crate::error::SnapshotError;
use crate::generation;
use crate::manifest::{self, FORMAT_VERSION, Location, Manifest, Member};
use crate::member;
use crate::metrics::Metrics;
use crate::shard_lock::{self, Held};
use crate::storage::{Body, StorageError, Store};
use crate::trailer::{TrailerCheck, TrailerError, Verified};

fn etcd(context: &str) -> impl Fn(etcd_client::Error) -> SnapshotError + '_ {
    move |e| SnapshotError::Etcd(format!("{context}: {e}"))
}

/// The multipart upload in progress and the shard's lock, for the shutdown hook to abort and release.
#[derive(Clone, Default)]
struct Pending {
    upload: Arc<Mutex<Option<(String, String)>>>,
    lock: Arc<Mutex<Option<Held>>>,
}

impl Pending {
    fn set(&self, key: &str, upload_id: &str) {
        *self.upload.lock().expect("pending lock") = Some((key.into(), upload_id.into()));
    }
    fn clear(&self) {
        *self.upload.lock().expect("pending lock") = None;
    }
    /// Aborts the upload in progress, if any, and releases the shard's lock (the shutdown hook of
    /// `finish_or_abort`, and the end of every run).
    async fn abort(&self, store: &Store) {
        let taken = self.upload.lock().expect("pending lock").take();
        if let Some((key, upload_id)) = taken {
            match store.abort_upload(&key, &upload_id).await {
                Ok(()) => tracing::info!(key, "multipart upload aborted"),
                Err(error) => {
                    tracing::error!(key, %error, "aborting the multipart upload failed; the next run cleans it")
                }
            }
        }
        let lock = self.lock.lock().expect("pending lock").take();
        if let Some(lock) = lock {
            lock.release().await;
        }
    }
}

/// Progress for a terminal: bytes received of the total etcd announced.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Send + Sync);

/// Who runs and how long it may wait for the shard's lock.
pub struct Run<'a> {
    /// The schedule tick this snapshot is for (none for a one-shot).
    pub tick: Option<chrono::DateTime<Utc>>,
    pub progress: Option<Progress<'a>>,
    /// `run` or `snapshot`, recorded in the lock for whoever waits on it.
    pub command: &'a str,
    /// How long to wait while another run holds the shard (then fail with reason `busy`).
    pub lock_wait: Duration,
    /// Told the holder's description once, when the lock is found held.
    pub waiting: &'a (dyn Fn(&str) + Send + Sync),
    /// The kcp version to record in the manifest (a snapshot before a kcp upgrade); none for the others.
    pub kcp: Option<crate::upgrade::KcpVersion>,
    /// With `kcp`: looked at once the snapshot's content is fixed, and when the operator's roll may have begun
    /// before it, the manifest says so ([`crate::upgrade::roll`]).
    pub roll: Option<&'a dyn crate::upgrade::roll::Roll>,
}

/// A published snapshot and how retention went after it (a failed retention is logged and counted already).
pub struct Taken {
    pub manifest: Manifest,
    pub retention: Result<RetentionReport, SnapshotError>,
}

/// Takes, proves and publishes one snapshot of `shard` under the shard's lock, then applies retention: the one
/// call of every caller (the schedule, the pre-upgrade watch, the `snapshot` one-shot). When `stop` is
/// cancelled the run gets `grace.finish` to end; then it is dropped, its multipart upload aborted and the
/// shard's lock released ([`Pending::abort`]), and it fails as `interrupted`. A published snapshot sets the
/// shard's series here ([`published`]), so every path that publishes sets the same ones.
pub async fn take_until(
    config: &Config,
    shard: &Shard,
    store: &Store,
    metrics: &Metrics,
    run: Run<'_>,
    stop: &CancellationToken,
    grace: Grace,
) -> Result<Taken, SnapshotError> {
    let started = Instant::now();
    let pending = Pending::default();
    let take = take(config, shard, store, metrics, &pending, run);
    let (manifest, retention) = match finish_or_abort(stop, grace, take, || pending.abort(store)).await {
        JobEnd::Finished(result) => result?,
        JobEnd::Aborted | JobEnd::AbortTimedOut => return Err(SnapshotError::Interrupted),
    };
    published(metrics, &shard.name, &manifest, started.elapsed());
    let retention = match retention {
        Ok(report) => {
            let label = metrics.shard(&shard.name);
            metrics.kept.get_or_create(&label).set(report.kept as i64);
            metrics.locked_skipped.get_or_create(&label).inc_by(report.locked.len() as u64);
            Ok(report)
        }
        Err(error) => {
            let error = SnapshotError::Retention(error);
            tracing::warn!(shard = shard.name, %error, "retention failed; nothing more was deleted");
            metrics.failed(&shard.name, &error);
            Err(error)
        }
    };
    Ok(Taken { manifest, retention })
}

/// The series of a published snapshot of `shard`.
fn published(metrics: &Metrics, shard: &str, manifest: &Manifest, took: Duration) {
    let label = metrics.shard(shard);
    metrics.last_success.get_or_create(&label).set(kcp_keeper_runtime::metrics::unix_now());
    metrics.duration.get_or_create(&label).set(took.as_secs_f64());
    metrics.object_bytes.get_or_create(&label).set(manifest.object_size_bytes as i64);
    metrics.db_bytes.get_or_create(&label).set(manifest.db_size_bytes as i64);
    metrics.revision.get_or_create(&label).set(manifest.revision as i64);
}

/// Takes, proves and publishes one snapshot of `shard` under the shard's lock, then applies retention.
async fn take(
    config: &Config,
    shard: &Shard,
    store: &Store,
    metrics: &Metrics,
    pending: &Pending,
    run: Run<'_>,
) -> Result<(Manifest, Result<RetentionReport, StorageError>), SnapshotError> {
    store.reachable().await?;
    metrics.storage_reachable.set(1);
    let waited = std::sync::atomic::AtomicBool::new(false);
    let waiting = |holder: &str| {
        waited.store(true, Ordering::Relaxed);
        (run.waiting)(holder)
    };
    let lock = shard_lock::acquire(store, &shard.name, run.command, run.lock_wait, waiting).await?;
    let mut run = run;
    if let Some(kcp) = run.kcp.as_mut().filter(|_| waited.load(Ordering::Relaxed)) {
        // A snapshot before an upgrade that waited for another run may come after the roll began.
        kcp.after_roll_may_have_begun = true;
    }
    // In `pending` from now on: a shutdown that drops this run releases the lock in its abort hook.
    *pending.lock.lock().expect("pending lock") = Some(lock.clone());
    // The run stops the moment its lock may no longer be its own (taken over, or unrenewed for half the expiry).
    let result = tokio::select! {
        result = locked(config, shard, store, metrics, pending, &run, &lock) => result,
        fenced = lock.fenced() => Err(fenced.into()),
    };
    drop(lock);
    pending.abort(store).await;
    result
}

async fn locked(
    config: &Config,
    shard: &Shard,
    store: &Store,
    metrics: &Metrics,
    pending: &Pending,
    run: &Run<'_>,
    lock: &Held,
) -> Result<(Manifest, Result<RetentionReport, StorageError>), SnapshotError> {
    let started = Instant::now();
    let mut chosen = choose_member(shard, metrics).await?;
    let own = generation::of_member(&mut chosen.client)
        .await
        .map_err(|e| SnapshotError::Etcd(format!("reading the cluster id: {e:#}")))?;
    // The content is fixed first (etcd's read transaction opens with the stream), the clean-up of an interrupted
    // run after it: a snapshot before an upgrade races the operator's roll, and every store request before the
    // stream opened is time the roll has.
    let (stream, first, Bracket { revision, upper }) = bracket(&mut chosen.client).await?;
    not_being_replaced(&mut chosen.client, &shard.name, [revision, upper]).await?;
    clean_interrupted(store, &shard.name, lock.acquired).await?;
    let spill_root = config.spill.directory.join(&shard.name);
    clean_spill(&spill_root);
    if upper != revision {
        tracing::info!(
            shard = shard.name,
            revision,
            upper,
            "the shard was written to as the stream opened; revision is a lower bound"
        );
    }
    let (location, started_at) = free_location(store, &shard.name, revision as u64).await?;
    let encrypted = !config.recipients.is_empty();
    let key = location.object_key(config.compression.as_str(), encrypted);

    // Keys and HashKV at the lower bound, which the snapshot holds: read once the stream is open, so a read
    // that succeeds proves no compaction past it had started when the snapshot's transaction began.
    let mut fingerprint_client = chosen.client.clone();
    let fingerprint = tokio::spawn(async move { member::fingerprint(&mut fingerprint_client, revision).await });

    let upload_id = store.create_upload(&key).await?;
    pending.set(&key, &upload_id);
    let spill_dir = RunDir::create(&spill_root)?;
    let streamed = stream_parts(
        config,
        store,
        metrics,
        &shard.name,
        (&key, &upload_id),
        spill_dir.path(),
        stream,
        first,
        run.progress,
    )
    .await;
    let stream_seconds = started.elapsed().as_secs_f64();
    let (streamed, (key_count, hash_kv, compact_revision)) =
        match stored(store, pending, lock, &key, &upload_id, streamed, fingerprint).await {
            Ok(done) => done,
            Err(error) => {
                let upload = pending.upload.lock().expect("pending lock").take();
                if let Some((key, upload_id)) = upload {
                    let _ = store.abort_upload(&key, &upload_id).await;
                }
                // A completed object without a manifest is not a snapshot; remove it now rather than next run (it
                // is this run's own object, at the key it just wrote).
                let _ = store.delete_unless_locked(&key).await;
                return Err(error);
            }
        };
    let kcp = roll_checked(&shard.name, run, started_at).await;
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        id: location.id.clone(),
        shard: shard.name.clone(),
        cluster_id: Some(own.cluster_id.clone()),
        member: Member { name: chosen.name.clone(), id: format!("{:x}", chosen.id), endpoint: chosen.endpoint.clone() },
        etcd_version: chosen.version.clone(),
        revision: revision as u64,
        revision_upper_bound: Some(upper as u64),
        compact_revision,
        key_count,
        hash_kv,
        object: manifest::object_name(config.compression.as_str(), encrypted),
        db_size_bytes: streamed.db_size,
        object_size_bytes: streamed.object_size,
        etcd_sha256: hex::encode(streamed.etcd_sha256),
        object_sha256: hex::encode(streamed.object_sha256),
        compression: config.compression.as_str().into(),
        encryption_recipients: config.recipients.iter().map(|r| r.id.clone()).collect(),
        agent_version: kcp_keeper_runtime::VERSION.into(),
        kcp,
        tick: run.tick,
        started_at,
        finished_at: crate::clock::now(),
        stream_seconds,
        total_seconds: started.elapsed().as_secs_f64(),
        spilled_bytes: streamed.spilled_bytes,
        verified_at: None,
    };
    store.put_backup(&location.manifest_key(), manifest.to_json()).await?;
    let retention = retention(config, store, metrics, &shard.name, &manifest, &own).await;
    Ok((manifest, retention))
}

/// Refuses a snapshot of a keyspace that `restore-installation` is replacing: its marker at either bound of the
/// stream's revision means the snapshot holds some of the restored keys and none of the rest (a replacement that
/// did not finish leaves it until the restore is run again).
async fn not_being_replaced(
    client: &mut etcd_client::Client,
    shard: &str,
    bounds: [i64; 2],
) -> Result<(), SnapshotError> {
    for revision in bounds {
        let marker = crate::restore::live::marker_at(client, Some(revision))
            .await
            .map_err(|e| SnapshotError::Etcd(format!("{e:#}")))?;
        if let Some(marker) = marker {
            return Err(SnapshotError::Restoring(format!(
                "shard {shard}'s keyspace is being replaced by {} (revision {revision} holds its marker): no snapshot \
                 of a partial keyspace is taken until the restore finishes",
                marker.describe()
            )));
        }
    }
    Ok(())
}

/// The run's kcp version, marked `afterRollMayHaveBegun` when its roll check finds the roll may have begun by
/// `started_at` (looked at only while unmarked).
async fn roll_checked(
    shard: &str,
    run: &Run<'_>,
    started_at: chrono::DateTime<Utc>,
) -> Option<crate::upgrade::KcpVersion> {
    let mut kcp = run.kcp.clone()?;
    if !kcp.after_roll_may_have_begun
        && let Some(roll) = run.roll
        && let Some(why) = roll.begun_by(started_at).await
    {
        tracing::warn!(shard, why, "the operator's roll may have begun before the snapshot: its manifest says so");
        kcp.after_roll_may_have_begun = true;
    }
    Some(kcp)
}

/// The member to stream from ([`member::choose`]), with the cluster's alarms counted and logged.
async fn choose_member(shard: &Shard, metrics: &Metrics) -> Result<member::Chosen, SnapshotError> {
    let (chosen, alarms) = member::choose(shard).await;
    if let Some(alarms) = &alarms {
        metrics.alarms_seen(&shard.name, alarms);
        for (member, alarm) in alarms {
            tracing::warn!(
                shard = shard.name,
                member = format!("{member:x}"),
                alarm = alarm.as_str(),
                "etcd alarm active"
            );
        }
    }
    let chosen = chosen?;
    tracing::info!(shard = shard.name, member = chosen.name, endpoint = chosen.endpoint, "streaming from member");
    Ok(chosen)
}

/// The snapshot's directory, named by the time and `revision`, and that time. Two runs of an idle shard within
/// one second would name the same directory: the later one takes the next second rather than write over a
/// published snapshot.
async fn free_location(
    store: &Store,
    shard: &str,
    revision: u64,
) -> Result<(Location, chrono::DateTime<Utc>), SnapshotError> {
    // The stores' time (see `clock`): a time point is placed among the snapshots by it.
    let mut started_at = crate::clock::now();
    let mut location = Location::new(&store.prefix, shard, started_at, revision);
    while store.get_versioned(&location.manifest_key()).await?.is_some() {
        let rest = 1000 - u64::from(crate::clock::now().timestamp_subsec_millis()).min(999);
        tokio::time::sleep(Duration::from_millis(rest)).await;
        started_at = crate::clock::now();
        location = Location::new(&store.prefix, shard, started_at, revision);
    }
    Ok((location, started_at))
}

/// The streamed object completed, its size and hash read back from the store, and the fingerprint read at
/// its revision, all under the shard's lock (confirmed before completing and after).
async fn stored(
    store: &Store,
    pending: &Pending,
    lock: &Held,
    key: &str,
    upload_id: &str,
    streamed: Result<Streamed, SnapshotError>,
    fingerprint: tokio::task::JoinHandle<anyhow::Result<(u64, Option<u32>, i64)>>,
) -> Result<(Streamed, (u64, Option<u32>, i64)), SnapshotError> {
    let mut streamed = streamed?;
    lock.confirm().await?;
    store.complete_upload(key, upload_id, std::mem::take(&mut streamed.parts)).await?;
    pending.clear();
    let stored = store.size(key).await?;
    if stored != streamed.object_size {
        return Err(SnapshotError::SizeMismatch { stored, written: streamed.object_size });
    }
    store.read_back(key, &streamed.object_sha256).await?;
    let fingerprint = fingerprint
        .await
        .map_err(|e| SnapshotError::Etcd(format!("fingerprint task: {e}")))?
        .map_err(|e| SnapshotError::Etcd(format!("{e:#}")))?;
    lock.confirm().await?;
    Ok((streamed, fingerprint))
}

/// Retention after a published snapshot, and the other clusters' snapshots it found counted and logged.
async fn retention(
    config: &Config,
    store: &Store,
    metrics: &Metrics,
    shard: &str,
    manifest: &Manifest,
    own: &generation::Own,
) -> Result<RetentionReport, StorageError> {
    let retention = catalog::apply_retention(store, shard, &config.retention, &manifest.id, own).await;
    if let Ok(report) = &retention {
        metrics.other_clusters.get_or_create(&metrics.shard(shard)).set(report.other_clusters as i64);
        if report.other_clusters > 0 {
            tracing::warn!(
                shard,
                cluster = own.cluster_id,
                others = report.other_clusters,
                "snapshots of other etcd clusters under the shard's directory: not used, not deleted"
            );
        }
    }
    retention
}

/// The revisions a snapshot stream holds at least and at most.
struct Bracket {
    /// The member's revision read before the stream was requested: everything up to it was committed to the
    /// backend, and etcd commits pending writes before its snapshot transaction begins, so the stream holds
    /// at least this revision.
    revision: i64,
    /// The member's revision read after the first message: by then the server holds its read transaction,
    /// so the stream holds at most this revision. Equal to `revision` when nothing was written in between.
    upper: i64,
}

/// Opens the stream and bounds its revision (etcd puts no revision in the stream, and a snapshot and a
/// revision read are never atomic: etcd-io/etcd#9037). One attempt: a busy shard moves its revision between
/// any two reads, so waiting for them to agree would fail exactly the shards that matter; the lower bound is
/// recorded instead (as Gardener's etcd-backup-restore does) and a drill reads the exact one.
async fn bracket(
    client: &mut etcd_client::Client,
) -> Result<(etcd_client::SnapshotStreaming, etcd_client::SnapshotResponse, Bracket), SnapshotError> {
    let revision = member::revision(client).await.map_err(|e| SnapshotError::Etcd(format!("{e:#}")))?;
    let mut stream = client.snapshot().await.map_err(etcd("starting the snapshot"))?;
    let first = stream
        .message()
        .await
        .map_err(etcd("first snapshot message"))?
        .ok_or_else(|| SnapshotError::Etcd("the snapshot stream ended before its first message".into()))?;
    let upper = member::revision(client).await.map_err(|e| SnapshotError::Etcd(format!("{e:#}")))?;
    Ok((stream, first, Bracket { revision, upper }))
}

struct Streamed {
    parts: Vec<CompletedPart>,
    db_size: u64,
    object_size: u64,
    etcd_sha256: [u8; 32],
    object_sha256: [u8; 32],
    spilled_bytes: u64,
}

/// Hands finished parts to the uploader: in memory while the budget has room (waiting at most
/// `spill_after` for room), else through a file in the spill directory, so etcd's stream never waits on S3
/// for longer than that; unless the spill directory already holds `max_bytes` of parts, then the part waits
/// for memory however long it takes (holding etcd's stream back beats the kubelet evicting the pod).
struct Dispatcher<'a> {
    memory: Arc<Semaphore>,
    spill_after: Duration,
    dir: &'a Path,
    tx: mpsc::UnboundedSender<(i32, Body, Option<OwnedSemaphorePermit>)>,
    next: i32,
    spilled: u64,
    /// Bytes of parts in the spill directory now (the uploader subtracts what it removed).
    on_disk: Arc<AtomicU64>,
    max_bytes: Option<u64>,
}

impl Dispatcher<'_> {
    async fn submit(&mut self, part: Bytes) -> Result<(), SnapshotError> {
        self.next += 1;
        if self.next as u64 > crate::parts::MAX_PARTS {
            return Err(SnapshotError::PartLimit(format!(
                "the object needs more than {} parts (S3's limit); raise spill.partSize",
                crate::parts::MAX_PARTS
            )));
        }
        let waited = tokio::time::timeout(self.spill_after, self.memory.clone().acquire_owned()).await;
        let full = |len: u64| self.max_bytes.is_some_and(|max| self.on_disk.load(Ordering::SeqCst) + len > max);
        let waited = match waited {
            Err(_) if full(part.len() as u64) => {
                tracing::info!(part = self.next, "the spill directory is at spill.maxBytes; the part waits for memory");
                Ok(self.memory.clone().acquire_owned().await)
            }
            other => other,
        };
        let message = match waited {
            Ok(permit) => (self.next, Body::Memory(part), Some(permit.expect("the semaphore is never closed"))),
            Err(_) => {
                self.on_disk.fetch_add(part.len() as u64, Ordering::SeqCst);
                let path = self.dir.join(format!("part-{:05}", self.next));
                tokio::fs::write(&path, &part)
                    .await
                    .map_err(|e| SnapshotError::Spill(format!("writing a part: {}", e.kind())))?;
                self.spilled += part.len() as u64;
                (self.next, Body::File(path), None)
            }
        };
        // The uploader only goes away on an error, which try_join reports first.
        let _ = self.tx.send(message);
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
async fn stream_parts(
    config: &Config,
    store: &Store,
    metrics: &Metrics,
    shard: &str,
    (key, upload_id): (&str, &str),
    spill_dir: &Path,
    stream: etcd_client::SnapshotStreaming,
    first: etcd_client::SnapshotResponse,
    progress: Option<Progress<'_>>,
) -> Result<Streamed, SnapshotError> {
    // The database's size, as etcd announced it with its first message, decides the part size.
    let total_hint = first.remaining_bytes() + first.blob().len() as u64;
    let planned = crate::parts::plan(total_hint, &config.spill).map_err(SnapshotError::PartLimit)?;
    if planned.part_size != config.spill.part_size {
        tracing::warn!(
            shard,
            database = total_hint,
            part_size = planned.part_size,
            "spill.partSize would need more than 10,000 parts: larger parts for this run"
        );
    }
    // etcd's bytes are hashed (the trailer check) on the reader's task and the object's parts on a thread of
    // their own: the encoder's task only compresses and encrypts.
    let (mut chunks, reader) = read_ahead(stream, first);
    let object_hash = crate::integrity::InOrder::start();
    let (tx, rx) = mpsc::unbounded_channel();
    let on_disk = Arc::new(AtomicU64::new(0));
    let uploader = upload_parts(
        store.clone(),
        key.to_string(),
        upload_id.to_string(),
        rx,
        config.spill.parts_in_flight,
        metrics.clone(),
        on_disk.clone(),
    );
    let producer = async move {
        let encode_err = |e: std::io::Error| SnapshotError::Encode(e.to_string());
        let mut encoder =
            Encoder::new(config.compression, &config.recipients, planned.part_size as usize).map_err(encode_err)?;
        let mut dispatcher = Dispatcher {
            memory: Arc::new(Semaphore::new(planned.memory_parts)),
            spill_after: config.spill.spill_after,
            dir: spill_dir,
            tx,
            next: 0,
            spilled: 0,
            on_disk,
            max_bytes: config.spill.max_bytes,
        };
        let mut received = 0u64;
        while let Some(response) = chunks.recv().await.transpose().map_err(etcd("snapshot stream"))? {
            received += response.blob().len() as u64;
            encoder.write(response.blob()).map_err(encode_err)?;
            for part in encoder.take_parts() {
                object_hash.push(part.clone()).await;
                dispatcher.submit(part).await?;
            }
            if let Some(progress) = progress {
                progress(received, total_hint.max(received));
            }
        }
        // Checked before the last part is handed over: a mismatch never completes the upload.
        let verified = reader.join().await.map_err(|e| SnapshotError::Etcd(format!("snapshot reader task: {e}")))??;
        let (rest, encoded) = encoder.finish().map_err(encode_err)?;
        for part in rest {
            object_hash.push(part.clone()).await;
            dispatcher.submit(part).await?;
        }
        let object_sha256 = object_hash.finish().await.map_err(encode_err)?;
        let spilled = dispatcher.spilled;
        drop(dispatcher);
        Ok::<_, SnapshotError>((verified.total_bytes, verified, (encoded, object_sha256), spilled))
    };
    let ((db_size, verified, (encoded, object_sha256), spilled), parts) = tokio::try_join!(producer, uploader)?;
    if spilled > 0 {
        tracing::warn!(shard, spilled, "S3 lagged: parts went through the spill directory");
    }
    metrics.spilled.get_or_create(&metrics.shard(shard)).inc_by(spilled);
    Ok(Streamed {
        parts,
        db_size,
        object_size: encoded.size,
        etcd_sha256: verified.sha256,
        object_sha256,
        spilled_bytes: spilled,
    })
}

/// etcd's chunks (32 KiB each) held ahead of the encoder: about 2 MiB.
const READ_AHEAD_CHUNKS: usize = 64;

/// Aborts the task when dropped: a snapshot that fails or is cancelled stops reading etcd's stream.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    async fn join(mut self) -> Result<T, tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

type Chunk = Result<etcd_client::SnapshotResponse, etcd_client::Error>;

/// Drains etcd's stream (from its `first` message on) in a task of its own into a bounded queue, checking
/// etcd's trailing sha256 on the way ([`TrailerCheck`]; the task's result once the stream ended). Read inline,
/// between two chunks that are compressed, encrypted and hashed, the stream's HTTP/2 window (64 KiB) fills and
/// etcd stops sending until the encoder asks again; read ahead, etcd sends while the encoder works, up to
/// [`READ_AHEAD_CHUNKS`], and the hash of etcd's bytes runs beside the encoder rather than on its thread.
fn read_ahead(
    mut stream: etcd_client::SnapshotStreaming,
    first: etcd_client::SnapshotResponse,
) -> (mpsc::Receiver<Chunk>, AbortOnDrop<Result<Verified, TrailerError>>) {
    let (tx, rx) = mpsc::channel(READ_AHEAD_CHUNKS);
    let reader = tokio::spawn(async move {
        let mut trailer = TrailerCheck::default();
        trailer.update(first.blob());
        let mut chunk = Some(Ok(first));
        // Until the stream ends, fails (the error is passed on) or the encoder is gone (it failed).
        while let Some(next) = chunk {
            let failed = next.is_err();
            if tx.send(next).await.is_err() || failed {
                break;
            }
            chunk = stream.message().await.transpose();
            if let Some(Ok(response)) = &chunk {
                trailer.update(response.blob());
            }
        }
        trailer.finish()
    });
    (rx, AbortOnDrop(reader))
}

/// Uploads parts as they come, at most `in_flight` at once; the first failure (after the SDK's bounded
/// retries) ends the run.
async fn upload_parts(
    store: Store,
    key: String,
    upload_id: String,
    mut rx: mpsc::UnboundedReceiver<(i32, Body, Option<OwnedSemaphorePermit>)>,
    in_flight: usize,
    metrics: Metrics,
    on_disk: Arc<AtomicU64>,
) -> Result<Vec<CompletedPart>, SnapshotError> {
    let mut running: JoinSet<Result<CompletedPart, StorageError>> = JoinSet::new();
    let mut done = Vec::new();
    let joined = |r: Result<Result<CompletedPart, StorageError>, tokio::task::JoinError>| {
        r.map_err(|e| SnapshotError::Encode(format!("upload task: {e}")))?.map_err(SnapshotError::from)
    };
    loop {
        if running.len() >= in_flight {
            done.push(joined(running.join_next().await.expect("non-empty"))?);
            continue;
        }
        tokio::select! {
            message = rx.recv() => match message {
                Some((number, body, permit)) => {
                    let (store, key, upload_id, metrics) = (store.clone(), key.clone(), upload_id.clone(), metrics.clone());
                    let on_disk = on_disk.clone();
                    running.spawn(async move {
                        metrics.parts_in_flight.inc();
                        let file = match &body { Body::File(path) => Some(path.clone()), Body::Memory(_) => None };
                        let result = store.upload_part(&key, &upload_id, number, body).await;
                        metrics.parts_in_flight.dec();
                        if let Some(path) = file {
                            let len = tokio::fs::metadata(&path).await.map(|m| m.len()).unwrap_or(0);
                            let _ = tokio::fs::remove_file(path).await;
                            on_disk.fetch_sub(len, Ordering::SeqCst);
                        }
                        drop(permit);
                        result
                    });
                }
                None => break,
            },
            Some(result) = running.join_next(), if !running.is_empty() => done.push(joined(result)?),
        }
    }
    while let Some(result) = running.join_next().await {
        done.push(joined(result)?);
    }
    Ok(done)
}

fn create_dir(dir: &Path) -> Result<&Path, SnapshotError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| SnapshotError::Spill(format!("creating the spill directory: {}", e.kind())))?;
    Ok(dir)
}

/// This run's directory under the shard's spill directory, held with an exclusive `flock` for as long as the
/// run lives: the kernel drops it when the process dies (SIGKILL included), so a directory whose lock can be
/// taken is provably no live run's.
struct RunDir {
    dir: tempfile::TempDir,
    _held: File,
}

impl RunDir {
    fn create(spill_root: &Path) -> Result<Self, SnapshotError> {
        let spill = |what: &str, e: std::io::Error| SnapshotError::Spill(format!("{what}: {}", e.kind()));
        let dir = tempfile::Builder::new()
            .prefix("run-")
            .tempdir_in(create_dir(spill_root)?)
            .map_err(|e| spill("creating a run directory", e))?;
        let held = File::open(dir.path()).map_err(|e| spill("opening the run directory", e))?;
        held.try_lock().map_err(|_| SnapshotError::Spill("locking the run directory".into()))?;
        Ok(Self { dir, _held: held })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Removes run directories in the shard's spill directory that no live process holds (see [`RunDir`]).
fn clean_spill(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path: PathBuf = entry.path();
        if !entry.file_name().to_string_lossy().starts_with("run-") {
            continue;
        }
        // Taken only if no process holds it; held until the directory is gone.
        let Ok(probe) = File::open(&path) else { continue };
        if probe.try_lock().is_ok() {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// Removes what interrupted runs left, and nothing else. Called under the shard's lock, so no other run of
/// the shard is in progress; on top of that, only what is provably abandoned and ours goes:
/// - multipart uploads at a key of this agent's data-object shape ([`manifest::data_object_location`]) that
///   the store began no later than this run took the lock (`acquired`, the store's clock);
/// - data objects of that shape whose directory has no manifest, that the store wrote no later than the lock
///   was taken and that carry this agent's `written-by` metadata (a hand-placed object of that name stays);
/// - the same for delta objects (`delta::location_of`) and sessions' proofs (`delta::proof_location_of`) whose
///   snapshot has no manifest.
///
/// Nothing else under the prefix is touched: other files, other shards, drill reports, the lock itself.
pub async fn clean_interrupted(
    store: &Store,
    shard: &str,
    acquired: aws_smithy_types::DateTime,
) -> Result<CleanReport, StorageError> {
    let dir = manifest::shard_dir(&store.prefix, shard);
    // At the store's clock and resolution (often whole seconds): no later than the lock. Whatever a run of the
    // lock's previous holder began is at most that; what this run writes comes after the clean-up.
    let before = |t: Option<aws_smithy_types::DateTime>| {
        t.is_some_and(|t| (t.secs(), t.subsec_nanos()) <= (acquired.secs(), acquired.subsec_nanos()))
    };
    let mut report = CleanReport::default();
    for upload in store.uploads(&dir).await? {
        let ours = manifest::data_object_location(&store.prefix, shard, &upload.key).is_some();
        if ours && before(upload.initiated) {
            store.abort_upload(&upload.key, &upload.upload_id).await?;
            tracing::warn!(key = upload.key, "aborted a multipart upload an interrupted run left");
            report.aborted_uploads += 1;
        } else {
            report.left_alone += 1;
        }
    }
    let objects = store.list_objects(&dir).await?;
    for object in &objects {
        // A data object, or a delta or a session's proof (written under a snapshot that retention deleted before
        // the writer saw the newer one).
        let location = manifest::data_object_location(&store.prefix, shard, &object.key)
            .or_else(|| crate::delta::location_of(&store.prefix, shard, &object.key).map(|(location, _)| location))
            .or_else(|| crate::delta::proof_location_of(&store.prefix, shard, &object.key).map(|(l, _)| l));
        let Some(location) = location else { continue };
        let manifest_key = location.manifest_key();
        if objects.iter().any(|o| o.key == manifest_key) {
            continue;
        }
        if !before(object.last_modified) || !store.written_by_us(&object.key).await? {
            tracing::info!(
                key = object.key,
                "a data object without a manifest that this agent did not provably leave; left alone"
            );
            report.left_alone += 1;
            continue;
        }
        if store.delete_unless_locked(&object.key).await? {
            tracing::warn!(key = object.key, "removed a data object without a manifest (an interrupted run)");
            report.removed_orphans += 1;
        }
    }
    Ok(report)
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct CleanReport {
    pub aborted_uploads: usize,
    pub removed_orphans: usize,
    /// Uploads and manifest-less objects not provably an interrupted run of this agent.
    pub left_alone: usize,
}
