//! Proving that what S3 stored is what was streamed (`storage.integrity`), the pure part: each part's SHA-256
//! (sent with the part, so the store refuses bytes that changed on the way), the multipart object's checksum
//! S3 derives from them (the SHA-256 of the parts' digests, then `-<parts>`), and the comparison with what the
//! store says. The requests are in `storage`. And the object's own SHA-256 (the manifest's `objectSha256`),
//! hashed from the finished parts in order on a thread of its own ([`InOrder`]).

use aws_smithy_types::base64;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

/// Parts queued for [`InOrder`] at most: the encoder waits when the hash lags by more (memory stays bounded:
/// these are the same buffers the uploader holds, kept alive at most this many parts longer).
const HASH_QUEUE: usize = 2;

/// The SHA-256 of a stream of parts, in the order they were pushed, computed on a blocking thread: the
/// encoder's thread then only compresses and encrypts while this runs on the other core (SHA-256 was 22% of
/// the agent's profile, all of it on the encoder's thread but the SDK's share; docs/benchmarks.md). Dropped
/// unfinished, the thread ends once it has drained what was queued.
pub struct InOrder {
    tx: mpsc::Sender<Bytes>,
    done: tokio::task::JoinHandle<[u8; 32]>,
}

impl InOrder {
    pub fn start() -> Self {
        let (tx, mut rx) = mpsc::channel::<Bytes>(HASH_QUEUE);
        let done = tokio::task::spawn_blocking(move || {
            let mut hasher = Sha256::new();
            while let Some(part) = rx.blocking_recv() {
                hasher.update(&part);
            }
            hasher.finalize().into()
        });
        Self { tx, done }
    }

    /// Queues the next part (a reference to its buffer, not a copy).
    pub async fn push(&self, part: Bytes) {
        // The thread only ends when `tx` is dropped, so the send cannot fail while `self` lives.
        let _ = self.tx.send(part).await;
    }

    /// The SHA-256 of every part pushed, in order.
    pub async fn finish(self) -> std::io::Result<[u8; 32]> {
        drop(self.tx);
        self.done.await.map_err(std::io::Error::other)
    }
}

pub fn sha256_base64(bytes: &[u8]) -> String {
    base64::encode(Sha256::digest(bytes))
}

/// A spilled part's SHA-256, read in blocks (a part may be large; memory stays bounded).
pub async fn file_sha256_base64(path: &std::path::Path) -> std::io::Result<String> {
    use tokio::io::AsyncReadExt;
    let mut file = tokio::fs::File::open(path).await?;
    let mut hasher = Sha256::new();
    let mut block = vec![0u8; 256 * 1024];
    loop {
        let n = file.read(&mut block).await?;
        if n == 0 {
            return Ok(base64::encode(hasher.finalize()));
        }
        hasher.update(&block[..n]);
    }
}

/// The checksum of a multipart object from its parts' SHA-256 (base64, in part order): S3's composite
/// checksum, `base64(sha256(digest_1 || ... || digest_n))-n`. `None` when a part's digest is not base64 of 32
/// bytes.
pub fn composite_sha256<'a>(parts: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut hasher = Sha256::new();
    let mut count = 0usize;
    for part in parts {
        let digest = base64::decode(part).ok().filter(|d| d.len() == 32)?;
        hasher.update(&digest);
        count += 1;
    }
    Some(format!("{}-{count}", base64::encode(hasher.finalize())))
}

/// Whether the store's checksum of the object is ours. Stores write the part count suffix or leave it out;
/// the digest must match either way, and a count, when given, too.
pub fn same_object_checksum(ours: &str, theirs: &str) -> bool {
    let split = |s: &str| match s.rsplit_once('-') {
        Some((digest, count)) if count.bytes().all(|b| b.is_ascii_digit()) => {
            (digest.to_string(), Some(count.to_string()))
        }
        _ => (s.to_string(), None),
    };
    let ((our_digest, our_count), (their_digest, their_count)) = (split(ours), split(theirs));
    our_digest == their_digest && (their_count.is_none() || their_count == our_count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_composite_is_the_sha256_of_the_part_digests_with_the_part_count() {
        let (a, b) = (sha256_base64(b"part one"), sha256_base64(b"part two"));
        let mut concatenated = Sha256::digest(b"part one").to_vec();
        concatenated.extend(Sha256::digest(b"part two"));
        let expected = format!("{}-2", base64::encode(Sha256::digest(&concatenated)));
        assert_eq!(composite_sha256([a.as_str(), b.as_str()]), Some(expected.clone()));
        assert_ne!(composite_sha256([b.as_str(), a.as_str()]), Some(expected.clone()), "order matters");
        assert_eq!(composite_sha256(["not base64!"]), None);
        assert_eq!(composite_sha256([base64::encode([0u8; 16]).as_str()]), None, "not a SHA-256");
    }

    #[test]
    fn the_stores_checksum_must_have_our_digest_and_our_part_count_when_it_gives_one() {
        assert!(same_object_checksum("abc=-3", "abc=-3"));
        assert!(same_object_checksum("abc=-3", "abc="));
        assert!(!same_object_checksum("abc=-3", "abc=-2"));
        assert!(!same_object_checksum("abc=-3", "abd=-3"));
        assert!(!same_object_checksum("abc=-3", ""));
    }

    #[tokio::test]
    async fn parts_hashed_in_order_give_the_sha256_of_their_concatenation() {
        let parts: Vec<Bytes> = (0..5u8).map(|i| Bytes::from(vec![i; 100_000 + i as usize])).collect();
        let hasher = InOrder::start();
        for part in &parts {
            hasher.push(part.clone()).await;
        }
        let digest = hasher.finish().await.unwrap();
        assert_eq!(digest[..], Sha256::digest(parts.concat())[..]);
        assert_eq!(InOrder::start().finish().await.unwrap()[..], Sha256::digest(b"")[..], "no parts: the empty object");
    }

    #[tokio::test]
    async fn a_spilled_part_hashes_like_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..700_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(dir.path().join("part"), &bytes).unwrap();
        assert_eq!(file_sha256_base64(&dir.path().join("part")).await.unwrap(), sha256_base64(&bytes));
    }
}
