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

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::SigningKey;
use crate::manifest;
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
            hmac_sha256: None,
        };
        point.hmac_sha256 = key.map(|key| key.sign(point.signed_text().as_bytes()));
        point
    }

    /// The proven time.
    pub fn time(&self) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(self.proven_ms).unwrap_or_default()
    }

    /// What the installation's key signs: every field but the signature, the shard's name included (a record
    /// copied to another shard's directory does not verify there).
    fn signed_text(&self) -> String {
        format!(
            "kcp-keeper-recovery-point-v1\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n",
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
}
