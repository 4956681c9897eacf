//! The recovery point stored in the bucket: one small object per shard, `<prefix>/<shard>/recovery-point.json`
//! beside the shard's snapshot directories (and its `run.lock`), that says "the store holds this shard as it was
//! at this time". The delta writer proves that point from quorum reads (`writer`'s `Session::prove`) and
//! rewrites the object when the point advances, at most once per `deltas.interval`; so a one-shot (`plan`) knows
//! how far each shard's chain reaches in time, a quiet shard included (its last delta may be old while it is
//! covered up to now).
//!
//! The object is no snapshot: catalog listing, retention and the clean-up of an interrupted run look only at
//! manifests, data objects and deltas under a snapshot's directory, and this key is none of those. It is
//! rewritten in place, so it is never written under object lock (like the shard lock). Each write is
//! conditional on the version this writer last saw (`If-Match`, or `If-None-Match: *` for the first), so an old
//! leader in its last seconds never moves a newer point back: a refused write reads the object again and
//! writes only a point past the stored one.
//!
//! With the installation's delta key ([`SigningKey`]), the record carries its HMAC-SHA256 as deltas do, and a
//! reader holding the key refuses a record without a valid one: a bucket writer cannot claim a point the
//! chain does not reach.
//!
//! Each session of the writer (one watch, from when it opened) also stores its newest proof in the chain it
//! writes, `<snapshot dir>/deltas/proofs/<watching_since_ms, 20 digits>.json`: the same record with the
//! session's `watchingSinceMs`, signed alike. The shard's object keeps only the newest session's point; these
//! keep every session's, so a restore can place a time between a session's last event and its last proof, when
//! the next session's watch had not opened yet (`replay`), and `plan --at latest-consistent` knows each
//! session's span. They are rewritten in place too (never under object lock), deleted with their snapshot.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::SigningKey;
use crate::delta;
use crate::manifest::{self, Location, Manifest};
use crate::storage::{Condition, Store};

/// The object's name inside the shard's directory.
pub const RECOVERY_POINT: &str = "recovery-point.json";
const FORMAT_VERSION: u32 = 1;

/// `<prefix>/<shard>/recovery-point.json`.
pub fn object_key(prefix: &str, shard: &str) -> String {
    format!("{}{RECOVERY_POINT}", manifest::shard_dir(prefix, shard))
}

/// What the object says: the store holds `shard` as it was at `proven_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecoveryPoint {
    pub format_version: u32,
    pub shard: String,
    /// When the quorum read that proved the point was sent (Unix ms): every write etcd acknowledged before it
    /// is in the store.
    pub proven_ms: i64,
    /// The same time for people (RFC 3339); a record where the two disagree is refused.
    pub proven_at: String,
    /// The revision that quorum read returned: every write acknowledged before `proven_ms` is at or below it.
    pub revision: u64,
    /// The last revision the stored chain held when the point was written (at or past `revision`).
    pub stored_revision: u64,
    /// The full snapshot whose delta chain holds the point.
    pub snapshot: String,
    pub cluster_id: String,
    /// In a session's proof in the chain only: when the session's watch opened (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watching_since_ms: Option<i64>,
    /// HMAC-SHA256 by the installation's delta key over the fields above; absent without a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hmac_sha256: Option<String>,
}

impl RecoveryPoint {
    /// A record of `shard`'s point, signed with `key` when there is one.
    pub fn new(
        shard: &str,
        (proven_ms, revision, stored_revision): (i64, u64, u64),
        (snapshot, cluster_id): (&str, &str),
        key: Option<&SigningKey>,
    ) -> Self {
        let proven_at = DateTime::from_timestamp_millis(proven_ms).unwrap_or_default();
        let mut point = Self {
            format_version: FORMAT_VERSION,
            shard: shard.into(),
            proven_ms,
            proven_at: proven_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            revision,
            stored_revision,
            snapshot: snapshot.into(),
            cluster_id: cluster_id.into(),
            watching_since_ms: None,
            hmac_sha256: None,
        };
        point.hmac_sha256 = key.map(|key| key.sign(point.signed_text().as_bytes()));
        point
    }

    /// The same point as the proof of the session whose watch opened at `watching_since_ms`, signed with `key`
    /// when there is one.
    pub fn for_session(&self, watching_since_ms: i64, key: Option<&SigningKey>) -> Self {
        let mut proof = Self { watching_since_ms: Some(watching_since_ms), hmac_sha256: None, ..self.clone() };
        proof.hmac_sha256 = key.map(|key| key.sign(proof.signed_text().as_bytes()));
        proof
    }

    /// The proven time.
    pub fn time(&self) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(self.proven_ms).unwrap_or_default()
    }

    /// What the installation's key signs: every field but the signature, the shard's name included (a record
    /// copied to another shard's directory does not verify there). A session's proof signs its session too,
    /// under another name (the shard's record is no proof, nor the other way round).
    fn signed_text(&self) -> String {
        let (kind, session) = match self.watching_since_ms {
            None => ("recovery-point", String::new()),
            Some(since) => ("session-proof", format!("{since}\n")),
        };
        format!(
            "kcp-keeper-{kind}-v1\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{session}",
            self.shard,
            self.snapshot,
            self.cluster_id,
            self.proven_ms,
            self.revision,
            self.stored_revision,
            self.proven_at
        )
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a recovery point serializes")
    }

    /// Parses the object of `shard` (untrusted: anyone with the bucket's write key can edit it): exactly this
    /// format, for this shard, its two times equal, and signed by `key` when one is configured.
    pub fn from_json(bytes: &[u8], shard: &str, key: Option<&SigningKey>) -> Result<Self, String> {
        let point: Self = serde_json::from_slice(bytes).map_err(|e| format!("it does not parse: {e}"))?;
        if point.format_version != FORMAT_VERSION {
            return Err(format!("format version {} is not {FORMAT_VERSION}", point.format_version));
        }
        if point.shard != shard {
            return Err(format!("it names shard {:?}", point.shard));
        }
        let at = DateTime::parse_from_rfc3339(&point.proven_at).map_err(|_| "provenAt is not a time".to_string())?;
        if at.timestamp_millis() != point.proven_ms {
            return Err("provenAt and provenMs disagree".into());
        }
        if point.stored_revision < point.revision {
            return Err("the chain it names stores less than the revision it proves".into());
        }
        match (key, &point.hmac_sha256) {
            (Some(_), None) => Err("it is not signed, and a delta signing key is configured".into()),
            (Some(key), Some(tag)) if !key.verifies(point.signed_text().as_bytes(), tag) => {
                Err("its signature does not verify with this installation's delta key (altered)".into())
            }
            _ => Ok(point),
        }
    }
}

/// A session's proof read from the chain of `snapshot` at its object's name's session (`watching_since_ms`):
/// [`RecoveryPoint::from_json`]'s checks, and it names that snapshot and that session.
pub fn proof_from_json(
    bytes: &[u8],
    (shard, snapshot, watching_since_ms): (&str, &str, i64),
    key: Option<&SigningKey>,
) -> Result<RecoveryPoint, String> {
    let proof = RecoveryPoint::from_json(bytes, shard, key)?;
    if proof.snapshot != snapshot {
        return Err(format!("it names snapshot {}, not the one whose chain holds it", proof.snapshot));
    }
    if proof.watching_since_ms != Some(watching_since_ms) {
        return Err(format!(
            "it names session {:?}, not {watching_since_ms} as its name says",
            proof.watching_since_ms
        ));
    }
    Ok(proof)
}

/// The session proofs stored in the chains of `snapshots`, each of its snapshot's etcd cluster, by session; one
/// refused (damaged, or unsigned or altered with a key configured) is said and left out: a time it alone would
/// place stays refused.
pub async fn proofs(
    store: &Store,
    snapshots: &[&Manifest],
    key: Option<&SigningKey>,
) -> anyhow::Result<Vec<RecoveryPoint>> {
    let mut out = Vec::new();
    for snapshot in snapshots {
        let shard = &snapshot.shard;
        let location = Location::from_id(&store.prefix, &snapshot.id)
            .ok_or_else(|| anyhow::anyhow!("the snapshot id {} is not valid", snapshot.id))?;
        let cluster = crate::generation::cluster_of(snapshot);
        for object in store.list_keys(&format!("{}{}", delta::dir(&location), delta::PROOFS_DIR)).await? {
            let Some((_, since)) = delta::proof_location_of(&store.prefix, shard, &object) else { continue };
            let Some(read) = store.get_versioned(&object).await? else { continue };
            match proof_from_json(&read.body, (shard, &location.id, since), key) {
                Ok(proof) if proof.cluster_id == cluster => out.push(proof),
                Ok(_) => {}
                Err(error) => tracing::warn!(key = object, error, "a session's proof is refused; not used"),
            }
        }
    }
    out.sort_by_key(|p| p.watching_since_ms);
    Ok(out)
}

/// Writes a session's proof into its chain (plainly: one session writes its own object, never locked).
pub async fn store_proof(store: &Store, location: &Location, proof: &RecoveryPoint) -> anyhow::Result<()> {
    let since = proof.watching_since_ms.ok_or_else(|| anyhow::anyhow!("a session's proof names its session"))?;
    store.put(&delta::proof_key(location, since), proof.to_json()).await?;
    Ok(())
}

/// The stored recovery point of `shard`: `None` when there is none (no delta writer has proven one).
pub async fn read(store: &Store, shard: &str, key: Option<&SigningKey>) -> anyhow::Result<Option<RecoveryPoint>> {
    let object = object_key(&store.prefix, shard);
    let Some(read) = store.get_versioned(&object).await? else { return Ok(None) };
    RecoveryPoint::from_json(&read.body, shard, key)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("the recovery point of shard {shard} ({object}) is refused: {e}"))
}

/// The writer's side: the version it last wrote or read, so each write is conditional on it.
#[derive(Debug, Default)]
pub struct Recorder {
    /// The stored object's ETag as this writer last saw it; `None` before the first read.
    seen: Option<Option<String>>,
    /// The point stored, as this writer knows it (Unix ms).
    stored_ms: Option<i64>,
}

impl Recorder {
    /// Stores `point` unless the store already holds one as new or newer: `Ok(true)` when written. A write
    /// refused because another writer changed the object reads it again on the next call.
    pub async fn record(&mut self, store: &Store, point: &RecoveryPoint) -> anyhow::Result<bool> {
        let object = object_key(&store.prefix, &point.shard);
        if self.seen.is_none() {
            let read = store.get_versioned(&object).await?;
            // An unreadable or foreign record is replaced (only this writer proves this shard's point).
            self.stored_ms = read
                .as_ref()
                .and_then(|r| RecoveryPoint::from_json(&r.body, &point.shard, None).ok())
                .filter(|stored| stored.cluster_id == point.cluster_id)
                .map(|stored| stored.proven_ms);
            self.seen = Some(read.map(|r| r.etag));
        }
        if self.stored_ms.is_some_and(|stored| stored >= point.proven_ms) {
            return Ok(false);
        }
        let condition = match self.seen.as_ref().and_then(Option::as_deref) {
            Some(etag) => Condition::Matches(etag),
            None => Condition::Absent,
        };
        match store.put_conditional(&object, point.to_json(), condition).await? {
            Some(etag) => {
                self.seen = Some(Some(etag));
                self.stored_ms = Some(point.proven_ms);
                Ok(true)
            }
            None => {
                // Another writer (an old or a new leader) changed it: read it again next time.
                self.seen = None;
                Ok(false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(key: Option<&SigningKey>) -> RecoveryPoint {
        RecoveryPoint::new("root", (1_796_000_000_123, 41, 42), ("root/20261130T120000Z-r10", "c1"), key)
    }

    #[test]
    fn the_key_sits_beside_the_snapshots_and_is_neither_a_manifest_nor_a_data_object_nor_a_delta() {
        let key = object_key("kcp/etcd", "root");
        assert_eq!(key, "kcp/etcd/root/recovery-point.json");
        assert_eq!(manifest::id_of_manifest_key("kcp/etcd", &key), None);
        assert_eq!(manifest::data_object_location("kcp/etcd", "root", &key), None);
        assert_eq!(crate::delta::location_of("kcp/etcd", "root", &key), None);
    }

    #[test]
    fn a_record_round_trips_and_with_a_key_an_unsigned_or_altered_one_is_refused() {
        let key = SigningKey::from_bytes(&[7u8; 32]).unwrap();
        let signed = point(Some(&key));
        assert_eq!(signed.proven_at, "2026-11-30T00:53:20.123Z");
        assert_eq!(RecoveryPoint::from_json(&signed.to_json(), "root", Some(&key)), Ok(signed.clone()));
        assert_eq!(RecoveryPoint::from_json(&signed.to_json(), "root", None), Ok(signed.clone()), "no key: taken");
        let unsigned = point(None);
        assert!(RecoveryPoint::from_json(&unsigned.to_json(), "root", Some(&key)).unwrap_err().contains("not signed"));
        let later = RecoveryPoint { proven_ms: signed.proven_ms + 60_000, ..signed.clone() };
        let later = RecoveryPoint { proven_at: later.time().to_rfc3339(), ..later };
        assert!(RecoveryPoint::from_json(&later.to_json(), "root", Some(&key)).unwrap_err().contains("altered"));
        let other_key = SigningKey::from_bytes(&[8u8; 32]).unwrap();
        assert!(RecoveryPoint::from_json(&signed.to_json(), "root", Some(&other_key)).is_err());
        assert!(RecoveryPoint::from_json(&signed.to_json(), "alpha", None).unwrap_err().contains("names shard"));
        let disagreeing = RecoveryPoint { proven_ms: signed.proven_ms + 1, ..unsigned.clone() };
        assert!(RecoveryPoint::from_json(&disagreeing.to_json(), "root", None).unwrap_err().contains("disagree"));
        assert!(RecoveryPoint::from_json(b"{\"formatVersion\":1}", "root", None).is_err());
    }

    #[test]
    fn a_sessions_proof_is_signed_with_its_session_and_with_a_key_an_unsigned_or_altered_one_is_refused() {
        let key = SigningKey::from_bytes(&[7u8; 32]).unwrap();
        let since = 1_796_000_000_000;
        let names = ("root", "root/20261130T120000Z-r10", since);
        let proof = point(Some(&key)).for_session(since, Some(&key));
        assert_eq!(proof.watching_since_ms, Some(since));
        assert_eq!(proof_from_json(&proof.to_json(), names, Some(&key)), Ok(proof.clone()));
        assert!(String::from_utf8(proof.to_json()).unwrap().contains("\"watchingSinceMs\": 1796000000000"));
        let unsigned = point(None).for_session(since, None);
        assert_eq!(proof_from_json(&unsigned.to_json(), names, None), Ok(unsigned.clone()), "no key: taken");
        assert!(proof_from_json(&unsigned.to_json(), names, Some(&key)).unwrap_err().contains("not signed"));
        let moved = RecoveryPoint { watching_since_ms: Some(since - 60_000), ..proof.clone() };
        let moved_names = ("root", "root/20261130T120000Z-r10", since - 60_000);
        assert!(proof_from_json(&moved.to_json(), moved_names, Some(&key)).unwrap_err().contains("altered"));
        let later = RecoveryPoint { revision: 41, stored_revision: 43, ..proof.clone() };
        assert!(proof_from_json(&later.to_json(), names, Some(&key)).unwrap_err().contains("altered"));
        // The shard's record is no proof: its signature does not verify as one, with the session added.
        let record = point(Some(&key));
        let as_proof = RecoveryPoint { watching_since_ms: Some(since), ..record.clone() };
        assert!(proof_from_json(&as_proof.to_json(), names, Some(&key)).unwrap_err().contains("altered"));
        assert!(proof_from_json(&record.to_json(), names, None).unwrap_err().contains("session"));
        let elsewhere = ("root", "root/20261201T120000Z-r99", since);
        assert!(proof_from_json(&proof.to_json(), elsewhere, Some(&key)).unwrap_err().contains("names snapshot"));
        let other_session = ("root", "root/20261130T120000Z-r10", since + 1);
        assert!(proof_from_json(&proof.to_json(), other_session, Some(&key)).unwrap_err().contains("session"));
        assert_eq!(RecoveryPoint::from_json(&record.to_json(), "root", Some(&key)), Ok(record), "still a record");
    }
}
