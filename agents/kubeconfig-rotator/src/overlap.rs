//! CA overlap through a server-CA rotation: a consumer still holding the previous kubeconfig trusts only the old
//! server CA, and servers keep serving from it for a while, so a published bundle keeps every previous CA the
//! target held that is still valid, beside the candidate's, until it expires (as ca-syncer keeps old and new in a
//! bundle). Expiry is checked here because rustls ignores a trust anchor's validity and kcp's Go consumers do
//! not. Pure.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};

/// At most this many previous CAs are carried (a rotation every few days for a month is still far below).
const MAX_CARRIED: usize = 8;

/// Each certificate of a PEM bundle, as DER with its notAfter; what does not parse is left out.
pub fn certificates(pem: &[u8]) -> Vec<(Vec<u8>, OffsetDateTime)> {
    CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .filter_map(|der| {
            let (_, cert) = X509Certificate::from_der(&der).ok()?;
            let not_after = OffsetDateTime::from_unix_timestamp(cert.validity().not_after.timestamp()).ok()?;
            Some((der.to_vec(), not_after))
        })
        .collect()
}

/// The notAfter of the first certificate in `pem` that has expired at `now`.
pub fn expired(pem: &[u8], now: OffsetDateTime) -> Option<OffsetDateTime> {
    certificates(pem).into_iter().map(|(_, t)| t).find(|t| *t <= now)
}

/// The bundle to publish: the candidate's CA data followed by every CA certificate of `held` (what the target
/// holds) that the candidate lacks and that is valid at `now`, re-encoded from DER (no other text of the held
/// data is carried). `None` when there is nothing to carry: the candidate's CA data is published as it is.
pub fn overlap(candidate: &[u8], held: &[u8], now: OffsetDateTime) -> Option<Vec<u8>> {
    let have: Vec<Vec<u8>> = certificates(candidate).into_iter().map(|(der, _)| der).collect();
    let mut carried: Vec<Vec<u8>> = Vec::new();
    for (der, not_after) in certificates(held) {
        if not_after > now && is_ca(&der) && !have.contains(&der) && !carried.contains(&der) {
            carried.push(der);
        }
    }
    carried.truncate(MAX_CARRIED);
    if carried.is_empty() {
        return None;
    }
    let mut out = candidate.to_vec();
    if !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    for der in carried {
        out.extend_from_slice(pem(&der).as_bytes());
    }
    Some(out)
}

/// A certificate that may sign others (basicConstraints CA): a leaf in a target's CA data is not carried.
fn is_ca(der: &[u8]) -> bool {
    X509Certificate::from_der(der).is_ok_and(|(_, c)| c.is_ca())
}

fn pem(der: &[u8]) -> String {
    let text = B64.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in text.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use testbed::certs::Ca;

    use super::*;

    const DAY: Duration = Duration::from_secs(86400);

    fn ders(pem: &[u8]) -> Vec<Vec<u8>> {
        certificates(pem).into_iter().map(|(d, _)| d).collect()
    }

    #[test]
    fn a_previous_ca_still_valid_is_carried_beside_the_candidates() {
        let (old, new) = (Ca::new("old", DAY).unwrap().cert_pem(), Ca::new("new", DAY).unwrap().cert_pem());
        let out = overlap(new.as_bytes(), old.as_bytes(), OffsetDateTime::now_utc()).expect("carried");
        assert_eq!(ders(&out), [ders(new.as_bytes()), ders(old.as_bytes())].concat());
        // Carrying again what is already carried changes nothing: the published bytes are stable.
        assert_eq!(overlap(&out, &out, OffsetDateTime::now_utc()), None);
    }

    #[test]
    fn an_expired_or_unchanged_ca_is_not_carried() {
        let (old, new) = (Ca::new("old", DAY).unwrap().cert_pem(), Ca::new("new", DAY).unwrap().cert_pem());
        let later = OffsetDateTime::now_utc() + time::Duration::days(2);
        assert_eq!(overlap(new.as_bytes(), old.as_bytes(), later), None, "expired by then");
        assert_eq!(overlap(new.as_bytes(), new.as_bytes(), OffsetDateTime::now_utc()), None, "the same CA");
        assert_eq!(overlap(new.as_bytes(), b"garbage", OffsetDateTime::now_utc()), None);
    }

    #[test]
    fn a_leaf_certificate_in_the_held_data_is_not_carried() {
        let ca = Ca::new("ca", DAY).unwrap();
        let leaf = ca.issue_client("someone", &[], DAY).unwrap().cert_pem;
        let new = Ca::new("new", DAY).unwrap().cert_pem();
        assert_eq!(overlap(new.as_bytes(), leaf.as_bytes(), OffsetDateTime::now_utc()), None);
    }

    #[test]
    fn an_expired_ca_is_found() {
        let ca = Ca::new("ca", DAY).unwrap().cert_pem();
        assert_eq!(expired(ca.as_bytes(), OffsetDateTime::now_utc()), None);
        assert!(expired(ca.as_bytes(), OffsetDateTime::now_utc() + time::Duration::days(2)).is_some());
    }
}
