//! The configuration file, read strictly: a raw serde form as written, turned at load into [`Config`] with
//! parsed schedules, URLs, sizes and age recipients, or every error at once with its field path. Error
//! messages name fields, never values (a recipient or an endpoint is not secret, but a credentials path
//! sits beside things that are, and one rule is easier to keep than several).

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use kcp_keeper_runtime::config::{AgentConfig, FieldError};
use kcp_keeper_runtime::duration::parse_go_duration;
use kcp_keeper_runtime::schedule::{Schedule, ScheduleSpec};
use serde::Deserialize;

use crate::retention::Policy;

/// S3 refuses parts below 5 MiB (except the last).
pub const MIN_PART_SIZE: u64 = 5 * 1024 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawConfig {
    pub shards: Vec<RawShard>,
    pub storage: RawStorage,
    #[serde(default)]
    pub compression: Compression,
    #[serde(default)]
    pub encryption: Option<RawEncryption>,
    pub retention: RawRetention,
    pub spill: RawSpill,
    #[serde(default)]
    pub drills: Option<RawDrills>,
}

/// How drills run (the tools and where); which shards drill when is each shard's `drill`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawDrills {
    #[serde(default = "default_etcd")]
    pub etcd: PathBuf,
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
    pub sample_keys: usize,
    /// Go-style duration: the longest a whole drill may take before it is stopped and fails.
    #[serde(default)]
    pub timeout: Option<String>,
    /// The kcp binary for the kcp level; without it no shard can ask for the kcp level.
    #[serde(default)]
    pub kcp: Option<PathBuf>,
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawShardDrill {
    pub schedule: ScheduleSpec,
    /// Chance (0 to 1) that a scheduled drill also drills a random older retained snapshot.
    #[serde(default)]
    pub older_rate: f64,
    #[serde(default)]
    pub kcp: Option<KcpExpect>,
}

/// The kcp level: a real kcp shard on the restored etcd, and what must be readable through it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KcpExpect {
    /// Workspace paths (`root:team-a`) that must exist.
    #[serde(default)]
    pub workspaces: Vec<String>,
    /// Objects that must exist: an API path inside a workspace.
    #[serde(default)]
    pub objects: Vec<ExpectedObject>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExpectedObject {
    /// Workspace path, `root` or `root:team-a`.
    pub workspace: String,
    /// API path below the workspace, e.g. `/api/v1/namespaces/default/configmaps/marker`.
    pub path: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawShard {
    pub name: String,
    pub endpoints: Vec<String>,
    #[serde(default)]
    pub tls: Option<TlsFiles>,
    pub schedule: ScheduleSpec,
    #[serde(default)]
    pub drill: Option<RawShardDrill>,
}

/// Client TLS for a shard's etcd: PEM files (mounted from a Secret), read at each connection.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsFiles {
    pub ca_file: PathBuf,
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawStorage {
    pub bucket: String,
    #[serde(default)]
    pub prefix: String,
    #[serde(default)]
    pub endpoint: Option<String>,
    pub region: String,
    #[serde(default)]
    pub path_style: bool,
    #[serde(default)]
    pub checksum_mode: ChecksumMode,
    pub credentials: RawCredentials,
    #[serde(default)]
    pub server_side_encryption: Option<RawSse>,
    /// Attempts per S3 request (the first plus retries), with exponential backoff between them.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// Go-style duration: how long one S3 request attempt may take.
    #[serde(default)]
    pub attempt_timeout: Option<String>,
}

fn default_attempts() -> u32 {
    4
}

/// When the SDK computes request checksums. S3-compatible stores often reject the SDK's default
/// (`whenSupported`), so `whenRequired` is the default here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ChecksumMode {
    #[default]
    WhenRequired,
    WhenSupported,
}

/// Exactly one of these (a map with one key: YAML has no other plain way to write an enum with data).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawCredentials {
    #[serde(default)]
    pub secret_directory: Option<PathBuf>,
    #[serde(default)]
    pub environment: Option<Empty>,
    #[serde(default)]
    pub web_identity: Option<WebIdentity>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WebIdentity {
    pub role_arn: String,
    pub token_file: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawSse {
    #[serde(rename = "type")]
    pub kind: SseKind,
    #[serde(default)]
    pub kms_key_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SseKind {
    #[serde(rename = "AES256")]
    Aes256,
    #[serde(rename = "aws:kms")]
    AwsKms,
}

/// Where the S3 credentials come from. Static keys never make the SDK probe a metadata endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// A mounted Secret: files `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` in this directory, re-read at
    /// every run so a rotated Secret is picked up.
    SecretDirectory(PathBuf),
    /// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` from the process environment.
    Environment {},
    /// The SDK's web-identity provider (IRSA and the like): a role and a projected token file.
    WebIdentity(WebIdentity),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerSideEncryption {
    Aes256,
    AwsKms { key_id: Option<String> },
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Compression {
    #[default]
    Zstd,
    None,
}

impl Compression {
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::Zstd => "zstd",
            Compression::None => "none",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawEncryption {
    /// age X25519 recipients (`age1...`): public keys, so they may sit in a ConfigMap.
    pub age_recipients: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawRetention {
    pub keep_last: usize,
    #[serde(default)]
    pub hourly: usize,
    #[serde(default)]
    pub daily: usize,
    #[serde(default)]
    pub weekly: usize,
    #[serde(default)]
    pub monthly: usize,
    #[serde(default)]
    pub min_verified: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawSpill {
    pub directory: PathBuf,
    /// Bytes of snapshot parts held in memory at most (`64Mi`, `256Mi`, plain bytes).
    pub memory_budget: String,
    #[serde(default)]
    pub part_size: Option<String>,
    #[serde(default = "default_in_flight")]
    pub parts_in_flight: usize,
    /// Go-style duration: how long a finished part may wait for memory before it goes to disk instead.
    #[serde(default)]
    pub spill_after: Option<String>,
}

fn default_in_flight() -> usize {
    2
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
}

#[derive(Debug, Clone)]
pub struct Shard {
    pub name: String,
    pub endpoints: Vec<String>,
    pub tls: Option<TlsFiles>,
    pub schedule: Schedule,
    schedule_spec: ScheduleSpec,
    pub drill: Option<ShardDrill>,
}

impl PartialEq for Shard {
    fn eq(&self, other: &Self) -> bool {
        (&self.name, &self.endpoints, &self.tls, &self.schedule_spec, &self.drill)
            == (&other.name, &other.endpoints, &other.tls, &other.schedule_spec, &other.drill)
    }
}

/// A shard's drill schedule and level.
#[derive(Debug, Clone)]
pub struct ShardDrill {
    pub schedule: Schedule,
    schedule_spec: ScheduleSpec,
    pub older_rate: f64,
    pub kcp: Option<KcpExpect>,
}

impl PartialEq for ShardDrill {
    fn eq(&self, other: &Self) -> bool {
        (&self.schedule_spec, self.older_rate, &self.kcp) == (&other.schedule_spec, other.older_rate, &other.kcp)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Storage {
    pub bucket: String,
    /// No leading or trailing `/`; may be empty.
    pub prefix: String,
    pub endpoint: Option<String>,
    pub region: String,
    pub path_style: bool,
    pub checksum_mode: ChecksumMode,
    pub credentials: Credentials,
    pub server_side_encryption: Option<ServerSideEncryption>,
    pub max_attempts: u32,
    pub attempt_timeout: Duration,
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

/// Memory and disk bounds of the streaming upload.
///
/// By construction at most `memory_parts` finished parts sit in memory (queued or uploading), plus the one
/// being filled: `(memory_parts + 1) * part_size <= memory_budget`. Parts that find no memory within
/// `spill_after` go to `directory` and are uploaded from there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spill {
    pub directory: PathBuf,
    pub memory_budget: u64,
    pub part_size: u64,
    pub parts_in_flight: usize,
    pub memory_parts: usize,
    pub spill_after: Duration,
}

impl AgentConfig for Config {
    type Raw = RawConfig;

    fn from_raw(raw: RawConfig) -> Result<Self, Vec<FieldError>> {
        let mut errors = Vec::new();
        let shards = shards(raw.shards, &mut errors);
        let storage = storage(raw.storage, &mut errors);
        let recipients = recipients(raw.encryption, &mut errors);
        let retention = retention(&raw.retention, &mut errors);
        let spill = spill(raw.spill, &mut errors);
        let drills = drills(raw.drills, spill.as_ref(), &shards, !recipients.is_empty(), &mut errors);
        match (storage, spill) {
            (Some(storage), Some(spill)) if errors.is_empty() => {
                Ok(Config { shards, storage, compression: raw.compression, recipients, retention, spill, drills })
            }
            _ => Err(errors),
        }
    }
}

fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn shards(raw: Vec<RawShard>, errors: &mut Vec<FieldError>) -> Vec<Shard> {
    if raw.is_empty() {
        errors.push(FieldError::new("shards", "at least one shard is required"));
    }
    let mut out: Vec<Shard> = Vec::new();
    for (i, shard) in raw.into_iter().enumerate() {
        let at = |field: &str| format!("shards[{i}].{field}");
        if !is_dns_label(&shard.name) {
            errors.push(FieldError::new(at("name"), "must be a DNS label (lowercase letters, digits, '-')"));
        } else if out.iter().any(|s| s.name == shard.name) {
            errors.push(FieldError::new(at("name"), "duplicate shard name"));
        }
        if shard.endpoints.is_empty() {
            errors.push(FieldError::new(at("endpoints"), "at least one endpoint is required"));
        }
        for (j, endpoint) in shard.endpoints.iter().enumerate() {
            if let Err(reason) = check_endpoint(endpoint, shard.tls.is_some()) {
                errors.push(FieldError::new(at(&format!("endpoints[{j}]")), reason));
            }
        }
        if let Some(tls) = &shard.tls
            && tls.cert_file.is_some() != tls.key_file.is_some()
        {
            errors.push(FieldError::new(at("tls"), "certFile and keyFile go together"));
        }
        let drill = shard.drill.and_then(|raw| shard_drill(&shard.name, raw, &at, errors));
        match Schedule::new(&format!("snapshot-{}", shard.name), &shard.schedule) {
            Ok(schedule) => out.push(Shard {
                name: shard.name,
                endpoints: shard.endpoints,
                tls: shard.tls,
                schedule,
                schedule_spec: shard.schedule,
                drill,
            }),
            Err(e) => errors.push(FieldError::new(at("schedule"), e.to_string())),
        }
    }
    out
}

fn shard_drill(
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
    let schedule = match Schedule::new(&format!("drill-{name}"), &raw.schedule) {
        Ok(schedule) => Some(schedule),
        Err(e) => {
            errors.push(FieldError::new(at("drill.schedule"), e.to_string()));
            None
        }
    };
    (errors.len() == before).then_some(ShardDrill {
        schedule: schedule?,
        schedule_spec: raw.schedule,
        older_rate: raw.older_rate,
        kcp: raw.kcp,
    })
}

const WORKSPACE_PATH: &str = "must be a workspace path like root or root:team-a";

/// `root`, `root:team-a`: DNS labels joined by ':'.
fn is_workspace_path(path: &str) -> bool {
    path.split(':').all(is_dns_label)
}

fn drills(
    raw: Option<RawDrills>,
    spill: Option<&Spill>,
    shards: &[Shard],
    encrypted: bool,
    errors: &mut Vec<FieldError>,
) -> Drills {
    let raw = raw.unwrap_or(RawDrills {
        etcd: default_etcd(),
        etcdutl: default_etcdutl(),
        directory: None,
        identity_file: None,
        sample_keys: default_sample_keys(),
        timeout: None,
        kcp: None,
    });
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
    let scheduled = |s: &&Shard| s.drill.is_some();
    if encrypted && raw.identity_file.is_none() && shards.iter().any(|s| scheduled(&s)) {
        errors.push(FieldError::new(
            "drills.identityFile",
            "snapshots are encrypted: scheduled drills need the age identity file",
        ));
    }
    if raw.sample_keys == 0 {
        errors.push(FieldError::new("drills.sampleKeys", "must be at least 1"));
    }
    let timeout = match raw.timeout.as_deref().map(parse_go_duration) {
        None => Duration::from_secs(30 * 60),
        Some(Ok(d)) if !d.is_zero() => d,
        Some(_) => {
            errors.push(FieldError::new("drills.timeout", "must be a positive Go duration like 30m"));
            Duration::ZERO
        }
    };
    if raw.kcp.is_none() {
        for (i, shard) in shards.iter().enumerate() {
            if shard.drill.as_ref().is_some_and(|d| d.kcp.is_some()) {
                errors.push(FieldError::new(format!("shards[{i}].drill.kcp"), "needs drills.kcp (the kcp binary)"));
            }
        }
    }
    Drills {
        etcd: raw.etcd,
        etcdutl: raw.etcdutl,
        directory,
        identity_file: raw.identity_file,
        sample_keys: raw.sample_keys,
        timeout,
        kcp: raw.kcp,
    }
}

/// An etcd client URL: `http://` or `https://` (matching whether TLS is configured), host and port, no
/// credentials and no path.
fn check_endpoint(endpoint: &str, tls: bool) -> Result<(), &'static str> {
    let rest = match (endpoint.strip_prefix("http://"), endpoint.strip_prefix("https://")) {
        (Some(rest), _) if !tls => rest,
        (_, Some(rest)) if tls => rest,
        (Some(_), _) => return Err("tls is configured: use https://"),
        (_, Some(_)) => return Err("https:// needs tls (caFile)"),
        _ => return Err("must start with http:// or https://"),
    };
    if rest.contains('@') {
        return Err("must not carry credentials");
    }
    let hostport = rest.trim_end_matches('/');
    match hostport.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && !hostport.contains('/') && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err("must be scheme://host:port"),
    }
}

fn storage(raw: RawStorage, errors: &mut Vec<FieldError>) -> Option<Storage> {
    let before = errors.len();
    // S3 bucket naming rules (3-63 characters, lowercase, digits, '.', '-').
    let bucket_ok = (3..=63).contains(&raw.bucket.len())
        && raw.bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    if !bucket_ok {
        errors.push(FieldError::new("storage.bucket", "must be a valid S3 bucket name"));
    }
    let prefix = raw.prefix.trim_matches('/').to_string();
    if prefix.split('/').any(|p| p == "." || p == "..") || prefix.contains("//") {
        errors.push(FieldError::new("storage.prefix", "must not contain empty, '.' or '..' segments"));
    }
    if let Some(endpoint) = &raw.endpoint
        && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
    {
        errors.push(FieldError::new("storage.endpoint", "must start with http:// or https://"));
    }
    if let Some(endpoint) = &raw.endpoint
        && endpoint.contains('@')
    {
        errors.push(FieldError::new("storage.endpoint", "must not carry credentials"));
    }
    if raw.region.is_empty() {
        errors.push(FieldError::new("storage.region", "must not be empty (the SDK must never guess it)"));
    }
    if !(1..=10).contains(&raw.max_attempts) {
        errors.push(FieldError::new("storage.maxAttempts", "must be 1 to 10"));
    }
    let attempt_timeout = match raw.attempt_timeout.as_deref().map(parse_go_duration) {
        None => Duration::from_secs(120),
        Some(Ok(d)) if !d.is_zero() => d,
        Some(_) => {
            errors.push(FieldError::new("storage.attemptTimeout", "must be a positive Go duration like 2m"));
            Duration::ZERO
        }
    };
    let c = raw.credentials;
    let credentials = match (c.secret_directory, c.environment, c.web_identity) {
        (Some(dir), None, None) if dir.is_absolute() => Some(Credentials::SecretDirectory(dir)),
        (Some(_), None, None) => {
            errors.push(FieldError::new("storage.credentials.secretDirectory", "must be an absolute path"));
            None
        }
        (None, Some(_), None) => Some(Credentials::Environment {}),
        (None, None, Some(web)) if web.role_arn.starts_with("arn:") => Some(Credentials::WebIdentity(web)),
        (None, None, Some(_)) => {
            errors.push(FieldError::new("storage.credentials.webIdentity.roleArn", "must be an ARN"));
            None
        }
        _ => {
            errors.push(FieldError::new(
                "storage.credentials",
                "exactly one of secretDirectory, environment, webIdentity",
            ));
            None
        }
    };
    let server_side_encryption = raw.server_side_encryption.map(|sse| match sse.kind {
        SseKind::Aes256 => ServerSideEncryption::Aes256,
        SseKind::AwsKms => ServerSideEncryption::AwsKms { key_id: sse.kms_key_id },
    });
    if errors.len() != before {
        return None;
    }
    Some(Storage {
        bucket: raw.bucket,
        prefix,
        endpoint: raw.endpoint.map(|e| e.trim_end_matches('/').to_string()),
        region: raw.region,
        path_style: raw.path_style,
        checksum_mode: raw.checksum_mode,
        credentials: credentials?,
        server_side_encryption,
        max_attempts: raw.max_attempts,
        attempt_timeout,
    })
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

fn retention(raw: &RawRetention, errors: &mut Vec<FieldError>) -> Policy {
    if raw.keep_last == 0 {
        errors.push(FieldError::new("retention.keepLast", "must be at least 1 (the newest snapshot is always kept)"));
    }
    Policy {
        keep_last: raw.keep_last,
        hourly: raw.hourly,
        daily: raw.daily,
        weekly: raw.weekly,
        monthly: raw.monthly,
        min_verified: raw.min_verified,
    }
}

fn spill(raw: RawSpill, errors: &mut Vec<FieldError>) -> Option<Spill> {
    let before = errors.len();
    let mut size = |field: &str, text: Option<&str>, default: u64| match text.map(parse_size) {
        None => default,
        Some(Ok(n)) => n,
        Some(Err(reason)) => {
            errors.push(FieldError::new(format!("spill.{field}"), reason));
            0
        }
    };
    let memory_budget = size("memoryBudget", Some(&raw.memory_budget), 0);
    let part_size = size("partSize", raw.part_size.as_deref(), 8 * 1024 * 1024);
    if !raw.directory.is_absolute() {
        errors.push(FieldError::new("spill.directory", "must be an absolute path"));
    }
    if part_size != 0 && part_size < MIN_PART_SIZE {
        errors.push(FieldError::new("spill.partSize", "must be at least 5Mi (S3's smallest part)"));
    }
    if part_size > 5 * 1024 * 1024 * 1024 {
        errors.push(FieldError::new("spill.partSize", "must be at most 5Gi (S3's largest part)"));
    }
    if raw.parts_in_flight == 0 {
        errors.push(FieldError::new("spill.partsInFlight", "must be at least 1"));
    }
    let spill_after = match raw.spill_after.as_deref().map(parse_go_duration) {
        None => Duration::from_secs(1),
        Some(Ok(d)) => d,
        Some(Err(_)) => {
            errors.push(FieldError::new("spill.spillAfter", "must be a Go duration like 500ms"));
            Duration::ZERO
        }
    };
    // One part is always being filled; the rest of the budget holds finished parts.
    let memory_parts = memory_budget.checked_div(part_size).unwrap_or(0).saturating_sub(1) as usize;
    if errors.len() == before && memory_parts < raw.parts_in_flight {
        errors.push(FieldError::new(
            "spill.memoryBudget",
            "must hold partsInFlight + 1 parts (memoryBudget >= (partsInFlight + 1) * partSize)",
        ));
    }
    (errors.len() == before).then_some(Spill {
        directory: raw.directory,
        memory_budget,
        part_size,
        parts_in_flight: raw.parts_in_flight,
        memory_parts,
        spill_after,
    })
}

/// `64Mi`, `1Gi`, `512Ki`, `10M`, or plain bytes.
pub fn parse_size(text: &str) -> Result<u64, &'static str> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| "must be a size like 64Mi")?;
    let factor: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return Err("unknown unit (use Ki, Mi, Gi, K, M or G)"),
    };
    n.checked_mul(factor).ok_or("too large")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use kcp_keeper_runtime::config::parse;

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
    }

    #[test]
    fn unknown_fields_fail_with_their_path() {
        let text = EXAMPLE.replace("keepLast:", "keepLsat:");
        let err = load(&text).unwrap_err();
        assert!(err.contains("retention") && err.contains("keepLsat"), "{err}");
    }

    #[test]
    fn every_semantic_error_is_reported_with_its_path_and_never_the_value() {
        let text = EXAMPLE
            .replace("http://127.0.0.1:2379", "http://user:hunter2@127.0.0.1:2379")
            .replace("keepLast: 3", "keepLast: 0")
            .replace("age1", "age2")
            .replace("memoryBudget: 64Mi", "memoryBudget: 16Mi")
            .replace("name: alpha", "name: Alpha");
        let err = load(&text).unwrap_err();
        for path in [
            "shards[0].endpoints[0]: must not carry credentials",
            "shards[1].name",
            "retention.keepLast",
            "encryption.ageRecipients[0]",
            "spill.memoryBudget",
        ] {
            assert!(err.contains(path), "{path} missing in {err}");
        }
        assert!(!err.contains("hunter2") && !err.contains("age2"), "{err}");
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
    fn parts_below_the_s3_minimum_are_refused() {
        let err = load(&EXAMPLE.replace("partSize: 8Mi", "partSize: 1Mi")).unwrap_err();
        assert!(err.contains("spill.partSize"), "{err}");
    }
}
