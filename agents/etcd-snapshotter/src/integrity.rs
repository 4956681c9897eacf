//! Proving that what S3 stored is what was streamed (`storage.integrity`), the pure part: each part's SHA-256
//! (sent with the part, so the store refuses bytes that changed on the way), the multipart object's checksum
//! S3 derives from them (the SHA-256 of the parts' digests, then `-<parts>`), and the comparison with what the
//! store says. The requests are in `storage`.

use aws_smithy_types::base64;
use sha2::{Digest, Sha256};

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
    async fn a_spilled_part_hashes_like_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..700_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(dir.path().join("part"), &bytes).unwrap();
        assert_eq!(file_sha256_base64(&dir.path().join("part")).await.unwrap(), sha256_base64(&bytes));
    }
}
