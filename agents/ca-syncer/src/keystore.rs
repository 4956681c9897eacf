//! Binary trust stores for Java consumers, written beside the PEM key of a target (`additionalFormats`): JKS and
//! PKCS#12, encoded here without I/O. [`jks`] and [`pkcs12`] hold the formats; [`der`] the DER they share.
//!
//! The same certificates and password always give the same bytes (no clock, no random salt), so a pass with
//! nothing new compares equal and writes nothing, as for the PEM key.

mod der;
mod jks;
mod pkcs12;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use crate::certs::Certificate;

/// A binary format. Both take a password; an empty one makes a PKCS#12 file without encryption or MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    Jks,
    /// trust-manager's `Modern2023` profile when there is a password ([`pkcs12`]).
    Pkcs12,
}

/// One certificate as a trust store entry.
struct Entry<'a> {
    alias: String,
    /// The entry's creation time in JKS, in milliseconds since the epoch.
    created_millis: i64,
    der: &'a [u8],
}

/// The longest alias written, in UTF-16 units (the subject is cut, never the hash that makes it unique).
const MAX_ALIAS: usize = 256;

/// The trust store holding `certs` (in the order given: the bundle's), protected by `password`.
pub fn encode(format: Format, certs: &[Certificate], password: &str) -> Vec<u8> {
    let entries: Vec<Entry<'_>> = certs.iter().map(entry).collect();
    match format {
        Format::Jks => jks::encode(&entries, password),
        Format::Pkcs12 => pkcs12::encode(&entries, password),
    }
}

/// trust-manager's alias, so its users find the same names: the first 8 hex digits of the certificate's SHA-256
/// (what makes two certificates with one subject distinct), `|`, the subject.
fn entry(cert: &Certificate) -> Entry<'_> {
    let alias = format!("{}|{}", &cert.fingerprint().to_string()[..8], cert.subject());
    let alias = alias.chars().take(MAX_ALIAS).collect();
    let created_millis = cert.not_before().unix_timestamp().saturating_mul(1000);
    Entry { alias, created_millis, der: cert.der() }
}

/// Trust stores encoded by recent passes, so a pass with nothing new does not encode again (a PKCS#12 store with
/// a password costs two 2048-round key derivations) and a fan-out to many targets encodes each store once. Keyed
/// by a SHA-256 over the format, the password and the certificates; what the last pass did not use is dropped
/// at the end of the next one.
#[derive(Default)]
pub struct Memo(Mutex<MemoMaps>);

#[derive(Default)]
struct MemoMaps {
    used: HashMap<[u8; 32], Arc<Vec<u8>>>,
    previous: HashMap<[u8; 32], Arc<Vec<u8>>>,
}

impl Memo {
    /// [`encode`], from the memo when this or the previous pass encoded the same store.
    pub fn encode(&self, format: Format, certs: &[Certificate], password: &str) -> Arc<Vec<u8>> {
        let mut id = Sha256::new().chain_update([format as u8]).chain_update((password.len() as u64).to_be_bytes());
        id.update(password.as_bytes());
        for cert in certs {
            id.update(cert.fingerprint().as_bytes());
        }
        let id: [u8; 32] = id.finalize().into();
        let mut maps = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bytes) = maps.used.get(&id) {
            return bytes.clone();
        }
        let bytes = maps.previous.remove(&id).unwrap_or_else(|| Arc::new(encode(format, certs, password)));
        maps.used.insert(id, bytes.clone());
        bytes
    }

    /// Ends a pass: what it did not use is dropped at the end of the next one.
    pub fn end_pass(&self) {
        let mut maps = self.0.lock().unwrap_or_else(|e| e.into_inner());
        maps.previous = std::mem::take(&mut maps.used);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testcerts::TestCa;

    #[test]
    fn the_same_certificates_and_password_give_the_same_bytes_and_another_password_others() {
        let certs = [TestCa::root("alpha").cert(), TestCa::root("beta").cert()];
        for format in [Format::Jks, Format::Pkcs12] {
            let once = encode(format, &certs, "changeit");
            assert_eq!(once, encode(format, &certs, "changeit"), "{format:?}");
            assert_ne!(once, encode(format, &certs, "another"), "{format:?}");
            assert_ne!(once, encode(format, &certs[..1], "changeit"), "{format:?}");
        }
        let passwordless = encode(Format::Pkcs12, &certs, "");
        assert_eq!(passwordless, encode(Format::Pkcs12, &certs, ""));
    }

    #[test]
    fn the_memo_returns_what_encode_gives_and_tells_passwords_and_formats_apart() {
        let certs = [TestCa::root("alpha").cert()];
        let memo = Memo::default();
        for _pass in 0..3 {
            for (format, password) in [(Format::Jks, "changeit"), (Format::Pkcs12, "changeit"), (Format::Pkcs12, "")] {
                assert_eq!(*memo.encode(format, &certs, password), encode(format, &certs, password));
            }
            memo.end_pass();
        }
        assert_eq!(memo.0.lock().map(|m| m.previous.len()).unwrap_or_default(), 3, "kept while used");
        memo.end_pass();
        assert!(memo.0.lock().map(|m| m.previous.is_empty()).unwrap_or_default(), "dropped once unused");
    }

    #[test]
    fn an_alias_starts_with_the_certificates_hash_and_its_subject() {
        let cert = TestCa::root("kcp-root").cert();
        let entry = entry(&cert);
        assert_eq!(entry.alias, format!("{}|CN=kcp-root", &cert.fingerprint().to_string()[..8]));
        assert_eq!(entry.created_millis, cert.not_before().unix_timestamp() * 1000);
    }
}
