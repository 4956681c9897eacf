//! A chain cert-manager broke while the layout came up, named at once.
//!
//! cert-manager v1.21's key manager can issue a Certificate twice when two reconciliations race on a stale
//! informer cache (upstream issue cert-manager#6331, fix proposed in PR #9097, open; the PR names "a Certificate
//! and an Issuer created in the same cycle", which is how the operator makes every CA of the layout). On this bed,
//! on a loaded machine, that hit a CA: issued, certificates signed with its key, then issued again with a new key.
//! It was seen on `root-ca` (the intermediates below it then failed "crypto/rsa: verification error ... root-ca")
//! and, in CI, on a CA one level down (the alpha shard's certificates, older than the front proxy's, never became
//! usable while the front proxy's were). Every chain through the replaced key stays broken: cert-manager never
//! re-issues what a replaced CA signed, and the kcp components crash-loop for good. The bring-up fails fast on
//! it instead of waiting out its 10 minutes, and starts the layout again (see `super::install`).
//!
//! The rule checked is the one TLS applies: every certificate cert-manager issued through a CA `Issuer` must
//! verify against that CA's current certificate.

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, ListParams};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::layout::NAMESPACE;

const CERTIFICATE_NAME: &str = "cert-manager.io/certificate-name";
const ISSUER_NAME: &str = "cert-manager.io/issuer-name";
const ISSUER_KIND: &str = "cert-manager.io/issuer-kind";

/// The first certificate of a Secret's `tls.crt`, as DER.
fn leaf(secret: &Secret) -> Option<Vec<u8>> {
    let pem = secret.data.as_ref()?.get("tls.crt")?;
    let der = CertificateDer::from_pem_slice(&pem.0).ok()?;
    Some(der.as_ref().to_vec())
}

/// Whether `cert` (DER) carries a signature `ca`'s (DER) key made. Unparsable input counts as not signed.
fn signed_by(cert: &[u8], ca: &[u8]) -> bool {
    let (Ok((_, cert)), Ok((_, ca))) =
        (x509_parser::parse_x509_certificate(cert), x509_parser::parse_x509_certificate(ca))
    else {
        return false;
    };
    cert.verify_signature(Some(ca.public_key())).is_ok()
}

/// The Secrets (by name) cert-manager issued through a CA `Issuer` (`ca_of`: Issuer name → its CA Secret's name)
/// whose certificate that CA's current certificate does not verify. Secrets not yet issued, and CAs not yet
/// present, are not judged.
pub fn broken(secrets: &[Secret], ca_of: &BTreeMap<String, String>) -> Vec<String> {
    let by_name: BTreeMap<&str, &Secret> =
        secrets.iter().filter_map(|s| Some((s.metadata.name.as_deref()?, s))).collect();
    let mut broken = Vec::new();
    for secret in secrets {
        let Some(annotations) = secret.metadata.annotations.as_ref() else { continue };
        if !annotations.contains_key(CERTIFICATE_NAME) || annotations.get(ISSUER_KIND).is_some_and(|k| k != "Issuer") {
            continue;
        }
        let Some(ca_secret) = annotations.get(ISSUER_NAME).and_then(|issuer| ca_of.get(issuer)) else { continue };
        let (Some(cert), Some(ca)) = (leaf(secret), by_name.get(ca_secret.as_str()).and_then(|s| leaf(s))) else {
            continue;
        };
        if !signed_by(&cert, &ca) {
            broken.push(format!(
                "{} (not signed by {ca_secret}'s current key)",
                secret.metadata.name.as_deref().unwrap_or("")
            ));
        }
    }
    broken
}

/// An error naming the Secrets a replaced CA signed (see the module's comment), when there are any.
pub async fn check(client: &kube::Client) -> Result<()> {
    let issuers =
        Api::<DynamicObject>::namespaced_with(client.clone(), NAMESPACE, &crate::operators::issuer_resource());
    let ca_of: BTreeMap<String, String> = issuers
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|i| {
            let secret = i.data.pointer("/spec/ca/secretName")?.as_str()?.to_string();
            Some((i.metadata.name?, secret))
        })
        .collect();
    let secrets = Api::<Secret>::namespaced(client.clone(), NAMESPACE).list(&ListParams::default()).await?.items;
    let broken = broken(&secrets, &ca_of);
    if broken.is_empty() {
        return Ok(());
    }
    bail!(
        "{BROKEN_CHAIN}: cert-manager issued a CA again after it had signed with it (cert-manager#6331, a key-manager \
         race on a loaded machine), and the kcp components cannot verify each other: {broken:?}"
    )
}

/// The start of [`check`]'s error, by which the bring-up tells it from other failures.
pub const BROKEN_CHAIN: &str = "a certificate chain is broken";

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

    fn ca(name: &str, signer: Option<&Issuer<'_, KeyPair>>) -> (String, Issuer<'static, KeyPair>) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = match signer {
            Some(signer) => params.clone().signed_by(&key, signer).unwrap(),
            None => params.clone().self_signed(&key).unwrap(),
        };
        (cert.pem(), Issuer::new(params, key))
    }

    fn leaf_signed_by(signer: &Issuer<'_, KeyPair>) -> String {
        let key = KeyPair::generate().unwrap();
        CertificateParams::new(vec!["leaf.example".to_string()]).unwrap().signed_by(&key, signer).unwrap().pem()
    }

    fn secret(name: &str, issuer: &str, pem: &str) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.annotations = Some(
            [(CERTIFICATE_NAME, name), (ISSUER_NAME, issuer), (ISSUER_KIND, "Issuer")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        s.data = Some([("tls.crt".to_string(), k8s_openapi::ByteString(pem.as_bytes().to_vec()))].into());
        s
    }

    /// `root-ca` (self-signed) → Issuer `root-ca`; `client-ca` signed by it → Issuer `client-ca`.
    fn issuers() -> BTreeMap<String, String> {
        [("root-ca", "root-ca"), ("client-ca", "client-ca")].into_iter().map(|(a, b)| (a.into(), b.into())).collect()
    }

    #[test]
    fn an_intact_two_level_chain_is_not_named() {
        let (root_pem, root) = ca("root-ca", None);
        let (client_pem, client) = ca("client-ca", Some(&root));
        let secrets = [
            secret("root-ca", "selfsigned", &root_pem),
            secret("client-ca", "root-ca", &client_pem),
            secret("alpha-client", "client-ca", &leaf_signed_by(&client)),
        ];
        assert_eq!(broken(&secrets, &issuers()), Vec::<String>::new());
    }

    #[test]
    fn leaves_signed_by_an_intermediate_issued_again_are_named_and_the_later_ones_are_not() {
        let (root_pem, root) = ca("root-ca", None);
        let (_, first) = ca("client-ca", Some(&root));
        let (client_pem, second) = ca("client-ca", Some(&root));
        let secrets = [
            secret("root-ca", "selfsigned", &root_pem),
            secret("client-ca", "root-ca", &client_pem),
            secret("alpha-client", "client-ca", &leaf_signed_by(&first)),
            secret("frontproxy-client", "client-ca", &leaf_signed_by(&second)),
        ];
        assert_eq!(broken(&secrets, &issuers()), vec!["alpha-client (not signed by client-ca's current key)"]);
    }

    #[test]
    fn intermediates_signed_by_a_root_issued_again_are_named() {
        let (_, first) = ca("root-ca", None);
        let (root_pem, _) = ca("root-ca", None);
        let (client_pem, _) = ca("client-ca", Some(&first));
        let secrets = [secret("root-ca", "selfsigned", &root_pem), secret("client-ca", "root-ca", &client_pem)];
        assert_eq!(broken(&secrets, &issuers()), vec!["client-ca (not signed by root-ca's current key)"]);
    }

    #[test]
    fn a_secret_whose_ca_is_not_yet_issued_is_not_judged() {
        let (_, root) = ca("root-ca", None);
        let (client_pem, _) = ca("client-ca", Some(&root));
        assert_eq!(broken(&[secret("client-ca", "root-ca", &client_pem)], &issuers()), Vec::<String>::new());
    }
}
