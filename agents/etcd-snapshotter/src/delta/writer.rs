//! The leader's delta writer for one shard: a watch of the shard's etcd from the newest full snapshot onwards,
//! its events written as delta objects every `deltas.interval` or at `deltas.maxBytes`.
//!
//! Where it starts is read from the store at the start of every session, never from what this process wrote:
//! the newest full snapshot of the shard's own cluster, then its last delta's `to + 1` (its chain continues),
//! else the snapshot's revision + 1. So a restart, a new leader or a one-shot snapshot in between resume with
//! no gap and no duplicate. A session ends when a newer full snapshot is published (the next session chains to
//! it), when the start revision was compacted away (the caller takes a full snapshot, counted), when another
//! writer put the chain's next link first, or when this replica stops leading.
//!
//! The writer takes no shard lock: a full snapshot's clean-up touches only what has no manifest, and the writer
//! writes only under a snapshot whose manifest it read. Retention may delete that snapshot (a newer one was just
//! published) between the read and a write: the delta then has no manifest, carries this agent's `written-by`
//! and is older than the next run's lock, so that run's clean-up removes it (`snapshot::clean_interrupted`).
//!
//! The recovery point is proven from what is stored, never from the watch being alive: every `interval` the
//! writer reads the cluster's revision linearizably (a quorum read, which a member cut off from its peers
//! cannot serve) and notes when it sent the read. Every write acknowledged before then has a revision at most
//! the one read, so once the chain stored reaches that revision the store holds the shard as it was at that
//! time: that time is `delta_stored_through_timestamp_seconds`, and `time() - it` is the recovery point. The
//! watch's progress answers only say when the buffer holds every event up to a revision and may be written.
//! The watch and every read are marked as needing a leader: a member that loses its peers ends the watch
//! within a few election timeouts, and the next session watches a member that still has a quorum. The proven
//! point is also written to the store, beside the shard's snapshots, when it advanced, at most once per tick
//! (`super::recovery`): a one-shot reads how far each shard's chain reaches in time from the bucket alone. The same
//! point goes first into the chain, as the session's proof (`deltas/proofs/<watching since>.json`), which the
//! next session does not overwrite: a restore places a time between this session's last event and its last
//! proof by it.

//! A flush at most every `deltas.hashKvInterval` (and the session's first) also asks the member for `HashKV(to)` and
//! the key count at `to`, and the delta carries them ([`super::Live`]) for drills to compare with. Not every
//! flush: HashKV reads the member's whole database, as etcd's own corruption check does.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{EventType, WatchOptions, WatchResponse, WatchStream};
use kcp_keeper_runtime::metrics::unix_now;
use tokio_util::sync::CancellationToken;

use super::recovery::{self, Recorder, RecoveryPoint};
use super::{Event, Header, Kind, Live, Meta};
use crate::catalog;
use crate::config::{Config, Deltas, Shard};
use crate::encode::Encoder;
use crate::generation::{self, Own};
use crate::labels::ShardLabel;
use crate::manifest::{self, Location, Manifest};
use crate::metrics::Metrics;
use crate::storage::Store;

/// Reads what the live member reports at a revision, at most every `every`.
struct LiveReader {
    client: etcd_client::Client,
    every: Duration,
    last: Option<Instant>,
}

impl LiveReader {
    /// `HashKV(to)`, its compact revision and the key count at `to`, when one is due; `None` when not due or
    /// when the member cannot say (a compaction past `to` already, a timeout): the delta then carries none.
    async fn read(&mut self, shard: &str, to: u64) -> Option<Live> {
        if self.last.is_some_and(|t| t.elapsed() < self.every) {
            return None;
        }
        self.last = Some(Instant::now());
        let at = to as i64;
        let client = &mut self.client;
        let read = async {
            let hash = client.hash_kv(at).await?;
            let options = etcd_client::GetOptions::new().with_all_keys().with_count_only().with_revision(at);
            let count = client.get("", Some(options)).await?.count();
            Ok::<_, etcd_client::Error>(Live {
                hash_kv: hash.hash(),
                compact_revision: hash.compact_version(),
                key_count: count.max(0) as u64,
            })
        };
        match tokio::time::timeout(Duration::from_secs(30), read).await {
            Ok(Ok(live)) => Some(live),
            Ok(Err(e)) => {
                tracing::warn!(shard, to, error = %e, "the live member's HashKV at the delta's end: not recorded");
                None
            }
            Err(_) => {
                tracing::warn!(shard, to, "the live member's HashKV at the delta's end timed out: not recorded");
                None
            }
        }
    }
}

/// How a session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// A newer full snapshot was published: chain to it.
    NewSnapshot,
    /// The start revision is compacted away: only a full snapshot closes the gap.
    Compacted,
    /// The shard has no full snapshot of its own cluster yet: nothing to chain to.
    NoSnapshot,
    /// Another writer stored the next link first (an old leader's last seconds): read the store again.
    Raced,
    /// The chain's next link is taken by an object that is not a link of it (a stray or damaged delta): no
    /// delta can follow, only a full snapshot starts a new chain.
    Blocked,
    /// Leadership or the process ended; what was buffered was written.
    Stopped,
}

pub struct Writer {
    pub config: Arc<Config>,
    pub shard: Shard,
    pub deltas: Deltas,
    pub metrics: Metrics,
}

/// Where a chain stands in the store.
struct Chain {
    snapshot: Manifest,
    location: Location,
    /// The next delta's `from`.
    next: u64,
    /// The last delta's object sha256.
    previous: Option<String>,
}

impl Writer {
    /// One session: from the store's state until it ends (see [`End`]); `stop` ends it after writing what is
    /// buffered.
    pub async fn session(&self, stop: &CancellationToken) -> anyhow::Result<End> {
        let (mut session, mut watch) = match self.start().await? {
            Ok(started) => started,
            Err(end) => return Ok(end),
        };
        let mut tick = tokio::time::interval(self.deltas.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => {
                    self.flush(&mut session).await?;
                    return Ok(End::Stopped);
                }
                _ = tick.tick() => {
                    if let Some(end) = self.on_tick(&mut session, &mut watch).await? {
                        return Ok(end);
                    }
                }
                message = watch.message() => {
                    if let Some(end) = self.on_message(&mut session, message).await? {
                        return Ok(end);
                    }
                }
            }
        }
    }

    /// The session's start: the store's chain of the live cluster's newest full snapshot, and a watch from its
    /// next revision; `None` when the shard has no full snapshot of its own cluster to chain to.
    async fn start(&self) -> anyhow::Result<Result<(Session, WatchStream), End>> {
        let store = Store::new(&self.config.storage)?.counting_retries(self.metrics.retries.clone());
        let own = generation::live(&self.shard)
            .await
            .ok_or_else(|| anyhow::anyhow!("no member of the shard's etcd answers"))?;
        let chain = match chain_of(&store, &self.shard.name, &own).await? {
            Ok(chain) => chain,
            Err(end) => return Ok(Err(end)),
        };
        let label = self.metrics.shard(&self.shard.name);
        let client = connect(&self.shard).await?;
        let live = LiveReader { client: client.clone(), every: self.deltas.hash_kv_interval, last: None };
        let options = WatchOptions::new().with_all_keys().with_start_revision(chain.next as i64).with_progress_notify();
        let watch = client.watch_client().max_decoding_message_size(256 << 20).watch("", Some(options)).await?;
        // Taken once the watch is open: every event it delivers was committed before this or is received after.
        let watching_since_ms = crate::clock::now().timestamp_millis();
        tracing::info!(shard = self.shard.name, snapshot = chain.snapshot.id, from = chain.next, "watching for deltas");
        // A replacement under way when the session starts: its marker at the revision the watch follows.
        let before = (chain.next as i64 - 1).max(1);
        let marked = crate::restore::live::marker_at(&mut client.clone(), Some(before)).await.ok().flatten();
        let replacements = Replacements(marked.map(|_| (before as u64, None)).into_iter().collect());

        let session = Session {
            store,
            own,
            client,
            live,
            chain,
            label,
            buffer: Vec::new(),
            buffered: 0,
            asked: None,
            claims: VecDeque::new(),
            proven: None,
            recorder: Recorder::default(),
            recorded: None,
            watching_since_ms,
            replacements,
        };
        Ok(Ok((session, watch)))
    }

    /// Every `interval`: ends the session when a newer full snapshot is published, writes the buffer when the
    /// progress request in flight goes unanswered, and asks for the watch's progress.
    async fn on_tick(&self, session: &mut Session, watch: &mut WatchStream) -> anyhow::Result<Option<End>> {
        if newer_snapshot(&session.store, &self.shard.name, &session.own, &session.chain.snapshot).await? {
            let end = self.flush(session).await?;
            return Ok(Some(end.unwrap_or(End::NewSnapshot)));
        }
        // An unanswered request (etcd busy catching the watcher up): write what is here anyway, so the
        // buffer never waits longer than an interval or two.
        if session.asked.as_ref().is_some_and(|a| a.elapsed() >= self.deltas.interval)
            && let Some(end) = self.flush(session).await?
        {
            return Ok(Some(end));
        }
        session.claim(&self.metrics).await;
        session.record(&self.shard.name, self.config.delta_key.as_ref(), self.deltas.interval).await;
        if session.asked.is_none() || session.asked.as_ref().is_some_and(|a| a.elapsed() >= self.deltas.interval * 3) {
            watch.request_progress().await?;
            session.asked = Some(Instant::now());
        }
        Ok(None)
    }

    /// One message of the watch: its events buffered (and written at `maxBytes`), or a progress answer that
    /// writes the buffer and proves a point; the session ends when the watch does.
    async fn on_message(
        &self,
        session: &mut Session,
        message: Result<Option<WatchResponse>, etcd_client::Error>,
    ) -> anyhow::Result<Option<End>> {
        let response = match message {
            Ok(Some(response)) => response,
            ended => {
                // etcd went away (a crashed member, a network cut): what arrived is written first.
                self.flush(session).await?;
                match ended {
                    Err(e) => anyhow::bail!("the watch failed: {e}"),
                    Ok(_) => anyhow::bail!("the watch ended"),
                }
            }
        };
        if response.canceled() {
            if response.compact_revision() > 0 {
                tracing::warn!(
                    shard = self.shard.name,
                    from = session.chain.next,
                    compacted = response.compact_revision(),
                    "the deltas' start revision was compacted away: a full snapshot closes the gap"
                );
                return Ok(Some(End::Compacted));
            }
            anyhow::bail!("etcd canceled the watch: {}", response.cancel_reason());
        }
        session.push_events(&response);
        // The memory bound: written at the size limit, whole revisions only (a transaction is never
        // split across two deltas).
        if session.buffered >= self.deltas.max_bytes
            && let Some(end) = self.flush(session).await?
        {
            return Ok(Some(end));
        }
        if response.events().is_empty() && !response.created() && session.asked.take().is_some() {
            // A progress answer: every event up to its revision has arrived, so the buffer is whole.
            if let Some(end) = self.flush(session).await? {
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    /// Writes the buffer as the chain's next delta (nothing when empty): `Some(Raced)` when another writer
    /// stored that link first.
    async fn flush(&self, session: &mut Session) -> anyhow::Result<Option<End>> {
        let Session { store, own, live, chain, buffer, buffered, watching_since_ms, .. } = session;
        let Some(last) = buffer.last() else { return Ok(None) };
        let header = Header {
            from: chain.next,
            to: last.revision,
            snapshot: chain.snapshot.id.clone(),
            cluster_id: own.cluster_id.clone(),
            previous_sha256: chain.previous.clone(),
            live: live.read(&self.shard.name, last.revision).await,
            watching_since_ms: Some(*watching_since_ms),
        };
        let payload = super::encode_payload(&header, buffer);
        let compression = self.config.compression;
        let mut encoder = Encoder::new(compression, &self.config.recipients, 1 << 20)?;
        encoder.write(&payload)?;
        let mut parts = encoder.take_parts();
        parts.extend(encoder.finish()?.0);
        let object: Vec<u8> = parts.concat();
        // Hashed here, over the bytes stored: a delta is small and whole in memory.
        let sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&object));
        let meta = Meta {
            from: header.from,
            to: header.to,
            sha256: sha256.clone(),
            previous: header.previous_sha256.clone(),
            snapshot: header.snapshot.clone(),
            cluster_id: header.cluster_id.clone(),
            events: buffer.len() as u64,
            live: header.live,
            watching_since_ms: header.watching_since_ms,
            hmac: None,
        };
        let meta = Meta { hmac: self.config.delta_key.as_ref().map(|key| meta.signature(key)), ..meta };
        let name = super::object_name(header.from, compression.as_str(), !self.config.recipients.is_empty());
        let key = format!("{}{name}", super::dir(&chain.location));
        let bytes = object.len() as u64;
        let started = Instant::now();
        if !store.put_new(&key, object, &meta.to_metadata()).await? {
            tracing::warn!(
                shard = self.shard.name,
                key,
                "another writer stored this delta first; reading the store again"
            );
            buffer.clear();
            *buffered = 0;
            return Ok(Some(End::Raced));
        }
        let label = self.metrics.shard(&self.shard.name);
        self.metrics.delta.objects.get_or_create(&label).inc();
        self.metrics.delta.bytes.get_or_create(&label).inc_by(bytes);
        self.metrics.delta.revision.get_or_create(&label).set(header.to as i64);
        self.metrics.delta.last_write_timestamp.get_or_create(&label).set(unix_now());
        tracing::debug!(
            shard = self.shard.name,
            from = header.from,
            to = header.to,
            events = buffer.len(),
            bytes,
            seconds = started.elapsed().as_secs_f64(),
            "delta written"
        );
        chain.next = header.to + 1;
        chain.previous = Some(sha256);
        buffer.clear();
        *buffered = 0;
        session.prove(&self.metrics);
        Ok(None)
    }
}

/// One session's state: the store and the chain it extends, the member it watches, and what is buffered.
struct Session {
    store: Store,
    own: Own,
    client: etcd_client::Client,
    live: LiveReader,
    chain: Chain,
    label: ShardLabel,
    buffer: Vec<Event>,
    buffered: u64,
    /// The progress request in flight: when it was sent.
    asked: Option<Instant>,
    /// Quorum reads not yet proven stored, oldest first: when each was sent and the revision it read.
    claims: VecDeque<(f64, u64)>,
    /// The newest claim proven stored: when it was sent and the revision it read.
    proven: Option<(f64, u64)>,
    /// Writes the proven point to the store ([`super::recovery`]).
    recorder: Recorder,
    /// The proven point last written, and when.
    recorded: Option<(f64, Instant)>,
    /// When the watch opened (Unix ms), carried by every delta of the session.
    watching_since_ms: i64,
    /// Where `restore-installation` replaced the keyspace, as this session saw its marker.
    replacements: Replacements,
}

/// The revisions where `restore-installation` replaced the keyspace: each the revision that put its marker and the
/// one that deleted it (none while it is there). No point inside is proven: a restore to it is refused, since the
/// shard then held part of the restored keys.
#[derive(Debug, Default)]
struct Replacements(Vec<(u64, Option<u64>)>);

impl Replacements {
    /// The marker put (a replacement begins, unless one is open) or deleted (it ends) at `revision`.
    fn changed(&mut self, kind: Kind, revision: u64) {
        let open = self.0.last_mut().filter(|(_, end)| end.is_none());
        match (kind, open) {
            (Kind::Put, None) => self.0.push((revision, None)),
            (Kind::Delete, Some(window)) => window.1 = Some(revision),
            _ => {}
        }
    }

    /// Whether the keyspace was being replaced at `revision`.
    fn at(&self, revision: u64) -> bool {
        self.0.iter().any(|&(put, deleted)| revision >= put && deleted.is_none_or(|d| revision < d))
    }
}

/// Claims kept waiting for the chain to reach them; a newer one proven proves every older one.
const CLAIMS: usize = 16;

impl Session {
    /// Reads the cluster's revision through a quorum and keeps it as a claim for [`Session::prove`]; nothing
    /// when the read fails (a member without a leader refuses it): no point is proven until one succeeds.
    async fn claim(&mut self, metrics: &Metrics) {
        let sent = crate::clock::unix_now_proven();
        if let Some(revision) = current_revision(&self.client).await {
            if self.claims.len() == CLAIMS {
                self.claims.pop_front();
            }
            self.claims.push_back((sent, revision));
        }
        self.prove(metrics);
    }

    /// Sets the recovery point to the newest claim the stored chain reaches: everything committed before it
    /// was sent is in the store.
    fn prove(&mut self, metrics: &Metrics) {
        let stored = self.chain.next - 1;
        let mut proven = None;
        while let Some(&claim) = self.claims.front()
            && claim.1 <= stored
        {
            if !self.replacements.at(claim.1) {
                proven = Some(claim);
            }
            self.claims.pop_front();
        }
        if let Some((sent, _)) = proven {
            metrics.delta.stored_through.get_or_create(&self.label).set(sent);
            self.proven = proven;
        }
    }

    /// Writes the proven point to the store when it advanced, at most once per `every` (`deltas.interval`): one
    /// PutObject per interval on a shard that is written to or idle alike. A failed write is said and tried
    /// again at the next tick; the deltas go on.
    async fn record(&mut self, shard: &str, key: Option<&super::SigningKey>, every: Duration) {
        let Some((sent, revision)) = self.proven else { return };
        let due = self.recorded.is_none_or(|(last, at)| sent > last && at.elapsed() >= every.mul_f64(0.9));
        if !due {
            return;
        }
        let point = RecoveryPoint::new(
            shard,
            ((sent * 1000.0).round() as i64, revision, self.chain.next - 1),
            (&self.chain.snapshot.id, &self.own.cluster_id),
            key,
        );
        // The session's proof in its chain first: every point the shard's object names is in a chain too, and
        // stays there when the next session overwrites that object.
        let proof = point.for_session(self.watching_since_ms, key);
        if let Err(e) = recovery::store_proof(&self.store, &self.chain.location, &proof).await {
            tracing::warn!(shard, error = %format!("{e:#}"), "writing the session's proof to its chain");
            return;
        }
        match self.recorder.record(&self.store, &point).await {
            Ok(_) => self.recorded = Some((sent, Instant::now())),
            Err(e) => tracing::warn!(shard, error = %format!("{e:#}"), "writing the recovery point to the store"),
        }
    }

    /// Buffers a watch response's events, each stamped with when it was received.
    fn push_events(&mut self, response: &WatchResponse) {
        let received_ms = crate::clock::now().timestamp_millis();
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let kind = match event.event_type() {
                EventType::Put => Kind::Put,
                EventType::Delete => Kind::Delete,
            };
            let value = if kind == Kind::Put { kv.value().to_vec() } else { Vec::new() };
            let lease = if kind == Kind::Put { kv.lease() } else { 0 };
            let event =
                Event { kind, revision: kv.mod_revision() as u64, received_ms, key: kv.key().to_vec(), value, lease };
            if event.key == crate::restore::live::MARKER_KEY.as_bytes() {
                self.replacements.changed(event.kind, event.revision);
            }
            self.buffered += event.size();
            self.buffer.push(event);
        }
    }
}

/// The cluster's revision now, from a linearizable count of one key (no value read); `None` when the read fails
/// (the next tick asks again).
async fn current_revision(client: &etcd_client::Client) -> Option<u64> {
    let options = etcd_client::GetOptions::new().with_count_only();
    let mut kv = client.kv_client();
    let response = tokio::time::timeout(Duration::from_secs(10), kv.get(vec![0u8], Some(options))).await.ok()?.ok()?;
    Some(response.header()?.revision() as u64)
}

/// The first member of the shard that serves a quorum read (any member with a leader serves the watch of the
/// whole cluster; one cut off from its peers answers Status, but not this).
async fn connect(shard: &Shard) -> anyhow::Result<etcd_client::Client> {
    let mut last = None;
    for endpoint in &shard.endpoints {
        match crate::member::connect_led(endpoint, shard.tls.as_ref()).await {
            Ok(client) => match current_revision(&client).await {
                Some(_) => return Ok(client),
                None => last = Some(anyhow::anyhow!("{endpoint} serves no quorum read")),
            },
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no endpoints")))
}

/// The newest full snapshot of the shard's own cluster and where its chain of deltas stands: `Err(NoSnapshot)`
/// without one, `Err(Blocked)` when the chain's next link is taken by something else.
async fn chain_of(store: &Store, shard: &str, own: &Own) -> anyhow::Result<Result<Chain, End>> {
    let Some(snapshot) = catalog::list(store, Some(shard)).await?.into_iter().find(|m| own.owns(m)) else {
        return Ok(Err(End::NoSnapshot));
    };
    let location = Location::from_id(&store.prefix, &snapshot.id).ok_or_else(|| anyhow::anyhow!("invalid id"))?;
    let starts: std::collections::BTreeMap<u64, String> =
        super::chain_keys(store, shard, &location).await?.into_iter().collect();
    let link = |meta: &Meta, from: u64, previous: Option<&str>| {
        let expected = super::Expected { from, previous, snapshot: &snapshot.id, cluster_id: &own.cluster_id };
        expected.admits(meta).is_ok()
    };
    // Usually the newest delta continues the one before it (or is the first): continue after it, two reads.
    let mut newest = starts.iter().rev();
    if let Some((&from, key)) = newest.next() {
        let meta = super::read_meta(store, key).await?;
        let before = match newest.next() {
            Some((_, key)) => super::read_meta(store, key).await?,
            None => None,
        };
        let linked = match (&meta, &before) {
            (Some(meta), Some(before)) => link(meta, before.to + 1, Some(&before.sha256)),
            (Some(meta), None) => link(meta, snapshot.revision + 1, None),
            _ => false,
        };
        if linked && let Some(meta) = meta {
            debug_assert_eq!(meta.from, from);
            return Ok(Ok(Chain { next: meta.to + 1, previous: Some(meta.sha256), snapshot, location }));
        }
    }
    // Otherwise (a stray or damaged newest object), the links walked from the snapshot.
    let (mut next, mut previous) = (snapshot.revision + 1, None::<String>);
    while let Some(key) = starts.get(&next) {
        match super::read_meta(store, key).await? {
            Some(meta) if link(&meta, next, previous.as_deref()) => (next, previous) = (meta.to + 1, Some(meta.sha256)),
            _ => {
                tracing::error!(key, "the delta chain's next link is taken by an object not on the chain");
                return Ok(Err(End::Blocked));
            }
        }
    }
    if starts.range(next..).next().is_some() {
        tracing::warn!(shard, next, "objects past the delta chain's end that are not on it; the chain continues");
    }
    Ok(Ok(Chain { next, previous, snapshot, location }))
}

/// Whether a full snapshot of the shard's own cluster newer than `current` is published: the directories
/// whose name says a higher revision, or the same revision taken later (an idle shard snapshotted twice: restore
/// takes the later one as the base, so the chain must continue under it), their manifests read (one listing
/// with a delimiter, however many deltas).
async fn newer_snapshot(store: &Store, shard: &str, own: &Own, current: &Manifest) -> anyhow::Result<bool> {
    for dir in store.list_dirs(&manifest::shard_dir(&store.prefix, shard)).await? {
        let Some(name) = dir.strip_suffix('/').and_then(|d| d.rsplit('/').next()) else { continue };
        let Some(location) = Location::from_id(&store.prefix, &format!("{shard}/{name}")) else { continue };
        let revision = name.rsplit_once("-r").and_then(|(_, r)| r.parse::<u64>().ok()).unwrap_or(0);
        // Ids of one revision differ by their time (`<time>-r<revision>`), which sorts as it runs.
        if revision < current.revision || (revision == current.revision && location.id <= current.id) {
            continue;
        }
        let Some(read) = store.get_versioned(&location.manifest_key()).await? else { continue };
        if let Ok(manifest) = Manifest::from_json(&read.body)
            && manifest.id == location.id
            && own.owns(&manifest)
        {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_point_is_proven_from_a_replacements_marker_put_until_its_delete_and_a_second_put_opens_none() {
        let mut seen = Replacements::default();
        assert!(!seen.at(10));
        seen.changed(Kind::Put, 10);
        seen.changed(Kind::Put, 12);
        assert!(!seen.at(9) && seen.at(10) && seen.at(11) && seen.at(500));
        seen.changed(Kind::Delete, 20);
        assert!(seen.at(19) && !seen.at(20) && !seen.at(21));
        seen.changed(Kind::Delete, 22);
        seen.changed(Kind::Put, 30);
        assert!(!seen.at(25) && seen.at(30) && seen.at(15));
        assert_eq!(seen.0, vec![(10, Some(20)), (30, None)]);
    }
}
