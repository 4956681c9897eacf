//! etcd's snapshot stream ends with the sha256 of everything before it (32 bytes). We hash while the bytes
//! pass, always holding the last 32 back, and compare at the end: a snapshot whose trailer does not match is
//! never published. `etcdutl snapshot restore` checks the same trailer, so the stored bytes keep it.

use sha2::{Digest, Sha256};

pub const TRAILER_LEN: usize = 32;

#[derive(Default)]
pub struct TrailerCheck {
    hasher: Sha256,
    tail: Vec<u8>,
    total: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrailerError {
    #[error("the stream ended after {0} bytes, too short to hold etcd's trailing sha256")]
    TooShort(u64),
    #[error("etcd's trailing sha256 {expected} does not match the sha256 of the {len} bytes received ({actual})")]
    Mismatch { expected: String, actual: String, len: u64 },
}

/// The verified result: etcd's sha256 and the number of bytes it covers plus the trailer itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub sha256: [u8; 32],
    pub total_bytes: u64,
}

impl TrailerCheck {
    pub fn update(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        if chunk.len() >= TRAILER_LEN {
            // The bytes held back and all but the chunk's last 32 are data: hashed in place, so only 32 bytes
            // per chunk are copied, not the whole stream.
            let (data, last) = chunk.split_at(chunk.len() - TRAILER_LEN);
            self.hasher.update(&self.tail);
            self.hasher.update(data);
            self.tail.clear();
            self.tail.extend_from_slice(last);
            return;
        }
        self.tail.extend_from_slice(chunk);
        if self.tail.len() > TRAILER_LEN {
            let spill = self.tail.len() - TRAILER_LEN;
            self.hasher.update(&self.tail[..spill]);
            self.tail.drain(..spill);
        }
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn finish(self) -> Result<Verified, TrailerError> {
        if self.tail.len() < TRAILER_LEN {
            return Err(TrailerError::TooShort(self.total));
        }
        let actual: [u8; 32] = self.hasher.finalize().into();
        if actual[..] != self.tail[..] {
            return Err(TrailerError::Mismatch {
                expected: hex::encode(&self.tail),
                actual: hex::encode(actual),
                len: self.total - TRAILER_LEN as u64,
            });
        }
        Ok(Verified { sha256: actual, total_bytes: self.total })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(db: &[u8]) -> Vec<u8> {
        let mut out = db.to_vec();
        out.extend_from_slice(&Sha256::digest(db));
        out
    }

    #[test]
    fn a_stream_with_its_trailer_verifies_whatever_the_chunking() {
        let data = stream(&(0..100_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        for chunk in [1, 7, 31, 32, 33, 64, 32 * 1024] {
            let mut check = TrailerCheck::default();
            data.chunks(chunk).for_each(|c| check.update(c));
            let verified = check.finish().unwrap();
            assert_eq!(verified.total_bytes, data.len() as u64);
            assert_eq!(verified.sha256[..], data[data.len() - 32..]);
        }
    }

    #[test]
    fn chunks_shorter_and_longer_than_the_trailer_mixed_verify() {
        let data = stream(&(0..50_000u32).map(|i| (i % 241) as u8).collect::<Vec<_>>());
        let sizes = [5, 40, 1, 32, 31, 33, 4096, 2, 64];
        let mut check = TrailerCheck::default();
        let (mut at, mut i) = (0, 0);
        while at < data.len() {
            let end = (at + sizes[i % sizes.len()]).min(data.len());
            check.update(&data[at..end]);
            (at, i) = (end, i + 1);
        }
        assert_eq!(check.finish().unwrap().sha256[..], data[data.len() - 32..]);
        // A short last chunk after a long one: the trailer spans both.
        let mut check = TrailerCheck::default();
        check.update(&data[..data.len() - 10]);
        check.update(&data[data.len() - 10..]);
        assert!(check.finish().is_ok());
    }

    #[test]
    fn one_flipped_byte_or_a_missing_trailer_fails() {
        let mut data = stream(b"some etcd database bytes");
        data[3] ^= 0x01;
        let mut check = TrailerCheck::default();
        check.update(&data);
        assert!(matches!(check.finish(), Err(TrailerError::Mismatch { len: 24, .. })));
        let mut check = TrailerCheck::default();
        check.update(&[0u8; 20]);
        assert_eq!(check.finish(), Err(TrailerError::TooShort(20)));
        // A stream cut short by a whole chunk: the last 32 bytes are data, not the hash of what came before.
        let mut check = TrailerCheck::default();
        check.update(&stream(&[7u8; 4096])[..4000]);
        assert!(matches!(check.finish(), Err(TrailerError::Mismatch { .. })));
    }
}
