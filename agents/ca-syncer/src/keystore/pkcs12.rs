//! PKCS#12 trust stores (RFC 7292) holding certificate bags only, in two forms, as trust-manager writes them:
//!
//! - no password: the certificates in clear and no MAC (go-pkcs12's "Passwordless"; Java 18's default trust
//!   store form, read by keytool with any store password);
//! - with a password, profile `Modern2023`: the certificates encrypted with PBES2 (PBKDF2-HMAC-SHA-256, 2048
//!   iterations, AES-256-CBC) and the whole authenticated by an HMAC-SHA-256 MAC whose key comes from the
//!   PKCS#12 key derivation (2048 iterations), the parameters of go-pkcs12's `Modern2023`.
//!
//! Every bag carries its alias as `friendlyName` and Oracle's trusted-key-usage attribute (anyExtendedKeyUsage):
//! without it Java loads a certificate bag as part of a key's chain, not as a trusted certificate entry.
//!
//! Deterministic: the salts and the IV come from the certificates (a SHA-256 over their DER), never from a
//! random source, so the same certificates and password give the same bytes and an unchanged bundle is not
//! rewritten. They never come from the password (the salt is public). What a salt protects against, a table of
//! precomputed keys, does not apply to a file whose content is public anyway.
//!
//! Written by hand, not with the `p12-keystore` crate (0.4.1 looked at): its only writer, `Pkcs12Writer::write`,
//! takes every salt and the IV from `rand::random()` (its `src/codec.rs`, `encrypt` and `compute_traditional_mac!`)
//! and offers no way to pass them or an RNG, so the bytes would change on every pass; it always encrypts and MACs
//! (with an empty password too, which keytool then refuses under any other store password), so the passwordless
//! form is out of reach; and it writes the bags in alias order (a `BTreeMap`), not the bundle's. Its PBES2 also
//! brings scrypt and AES-GCM as second versions beside age's.

use aes::Aes256;
use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockEncrypt, KeyInit};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::Entry;
use super::der::{
    EXPLICIT_0, IMPLICIT_0, algorithm, bmp_string, constructed, octet_string, oid, sequence, set_of, tlv, uint,
};

const ID_DATA: &[u64] = &[1, 2, 840, 113549, 1, 7, 1];
const ID_ENCRYPTED_DATA: &[u64] = &[1, 2, 840, 113549, 1, 7, 6];
const CERT_BAG: &[u64] = &[1, 2, 840, 113549, 1, 12, 10, 1, 3];
const X509_CERTIFICATE: &[u64] = &[1, 2, 840, 113549, 1, 9, 22, 1];
const FRIENDLY_NAME: &[u64] = &[1, 2, 840, 113549, 1, 9, 20];
/// Oracle's `trustedKeyUsage` bag attribute, what makes Java treat a certificate bag as a trust anchor.
const ORACLE_TRUSTED_KEY_USAGE: &[u64] = &[2, 16, 840, 1, 113894, 746875, 1, 1];
const ANY_EXTENDED_KEY_USAGE: &[u64] = &[2, 5, 29, 37, 0];
const PBES2: &[u64] = &[1, 2, 840, 113549, 1, 5, 13];
const PBKDF2: &[u64] = &[1, 2, 840, 113549, 1, 5, 12];
const HMAC_WITH_SHA256: &[u64] = &[1, 2, 840, 113549, 2, 9];
const AES_256_CBC: &[u64] = &[2, 16, 840, 1, 101, 3, 4, 1, 42];
const SHA256: &[u64] = &[2, 16, 840, 1, 101, 3, 4, 2, 1];

/// go-pkcs12's Modern2023: 2048 iterations for both the encryption key and the MAC key, 16-byte salts.
const ITERATIONS: u32 = 2048;
const SALT_LEN: usize = 16;

pub(super) fn encode(entries: &[Entry<'_>], password: &str) -> Vec<u8> {
    let bags: Vec<Vec<u8>> = entries.iter().map(cert_bag).collect();
    let safe_contents = sequence(&bags.iter().map(Vec::as_slice).collect::<Vec<_>>());
    let seed = seed(entries);
    let content = if password.is_empty() {
        data(&safe_contents)
    } else {
        encrypted(&safe_contents, password, &derived::<SALT_LEN>(&seed, b"encryption salt"), &derived(&seed, b"iv"))
    };
    let auth_safe = sequence(&[&content]);
    let mut pfx = vec![uint(3), data(&auth_safe)];
    if !password.is_empty() {
        pfx.push(mac_data(&auth_safe, password, &derived::<SALT_LEN>(&seed, b"mac salt")));
    }
    sequence(&pfx.iter().map(Vec::as_slice).collect::<Vec<_>>())
}

/// `ContentInfo { id-data, [0] EXPLICIT OCTET STRING }`.
fn data(content: &[u8]) -> Vec<u8> {
    sequence(&[&oid(ID_DATA), &constructed(EXPLICIT_0, &[&octet_string(content)])])
}

fn cert_bag(entry: &Entry<'_>) -> Vec<u8> {
    let value = sequence(&[&oid(X509_CERTIFICATE), &constructed(EXPLICIT_0, &[&octet_string(entry.der)])]);
    let friendly = sequence(&[&oid(FRIENDLY_NAME), &set_of(vec![bmp_string(&entry.alias)])]);
    let trusted = sequence(&[&oid(ORACLE_TRUSTED_KEY_USAGE), &set_of(vec![oid(ANY_EXTENDED_KEY_USAGE)])]);
    sequence(&[&oid(CERT_BAG), &constructed(EXPLICIT_0, &[&value]), &set_of(vec![friendly, trusted])])
}

/// `ContentInfo { id-encryptedData, EncryptedData { 0, { id-data, PBES2, [0] IMPLICIT ciphertext } } }`.
fn encrypted(plain: &[u8], password: &str, salt: &[u8], iv: &[u8; 16]) -> Vec<u8> {
    let mut key = [0u8; 32];
    // PBES2 takes the password as its UTF-8 bytes (OpenSSL and Java both), unlike the PKCS#12 KDF below.
    pbkdf2::pbkdf2_hmac::<Sha256>(password.as_bytes(), salt, ITERATIONS, &mut key);
    let kdf = sequence(&[
        &oid(PBKDF2),
        &sequence(&[&octet_string(salt), &uint(ITERATIONS), &algorithm(HMAC_WITH_SHA256, None)]),
    ]);
    let scheme = sequence(&[&oid(AES_256_CBC), &octet_string(iv)]);
    let pbes2 = algorithm(PBES2, Some(&sequence(&[&kdf, &scheme])));
    let ciphertext = aes_256_cbc(&key, iv, plain);
    let info = sequence(&[&oid(ID_DATA), &pbes2, &tlv(IMPLICIT_0, &ciphertext)]);
    let encrypted_data = sequence(&[&uint(0), &info]);
    sequence(&[&oid(ID_ENCRYPTED_DATA), &constructed(EXPLICIT_0, &[&encrypted_data])])
}

/// AES-256-CBC with PKCS#7 padding.
fn aes_256_cbc(key: &[u8; 32], iv: &[u8; 16], plain: &[u8]) -> Vec<u8> {
    let cipher = Aes256::new(GenericArray::from_slice(key));
    let pad = 16 - plain.len() % 16;
    let mut buf = plain.to_vec();
    buf.resize(plain.len() + pad, pad as u8);
    let mut previous = *iv;
    for block in buf.chunks_exact_mut(16) {
        block.iter_mut().zip(previous).for_each(|(b, p)| *b ^= p);
        cipher.encrypt_block(GenericArray::from_mut_slice(block));
        previous.copy_from_slice(block);
    }
    buf
}

/// `MacData { DigestInfo { sha256, HMAC }, salt, iterations }` over the authenticated safe's content.
fn mac_data(auth_safe: &[u8], password: &str, salt: &[u8]) -> Vec<u8> {
    let key = pkcs12_kdf(3, &bmp_password(password), salt, ITERATIONS, 32);
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key).expect("HMAC takes a key of any length");
    mac.update(auth_safe);
    let digest = mac.finalize().into_bytes();
    sequence(&[&sequence(&[&algorithm(SHA256, None), &octet_string(&digest)]), &octet_string(salt), &uint(ITERATIONS)])
}

/// The PKCS#12 KDF's password: BMPString bytes with a two-byte terminator.
fn bmp_password(password: &str) -> Vec<u8> {
    password.encode_utf16().chain([0]).flat_map(u16::to_be_bytes).collect()
}

/// RFC 7292 appendix B.2 with SHA-256 (u = 32, v = 64): `n` bytes of key material for purpose `id`.
fn pkcs12_kdf(id: u8, password: &[u8], salt: &[u8], iterations: u32, n: usize) -> Vec<u8> {
    const V: usize = 64;
    let fill = |x: &[u8]| -> Vec<u8> { x.iter().copied().cycle().take(V * x.len().div_ceil(V)).collect() };
    let mut i = [fill(salt), fill(password)].concat();
    let mut out = Vec::with_capacity(n + 32);
    loop {
        let mut a = Sha256::new().chain_update([id; V]).chain_update(&i).finalize();
        for _ in 1..iterations {
            a = Sha256::digest(a);
        }
        out.extend_from_slice(&a);
        if out.len() >= n {
            out.truncate(n);
            return out;
        }
        let b: Vec<u8> = a.iter().copied().cycle().take(V).collect();
        // Each V-byte block of I becomes (I_j + B + 1) mod 2^(8V).
        for block in i.chunks_exact_mut(V) {
            let mut carry = 1u16;
            for k in (0..V).rev() {
                let sum = u16::from(block[k]) + u16::from(b[k]) + carry;
                block[k] = sum as u8;
                carry = sum >> 8;
            }
        }
    }
}

/// A SHA-256 over the certificates, in order: the one input every salt and the IV are derived from.
fn seed(entries: &[Entry<'_>]) -> [u8; 32] {
    let mut hash = Sha256::new().chain_update(b"ca-syncer pkcs12 v1");
    for entry in entries {
        hash.update((entry.der.len() as u64).to_be_bytes());
        hash.update(entry.der);
    }
    hash.finalize().into()
}

fn derived<const N: usize>(seed: &[u8; 32], purpose: &[u8]) -> [u8; N] {
    let hash = Sha256::new().chain_update(seed).chain_update(purpose).finalize();
    let mut out = [0u8; N];
    out.copy_from_slice(&hash[..N]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aes_256_cbc_matches_the_nist_sp800_38a_vector() {
        // SP 800-38A F.2.5, first block; one whole block of PKCS#7 padding follows it.
        let key: [u8; 32] = hex::decode("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4")
            .expect("hex")
            .try_into()
            .expect("32 bytes");
        let iv: [u8; 16] = hex::decode("000102030405060708090a0b0c0d0e0f").expect("hex").try_into().expect("16");
        let plain = hex::decode("6bc1bee22e409f96e93d7e117393172a").expect("hex");
        let out = aes_256_cbc(&key, &iv, &plain);
        assert_eq!(hex::encode(&out[..16]), "f58c4c04d6e5f1ba779eabfb5f7bfbd6");
        assert_eq!(out.len(), 32);
    }

    #[test]
    fn the_salts_are_fixed_by_the_certificates_and_differ_by_purpose() {
        let der = [1u8, 2, 3];
        let entries = [Entry { alias: "a".into(), created_millis: 0, der: &der }];
        let seed = seed(&entries);
        assert_eq!(derived::<SALT_LEN>(&seed, b"mac salt"), derived::<SALT_LEN>(&super::seed(&entries), b"mac salt"));
        assert_ne!(derived::<SALT_LEN>(&seed, b"mac salt"), derived::<SALT_LEN>(&seed, b"encryption salt"));
    }
}
