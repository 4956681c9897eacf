//! Delta snapshots, the pure part: what one delta object holds, where it lives, and what makes a chain.
//!
//! A delta is the watch events of a revision range `[from, to]` of one shard, received after a full snapshot:
//! `<snapshot dir>/deltas/<from, 20 digits>.delta[.zst][.age]`, its payload compressed and encrypted exactly
//! as full snapshots are (`encode`). Each one names, in its user metadata and again inside its payload, its
//! range, its full snapshot's id, the etcd cluster id and the sha256 of the delta before it (none for the
//! first, which starts at the full snapshot's revision + 1); the metadata also carries its own object's
//! sha256. Restore walks the chain from the full snapshot, delta by delta, and stops at the first that is
//! missing, altered or not linked to the one before (`check_link`).
//!
//! Names carry only `from`: a delta is written with `If-None-Match: *`, so two writers (an old leader in its
//! last seconds and the new one) can never both write the chain's next link; the loser re-reads the store.
//! The writer is `delta::writer`, the replay `delta::replay`.
//!
//! A delta may also carry what the live member reported at its last revision `to` when it was written
//! ([`Live`]: HashKV, its compact revision, the key count), in its metadata and its payload's header alike:
//! a drill replays the chain to the newest delta that carries one and compares (`drill::chain`).

pub mod recovery;
pub mod replay;
pub mod writer;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::manifest::{self, Location};
pub use crate::signing::SigningKey;

/// The directory of a snapshot's deltas, inside the snapshot's directory.
pub const DELTAS_DIR: &str = "deltas/";
/// The payload's first bytes: the format and its version.
const MAGIC: &[u8] = b"KCPKDELTA1\n";
/// Metadata names (`x-amz-meta-<name>`), lowercase as stores return them.
pub const META_FROM: &str = "delta-from";
pub const META_TO: &str = "delta-to";
pub const META_SHA256: &str = "delta-sha256";
pub const META_PREVIOUS: &str = "delta-previous-sha256";
pub const META_SNAPSHOT: &str = "delta-snapshot";
pub const META_CLUSTER: &str = "delta-cluster-id";
pub const META_EVENTS: &str = "delta-events";
pub const META_LIVE_HASH_KV: &str = "delta-live-hash-kv";
pub const META_LIVE_COMPACT: &str = "delta-live-compact-revision";
pub const META_LIVE_KEYS: &str = "delta-live-key-count";
pub const META_WATCHING_SINCE: &str = "delta-watching-since-ms";
pub const META_HMAC: &str = "delta-hmac-sha256";
/// The previous hash of a chain's first delta.
const NO_PREVIOUS: &str = "none";

/// `00000000000000001001.delta.zst.age`: the range's start, zero-padded so names sort as numbers.
pub fn object_name(from: u64, compression: &str, encrypted: bool) -> String {
    let mut name = format!("{from:020}.delta");
    if compression == "zstd" {
        name.push_str(".zst");
    }
    if encrypted {
        name.push_str(".age");
    }
    name
}

/// `<snapshot dir>/deltas/`.
pub fn dir(location: &Location) -> String {
    format!("{}{DELTAS_DIR}", location.dir())
}

/// A delta object's name as this agent writes it: its `from`, compression and whether it is encrypted.
pub fn parse_name(name: &str) -> Option<(u64, &'static str, bool)> {
    let (digits, rest) = name.split_at_checked(20)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (compression, encrypted) = match rest {
        ".delta" => ("none", false),
        ".delta.zst" => ("zstd", false),
        ".delta.age" => ("none", true),
        ".delta.zst.age" => ("zstd", true),
        _ => return None,
    };
    Some((digits.parse().ok()?, compression, encrypted))
}

/// The snapshot and `from` of the delta object `key`, if `key` has exactly the shape this agent writes under
/// `shard`: `<prefix>/<shard>/<time>-r<revision>/deltas/<from>.delta[.zst][.age]`.
pub fn location_of(prefix: &str, shard: &str, key: &str) -> Option<(Location, u64)> {
    let (location, object) = in_deltas_dir(prefix, shard, key)?;
    let (from, _, _) = parse_name(object)?;
    Some((location, from))
}

/// The snapshot of a key under a snapshot's `deltas/` of `shard`, and the key's name inside that directory.
fn in_deltas_dir<'a>(prefix: &str, shard: &str, key: &'a str) -> Option<(Location, &'a str)> {
    let rest = key.strip_prefix(&manifest::shard_dir(prefix, shard))?;
    let (name, rest) = rest.split_once('/')?;
    let object = rest.strip_prefix(DELTAS_DIR)?;
    Some((Location::from_id(prefix, &format!("{shard}/{name}"))?, object))
}

/// The directory of a snapshot's session proofs, inside its `deltas/` (`recovery::proofs`).
pub const PROOFS_DIR: &str = "proofs/";

/// `proofs/00000001796000000123.json`: the session's `watching_since_ms`, zero-padded so names sort by it.
pub fn proof_name(watching_since_ms: i64) -> String {
    format!("{PROOFS_DIR}{watching_since_ms:020}.json")
}

/// `<snapshot dir>/deltas/proofs/<watching_since_ms, 20 digits>.json`.
pub fn proof_key(location: &Location, watching_since_ms: i64) -> String {
    format!("{}{}", dir(location), proof_name(watching_since_ms))
}

/// The snapshot and session (`watching_since_ms`) of the proof object `key`, if `key` has exactly the shape
/// this agent writes under `shard`; the inverse of [`proof_key`].
pub fn proof_location_of(prefix: &str, shard: &str, key: &str) -> Option<(Location, i64)> {
    let (location, object) = in_deltas_dir(prefix, shard, key)?;
    let since = parse_proof_name(object)?;
    Some((location, since))
}

/// The session of a proof's name inside `deltas/` (`proofs/<20 digits>.json`).
pub fn parse_proof_name(name: &str) -> Option<i64> {
    let digits = name.strip_prefix(PROOFS_DIR)?.strip_suffix(".json")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok())?
}

/// What kind of change an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Put,
    Delete,
}

/// What the live member reported for a delta's last revision `to` when the delta was written: `HashKV(to)`,
/// the compact revision that hash began at, and the number of keys at `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Live {
    pub hash_kv: u32,
    pub compact_revision: i64,
    pub key_count: u64,
}

/// One watch event as stored: enough to replay it (the key's create revision and version follow from
/// replaying every revision in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: Kind,
    /// The revision the change was committed at (the key's mod revision; a delete's own revision).
    pub revision: u64,
    /// When this agent received it from the watch (Unix milliseconds): `restore --at <time>` replays what was
    /// received by then, never what was committed later.
    pub received_ms: i64,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// The lease a put attached (0: none). etcd stores it in the key's value record, so HashKV covers it:
    /// a replay that dropped it would not reproduce the source.
    pub lease: i64,
}

impl Event {
    /// Bytes it takes in the payload (the memory bound counts these).
    pub fn size(&self) -> u64 {
        (1 + 8 + 8 + 4 + 4 + self.key.len() + self.value.len() + if self.lease != 0 { 8 } else { 0 }) as u64
    }
}

/// Event kinds in the payload: a put with a lease is its own kind (the lease follows the value), so payloads
/// written before leases were kept still read.
const PUT: u8 = 1;
const DELETE: u8 = 2;
const PUT_WITH_LEASE: u8 = 3;

/// The header inside the payload, repeating the metadata's chain so that an edited metadata is caught when
/// the payload is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Header {
    pub from: u64,
    pub to: u64,
    pub snapshot: String,
    pub cluster_id: String,
    pub previous_sha256: Option<String>,
    /// What the live member reported at `to` (absent when it was not read for this delta).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<Live>,
    /// When the watch that delivered these events opened (Unix ms): events of revisions committed before then
    /// (an agent restart, a new leader, a new full snapshot) were delivered then, so their receipt time says
    /// only that they were committed before it. Absent in deltas written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watching_since_ms: Option<i64>,
}

/// The payload before compression and encryption.
pub fn encode_payload(header: &Header, events: &[Event]) -> Vec<u8> {
    let json = serde_json::to_vec(header).expect("a header serializes");
    let mut out =
        Vec::with_capacity(MAGIC.len() + 4 + json.len() + events.iter().map(|e| e.size() as usize).sum::<usize>() + 9);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    for event in events {
        out.push(match event.kind {
            Kind::Put if event.lease != 0 => PUT_WITH_LEASE,
            Kind::Put => PUT,
            Kind::Delete => DELETE,
        });
        out.extend_from_slice(&event.revision.to_le_bytes());
        out.extend_from_slice(&event.received_ms.to_le_bytes());
        out.extend_from_slice(&(event.key.len() as u32).to_le_bytes());
        out.extend_from_slice(&event.key);
        out.extend_from_slice(&(event.value.len() as u32).to_le_bytes());
        out.extend_from_slice(&event.value);
        if event.kind == Kind::Put && event.lease != 0 {
            out.extend_from_slice(&event.lease.to_le_bytes());
        }
    }
    out.push(0);
    out.extend_from_slice(&(events.len() as u64).to_le_bytes());
    out
}

/// Reads a payload (untrusted: it comes from the bucket): exactly the format, every length within the bytes,
/// revisions inside the header's range and never going down, the event count at the end.
pub fn decode_payload(bytes: &[u8]) -> Result<(Header, Vec<Event>), String> {
    let mut r = Reader(bytes);
    if r.take(MAGIC.len())? != MAGIC {
        return Err("not a delta of this format".into());
    }
    let len = r.u32()? as usize;
    let header: Header = serde_json::from_slice(r.take(len)?).map_err(|e| format!("the header: {e}"))?;
    if header.from > header.to {
        return Err(format!("the range {}..{} is empty", header.from, header.to));
    }
    let mut events = Vec::new();
    loop {
        let (kind, leased) = match r.take(1)?[0] {
            0 => break,
            PUT => (Kind::Put, false),
            DELETE => (Kind::Delete, false),
            PUT_WITH_LEASE => (Kind::Put, true),
            other => return Err(format!("event {}: unknown kind {other}", events.len())),
        };
        let revision = r.u64()?;
        let received_ms = r.u64()? as i64;
        let key_len = r.u32()? as usize;
        let key = r.take(key_len)?.to_vec();
        let value_len = r.u32()? as usize;
        let value = r.take(value_len)?.to_vec();
        let lease = if leased { r.u64()? as i64 } else { 0 };
        if leased && lease == 0 {
            return Err(format!("event {}: a leased put with lease 0", events.len()));
        }
        let last = events.last().map_or(header.from, |e: &Event| e.revision);
        if revision < last || revision > header.to {
            return Err(format!(
                "event {}: revision {revision} out of order or outside {}..{}",
                events.len(),
                header.from,
                header.to
            ));
        }
        events.push(Event { kind, revision, received_ms, key, value, lease });
    }
    let count = r.u64()?;
    if count != events.len() as u64 || !r.0.is_empty() {
        return Err(format!("{} events read, the end says {count}", events.len()));
    }
    Ok((header, events))
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err("the payload ends early".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
}

/// A delta's chain as its user metadata states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub from: u64,
    pub to: u64,
    /// sha256 (hex) of the stored object.
    pub sha256: String,
    /// sha256 of the delta before it; `None` for the first after the full snapshot.
    pub previous: Option<String>,
    pub snapshot: String,
    pub cluster_id: String,
    pub events: u64,
    pub live: Option<Live>,
    /// The header's `watchingSinceMs`, repeated so a restore picks its base without reading payloads.
    pub watching_since_ms: Option<i64>,
    /// HMAC-SHA256 by the installation's delta key over the delta's chain identity and object hash
    /// ([`SigningKey`]); absent when no key is configured.
    pub hmac: Option<String>,
}

impl Meta {
    pub fn to_metadata(&self) -> Vec<(&'static str, String)> {
        let mut metadata = vec![
            (META_FROM, self.from.to_string()),
            (META_TO, self.to.to_string()),
            (META_SHA256, self.sha256.clone()),
            (META_PREVIOUS, self.previous.clone().unwrap_or_else(|| NO_PREVIOUS.into())),
            (META_SNAPSHOT, self.snapshot.clone()),
            (META_CLUSTER, self.cluster_id.clone()),
            (META_EVENTS, self.events.to_string()),
        ];
        if let Some(live) = &self.live {
            metadata.extend([
                (META_LIVE_HASH_KV, live.hash_kv.to_string()),
                (META_LIVE_COMPACT, live.compact_revision.to_string()),
                (META_LIVE_KEYS, live.key_count.to_string()),
            ]);
        }
        if let Some(since) = self.watching_since_ms {
            metadata.push((META_WATCHING_SINCE, since.to_string()));
        }
        if let Some(hmac) = &self.hmac {
            metadata.push((META_HMAC, hmac.clone()));
        }
        metadata
    }

    /// Parses the metadata of an object others can write: numbers, 64 hex digits, nothing else taken.
    pub fn from_metadata(metadata: &HashMap<String, String>) -> Result<Self, String> {
        let get = |name: &str| metadata.get(name).map(String::as_str).ok_or_else(|| format!("no {name} metadata"));
        let number = |name: &str| get(name)?.parse::<u64>().map_err(|_| format!("{name} is not a revision"));
        let hash = |name: &str, text: &str| {
            (text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| text.to_ascii_lowercase())
                .ok_or_else(|| format!("{name} is not a sha256"))
        };
        let previous = match get(META_PREVIOUS)? {
            NO_PREVIOUS => None,
            text => Some(hash(META_PREVIOUS, text)?),
        };
        let meta = Self {
            from: number(META_FROM)?,
            to: number(META_TO)?,
            sha256: hash(META_SHA256, get(META_SHA256)?)?,
            previous,
            snapshot: get(META_SNAPSHOT)?.to_string(),
            cluster_id: get(META_CLUSTER)?.to_string(),
            events: number(META_EVENTS)?,
            live: live(metadata)?,
            watching_since_ms: match metadata.get(META_WATCHING_SINCE) {
                None => None,
                Some(text) => Some(text.parse::<i64>().map_err(|_| format!("{META_WATCHING_SINCE} is not a time"))?),
            },
            hmac: metadata.get(META_HMAC).map(|text| hash(META_HMAC, text)).transpose()?,
        };
        if meta.from > meta.to {
            return Err(format!("the range {}..{} is empty", meta.from, meta.to));
        }
        Ok(meta)
    }
}

/// The live record of a delta's metadata: all three numbers or none (an older delta, or one written while
/// the live member's HashKV could not be read).
fn live(metadata: &HashMap<String, String>) -> Result<Option<Live>, String> {
    let names = [META_LIVE_HASH_KV, META_LIVE_COMPACT, META_LIVE_KEYS];
    let values: Vec<Option<&String>> = names.iter().map(|n| metadata.get(*n)).collect();
    if values.iter().all(Option::is_none) {
        return Ok(None);
    }
    let [Some(hash), Some(compact), Some(keys)] = values[..] else {
        return Err(format!("the live record needs all of {}", names.join(", ")));
    };
    Ok(Some(Live {
        hash_kv: hash.parse().map_err(|_| format!("{META_LIVE_HASH_KV} is not a 32-bit hash"))?,
        compact_revision: compact
            .parse::<i64>()
            .ok()
            // -1: a member never compacted.
            .filter(|c| *c >= -1)
            .ok_or_else(|| format!("{META_LIVE_COMPACT} is not a revision"))?,
        key_count: keys.parse().map_err(|_| format!("{META_LIVE_KEYS} is not a count"))?,
    }))
}

/// What the next link of a chain must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected<'a> {
    pub from: u64,
    pub previous: Option<&'a str>,
    pub snapshot: &'a str,
    pub cluster_id: &'a str,
}

impl Expected<'_> {
    /// Whether a delta's metadata names the expected start, predecessor, snapshot and cluster (the metadata
    /// half of [`check_link`]).
    pub fn admits(&self, meta: &Meta) -> Result<(), String> {
        if meta.from != self.from {
            return Err(format!("it starts at revision {}, the chain continues at {}", meta.from, self.from));
        }
        if meta.previous.as_deref() != self.previous {
            return Err(format!(
                "it follows a delta with sha256 {}, the chain's last is {}",
                meta.previous.as_deref().unwrap_or(NO_PREVIOUS),
                self.previous.unwrap_or(NO_PREVIOUS)
            ));
        }
        if meta.snapshot != self.snapshot || meta.cluster_id != self.cluster_id {
            return Err(format!("it belongs to snapshot {} of cluster {}", meta.snapshot, meta.cluster_id));
        }
        Ok(())
    }
}

/// The delta objects under the snapshot at `location` (of `shard`) by the revision each starts at, in order.
pub(crate) async fn chain_keys(
    store: &crate::storage::Store,
    shard: &str,
    location: &Location,
) -> anyhow::Result<Vec<(u64, String)>> {
    let mut keys: Vec<(u64, String)> = store
        .list_keys(&dir(location))
        .await?
        .into_iter()
        .filter_map(|key| Some((location_of(&store.prefix, shard, &key)?.1, key)))
        .collect();
    keys.sort();
    Ok(keys)
}

/// Whether a delta is the chain's next link: its metadata names the expected start, predecessor, snapshot and
/// cluster, its object's sha256 (`actual_sha256`, measured) is the one it states, and its payload's header
/// repeats its metadata.
pub fn check_link(expected: &Expected<'_>, meta: &Meta, actual_sha256: &str, header: &Header) -> Result<(), String> {
    if meta.sha256 != actual_sha256 {
        return Err(format!("its object's sha256 is {actual_sha256}, its metadata says {}", meta.sha256));
    }
    expected.admits(meta)?;
    let stated = Header {
        from: meta.from,
        to: meta.to,
        snapshot: meta.snapshot.clone(),
        cluster_id: meta.cluster_id.clone(),
        previous_sha256: meta.previous.clone(),
        live: meta.live,
        watching_since_ms: meta.watching_since_ms,
    };
    if &stated != header {
        return Err("its payload's header does not repeat its metadata".into());
    }
    Ok(())
}

impl Meta {
    /// What the installation's key signs: the delta's chain identity and its object's sha256 (which covers its
    /// payload and header).
    fn signed_text(&self) -> String {
        format!(
            "kcp-keeper-delta-v1\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n",
            self.snapshot,
            self.cluster_id,
            self.from,
            self.to,
            self.previous.as_deref().unwrap_or(NO_PREVIOUS),
            self.sha256,
            self.events
        )
    }

    /// This delta's signature by `key`, as hex.
    pub fn signature(&self, key: &SigningKey) -> String {
        key.sign(self.signed_text().as_bytes())
    }

    /// Whether it carries `key`'s signature of itself.
    pub fn signed_by(&self, key: &SigningKey) -> bool {
        self.hmac.as_deref().is_some_and(|tag| key.verifies(self.signed_text().as_bytes(), tag))
    }
}

/// A stored delta's metadata, `None` when it is gone or does not parse.
pub async fn read_meta(store: &crate::storage::Store, key: &str) -> anyhow::Result<Option<Meta>> {
    Ok(store.head_metadata(key).await?.and_then(|metadata| Meta::from_metadata(&metadata).ok()))
}

/// Events grouped by revision, in order: each group was one transaction in the source and is replayed as one.
pub fn by_revision(events: &[Event]) -> Vec<(u64, &[Event])> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=events.len() {
        if i == events.len() || events[i].revision != events[start].revision {
            out.push((events[start].revision, &events[start..i]));
            start = i;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: Kind, revision: u64, key: &str) -> Event {
        Event {
            kind,
            revision,
            received_ms: 1_700_000_000_000 + revision as i64,
            key: key.into(),
            value: vec![revision as u8; 3],
            lease: 0,
        }
    }

    /// The metadata of a delta from 11 to 14 of snapshot r10, with no live record.
    fn meta() -> Meta {
        Meta {
            from: 11,
            to: 14,
            sha256: "ab".repeat(32),
            previous: None,
            snapshot: "root/20261130T120000Z-r10".into(),
            cluster_id: "c1".into(),
            events: 4,
            live: None,
            watching_since_ms: None,
            hmac: None,
        }
    }

    #[test]
    fn a_signed_delta_verifies_only_with_its_key_and_unchanged() {
        let key = SigningKey::from_bytes(&[7u8; 32]).unwrap();
        let mut signed = meta();
        signed.hmac = Some(signed.signature(&key));
        assert!(signed.signed_by(&key));
        let parsed = Meta::from_metadata(&signed.to_metadata().into_iter().map(|(k, v)| (k.into(), v)).collect());
        assert!(parsed.unwrap().signed_by(&key), "the signature survives the object's metadata");
        assert!(!signed.signed_by(&SigningKey::from_bytes(&[8u8; 32]).unwrap()), "another key");
        for altered in [Meta { to: 15, ..signed.clone() }, Meta { sha256: "cd".repeat(32), ..signed.clone() }] {
            assert!(!altered.signed_by(&key), "{altered:?}");
        }
        assert!(!meta().signed_by(&key), "unsigned");
        let short = SigningKey::from_bytes(b"only sixteen byt").unwrap_err();
        assert!(short.contains("at least 32 bytes") && !short.contains("sixteen"), "{short}");
        assert_eq!(format!("{key:?}"), "SigningKey(redacted)");
    }

    fn header() -> Header {
        Header {
            from: 11,
            to: 14,
            snapshot: "root/20261130T120000Z-r10".into(),
            cluster_id: "c1".into(),
            previous_sha256: None,
            live: None,
            watching_since_ms: None,
        }
    }

    #[test]
    fn a_payload_round_trips_and_every_damage_is_an_error() {
        let events = vec![
            event(Kind::Put, 11, "/a"),
            event(Kind::Put, 12, "/b"),
            event(Kind::Delete, 12, "/c"),
            event(Kind::Put, 14, "/a"),
        ];
        let bytes = encode_payload(&header(), &events);
        assert_eq!(decode_payload(&bytes), Ok((header(), events.clone())));
        assert!(decode_payload(&bytes[..bytes.len() - 1]).is_err(), "cut short");
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_payload(&longer).is_err(), "trailing bytes");
        let mut other_kind = bytes.clone();
        let first_event = MAGIC.len() + 4 + serde_json::to_vec(&header()).unwrap().len();
        other_kind[first_event] = 7;
        assert!(decode_payload(&other_kind).unwrap_err().contains("unknown kind"));
        let outside = encode_payload(&header(), &[event(Kind::Put, 15, "/a")]);
        assert!(decode_payload(&outside).unwrap_err().contains("outside"));
        let backwards = encode_payload(&header(), &[event(Kind::Put, 13, "/a"), event(Kind::Put, 12, "/a")]);
        assert!(decode_payload(&backwards).is_err());
        let mut huge_key = bytes.clone();
        huge_key[first_event + 17..first_event + 21].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_payload(&huge_key).unwrap_err().contains("ends early"), "a length past the bytes");
        assert_eq!(
            by_revision(&events).iter().map(|(r, e)| (*r, e.len())).collect::<Vec<_>>(),
            [(11, 1), (12, 2), (14, 1)]
        );
    }

    #[test]
    fn names_and_keys_have_one_shape_and_nothing_else_is_a_delta() {
        assert_eq!(object_name(1001, "zstd", true), "00000000000000001001.delta.zst.age");
        assert_eq!(parse_name("00000000000000001001.delta.zst.age"), Some((1001, "zstd", true)));
        assert_eq!(parse_name("00000000000000001001.delta"), Some((1001, "none", false)));
        for bad in
            ["1001.delta", "0000000000000000100x.delta", "00000000000000001001.delta.gz", "00000000000000001001.json"]
        {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
        let key = "kcp/etcd/root/20261130T120000Z-r10/deltas/00000000000000000011.delta.zst";
        let (location, from) = location_of("kcp/etcd", "root", key).unwrap();
        assert_eq!((location.id.as_str(), from), ("root/20261130T120000Z-r10", 11));
        for not_ours in [
            "kcp/etcd/root/20261130T120000Z-r10/deltas/notes.txt",
            "kcp/etcd/root/20261130T120000Z-r10/00000000000000000011.delta.zst",
            "kcp/etcd/root/handmade/deltas/00000000000000000011.delta.zst",
            "kcp/etcd/alpha/20261130T120000Z-r10/deltas/00000000000000000011.delta.zst",
        ] {
            assert_eq!(location_of("kcp/etcd", "root", not_ours), None, "{not_ours}");
        }
    }

    #[test]
    fn a_sessions_proof_lives_in_deltas_proofs_and_is_no_delta() {
        let location = Location::from_id("kcp/etcd", "root/20261130T120000Z-r10").unwrap();
        let key = proof_key(&location, 1_796_000_000_123);
        assert_eq!(key, "kcp/etcd/root/20261130T120000Z-r10/deltas/proofs/00000001796000000123.json");
        assert_eq!(location_of("kcp/etcd", "root", &key), None, "no delta: never off the chain");
        assert_eq!(parse_name("proofs/00000001796000000123.json"), None);
        let (at, since) = proof_location_of("kcp/etcd", "root", &key).unwrap();
        assert_eq!((at.id.as_str(), since), ("root/20261130T120000Z-r10", 1_796_000_000_123));
        for not_a_proof in [
            "kcp/etcd/root/20261130T120000Z-r10/deltas/proofs/notes.json",
            "kcp/etcd/root/20261130T120000Z-r10/deltas/proofs/1796000000123.json",
            "kcp/etcd/root/20261130T120000Z-r10/deltas/00000001796000000123.json",
            "kcp/etcd/root/20261130T120000Z-r10/deltas/00000000000000000011.delta.zst",
            "kcp/etcd/alpha/20261130T120000Z-r10/deltas/proofs/00000001796000000123.json",
        ] {
            assert_eq!(proof_location_of("kcp/etcd", "root", not_a_proof), None, "{not_a_proof}");
        }
    }

    #[test]
    fn a_leased_put_keeps_its_lease_and_a_leased_put_with_lease_0_is_an_error() {
        let leased = Event { lease: 0x694d_7a1b_0000_0001, ..event(Kind::Put, 12, "/events/e1") };
        let events = vec![event(Kind::Put, 11, "/a"), leased.clone()];
        let bytes = encode_payload(&header(), &events);
        assert_eq!(decode_payload(&bytes), Ok((header(), events)));
        let mut zero = bytes.clone();
        let lease_at = zero.len() - 9 - 8;
        zero[lease_at..lease_at + 8].copy_from_slice(&0i64.to_le_bytes());
        assert!(decode_payload(&zero).unwrap_err().contains("lease 0"));
    }

    #[test]
    fn the_live_record_travels_in_metadata_and_header_and_a_partial_or_edited_one_is_refused() {
        let live = Live { hash_kv: 3_000_000_000, compact_revision: 9, key_count: 40 };
        let meta = Meta { live: Some(live), ..meta() };
        let map = |m: &Meta| -> HashMap<String, String> {
            m.to_metadata().into_iter().map(|(k, v)| (k.to_string(), v)).collect()
        };
        assert_eq!(Meta::from_metadata(&map(&meta)), Ok(meta.clone()));
        let with_live = Header { live: Some(live), ..header() };
        let bytes = encode_payload(&with_live, &[]);
        assert_eq!(decode_payload(&bytes).unwrap().0, with_live);
        let expected = Expected { from: 11, previous: None, snapshot: &meta.snapshot, cluster_id: "c1" };
        assert_eq!(check_link(&expected, &meta, &meta.sha256, &with_live), Ok(()));
        let edited = Meta { live: Some(Live { hash_kv: 1, ..live }), ..meta.clone() };
        assert!(check_link(&expected, &edited, &meta.sha256, &with_live).is_err(), "metadata edited alone");
        let mut partial = map(&meta);
        partial.remove(META_LIVE_KEYS);
        assert!(Meta::from_metadata(&partial).unwrap_err().contains("all of"));
        let mut negative = map(&meta);
        negative.insert(META_LIVE_COMPACT.into(), "-2".into());
        assert!(Meta::from_metadata(&negative).is_err());
        let mut never_compacted = map(&meta);
        never_compacted.insert(META_LIVE_COMPACT.into(), "-1".into());
        assert_eq!(Meta::from_metadata(&never_compacted).unwrap().live.unwrap().compact_revision, -1);
        let mut none = map(&meta);
        for name in [META_LIVE_HASH_KV, META_LIVE_COMPACT, META_LIVE_KEYS] {
            none.remove(name);
        }
        assert_eq!(Meta::from_metadata(&none).unwrap().live, None, "an older delta has none");
    }

    #[test]
    fn a_link_is_checked_against_its_hash_its_predecessor_and_its_payload() {
        let meta = meta();
        let parsed = Meta::from_metadata(&meta.to_metadata().into_iter().map(|(k, v)| (k.to_string(), v)).collect());
        assert_eq!(parsed.as_ref(), Ok(&meta));
        let expected = Expected { from: 11, previous: None, snapshot: &meta.snapshot, cluster_id: "c1" };
        assert_eq!(check_link(&expected, &meta, &meta.sha256, &header()), Ok(()));
        assert!(check_link(&expected, &meta, &"cd".repeat(32), &header()).unwrap_err().contains("sha256"));
        let later = Expected { from: 15, ..expected.clone() };
        assert!(check_link(&later, &meta, &meta.sha256, &header()).unwrap_err().contains("continues at 15"));
        let prev = "ef".repeat(32);
        let after = Expected { previous: Some(&prev), ..expected.clone() };
        assert!(check_link(&after, &meta, &meta.sha256, &header()).unwrap_err().contains("follows"));
        let edited = Header { to: 13, ..header() };
        assert!(check_link(&expected, &meta, &meta.sha256, &edited).is_err(), "metadata and payload disagree");
        let mut bad: HashMap<String, String> =
            meta.to_metadata().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        bad.insert(META_SHA256.into(), "../../etc".into());
        assert!(Meta::from_metadata(&bad).is_err());
    }
}
