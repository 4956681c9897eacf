//! The configuration file, read strictly: a raw serde form as written (whose doc comments are the chart's
//! values schema), turned at load into [`Config`] with parsed schedules, URLs, sizes and age recipients, or
//! every error at once with its field path. Error messages name fields, never values (a recipient or an
//! endpoint is not secret, but a credentials path sits beside things that are, and one rule is easier to keep
//! than several).
//!
//! One file per section in `config/`: `shards.rs`, `storage.rs`, `spill.rs`, `retention.rs` and `drills.rs`
//! (with each shard's `drill`); compression and encryption are small enough to stay here.

mod defrag;
mod deltas;
mod drills;
mod retention;
mod retry;
mod secondary;
mod shards;
mod spill;
mod storage;

use std::ops::RangeInclusive;
use std::str::FromStr;
use std::time::Duration;

use kcp_keeper_runtime::config::{AgentConfig, FieldError};
use kcp_keeper_runtime::schedule::{Schedule, ScheduleSpec};
use schemars::JsonSchema;
use serde::Deserialize;

pub use defrag::{Defrag, RawDefrag};
pub use deltas::{Deltas, RawDeltas};
pub use drills::{
    Drills, ExpectedObject, InstallationDrill, KcpExpect, LATEST_CONSISTENT, ROOT_SHARD, RawDrills,
    RawInstallationDrill, RawShardDrill, ShardDrill,
};
pub use retention::RawRetention;
pub use retry::{RawRetry, Retry};
pub use secondary::{RawSecondary, Secondary};
pub use shards::{RawShard, Shard, TlsFiles};
pub use spill::{MIN_PART_SIZE, RawSpill, Size, Spill, parse_size};
pub use storage::{
    ChecksumMode, Credentials, Empty, Integrity, LockMode, ObjectLock, RawCredentials, RawObjectLock, RawSse,
    RawStorage, ServerSideEncryption, SseKind, Storage, WebIdentity,
};

use crate::retention::Policy;

/// Every duration above zero: the range of a field that must be positive (`0s` is not).
const POSITIVE: RangeInclusive<Duration> = Duration::from_nanos(1)..=Duration::MAX;
/// etcd-snapshotter's configuration: the shards to snapshot, the bucket, and how snapshots are encoded, kept
/// and drilled.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawConfig {
    /// Every kcp shard's etcd, each on its own schedule (at least one).
    pub shards: Vec<RawShard>,
    /// The bucket every shard streams to, under `<prefix>/<shard>/`.
    pub storage: RawStorage,
    /// `zstd` (the default) or `none`.
    #[serde(default)]
    pub compression: Compression,
    /// age encryption of every snapshot; none when absent.
    #[serde(default)]
    pub encryption: Option<RawEncryption>,
    /// Which published snapshots to keep.
    pub retention: RawRetention,
    /// The memory bound of the streaming upload, and where parts wait on disk when S3 lags.
    pub spill: RawSpill,
    /// How restore drills run (the tools and where); each shard's `drill` says when.
    #[serde(default)]
    pub drills: Option<RawDrills>,
    /// How a failed scheduled snapshot run is run again within its tick.
    #[serde(default)]
    pub retry: Option<RawRetry>,
    /// A second store every published object is copied to and verified on, with its own credentials and
    /// retention; none when absent.
    #[serde(default)]
    pub secondary: Option<RawSecondary>,
    /// A file holding the installation's delta signing key (at least 32 bytes, mounted from a Secret): every
    /// delta is signed with it (HMAC-SHA256), and restores and drills refuse a delta without its signature.
    /// Without it, deltas are checked for integrity and order but not for who wrote them: whoever can write the
    /// bucket can append one.
    #[serde(default)]
    pub delta_signing_key_file: Option<std::path::PathBuf>,
    /// Mirror every published snapshot as an `EtcdSnapshot` object and each shard as an `EtcdShardBackup`, in the
    /// agent's namespace (the chart ships their CustomResourceDefinitions and turns this on); false when absent.
    #[serde(default)]
    pub snapshot_objects: bool,
}

/// How snapshots are compressed before encryption.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema, strum::IntoStaticStr)]
#[serde(rename_all = "camelCase")]
#[strum(serialize_all = "camelCase")]
pub enum Compression {
    #[default]
    Zstd,
    None,
}

impl Compression {
    /// As written in the configuration and in manifests: `zstd` or `none`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// age encryption of the snapshots.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawEncryption {
    /// age X25519 recipients (`age1...`): public keys, so they may sit in a ConfigMap.
    pub age_recipients: Vec<String>,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub shards: Vec<Shard>,
    pub storage: Storage,
    pub compression: Compression,
    pub recipients: Vec<Recipient>,
    pub retention: Policy,
    pub spill: Spill,
    pub drills: Drills,
    pub retry: Retry,
    pub secondary: Option<Secondary>,
    /// The delta signing key, read from `deltaSigningKeyFile` at load.
    pub delta_key: Option<crate::signing::SigningKey>,
    /// `snapshotObjects`.
    pub snapshot_objects: bool,
}

/// An age recipient with the text it was written as (its id in manifests).
#[derive(Clone)]
pub struct Recipient {
    pub id: String,
    pub key: age::x25519::Recipient,
}

impl std::fmt::Debug for Recipient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id)
    }
}

impl PartialEq for Recipient {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl AgentConfig for Config {
    type Raw = RawConfig;

    fn from_raw(raw: RawConfig) -> Result<Self, Vec<FieldError>> {
        let mut errors = Vec::new();
        let kcp_binary = raw.drills.as_ref().is_some_and(|d| d.kcp.is_some());
        let shards = shards::shards(raw.shards, kcp_binary, &mut errors);
        let storage = storage::storage(raw.storage, &mut errors);
        let recipients = recipients(raw.encryption, &mut errors);
        let retention = retention::retention(&raw.retention, shards.iter().any(|s| s.drill.is_some()), &mut errors);
        let spill = spill::spill(raw.spill, &mut errors);
        let scheduled = shards.iter().any(|s| s.drill.is_some() || s.before_upgrade.is_some());
        let delta_key = raw.delta_signing_key_file.and_then(|path| {
            crate::signing::SigningKey::read(&path)
                .map_err(|e| errors.push(FieldError::new("deltaSigningKeyFile", e)))
                .ok()
        });
        let root = shards.iter().any(|s| s.name == ROOT_SHARD);
        let kind = (scheduled, !recipients.is_empty(), root);
        let drills = drills::drills(raw.drills, spill.as_ref(), kind, delta_key.clone(), &mut errors);
        let retry = retry::retry(raw.retry, &mut errors);
        let secondary = secondary::secondary(raw.secondary, scheduled, &mut errors);
        match (storage, spill) {
            (Some(storage), Some(spill)) if errors.is_empty() => Ok(Config {
                shards,
                storage,
                compression: raw.compression,
                recipients,
                retention,
                spill,
                drills,
                retry,
                secondary,
                delta_key,
                snapshot_objects: raw.snapshot_objects,
            }),
            _ => Err(errors),
        }
    }
}

/// The schedule `name` as `spec` writes it, or `None` and why not at `path`.
fn schedule(name: &str, spec: &ScheduleSpec, path: String, errors: &mut Vec<FieldError>) -> Option<Schedule> {
    Schedule::new(name, spec).map_err(|e| errors.push(FieldError::new(path, e.to_string()))).ok()
}

fn recipients(raw: Option<RawEncryption>, errors: &mut Vec<FieldError>) -> Vec<Recipient> {
    let Some(raw) = raw else { return Vec::new() };
    if raw.age_recipients.is_empty() {
        errors.push(FieldError::new("encryption.ageRecipients", "at least one recipient (or no encryption section)"));
    }
    let mut out = Vec::new();
    for (i, text) in raw.age_recipients.into_iter().enumerate() {
        match age::x25519::Recipient::from_str(text.trim()) {
            Ok(key) => out.push(Recipient { id: text.trim().to_string(), key }),
            Err(_) => errors.push(FieldError::new(
                format!("encryption.ageRecipients[{i}]"),
                "not an age X25519 recipient (age1...)",
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use kcp_keeper_runtime::config::parse;

    use super::shards::check_endpoint;
    use super::*;

    pub(crate) const EXAMPLE: &str = include_str!("../example.yaml");

    fn load(text: &str) -> Result<Config, String> {
        parse::<Config>(Path::new("c.yaml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn the_example_parses_into_validated_types() {
        let config = load(EXAMPLE).unwrap();
        assert_eq!(config.shards.len(), 2);
        assert_eq!(config.shards[0].schedule.name(), "snapshot-root");
        assert_eq!(config.storage.prefix, "kcp/etcd");
        assert_eq!(config.spill.part_size, 8 << 20);
        assert_eq!(config.spill.memory_parts, 7);
        assert_eq!(config.compression, Compression::Zstd);
        assert_eq!(config.recipients.len(), 1);
        let deltas = config.shards[0].deltas.as_ref().expect("root has deltas");
        assert_eq!((deltas.interval, deltas.max_bytes), (Duration::from_secs(10), 16 << 20));
        assert!(config.shards[1].deltas.is_none(), "alpha has none");
    }

    #[test]
    fn unknown_fields_fail_with_their_path() {
        let text = EXAMPLE.replace("keepLast:", "keepLsat:");
        let err = load(&text).unwrap_err();
        assert!(err.contains("retention") && err.contains("keepLsat"), "{err}");
    }

    /// `text` is refused with an error naming every one of `paths` and none of `values`.
    fn assert_names_paths_not_values(text: &str, paths: &[&str], values: &[&str]) {
        let err = load(text).unwrap_err();
        for path in paths {
            assert!(err.contains(path), "{path} missing in {err}");
        }
        for value in values {
            assert!(!err.contains(value), "{value} echoed in {err}");
        }
    }

    #[test]
    fn every_semantic_error_is_reported_with_its_path_and_never_the_value() {
        let text = EXAMPLE
            .replace("http://127.0.0.1:2379", "http://user:hunter2@127.0.0.1:2379")
            .replace("keepLast: 3", "keepLast: 0")
            .replace("age1", "age2")
            .replace("memoryBudget: 64Mi", "memoryBudget: 16Mi")
            .replace("name: alpha", "name: Alpha");
        let paths = [
            "shards[0].endpoints[0]: must not carry credentials",
            "shards[1].name",
            "retention.keepLast",
            "encryption.ageRecipients[0]",
            "spill.memoryBudget",
        ];
        assert_names_paths_not_values(&text, &paths, &["hunter2", "age2"]);
    }

    #[test]
    fn the_lock_expiry_defaults_to_two_minutes_and_one_below_six_seconds_is_refused_naming_its_field() {
        assert_eq!(load(EXAMPLE).unwrap().storage.lock_expiry, Duration::from_secs(120));
        let short = EXAMPLE.replace("  region:", "  lockExpiry: 5s\n  region:");
        assert_names_paths_not_values(&short, &["storage.lockExpiry"], &[]);
        let set = EXAMPLE.replace("  region:", "  lockExpiry: 12s\n  region:");
        assert_eq!(load(&set).unwrap().storage.lock_expiry, Duration::from_secs(12));
    }

    #[test]
    fn object_lock_is_off_by_default_and_a_bad_mode_period_or_readback_store_is_refused_naming_its_field() {
        assert_eq!(load(EXAMPLE).unwrap().storage.object_lock, None);
        let with = |lines: &str| EXAMPLE.replace("  region:", &format!("{lines}  region:"));
        let set = with("  objectLock:\n    mode: governance\n    retainFor: 720h\n");
        let lock = load(&set).unwrap().storage.object_lock.unwrap();
        assert_eq!((lock.mode, lock.retain_for), (LockMode::Governance, Duration::from_secs(720 * 3600)));
        let zero = with("  objectLock:\n    mode: compliance\n    retainFor: 0s\n");
        assert_names_paths_not_values(&zero, &["storage.objectLock.retainFor"], &[]);
        let forever = with("  objectLock:\n    mode: compliance\n    retainFor: 900000h\n");
        assert_names_paths_not_values(&forever, &["storage.objectLock.retainFor"], &[]);
        let read_back = with("  integrity: readBack\n  objectLock:\n    mode: compliance\n    retainFor: 1h\n");
        assert_names_paths_not_values(&read_back, &["storage.objectLock"], &[]);
        assert!(load(&with("  objectLock:\n    mode: legal\n    retainFor: 1h\n")).is_err());
    }

    #[test]
    fn endpoints_match_tls_and_sizes_parse() {
        assert_eq!(check_endpoint("http://127.0.0.1:2379", false), Ok(()));
        assert_eq!(check_endpoint("https://etcd-0.etcd:2379", true), Ok(()));
        assert!(check_endpoint("https://127.0.0.1:2379", false).is_err());
        assert!(check_endpoint("http://127.0.0.1", false).is_err());
        assert!(check_endpoint("http://127.0.0.1:2379/x", false).is_err());
        assert_eq!(parse_size("64Mi"), Ok(64 << 20));
        assert_eq!(parse_size("5000"), Ok(5000));
        assert!(parse_size("5 MB").is_err());
    }

    #[test]
    fn the_example_drills_root_at_the_kcp_level() {
        let config = load(EXAMPLE).unwrap();
        let drill = config.shards[0].drill.as_ref().unwrap();
        assert_eq!(drill.schedule.name(), "drill-root");
        assert_eq!(drill.kcp.as_ref().unwrap().workspaces, ["root:team-a"]);
        assert!(config.shards[1].drill.is_none());
        assert_eq!(config.drills.kcp.as_deref(), Some(Path::new("/usr/local/bin/kcp")));
        assert_eq!(config.drills.timeout, Duration::from_secs(30 * 60));
    }

    #[test]
    fn drill_errors_name_their_fields_and_never_the_values() {
        let text = EXAMPLE
            .replace("olderRate: 0.2", "olderRate: 7")
            .replace("[root:team-a]", "[\"Root:Secret-Team\"]")
            .replace("path: /api/v1/namespaces/default/configmaps/drill-marker", "path: /api/../secret-path?x=1")
            .replace("cron: \"30 4 * * *\"", "cron: \"99 4 * * *\"")
            .replace("  kcp: /usr/local/bin/kcp", "")
            .replace("identityFile: /var/run/secrets/etcd-snapshotter/age/identity.txt", "sampleKeys: 0")
            .replace("  sampleKeys: 100\n", "")
            .replace("timeout: 30m", "timeout: soon-ish");
        let paths = [
            "shards[0].drill.olderRate",
            "shards[0].drill.kcp.workspaces[0]",
            "shards[0].drill.kcp.objects[0].path",
            "shards[0].drill.schedule",
            "drills.sampleKeys",
            "drills.timeout",
        ];
        assert_names_paths_not_values(&text, &paths, &["Secret-Team", "secret-path", "soon-ish"]);
    }

    #[test]
    fn the_kcp_level_needs_the_kcp_binary_and_unknown_drill_fields_fail() {
        let err = load(&EXAMPLE.replace("  kcp: /usr/local/bin/kcp", "")).unwrap_err();
        assert!(err.contains("shards[0].drill.kcp: needs drills.kcp"), "{err}");
        let without_identity = EXAMPLE.replace("identityFile: /var/run/secrets/etcd-snapshotter/age/identity.txt", "");
        let err = load(&without_identity).unwrap_err();
        assert!(err.contains("drills.identityFile: snapshots are encrypted"), "{err}");
        let err = load(&EXAMPLE.replace("olderRate:", "olderRatio:")).unwrap_err();
        assert!(err.contains("olderRatio"), "{err}");
    }

    /// The example with `drills.installation` at `at` on a daily schedule.
    fn with_installation(text: &str, at: &str) -> String {
        let block = format!("  installation:\n    schedule:\n      cron: \"0 5 * * *\"\n    at: {at}\n");
        format!("{text}{block}")
    }

    #[test]
    fn the_installation_drill_takes_latest_consistent_on_its_own_schedule_recorded_as_installation_drill() {
        let config = load(&with_installation(EXAMPLE, "latest-consistent")).unwrap();
        let installation = config.drills.installation.expect("drills.installation");
        assert_eq!(installation.schedule.name(), "installation-drill");
        assert_eq!(installation.schedule.record_key(), "schedule.kcp-keeper.io/installation-drill");
        let defaulted = with_installation(EXAMPLE, "latest-consistent").replace("    at: latest-consistent\n", "");
        assert!(load(&defaulted).unwrap().drills.installation.is_some(), "at defaults to latest-consistent");
        assert!(load(EXAMPLE).unwrap().drills.installation.is_none());
    }

    #[test]
    fn the_installation_drill_at_any_point_but_latest_consistent_is_refused_naming_the_field_not_the_value() {
        let text = with_installation(EXAMPLE, "2026-12-01T12:00:00Z");
        assert_names_paths_not_values(&text, &["drills.installation.at: must be latest-consistent"], &["2026-12-01"]);
        let bad_cron = with_installation(EXAMPLE, "latest-consistent").replace("\"0 5 * * *\"", "\"99 5 * * *\"");
        assert_names_paths_not_values(&bad_cron, &["drills.installation.schedule"], &[]);
    }

    #[test]
    fn the_installation_drill_without_the_kcp_binary_or_a_root_shard_is_refused_naming_the_field() {
        // The example's shard drill needs drills.kcp too: without the binary, both are named.
        let no_kcp = with_installation(EXAMPLE, "latest-consistent").replace("  kcp: /usr/local/bin/kcp", "");
        assert_names_paths_not_values(&no_kcp, &["drills.installation: needs drills.kcp"], &[]);
        let no_root = with_installation(EXAMPLE, "latest-consistent").replace("  - name: root\n", "  - name: beta\n");
        assert_names_paths_not_values(&no_root, &["drills.installation: needs a shard named root"], &[]);
        let err = load(&with_installation(EXAMPLE, "latest-consistent").replace("    at:", "    point:")).unwrap_err();
        assert!(err.contains("point"), "unknown fields fail: {err}");
    }

    #[test]
    fn min_verified_defaults_to_1_with_drills_scheduled_and_0_there_is_refused() {
        assert!(EXAMPLE.contains("minVerified: 1") && EXAMPLE.contains("drill:"), "the example drills root");
        let unset = EXAMPLE.replace("  minVerified: 1\n", "");
        assert_eq!(load(&unset).unwrap().retention.min_verified, 1);
        let err = load(&EXAMPLE.replace("minVerified: 1", "minVerified: 0")).unwrap_err();
        assert!(err.contains("retention.minVerified: must be at least 1 when drills are scheduled"), "{err}");
        // Without a drill schedule nothing is ever verified: 0 is the only sensible default.
        let start = unset.find("    drill:").unwrap();
        let end = start + unset[start..].find("  - name: alpha").unwrap();
        let undrilled = format!("{}{}", &unset[..start], &unset[end..]);
        assert_eq!(load(&undrilled).unwrap().retention.min_verified, 0);
    }

    #[test]
    fn parts_below_the_s3_minimum_are_refused() {
        let err = load(&EXAMPLE.replace("partSize: 8Mi", "partSize: 1Mi")).unwrap_err();
        assert!(err.contains("spill.partSize"), "{err}");
    }
}
