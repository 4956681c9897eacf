//! A kubeconfig as a credential: parsed from the bytes a Secret holds, checked (certificate parses, key matches
//! it, CA parses, not expired), rewritten to another server, or built from a certificate Secret. Pure: no client,
//! no I/O. Errors name what is wrong, never a value from the kubeconfig (no key, certificate body or server).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use kcp_keeper_runtime::Sensitive;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_yaml::Value;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Why a candidate (or a target's current content) is not a usable credential. The variant names are the
/// `reason` label of `kubeconfig_rotator_verification_failures_total` (with the proof's own reasons).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum CredentialError {
    #[error("not a usable kubeconfig: {0}")]
    Unparsable(&'static str),
    #[error("the client certificate does not parse")]
    CertificateUnparsable,
    #[error("the client key does not parse or is of an unsupported type")]
    KeyUnparsable,
    #[error("the client key does not belong to the client certificate")]
    KeyMismatch,
    #[error("the CA data holds no parsable certificate")]
    CaUnparsable,
    /// A certificate in the CA data has expired: Go clients (kcp's consumers) reject a chain to it.
    #[error("a CA certificate in the CA data expired at {0}")]
    CaExpired(String),
    #[error("the client certificate expired at {0}")]
    Expired(String),
    #[error("the client certificate is not valid before {0}")]
    NotYetValid(String),
    /// The kubeconfig carries more than a server, its CA and a client certificate and key: the field is named
    /// (`users.user.tokenFile`), never its value.
    #[error(
        "unsupported field {0}: a candidate may carry only a server, its CA data and an inline client certificate and key"
    )]
    UnsupportedField(String),
}

/// What identifies a client certificate, for comparisons, metrics, Events and the status table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Hex, colon-separated, as openssl prints it.
    pub serial: String,
    /// CN: the Kubernetes user name.
    pub username: String,
    /// O: the groups.
    pub groups: Vec<String>,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl CertInfo {
    /// `CN=<user>,O=<group>...` for logs and the status table (names, not secrets).
    pub fn subject(&self) -> String {
        let mut out = format!("CN={}", self.username);
        for g in &self.groups {
            out.push_str(",O=");
            out.push_str(g);
        }
        out
    }

    pub fn lifetime(&self) -> time::Duration {
        self.not_after - self.not_before
    }
}

/// A checked credential: its parts, and the kubeconfig rendered from them alone, as it is published.
#[derive(Debug, Clone)]
pub struct Credential {
    /// The current context's server (where it is proven).
    pub server: String,
    pub cert: CertInfo,
    pub ca_pem: Vec<u8>,
    pub cert_pem: Vec<u8>,
    pub key_pem: Sensitive<Vec<u8>>,
    /// The exact bytes published under the target key: rendered from the parts ([`build`]), never the source's.
    pub kubeconfig: Sensitive<Vec<u8>>,
}

impl Credential {
    /// The same credential trusting `ca_pem` instead (the CA overlap), its kubeconfig rendered again.
    pub fn with_ca(&self, ca_pem: Vec<u8>) -> Credential {
        let user = if self.cert.username.is_empty() { "kcp-keeper" } else { self.cert.username.as_str() };
        let kubeconfig = build(&self.server, &ca_pem, &self.cert_pem, self.key_pem.expose(), user);
        Credential { ca_pem, kubeconfig: Sensitive::new(kubeconfig), ..self.clone() }
    }

    /// A short content hash of the published kubeconfig: annotated on targets, compared to skip no-op writes.
    pub fn hash(&self) -> String {
        content_hash(self.kubeconfig.expose())
    }
}

/// The first 16 hex digits of SHA-256 over `bytes`.
pub fn content_hash(bytes: &[u8]) -> String {
    hex::encode(&Sha256::digest(bytes)[..8])
}

/// The parts of a kubeconfig's current context, sanitised ([`parts`]) but still unchecked.
pub struct Parts {
    pub server: String,
    pub ca_pem: Vec<u8>,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl Parts {
    /// The server moved to `base` (scheme, host, port), keeping its path (`/clusters/root`).
    pub fn at(mut self, base: &str) -> Self {
        self.server = format!("{base}{}", path_of(&self.server));
        self
    }
}

/// Sanitises and checks a kubeconfig at `now`.
pub fn parse(kubeconfig: &[u8], now: OffsetDateTime) -> Result<Credential, CredentialError> {
    check(parts(kubeconfig)?, now)
}

/// The client certificate of a kubeconfig without any check (a stale or expired render still has a serial).
pub fn peek(kubeconfig: &[u8]) -> Option<CertInfo> {
    cert_info(&parts(kubeconfig).ok()?.cert_pem).ok()
}

/// The CA data of a kubeconfig without any check.
pub fn peek_ca(kubeconfig: &[u8]) -> Option<Vec<u8>> {
    parts(kubeconfig).ok().map(|p| p.ca_pem)
}

/// Whether every certificate in `current` (the server CA now) is in `rendered` (a kubeconfig's CA data),
/// compared by DER: a render from before a server-CA rotation lacks the new CA.
pub fn ca_contains(rendered: &[u8], current: &[u8]) -> bool {
    let ders = |pem: &[u8]| -> Vec<Vec<u8>> {
        CertificateDer::pem_slice_iter(pem).filter_map(Result::ok).map(|c| c.to_vec()).collect()
    };
    let rendered = ders(rendered);
    ders(current).iter().all(|c| rendered.contains(c))
}

/// Checks certificate, key and CA parts and renders the kubeconfig that is published from them.
pub fn check(parts: Parts, now: OffsetDateTime) -> Result<Credential, CredentialError> {
    check_server(&parts.server)?;
    let cert = cert_info(&parts.cert_pem)?;
    key_matches(&parts.cert_pem, &parts.key_pem)?;
    if CertificateDer::pem_slice_iter(&parts.ca_pem).filter_map(Result::ok).next().is_none() {
        return Err(CredentialError::CaUnparsable);
    }
    if let Some(at) = crate::overlap::expired(&parts.ca_pem, now) {
        return Err(CredentialError::CaExpired(rfc3339(at)));
    }
    if cert.not_after <= now {
        return Err(CredentialError::Expired(rfc3339(cert.not_after)));
    }
    // A minute of skew between the issuer's clock and ours, as cert-manager back-dates by.
    if cert.not_before > now + time::Duration::minutes(1) {
        return Err(CredentialError::NotYetValid(rfc3339(cert.not_before)));
    }
    let user = if cert.username.is_empty() { "kcp-keeper" } else { cert.username.as_str() };
    let kubeconfig = build(&parts.server, &parts.ca_pem, &parts.cert_pem, &parts.key_pem, user);
    Ok(Credential {
        server: parts.server,
        cert,
        ca_pem: parts.ca_pem,
        cert_pem: parts.cert_pem,
        key_pem: Sensitive::new(parts.key_pem),
        kubeconfig: Sensitive::new(kubeconfig),
    })
}

/// The identity and validity of the first certificate in `pem`.
pub fn cert_info(pem: &[u8]) -> Result<CertInfo, CredentialError> {
    let der = CertificateDer::from_pem_slice(pem).map_err(|_| CredentialError::CertificateUnparsable)?;
    let (_, cert) = X509Certificate::from_der(&der).map_err(|_| CredentialError::CertificateUnparsable)?;
    let subject = cert.subject();
    let username = subject.iter_common_name().next().and_then(|a| a.as_str().ok()).unwrap_or_default().to_string();
    let groups = subject.iter_organization().filter_map(|a| a.as_str().ok()).map(String::from).collect();
    let time = |t: x509_parser::time::ASN1Time| {
        OffsetDateTime::from_unix_timestamp(t.timestamp()).map_err(|_| CredentialError::CertificateUnparsable)
    };
    Ok(CertInfo {
        serial: cert.raw_serial_as_string(),
        username,
        groups,
        not_before: time(cert.validity().not_before)?,
        not_after: time(cert.validity().not_after)?,
    })
}

/// Whether the private key in `key_pem` is the one the certificate's public key belongs to.
fn key_matches(cert_pem: &[u8], key_pem: &[u8]) -> Result<(), CredentialError> {
    let der = CertificateDer::from_pem_slice(cert_pem).map_err(|_| CredentialError::CertificateUnparsable)?;
    let (_, cert) = X509Certificate::from_der(&der).map_err(|_| CredentialError::CertificateUnparsable)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| CredentialError::KeyUnparsable)?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|_| CredentialError::KeyUnparsable)?;
    let public = signer.public_key().ok_or(CredentialError::KeyUnparsable)?;
    if public.as_ref() == cert.public_key().raw { Ok(()) } else { Err(CredentialError::KeyMismatch) }
}

/// The fields a candidate may carry: the server and its CA, the client certificate and key, and the names that
/// tie them together. Anything else (`exec`, `token`, `tokenFile`, `insecure-skip-tls-verify`, `proxy-url`, a file
/// path, ...) is refused as [`CredentialError::UnsupportedField`]: none of it is used, so none of it may be there.
const TOP_FIELDS: &[&str] = &["apiVersion", "kind", "clusters", "contexts", "users", "current-context", "preferences"];
const CLUSTER_FIELDS: &[&str] = &["server", "certificate-authority-data"];
const USER_FIELDS: &[&str] = &["client-certificate-data", "client-key-data"];
const CONTEXT_FIELDS: &[&str] = &["cluster", "user", "namespace"];
const ENTRY_FIELDS: &[&str] = &["name", "cluster", "user", "context"];

/// Kubeconfig's own fields that no candidate may carry. These and the allowed ones are the field names a refusal
/// may echo (a key an attacker made up is named "an unknown field", so a refusal never carries text from the
/// candidate).
const REFUSED_FIELDS: &[&str] = &[
    "exec",
    "auth-provider",
    "token",
    "tokenFile",
    "username",
    "password",
    "as",
    "as-uid",
    "as-groups",
    "as-user-extra",
    "client-certificate",
    "client-key",
    "certificate-authority",
    "insecure-skip-tls-verify",
    "proxy-url",
    "tls-server-name",
    "disable-compression",
    "extensions",
];

/// `where.field`, the field named only if kubeconfig knows it.
fn unsupported(place: &str, field: &str) -> CredentialError {
    let known = [REFUSED_FIELDS, TOP_FIELDS, CLUSTER_FIELDS, USER_FIELDS, CONTEXT_FIELDS, ENTRY_FIELDS];
    let field = known.into_iter().flatten().find(|k| **k == field).copied().unwrap_or("an unknown field");
    CredentialError::UnsupportedField(format!("{place}.{field}"))
}

/// Every key of `map` is in `allowed`.
fn only(map: &Value, allowed: &[&str], place: &str) -> Result<(), CredentialError> {
    let map = map.as_mapping().ok_or(CredentialError::Unparsable("an entry is not a map"))?;
    for key in map.keys() {
        let key = key.as_str().unwrap_or("");
        if !allowed.contains(&key) {
            return Err(unsupported(place, key));
        }
    }
    Ok(())
}

/// Sanitises a kubeconfig into exactly its current context's server, CA data, client certificate data and client
/// key data (inline `*-data` fields only: a published kubeconfig must stand on its own). Every entry of every list
/// is held to the allowed fields; without a `current-context`, there must be exactly one context.
pub fn parts(kubeconfig: &[u8]) -> Result<Parts, CredentialError> {
    use CredentialError::Unparsable;
    let doc: Value = serde_yaml::from_slice(kubeconfig).map_err(|_| Unparsable("not YAML"))?;
    only(&doc, TOP_FIELDS, "kubeconfig")?;
    for (list, inner, fields) in [
        ("clusters", "cluster", CLUSTER_FIELDS),
        ("users", "user", USER_FIELDS),
        ("contexts", "context", CONTEXT_FIELDS),
    ] {
        let Some(entries) = doc.get(list) else { continue };
        let entries = entries.as_sequence().ok_or(Unparsable("a list is not a list"))?;
        for entry in entries {
            only(entry, ENTRY_FIELDS, list)?;
            if let Some(body) = entry.get(inner) {
                only(body, fields, &format!("{list}.{inner}"))?;
            }
        }
    }
    let current = match doc.get("current-context").and_then(Value::as_str) {
        Some(c) => c.to_string(),
        None => match doc.get("contexts").and_then(Value::as_sequence).map(Vec::as_slice) {
            Some([only]) => only.get("name").and_then(Value::as_str).ok_or(Unparsable("context has no name"))?.into(),
            Some([]) | None => return Err(Unparsable("no context")),
            Some(_) => return Err(CredentialError::UnsupportedField("contexts (more than one, none current)".into())),
        },
    };
    let context = named(&doc, "contexts", &current)
        .and_then(|c| c.get("context"))
        .ok_or(Unparsable("current context missing"))?;
    let cluster_name = context.get("cluster").and_then(Value::as_str).ok_or(Unparsable("context names no cluster"))?;
    let user_name = context.get("user").and_then(Value::as_str).ok_or(Unparsable("context names no user"))?;
    let cluster =
        named(&doc, "clusters", cluster_name).and_then(|c| c.get("cluster")).ok_or(Unparsable("cluster missing"))?;
    let user = named(&doc, "users", user_name).and_then(|u| u.get("user")).ok_or(Unparsable("user missing"))?;
    let server = cluster.get("server").and_then(Value::as_str).ok_or(Unparsable("cluster has no server"))?;
    check_server(server)?;
    let data = |map: &Value, field: &'static str| -> Result<Vec<u8>, CredentialError> {
        let text = map.get(field).and_then(Value::as_str).ok_or(Unparsable(field))?;
        B64.decode(text.trim()).map_err(|_| Unparsable(field))
    };
    Ok(Parts {
        server: server.to_string(),
        ca_pem: data(cluster, "certificate-authority-data")?,
        cert_pem: data(user, "client-certificate-data")?,
        key_pem: data(user, "client-key-data")?,
    })
}

/// The server is `https://host[:port][/path]`: no other scheme (a client certificate over plain HTTP, or a
/// credential sent in clear), no user info, query or fragment.
fn check_server(server: &str) -> Result<(), CredentialError> {
    let Some(rest) = server.strip_prefix("https://") else {
        return Err(CredentialError::UnsupportedField("clusters.cluster.server (not https)".into()));
    };
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty()
        || authority.contains('@')
        || rest.contains(['?', '#'])
        || server.parse::<http::Uri>().is_err()
    {
        return Err(CredentialError::Unparsable("the server is not an https URL"));
    }
    Ok(())
}

/// The entry named `name` in the list `list` (`clusters`, `contexts`, `users`).
fn named<'a>(doc: &'a Value, list: &str, name: &str) -> Option<&'a Value> {
    doc.get(list)?.as_sequence()?.iter().find(|e| e.get("name").and_then(Value::as_str) == Some(name))
}

/// The path of an `https://host:port/path` URL ("" when it has none).
fn path_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.find('/').map_or(String::new(), |i| rest[i..].to_string())
}

/// Builds a kubeconfig as the kcp-operator renders one: clusters and contexts `base` (the server without its
/// path) and `default` (the server as given, e.g. `.../clusters/root`), current context `default`, the user
/// named after the username.
pub fn build(server: &str, ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8], username: &str) -> Vec<u8> {
    let base = server.strip_suffix(path_of(server).as_str()).unwrap_or(server);
    let cluster = |name: &str, url: &str| serde_json::json!({"name": name, "cluster": {"server": url, "certificate-authority-data": B64.encode(ca_pem)}});
    let context = |name: &str| serde_json::json!({"name": name, "context": {"cluster": name, "user": username}});
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster("base", base), cluster("default", server)],
        "contexts": [context("base"), context("default")],
        "current-context": "default",
        "users": [{"name": username, "user": {
            "client-certificate-data": B64.encode(cert_pem),
            "client-key-data": B64.encode(key_pem),
        }}],
    });
    serde_yaml::to_string(&doc).unwrap_or_default().into_bytes()
}

pub fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_else(|_| t.unix_timestamp().to_string())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use testbed::certs::Ca;

    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn kubeconfig(ca: &Ca, user: &str, groups: &[&str], validity: Duration) -> (Vec<u8>, testbed::certs::Credential) {
        let cred = ca.issue_client(user, groups, validity).unwrap();
        let bytes = build(
            "https://localhost:6443/clusters/root",
            ca.cert_pem().as_bytes(),
            cred.cert_pem.as_bytes(),
            cred.key_pem.as_bytes(),
            user,
        );
        (bytes, cred)
    }

    #[test]
    fn a_built_kubeconfig_parses_back_with_its_identity_and_server() {
        let ca = Ca::new("client-ca", HOUR * 24).unwrap();
        let (bytes, cred) = kubeconfig(&ca, "kcp-admin", &["system:kcp:admin", "kubeconfig:hub"], HOUR);
        let c = parse(&bytes, OffsetDateTime::now_utc()).unwrap();
        assert_eq!(c.server, "https://localhost:6443/clusters/root");
        assert_eq!(c.cert.username, "kcp-admin");
        assert_eq!(c.cert.groups, ["system:kcp:admin", "kubeconfig:hub"]);
        assert_eq!(c.cert.not_after.unix_timestamp(), cred.not_after.unix_timestamp());
        assert_eq!(c.cert_pem, cred.cert_pem.as_bytes());
        assert!(!c.cert.serial.is_empty());
        assert_eq!(c.hash(), content_hash(&bytes));
    }

    #[test]
    fn an_expired_certificate_is_refused() {
        let ca = Ca::new("client-ca", HOUR * 24).unwrap();
        let (bytes, _) = kubeconfig(&ca, "u", &[], HOUR);
        let later = OffsetDateTime::now_utc() + time::Duration::hours(2);
        assert!(matches!(parse(&bytes, later), Err(CredentialError::Expired(_))));
    }

    #[test]
    fn a_key_from_another_certificate_is_refused() {
        let ca = Ca::new("client-ca", HOUR * 24).unwrap();
        let a = ca.issue_client("u", &[], HOUR).unwrap();
        let b = ca.issue_client("u", &[], HOUR).unwrap();
        let bytes = build("https://h:1", ca.cert_pem().as_bytes(), a.cert_pem.as_bytes(), b.key_pem.as_bytes(), "u");
        assert_eq!(parse(&bytes, OffsetDateTime::now_utc()).unwrap_err(), CredentialError::KeyMismatch);
    }

    #[test]
    fn garbage_and_missing_parts_are_unparsable_without_echoing_content() {
        let ca = Ca::new("client-ca", HOUR * 24).unwrap();
        let now = OffsetDateTime::now_utc();
        assert!(matches!(parse(b"{{{{ not yaml", now), Err(CredentialError::Unparsable(_))));
        assert!(matches!(parse(b"apiVersion: v1\nkind: Config\n", now), Err(CredentialError::Unparsable(_))));
        let cred = ca.issue_client("u", &[], HOUR).unwrap();
        let bad_cert = build("https://h:1", ca.cert_pem().as_bytes(), b"not a cert", cred.key_pem.as_bytes(), "u");
        assert_eq!(parse(&bad_cert, now).unwrap_err(), CredentialError::CertificateUnparsable);
        let bad_ca = build("https://h:1", b"nope", cred.cert_pem.as_bytes(), cred.key_pem.as_bytes(), "u");
        assert_eq!(parse(&bad_ca, now).unwrap_err(), CredentialError::CaUnparsable);
        let bad_key = build("https://h:1", ca.cert_pem().as_bytes(), cred.cert_pem.as_bytes(), b"secret-ish", "u");
        let err = parse(&bad_key, now).unwrap_err();
        assert_eq!(err, CredentialError::KeyUnparsable);
        assert!(!err.to_string().contains("secret-ish"));
    }

    #[test]
    fn moving_the_server_keeps_its_path_and_the_credential_and_renders_both_contexts() {
        let ca = Ca::new("client-ca", HOUR * 24).unwrap();
        let (bytes, _) = kubeconfig(&ca, "u", &[], HOUR);
        let c = check(parts(&bytes).unwrap().at("https://fp.kcp-system.svc:6443"), OffsetDateTime::now_utc()).unwrap();
        assert_eq!(c.server, "https://fp.kcp-system.svc:6443/clusters/root");
        let text = String::from_utf8(c.kubeconfig.expose().clone()).unwrap();
        assert!(text.contains("server: https://fp.kcp-system.svc:6443\n"), "the base context keeps no path: {text}");
        assert_eq!(parse(c.kubeconfig.expose(), OffsetDateTime::now_utc()).unwrap().cert.username, "u");
    }

    /// A clean kubeconfig in the testbed's shape (one cluster, one user, one context) with `edit` applied to
    /// its YAML.
    fn shaped(edit: impl FnOnce(&mut Value)) -> (Vec<u8>, String) {
        let ca = Ca::new("client-ca", HOUR * 24).unwrap();
        let cred = ca.issue_client("u", &[], HOUR).unwrap();
        let mut doc: Value = serde_yaml::from_str(&format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443/clusters/root\n    certificate-authority-data: {ca}\nusers:\n- name: u\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
            ca = B64.encode(ca.cert_pem()),
            cert = B64.encode(&cred.cert_pem),
            key = B64.encode(&cred.key_pem),
        ))
        .unwrap();
        edit(&mut doc);
        (serde_yaml::to_string(&doc).unwrap().into_bytes(), cred.key_pem)
    }

    fn set(doc: &mut Value, list: &str, inner: &str, field: &str, value: Value) {
        doc[list][0][inner].as_mapping_mut().unwrap().insert(Value::from(field), value);
    }

    /// Refused as `unsupported_field`, naming `field`, never echoing `value` or the key.
    fn refused(bytes: &[u8], field: &str, value: &str, key: &str) {
        let err = parse(bytes, OffsetDateTime::now_utc()).unwrap_err();
        assert!(matches!(err, CredentialError::UnsupportedField(_)), "{err:?}");
        assert_eq!(<&str>::from(&err), "unsupported_field");
        let text = err.to_string();
        assert!(text.contains(field), "names {field}: {text}");
        assert!(value.is_empty() || !text.contains(value), "echoes the value: {text}");
        testbed::assert_no_secret_material(&text, &[key]);
    }

    /// One test per field of a kubeconfig's `users[].user` or `clusters[].cluster` that is refused, naming the
    /// field and never its value.
    macro_rules! refused_field {
        ($list:literal . $item:literal: $($test:ident: $field:literal = $value:expr;)*) => {$(
            #[test]
            fn $test() {
                let value: Value = serde_yaml::from_str($value).unwrap();
                let (bytes, key) = shaped(|d| set(d, $list, $item, $field, value));
                refused(&bytes, &format!("{}.{}.{}", $list, $item, $field), "s3cr3t", &key);
            }
        )*};
    }

    refused_field! {
        "users"."user":
        an_exec_plugin_is_refused_so_no_command_runs: "exec" = "{command: /bin/s3cr3t, apiVersion: client.authentication.k8s.io/v1}";
        an_auth_provider_is_refused: "auth-provider" = "{name: oidc, config: {id-token: s3cr3t}}";
        a_token_is_refused_naming_the_field_not_the_token: "token" = "s3cr3t";
        a_token_file_is_refused_so_the_agents_own_token_is_never_read: "tokenFile" = "/var/run/secrets/s3cr3t/token";
        a_username_is_refused: "username" = "s3cr3t";
        a_password_is_refused: "password" = "s3cr3t";
        a_client_certificate_file_path_is_refused: "client-certificate" = "/etc/s3cr3t.crt";
        a_client_key_file_path_is_refused: "client-key" = "/etc/s3cr3t.key";
        impersonation_is_refused: "as" = "s3cr3t";
    }

    refused_field! {
        "clusters"."cluster":
        insecure_skip_tls_verify_is_refused_so_a_proof_always_verifies_the_server: "insecure-skip-tls-verify" = "true";
        a_proxy_url_is_refused: "proxy-url" = "http://s3cr3t.example:3128";
        a_tls_server_name_is_refused: "tls-server-name" = "s3cr3t";
        a_certificate_authority_file_path_is_refused: "certificate-authority" = "/etc/s3cr3t.crt";
    }

    #[test]
    fn an_unknown_field_is_refused_without_echoing_its_name() {
        let (bytes, key) = shaped(|d| set(d, "users", "user", "s3cr3t-field", Value::from("x")));
        refused(&bytes, "users.user.an unknown field", "s3cr3t", &key);
        let (bytes, key) = shaped(|d| {
            d.as_mapping_mut().unwrap().insert(Value::from("s3cr3t-top"), Value::from("x"));
        });
        refused(&bytes, "kubeconfig.an unknown field", "s3cr3t", &key);
    }

    #[test]
    fn a_field_in_an_entry_the_current_context_does_not_use_is_refused_too() {
        let (bytes, key) = shaped(|d| {
            let mut other = d["users"][0].clone();
            other["name"] = Value::from("other");
            other["user"].as_mapping_mut().unwrap().insert(Value::from("token"), Value::from("s3cr3t"));
            d["users"].as_sequence_mut().unwrap().push(other);
        });
        refused(&bytes, "users.user.token", "s3cr3t", &key);
    }

    #[test]
    fn more_than_one_context_with_none_current_is_refused() {
        let (bytes, key) = shaped(|d| {
            let mut other = d["contexts"][0].clone();
            other["name"] = Value::from("y");
            d["contexts"].as_sequence_mut().unwrap().push(other);
            d.as_mapping_mut().unwrap().remove("current-context");
        });
        refused(&bytes, "contexts", "", &key);
        // One context and no current-context is that context.
        let (bytes, _) = shaped(|d| {
            d.as_mapping_mut().unwrap().remove("current-context");
        });
        assert_eq!(parse(&bytes, OffsetDateTime::now_utc()).unwrap().cert.username, "u");
    }

    #[test]
    fn a_plain_http_server_is_refused() {
        let (bytes, key) =
            shaped(|d| d["clusters"][0]["cluster"]["server"] = Value::from("http://127.0.0.1:8080/clusters/root"));
        refused(&bytes, "clusters.cluster.server", "127.0.0.1", &key);
    }

    #[test]
    fn what_is_published_is_rendered_from_the_parts_alone() {
        let (bytes, _) = shaped(|d| {
            d["clusters"][0]["cluster"]["server"] = Value::from("https://127.0.0.1:6443/clusters/root");
        });
        let c = parse(&bytes, OffsetDateTime::now_utc()).unwrap();
        assert_ne!(c.kubeconfig.expose(), &bytes, "rendered, not copied");
        let again = parse(c.kubeconfig.expose(), OffsetDateTime::now_utc()).unwrap();
        assert_eq!(again.kubeconfig.expose(), c.kubeconfig.expose(), "a rendering renders to itself");
        assert_eq!((again.server, again.cert_pem), (c.server, c.cert_pem));
    }

    #[test]
    fn a_render_lacking_the_current_server_ca_is_told_apart() {
        let old = Ca::new("server-ca-1", HOUR).unwrap().cert_pem();
        let new = Ca::new("server-ca-2", HOUR).unwrap().cert_pem();
        assert!(ca_contains(old.as_bytes(), old.as_bytes()));
        assert!(ca_contains(format!("{old}{new}").as_bytes(), new.as_bytes()));
        assert!(!ca_contains(old.as_bytes(), new.as_bytes()));
    }

    #[test]
    fn path_of_takes_everything_after_the_authority() {
        assert_eq!(path_of("https://h:1/clusters/root"), "/clusters/root");
        assert_eq!(path_of("https://h:1"), "");
    }
}
