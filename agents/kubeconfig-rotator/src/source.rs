//! The configured source, read out of a [`Snapshot`]: the candidate kubeconfig it offers (rendered by the
//! operator, held in a Secret, or built from a certificate Secret), who it must prove to be, and, for an operator
//! source, what cert-manager last issued. Pure: the daemon and the one-shots resolve the same way.

use k8s_openapi::api::core::v1::ObjectReference;
use kcp_keeper_runtime::events::reference;
use time::OffsetDateTime;

use crate::config::{Identity, KUBECONFIG_KEY, Kubeconfig, Source, certificate_name};
use crate::credential::{self, CertInfo, Credential, CredentialError};
use crate::error::SyncError;
use crate::objects::Certificate;
use crate::policy::{self, Expected};
use crate::scope::Snapshot;

/// The source, resolved into a candidate kubeconfig and what it must prove.
pub struct Resolved {
    pub bytes: Vec<u8>,
    pub expected: Expected,
    /// Where Events about the source go.
    pub regarding: ObjectReference,
    /// Operator source: the certificate cert-manager last issued, and its Certificate.
    pub issued: Option<CertInfo>,
    pub certificate: Option<Certificate>,
    /// The rendered Secret (or its key) does not exist yet.
    pub missing: Option<String>,
}

/// Where Events about `kc` go: its source object, the `Kubeconfig` (with its uid once the store holds it) or the
/// Secret; known from the configuration, so also when the source is missing.
pub fn regarding(kc: &Kubeconfig, snap: &Snapshot) -> ObjectReference {
    match &kc.source {
        Source::Operator { namespace, name, .. } => {
            let uid = snap.kubeconfig.as_ref().and_then(|k| k.metadata.uid.clone());
            reference("operator.kcp.io/v1alpha1", "Kubeconfig", namespace, name, uid)
        }
        Source::Secret(r) => reference("v1", "Secret", &r.namespace, &r.name, None),
        Source::CertificateSecret { namespace, name, .. } => reference("v1", "Secret", namespace, name, None),
    }
}

/// Reads the source out of `snap`; pure apart from building the candidate.
pub fn resolve(kc: &Kubeconfig, snap: &Snapshot) -> Result<Resolved, SyncError> {
    let key = |ns: &str, name: &str, key: &str| {
        snap.key(ns, name, key).ok_or_else(|| SyncError::SourceMissing(format!("Secret {ns}/{name} key {key}")))
    };
    // A Secret alone: no Certificate, nothing to wait for; Events go to the Secret.
    let secret = |bytes, expected, ns: &str, name: &str| Resolved {
        bytes,
        expected,
        regarding: reference("v1", "Secret", ns, name, None),
        issued: None,
        certificate: None,
        missing: None,
    };
    match &kc.source {
        Source::Operator { namespace, name, rendered_secret, .. } => {
            let object = format!("{namespace}/{name}");
            let kubeconfig =
                snap.kubeconfig.as_ref().ok_or_else(|| SyncError::SourceMissing(format!("Kubeconfig {object}")))?;
            if kubeconfig.secret_ref() != Some(rendered_secret.as_str()) {
                return Err(SyncError::SecretRefMismatch(object));
            }
            let expected = match &kc.expect {
                Some(_) => expected_of(kc),
                None => Expected {
                    rights: kc.rights.clone(),
                    ..policy::operator_identity(name, kubeconfig.username().unwrap_or_default(), &kubeconfig.groups())
                },
            };
            let cert_secret = certificate_name(name);
            let issued = snap.key(namespace, &cert_secret, "tls.crt").and_then(|pem| credential::cert_info(pem).ok());
            // Not rendered yet: still nudged and renewed below, then reported as missing, not as a bad candidate.
            let bytes = snap.key(namespace, rendered_secret, KUBECONFIG_KEY).map(<[u8]>::to_vec);
            let missing = bytes.is_none().then(|| format!("Secret {namespace}/{rendered_secret} key {KUBECONFIG_KEY}"));
            let bytes = bytes.unwrap_or_default();
            let regarding = regarding(kc, snap);
            Ok(Resolved { bytes, expected, regarding, issued, certificate: snap.certificate.clone(), missing })
        }
        Source::Secret(r) => {
            Ok(secret(key(&r.namespace, &r.name, &r.key)?.to_vec(), expected_of(kc), &r.namespace, &r.name))
        }
        Source::CertificateSecret { namespace, name, server, ca } => {
            let (crt, tls_key) = (key(namespace, name, "tls.crt")?, key(namespace, name, "tls.key")?);
            let ca_pem = key(&ca.namespace, &ca.name, &ca.key)?;
            let expected = expected_of(kc);
            Ok(secret(credential::build(server, ca_pem, crt, tls_key, &expected.username), expected, namespace, name))
        }
    }
}

/// The identity configured in `expect`, and the rights.
fn expected_of(kc: &Kubeconfig) -> Expected {
    // Validation guarantees `expect` for every source but the operator's.
    let e = kc.expect.clone().unwrap_or(Identity { username: String::new(), groups: vec![] });
    Expected { username: e.username, groups: e.groups, rights: kc.rights.clone() }
}

/// The candidate as it will be published: the source's kubeconfig sanitised into its parts (anything more is
/// refused), the server moved if configured, rendered from those parts alone.
pub fn candidate(kc: &Kubeconfig, source: &Resolved, now: OffsetDateTime) -> Result<Credential, CredentialError> {
    let parts = credential::parts(&source.bytes)?;
    let parts = match &kc.server {
        Some(base) => parts.at(base),
        None => parts,
    };
    credential::check(parts, now)
}
