//! The bucket, through the AWS SDK configured for S3-compatible stores: explicit region, optional endpoint and
//! path-style addressing, request checksums only when required (unless configured), static or web-identity
//! credentials set explicitly so the SDK has no credential chain to walk and never probes a cloud metadata
//! endpoint, bounded
//! attempts with exponential backoff and a timeout per attempt: `maxAttempts` per request, `partMaxAttempts`
//! per multipart part (a part lost fails the run), each retry counted and logged (`retries`).
//!
//! Errors carry the operation and the SDK's error code, never a credential: the SDK's own messages do not
//! include keys, and the credentials live only inside its provider.

use std::path::{Path, PathBuf};
use std::time::Duration;

use aws_config::provider_config::ProviderConfig;
use aws_config::web_identity_token::{StaticConfiguration, WebIdentityTokenCredentialsProvider};
use aws_sdk_s3::config::{BehaviorVersion, Credentials as SdkCredentials, Region, SharedCredentialsProvider};
use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart, ServerSideEncryption as SdkSse};
use bytes::Bytes;
use kcp_keeper_runtime::Sensitive;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::config::{
    ChecksumMode, Credentials, Integrity, LockMode, ObjectLock, ServerSideEncryption, Storage, WebIdentity,
};
use crate::integrity;
use crate::labels::RetryLabels;
use crate::retries::RetryCounter;

mod mirror;
pub use mirror::{PartReader, StoredObject};

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("S3 {operation}: {detail}")]
    Request { operation: &'static str, detail: String },
    #[error("S3 credentials: {0}")]
    Credentials(String),
    #[error("reading spilled part {path}: {detail}")]
    SpillRead { path: PathBuf, detail: String },
    /// The store holds other bytes than those streamed (`storage.integrity`): nothing may be published.
    #[error("integrity: {0}")]
    Integrity(String),
}

impl StorageError {
    fn request<E: ProvideErrorMetadata + std::error::Error>(operation: &'static str, err: E) -> Self {
        // The code and message the store sent, or the SDK's classification (dispatch failure, timeout).
        let detail = match (err.code(), err.message()) {
            (Some(code), Some(message)) => format!("{code}: {message}"),
            (Some(code), None) => code.to_string(),
            _ => {
                let mut text = err.to_string();
                let mut source = err.source();
                while let Some(s) = source {
                    text.push_str(": ");
                    text.push_str(&s.to_string());
                    source = s.source();
                }
                text
            }
        };
        StorageError::Request { operation, detail }
    }
}

/// A part's bytes: in memory, or in a spill file uploaded from disk.
pub enum Body {
    Memory(Bytes),
    File(PathBuf),
}

/// User metadata on every object and upload this agent writes (`x-amz-meta-written-by`): clean-up removes an
/// object without a manifest only when it carries this, so a hand-placed object in the same key shape stays.
pub const WRITTEN_BY: (&str, &str) = ("written-by", "etcd-snapshotter");

/// One object as listed: its key and when the store last wrote it (the store's clock).
#[derive(Debug, Clone)]
pub struct ListedObject {
    pub key: String,
    pub last_modified: Option<aws_smithy_types::DateTime>,
}

/// A multipart upload in progress: key, id and when the store began it (the store's clock).
#[derive(Debug, Clone)]
pub struct Upload {
    pub key: String,
    pub upload_id: String,
    pub initiated: Option<aws_smithy_types::DateTime>,
}

/// The condition of a conditional PutObject.
#[derive(Debug, Clone, Copy)]
pub enum Condition<'a> {
    /// `If-None-Match: *`: only if no object is at the key.
    Absent,
    /// `If-Match: <etag>`: only if the object at the key is this version.
    Matches(&'a str),
}

/// An object read with its ETag and modification time.
#[derive(Debug, Clone)]
pub struct Versioned {
    pub etag: String,
    pub body: Vec<u8>,
    pub last_modified: Option<aws_smithy_types::DateTime>,
}

/// An object read whole with its user metadata (`x-amz-meta-*`, names lowercased by the store).
#[derive(Debug, Clone)]
pub struct WithMetadata {
    pub body: Vec<u8>,
    pub metadata: std::collections::HashMap<String, String>,
}

/// One bucket under one prefix.
#[derive(Clone)]
pub struct Store {
    client: aws_sdk_s3::Client,
    pub bucket: String,
    pub prefix: String,
    sse: Option<ServerSideEncryption>,
    checksum: ChecksumMode,
    part_max_attempts: u32,
    retries: RetryCounter,
    integrity: Integrity,
    /// Delete versions for good (`storage.deleteVersions`) rather than leave delete markers.
    delete_versions: bool,
    /// How long the shard's lock outlives its holder (`storage.lockExpiry`).
    pub lock_expiry: Duration,
    /// Object lock on every backup object written (`storage.objectLock`).
    object_lock: Option<ObjectLock>,
}

/// The SDK's standard retry strategy with `attempts` attempts: exponential backoff with jitter, 500 ms to 10 s.
fn retry_config(attempts: u32) -> aws_smithy_types::retry::RetryConfig {
    aws_smithy_types::retry::RetryConfig::standard()
        .with_max_attempts(attempts)
        .with_initial_backoff(Duration::from_millis(500))
        .with_max_backoff(Duration::from_secs(10))
}

/// The credentials provider the configuration asks for. Static keys are read now (call again per run so a
/// rotated Secret is picked up); web identity exchanges the projected token file for temporary credentials
/// through STS's AssumeRoleWithWebIdentity, re-reading the file whenever the SDK refreshes them. Either way the
/// provider is set explicitly, so the SDK has no default chain to walk and never probes a metadata endpoint.
fn credentials_provider(storage: &Storage) -> Result<SharedCredentialsProvider, StorageError> {
    let read_file = |dir: &Path, name: &str| {
        std::fs::read_to_string(dir.join(name))
            .map(|s| s.trim().to_string())
            .map_err(|e| StorageError::Credentials(format!("reading {name} in the secretDirectory: {}", e.kind())))
    };
    let read_env = |name: &str| {
        std::env::var(name).map_err(|_| StorageError::Credentials(format!("{name} is not set in the environment")))
    };
    let (key, secret) = match &storage.credentials {
        Credentials::SecretDirectory(dir) => {
            (read_file(dir, "AWS_ACCESS_KEY_ID")?, read_file(dir, "AWS_SECRET_ACCESS_KEY")?)
        }
        Credentials::Environment {} => (read_env("AWS_ACCESS_KEY_ID")?, read_env("AWS_SECRET_ACCESS_KEY")?),
        Credentials::WebIdentity(web) => return Ok(web_identity(web, &storage.region)),
    };
    if key.is_empty() || secret.is_empty() {
        return Err(StorageError::Credentials("the access key id or secret access key is empty".into()));
    }
    let secret = Sensitive::new(secret);
    Ok(SharedCredentialsProvider::new(SdkCredentials::new(key, secret.into_inner(), None, None, "etcd-snapshotter")))
}

/// The SDK's web-identity provider (IRSA and the like) with the role and token file from the configuration,
/// asking the STS endpoint of the bucket's region. Nothing is read or sent until the first request needs
/// credentials; a missing or refused token then fails that request with the SDK's error code.
fn web_identity(web: &WebIdentity, region: &str) -> SharedCredentialsProvider {
    let provider_config = ProviderConfig::without_region()
        .with_region(Some(Region::new(region.to_string())))
        .with_http_client(https_client());
    let provider = WebIdentityTokenCredentialsProvider::builder()
        .configure(&provider_config)
        .static_configuration(StaticConfiguration {
            web_identity_token_file: web.token_file.clone(),
            role_arn: web.role_arn.clone(),
            session_name: "etcd-snapshotter".into(),
        })
        .build();
    SharedCredentialsProvider::new(provider)
}

/// The SDK's HTTP(S) client on rustls with ring, the crypto library the rest of the agent already links (the
/// SDK's default would add aws-lc). Trusted roots are the platform's (`SSL_CERT_FILE`/`SSL_CERT_DIR` honoured).
fn https_client() -> aws_sdk_s3::config::SharedHttpClient {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https()
}

impl Store {
    /// Builds the client; credentials are read now (call again per run so a rotated Secret is picked up).
    pub fn new(storage: &Storage) -> Result<Self, StorageError> {
        let credentials = credentials_provider(storage)?;
        let retries = RetryCounter::default();
        let checksum = match storage.checksum_mode {
            ChecksumMode::WhenRequired => (
                aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired,
                aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired,
            ),
            ChecksumMode::WhenSupported => (
                aws_sdk_s3::config::RequestChecksumCalculation::WhenSupported,
                aws_sdk_s3::config::ResponseChecksumValidation::WhenSupported,
            ),
        };
        let mut config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .http_client(https_client())
            .region(Region::new(storage.region.clone()))
            .force_path_style(storage.path_style)
            .credentials_provider(credentials)
            .request_checksum_calculation(checksum.0)
            .response_checksum_validation(checksum.1)
            .retry_config(retry_config(storage.max_attempts))
            .interceptor(retries.clone())
            .interceptor(crate::clock::StoreClock)
            .timeout_config(
                aws_smithy_types::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(storage.attempt_timeout)
                    .build(),
            );
        if let Some(endpoint) = &storage.endpoint {
            config = config.endpoint_url(endpoint);
        }
        Ok(Self {
            client: aws_sdk_s3::Client::from_conf(config.build()),
            bucket: storage.bucket.clone(),
            prefix: storage.prefix.clone(),
            sse: storage.server_side_encryption.clone(),
            checksum: storage.checksum_mode,
            part_max_attempts: storage.part_max_attempts,
            retries,
            integrity: storage.integrity,
            delete_versions: storage.delete_versions,
            lock_expiry: storage.lock_expiry,
            object_lock: storage.object_lock,
        })
    }

    /// The object lock a backup object written now gets: its mode and the end of its retention (the store's
    /// time, as far as the answers so far prove it, plus `retainFor`); none when not configured.
    fn lock_now(&self) -> Option<(aws_sdk_s3::types::ObjectLockMode, aws_smithy_types::DateTime)> {
        let lock = self.object_lock?;
        let mode = match lock.mode {
            LockMode::Governance => aws_sdk_s3::types::ObjectLockMode::Governance,
            LockMode::Compliance => aws_sdk_s3::types::ObjectLockMode::Compliance,
        };
        let until = crate::clock::now() + lock.retain_for;
        Some((mode, aws_smithy_types::DateTime::from_millis(until.timestamp_millis())))
    }

    /// With `objectLock` configured, that the bucket has object lock enabled: a bucket without it would refuse
    /// every locked write, or, worse, a store that ignores the headers would keep deletable backups while the
    /// operator believes them immutable.
    pub async fn check_object_lock(&self) -> Result<(), StorageError> {
        if self.object_lock.is_none() {
            return Ok(());
        }
        let enabled = match self.client.get_object_lock_configuration().bucket(&self.bucket).send().await {
            Ok(out) => out
                .object_lock_configuration
                .and_then(|c| c.object_lock_enabled)
                .is_some_and(|e| e == aws_sdk_s3::types::ObjectLockEnabled::Enabled),
            Err(e) if e.code() == Some("ObjectLockConfigurationNotFoundError") => false,
            Err(e) => return Err(StorageError::request("GetObjectLockConfiguration", e)),
        };
        if enabled {
            Ok(())
        } else {
            Err(StorageError::Request {
                operation: "GetObjectLockConfiguration",
                detail: format!(
                    "storage.objectLock is set but bucket {} has no object lock enabled (S3 enables it only when \
                     the bucket is created; create the bucket with object lock, or remove storage.objectLock)",
                    self.bucket
                ),
            })
        }
    }

    /// Counts every retry of this store's requests in `family` (the daemon's `etcd_snapshotter_retries_total`).
    pub fn counting_retries(self, family: Family<RetryLabels, Counter>) -> Self {
        self.retries.count_into(family);
        self
    }

    fn sse(&self) -> (Option<SdkSse>, Option<String>) {
        match &self.sse {
            None => (None, None),
            Some(ServerSideEncryption::Aes256) => (Some(SdkSse::Aes256), None),
            Some(ServerSideEncryption::AwsKms { key_id }) => (Some(SdkSse::AwsKms), key_id.clone()),
        }
    }

    /// Whether the bucket answers (and our credentials are accepted).
    pub async fn reachable(&self) -> Result<(), StorageError> {
        self.client
            .head_bucket()
            .bucket(&self.bucket)
            .send()
            .await
            .map_err(|e| StorageError::request("HeadBucket", e))?;
        self.check_object_lock().await
    }

    pub async fn create_upload(&self, key: &str) -> Result<String, StorageError> {
        self.create_upload_with(key, &std::collections::HashMap::new()).await
    }

    /// CreateMultipartUpload at `key`, the object to carry `metadata` (a copied object's) beside [`WRITTEN_BY`].
    pub async fn create_upload_with(
        &self,
        key: &str,
        metadata: &std::collections::HashMap<String, String>,
    ) -> Result<String, StorageError> {
        let (sse, kms) = self.sse();
        let mut request = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .set_metadata(Some(mirror::with_written_by(metadata)))
            .set_server_side_encryption(sse)
            .set_ssekms_key_id(kms);
        if let Some((mode, until)) = self.lock_now() {
            request = request.object_lock_mode(mode).object_lock_retain_until_date(until);
        }
        if self.integrity == Integrity::Checksums {
            // The parts then carry their SHA-256 and the object gets S3's checksum of them.
            request = request.checksum_algorithm(aws_sdk_s3::types::ChecksumAlgorithm::Sha256);
        } else if self.checksum == ChecksumMode::WhenSupported {
            request = request.checksum_algorithm(aws_sdk_s3::types::ChecksumAlgorithm::Crc32);
        }
        let out = request.send().await.map_err(|e| StorageError::request("CreateMultipartUpload", e))?;
        out.upload_id.ok_or(StorageError::Request { operation: "CreateMultipartUpload", detail: "no upload id".into() })
    }

    pub async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: i32,
        body: Body,
    ) -> Result<CompletedPart, StorageError> {
        // Ours, from the bytes as they are here: the store refuses a part whose bytes do not match it.
        let digest = match (&body, self.integrity) {
            (_, Integrity::ReadBack) => None,
            (Body::Memory(bytes), Integrity::Checksums) => Some(integrity::sha256_base64(bytes)),
            (Body::File(path), Integrity::Checksums) => Some(
                integrity::file_sha256_base64(path)
                    .await
                    .map_err(|e| StorageError::SpillRead { path: path.clone(), detail: e.to_string() })?,
            ),
        };
        let stream = match body {
            Body::Memory(bytes) => ByteStream::from(bytes),
            Body::File(path) => ByteStream::from_path(&path)
                .await
                .map_err(|e| StorageError::SpillRead { path: path.clone(), detail: e.to_string() })?,
        };
        let mut request = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .part_number(number)
            .body(stream);
        if let Some(digest) = &digest {
            request = request.checksum_sha256(digest);
        } else if self.checksum == ChecksumMode::WhenSupported {
            request = request.checksum_algorithm(aws_sdk_s3::types::ChecksumAlgorithm::Crc32);
        }
        let mut request = request
            .customize()
            .config_override(aws_sdk_s3::Config::builder().retry_config(retry_config(self.part_max_attempts)));
        if self.unsigned_parts(digest.is_some()) {
            request = request.disable_payload_signing();
        }
        let out = request.send().await.map_err(|e| StorageError::request("UploadPart", e))?;
        if let (Some(ours), Some(theirs)) = (&digest, &out.checksum_sha256)
            && ours != theirs
        {
            return Err(StorageError::Integrity(format!(
                "part {number} is stored with SHA-256 {theirs}, {ours} was sent"
            )));
        }
        Ok(CompletedPart::builder()
            .part_number(number)
            .set_e_tag(out.e_tag)
            .set_checksum_crc32(out.checksum_crc32)
            .set_checksum_sha256(digest)
            .build())
    }

    /// Whether a part goes with `UNSIGNED-PAYLOAD` rather than SigV4's SHA-256 of its body, a third pass over
    /// every byte (6% of the agent's profile; docs/benchmarks.md). Only where the bytes are proven otherwise:
    /// with `integrity: checksums` the part's own SHA-256 travels in a signed header and the store refuses a
    /// body that does not match it; with `readBack` the whole object is read back and compared before anything
    /// is published. Not when the SDK is to add a CRC32 of its own (`checksumMode: whenSupported` without a part
    /// digest): unsigned, it would send that as an aws-chunked trailer, which not every S3-compatible store
    /// takes.
    fn unsigned_parts(&self, part_digest: bool) -> bool {
        part_digest || self.checksum == ChecksumMode::WhenRequired
    }

    /// CompleteMultipartUpload; with `integrity: checksums` the object's checksum must then be ours. The ETag
    /// the store gave the object.
    pub async fn complete_upload(
        &self,
        key: &str,
        upload_id: &str,
        mut parts: Vec<CompletedPart>,
    ) -> Result<String, StorageError> {
        parts.sort_by_key(|p| p.part_number);
        let ours = match self.integrity {
            Integrity::ReadBack => None,
            Integrity::Checksums => Some(
                integrity::composite_sha256(parts.iter().map(|p| p.checksum_sha256().unwrap_or_default()))
                    .ok_or_else(|| StorageError::Integrity("a part has no SHA-256".into()))?,
            ),
        };
        let completed = self
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
            .send()
            .await
            .map_err(|e| StorageError::request("CompleteMultipartUpload", e))?;
        let etag = completed.e_tag.unwrap_or_default();
        let Some(ours) = ours else { return Ok(etag) };
        let head = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .checksum_mode(aws_sdk_s3::types::ChecksumMode::Enabled)
            .send()
            .await
            .map_err(|e| StorageError::request("HeadObject", e))?;
        match head.checksum_sha256() {
            Some(theirs) if integrity::same_object_checksum(&ours, theirs) => Ok(etag),
            Some(theirs) => {
                Err(StorageError::Integrity(format!("the object is stored with checksum {theirs}, ours is {ours}")))
            }
            None => Err(StorageError::Integrity(
                "the store gave no SHA-256 checksum for the object; with a store that keeps none, set \
                 storage.integrity: readBack"
                    .into(),
            )),
        }
    }

    /// With `integrity: readBack`, reads the stored object whole and compares its sha256 with `sha256`, the
    /// bytes streamed; nothing to do with `checksums` (the parts and the object were proven on the way).
    pub async fn read_back(&self, key: &str, sha256: &[u8; 32]) -> Result<(), StorageError> {
        if self.integrity != Integrity::ReadBack {
            return Ok(());
        }
        let (stored, _) = hash_body(self.get(key).await?).await?;
        if &stored != sha256 {
            return Err(StorageError::Integrity(format!(
                "the object read back has sha256 {}, {} was streamed",
                hex::encode(stored),
                hex::encode(sha256)
            )));
        }
        Ok(())
    }

    pub async fn abort_upload(&self, key: &str, upload_id: &str) -> Result<(), StorageError> {
        self.client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .send()
            .await
            .map_err(|e| StorageError::request("AbortMultipartUpload", e))?;
        Ok(())
    }

    /// Every key under `prefix`.
    pub async fn list_keys(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        Ok(self.list_objects(prefix).await?.into_iter().map(|o| o.key).collect())
    }

    /// A PutObject of one of our whole objects: marked as ours, encrypted as configured.
    fn put_ours(
        &self,
        key: &str,
        content_type: Option<&str>,
    ) -> aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder {
        let (sse, kms) = self.sse();
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .set_content_type(content_type.map(str::to_string))
            .metadata(WRITTEN_BY.0, WRITTEN_BY.1)
            .set_server_side_encryption(sse)
            .set_ssekms_key_id(kms)
    }

    /// A PutObject of one of our small JSON objects (manifest, report, lock).
    fn put_json(
        &self,
        key: &str,
        body: Vec<u8>,
    ) -> aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder {
        self.put_ours(key, Some("application/json")).body(ByteStream::from(body))
    }

    pub async fn put(&self, key: &str, body: Vec<u8>) -> Result<(), StorageError> {
        self.put_json(key, body).send().await.map_err(|e| StorageError::request("PutObject", e))?;
        Ok(())
    }

    /// [`Self::put`] of a backup object (a snapshot's manifest): under object lock when configured, with its
    /// SHA-256 (S3 refuses a locked write without an integrity header).
    pub async fn put_backup(&self, key: &str, body: Vec<u8>) -> Result<(), StorageError> {
        let request = self.locked(self.put_ours(key, Some("application/json")), &body);
        request.body(ByteStream::from(body)).send().await.map_err(|e| StorageError::request("PutObject", e))?;
        Ok(())
    }

    /// `request` (a PutObject of `body`) under object lock when configured, with the body's SHA-256.
    fn locked(
        &self,
        request: aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder,
        body: &[u8],
    ) -> aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder {
        match self.lock_now() {
            Some((mode, until)) => request
                .object_lock_mode(mode)
                .object_lock_retain_until_date(until)
                .checksum_sha256(integrity::sha256_base64(body)),
            None => request,
        }
    }

    pub async fn get_bytes(&self, key: &str) -> Result<Vec<u8>, StorageError> {
        let out = self.get(key).await?;
        let bytes =
            out.collect().await.map_err(|e| StorageError::Request { operation: "GetObject", detail: e.to_string() })?;
        Ok(bytes.to_vec())
    }

    pub async fn get(&self, key: &str) -> Result<ByteStream, StorageError> {
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| StorageError::request("GetObject", e))?;
        Ok(out.body)
    }

    pub async fn size(&self, key: &str) -> Result<u64, StorageError> {
        let out = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| StorageError::request("HeadObject", e))?;
        Ok(out.content_length.unwrap_or(-1).max(0) as u64)
    }

    /// PutObject under `condition`: `Some(etag)` when written, `None` when the store refused the condition
    /// (412, or 409 for a conditional write that raced another; a missing object for `Matches`).
    pub async fn put_conditional(
        &self,
        key: &str,
        body: Vec<u8>,
        condition: Condition<'_>,
    ) -> Result<Option<String>, StorageError> {
        let request = self.put_json(key, body);
        let request = match condition {
            Condition::Absent => request.if_none_match("*"),
            Condition::Matches(etag) => request.if_match(etag),
        };
        match request.send().await {
            Ok(out) => Ok(Some(out.e_tag.unwrap_or_default())),
            Err(e) if condition_refused(&e) || e.code() == Some("NoSuchKey") => Ok(None),
            Err(e) => Err(StorageError::request("PutObject", e)),
        }
    }

    /// The object at `key` with its ETag, or `None` when there is none.
    pub async fn get_versioned(&self, key: &str) -> Result<Option<Versioned>, StorageError> {
        Ok(self.get_whole(key).await?.map(|(out, body)| Versioned {
            etag: out.e_tag.unwrap_or_default(),
            body,
            last_modified: out.last_modified,
        }))
    }

    /// The object at `key` read whole, with what the store said of it (its body taken out); `None` when there is
    /// none.
    async fn get_whole(
        &self,
        key: &str,
    ) -> Result<Option<(aws_sdk_s3::operation::get_object::GetObjectOutput, Vec<u8>)>, StorageError> {
        let Some(mut out) = self.get_if_any(key).await? else { return Ok(None) };
        let body = std::mem::take(&mut out.body)
            .collect()
            .await
            .map_err(|e| StorageError::Request { operation: "GetObject", detail: e.to_string() })?;
        Ok(Some((out, body.to_vec())))
    }

    /// GetObject of `key`; `None` when there is no object.
    async fn get_if_any(
        &self,
        key: &str,
    ) -> Result<Option<aws_sdk_s3::operation::get_object::GetObjectOutput>, StorageError> {
        match self.client.get_object().bucket(&self.bucket).key(key).send().await {
            Ok(out) => Ok(Some(out)),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => Ok(None),
            Err(e) => Err(StorageError::request("GetObject", e)),
        }
    }

    /// Every object under `prefix` with its modification time.
    pub async fn list_objects(&self, prefix: &str) -> Result<Vec<ListedObject>, StorageError> {
        let listed = self.list_all(prefix).await?;
        Ok(listed
            .iter()
            .filter_map(|o| Some(ListedObject { key: o.key()?.to_string(), last_modified: o.last_modified().copied() }))
            .collect())
    }

    /// Every object under `prefix` as ListObjectsV2 describes it, page after page: each caller keeps the
    /// fields it needs.
    async fn list_all(&self, prefix: &str) -> Result<Vec<aws_sdk_s3::types::Object>, StorageError> {
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(prefix)
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| StorageError::request("ListObjectsV2", e))?;
            let truncated = page.is_truncated() == Some(true);
            let next = page.next_continuation_token.clone();
            out.extend(page.contents.unwrap_or_default());
            match next {
                Some(next) if truncated => token = Some(next),
                _ => return Ok(out),
            }
        }
    }

    /// Multipart uploads in progress under `prefix`, with when each began.
    pub async fn uploads(&self, prefix: &str) -> Result<Vec<Upload>, StorageError> {
        let mut out = Vec::new();
        let (mut key_marker, mut id_marker) = (None, None);
        loop {
            let page = self
                .client
                .list_multipart_uploads()
                .bucket(&self.bucket)
                .prefix(prefix)
                .set_key_marker(key_marker.take())
                .set_upload_id_marker(id_marker.take())
                .send()
                .await
                .map_err(|e| StorageError::request("ListMultipartUploads", e))?;
            for upload in page.uploads() {
                if let (Some(key), Some(id)) = (upload.key(), upload.upload_id()) {
                    out.push(Upload {
                        key: key.to_string(),
                        upload_id: id.to_string(),
                        initiated: upload.initiated().copied(),
                    });
                }
            }
            key_marker = page.next_key_marker.filter(|_| page.is_truncated == Some(true));
            id_marker = page.next_upload_id_marker;
            if key_marker.is_none() {
                return Ok(out);
            }
        }
    }

    /// Writes a delta object (`delta`), whole, only where none is (`If-None-Match: *`), with its chain in user
    /// metadata beside [`WRITTEN_BY`]: `Ok(false)` when another writer put one at the key first.
    pub async fn put_new(&self, key: &str, body: Vec<u8>, metadata: &[(&str, String)]) -> Result<bool, StorageError> {
        let mut request = self.put_ours(key, Some("application/octet-stream")).if_none_match("*");
        if self.integrity == Integrity::Checksums {
            request = request.checksum_sha256(integrity::sha256_base64(&body));
        }
        request = self.locked(request, &body);
        for (name, value) in metadata {
            request = request.metadata(*name, value);
        }
        match request.body(ByteStream::from(body)).send().await {
            Ok(_) => Ok(true),
            Err(e) if condition_refused(&e) => Ok(false),
            Err(e) => Err(StorageError::request("PutObject", e)),
        }
    }

    /// An object with its user metadata, or `None` when there is none at `key`.
    pub async fn get_with_metadata(&self, key: &str) -> Result<Option<WithMetadata>, StorageError> {
        Ok(self
            .get_whole(key)
            .await?
            .map(|(out, body)| WithMetadata { body, metadata: out.metadata.unwrap_or_default() }))
    }

    /// The user metadata of the object at `key`, or `None` when there is none.
    pub async fn head_metadata(
        &self,
        key: &str,
    ) -> Result<Option<std::collections::HashMap<String, String>>, StorageError> {
        match self.client.head_object().bucket(&self.bucket).key(key).send().await {
            Ok(head) => Ok(Some(head.metadata.unwrap_or_default())),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => Ok(None),
            Err(e) => Err(StorageError::request("HeadObject", e)),
        }
    }

    /// The "directories" right under `prefix` (common prefixes at the next `/`): one per snapshot under a
    /// shard's directory, however many deltas each holds.
    pub async fn list_dirs(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(prefix)
                .delimiter("/")
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| StorageError::request("ListObjectsV2", e))?;
            out.extend(page.common_prefixes().iter().filter_map(|p| p.prefix().map(str::to_string)));
            match page.next_continuation_token {
                Some(next) if page.is_truncated() == Some(true) => token = Some(next),
                _ => return Ok(out),
            }
        }
    }

    /// Whether the object at `key` carries [`WRITTEN_BY`] (false when it is gone).
    pub async fn written_by_us(&self, key: &str) -> Result<bool, StorageError> {
        match self.client.head_object().bucket(&self.bucket).key(key).send().await {
            Ok(head) => Ok(head.metadata().and_then(|m| m.get(WRITTEN_BY.0)).is_some_and(|v| v == WRITTEN_BY.1)),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => Ok(false),
            Err(e) => Err(StorageError::request("HeadObject", e)),
        }
    }

    /// Deletes `key` unless object lock protects it: `Ok(false)` when it is locked (a retention date in the
    /// future or a legal hold), so retention skips it and goes on.
    pub async fn delete_unless_locked(&self, key: &str) -> Result<bool, StorageError> {
        let head = match self.client.head_object().bucket(&self.bucket).key(key).send().await {
            Ok(head) => head,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => return Ok(true),
            Err(e) => return Err(StorageError::request("HeadObject", e)),
        };
        let now = aws_smithy_types::DateTime::from(std::time::SystemTime::now());
        let retained = head.object_lock_retain_until_date().is_some_and(|until| until.secs() > now.secs());
        let held = head.object_lock_legal_hold_status() == Some(&aws_sdk_s3::types::ObjectLockLegalHoldStatus::On);
        if retained || held {
            return Ok(false);
        }
        // With a version id the object really goes; without, a versioned bucket keeps it behind a delete marker
        // (the default: what goes for good is the configuration's decision, `storage.deleteVersions`).
        let version = head.version_id.filter(|_| self.delete_versions);
        match self.client.delete_object().bucket(&self.bucket).key(key).set_version_id(version).send().await {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some("AccessDenied") => Ok(false),
            Err(e) => Err(StorageError::request("DeleteObject", e)),
        }
    }
}

/// A conditional PutObject the store refused because of its condition: 412, or 409 for a conditional write
/// that raced another (stores name these by code, and some only by status).
fn condition_refused(
    e: &aws_sdk_s3::error::SdkError<
        aws_sdk_s3::operation::put_object::PutObjectError,
        aws_sdk_s3::config::http::HttpResponse,
    >,
) -> bool {
    matches!(e.code(), Some("PreconditionFailed" | "ConditionalRequestConflict"))
        || e.raw_response().is_some_and(|r| matches!(r.status().as_u16(), 409 | 412))
}

/// The sha256 and size of a body, read to its end.
async fn hash_body(mut body: ByteStream) -> Result<([u8; 32], u64), StorageError> {
    use sha2::Digest;
    let (mut hasher, mut size) = (sha2::Sha256::new(), 0u64);
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| StorageError::Request { operation: "GetObject", detail: e.to_string() })?;
        hasher.update(&chunk);
        size += chunk.len() as u64;
    }
    Ok((hasher.finalize().into(), size))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example's storage, pointed at a closed loopback port with `credentials`.
    fn storage(credentials: Credentials) -> Storage {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("example.yaml");
        let text = std::fs::read_to_string(&path).expect("example.yaml");
        let config: crate::config::Config = kcp_keeper_runtime::config::parse(&path, &text).expect("valid");
        Storage { endpoint: Some("http://127.0.0.1:1".into()), credentials, max_attempts: 1, ..config.storage }
    }

    /// The web-identity provider is wired (not refused), reads its token only when a request needs
    /// credentials, and a token it cannot read fails that request as a credentials error before anything is
    /// sent anywhere (the endpoint is a closed loopback port; STS is never reached without a token).
    #[tokio::test]
    async fn web_identity_is_built_and_an_unreadable_token_fails_the_request_before_sending() {
        let dir = tempfile::tempdir().unwrap();
        let web = WebIdentity { role_arn: "arn:aws:iam::1:role/x".into(), token_file: dir.path().join("missing") };
        let store = Store::new(&storage(Credentials::WebIdentity(web))).expect("web identity builds a store");
        let err = store.reachable().await.expect_err("no token, no credentials").to_string();
        assert!(err.to_lowercase().contains("credential"), "{err}");
    }
}
