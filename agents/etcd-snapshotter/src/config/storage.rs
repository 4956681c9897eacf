//! `storage`: the S3 bucket, its credentials and request bounds.

use std::path::PathBuf;
use std::time::Duration;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::field::{Checked, GoDuration, duration_within};
use schemars::JsonSchema;
use serde::Deserialize;

use super::POSITIVE;

/// The S3-compatible bucket snapshots go to.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawStorage {
    /// The bucket's name (S3 naming rules: 3 to 63 lowercase letters, digits, '.' and '-').
    pub bucket: String,
    /// Key prefix below which every shard's snapshots live (no '.' or '..' segments); none when empty.
    #[serde(default)]
    pub prefix: String,
    /// The endpoint URL (`http://` or `https://`, no credentials) of an S3-compatible store; omit for AWS.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The bucket's region; required, so the SDK never guesses it.
    pub region: String,
    /// Path-style requests (`endpoint/bucket/key`), which most S3-compatible stores need.
    #[serde(default)]
    pub path_style: bool,
    /// When the SDK computes request checksums: `whenRequired` (the default) or `whenSupported`.
    #[serde(default)]
    pub checksum_mode: ChecksumMode,
    /// Where the S3 credentials come from: exactly one of secretDirectory, environment, webIdentity.
    pub credentials: RawCredentials,
    /// Server-side encryption of every object written.
    #[serde(default)]
    pub server_side_encryption: Option<RawSse>,
    /// Attempts per S3 request (the first plus retries), with exponential backoff between them.
    #[serde(default = "default_attempts")]
    #[schemars(range(min = 1, max = 10))]
    pub max_attempts: u32,
    /// Attempts per multipart part (the first plus retries after 503 SlowDown, a reset connection, a
    /// timeout...), with exponential backoff: a part that still fails fails the run.
    #[serde(default = "default_part_attempts")]
    #[schemars(range(min = 1, max = 20))]
    pub part_max_attempts: u32,
    /// Go-style duration: how long one S3 request attempt may take.
    #[serde(default)]
    pub attempt_timeout: Option<Checked<GoDuration>>,
    /// Go-style duration (default `2m`, 6s to 1h): how long the shard's lock
    /// outlives its holder. The holder renews it every sixth of this and stops its run (its requests in flight
    /// dropped) when half of it passed without a renewal the store took; a waiter takes over a lock left unrenewed this long.
    #[serde(default)]
    pub lock_expiry: Option<Checked<GoDuration>>,
    /// How the stored object is proven to be the bytes streamed before its manifest is written: `checksums`
    /// (the default: every part carries its SHA-256, which the store checks, and the completed object's
    /// checksum is compared with ours) or `readBack` (the object is downloaded and its sha256 compared with
    /// ours: for stores without checksums, at the cost of reading every snapshot once).
    #[serde(default)]
    pub integrity: Integrity,
    /// On a versioned bucket, delete the version itself when retention or clean-up removes an object (it is
    /// gone for good); false (the default) leaves a delete marker and the bucket's lifecycle decides.
    #[serde(default)]
    pub delete_versions: bool,
    /// S3 Object Lock on every snapshot, delta and manifest written: none can be deleted or overwritten, even
    /// with this agent's own key, until its retention ends. The bucket must have been created with object lock
    /// enabled (the agent checks at start); the shard's lock object and drill reports are not locked.
    #[serde(default)]
    pub object_lock: Option<RawObjectLock>,
}

/// Object lock asked for every backup object.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawObjectLock {
    /// `governance` (a principal allowed to bypass governance retention may still delete) or `compliance`
    /// (no one can, the bucket's owner included, until the retention ends).
    pub mode: LockMode,
    /// Go-style duration, from 1s to 100 years (`876000h`): how long each object stays locked after it is
    /// written. Retention never deletes an object before its lock ends; set `retention` to keep at least this
    /// long, or snapshots past their retention stay (and are reported as locked) until their locks end.
    pub retain_for: Checked<GoDuration>,
}

/// S3's two object lock modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum LockMode {
    Governance,
    Compliance,
}

/// Object lock as validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectLock {
    pub mode: LockMode,
    pub retain_for: Duration,
}

/// The longest retention accepted: 100 years.
const LONGEST_LOCK: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn default_attempts() -> u32 {
    4
}

/// About a minute of backoff (0.5, 1, 2, 4, 8, then 10 s each) before a part gives up.
fn default_part_attempts() -> u32 {
    10
}

/// How a stored object is proven before its manifest is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Integrity {
    #[default]
    Checksums,
    ReadBack,
}

/// When the SDK computes request checksums. S3-compatible stores often reject the SDK's default
/// (`whenSupported`), so `whenRequired` is the default here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ChecksumMode {
    #[default]
    WhenRequired,
    WhenSupported,
}

/// Exactly one of these (a map with one key: YAML has no other plain way to write an enum with data).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawCredentials {
    /// A mounted Secret: files `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` in this absolute directory,
    /// re-read at every run.
    #[serde(default)]
    pub secret_directory: Option<PathBuf>,
    /// `{}`: `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` from the process environment.
    #[serde(default)]
    pub environment: Option<Empty>,
    /// The SDK's web-identity provider (IRSA and the like): a role and a projected token file.
    #[serde(default)]
    pub web_identity: Option<WebIdentity>,
}

/// `{}`: nothing to say.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// A role assumed with a projected service-account token.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WebIdentity {
    /// The role's ARN (`arn:...`).
    pub role_arn: String,
    /// The projected token file.
    pub token_file: PathBuf,
}

/// Server-side encryption asked of S3 for every object: `AES256` or `aws:kms` (with `kmsKeyId` when given).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawSse {
    /// `AES256` or `aws:kms`.
    #[serde(rename = "type")]
    pub kind: SseKind,
    /// The KMS key id for `aws:kms`; S3's default key when absent.
    #[serde(default)]
    pub kms_key_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
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
    pub part_max_attempts: u32,
    pub attempt_timeout: Duration,
    pub lock_expiry: Duration,
    pub integrity: Integrity,
    pub delete_versions: bool,
    pub object_lock: Option<ObjectLock>,
}

/// `storage.bucket`, `storage.prefix` (returned without its outer `/`) and `storage.endpoint` checked.
fn location(raw: &RawStorage, errors: &mut Vec<FieldError>) -> String {
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
    if let Some(endpoint) = &raw.endpoint {
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            errors.push(FieldError::new("storage.endpoint", "must start with http:// or https://"));
        }
        if endpoint.contains('@') {
            errors.push(FieldError::new("storage.endpoint", "must not carry credentials"));
        }
    }
    prefix
}

/// `storage.credentials`: exactly one source.
fn credentials(c: RawCredentials, errors: &mut Vec<FieldError>) -> Option<Credentials> {
    match (c.secret_directory, c.environment, c.web_identity) {
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
    }
}

pub(super) fn storage(raw: RawStorage, errors: &mut Vec<FieldError>) -> Option<Storage> {
    let before = errors.len();
    let prefix = location(&raw, errors);
    if raw.region.is_empty() {
        errors.push(FieldError::new("storage.region", "must not be empty (the SDK must never guess it)"));
    }
    if !(1..=10).contains(&raw.max_attempts) {
        errors.push(FieldError::new("storage.maxAttempts", "must be 1 to 10"));
    }
    if !(1..=20).contains(&raw.part_max_attempts) {
        errors.push(FieldError::new("storage.partMaxAttempts", "must be 1 to 20"));
    }
    let attempt_timeout = duration_within(
        raw.attempt_timeout,
        POSITIVE,
        Duration::from_secs(120),
        "storage.attemptTimeout",
        "must be a positive Go duration like 2m",
        errors,
    );
    let lock_expiry = duration_within(
        raw.lock_expiry,
        Duration::from_secs(6)..=Duration::from_secs(3600),
        Duration::from_secs(120),
        "storage.lockExpiry",
        "must be a Go duration from 6s to 1h like 2m",
        errors,
    );
    let object_lock = raw.object_lock.map(|lock| {
        if raw.integrity != Integrity::Checksums {
            // S3 refuses a locked write without an integrity header; `readBack` stores send none.
            errors.push(FieldError::new("storage.objectLock", "needs `integrity: checksums` (the default)"));
        }
        let retain_for = duration_within(
            Some(lock.retain_for),
            Duration::from_secs(1)..=LONGEST_LOCK,
            Duration::ZERO,
            "storage.objectLock.retainFor",
            "must be a Go duration from 1s to 876000h (100 years), like 720h",
            errors,
        );
        ObjectLock { mode: lock.mode, retain_for }
    });
    let credentials = credentials(raw.credentials, errors);
    let server_side_encryption = raw.server_side_encryption.map(|sse| match sse.kind {
        SseKind::Aes256 => ServerSideEncryption::Aes256,
        SseKind::AwsKms => ServerSideEncryption::AwsKms { key_id: sse.kms_key_id },
    });
    (errors.len() == before).then_some(Storage {
        bucket: raw.bucket,
        prefix,
        endpoint: raw.endpoint.map(|e| e.trim_end_matches('/').to_string()),
        region: raw.region,
        path_style: raw.path_style,
        checksum_mode: raw.checksum_mode,
        credentials: credentials?,
        server_side_encryption,
        max_attempts: raw.max_attempts,
        part_max_attempts: raw.part_max_attempts,
        attempt_timeout,
        lock_expiry,
        integrity: raw.integrity,
        delete_versions: raw.delete_versions,
        object_lock,
    })
}
