//! Point-in-time restore (`restore --at <time|revision|latest>`): the newest full snapshot of the shard's own
//! cluster at or before the point, proven as any restore proves it, restored without a bump into a scratch
//! member started on loopback (as drills do); then its deltas, in chain order, each proven (its object's
//! sha256, its link to the one before, its payload's header) and replayed up to the point, each source
//! revision's events as one transaction, so revision N of the source is revision N here: a key's mod revision
//! after replay is the source's. The result is snapshotted and restored into the member's new data directory
//! with `--bump-revision` and `--mark-compacted` as a plain restore does.
//!
//! A put that carried a lease is replayed with that lease ID, granted first when the member does not hold it
//! (a lease granted after the full snapshot is not a watch event, so its TTL is unknown: [`REPLAYED_LEASE_TTL`]).
//! The key's stored record then is the source's, lease included, which is what lets a drill compare HashKV.
//!
//! A delta that is missing, altered or not linked to the one before stops the replay at the last good
//! revision: the data directory holds that point and the outcome says where and why (`restore` exits 2).
//!
//! A time point is placed by when the agent received each revision. Between two writer sessions (a restart, a
//! new leader) the next session's watch delivers what was committed meanwhile at unknown times, so a time
//! before it opened is refused, unless a proof the session before stored in its chain (`recovery::proofs`)
//! shows that a quorum read sent at or after the point still returned the last revision received before it
//! ([`placing_proof`]): the point is then that revision. A refusal names the nearest times that can be placed.

use std::path::Path;
use std::str::FromStr;

use anyhow::{Context, ensure};
use chrono::{DateTime, Utc};
use etcd_client::{LeaseGrantOptions, PutOptions, Txn, TxnOp};
use sha2::{Digest, Sha256};

use super::recovery::{self, RecoveryPoint};
use super::{Expected, Kind, Live, Meta, SigningKey, by_revision, check_link, decode_payload, parse_name};
use crate::clock::{stamp, stamp_ms};
use crate::encode::{self, Identity};
use crate::generation::{self, Own};
use crate::manifest::{Location, Manifest};
use crate::restore::live;
use crate::restore::{self, CheckedFile, MemberFlags};
use crate::storage::Store;
use crate::throwaway::{self, Scratch};
use crate::trailer::TrailerCheck;

/// The TTL of a lease the replay grants (one the full snapshot does not hold): its owner is gone after a
/// restore, so its keys expire an hour after the restored member starts, as kube-apiserver's events do.
pub const REPLAYED_LEASE_TTL: i64 = 3600;

/// The point to restore to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Everything stored.
    Latest,
    /// Up to and including this source revision.
    Revision(u64),
    /// What the agent had received from etcd by this time.
    Time(DateTime<Utc>),
}

impl FromStr for Point {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text == "latest" {
            return Ok(Point::Latest);
        }
        if let Ok(revision) = text.parse::<u64>() {
            return Ok(Point::Revision(revision));
        }
        DateTime::parse_from_rfc3339(text)
            .map(|t| Point::Time(t.with_timezone(&Utc)))
            .map_err(|_| "an RFC 3339 time (2026-12-01T12:00:00Z), a revision, or latest".into())
    }
}

impl Point {
    /// Whether the full snapshot can be the base: taken at or before the point.
    fn admits(&self, manifest: &Manifest) -> bool {
        match self {
            Point::Latest => true,
            Point::Revision(n) => manifest.revision <= *n,
            // Its revision bounds are read, and its content fixed, before `startedAt` is taken: a snapshot
            // started by the point holds nothing written after it.
            Point::Time(t) => manifest.started_at <= *t,
        }
    }

    /// Whether replaying up to `revision` has reached the point: a revision point only (a time or `latest` is
    /// reached by the first event past it or the end of the chain).
    fn reached(&self, revision: u64) -> bool {
        matches!(self, Point::Revision(n) if revision >= *n)
    }

    /// Whether a source revision whose events arrived at `received_ms` is past the point.
    fn past(&self, revision: u64, received_ms: i64) -> bool {
        match self {
            Point::Latest => false,
            Point::Revision(n) => revision > *n,
            Point::Time(t) => received_ms > t.timestamp_millis(),
        }
    }
}

/// What a point-in-time restore did.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub snapshot: String,
    /// The full snapshot's exact revision, as restored.
    pub snapshot_revision: u64,
    /// The last source revision replayed (the snapshot's when none was).
    pub revision: u64,
    /// When the agent received that revision's events (absent when no delta was replayed).
    pub received_at: Option<DateTime<Utc>>,
    pub deltas: usize,
    /// The first and the last delta read (each's `from` and `to`), the last perhaps replayed only in part.
    pub first_delta: Option<(u64, u64)>,
    pub last_delta: Option<(u64, u64)>,
    pub transactions: u64,
    /// Why the replay stopped before the point: a broken chain, named.
    pub broken: Option<String>,
    /// The newest wholly replayed delta that carries what the live member reported at its end: that end
    /// revision and the record (a drill compares them).
    pub live: Option<(u64, Live)>,
    /// NOSPACE alarms the snapshot carried (raised when it was taken), disarmed in the restored member.
    pub disarmed: usize,
}

impl Outcome {
    /// Nothing replayed yet: `manifest`'s snapshot restored at its exact `revision`.
    pub fn new(manifest: &Manifest, revision: u64) -> Self {
        Self {
            snapshot: manifest.id.clone(),
            snapshot_revision: revision,
            revision,
            received_at: None,
            deltas: 0,
            first_delta: None,
            last_delta: None,
            transactions: 0,
            broken: None,
            live: None,
            disarmed: 0,
        }
    }
}

/// What the restore needs besides the store.
pub struct Tools<'a> {
    pub etcdutl: &'a Path,
    pub etcd: &'a Path,
    /// Where the scratch member lives (the drills' directory: room for about twice the database).
    pub scratch_root: &'a Path,
    /// The age identity file, for encrypted snapshots and deltas (read once for each).
    pub identity_file: Option<&'a Path>,
    /// The installation's delta key: every delta replayed must carry its signature.
    pub signing: Option<&'a SigningKey>,
}

/// The newest full snapshot of the shard's own cluster (`own`, or the only cluster when its etcd does not
/// answer) at or before `point`.
pub async fn base(store: &Store, shard: &str, own: Option<&Own>, point: Point) -> anyhow::Result<Manifest> {
    let all = crate::catalog::list(store, Some(shard)).await?;
    let cluster = match own {
        Some(own) => Some(own.cluster_id.clone()),
        None => generation::only_cluster(&all).map_err(|e| anyhow::anyhow!(e))?,
    };
    let admitted: Vec<Manifest> = all
        .into_iter()
        .filter(|m| match own {
            Some(own) => own.owns(m),
            None => Some(generation::cluster_of(m)) == cluster.as_deref(),
        })
        .filter(|m| point.admits(m))
        .collect();
    let Point::Time(t) = point else {
        return admitted.into_iter().next().ok_or_else(|| none_before(shard, point));
    };
    // A time between a snapshot's end and the moment the deltas' watch moved under it is covered by the chain
    // before it, whose watch still ran: the newest base whose chain was watched at the point.
    for manifest in &admitted {
        if watched_from(store, manifest).await?.0.is_none_or(|since| since <= t.timestamp_millis()) {
            return Ok(manifest.clone());
        }
    }
    admitted.into_iter().next().ok_or_else(|| none_before(shard, point))
}

fn none_before(shard: &str, point: Point) -> anyhow::Error {
    anyhow::anyhow!("no full snapshot of shard {shard}'s etcd cluster at or before {point:?}")
}

/// When the watch that wrote the first delta of `manifest`'s chain opened (`None`: no delta, or not recorded),
/// and where its last delta ends.
async fn watched_from(store: &Store, manifest: &Manifest) -> anyhow::Result<(Option<i64>, Option<u64>)> {
    let location = Location::from_id(&store.prefix, &manifest.id).context("the manifest's id is not valid")?;
    let keys = super::chain_keys(store, &manifest.shard, &location).await?;
    let (Some((_, first)), Some((_, last))) = (keys.first(), keys.last()) else { return Ok((None, None)) };
    let since = super::read_meta(store, first).await?.and_then(|m| m.watching_since_ms);
    Ok((since, super::read_meta(store, last).await?.map(|m| m.to)))
}

/// A snapshot newer than `manifest`, started by `t`, whose chain's watch opened after `t` and reaches past
/// `reached`: with when that watch opened.
async fn watched_after(
    store: &Store,
    (manifest, listed): (&Manifest, &[Manifest]),
    t: DateTime<Utc>,
    reached: u64,
) -> anyhow::Result<Option<(Manifest, i64)>> {
    let cluster = generation::cluster_of(manifest);
    for newer in listed.iter().cloned() {
        let later = newer.started_at > manifest.started_at && newer.started_at <= t;
        if !later || generation::cluster_of(&newer) != cluster {
            continue;
        }
        if let (Some(since), Some(end)) = watched_from(store, &newer).await?
            && since > t.timestamp_millis()
            && end > reached
        {
            return Ok(Some((newer, since)));
        }
    }
    Ok(None)
}

/// Restores `manifest` and its deltas up to `point` into `flags.data_dir` (see the module).
pub async fn restore_at(
    store: &Store,
    manifest: Manifest,
    point: Point,
    tools: Tools<'_>,
    flags: &MemberFlags,
) -> anyhow::Result<Outcome> {
    ensure!(
        !flags.data_dir.exists(),
        "the data directory {} exists; restore never overwrites",
        flags.data_dir.display()
    );
    let mut scratch = Scratch::new(tools.scratch_root, &manifest.shard).map_err(|e| anyhow::anyhow!("{e}"))?;
    let read = || tools.identity_file.map(restore::read_identities).transpose();
    let identities = read()?;
    let (fetched, status) = restore::fetch_proven(store, manifest, read()?, scratch.path(), tools.etcdutl).await?;
    let manifest = fetched.manifest.clone();
    let exact = status.revision as u64;
    if let Point::Revision(n) = point {
        ensure!(exact <= n, "snapshot {} holds revision {exact}, past the point {n}", manifest.id);
    }

    let quota = manifest.db_size_bytes.saturating_mul(4).max(4 << 30);
    let (mut client, _, disarmed) =
        throwaway::restore_and_start(&mut scratch, (tools.etcdutl, tools.etcd), &fetched.db, quota).await?;

    let mut outcome = Outcome { disarmed, ..Outcome::new(&manifest, exact) };
    let keys = (identities.as_deref(), tools.signing);
    replay(store, &manifest, point, keys, Some(&mut client), &mut outcome).await?;
    let live = crate::member::revision(&mut client).await?;
    ensure!(
        live as u64 == outcome.revision,
        "after replay the member is at revision {live}, the source's last replayed revision is {}",
        outcome.revision
    );

    // The replayed member's database, proven by etcd's own trailer, then restored as any snapshot is.
    let db = scratch.path().join("replayed.db");
    let mut stream = client.snapshot().await.context("snapshotting the replayed member")?;
    let mut sink =
        CheckedFile { file: std::io::BufWriter::new(std::fs::File::create(&db)?), check: TrailerCheck::default() };
    while let Some(chunk) = stream.message().await? {
        std::io::Write::write_all(&mut sink, chunk.blob())?;
    }
    std::io::Write::flush(&mut sink)?;
    sink.check.finish()?;
    drop(client);
    scratch.finish().await;
    restore::restore_member(tools.etcdutl, &db, flags).await?;
    Ok(outcome)
}

/// Walks the chain from the snapshot and replays it into `client` up to `point`; a broken link ends the walk
/// with `outcome.broken` set. `outcome` starts at the snapshot's exact revision (`revision`), no delta
/// replayed. Without a client (`plan`), the same walk, every delta read and proven, nothing applied: the
/// outcome is what a restore to `point` would replay.
///
/// Fails when the walk ends inside a replacement of the keyspace by `restore-installation` (its marker key put
/// and not yet deleted, in the snapshot or by a delta): the shard then held part of the restored keys and none of
/// the rest, a state no restore may bring back. Without a client the snapshot's own keys are not read, so a
/// marker it holds is seen only by a restore or a drill.
pub(crate) async fn replay(
    store: &Store,
    manifest: &Manifest,
    point: Point,
    keys: (Option<&[Identity]>, Option<&SigningKey>),
    mut client: Option<&mut etcd_client::Client>,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let mut replacing = None;
    if let Some(client) = client.as_deref_mut() {
        let marker = live::marker(client).await.context("reading the restored snapshot's restore marker")?;
        replacing = marker.map(|m| (m, outcome.revision));
    }
    walk(store, manifest, point, keys, client, outcome, &mut replacing).await?;
    if let Some((marker, since)) = replacing {
        let broken = outcome.broken.as_deref().map(|b| format!("; and {b}")).unwrap_or_default();
        anyhow::bail!(
            "shard {}: at revision {} (the point {point:?}) its keyspace was being replaced by {}, which put its \
             marker by revision {since} and had not finished: the shard held part of the restored keys. Restore to \
             a point before revision {since} or after the replacement finished{broken}",
            manifest.shard,
            outcome.revision,
            marker.describe()
        );
    }
    Ok(())
}

/// [`replay`]'s walk; `replacing` follows the restore marker through the replayed events: the marker and the
/// revision that put it, while it is there.
async fn walk(
    store: &Store,
    manifest: &Manifest,
    point: Point,
    (identities, signing): (Option<&[Identity]>, Option<&SigningKey>),
    mut client: Option<&mut etcd_client::Client>,
    outcome: &mut Outcome,
    replacing: &mut Option<(live::Marker, u64)>,
) -> anyhow::Result<()> {
    let location = Location::from_id(&store.prefix, &manifest.id).context("the manifest's id is not valid")?;
    let cluster = generation::cluster_of(manifest).to_string();
    let mut from = manifest.revision + 1;
    let mut previous: Option<String> = None;
    let mut leases = std::collections::HashSet::new();
    for (start, key) in super::chain_keys(store, &manifest.shard, &location).await? {
        if point.reached(outcome.revision) {
            // What follows (even a broken link) is past the point.
            return Ok(());
        }
        if start < from {
            // Not on the chain (a link already passed by this start): never replayed.
            tracing::warn!(key, "a delta off the chain; skipped");
            continue;
        }
        let stop = |outcome: &mut Outcome, why: String| {
            outcome.broken = Some(format!("the delta chain of {} breaks at revision {from}: {why}", manifest.id));
        };
        if start > from {
            stop(outcome, format!("the delta starting there is missing (the next stored starts at {start})"));
            return Ok(());
        }
        let (meta, header, events) = match read_delta(store, &key, identities).await? {
            Ok(read) => read,
            Err(why) => {
                stop(outcome, why);
                return Ok(());
            }
        };
        let expected = Expected { from, previous: previous.as_deref(), snapshot: &manifest.id, cluster_id: &cluster };
        if let Err(e) = check_link(&expected, &meta, &meta.sha256, &header) {
            stop(outcome, e);
            return Ok(());
        }
        if signing.is_some_and(|key| !meta.signed_by(key)) {
            stop(outcome, "it is not signed with this installation's delta key (deltaSigningKeyFile)".into());
            return Ok(());
        }
        outcome.deltas += 1;
        outcome.first_delta.get_or_insert((meta.from, meta.to));
        outcome.last_delta = Some((meta.from, meta.to));
        for (revision, group) in by_revision(&events) {
            if revision <= outcome.revision {
                // The snapshot already holds it (its exact revision is at or past the manifest's lower bound).
                continue;
            }
            if point.past(revision, group[0].received_ms) {
                if let (Point::Time(t), Some(since)) = (point, header.watching_since_ms)
                    && since > t.timestamp_millis()
                {
                    // Delivered by a watch that opened after the point: its events' commit times are unknown
                    // (the agent was down, or leadership moved), so the point cannot be placed among them, unless
                    // the session before proved that nothing was committed after the last revision by then.
                    let at = outcome.received_at.map_or_else(|| "the snapshot".into(), stamp);
                    let why = format!(
                        "no watch of the shard ran at the point: the last revision received before it is {} ({at}), \
                         the next ones were delivered by a watch opened at {}, after writes of unknown time",
                        outcome.revision,
                        stamp_ms(since)
                    );
                    between_sessions(store, (&[manifest], signing), (t, since), why, outcome).await?;
                }
                return Ok(());
            }
            if revision != outcome.revision + 1 {
                stop(
                    outcome,
                    format!("revision {} is not in the delta (it jumps to {revision})", outcome.revision + 1),
                );
                return Ok(());
            }
            if let Some(client) = client.as_deref_mut() {
                apply(client, revision, group, &mut leases).await?;
            }
            for e in group.iter().filter(|e| e.key == live::MARKER_KEY.as_bytes()) {
                *replacing = match e.kind {
                    Kind::Put => Some((live::Marker::from_value(&e.value), revision)),
                    Kind::Delete => None,
                };
            }
            outcome.revision = revision;
            outcome.received_at = DateTime::from_timestamp_millis(group[0].received_ms);
            outcome.transactions += 1;
        }
        if let Some(live) = meta.live {
            outcome.live = Some((meta.to, live));
        }
        from = meta.to + 1;
        previous = Some(meta.sha256);
    }
    ended(store, manifest, (point, signing), outcome).await
}

/// The proof that places `t_ms` at `revision`, the last revision received by then, if one does: a quorum read
/// sent at or after `t_ms` returned `revision`, so nothing after it was committed by `t_ms`.
pub fn placing_proof(proofs: &[RecoveryPoint], t_ms: i64, revision: u64) -> Option<&RecoveryPoint> {
    proofs.iter().filter(|p| p.proven_ms >= t_ms && p.revision == revision).min_by_key(|p| p.proven_ms)
}

/// What a refusal of `t_ms` between two sessions names: the nearest times that can be placed, the last proof
/// before it (up to which the session before it is placed) and `since`, when the next watch opened.
pub fn nearest(proofs: &[RecoveryPoint], t_ms: i64, reached: u64, since: i64) -> String {
    let before = proofs.iter().filter(|p| p.proven_ms < t_ms).max_by_key(|p| p.proven_ms);
    match before {
        Some(p) => format!(
            "the nearest times it can be restored to are {} (revision {}, the last proof of the watch before) and \
             {} (when the next watch opened); or restore --at {reached}",
            stamp(p.time()),
            p.revision,
            stamp_ms(since)
        ),
        None => format!("restore --at {reached} or a time from {} on", stamp_ms(since)),
    }
}

/// The point `t` lies between two sessions: the revisions after `outcome.revision` came from a watch opened at
/// `since`, after `t`. Placed at `outcome.revision` when a session's proof in the chains of `manifests` (of
/// their cluster, signed by `signing` when configured) says so ([`placing_proof`]); otherwise refused:
/// `outcome.broken` is `why` and the nearest times ([`nearest`]).
async fn between_sessions(
    store: &Store,
    (manifests, signing): (&[&Manifest], Option<&SigningKey>),
    (t, since): (DateTime<Utc>, i64),
    why: String,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let proofs = recovery::proofs(store, manifests, signing).await?;
    let (t_ms, reached) = (t.timestamp_millis(), outcome.revision);
    if placing_proof(&proofs, t_ms, reached).is_none() {
        outcome.broken = Some(format!("{why}; {}", nearest(&proofs, t_ms, reached, since)));
    }
    Ok(())
}

/// The chain ran out before `point` was passed: whether that is the point or a short restore (`outcome.broken`
/// says why).
async fn ended(
    store: &Store,
    manifest: &Manifest,
    (point, signing): (Point, Option<&SigningKey>),
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    // A time point is checked against the newer snapshots of the shard, listed once.
    let listed = match point {
        Point::Time(_) => crate::catalog::list(store, Some(&manifest.shard)).await?,
        _ => Vec::new(),
    };
    if let Point::Time(t) = point
        && let Some(newer) = newer_than(manifest, &listed, outcome.revision)
    {
        // The chain ends before a revision a newer snapshot holds: while its writer ran, the chain reached at least
        // that far, so deltas are missing (deleted, or never written while no watch ran), and the point may lie
        // among them, unless a proof of its writer places it before them. Never a silent short restore.
        let proofs = recovery::proofs(store, &[manifest], signing).await?;
        if placing_proof(&proofs, t.timestamp_millis(), outcome.revision).is_some() {
            return Ok(());
        }
        let (chain, reached, newer, at) = (&manifest.id, outcome.revision, &newer, t.to_rfc3339());
        outcome.broken = Some(format!(
            "the delta chain of {chain} ends at revision {reached}, but the newer snapshot {} holds revision {}: the \
             deltas between are missing, and the point {at} may lie among them; the nearest points are revision \
             {reached} and snapshot {} (started {})",
            newer.id,
            newer.revision,
            newer.id,
            newer.started_at.to_rfc3339()
        ));
    }
    if let Point::Time(t) = point
        && outcome.broken.is_none()
        && let Some((newer, since)) = watched_after(store, (manifest, &listed), t, outcome.revision).await?
    {
        // The chain ends (its writer stopped, or its last deltas are gone) before the point, and the revisions
        // after its end were next delivered by a watch under a newer snapshot that opened after the point: their
        // commit times are unknown, so the point cannot be placed among them, unless a proof of the session before
        // places it.
        let why = format!(
            "no stored delta places the point {}: the delta chain of {} ends at revision {} (its watch stopped, or \
             its later deltas are gone), and the next revisions were delivered under snapshot {} by a watch opened \
             at {}",
            stamp(t),
            manifest.id,
            outcome.revision,
            newer.id,
            stamp_ms(since)
        );
        between_sessions(store, (&[manifest, &newer], signing), (t, since), why, outcome).await?;
    }
    if let Point::Revision(n) = point
        && outcome.revision < n
    {
        // The chain ends before the point: nothing stored reaches it (a revision not written yet, or deltas
        // that retention, a compaction gap or an outage left out). Never a silent short restore.
        outcome.broken = Some(format!(
            "the delta chain of {} ends at revision {}, before the point {n}: no stored delta reaches it",
            manifest.id, outcome.revision
        ));
    }
    Ok(())
}

/// The oldest snapshot of `manifest`'s cluster past `reached`.
fn newer_than<'a>(manifest: &Manifest, listed: &'a [Manifest], reached: u64) -> Option<&'a Manifest> {
    let cluster = generation::cluster_of(manifest);
    listed.iter().filter(|m| generation::cluster_of(m) == cluster && m.revision > reached).min_by_key(|m| m.revision)
}

/// One delta object read and proven by its own sha256 (only a payload whose sha256 matches is decoded: it is
/// then what the writer wrote): its metadata, header and events, or why the chain breaks at it.
async fn read_delta(
    store: &Store,
    key: &str,
    identities: Option<&[Identity]>,
) -> anyhow::Result<Result<(Meta, super::Header, Vec<super::Event>), String>> {
    let Some(object) = store.get_with_metadata(key).await? else {
        return Ok(Err("the delta starting there is missing".into()));
    };
    let actual = hex::encode(Sha256::digest(&object.body));
    let meta = match Meta::from_metadata(&object.metadata) {
        Ok(meta) => meta,
        Err(e) => return Ok(Err(format!("its metadata: {e}"))),
    };
    let name = key.rsplit('/').next().unwrap_or_default();
    let (_, compression, encrypted) = parse_name(name).context("a delta name")?;
    if encrypted && identities.is_none() {
        anyhow::bail!("the deltas are encrypted with age: give --identity-file");
    }
    if meta.sha256 != actual {
        return Ok(Err(format!("its object's sha256 is {actual}, its metadata says {}", meta.sha256)));
    }
    let mut payload = Vec::new();
    if let Err(e) = encode::decode(&object.body[..], compression, identities.filter(|_| encrypted), &mut payload) {
        return Ok(Err(format!("its payload does not decode: {e:#}")));
    }
    Ok(decode_payload(&payload).map(|(header, events)| (meta, header, events)))
}

/// Replays one source transaction (every event at `revision`) as one transaction, its leases granted first;
/// fails unless the member commits it at the source's revision.
async fn apply(
    client: &mut etcd_client::Client,
    revision: u64,
    group: &[super::Event],
    leases: &mut std::collections::HashSet<i64>,
) -> anyhow::Result<()> {
    for e in group.iter().filter(|e| e.lease != 0) {
        if leases.insert(e.lease) {
            grant(client, e.lease).await?;
        }
    }
    let ops: Vec<TxnOp> = group
        .iter()
        .map(|e| match e.kind {
            Kind::Put if e.lease != 0 => {
                TxnOp::put(e.key.clone(), e.value.clone(), Some(PutOptions::new().with_lease(e.lease)))
            }
            Kind::Put => TxnOp::put(e.key.clone(), e.value.clone(), None),
            Kind::Delete => TxnOp::delete(e.key.clone(), None),
        })
        .collect();
    let response =
        client.txn(Txn::new().and_then(ops)).await.with_context(|| format!("replaying revision {revision}"))?;
    let replayed = response.header().map(|h| h.revision()).unwrap_or_default() as u64;
    ensure!(replayed == revision, "revision {revision} of the source replayed as {replayed}");
    Ok(())
}

/// Grants lease `id` unless the member holds it already (restored with the full snapshot).
async fn grant(client: &mut etcd_client::Client, id: i64) -> anyhow::Result<()> {
    match client.lease_grant(REPLAYED_LEASE_TTL, Some(LeaseGrantOptions::new().with_id(id))).await {
        Ok(_) => Ok(()),
        Err(e) if e.to_string().contains("lease already exists") => Ok(()),
        Err(e) => Err(anyhow::anyhow!("granting lease {id:x} for the replay: {e}")),
    }
}

/// The restore's summary for people, and the exit code's reason when the chain broke.
pub fn summary(outcome: &Outcome, point: Point) -> String {
    let at = outcome.received_at.map(|t| format!(" (received {})", t.to_rfc3339())).unwrap_or_default();
    let mut text = format!(
        "restored snapshot {} (revision {}) and {} delta(s), {} transaction(s) replayed: the source's revision {}{at}, \
         asked for {point:?}\n",
        outcome.snapshot, outcome.snapshot_revision, outcome.deltas, outcome.transactions, outcome.revision
    );
    if outcome.disarmed > 0 {
        text.push_str(
            "the snapshot was taken while etcd's NOSPACE alarm was raised; the alarm is disarmed in the restored \
             member (free space in the cluster you restore into before kcp writes to it)\n",
        );
    }
    if let Some(broken) = &outcome.broken {
        text.push_str(&format!("STOPPED AT THE LAST GOOD POINT, revision {}: {broken}\n", outcome.revision));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_is_latest_a_revision_or_an_rfc3339_time_and_nothing_else() {
        assert_eq!("latest".parse(), Ok(Point::Latest));
        assert_eq!("1042".parse(), Ok(Point::Revision(1042)));
        let t = DateTime::parse_from_rfc3339("2026-12-01T12:00:00+01:00").unwrap().with_timezone(&Utc);
        assert_eq!("2026-12-01T12:00:00+01:00".parse(), Ok(Point::Time(t)));
        assert!("yesterday".parse::<Point>().is_err());
        assert!(Point::Time(t).past(5, t.timestamp_millis() + 1));
        assert!(!Point::Time(t).past(5, t.timestamp_millis()));
        assert!(Point::Revision(10).past(11, 0) && !Point::Revision(10).past(10, 0));
    }

    /// Session 1 received revision 41 last at T1 and proved (T1p, 41) at T1 + 5 s, after (T0, 39) earlier;
    /// session 2's watch opened at T1 + 20 s.
    fn session_one() -> (Vec<RecoveryPoint>, i64, i64, i64) {
        let t1 = 1_796_000_000_000;
        let proof = |ms: i64, revision| {
            RecoveryPoint::new("root", (ms, revision, revision), ("root/20261130T120000Z-r10", "c1"), None)
                .for_session(t1 - 60_000, None)
        };
        (vec![proof(t1 - 10_000, 39), proof(t1 + 5_000, 41)], t1, t1 + 5_000, t1 + 20_000)
    }

    #[test]
    fn a_time_between_the_last_event_and_the_sessions_last_proof_is_placed_at_the_last_revision() {
        let (proofs, t1, t1p, _) = session_one();
        for t in [t1, t1 + 1, t1p - 1, t1p] {
            let placed = placing_proof(&proofs, t, 41).map(|p| p.proven_ms);
            assert_eq!(placed, Some(t1p), "{t}: the quorum read at {t1p} returned 41");
        }
        assert_eq!(placing_proof(&proofs, t1, 40), None, "a proof places only the revision it read");
        assert_eq!(placing_proof(&proofs, t1 - 20_000, 39).map(|p| p.proven_ms), Some(t1 - 10_000));
    }

    #[test]
    fn a_time_after_the_last_proof_and_before_the_next_watch_is_refused_naming_the_nearest_times() {
        let (proofs, _, t1p, since) = session_one();
        for t in [t1p + 1, since - 1] {
            assert_eq!(placing_proof(&proofs, t, 41), None, "{t}: no read proves what was committed by then");
            let named = nearest(&proofs, t, 41, since);
            assert!(named.contains(&stamp_ms(t1p)) && named.contains(&stamp_ms(since)), "{named}");
            assert!(named.contains("revision 41") && named.contains("restore --at 41"), "{named}");
        }
        assert_eq!(stamp_ms(t1p), "2026-11-30T00:53:25.000Z");
        let without = nearest(&[], t1p + 1, 41, since);
        assert_eq!(without, "restore --at 41 or a time from 2026-11-30T00:53:40.000Z on");
    }
}
