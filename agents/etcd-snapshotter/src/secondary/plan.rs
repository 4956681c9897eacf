//! What the second store should hold, the pure part: which snapshots (the second store's own retention
//! applied to every snapshot either store knows), which objects of each and in what order, and which copies
//! are known to be verified.

use std::collections::{HashMap, HashSet};

use crate::drill_report;
use crate::manifest::{Location, MANIFEST, Manifest};
use crate::retention::{self, Entry, Policy, Trigger};
use crate::storage::StoredObject;

/// What an object of the second store is, or what failed on it: the `kind` label, each of [`Kind::VARIANTS`]
/// exported at 0 from the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum Kind {
    /// Listing the second store (it does not answer, or refuses the credentials).
    Listing,
    /// A full snapshot's data object.
    Snapshot,
    Delta,
    Manifest,
    DrillReport,
    /// Applying the second store's retention.
    Retention,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// How the bytes an object must have are known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// The data object: the manifest's `objectSha256` (hex).
    Sha256(String),
    /// A delta: the sha256 its own metadata states (`delta-sha256`), read from the primary.
    DeltaMetadata,
    /// A manifest, drill report or session's proof: whatever the primary holds now (rewritten in place).
    PrimaryBytes,
}

/// One object to mirror: its key relative to the store's prefix (the same on both stores), its kind and how
/// its bytes are known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    pub relative: String,
    pub kind: Kind,
    pub expected: Expected,
}

/// The snapshots the second store keeps, newest first, and the newest of them: its own policy applied to every
/// snapshot of the shard's own cluster that either store holds, as if it had all of them. A snapshot the
/// second store's retention would delete is then never copied, and one the primary deleted stays as long as
/// the second store's policy keeps it.
pub fn kept(primary: &[Entry], secondary: &[Entry], policy: &Policy) -> (HashSet<String>, Option<String>) {
    let mut by_id: HashMap<&str, Entry> = HashMap::new();
    for entry in primary.iter().chain(secondary) {
        by_id.entry(&entry.id).and_modify(|known| known.verified |= entry.verified).or_insert_with(|| entry.clone());
    }
    let mut all: Vec<Entry> = by_id.into_values().collect();
    retention::newest_first(&mut all);
    let Some(newest) = all.first().map(|e| e.id.clone()) else { return (HashSet::new(), None) };
    let decision = retention::plan(&all, policy, &Trigger::AfterSuccess(newest.clone()));
    (decision.keep.into_iter().map(|(id, _)| id).collect(), Some(newest))
}

/// The objects of the published snapshot `manifest` on the primary (`listed` under its prefix `primary_root`),
/// in copy order: the data object, its drill report, the manifest (so a snapshot is listed on the second store
/// only once its data is there and proven), then its deltas by revision (a chain copied in order never has a
/// gap: a restore from the second store stops at the newest delta copied, never at a hole), then its sessions'
/// proofs.
pub fn objects_of(primary_root: &str, manifest: &Manifest, listed: &[StoredObject]) -> Vec<Object> {
    let dir = format!("{}/", manifest.id);
    let relative = |key: &str| key.strip_prefix(primary_root).map(str::to_string);
    let present: HashSet<String> = listed.iter().filter_map(|o| relative(&o.key)).collect();
    let mut out = vec![Object {
        relative: format!("{dir}{}", manifest.object),
        kind: Kind::Snapshot,
        expected: Expected::Sha256(manifest.object_sha256.clone()),
    }];
    let report = format!("{dir}{}", drill_report::REPORT);
    if present.contains(&report) {
        out.push(Object { relative: report, kind: Kind::DrillReport, expected: Expected::PrimaryBytes });
    }
    out.push(Object { relative: format!("{dir}{MANIFEST}"), kind: Kind::Manifest, expected: Expected::PrimaryBytes });
    let deltas_dir = format!("{dir}{}", crate::delta::DELTAS_DIR);
    let mut deltas: Vec<(u64, String)> = present
        .iter()
        .filter_map(|key| {
            let name = key.strip_prefix(&deltas_dir)?;
            Some((crate::delta::parse_name(name)?.0, key.clone()))
        })
        .collect();
    deltas.sort();
    out.extend(deltas.into_iter().map(|(_, relative)| Object {
        relative,
        kind: Kind::Delta,
        expected: Expected::DeltaMetadata,
    }));
    // Then the sessions' proofs (rewritten in place, as a manifest is): after the deltas they prove, so a proof
    // copied names a revision the second store's chain holds, and one behind a missing delta is not copied.
    let mut proofs: Vec<String> = present
        .iter()
        .filter(|key| key.strip_prefix(&deltas_dir).and_then(crate::delta::parse_proof_name).is_some())
        .cloned()
        .collect();
    proofs.sort();
    out.extend(proofs.into_iter().map(|relative| Object {
        relative,
        kind: Kind::Delta,
        expected: Expected::PrimaryBytes,
    }));
    out
}

/// Whether `id` names a snapshot location (so a manifest of another shape is never mirrored).
pub fn valid_id(id: &str) -> bool {
    Location::from_id("", id).is_some()
}

/// Copies known to be verified: the relative key, the primary's ETag of the version copied and the second
/// store's ETag of the copy read back. A copy is in sync while both stores still list those ETags; anything
/// else (a new primary version, an object replaced on the second store, a restart, which starts empty) is
/// checked again by hash.
#[derive(Debug, Default)]
pub struct Verified(HashMap<String, (String, String)>);

impl Verified {
    pub fn in_sync(&self, relative: &str, primary_etag: &str, secondary_etag: Option<&str>) -> bool {
        self.0.get(relative).is_some_and(|(p, s)| p == primary_etag && Some(s.as_str()) == secondary_etag)
    }

    pub fn record(&mut self, relative: &str, primary_etag: &str, secondary_etag: &str) {
        self.0.insert(relative.into(), (primary_etag.into(), secondary_etag.into()));
    }

    /// Forgets the shard's entries (relative keys under `<shard>/`) not in `keep`: objects gone from the primary.
    pub fn retain_shard(&mut self, shard: &str, keep: &HashSet<String>) {
        let dir = format!("{shard}/");
        self.0.retain(|key, _| !key.starts_with(&dir) || keep.contains(key));
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::*;

    fn entry(id: &str, revision: u64, time: &str, verified: bool) -> Entry {
        let taken_at = DateTime::parse_from_rfc3339(time).unwrap().with_timezone(&Utc);
        Entry { id: id.into(), revision, taken_at, verified }
    }

    #[test]
    fn the_second_store_keeps_by_its_own_policy_over_both_stores_snapshots() {
        let primary = vec![
            entry("root/a", 30, "2026-12-01T03:00:00Z", false),
            entry("root/b", 20, "2026-12-01T02:00:00Z", false),
            entry("root/c", 10, "2026-12-01T01:00:00Z", false),
        ];
        // The second store still holds one the primary's retention deleted, and it was verified there.
        let secondary = vec![entry("root/old", 5, "2026-11-30T01:00:00Z", true)];
        let policy = Policy { keep_last: 2, min_verified: 1, ..Policy::default() };
        let (kept, newest) = kept(&primary, &secondary, &policy);
        assert_eq!(newest.as_deref(), Some("root/a"));
        let mut kept: Vec<_> = kept.into_iter().collect();
        kept.sort();
        assert_eq!(kept, ["root/a", "root/b", "root/old"], "c is not copied: the second store would delete it");
        assert_eq!(super::kept(&[], &[], &policy), (HashSet::new(), None));
    }

    #[test]
    fn a_snapshot_is_copied_data_first_then_report_then_manifest_then_deltas_in_revision_order_then_session_proofs() {
        let manifest: Manifest = serde_json::from_value(serde_json::json!({
            "formatVersion": 1, "id": "root/20261201T010000Z-r10", "shard": "root",
            "member": {"name": "m", "id": "1", "endpoint": "http://e:2379"}, "etcdVersion": "3.6.0",
            "revision": 10, "compactRevision": 0, "keyCount": 1, "hashKv": 1, "object": "snapshot.db.zst", "dbSizeBytes": 1,
            "objectSizeBytes": 1, "etcdSha256": "00", "objectSha256": "ab", "compression": "zstd",
            "encryptionRecipients": [], "agentVersion": "x", "startedAt": "2026-12-01T01:00:00Z",
            "finishedAt": "2026-12-01T01:00:01Z", "streamSeconds": 1.0, "totalSeconds": 1.0, "spilledBytes": 0
        }))
        .expect("a manifest");
        let dir = "p/root/20261201T010000Z-r10/";
        let listed: Vec<StoredObject> = [
            "deltas/00000000000000000100.delta.zst",
            "deltas/00000000000000000011.delta.zst",
            "deltas/notes.txt",
            "deltas/proofs/00000001796000000123.json",
            "deltas/proofs/notes.json",
            "snapshot.db.zst",
            "manifest.json",
            drill_report::REPORT,
        ]
        .iter()
        .map(|name| StoredObject { key: format!("{dir}{name}"), etag: "e".into(), size: 1 })
        .collect();
        let objects = objects_of("p/", &manifest, &listed);
        let order: Vec<(&str, Kind)> = objects.iter().map(|o| (o.relative.as_str(), o.kind)).collect();
        let id = "root/20261201T010000Z-r10";
        assert_eq!(
            order,
            [
                (format!("{id}/snapshot.db.zst").as_str(), Kind::Snapshot),
                (format!("{id}/{}", drill_report::REPORT).as_str(), Kind::DrillReport),
                (format!("{id}/manifest.json").as_str(), Kind::Manifest),
                (format!("{id}/deltas/00000000000000000011.delta.zst").as_str(), Kind::Delta),
                (format!("{id}/deltas/00000000000000000100.delta.zst").as_str(), Kind::Delta),
                (format!("{id}/deltas/proofs/00000001796000000123.json").as_str(), Kind::Delta),
            ]
        );
        assert_eq!(objects[5].expected, Expected::PrimaryBytes, "a session's proof is rewritten in place");
        assert_eq!(objects[0].expected, Expected::Sha256("ab".into()));
    }

    #[test]
    fn a_copy_is_in_sync_only_while_both_stores_list_the_versions_it_was_verified_at() {
        let mut verified = Verified::default();
        assert!(!verified.in_sync("root/x/manifest.json", "p1", Some("s1")), "a restart starts empty");
        verified.record("root/x/manifest.json", "p1", "s1");
        assert!(verified.in_sync("root/x/manifest.json", "p1", Some("s1")));
        assert!(!verified.in_sync("root/x/manifest.json", "p2", Some("s1")), "rewritten on the primary");
        assert!(!verified.in_sync("root/x/manifest.json", "p1", Some("s2")), "replaced on the second store");
        assert!(!verified.in_sync("root/x/manifest.json", "p1", None), "gone from the second store");
        verified.retain_shard("root", &HashSet::new());
        assert!(!verified.in_sync("root/x/manifest.json", "p1", Some("s1")));
    }
}
