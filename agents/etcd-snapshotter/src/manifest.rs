//! Where a snapshot lives in the bucket and what its manifest says.
//!
//! Layout: `<prefix>/<shard>/<UTC time>-r<revision>/` holds the data object (`snapshot.db`, plus `.zst` and
//! `.age` as configured) and `manifest.json`, written last. A snapshot exists only if its manifest does:
//! a data object without one is an interrupted run, never listed, and cleaned by a later run once provably
//! abandoned and this agent's (`snapshot::clean_interrupted`). The id of a
//! snapshot is `<shard>/<time>-r<revision>`. Names are for people; order comes from the manifest's revision.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub const MANIFEST: &str = "manifest.json";
pub const FORMAT_VERSION: u32 = 1;

/// The bucket location of one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// `<prefix>/` or empty.
    pub root: String,
    pub id: String,
}

impl Location {
    pub fn new(prefix: &str, shard: &str, taken_at: DateTime<Utc>, revision: u64) -> Self {
        Self { root: root(prefix), id: format!("{shard}/{}-r{revision}", taken_at.format("%Y%m%dT%H%M%SZ")) }
    }

    /// From an id given by an operator (`root/20261130T120000Z-r42`): shard and name, nothing else.
    pub fn from_id(prefix: &str, id: &str) -> Option<Self> {
        let (shard, name) = id.split_once('/')?;
        let (time, revision) = name.split_once("-r")?;
        let ok = !shard.is_empty()
            && !shard.contains("..")
            && time.len() == 16
            && time.bytes().all(|b| b.is_ascii_digit() || b == b'T' || b == b'Z')
            && revision.parse::<u64>().is_ok();
        ok.then(|| Self { root: root(prefix), id: id.into() })
    }

    pub fn dir(&self) -> String {
        format!("{}{}/", self.root, self.id)
    }

    pub fn manifest_key(&self) -> String {
        format!("{}{MANIFEST}", self.dir())
    }

    pub fn object_key(&self, compression: &str, encrypted: bool) -> String {
        format!("{}{}", self.dir(), object_name(compression, encrypted))
    }
}

/// `snapshot.db`, `snapshot.db.zst`, `snapshot.db.zst.age`.
pub fn object_name(compression: &str, encrypted: bool) -> String {
    let mut name = String::from("snapshot.db");
    if compression == "zstd" {
        name.push_str(".zst");
    }
    if encrypted {
        name.push_str(".age");
    }
    name
}

/// Every name a data object of this agent has (`object_name` of each configuration).
pub const OBJECT_NAMES: [&str; 4] = ["snapshot.db", "snapshot.db.zst", "snapshot.db.age", "snapshot.db.zst.age"];

/// The location of the snapshot whose data object `key` would be, if `key` has exactly the shape this agent
/// writes under `shard`: `<prefix>/<shard>/<time>-r<revision>/snapshot.db[.zst][.age]`. Anything else under the
/// prefix (a hand-placed `etcdctl` snapshot, notes) is not ours, whatever its name resembles.
pub fn data_object_location(prefix: &str, shard: &str, key: &str) -> Option<Location> {
    let rest = key.strip_prefix(&shard_dir(prefix, shard))?;
    let (name, object) = rest.split_once('/')?;
    let location = Location::from_id(prefix, &format!("{shard}/{name}"))?;
    OBJECT_NAMES.contains(&object).then_some(location)
}

/// `<prefix>/` or empty: what every key in a store starts with.
pub fn root(prefix: &str) -> String {
    if prefix.is_empty() { String::new() } else { format!("{prefix}/") }
}

/// `<prefix>/<shard>/`: everything of one shard.
pub fn shard_dir(prefix: &str, shard: &str) -> String {
    format!("{}{shard}/", root(prefix))
}

/// The id of the snapshot whose manifest is `key`, if `key` is a manifest under `prefix`.
pub fn id_of_manifest_key<'a>(prefix: &str, key: &'a str) -> Option<&'a str> {
    let rest = key.strip_prefix(&root(prefix))?;
    let id = rest.strip_suffix(MANIFEST)?.strip_suffix('/')?;
    (id.matches('/').count() == 1).then_some(id)
}

/// What a published snapshot is. Every field is checked or measured, none is configuration echoed back
/// except the recipients' public ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    pub format_version: u32,
    pub id: String,
    pub shard: String,
    /// etcd's cluster id (hex), as the member's status reported it: snapshots are ordered, kept and picked
    /// among those of one cluster (`generation`). Absent in manifests written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    pub member: Member,
    pub etcd_version: String,
    /// A store revision the snapshot provably holds, a lower bound: the member's revision read before the
    /// stream was requested (etcd puts no revision in the stream; see `snapshot::bracket`). The snapshot holds
    /// exactly this revision when `revisionUpperBound` equals it; a drill reports the exact one. Key count
    /// and HashKV are recorded at this revision, so they compare against any restore of the snapshot.
    pub revision: u64,
    /// The member's revision read after the stream's first message: the snapshot holds at most this
    /// revision. Absent in manifests written before it existed, whose `revision` was exact (two reads that
    /// agreed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_upper_bound: Option<u64>,
    /// The compact revision HashKV reported; -1 when HashKV could not be recorded.
    pub compact_revision: i64,
    /// Keys at `revision`.
    pub key_count: u64,
    /// `HashKV(revision)` on the live member, for drills to compare a restored member against; absent when
    /// the member could not compute it at snapshot time (a drill then reports HashKV "not comparable").
    #[serde(default)]
    pub hash_kv: Option<u32>,
    /// The object's key relative to the snapshot's directory.
    pub object: String,
    /// The etcd database as streamed (with its 32-byte trailing sha256).
    pub db_size_bytes: u64,
    pub object_size_bytes: u64,
    /// The sha256 etcd appended to the stream, which we recomputed and matched before publishing.
    pub etcd_sha256: String,
    /// sha256 of the object as stored (after compression and encryption).
    pub object_sha256: String,
    pub compression: String,
    /// age recipients the object is encrypted to; empty when not encrypted.
    pub encryption_recipients: Vec<String>,
    pub agent_version: String,
    /// The kcp the shard ran, on a snapshot taken because its image changed (`shards[].beforeUpgrade`): the
    /// image before the change and the one rolled to. Absent otherwise, and in older manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kcp: Option<crate::upgrade::KcpVersion>,
    /// The schedule tick this snapshot was taken for (absent for a one-shot `snapshot`).
    #[serde(default)]
    pub tick: Option<DateTime<Utc>>,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub stream_seconds: f64,
    pub total_seconds: f64,
    /// Bytes that went through the local spill directory because S3 lagged.
    pub spilled_bytes: u64,
    /// Not written by this agent and never trusted: a manifest is editable, so "verified" comes only from a
    /// passing drill report whose hashes match this manifest and its object (`drill_report`). Kept so that
    /// manifests carrying it still parse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Member {
    pub name: String,
    pub id: String,
    pub endpoint: String,
}

impl Manifest {
    /// Whether a database at `exact` (as etcdutl or a restored member reads it) is what this manifest
    /// describes: within `[revision, revisionUpperBound]`.
    pub fn holds_revision(&self, exact: u64) -> bool {
        self.revision <= exact && exact <= self.revision_upper_bound.unwrap_or(self.revision)
    }

    /// The bounds as people read them: `42` when exact, `42..45` otherwise.
    pub fn revision_bounds(&self) -> String {
        match self.revision_upper_bound {
            Some(upper) if upper != self.revision => format!("{}..{upper}", self.revision),
            _ => self.revision.to_string(),
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        crate::json::object(self)
    }

    /// Parses a manifest read from the bucket. `object` must be one of the names this agent writes: retention
    /// deletes `<dir>/<object>`, and a manifest is an object anyone with write access can edit.
    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        let manifest: Self = serde_json::from_slice(bytes)?;
        if !OBJECT_NAMES.contains(&manifest.object.as_str()) {
            return Err(serde::de::Error::custom("object is not a data object name of this agent"));
        }
        Ok(manifest)
    }

    /// The retention entry; `verified` is what the drill report proves (see `Listed` in the catalog).
    pub fn entry(&self, verified: bool) -> crate::retention::Entry {
        crate::retention::Entry { id: self.id.clone(), revision: self.revision, taken_at: self.started_at, verified }
    }
}

#[cfg(test)]
pub(crate) fn sample() -> Manifest {
    let at = DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z").unwrap().with_timezone(&Utc);
    Manifest {
        format_version: FORMAT_VERSION,
        id: "root/20261130T120000Z-r1000".into(),
        shard: "root".into(),
        cluster_id: Some("cdf818194e3a8c32".into()),
        member: Member {
            name: "root-0".into(),
            id: "8e9e05c52164694d".into(),
            endpoint: "http://127.0.0.1:2379".into(),
        },
        etcd_version: "3.6.16".into(),
        revision: 1000,
        revision_upper_bound: Some(1000),
        compact_revision: 0,
        key_count: 17,
        hash_kv: Some(123),
        object: "snapshot.db.zst".into(),
        db_size_bytes: 20512,
        object_size_bytes: 3000,
        etcd_sha256: "00".repeat(32),
        object_sha256: "11".repeat(32),
        compression: "zstd".into(),
        encryption_recipients: vec![],
        agent_version: "0.1.0".into(),
        kcp: None,
        tick: None,
        started_at: at,
        finished_at: at,
        stream_seconds: 0.5,
        total_seconds: 1.0,
        spilled_bytes: 0,
        verified_at: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_name_time_and_revision_and_ids_round_trip() {
        let at = DateTime::parse_from_rfc3339("2026-11-30T12:00:05Z").unwrap().with_timezone(&Utc);
        let loc = Location::new("kcp/etcd", "root", at, 1000);
        assert_eq!(loc.id, "root/20261130T120005Z-r1000");
        assert_eq!(loc.manifest_key(), "kcp/etcd/root/20261130T120005Z-r1000/manifest.json");
        assert_eq!(loc.object_key("zstd", true), "kcp/etcd/root/20261130T120005Z-r1000/snapshot.db.zst.age");
        assert_eq!(Location::new("", "root", at, 7).object_key("none", false), "root/20261130T120005Z-r7/snapshot.db");
        assert_eq!(Location::from_id("kcp/etcd", &loc.id), Some(loc.clone()));
        assert_eq!(id_of_manifest_key("kcp/etcd", &loc.manifest_key()), Some(loc.id.as_str()));
        assert_eq!(id_of_manifest_key("kcp/etcd", "kcp/etcd/root/x/snapshot.db"), None);
        let ours = "kcp/etcd/root/20261130T120005Z-r1000/snapshot.db.zst.age";
        assert_eq!(data_object_location("kcp/etcd", "root", ours), Some(loc.clone()));
        for not_ours in [
            "kcp/etcd/root/etcdctl-snapshot.db",
            "kcp/etcd/root/20261130T120005Z-r1000/notes.txt",
            "kcp/etcd/root/20261130T120005Z-r1000/manifest.json",
            "kcp/etcd/root/20261130T120005Z-r1000/x/snapshot.db",
            "kcp/etcd/root/backup-r1000/snapshot.db",
            "kcp/etcd/alpha/20261130T120005Z-r1000/snapshot.db",
        ] {
            assert_eq!(data_object_location("kcp/etcd", "root", not_ours), None, "{not_ours}");
        }
        for bad in ["root", "../x/20261130T120005Z-r1", "root/20261130T120005Z-rX", "root/now-r1"] {
            assert_eq!(Location::from_id("p", bad), None, "{bad}");
        }
    }

    #[test]
    fn the_manifest_round_trips_and_rejects_unknown_fields() {
        let m = sample();
        assert_eq!(Manifest::from_json(&m.to_json()).unwrap(), m);
        let text = String::from_utf8(m.to_json()).unwrap().replace("\"revision\"", "\"revison\"");
        assert!(Manifest::from_json(text.as_bytes()).is_err());
        // Retention deletes `<dir>/<object>`: an edited manifest cannot point it at anything else.
        let text = String::from_utf8(m.to_json()).unwrap().replace("snapshot.db.zst", "notes.txt");
        assert!(Manifest::from_json(text.as_bytes()).is_err());
    }
}
