//! `drills` (how restore drills run: the tools and where) and each shard's `drill` (when, and at which level).

use std::path::PathBuf;
use std::time::Duration;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::field::{Checked, GoDuration, duration_within};
use kcp_keeper_runtime::names::check_dns_label;
use kcp_keeper_runtime::schedule::{Schedule, ScheduleSpec};
use schemars::JsonSchema;
use serde::Deserialize;

use super::POSITIVE;
use super::spill::Spill;

/// How drills run (the tools and where); which shards drill when is each shard's `drill`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawDrills {
    /// The etcd binary the throwaway member runs (`etcd` on `PATH` when absent).
    #[serde(default = "default_etcd")]
    pub etcd: PathBuf,
    /// The etcdutl binary that restores the snapshot (`etcdutl` on `PATH` when absent).
    #[serde(default = "default_etcdutl")]
    pub etcdutl: PathBuf,
    /// Where each drill's temporary directory is made (it holds the download and the restored member);
    /// `<spill.directory>/drills` when absent.
    #[serde(default)]
    pub directory: Option<PathBuf>,
    /// age identities for encrypted snapshots (a mounted Secret).
    #[serde(default)]
    pub identity_file: Option<PathBuf>,
    /// Keys read back from the restored etcd.
    #[serde(default = "default_sample_keys")]
    #[schemars(range(min = 1))]
    pub sample_keys: usize,
    /// Go-style duration: the longest a whole drill may take before it is stopped and fails.
    #[serde(default)]
    pub timeout: Option<Checked<GoDuration>>,
    /// The kcp binary for the kcp level; without it no shard can ask for the kcp level.
    #[serde(default)]
    pub kcp: Option<PathBuf>,
    /// Whether a drill may run while a snapshot runs in the same pod. Off by default: a drill then waits for
    /// the snapshot in flight (and a snapshot for the drill), so the pod's memory and disk need to hold one of
    /// them at a time. On only when the pod's limits hold both (an etcd of the database's size beside a
    /// snapshot's memory budget and spill).
    #[serde(default)]
    pub alongside_snapshots: bool,
    /// The whole installation's drill on a schedule (needs `kcp` and a shard named `root`): every shard
    /// restored to one point, a real kcp on each, as `drill --installation` does; none when absent.
    #[serde(default)]
    pub installation: Option<RawInstallationDrill>,
}

/// The scheduled drill of the whole installation at one point (`drill --installation --at`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawInstallationDrill {
    /// When the installation drill runs (recorded on the Lease as `installation-drill`).
    pub schedule: ScheduleSpec,
    /// The point every shard is restored to: `latest-consistent` (the newest time every shard reaches), the
    /// only point a scheduled drill takes.
    #[serde(default = "default_installation_point")]
    #[schemars(extend("enum" = ["latest-consistent"]))]
    pub at: String,
}

/// The name kcp gives its root shard: the configured shard of that name is started as the root shard.
pub const ROOT_SHARD: &str = "root";

/// The only point a scheduled installation drill takes.
pub const LATEST_CONSISTENT: &str = "latest-consistent";

fn default_installation_point() -> String {
    LATEST_CONSISTENT.into()
}

/// The scheduled installation drill, validated: its point is always `latest-consistent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallationDrill {
    pub schedule: Schedule,
}

fn default_etcd() -> PathBuf {
    "etcd".into()
}

fn default_etcdutl() -> PathBuf {
    "etcdutl".into()
}

fn default_sample_keys() -> usize {
    100
}

/// A shard's restore drills: on their own schedule, of the newest snapshot (and sometimes an older one).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawShardDrill {
    /// When the shard's drills run (recorded on the Lease as `drill-<shard>`).
    pub schedule: ScheduleSpec,
    /// Chance (0 to 1) that a scheduled drill also drills a random older retained snapshot.
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub older_rate: f64,
    /// The kcp level (needs `drills.kcp`): what a real kcp on the restored etcd must show.
    #[serde(default)]
    pub kcp: Option<KcpExpect>,
}

/// The kcp level: a real kcp shard on the restored etcd, and what must be readable through it (`kcp: {}` for
/// `/readyz` alone).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KcpExpect {
    /// Workspace paths (`root:team-a`) that must exist.
    #[serde(default)]
    pub workspaces: Vec<String>,
    /// Objects that must exist: an API path inside a workspace.
    #[serde(default)]
    pub objects: Vec<ExpectedObject>,
}

/// One object the restored kcp must serve.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExpectedObject {
    /// Workspace path, `root` or `root:team-a`.
    pub workspace: String,
    /// API path below the workspace, e.g. `/api/v1/namespaces/default/configmaps/marker`.
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drills {
    pub etcd: PathBuf,
    pub etcdutl: PathBuf,
    pub directory: PathBuf,
    pub identity_file: Option<PathBuf>,
    pub sample_keys: usize,
    pub timeout: Duration,
    pub kcp: Option<PathBuf>,
    pub alongside_snapshots: bool,
    /// `installation`: the whole installation's scheduled drill.
    pub installation: Option<InstallationDrill>,
    /// The installation's delta key (`deltaSigningKeyFile`): chain drills refuse a delta without its signature.
    pub delta_key: Option<crate::signing::SigningKey>,
}

/// A shard's drill schedule and level.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardDrill {
    pub schedule: Schedule,
    pub older_rate: f64,
    pub kcp: Option<KcpExpect>,
}

pub(super) fn shard_drill(
    name: &str,
    raw: RawShardDrill,
    at: &dyn Fn(&str) -> String,
    errors: &mut Vec<FieldError>,
) -> Option<ShardDrill> {
    let before = errors.len();
    if !(0.0..=1.0).contains(&raw.older_rate) {
        errors.push(FieldError::new(at("drill.olderRate"), "must be between 0 and 1"));
    }
    if let Some(kcp) = &raw.kcp {
        for (i, workspace) in kcp.workspaces.iter().enumerate() {
            if !is_workspace_path(workspace) {
                errors.push(FieldError::new(at(&format!("drill.kcp.workspaces[{i}]")), WORKSPACE_PATH));
            }
        }
        for (i, object) in kcp.objects.iter().enumerate() {
            if !is_workspace_path(&object.workspace) {
                errors.push(FieldError::new(at(&format!("drill.kcp.objects[{i}].workspace")), WORKSPACE_PATH));
            }
            let path_ok = (object.path.starts_with("/api/") || object.path.starts_with("/apis/"))
                && !object.path.contains("..")
                && !object.path.contains(['?', '#', ' ']);
            if !path_ok {
                errors.push(FieldError::new(
                    at(&format!("drill.kcp.objects[{i}].path")),
                    "must be an API path starting /api/ or /apis/ (no query, no '..')",
                ));
            }
        }
    }
    let schedule = super::schedule(&format!("drill-{name}"), &raw.schedule, at("drill.schedule"), errors);
    (errors.len() == before).then_some(ShardDrill { schedule: schedule?, older_rate: raw.older_rate, kcp: raw.kcp })
}

const WORKSPACE_PATH: &str = "must be a workspace path like root or root:team-a";

/// `root`, `root:team-a`: DNS labels joined by ':'.
fn is_workspace_path(path: &str) -> bool {
    path.split(':').all(|label| check_dns_label(label).is_ok())
}

/// `scheduled`: whether any shard has a drill schedule (those drills need the identity when `encrypted`);
/// `delta_key`: the installation's delta key, every replayed delta's signature checked with it; `root`: whether
/// a shard is named `root` (the installation drill starts it as kcp's root shard).
pub(super) fn drills(
    raw: Option<RawDrills>,
    spill: Option<&Spill>,
    (scheduled, encrypted, root): (bool, bool, bool),
    delta_key: Option<crate::signing::SigningKey>,
    errors: &mut Vec<FieldError>,
) -> Drills {
    // Absent: every field as serde defaults it.
    let mut raw =
        raw.unwrap_or_else(|| serde_json::from_value(serde_json::json!({})).expect("every field has a default"));
    let installation = raw.installation.take().and_then(|i| installation(i, raw.kcp.is_some(), root, errors));
    let scheduled = scheduled || installation.is_some();
    let directory = match (raw.directory, spill) {
        (Some(dir), _) if dir.is_absolute() => dir,
        (Some(_), _) => {
            errors.push(FieldError::new("drills.directory", "must be an absolute path"));
            PathBuf::new()
        }
        (None, Some(spill)) => spill.directory.join("drills"),
        (None, None) => PathBuf::new(),
    };
    if raw.identity_file.as_ref().is_some_and(|p| !p.is_absolute()) {
        errors.push(FieldError::new("drills.identityFile", "must be an absolute path"));
    }
    if encrypted && raw.identity_file.is_none() && scheduled {
        errors.push(FieldError::new(
            "drills.identityFile",
            "snapshots are encrypted: scheduled drills need the age identity file",
        ));
    }
    if raw.sample_keys == 0 {
        errors.push(FieldError::new("drills.sampleKeys", "must be at least 1"));
    }
    let timeout = duration_within(
        raw.timeout,
        POSITIVE,
        Duration::from_secs(30 * 60),
        "drills.timeout",
        "must be a positive Go duration like 30m",
        errors,
    );
    Drills {
        etcd: raw.etcd,
        etcdutl: raw.etcdutl,
        directory,
        identity_file: raw.identity_file,
        sample_keys: raw.sample_keys,
        timeout,
        kcp: raw.kcp,
        alongside_snapshots: raw.alongside_snapshots,
        installation,
        delta_key,
    }
}

/// `drills.installation`: its schedule, refused without the kcp binary, without a shard named `root`, or at any
/// point but `latest-consistent`.
fn installation(
    raw: RawInstallationDrill,
    kcp: bool,
    root: bool,
    errors: &mut Vec<FieldError>,
) -> Option<InstallationDrill> {
    let before = errors.len();
    if raw.at != LATEST_CONSISTENT {
        errors.push(FieldError::new(
            "drills.installation.at",
            "must be latest-consistent: the only point a scheduled installation drill takes",
        ));
    }
    if !kcp {
        errors.push(FieldError::new("drills.installation", "needs drills.kcp: every shard is drilled with a real kcp"));
    }
    if !root {
        errors.push(FieldError::new(
            "drills.installation",
            "needs a shard named root in shards[]: it is started as kcp's root shard, every other shard wired to it",
        ));
    }
    let schedule = super::schedule("installation-drill", &raw.schedule, "drills.installation.schedule".into(), errors);
    (errors.len() == before).then_some(InstallationDrill { schedule: schedule? })
}
