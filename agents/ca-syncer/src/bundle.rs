//! Building a CA bundle from the certificates of several sources, and rendering it as byte-stable PEM.
//!
//! Consumers hot-reload the bundle when its bytes change, so the same set of certificates must always give the
//! same bytes, whatever the order of the sources or of the blocks inside them:
//!
//! - certificates are deduplicated by the SHA-256 of their DER;
//! - they are ordered by subject (the DER bytes of the subject Name, so the order does not depend on how a
//!   library renders names), then notBefore (older generation of a CA first), then SHA-256 (total order);
//! - each is written as a `CERTIFICATE` block with 64-character base64 lines and `\n` line endings, no headers,
//!   no comments, no blank lines; the text ends with exactly one `\n`. No certificate renders as empty text.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::certs::{Certificate, Fingerprint};

/// How a bundle is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleOptions {
    /// Drop certificates whose notAfter is before `now`.
    pub drop_expired: bool,
    pub now: OffsetDateTime,
}

/// A deduplicated, ordered set of certificates.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bundle {
    certs: Vec<Certificate>,
    dropped_expired: Vec<Certificate>,
}

impl Bundle {
    /// Builds the bundle from all sources' certificates (flattened, in any order).
    pub fn build(certs: impl IntoIterator<Item = Certificate>, options: &BundleOptions) -> Self {
        let mut unique: BTreeMap<Fingerprint, Certificate> = BTreeMap::new();
        for cert in certs {
            unique.entry(cert.fingerprint()).or_insert(cert);
        }
        let (mut certs, mut dropped_expired): (Vec<_>, Vec<_>) =
            unique.into_values().partition(|c| !(options.drop_expired && c.is_expired_at(options.now)));
        certs.sort_by(bundle_order);
        dropped_expired.sort_by(bundle_order);
        Self { certs, dropped_expired }
    }

    /// The certificates, in bundle order.
    pub fn certificates(&self) -> &[Certificate] {
        &self.certs
    }

    /// Certificates left out because they had expired (empty unless `drop_expired`), for reporting.
    pub fn dropped_expired(&self) -> &[Certificate] {
        &self.dropped_expired
    }

    pub fn len(&self) -> usize {
        self.certs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.certs.is_empty()
    }

    pub fn fingerprints(&self) -> impl Iterator<Item = Fingerprint> + '_ {
        self.certs.iter().map(Certificate::fingerprint)
    }

    /// The PEM text to publish.
    pub fn render(&self) -> String {
        render_pem(&self.certs)
    }

    /// One line of facts per certificate, in bundle order, for `render` and status output.
    pub fn summaries(&self) -> Vec<CertSummary> {
        self.certs.iter().map(CertSummary::of).collect()
    }

    /// The earliest notAfter in the bundle: when the bundle next changes on its own if expired certificates are
    /// dropped (the caller re-syncs just after it).
    pub fn earliest_not_after(&self) -> Option<OffsetDateTime> {
        self.certs.iter().map(Certificate::not_after).min()
    }
}

/// The documented bundle order: subject DER, then notBefore, then SHA-256.
pub fn bundle_order(a: &Certificate, b: &Certificate) -> Ordering {
    a.subject_der()
        .cmp(b.subject_der())
        .then_with(|| a.not_before().cmp(&b.not_before()))
        .then_with(|| a.fingerprint().cmp(&b.fingerprint()))
}

/// Renders certificates, in the given order, in the fixed encoding described in the module docs.
pub fn render_pem(certs: &[Certificate]) -> String {
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF).set_line_wrap(64);
    // Each block already ends with "\n"; concatenating (not `encode_many`, which puts a blank line between
    // blocks) gives one trailing newline and no blank lines.
    certs.iter().map(|c| pem::encode_config(&pem::Pem::new("CERTIFICATE", c.der()), config)).collect()
}

/// What `render` shows of a certificate. Everything here is public.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSummary {
    pub subject: String,
    pub issuer: String,
    pub serial: String,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    pub is_ca: bool,
    pub sha256: Fingerprint,
}

impl CertSummary {
    pub fn of(cert: &Certificate) -> Self {
        Self {
            subject: cert.subject().to_owned(),
            issuer: cert.issuer().to_owned(),
            serial: cert.serial().to_owned(),
            not_before: cert.not_before(),
            not_after: cert.not_after(),
            is_ca: cert.is_ca(),
            sha256: cert.fingerprint(),
        }
    }
}

impl fmt::Display for CertSummary {
    /// `subject="CN=root" issuer="CN=root" notAfter=2035-01-01T00:00:00Z ca=true sha256=...`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "subject={:?} issuer={:?} notAfter={} ca={} sha256={}",
            self.subject,
            self.issuer,
            rfc3339(self.not_after),
            self.is_ca,
            self.sha256
        )
    }
}

/// RFC 3339 in UTC; falls back to the Unix timestamp for years RFC 3339 cannot hold.
pub fn rfc3339(t: OffsetDateTime) -> String {
    t.to_offset(time::UtcOffset::UTC).format(&Rfc3339).unwrap_or_else(|_| format!("@{}", t.unix_timestamp()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::{EmptyPolicy, parse_certificates};
    use crate::testcerts::{DAY, T2025, TestCa, at};

    fn options(now: OffsetDateTime) -> BundleOptions {
        BundleOptions { drop_expired: true, now }
    }

    fn now() -> OffsetDateTime {
        at(T2025 + 100 * DAY)
    }

    #[test]
    fn same_certs_in_any_source_order_render_identical_bytes() {
        let a = TestCa::root("alpha");
        let b = TestCa::root("beta");
        let c = a.intermediate("gamma");
        let orders = [
            vec![vec![a.cert(), b.cert()], vec![c.cert()]],
            vec![vec![c.cert()], vec![b.cert(), a.cert()]],
            vec![vec![b.cert()], vec![c.cert(), a.cert()], vec![a.cert()]],
        ];
        let rendered: Vec<String> = orders
            .into_iter()
            .map(|sources| Bundle::build(sources.into_iter().flatten(), &options(now())).render())
            .collect();
        assert_eq!(rendered[0], rendered[1]);
        assert_eq!(rendered[0], rendered[2]);
    }

    #[test]
    fn duplicate_certificates_across_sources_appear_once() {
        let a = TestCa::root("alpha");
        let b = TestCa::root("beta");
        let bundle = Bundle::build([a.cert(), b.cert(), a.cert(), a.cert()], &options(now()));
        assert_eq!(bundle.len(), 2);
        assert_eq!(bundle.render().matches("BEGIN CERTIFICATE").count(), 2);
    }

    #[test]
    fn the_same_certificate_wrapped_differently_in_two_sources_is_deduplicated() {
        let a = TestCa::root("alpha");
        let body = crate::testcerts::base64_body(&a.pem());
        let lines: Vec<String> = body.as_bytes().chunks(40).map(|c| String::from_utf8_lossy(c).into()).collect();
        let rewrapped =
            format!("-----BEGIN CERTIFICATE-----\r\n{}\r\n-----END CERTIFICATE-----\r\n", lines.join("\r\n"));
        let first = parse_certificates(a.pem().as_bytes(), EmptyPolicy::Reject).expect("parses");
        let second = parse_certificates(rewrapped.as_bytes(), EmptyPolicy::Reject).expect("parses");
        let bundle = Bundle::build(first.into_iter().chain(second), &options(now()));
        assert_eq!(bundle.len(), 1);
    }

    #[test]
    fn render_uses_64_char_lines_lf_endings_and_exactly_one_trailing_newline() {
        let a = TestCa::root("alpha");
        let b = TestCa::root("beta");
        let text = Bundle::build([a.cert(), b.cert()], &options(now())).render();
        assert!(!text.contains('\r'));
        assert!(text.ends_with("-----END CERTIFICATE-----\n"));
        assert!(!text.ends_with("\n\n"));
        assert!(!text.contains("\n\n"), "no blank line between blocks");
        for line in text.lines().filter(|l| !l.starts_with("-----")) {
            assert!(line.len() <= 64, "{line}");
        }
        let full_lines = text.lines().filter(|l| !l.starts_with("-----") && l.len() == 64).count();
        assert!(full_lines > 0);
        assert_eq!(text.lines().filter(|l| l.starts_with("-----BEGIN")).count(), 2);
    }

    #[test]
    fn rendered_bundle_parses_back_to_the_same_certificates() {
        let a = TestCa::root("alpha");
        let b = a.intermediate("beta");
        let bundle = Bundle::build([b.cert(), a.cert()], &options(now()));
        let back = parse_certificates(bundle.render().as_bytes(), EmptyPolicy::Reject).expect("parses");
        assert_eq!(back, bundle.certificates());
    }

    #[test]
    fn order_is_by_subject_then_not_before_then_sha256() {
        // Two generations of the same CA (same subject, rotated key), plus another CA.
        let old = TestCa::root_valid("kcp-root", at(T2025), at(T2025 + 365 * DAY));
        let new = TestCa::root_valid("kcp-root", at(T2025 + 30 * DAY), at(T2025 + 395 * DAY));
        let other = TestCa::root("another");
        let bundle = Bundle::build([new.cert(), other.cert(), old.cert()], &options(now()));
        let order: Vec<_> = bundle.certificates().iter().map(|c| (c.subject().to_owned(), c.not_before())).collect();
        // The DER of "CN=another" sorts before that of "CN=kcp-root" (it is shorter, so its length bytes are
        // smaller); DER order is not alphabetical order, but it is stable.
        assert_eq!(
            order,
            [
                ("CN=another".to_owned(), other.not_before),
                ("CN=kcp-root".to_owned(), old.not_before),
                ("CN=kcp-root".to_owned(), new.not_before)
            ]
        );
        let twin_a = TestCa::root("twin");
        let twin_b = TestCa::root("twin");
        let twins = Bundle::build([twin_a.cert(), twin_b.cert()], &options(now()));
        assert!(twins.certificates()[0].fingerprint() < twins.certificates()[1].fingerprint());
    }

    #[test]
    fn drop_expired_removes_certificates_past_not_after_and_reports_them() {
        let expired = TestCa::root_valid("expired", at(T2025), at(T2025 + 10 * DAY));
        let valid = TestCa::root("valid");
        let bundle = Bundle::build([expired.cert(), valid.cert()], &options(now()));
        assert_eq!(bundle.certificates(), [valid.cert()]);
        assert_eq!(bundle.dropped_expired(), [expired.cert()]);
    }

    #[test]
    fn expired_certificates_are_kept_when_drop_expired_is_off() {
        let expired = TestCa::root_valid("expired", at(T2025), at(T2025 + 10 * DAY));
        let bundle = Bundle::build([expired.cert()], &BundleOptions { drop_expired: false, now: now() });
        assert_eq!(bundle.len(), 1);
        assert!(bundle.dropped_expired().is_empty());
    }

    #[test]
    fn certificate_is_valid_through_its_not_after_second() {
        let ca = TestCa::root_valid("edge", at(T2025), at(T2025 + DAY));
        assert_eq!(Bundle::build([ca.cert()], &options(ca.not_after)).len(), 1);
        let just_after = ca.not_after + time::Duration::seconds(1);
        assert!(Bundle::build([ca.cert()], &options(just_after)).is_empty());
    }

    #[test]
    fn empty_bundle_renders_as_empty_text() {
        let bundle = Bundle::build([], &options(now()));
        assert!(bundle.is_empty());
        assert_eq!(bundle.render(), "");
        assert_eq!(bundle.earliest_not_after(), None);
    }

    #[test]
    fn summaries_list_subject_issuer_and_not_after_in_bundle_order() {
        let root = TestCa::root("kcp-root");
        let inter = root.intermediate("kcp-server-ca");
        let bundle = Bundle::build([root.cert(), inter.cert()], &options(now()));
        let summaries = bundle.summaries();
        assert_eq!(summaries.len(), 2);
        assert_eq!(summaries[0].subject, "CN=kcp-root");
        assert_eq!(summaries[1].subject, "CN=kcp-server-ca");
        assert_eq!(summaries[1].issuer, "CN=kcp-root");
        assert_eq!(summaries[1].not_after, root.not_after);
        assert!(summaries.iter().all(|s| s.is_ca));
        let line = summaries[1].to_string();
        assert!(
            line.starts_with(
                r#"subject="CN=kcp-server-ca" issuer="CN=kcp-root" notAfter=2034-12-30T00:00:00Z ca=true sha256="#
            ),
            "{line}"
        );
    }

    #[test]
    fn earliest_not_after_is_the_next_expiry() {
        let soon = TestCa::root_valid("soon", at(T2025), at(T2025 + 200 * DAY));
        let later = TestCa::root("later");
        let bundle = Bundle::build([later.cert(), soon.cert()], &options(now()));
        assert_eq!(bundle.earliest_not_after(), Some(soon.not_after));
    }
}
