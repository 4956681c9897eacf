//! Certificates for the test bed, generated in-process: a server CA (the apiserver's serving certificate), a
//! client CA (client-certificate users) and the service-account signing key.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::Result;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use time::OffsetDateTime;

/// A certificate authority that can issue leaf certificates.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

/// A certificate with its private key, both PEM.
#[derive(Clone)]
pub struct Credential {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_after: OffsetDateTime,
}

impl std::fmt::Debug for Credential {
    // Keep key material out of test output, as the agents must.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential").field("not_after", &self.not_after).finish_non_exhaustive()
    }
}

impl Ca {
    /// A self-signed CA valid from a minute ago for `validity`.
    pub fn new(common_name: &str, validity: Duration) -> Result<Self> {
        let (params, key) = (ca_params(common_name, validity)?, KeyPair::generate()?);
        let cert_pem = params.self_signed(&key)?.pem();
        Ok(Self { issuer: Issuer::new(params, key), cert_pem })
    }

    /// An intermediate CA signed by this one (cert-manager's `<rootshard>-server-ca` shape).
    pub fn intermediate(&self, common_name: &str, validity: Duration) -> Result<Ca> {
        let (params, key) = (ca_params(common_name, validity)?, KeyPair::generate()?);
        let cert_pem = params.signed_by(&key, &self.issuer)?.pem();
        Ok(Ca { issuer: Issuer::new(params, key), cert_pem })
    }

    /// The CA a process wrote before ([`Ca::cert_pem`], [`Ca::key_pem`]): a test binary issues from the CAs of a
    /// kcp bed another process started (`kcp::shared`).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self> {
        let issuer = Issuer::from_ca_cert_pem(cert_pem, KeyPair::from_pem(key_pem)?)?;
        Ok(Self { issuer, cert_pem: cert_pem.to_string() })
    }

    pub fn cert_pem(&self) -> String {
        self.cert_pem.clone()
    }

    /// The CA's private key: only for tests that must prove it never travels.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// A TLS serving certificate for the given DNS names and IP addresses.
    pub fn issue_server(&self, dns_names: &[&str], ips: &[IpAddr], validity: Duration) -> Result<Credential> {
        let mut params = CertificateParams::new(dns_names.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        params.subject_alt_names.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.distinguished_name = name(dns_names.first().copied().unwrap_or("testbed"), &[]);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        self.issue(params, validity)
    }

    /// A client certificate as Kubernetes reads it: CN = user, O = groups (at most two, see [`name`]).
    pub fn issue_client(&self, user: &str, groups: &[&str], validity: Duration) -> Result<Credential> {
        anyhow::ensure!(groups.len() <= 2, "rcgen writes at most two O attributes; {} groups asked", groups.len());
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = name(user, groups);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        self.issue(params, validity)
    }

    fn issue(&self, mut params: CertificateParams, validity: Duration) -> Result<Credential> {
        let not_after = set_validity(&mut params, validity);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Credential { cert_pem: cert.pem(), key_pem: key.serialize_pem(), not_after })
    }
}

fn ca_params(common_name: &str, validity: Duration) -> Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = name(common_name, &[]);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    set_validity(&mut params, validity);
    Ok(params)
}

/// CN and up to two O attributes. rcgen keeps one value per attribute type, so a second O (a kcp-operator
/// certificate carries its groups plus `kubeconfig:<name>`) is written under the same OID as a custom type.
fn name(common_name: &str, organizations: &[&str]) -> DistinguishedName {
    const ORGANIZATION_OID: [u64; 4] = [2, 5, 4, 10];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    for (i, org) in organizations.iter().enumerate() {
        let ty = if i == 0 { DnType::OrganizationName } else { DnType::CustomDnType(ORGANIZATION_OID.to_vec()) };
        dn.push(ty, *org);
    }
    dn
}

/// Valid from a minute ago (clock skew between processes) until `validity` from now.
fn set_validity(params: &mut CertificateParams, validity: Duration) -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(1);
    params.not_after = now + validity;
    params.not_after
}

/// Everything the apiserver needs.
pub struct Pki {
    pub server_ca: Ca,
    pub client_ca: Ca,
    pub serving: Credential,
    /// Service-account token signing key (private) and its public half, PEM.
    pub sa_key_pem: String,
    pub sa_pub_pem: String,
}

impl Pki {
    pub fn new() -> Result<Self> {
        let year = Duration::from_secs(365 * 24 * 3600);
        let server_ca = Ca::new("testbed-server-ca", year)?;
        let client_ca = Ca::new("testbed-client-ca", year)?;
        let serving = server_ca.issue_server(
            &["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            year,
        )?;
        let sa = KeyPair::generate()?;
        Ok(Self { server_ca, client_ca, serving, sa_key_pem: sa.serialize_pem(), sa_pub_pem: sa.public_key_pem() })
    }
}
