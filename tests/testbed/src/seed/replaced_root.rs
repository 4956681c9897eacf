//! A chain cert-manager broke while the layout came up, named at once.
//!
//! cert-manager v1.21's key manager can issue a Certificate twice when two reconciliations race on a stale
//! informer cache (upstream issue cert-manager#6331, fix proposed in PR #9097, open). On this bed, on a loaded
//! machine, that hit the layout's `root-ca`: issued, the intermediate CAs signed by it, then issued again with a
//! new key a minute later. Every chain below it then fails to verify ("crypto/rsa: verification error ... root-ca")
//! and the proxies crash-loop for good: cert-manager never re-issues what a replaced CA signed. The bring-up used
//! to wait out its 10 minutes on that; it now fails as soon as it sees it, naming the cause. (Healing it in place,
//! by deleting the stale Secrets so cert-manager issues them again, was tried: the CAs came back in seconds, but
//! ten of the leaves were not issued again within 3 minutes, so the bed does not pretend to heal it.)
//!
//! A Secret the CA issuer wrote carries its chain's root in `ca.crt`; below a self-signed `root-ca` that is
//! `root-ca`'s own certificate, so a Secret whose `ca.crt` is another certificate was signed by a replaced key.

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::layout::NAMESPACE;

/// The layout's self-signed root of every chain (the operator's `<rootshard>-ca`).
const ROOT_CA: &str = "root-ca";
const CERTIFICATE_NAME: &str = "cert-manager.io/certificate-name";

/// The first certificate of a PEM field, as DER (PEM encodings of one certificate may differ in whitespace).
fn first_der(pem: Option<&k8s_openapi::ByteString>) -> Option<Vec<u8>> {
    let der = CertificateDer::from_pem_slice(&pem?.0).ok()?;
    Some(der.as_ref().to_vec())
}

/// The Secrets (by name) cert-manager issued below `root-ca` whose chain's root is not `root-ca`'s current
/// certificate (none while `root-ca` has not been issued).
async fn stale(client: &kube::Client) -> Result<Vec<String>> {
    let secrets = Api::<Secret>::namespaced(client.clone(), NAMESPACE);
    let Some(root) = secrets.get_opt(ROOT_CA).await? else { return Ok(Vec::new()) };
    let Some(root) = first_der(root.data.as_ref().and_then(|d| d.get("tls.crt"))) else { return Ok(Vec::new()) };
    let mut stale = Vec::new();
    for secret in secrets.list(&ListParams::default()).await?.items {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let issued = secret.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(CERTIFICATE_NAME));
        if !issued || name == ROOT_CA {
            continue;
        }
        let chain_root = first_der(secret.data.as_ref().and_then(|d| d.get("ca.crt")));
        if chain_root.is_some_and(|c| c != root) {
            stale.push(name);
        }
    }
    Ok(stale)
}

/// An error naming the Secrets signed by a replaced `root-ca` (see the module's comment), when there are any.
pub async fn check(client: &kube::Client) -> Result<()> {
    let stale = stale(client).await?;
    if stale.is_empty() {
        return Ok(());
    }
    bail!(
        "cert-manager issued {ROOT_CA} again after it had signed with it (cert-manager#6331, a key-manager race on a \
         loaded machine): {stale:?} chain to its old key, and the kcp components cannot verify each other; this \
         bring-up cannot recover, run the binary again"
    )
}
