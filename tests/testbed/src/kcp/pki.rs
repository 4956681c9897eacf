//! kcp's certificates, laid out the way kcp-operator lays them out: one root CA and, under it, the server CA
//! (the `<rootshard>-server-ca` Secret: `tls.crt` the intermediate, `ca.crt` the root, `tls.key` the CA's
//! private key), the client CA for admin kubeconfigs and kcp's own client certificates, and the front-proxy
//! client CA, whose certificate the front proxy presents to the shards with the user in request headers.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use rcgen::KeyPair;
use serde::{Deserialize, Serialize};

use crate::apiserver::kubeconfig_yaml_with_context;
use crate::certs::{Ca, Credential};

const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// The admin user of kubeconfigs the operator renders for `Kubeconfig` objects in the demo and the tests.
pub const ADMIN_USER: &str = "kcp-admin";
/// kcp binds this group to cluster-admin in the root workspace.
pub const ADMIN_GROUP: &str = "system:kcp:admin";

pub struct KcpPki {
    pub root_ca: Ca,
    pub server_ca: Ca,
    pub client_ca: Ca,
    pub front_proxy_client_ca: Ca,
    sa_key_pem: String,
    sa_pub_pem: String,
}

impl KcpPki {
    pub fn new() -> Result<Self> {
        let root_ca = Ca::new("root-ca", YEAR * 10)?;
        let server_ca = root_ca.intermediate("root-server-ca", YEAR * 5)?;
        let client_ca = root_ca.intermediate("root-client-ca", YEAR * 5)?;
        let front_proxy_client_ca = root_ca.intermediate("root-front-proxy-client-ca", YEAR * 5)?;
        let sa = KeyPair::generate()?;
        Ok(Self {
            root_ca,
            server_ca,
            client_ca,
            front_proxy_client_ca,
            sa_key_pem: sa.serialize_pem(),
            sa_pub_pem: sa.public_key_pem(),
        })
    }

    /// A CA as cert-manager writes its Secret: `tls.crt` the CA, `ca.crt` its root, `tls.key` its private key.
    pub fn ca_secret_data(&self, ca: &Ca) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("tls.crt".to_string(), ca.cert_pem()),
            ("ca.crt".to_string(), self.root_ca.cert_pem()),
            ("tls.key".to_string(), ca.key_pem()),
        ])
    }

    /// The bundle clients verify kcp's serving certificates with (the server CA Secret's `tls.crt` and `ca.crt`).
    pub fn server_ca_bundle(&self) -> String {
        format!("{}{}", self.server_ca.cert_pem(), self.root_ca.cert_pem())
    }

    /// A serving certificate from the server CA for 127.0.0.1, `localhost` and `hostnames`; its `tls.crt` carries
    /// the intermediate after the leaf, as cert-manager writes it.
    pub fn serving(&self, hostnames: &[&str]) -> Result<Credential> {
        let mut names = vec!["localhost"];
        names.extend_from_slice(hostnames);
        let mut cred = self.server_ca.issue_server(&names, &[IpAddr::V4(Ipv4Addr::LOCALHOST)], YEAR)?;
        cred.cert_pem.push_str(&self.server_ca.cert_pem());
        Ok(cred)
    }

    /// A client certificate from the client CA (CN = user, O = groups).
    pub fn client(&self, user: &str, groups: &[&str], validity: Duration) -> Result<Credential> {
        self.client_ca.issue_client(user, groups, validity)
    }

    /// A kubeconfig for `server` as `user` with a fresh client certificate, trusting the server CA bundle.
    pub fn kubeconfig(&self, server: &str, user: &str, groups: &[&str]) -> Result<String> {
        self.kubeconfig_with_context(server, user, groups, "testbed")
    }

    /// The same, with its one context named `context`: a non-root shard reads the root shard's kubeconfig at
    /// context `shard-base`, as kcp's own harness writes it.
    pub fn kubeconfig_with_context(&self, server: &str, user: &str, groups: &[&str], context: &str) -> Result<String> {
        let cred = self.client(user, groups, YEAR)?;
        Ok(kubeconfig_yaml_with_context(server, &self.server_ca_bundle(), &cred, user, context))
    }

    /// Every CA with its key and the service-account key pair, for another process to issue from
    /// ([`KcpPki::from_pem`]; the shared bed's file).
    pub fn to_pem(&self) -> PkiPem {
        let pair = |ca: &Ca| CaPem { cert: ca.cert_pem(), key: ca.key_pem() };
        PkiPem {
            root_ca: pair(&self.root_ca),
            server_ca: pair(&self.server_ca),
            client_ca: pair(&self.client_ca),
            front_proxy_client_ca: pair(&self.front_proxy_client_ca),
            service_account_key: self.sa_key_pem.clone(),
            service_account_pub: self.sa_pub_pem.clone(),
        }
    }

    pub fn from_pem(pem: &PkiPem) -> Result<Self> {
        let ca = |p: &CaPem| Ca::from_pem(&p.cert, &p.key);
        Ok(Self {
            root_ca: ca(&pem.root_ca).context("the root CA")?,
            server_ca: ca(&pem.server_ca).context("the server CA")?,
            client_ca: ca(&pem.client_ca).context("the client CA")?,
            front_proxy_client_ca: ca(&pem.front_proxy_client_ca).context("the front-proxy client CA")?,
            sa_key_pem: pem.service_account_key.clone(),
            sa_pub_pem: pem.service_account_pub.clone(),
        })
    }

    pub fn service_account_key_pem(&self) -> &str {
        &self.sa_key_pem
    }

    pub fn service_account_pub_pem(&self) -> &str {
        &self.sa_pub_pem
    }
}

/// A [`KcpPki`] as PEM.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PkiPem {
    root_ca: CaPem,
    server_ca: CaPem,
    client_ca: CaPem,
    front_proxy_client_ca: CaPem,
    service_account_key: String,
    service_account_pub: String,
}

#[derive(Serialize, Deserialize)]
struct CaPem {
    cert: String,
    key: String,
}

/// Writes `content` to `dir/name` (creating `dir`) and returns the path.
pub fn write(dir: &Path, name: &str, content: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Writes a CA as its Secret would be mounted (`tls.crt`, `ca.crt`, `tls.key`) under `dir/name`.
pub fn write_ca_secret(dir: &Path, name: &str, data: &BTreeMap<String, String>) -> Result<PathBuf> {
    let dir = dir.join(name);
    for (key, value) in data {
        write(&dir, key, value)?;
    }
    Ok(dir)
}
