//! The requests the second store's copy pass needs (`crate::secondary`), on the same [`Store`] as every other
//! request: objects listed with their ETag and size, an object read as a stream of parts (one buffer at a time,
//! hashed as it arrives: nothing of it touches the disk), one part put whole with the metadata it carried, and
//! an object's sha256 read back. A larger object goes through the multipart requests of `storage`
//! ([`Store::create_upload_with`], [`Store::upload_part`], [`Store::complete_upload`]).

use std::collections::HashMap;

use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::{StorageError, Store, WRITTEN_BY};
use crate::config::Integrity;
use crate::part_buf::PartPool;

/// One object as listed: its key, ETag (the store's name for this version of it) and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    pub key: String,
    pub etag: String,
    pub size: u64,
}

/// An object being read ([`Store::read_parts`]): its user metadata and announced size, and its body cut into
/// parts of at most `part_size` bytes, each in one buffer that the next part reuses once the last reference to
/// it is dropped. Every byte received is hashed, whether it went into a part or was drained by [`Self::finish`].
pub struct PartReader {
    pub metadata: HashMap<String, String>,
    /// The size the store announced (`Content-Length`); [`Self::finish`] gives the size received.
    pub size: u64,
    body: ByteStream,
    pool: PartPool,
    /// What is left of the last chunk received, not yet in a part.
    rest: Bytes,
    hasher: Sha256,
    received: u64,
}

impl PartReader {
    /// The next part (full unless it is the last), `None` once the body is done.
    pub async fn next_part(&mut self) -> Result<Option<Bytes>, StorageError> {
        let mut part = self.pool.take().map_err(|e| StorageError::Request {
            operation: "GetObject",
            detail: format!("a buffer for a part: {e}"),
        })?;
        while part.len < part.capacity() {
            if self.rest.is_empty() {
                match self.chunk().await? {
                    Some(chunk) => self.rest = chunk,
                    None => break,
                }
            }
            let taken = part.fill(&self.rest);
            self.rest = self.rest.slice(taken..);
        }
        Ok((part.len > 0).then(|| part.into_bytes()))
    }

    /// Reads what is left of the body without keeping it; the sha256 and size of every byte received.
    pub async fn finish(mut self) -> Result<([u8; 32], u64), StorageError> {
        while self.chunk().await?.is_some() {}
        Ok((self.hasher.finalize().into(), self.received))
    }

    /// The body's next chunk, hashed and counted.
    async fn chunk(&mut self) -> Result<Option<Bytes>, StorageError> {
        let Some(chunk) = self.body.next().await else { return Ok(None) };
        let chunk = chunk.map_err(|e| StorageError::Request { operation: "GetObject", detail: e.to_string() })?;
        self.hasher.update(&chunk);
        self.received += chunk.len() as u64;
        Ok(Some(chunk))
    }
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

    /// Opens `key` to be read in parts of at most `part_size` bytes (smaller buffers for a smaller object);
    /// `None` when there is no object.
    pub async fn read_parts(&self, key: &str, part_size: u64) -> Result<Option<PartReader>, StorageError> {
        let Some(out) = self.get_if_any(key).await? else { return Ok(None) };
        let size = out
            .content_length
            .filter(|l| *l >= 0)
            .ok_or(StorageError::Request { operation: "GetObject", detail: "no Content-Length".into() })?
            as u64;
        Ok(Some(PartReader {
            metadata: out.metadata.unwrap_or_default(),
            size,
            body: out.body,
            pool: PartPool::new(size.min(part_size) as usize),
            rest: Bytes::new(),
            hasher: Sha256::new(),
            received: 0,
        }))
    }

    /// The sha256 and size of the object at `key`, read whole; `None` when there is none.
    pub async fn read_sha256(&self, key: &str) -> Result<Option<([u8; 32], u64)>, StorageError> {
        let Some(out) = self.get_if_any(key).await? else { return Ok(None) };
        Ok(Some(super::hash_body(out.body).await?))
    }

    /// PutObject of `body` (one part's worth, from memory) at `key` with `metadata` (the source object's, so a
    /// delta keeps its chain) and [`WRITTEN_BY`], encrypted as configured; with `integrity: checksums` it
    /// carries its SHA-256 (`sha256`), which the store checks. Returns the ETag the store gave it.
    pub async fn put_copy(
        &self,
        key: &str,
        body: Bytes,
        sha256: &[u8; 32],
        metadata: &HashMap<String, String>,
    ) -> Result<String, StorageError> {
        let mut request = self.put_ours(key, None).set_metadata(Some(with_written_by(metadata)));
        if self.integrity == Integrity::Checksums {
            request = request.checksum_sha256(aws_smithy_types::base64::encode(sha256));
        }
        request = self.locked(request, &body);
        let out =
            request.body(ByteStream::from(body)).send().await.map_err(|e| StorageError::request("PutObject", e))?;
        Ok(out.e_tag.unwrap_or_default())
    }
}

/// `metadata` (a copied object's) with [`WRITTEN_BY`] ours, whatever it said.
pub(super) fn with_written_by(metadata: &HashMap<String, String>) -> HashMap<String, String> {
    let mut out = metadata.clone();
    out.insert(WRITTEN_BY.0.into(), WRITTEN_BY.1.into());
    out
}
