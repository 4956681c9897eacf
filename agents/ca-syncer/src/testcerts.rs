//! Test certificates made with rcgen: CAs with chosen validity, intermediates, leaves, and their keys.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use time::OffsetDateTime;

use crate::certs::Certificate;

/// A Unix timestamp as a time (whole seconds, as certificates store them).
pub fn at(unix: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(unix).expect("valid timestamp")
}

/// 2025-01-01T00:00:00Z
pub const T2025: i64 = 1_735_689_600;
pub const DAY: i64 = 86_400;

pub struct TestCa {
    key: KeyPair,
    params: CertificateParams,
    cert: rcgen::Certificate,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

fn ca_params(cn: &str, not_before: OffsetDateTime, not_after: OffsetDateTime) -> CertificateParams {
    let mut params = CertificateParams::new(vec![]).expect("params");
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.not_before = not_before;
    params.not_after = not_after;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
}

impl TestCa {
    /// A self-signed CA valid 2025-01-01 .. 2035-01-01.
    pub fn root(cn: &str) -> Self {
        Self::root_valid(cn, at(T2025), at(T2025 + 3650 * DAY))
    }

    pub fn root_valid(cn: &str, not_before: OffsetDateTime, not_after: OffsetDateTime) -> Self {
        let key = KeyPair::generate().expect("key");
        let params = ca_params(cn, not_before, not_after);
        let cert = params.self_signed(&key).expect("self-signed");
        Self { key, params, cert, not_before, not_after }
    }

    /// An intermediate CA signed by this one, with this one's validity.
    pub fn intermediate(&self, cn: &str) -> Self {
        let key = KeyPair::generate().expect("key");
        let params = ca_params(cn, self.not_before, self.not_after);
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("signed");
        Self { key, params, cert, not_before: self.not_before, not_after: self.not_after }
    }

    /// A server certificate signed by this CA, as PEM.
    pub fn leaf(&self, cn: &str) -> String {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec![format!("{cn}.example.com")]).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.not_before = self.not_before;
        params.not_after = self.not_after;
        let issuer = Issuer::from_params(&self.params, &self.key);
        params.signed_by(&key, &issuer).expect("signed").pem()
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    pub fn der(&self) -> &[u8] {
        self.cert.der()
    }

    /// The CA's private key as PKCS#8 PEM: what sits in `tls.key` next to the certificate.
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    pub fn cert(&self) -> Certificate {
        Certificate::from_der(self.der()).expect("test certificate parses")
    }
}

/// The base64 body of a PEM block, on one line.
pub fn base64_body(pem: &str) -> String {
    pem.lines().filter(|l| !l.starts_with("-----")).collect()
}
