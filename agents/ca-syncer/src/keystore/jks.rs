//! Java KeyStore (JKS) trust stores: Sun's format, as `sun.security.provider.JavaKeyStore` reads it.
//!
//! `FEEDFEED`, version 2, the entry count, then one trusted-certificate entry (tag 2) per certificate: its alias
//! and creation time, the type `X.509` and the DER; then a SHA-1 over the password (UTF-16BE), the text
//! "Mighty Aphrodite" and everything before it. That digest is integrity against accidents, not protection:
//! nothing in a trust store is secret.

use sha1::{Digest, Sha1};

use super::{Entry, MAX_ALIAS};

const MAGIC: u32 = 0xfeed_feed;
const VERSION: u32 = 2;
const TRUSTED_CERT: u32 = 2;
/// The keyed-digest whitener Sun's implementation uses.
const WHITENER: &[u8] = b"Mighty Aphrodite";

pub(super) fn encode(entries: &[Entry<'_>], password: &str) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC.to_be_bytes());
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    for entry in entries {
        out.extend_from_slice(&TRUSTED_CERT.to_be_bytes());
        // Java lower-cases JKS aliases when it loads them; writing them lower-case keeps `keytool -list` and
        // the file in agreement.
        java_utf(&mut out, &entry.alias.to_lowercase());
        // The creation time: the certificate's notBefore, so the same certificates give the same bytes.
        out.extend_from_slice(&entry.created_millis.to_be_bytes());
        java_utf(&mut out, "X.509");
        out.extend_from_slice(&(entry.der.len() as u32).to_be_bytes());
        out.extend_from_slice(entry.der);
    }
    let mut digest = Sha1::new();
    let password: Vec<u8> = password.encode_utf16().flat_map(u16::to_be_bytes).collect();
    digest.update(&password);
    digest.update(WHITENER);
    digest.update(&out);
    out.extend_from_slice(&digest.finalize());
    out
}

/// `DataOutputStream.writeUTF`: a 16-bit length, then Java's modified UTF-8 (U+0000 as two bytes, characters
/// beyond the BMP as two three-byte surrogates). Cut to [`MAX_ALIAS`] UTF-16 units, far below the 65535-byte
/// limit.
fn java_utf(out: &mut Vec<u8>, text: &str) {
    let mut bytes = Vec::new();
    for unit in text.encode_utf16().take(MAX_ALIAS) {
        match unit {
            0x0001..=0x007f => bytes.push(unit as u8),
            0x0000 | 0x0080..=0x07ff => {
                bytes.push(0xc0 | (unit >> 6) as u8);
                bytes.push(0x80 | (unit & 0x3f) as u8);
            }
            _ => {
                bytes.push(0xe0 | (unit >> 12) as u8);
                bytes.push(0x80 | ((unit >> 6) & 0x3f) as u8);
                bytes.push(0x80 | (unit & 0x3f) as u8);
            }
        }
    }
    out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    out.extend_from_slice(&bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modified_utf8_encodes_nul_and_supplementary_characters_as_java_does() {
        let mut out = Vec::new();
        java_utf(&mut out, "a\u{0}é😀");
        assert_eq!(out, [0, 11, b'a', 0xc0, 0x80, 0xc3, 0xa9, 0xed, 0xa0, 0xbd, 0xed, 0xb8, 0x80]);
    }
}
