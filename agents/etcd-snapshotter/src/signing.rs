//! The installation's delta signing key: a leaf (it imports nothing of the crate), so the configuration that
//! reads it and the deltas it signs both sit above it.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The installation's delta key (`deltaSigningKeyFile`): the writer signs every delta with it, and restores and
/// drills that hold it refuse a delta without a valid signature. A bucket writer can add, replace or extend
/// objects and rewrite their metadata, but cannot sign a delta without the key, so with it a chain cannot be
/// extended or altered by anyone who only holds the bucket's write credentials.
#[derive(Clone)]
pub struct SigningKey(std::sync::Arc<[u8]>);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(redacted)")
    }
}

impl PartialEq for SigningKey {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for SigningKey {}

impl SigningKey {
    /// At least 32 bytes, as written (whitespace at the ends dropped, so a key file ending in a newline is the
    /// same key); the error never shows any of it.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        let key = bytes.trim_ascii();
        if key.len() < 32 {
            return Err(format!("a delta signing key needs at least 32 bytes, this one has {}", key.len()));
        }
        Ok(Self(key.into()))
    }

    /// Reads the key file (mounted from a Secret).
    pub fn read(path: &std::path::Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("reading the delta signing key: {}", e.kind()))?;
        Self::from_bytes(&bytes)
    }

    fn mac(&self, text: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(text);
        mac
    }

    /// HMAC-SHA256 of `text` by this key, as hex.
    pub fn sign(&self, text: &[u8]) -> String {
        hex::encode(self.mac(text).finalize().into_bytes())
    }

    /// Whether `tag` (hex) is this key's HMAC of `text` (compared in constant time).
    pub fn verifies(&self, text: &[u8], tag: &str) -> bool {
        let Ok(tag) = hex::decode(tag) else { return false };
        self.mac(text).verify_slice(&tag).is_ok()
    }
}
