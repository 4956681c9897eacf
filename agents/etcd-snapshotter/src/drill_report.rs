//! The drill report: `drill.json` beside the snapshot's manifest, written after every drill of that snapshot
//! (the latest outcome replaces the one before, except that a failure of the drill's environment leaves a
//! passing report that still proves the snapshot in place, with the attempt in `last_failed_attempt`). A
//! snapshot counts as verified only when its report passed and the hashes the report recorded are the
//! manifest's bytes and the manifest's object and etcd hashes: the manifest is an ordinary object anyone with
//! write access can edit, so its own word (`verifiedAt`) is never taken, and a manifest changed after the drill
//! is no longer verified.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::DrillError;
use crate::manifest::Manifest;

pub const REPORT: &str = "drill.json";

/// How HashKV compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HashKvResult {
    Match,
    /// The manifest holds no live HashKV (it could not be read when the snapshot was taken), or the live one
    /// began at another compact revision than the snapshot's (a compaction came between the snapshot and its
    /// HashKV read): the two hashes cover different histories, and a difference says nothing.
    NotComparable,
}

/// What the chain level proved (in the drill report as `chain`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChainLevel {
    /// Deltas replayed, all of the chain.
    pub deltas: usize,
    pub transactions: u64,
    /// The source revision the replay reached.
    pub revision: u64,
    /// The revision compared with the live member's record (the end of the newest delta carrying one).
    #[serde(default)]
    pub compared_at: Option<u64>,
    /// Keys at `compared_at`, equal to the live member's.
    #[serde(default)]
    pub key_count: Option<u64>,
    pub hash_kv: HashKvResult,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Report {
    pub format_version: u32,
    pub id: String,
    pub passed: bool,
    /// The failure's reason label and message; absent when the drill passed.
    #[serde(default)]
    pub failure: Option<Failure>,
    /// sha256 of `manifest.json` as the drill read it.
    pub manifest_sha256: String,
    /// sha256 of the object as downloaded (absent when the download failed).
    #[serde(default)]
    pub object_sha256: Option<String>,
    /// etcd's trailing sha256 as recomputed over the decrypted, decompressed database.
    #[serde(default)]
    pub etcd_sha256: Option<String>,
    #[serde(default)]
    pub revision: Option<u64>,
    #[serde(default)]
    pub key_count: Option<u64>,
    #[serde(default)]
    pub hash_kv: Option<HashKvResult>,
    /// Keys read back with their values from the restored etcd.
    #[serde(default)]
    pub sampled_keys: Option<u64>,
    /// `etcdutl snapshot restore` until the throwaway etcd answered: the restore time (RTO) of this shard.
    #[serde(default)]
    pub restore_seconds: Option<f64>,
    /// The kcp level, when it ran.
    #[serde(default)]
    pub kcp: Option<KcpLevel>,
    /// The chain level: the snapshot's deltas replayed and compared with the live member (absent when the
    /// snapshot has no deltas, or the drill stopped before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<ChainLevel>,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub duration_seconds: f64,
    pub agent_version: String,
    /// The kcp the drilled snapshot was taken under, from its manifest (a snapshot before a kcp upgrade).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kcp_version: Option<String>,
    /// The last drill that failed for a reason of its environment while this passing report still proved the
    /// snapshot (the report then stays, and so does the verification).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failed_attempt: Option<FailedAttempt>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FailedAttempt {
    pub reason: String,
    pub message: String,
    pub finished_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Failure {
    pub reason: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KcpLevel {
    /// kcp start until `/readyz` answered ok.
    pub ready_seconds: f64,
    pub workspaces: Vec<String>,
    pub objects: Vec<String>,
}

impl From<&DrillError> for Failure {
    fn from(error: &DrillError) -> Self {
        let reason: &'static str = error.into();
        Self { reason: reason.into(), message: error.to_string() }
    }
}

impl Report {
    /// A report of a drill of `id` begun at `started_at` (and, until it is told otherwise, finished then).
    pub fn started(id: &str, started_at: DateTime<Utc>) -> Self {
        Self {
            format_version: 1,
            id: id.into(),
            started_at,
            finished_at: started_at,
            agent_version: kcp_keeper_runtime::VERSION.into(),
            ..Self::default()
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        crate::json::object(self)
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// When the snapshot was verified: the report's finish time, if the report proves this manifest (as stored,
/// `manifest_bytes`) and its object; `None` otherwise.
pub fn verified_at(report: &Report, manifest: &Manifest, manifest_bytes: &[u8]) -> Option<DateTime<Utc>> {
    let proves = report.passed
        && report.id == manifest.id
        && report.manifest_sha256 == sha256_hex(manifest_bytes)
        && report.object_sha256.as_deref() == Some(manifest.object_sha256.as_str())
        && report.etcd_sha256.as_deref() == Some(manifest.etcd_sha256.as_str());
    proves.then_some(report.finished_at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::sample;

    fn passing(manifest: &Manifest, bytes: &[u8]) -> Report {
        let at = manifest.finished_at;
        Report {
            format_version: 1,
            id: manifest.id.clone(),
            passed: true,
            failure: None,
            manifest_sha256: sha256_hex(bytes),
            object_sha256: Some(manifest.object_sha256.clone()),
            etcd_sha256: Some(manifest.etcd_sha256.clone()),
            revision: Some(manifest.revision),
            key_count: Some(manifest.key_count),
            hash_kv: Some(HashKvResult::Match),
            sampled_keys: Some(17),
            restore_seconds: Some(0.4),
            kcp: None,
            chain: None,
            started_at: at,
            finished_at: at,
            duration_seconds: 1.0,
            agent_version: "0.1.0".into(),
            kcp_version: None,
            last_failed_attempt: None,
        }
    }

    #[test]
    fn a_passing_report_of_this_manifest_verifies_it() {
        let m = sample();
        let bytes = m.to_json();
        let report = passing(&m, &bytes);
        assert_eq!(Report::from_json(&report.to_json()).unwrap(), report);
        assert_eq!(verified_at(&report, &m, &bytes), Some(m.finished_at));
    }

    #[test]
    fn an_edited_manifest_a_failed_drill_or_another_object_is_not_verified() {
        let m = sample();
        let bytes = m.to_json();
        let report = passing(&m, &bytes);
        // Someone wrote verifiedAt into the manifest: its bytes changed, the report no longer proves it.
        let edited = Manifest { verified_at: Some(m.finished_at), ..m.clone() };
        assert_eq!(verified_at(&report, &edited, &edited.to_json()), None);
        let failed = Report { passed: false, ..report.clone() };
        assert_eq!(verified_at(&failed, &m, &bytes), None);
        let other_object = Report { object_sha256: Some("22".repeat(32)), ..report.clone() };
        assert_eq!(verified_at(&other_object, &m, &bytes), None);
        let other_snapshot = Report { id: "root/other".into(), ..report };
        assert_eq!(verified_at(&other_snapshot, &m, &bytes), None);
    }
}
