//! Strict parsing of one source's bytes into X.509 certificates.
//!
//! A CA source is often a Secret that also holds the CA's private key (kcp-operator's `<rootshard>-server-ca`
//! has `tls.key` next to `tls.crt`), so a mistake in configuration points us straight at key material. The
//! parser therefore accepts exactly one shape: `CERTIFICATE` PEM blocks separated by whitespace. Anything else
//! (another block type, encapsulated headers, text around the blocks, a body that is not base64 or not a
//! certificate) rejects the whole source, and the error says what and where (block and line numbers, both
//! counted from 1) but never carries a byte of the content.
//!
//! The framing (where blocks start and end, what lies between them) is checked here line by line because the
//! `pem` crate silently skips text outside blocks; the base64 decoding of each accepted block is the `pem`
//! crate's, and the DER is parsed by `x509-parser`.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Sources bigger than this are refused before parsing. Kubernetes caps a Secret at 1 MiB; a file with the
/// public roots is a few hundred KiB.
pub const MAX_SOURCE_BYTES: usize = 4 * 1024 * 1024;

/// SHA-256 of a certificate's DER: its identity for deduplication and in the rotation state.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn of(der: &[u8]) -> Self {
        Self(Sha256::digest(der).into())
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    /// Lowercase hex, 64 characters.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// The text is not 64 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a SHA-256 fingerprint (64 hex digits)")]
pub struct InvalidFingerprint;

impl FromStr for Fingerprint {
    type Err = InvalidFingerprint;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|_| InvalidFingerprint)?;
        Ok(Self(out))
    }
}

/// One parsed certificate. Certificates are public, so `Debug` shows who it is; the DER is not printed because
/// it is long, not because it is secret. Equality is identity of the DER (its fingerprint).
#[derive(Clone)]
pub struct Certificate {
    der: Arc<[u8]>,
    fingerprint: Fingerprint,
    subject: String,
    subject_der: Vec<u8>,
    issuer: String,
    serial: String,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    is_ca: bool,
}

/// Why a DER blob is not an acceptable certificate. Deliberately coarse and free of content: the parser's own
/// messages can quote bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CertificateError {
    #[error("not a DER-encoded X.509 certificate")]
    Malformed,
    #[error("bytes follow the certificate's DER")]
    TrailingData,
    #[error("its basicConstraints extension is invalid or repeated")]
    InvalidBasicConstraints,
}

impl Certificate {
    /// Parses one DER certificate; the whole input must be that certificate.
    pub fn from_der(der: &[u8]) -> Result<Self, CertificateError> {
        let (rest, cert) = X509Certificate::from_der(der).map_err(|_| CertificateError::Malformed)?;
        if !rest.is_empty() {
            return Err(CertificateError::TrailingData);
        }
        // `X509Certificate::is_ca` treats a broken extension as "not a CA"; a trust anchor with a broken
        // extension is better refused than guessed at.
        let is_ca = cert
            .basic_constraints()
            .map_err(|_| CertificateError::InvalidBasicConstraints)?
            .is_some_and(|ext| ext.value.ca);
        let validity = cert.validity();
        Ok(Self {
            der: Arc::from(der),
            fingerprint: Fingerprint::of(der),
            subject: cert.subject().to_string(),
            subject_der: cert.subject().as_raw().to_vec(),
            issuer: cert.issuer().to_string(),
            serial: cert.raw_serial_as_string(),
            not_before: validity.not_before.to_datetime(),
            not_after: validity.not_after.to_datetime(),
            is_ca,
        })
    }

    pub fn der(&self) -> &[u8] {
        &self.der
    }

    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// Subject distinguished name as text (RFC 4514 style, as x509-parser renders it).
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Subject distinguished name as its DER bytes: what the bundle order is built on, because it does not
    /// depend on how any library renders names.
    pub fn subject_der(&self) -> &[u8] {
        &self.subject_der
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Serial number as colon-separated hex.
    pub fn serial(&self) -> &str {
        &self.serial
    }

    pub fn not_before(&self) -> OffsetDateTime {
        self.not_before
    }

    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    /// `basicConstraints CA:TRUE`.
    pub fn is_ca(&self) -> bool {
        self.is_ca
    }

    /// X.509 validity includes its notAfter second, so a certificate is expired only once `now` is past it.
    pub fn is_expired_at(&self, now: OffsetDateTime) -> bool {
        self.not_after < now
    }
}

impl PartialEq for Certificate {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint
    }
}

impl Eq for Certificate {}

impl fmt::Debug for Certificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certificate")
            .field("subject", &self.subject)
            .field("not_after", &self.not_after)
            .field("sha256", &self.fingerprint)
            .finish()
    }
}

/// Whether a source with no certificate at all (empty or only whitespace) is acceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmptyPolicy {
    /// A configured source must contribute at least one certificate.
    Reject,
    /// For reading back a published target, which may be empty on purpose ("empty means public roots").
    Allow,
}

/// What a non-certificate block is, as far as its label tells. A closed set so that an error can say what was
/// found without repeating text from the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::Display)]
pub enum BlockKind {
    #[strum(to_string = "private key")]
    PrivateKey,
    #[strum(to_string = "public key")]
    PublicKey,
    #[strum(to_string = "certificate request")]
    CertificateRequest,
    #[strum(to_string = "certificate revocation list")]
    RevocationList,
    /// `TRUSTED CERTIFICATE` (OpenSSL's certificate plus trust settings) and the legacy `X509 CERTIFICATE`:
    /// certificates, but not in the plain form consumers read.
    #[strum(to_string = "non-standard certificate (TRUSTED/X509 CERTIFICATE)")]
    NonStandardCertificate,
    #[strum(to_string = "PKCS#7/CMS")]
    Pkcs7,
    #[strum(to_string = "key parameters")]
    Parameters,
    #[strum(to_string = "unrecognised")]
    Unrecognised,
}

impl BlockKind {
    fn of_label(label: &str) -> Self {
        // Any label mentioning PRIVATE counts as a key: RSA/EC/DSA/OPENSSH/ENCRYPTED/ANY PRIVATE KEY, and
        // whatever a tool invents next. Reporting it as a key is what makes the alert useful.
        if label.to_ascii_uppercase().contains("PRIVATE") {
            return Self::PrivateKey;
        }
        match label {
            "PUBLIC KEY" | "RSA PUBLIC KEY" => Self::PublicKey,
            "CERTIFICATE REQUEST" | "NEW CERTIFICATE REQUEST" => Self::CertificateRequest,
            "X509 CRL" => Self::RevocationList,
            "TRUSTED CERTIFICATE" | "X509 CERTIFICATE" => Self::NonStandardCertificate,
            "PKCS7" | "CMS" => Self::Pkcs7,
            "EC PARAMETERS" | "DH PARAMETERS" | "X9.42 DH PARAMETERS" => Self::Parameters,
            _ => Self::Unrecognised,
        }
    }
}

/// Why a source was rejected. Each variant says what kind of problem and where; none holds or prints source
/// content, so the error can go to logs, Events and status as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum SourceError {
    #[error("source is over the {limit}-byte limit ({size} bytes read before stopping)")]
    TooLarge { size: usize, limit: usize },
    #[error(
        "non-whitespace text outside PEM blocks on line {line}, where block {block} would start; only CERTIFICATE blocks and whitespace are allowed"
    )]
    TextOutsideBlocks { block: usize, line: usize },
    #[error(
        "block {block} (line {line}) is a {kind} block; only CERTIFICATE blocks are accepted, the whole source is rejected"
    )]
    ForbiddenBlock { block: usize, line: usize, kind: BlockKind },
    #[error("block {block} (line {line}) carries PEM headers (like Proc-Type); a certificate block has none")]
    #[strum(serialize = "pem_headers")]
    HeadersPresent { block: usize, line: usize },
    #[error("block {block} (line {line}) is malformed: {problem}")]
    #[strum(serialize = "malformed_pem")]
    MalformedBlock { block: usize, line: usize, problem: FramingProblem },
    #[error("block {block} (line {line}) is not valid base64")]
    InvalidBase64 { block: usize, line: usize },
    #[error("block {block} (line {line}) is not an acceptable certificate: {reason}")]
    InvalidCertificate { block: usize, line: usize, reason: CertificateError },
    #[error("source holds no certificate")]
    NoCertificates,
}

impl SourceError {
    /// A low-cardinality label for metrics and Event reasons: the variant's name, a private key told apart.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::ForbiddenBlock { kind: BlockKind::PrivateKey, .. } => "private_key",
            other => other.into(),
        }
    }
}

/// What is wrong with a block's framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingProblem {
    #[error("its BEGIN line is not `-----BEGIN <LABEL>-----`")]
    BadBeginLine,
    #[error("it has no END line")]
    Unterminated,
    #[error("its END line does not match its BEGIN line")]
    MismatchedEnd,
    #[error("a BEGIN line appears inside it")]
    NestedBegin,
    #[error("it contains a blank line")]
    BlankLine,
}

/// Parses a source into its certificates, in source order (duplicates kept; the bundle dedupes). The whole
/// source is rejected on the first problem.
pub fn parse_certificates(input: &[u8], empty: EmptyPolicy) -> Result<Vec<Certificate>, SourceError> {
    if input.len() > MAX_SOURCE_BYTES {
        return Err(SourceError::TooLarge { size: input.len(), limit: MAX_SOURCE_BYTES });
    }
    let mut certs = Vec::new();
    for block in frame(input)? {
        let der = decode(&block)?;
        let cert = Certificate::from_der(&der).map_err(|reason| SourceError::InvalidCertificate {
            block: block.index,
            line: block.line,
            reason,
        })?;
        certs.push(cert);
    }
    if certs.is_empty() && empty == EmptyPolicy::Reject {
        return Err(SourceError::NoCertificates);
    }
    Ok(certs)
}

/// A framed CERTIFICATE block: its position and its base64 lines (trimmed, without blank lines).
struct Block<'a> {
    index: usize,
    line: usize,
    body: Vec<&'a [u8]>,
}

const BEGIN: &[u8] = b"-----BEGIN ";
const END: &[u8] = b"-----END ";
const DASHES: &[u8] = b"-----";

/// Splits the input into CERTIFICATE blocks, rejecting everything else. Works on bytes so that non-UTF-8 junk
/// is reported like any other junk.
fn frame(input: &[u8]) -> Result<Vec<Block<'_>>, SourceError> {
    let mut blocks = Vec::new();
    let mut open: Option<(Block<'_>, &[u8])> = None; // the block being read and its label
    for (number, raw) in input.split(|&b| b == b'\n').enumerate() {
        let line_no = number + 1;
        let line = raw.trim_ascii();
        match open.take() {
            None => {
                // Distribution bundles (certifi's cacert.pem, Red Hat's tls-ca-bundle.pem) describe each
                // certificate in `#` comment lines between blocks; those and blank lines are all that may lie
                // outside a block.
                if line.is_empty() || line.starts_with(b"#") {
                    continue;
                }
                let index = blocks.len() + 1;
                if !line.starts_with(BEGIN) {
                    return Err(SourceError::TextOutsideBlocks { block: index, line: line_no });
                }
                let label = marker_label(line, BEGIN).ok_or(SourceError::MalformedBlock {
                    block: index,
                    line: line_no,
                    problem: FramingProblem::BadBeginLine,
                })?;
                if label != b"CERTIFICATE" {
                    // Checked before anything inside the block is looked at: a key's body is never decoded.
                    let kind = BlockKind::of_label(&String::from_utf8_lossy(label));
                    return Err(SourceError::ForbiddenBlock { block: index, line: line_no, kind });
                }
                open = Some((Block { index, line: line_no, body: Vec::new() }, label));
            }
            Some((mut block, label)) => {
                let malformed = |problem| SourceError::MalformedBlock { block: block.index, line: block.line, problem };
                if line.starts_with(END) {
                    if marker_label(line, END) != Some(label) {
                        return Err(malformed(FramingProblem::MismatchedEnd));
                    }
                    blocks.push(block);
                    continue;
                }
                if line.starts_with(BEGIN) {
                    return Err(malformed(FramingProblem::NestedBegin));
                }
                if line.contains(&b':') {
                    // RFC 1421 encapsulated headers (`Proc-Type: 4,ENCRYPTED`, `DEK-Info: ...`).
                    return Err(SourceError::HeadersPresent { block: block.index, line: block.line });
                }
                if line.is_empty() {
                    // In PEM a blank line ends the header section; a plain certificate has none.
                    return Err(malformed(FramingProblem::BlankLine));
                }
                if !line.iter().all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=')) {
                    return Err(SourceError::InvalidBase64 { block: block.index, line: block.line });
                }
                block.body.push(line);
                open = Some((block, label));
            }
        }
    }
    match open {
        Some((block, _)) => Err(SourceError::MalformedBlock {
            block: block.index,
            line: block.line,
            problem: FramingProblem::Unterminated,
        }),
        None => Ok(blocks),
    }
}

/// The label of a `-----BEGIN X-----` / `-----END X-----` line, if the line has exactly that shape.
fn marker_label<'a>(line: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let label = line.strip_prefix(prefix)?.strip_suffix(DASHES)?;
    let well_formed = !label.is_empty()
        && label.iter().all(|&c| c.is_ascii_graphic() || c == b' ')
        && !label.starts_with(b"-")
        && !label.ends_with(b"-");
    well_formed.then_some(label)
}

/// Decodes a framed block with the `pem` crate. The block is rebuilt from its validated lines, so the crate
/// only ever sees one plain CERTIFICATE block; its own checks (label, headers) are kept as a second line of
/// defence. Its errors are not passed on: some quote the input.
fn decode(block: &Block<'_>) -> Result<Vec<u8>, SourceError> {
    let mut text = Vec::with_capacity(block.body.iter().map(|l| l.len() + 1).sum::<usize>() + 64);
    text.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
    for line in &block.body {
        text.extend_from_slice(line);
        text.push(b'\n');
    }
    text.extend_from_slice(b"-----END CERTIFICATE-----\n");
    let invalid = SourceError::InvalidBase64 { block: block.index, line: block.line };
    let parsed = pem::parse(&text).map_err(|_| invalid.clone())?;
    if parsed.tag() != "CERTIFICATE" || parsed.headers().iter().next().is_some() {
        return Err(SourceError::HeadersPresent { block: block.index, line: block.line });
    }
    if parsed.contents().is_empty() {
        return Err(SourceError::InvalidCertificate {
            block: block.index,
            line: block.line,
            reason: CertificateError::Malformed,
        });
    }
    Ok(parsed.into_contents())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testcerts::{self, TestCa};

    /// Asserts that neither Display nor Debug of the error carries any part of `secret`.
    fn assert_no_echo(err: &SourceError, secret: &str) {
        let shown = format!("{err} {err:?}");
        for line in secret.lines().map(str::trim).filter(|l| l.len() >= 8) {
            assert!(!shown.contains(line), "error {shown:?} echoes source line {line:?}");
        }
        // Not even a short run of the body.
        for line in secret.lines().filter(|l| !l.starts_with("-----") && l.len() >= 16) {
            assert!(!shown.contains(&line[..16]), "error {shown:?} echoes part of {line:?}");
        }
    }

    #[test]
    fn single_certificate_parses_with_subject_issuer_serial_validity_ca_flag_and_sha256() {
        let ca = TestCa::root("kcp-root-ca");
        let certs = parse_certificates(ca.pem().as_bytes(), EmptyPolicy::Reject).expect("parses");
        assert_eq!(certs.len(), 1);
        let cert = &certs[0];
        assert_eq!(cert.subject(), "CN=kcp-root-ca");
        assert_eq!(cert.issuer(), "CN=kcp-root-ca");
        assert!(cert.is_ca());
        assert_eq!(cert.not_after(), ca.not_after);
        assert_eq!(cert.not_before(), ca.not_before);
        assert!(!cert.serial().is_empty());
        assert_eq!(cert.der(), ca.der());
        let expected: [u8; 32] = Sha256::digest(ca.der()).into();
        assert_eq!(cert.fingerprint().as_bytes(), &expected);
    }

    #[test]
    fn intermediate_and_root_parse_in_source_order_with_issuer_of_intermediate_being_root() {
        let root = TestCa::root("root");
        let intermediate = root.intermediate("intermediate");
        let text = format!("{}\n{}", intermediate.pem(), root.pem());
        let certs = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).expect("parses");
        assert_eq!(certs.iter().map(Certificate::subject).collect::<Vec<_>>(), ["CN=intermediate", "CN=root"]);
        assert_eq!(certs[0].issuer(), "CN=root");
    }

    #[test]
    fn leaf_certificate_is_accepted_and_not_marked_ca() {
        let root = TestCa::root("root");
        let leaf = root.leaf("server");
        let certs = parse_certificates(leaf.as_bytes(), EmptyPolicy::Reject).expect("parses");
        assert!(!certs[0].is_ca());
    }

    #[test]
    fn crlf_line_endings_and_surrounding_whitespace_are_accepted() {
        let ca = TestCa::root("root");
        let text = format!("\n  \t\r\n{}\r\n\r\n", ca.pem().replace('\n', "\r\n"));
        let certs = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).expect("parses");
        assert_eq!(certs[0].der(), ca.der());
    }

    #[test]
    fn body_wrapped_at_any_width_gives_the_same_certificate() {
        let ca = TestCa::root("root");
        let body: String = ca.pem().lines().filter(|l| !l.starts_with("-----")).collect();
        let rewrapped: Vec<String> = body.as_bytes().chunks(76).map(|c| String::from_utf8_lossy(c).into()).collect();
        let text = format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", rewrapped.join("\n"));
        let certs = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).expect("parses");
        assert_eq!(certs[0].der(), ca.der());
    }

    #[test]
    fn private_key_block_rejects_whole_source_without_echoing_content() {
        let ca = TestCa::root("root");
        let key = ca.key_pem();
        // cert-manager's Secret shape, concatenated: certificate first, then the key.
        let text = format!("{}{}", ca.pem(), key);
        let err = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).unwrap_err();
        assert_eq!(
            err,
            SourceError::ForbiddenBlock { block: 2, line: ca.pem().lines().count() + 1, kind: BlockKind::PrivateKey }
        );
        assert_eq!(err.metric_label(), "private_key");
        assert!(err.to_string().contains("block 2"), "{err}");
        assert!(err.to_string().contains("private key"), "{err}");
        assert_no_echo(&err, &key);
        assert_no_echo(&err, &ca.pem());
    }

    #[test]
    fn every_private_key_label_is_reported_as_a_private_key() {
        for label in
            ["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY", "ENCRYPTED PRIVATE KEY", "OPENSSH PRIVATE KEY"]
        {
            let text = format!(
                "-----BEGIN {label}-----\nMIIBVQIBADANBgkqhkiG9w0BAQEFAASCAT8wggE7AgEAAkEA\n-----END {label}-----\n"
            );
            let err = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).unwrap_err();
            assert_eq!(err, SourceError::ForbiddenBlock { block: 1, line: 1, kind: BlockKind::PrivateKey }, "{label}");
            assert_no_echo(&err, &text);
        }
    }

    #[test]
    fn key_before_certificate_is_rejected_too() {
        let ca = TestCa::root("root");
        let text = format!("{}{}", ca.key_pem(), ca.pem());
        let err = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).unwrap_err();
        assert!(matches!(err, SourceError::ForbiddenBlock { block: 1, kind: BlockKind::PrivateKey, .. }), "{err:?}");
    }

    #[test]
    fn other_block_types_are_named_by_kind_not_by_their_label_text() {
        let cases = [
            ("PUBLIC KEY", BlockKind::PublicKey),
            ("CERTIFICATE REQUEST", BlockKind::CertificateRequest),
            ("X509 CRL", BlockKind::RevocationList),
            ("TRUSTED CERTIFICATE", BlockKind::NonStandardCertificate),
            ("PKCS7", BlockKind::Pkcs7),
            ("EC PARAMETERS", BlockKind::Parameters),
            ("SECRET SAUCE 1234", BlockKind::Unrecognised),
        ];
        for (label, kind) in cases {
            let text = format!("-----BEGIN {label}-----\nAAAA\n-----END {label}-----\n");
            let err = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).unwrap_err();
            assert_eq!(err, SourceError::ForbiddenBlock { block: 1, line: 1, kind }, "{label}");
            assert_eq!(err.metric_label(), "forbidden_block");
        }
        let text = "-----BEGIN SECRET SAUCE 1234-----\nAAAA\n-----END SECRET SAUCE 1234-----\n";
        let err = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).unwrap_err();
        assert!(!err.to_string().contains("SAUCE"), "{err}");
    }

    #[test]
    fn pem_headers_reject_whole_source_without_echoing_them() {
        let ca = TestCa::root("root");
        let pem = ca.pem();
        let mut lines: Vec<&str> = pem.lines().collect();
        lines.insert(1, "Proc-Type: 4,ENCRYPTED");
        lines.insert(2, "DEK-Info: AES-128-CBC,0123456789ABCDEF0123456789ABCDEF");
        lines.insert(3, "");
        let text = lines.join("\n");
        let err = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).unwrap_err();
        assert_eq!(err, SourceError::HeadersPresent { block: 1, line: 1 });
        assert_eq!(err.metric_label(), "pem_headers");
        assert!(!err.to_string().contains("0123456789ABCDEF"));
        assert_no_echo(&err, &text);
    }

    #[test]
    fn garbage_before_between_or_after_blocks_rejects_whole_source() {
        let root = TestCa::root("root");
        let other = TestCa::root("other");
        let first_len = root.pem().lines().count();
        let both_len = first_len + other.pem().lines().count();
        let cases = [
            (format!("subject=CN = root\n{}", root.pem()), 1, 1),
            (format!("{}the next one\n{}", root.pem(), other.pem()), 2, first_len + 1),
            (format!("{}{}trailing words\n", root.pem(), other.pem()), 3, both_len + 1),
            (format!("{}{}.", root.pem(), other.pem()), 3, both_len + 1),
        ];
        for (text, block, line) in cases {
            let err = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).unwrap_err();
            assert_eq!(err, SourceError::TextOutsideBlocks { block, line }, "{text}");
            assert_eq!(err.metric_label(), "text_outside_blocks");
            assert!(!err.to_string().contains("words"), "{err}");
        }
    }

    #[test]
    fn binary_junk_is_rejected_as_text_outside_blocks() {
        let ca = TestCa::root("root");
        let mut bytes = ca.pem().into_bytes();
        bytes.extend_from_slice(&[0xff, 0xfe, 0x00, b'\n']);
        let err = parse_certificates(&bytes, EmptyPolicy::Reject).unwrap_err();
        assert!(matches!(err, SourceError::TextOutsideBlocks { block: 2, .. }), "{err:?}");
    }

    #[test]
    fn raw_der_instead_of_pem_is_rejected() {
        let ca = TestCa::root("root");
        let err = parse_certificates(ca.der(), EmptyPolicy::Reject).unwrap_err();
        assert!(matches!(err, SourceError::TextOutsideBlocks { block: 1, line: 1 }), "{err:?}");
    }

    #[test]
    fn unparsable_der_in_a_certificate_block_is_rejected_with_its_block_index() {
        let ca = TestCa::root("root");
        // Valid base64 of bytes that are not a certificate.
        let text =
            format!("{}-----BEGIN CERTIFICATE-----\nSGVsbG8sIHdvcmxkIQ==\n-----END CERTIFICATE-----\n", ca.pem());
        let err = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).unwrap_err();
        assert!(
            matches!(err, SourceError::InvalidCertificate { block: 2, reason: CertificateError::Malformed, .. }),
            "{err:?}"
        );
        assert!(!err.to_string().contains("SGVsbG8"), "{err}");
    }

    #[test]
    fn der_with_trailing_bytes_is_rejected() {
        let ca = TestCa::root("root");
        let mut der = ca.der().to_vec();
        der.extend_from_slice(&[0, 0, 0]);
        let text = pem::encode(&pem::Pem::new("CERTIFICATE", der));
        let err = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).unwrap_err();
        assert!(
            matches!(err, SourceError::InvalidCertificate { block: 1, reason: CertificateError::TrailingData, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn bad_base64_is_rejected() {
        for body in ["not*base64", "QUJD RA==", "QUJDRA=", "QUJDRA==QUJD"] {
            let text = format!("-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n");
            let err = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).unwrap_err();
            assert_eq!(err, SourceError::InvalidBase64 { block: 1, line: 1 }, "{body}");
        }
    }

    #[test]
    fn empty_certificate_block_is_rejected() {
        let text = "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n";
        let err = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).unwrap_err();
        assert!(matches!(err, SourceError::InvalidCertificate { block: 1, .. }), "{err:?}");
    }

    #[test]
    fn framing_errors_are_named() {
        let ca = TestCa::root("root");
        let pem = ca.pem();
        let unterminated = pem.lines().take(3).collect::<Vec<_>>().join("\n");
        let mismatched = pem.replace("-----END CERTIFICATE-----", "-----END X509 CRL-----");
        let nested = pem.replacen("\n", "\n-----BEGIN CERTIFICATE-----\n", 1);
        let blank = pem.replacen("\n", "\n\n", 2).replacen("\n\n", "\n", 1);
        let bad_begin = "-----BEGIN CERTIFICATE----\nAAAA\n-----END CERTIFICATE-----\n".to_string();
        let cases = [
            (unterminated, FramingProblem::Unterminated),
            (mismatched, FramingProblem::MismatchedEnd),
            (nested, FramingProblem::NestedBegin),
            (blank, FramingProblem::BlankLine),
            (bad_begin, FramingProblem::BadBeginLine),
        ];
        for (text, problem) in cases {
            let err = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).unwrap_err();
            assert_eq!(err, SourceError::MalformedBlock { block: 1, line: 1, problem }, "{text}");
            assert_eq!(err.metric_label(), "malformed_pem");
        }
    }

    #[test]
    fn empty_or_whitespace_source_is_rejected_when_a_certificate_is_required() {
        for text in ["", "\n", " \r\n\t\n"] {
            assert_eq!(parse_certificates(text.as_bytes(), EmptyPolicy::Reject), Err(SourceError::NoCertificates));
            assert_eq!(parse_certificates(text.as_bytes(), EmptyPolicy::Allow), Ok(vec![]));
        }
    }

    #[test]
    fn oversized_source_is_refused_before_parsing() {
        let big = vec![b' '; MAX_SOURCE_BYTES + 1];
        let err = parse_certificates(&big, EmptyPolicy::Allow).unwrap_err();
        assert_eq!(err, SourceError::TooLarge { size: MAX_SOURCE_BYTES + 1, limit: MAX_SOURCE_BYTES });
    }

    #[test]
    fn fingerprint_round_trips_through_hex_and_rejects_non_hex() {
        let fp = Fingerprint::of(b"abc");
        let hex = fp.to_string();
        assert_eq!(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(hex.parse::<Fingerprint>(), Ok(fp));
        assert_eq!(hex.to_uppercase().parse::<Fingerprint>(), Ok(fp));
        assert_eq!("ab".parse::<Fingerprint>(), Err(InvalidFingerprint));
        assert_eq!(hex.replace('b', "g").parse::<Fingerprint>(), Err(InvalidFingerprint));
        assert_eq!(format!("{}é", &hex[..62]).parse::<Fingerprint>(), Err(InvalidFingerprint));
    }

    #[test]
    fn certificate_debug_shows_identity_not_der() {
        let ca = TestCa::root("root");
        let cert = Certificate::from_der(ca.der()).expect("parses");
        let shown = format!("{cert:?}");
        assert!(shown.contains("CN=root") && shown.contains(&cert.fingerprint().to_string()), "{shown}");
        assert!(!shown.contains(&testcerts::base64_body(&ca.pem())[..32]));
    }

    /// The machine's CA bundle with comments before each certificate, the way certifi's cacert.pem writes them.
    fn distribution_bundle() -> Option<(String, usize)> {
        let system = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").ok()?;
        let count = system.matches("-----BEGIN CERTIFICATE-----").count();
        let commented = system.replace(
            "-----BEGIN CERTIFICATE-----",
            "\n# Issuer: CN=Example Root O=Example\n# Label: \"Example Root\"\n# SHA256 Fingerprint: 00:11:22\n-----BEGIN CERTIFICATE-----",
        );
        Some((format!("\n# Mozilla's CA bundle, as certifi ships it\n{commented}"), count))
    }

    #[test]
    fn a_distribution_bundle_with_comment_lines_between_blocks_parses_whole() {
        let Some((bundle, count)) = distribution_bundle() else {
            panic!("the test needs the machine's CA bundle at /etc/ssl/certs/ca-certificates.crt");
        };
        assert!(count > 100, "{count}");
        let certs = parse_certificates(bundle.as_bytes(), EmptyPolicy::Reject).expect("parses");
        assert_eq!(certs.len(), count);
    }

    #[test]
    fn outside_blocks_only_comments_and_blank_lines_pass_and_a_lowercase_key_label_is_a_private_key() {
        let ca = TestCa::root("ca");
        let ok = format!("# comment\n\n   # indented comment\n{}", ca.pem());
        assert_eq!(parse_certificates(ok.as_bytes(), EmptyPolicy::Reject).expect("parses").len(), 1);
        let text = format!("{}Issuer: CN=x\n", ca.pem());
        let err = parse_certificates(text.as_bytes(), EmptyPolicy::Reject).unwrap_err();
        assert_eq!(err.metric_label(), "text_outside_blocks");
        let key = format!("# a key\n{}-----BEGIN private key-----\nAAAA\n-----END private key-----\n", ca.pem());
        let err = parse_certificates(key.as_bytes(), EmptyPolicy::Reject).unwrap_err();
        assert_eq!(err.metric_label(), "private_key");
    }
}
