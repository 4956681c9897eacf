//! The requests the second store's copy pass needs (`crate::secondary`), on the same [`Store`] as every other
//! request: objects listed with their ETag and size, an object downloaded to a file while hashing, a file put
//! whole with the metadata it carried, and an object's sha256 read back.

use std::collections::HashMap;
use std::path::Path;

use aws_sdk_s3::operation::get_object::GetObjectOutput;
use aws_sdk_s3::primitives::ByteStream;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::{StorageError, Store, WRITTEN_BY};
use crate::config::Integrity;

/// S3's bound on one PutObject: a larger object would need a multipart copy, which this pass does not make.
pub const MAX_SINGLE_PUT: u64 = 5 << 30;

/// One object as listed: its key, ETag (the store's name for this version of it) and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    pub key: String,
    pub etag: String,
    pub size: u64,
}

/// An object downloaded to a file: the sha256 and size of the bytes received, and its user metadata.
#[derive(Debug, Clone)]
pub struct Downloaded {
    pub sha256: [u8; 32],
    pub size: u64,
    pub metadata: HashMap<String, String>,
}

impl Store {
    /// Every object under `prefix` with its ETag and size.
    pub async fn list_versions(&self, prefix: &str) -> Result<Vec<StoredObject>, StorageError> {
        let listed = self.list_all(prefix).await?;
        Ok(listed
            .iter()
            .filter_map(|o| {
                Some(StoredObject {
                    key: o.key()?.to_string(),
                    etag: o.e_tag().unwrap_or_default().to_string(),
                    size: o.size().unwrap_or(0).max(0) as u64,
                })
            })
            .collect())
    }

    /// Downloads `key` into the file `path` (created), hashing what arrives; `None` when there is no object.
    pub async fn download(&self, key: &str, path: &Path) -> Result<Option<Downloaded>, StorageError> {
        let Some(out) = self.get_if_any(key).await? else { return Ok(None) };
        let metadata = out.metadata.clone().unwrap_or_default();
        let local = |e: std::io::Error| StorageError::SpillRead { path: path.into(), detail: e.to_string() };
        let mut file = tokio::fs::File::create(path).await.map_err(local)?;
        let (sha256, size) = hash_body(out.body, Some((&mut file, path))).await?;
        file.flush().await.map_err(local)?;
        Ok(Some(Downloaded { sha256, size, metadata }))
    }

    /// The sha256 and size of the object at `key`, read whole; `None` when there is none.
    pub async fn read_sha256(&self, key: &str) -> Result<Option<([u8; 32], u64)>, StorageError> {
        let Some(out) = self.get_if_any(key).await? else { return Ok(None) };
        Ok(Some(hash_body(out.body, None).await?))
    }

    /// GetObject of `key`; `None` when there is no object.
    async fn get_if_any(&self, key: &str) -> Result<Option<GetObjectOutput>, StorageError> {
        match self.client.get_object().bucket(&self.bucket).key(key).send().await {
            Ok(out) => Ok(Some(out)),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => Ok(None),
            Err(e) => Err(StorageError::request("GetObject", e)),
        }
    }

    /// PutObject of the file `path` at `key` with `metadata` (the source object's, so a delta keeps its chain)
    /// and [`WRITTEN_BY`], encrypted as configured; with `integrity: checksums` it carries its SHA-256, which the
    /// store checks. Returns the ETag the store gave it.
    pub async fn put_file(
        &self,
        key: &str,
        path: &Path,
        sha256: &[u8; 32],
        metadata: &HashMap<String, String>,
    ) -> Result<String, StorageError> {
        let body = ByteStream::from_path(path)
            .await
            .map_err(|e| StorageError::SpillRead { path: path.into(), detail: e.to_string() })?;
        let (sse, kms) = self.sse();
        let mut request = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .set_server_side_encryption(sse)
            .set_ssekms_key_id(kms);
        for (name, value) in metadata.iter().filter(|(name, _)| name.as_str() != WRITTEN_BY.0) {
            request = request.metadata(name, value);
        }
        request = request.metadata(WRITTEN_BY.0, WRITTEN_BY.1);
        if self.integrity == Integrity::Checksums {
            request = request.checksum_sha256(aws_smithy_types::base64::encode(sha256));
        }
        let out = request.body(body).send().await.map_err(|e| StorageError::request("PutObject", e))?;
        Ok(out.e_tag.unwrap_or_default())
    }
}

/// Hashes `body` as it arrives, writing each chunk to the file when one is given: the sha256 and the size.
async fn hash_body(
    mut body: ByteStream,
    mut file: Option<(&mut tokio::fs::File, &Path)>,
) -> Result<([u8; 32], u64), StorageError> {
    let (mut hasher, mut size) = (Sha256::new(), 0u64);
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| StorageError::Request { operation: "GetObject", detail: e.to_string() })?;
        hasher.update(&chunk);
        size += chunk.len() as u64;
        if let Some((file, path)) = file.as_mut() {
            file.write_all(&chunk)
                .await
                .map_err(|e| StorageError::SpillRead { path: path.to_path_buf(), detail: e.to_string() })?;
        }
    }
    Ok((hasher.finalize().into(), size))
}
