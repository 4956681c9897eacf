//! A real kube-apiserver on the test bed's etcd, with client-certificate users and RBAC.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::certs::{Credential, Pki};
use crate::process::{Process, free_port, wait_until};

/// The Service ClusterIP range; the demo's fixed ClusterIPs are picked inside it.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";

/// The admin user: `system:masters` bypasses RBAC, like kubeadm's admin.conf.
pub const ADMIN_USER: &str = "testbed-admin";

pub struct ApiServer {
    pub url: String,
    pub process: Process,
    pub pki: Pki,
    pub admin_kubeconfig: PathBuf,
    /// The audit log (JSON lines, Metadata level): who did what, read by [`crate::audit`].
    pub audit_log: PathBuf,
    dir: PathBuf,
}

/// Every request at Metadata level (never a body, so no Secret data lands in the log), written as it completes.
const AUDIT_POLICY: &str =
    "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n";

impl ApiServer {
    pub async fn start(binary: &Path, dir: &Path, etcd_servers: &str) -> Result<Self> {
        let pki = Pki::new()?;
        let port = free_port()?;
        let url = format!("https://127.0.0.1:{port}");
        let write = |name: &str, content: &str| -> Result<String> {
            let path = dir.join(name);
            std::fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
            Ok(path.display().to_string())
        };
        let args = vec![
            format!("--etcd-servers={etcd_servers}"),
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--cert-dir={}", dir.display()),
            format!("--tls-cert-file={}", write("serving.crt", &pki.serving.cert_pem)?),
            format!("--tls-private-key-file={}", write("serving.key", &pki.serving.key_pem)?),
            format!("--client-ca-file={}", write("client-ca.crt", &pki.client_ca.cert_pem())?),
            format!("--service-account-key-file={}", write("sa.pub", &pki.sa_pub_pem)?),
            format!("--service-account-signing-key-file={}", write("sa.key", &pki.sa_key_pem)?),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--authorization-mode=RBAC".into(),
            format!("--audit-policy-file={}", write("audit-policy.yaml", AUDIT_POLICY)?),
            format!("--audit-log-path={}", dir.join("audit.log").display()),
            "--audit-log-format=json".into(),
            // Written before the response is sent, so a test reads every request it has seen answered.
            "--audit-log-mode=blocking".into(),
            "--allow-privileged=true".into(),
            // The apiserver refuses to publish a loopback address in the `kubernetes` Service endpoints.
            "--endpoint-reconciler-type=none".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        let process = Process::start("kube-apiserver", binary, args, dir.join("kube-apiserver.log"))?;
        let admin =
            pki.client_ca.issue_client(ADMIN_USER, &["system:masters"], Duration::from_secs(365 * 24 * 3600))?;
        let admin_kubeconfig = dir.join("admin.kubeconfig");
        std::fs::write(&admin_kubeconfig, kubeconfig_yaml(&url, &pki.server_ca.cert_pem(), &admin, ADMIN_USER))?;
        let audit_log = dir.join("audit.log");
        let mut server = Self { url, process, pki, admin_kubeconfig, audit_log, dir: dir.into() };
        server.wait_ready().await?;
        Ok(server)
    }

    /// A client acting as the admin (`system:masters`).
    pub async fn admin_client(&self) -> Result<kube::Client> {
        client_from_file(&self.admin_kubeconfig).await
    }

    /// Writes a kubeconfig for a client-certificate user with these groups and returns its path.
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str], validity: Duration) -> Result<PathBuf> {
        let cred = self.pki.client_ca.issue_client(user, groups, validity)?;
        let path = self.dir.join(format!("user-{user}-{}.kubeconfig", rand::random::<u32>()));
        std::fs::write(&path, kubeconfig_yaml(&self.url, &self.pki.server_ca.cert_pem(), &cred, user))?;
        Ok(path)
    }

    /// A client for a restricted user: RBAC decides what it may do.
    pub async fn user_client(&self, user: &str, groups: &[&str]) -> Result<kube::Client> {
        client_from_file(&self.user_kubeconfig(user, groups, Duration::from_secs(24 * 3600))?).await
    }

    /// Writes a kubeconfig that authenticates with a bearer token (a ServiceAccount's) and returns its path.
    pub fn token_kubeconfig(&self, user: &str, token: &str) -> Result<PathBuf> {
        let path = self.dir.join(format!("token-{}.kubeconfig", rand::random::<u32>()));
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: testbed\n  context:\n    cluster: testbed\n    user: {user}\ncurrent-context: testbed\n",
            server = self.url,
            ca = B64.encode(self.pki.server_ca.cert_pem()),
        );
        std::fs::write(&path, yaml)?;
        Ok(path)
    }

    /// Kills the apiserver process and starts it again on the same port, etcd and certificates.
    pub async fn restart(&mut self) -> Result<()> {
        self.process.restart()?;
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let client = client_from_file(&self.admin_kubeconfig).await?;
        wait_until(&mut self.process, Duration::from_secs(90), "ready", || {
            let client = client.clone();
            async move {
                let req = http::Request::get("/readyz").body(Vec::new())?;
                client.request_text(req).await?;
                Ok(())
            }
        })
        .await
    }
}

/// A kubeconfig with everything embedded, as kcp-operator renders them (contexts are named after the user).
pub fn kubeconfig_yaml(server: &str, ca_pem: &str, cred: &Credential, user: &str) -> String {
    kubeconfig_yaml_with_context(server, ca_pem, cred, user, "testbed")
}

/// The same with the context named `context` (kcp reads a root shard kubeconfig at context `shard-base`).
pub fn kubeconfig_yaml_with_context(
    server: &str,
    ca_pem: &str,
    cred: &Credential,
    user: &str,
    context: &str,
) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: {context}\n  context:\n    cluster: testbed\n    user: {user}\ncurrent-context: {context}\n",
        ca = B64.encode(ca_pem),
        cert = B64.encode(&cred.cert_pem),
        key = B64.encode(&cred.key_pem),
    )
}

pub async fn client_from_file(path: &Path) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}
