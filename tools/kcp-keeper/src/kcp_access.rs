//! A kcp kubeconfig (from a Secret others can write) parsed into exactly what a client needs: the server URL,
//! the CA bundle, and one credential (a client certificate and key, or a bearer token). Nothing else of the file
//! reaches a client: no exec plugin, no auth provider, no proxy, no file path, no `insecure-skip-tls-verify`.

use std::fmt;

use anyhow::{Context, Result, bail};
use base64::Engine;
use serde::Deserialize;

/// Key material, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Sensitive(pub String);

impl fmt::Debug for Sensitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// PEM certificate and PEM key.
    ClientCertificate {
        cert_pem: String,
        key_pem: Sensitive,
    },
    Token(Sensitive),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KcpAccess {
    /// `https://host[:port][/clusters/<workspace>]`: the workspace the slices are listed in.
    pub server: String,
    /// The PEM CA bundle that verifies the server.
    pub ca_pem: Vec<u8>,
    pub credential: Credential,
}

// The kubeconfig's shape, only the fields read; everything else is ignored unparsed.
#[derive(Deserialize)]
struct File {
    #[serde(rename = "current-context", default)]
    current_context: Option<String>,
    #[serde(default)]
    contexts: Vec<Named<ContextRef>>,
    #[serde(default)]
    clusters: Vec<Named<Cluster>>,
    #[serde(default)]
    users: Vec<Named<User>>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "context", alias = "cluster", alias = "user")]
    value: Option<T>,
}

#[derive(Deserialize)]
struct ContextRef {
    cluster: String,
    user: String,
}

#[derive(Deserialize)]
struct Cluster {
    server: Option<String>,
    #[serde(rename = "certificate-authority-data")]
    ca_data: Option<String>,
}

#[derive(Deserialize)]
struct User {
    #[serde(rename = "client-certificate-data")]
    cert_data: Option<String>,
    #[serde(rename = "client-key-data")]
    key_data: Option<String>,
    token: Option<String>,
}

fn decode(field: &str, b64: &str) -> Result<String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|_| anyhow::anyhow!("{field} is not base64"))?;
    String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{field} is not PEM text"))
}

/// The current context's server, CA and credential (the first context when none is current). A YAML error gives a
/// position only: the text around it may be a key.
pub fn parse(bytes: &[u8]) -> Result<KcpAccess> {
    let file: File = serde_yaml::from_slice(bytes).map_err(|e| {
        let at = e.location().map_or("not a kubeconfig".into(), |l| format!("line {} column {}", l.line(), l.column()));
        anyhow::anyhow!("the kcp kubeconfig does not parse: {at}")
    })?;
    let context = match &file.current_context {
        Some(name) => file.contexts.iter().find(|c| &c.name == name).with_context(|| format!("no context {name:?}"))?,
        None => file.contexts.first().context("the kubeconfig has no context")?,
    };
    let context = context.value.as_ref().context("the context names no cluster and user")?;
    let cluster = file
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.value.as_ref())
        .with_context(|| format!("no cluster {:?}", context.cluster))?;
    let user = file
        .users
        .iter()
        .find(|u| u.name == context.user)
        .and_then(|u| u.value.as_ref())
        .with_context(|| format!("no user {:?}", context.user))?;
    let server = cluster.server.clone().context("the cluster has no server")?;
    let shown = kcp_keeper_runtime::redact::url(&server);
    let uri: http::Uri = server.parse().map_err(|_| anyhow::anyhow!("the server {shown:?} is not a URL"))?;
    if uri.scheme_str() != Some("https") || uri.host().is_none() {
        bail!("the server {shown:?} is not an https URL");
    }
    let ca_pem = decode(
        "certificate-authority-data",
        cluster.ca_data.as_deref().context(
            "the cluster has no certificate-authority-data (a CA file path or the system roots are not used)",
        )?,
    )?
    .into_bytes();
    crate::probe::tls_config(&ca_pem).context("certificate-authority-data")?;
    let credential = match (&user.cert_data, &user.key_data, &user.token) {
        (Some(c), Some(k), _) => Credential::ClientCertificate {
            cert_pem: decode("client-certificate-data", c)?,
            key_pem: Sensitive(decode("client-key-data", k)?),
        },
        (None, None, Some(t)) if !t.trim().is_empty() => Credential::Token(Sensitive(t.trim().to_string())),
        (Some(_), None, _) | (None, Some(_), _) => bail!("the user has a client certificate or key without the other"),
        _ => bail!("the user has no client-certificate-data/client-key-data and no token"),
    };
    Ok(KcpAccess { server: server.trim_end_matches('/').to_string(), ca_pem, credential })
}

impl KcpAccess {
    /// A client built from these fields alone.
    pub fn client(&self) -> Result<kube::Client> {
        let mut config = kube::Config::new(self.server.parse().context("the server URL")?);
        let mut roots = Vec::new();
        for block in pem::parse_many(&self.ca_pem).context("the CA bundle")? {
            if block.tag() == "CERTIFICATE" {
                roots.push(block.contents().to_vec());
            }
        }
        config.root_cert = Some(roots);
        match &self.credential {
            Credential::ClientCertificate { cert_pem, key_pem } => {
                let b64 = base64::engine::general_purpose::STANDARD;
                config.auth_info.client_certificate_data = Some(b64.encode(cert_pem));
                config.auth_info.client_key_data = Some(b64.encode(&key_pem.0).into());
            }
            Credential::Token(t) => config.auth_info.token = Some(t.0.clone().into()),
        }
        config.connect_timeout = Some(std::time::Duration::from_secs(10));
        config.read_timeout = Some(std::time::Duration::from_secs(30));
        Ok(kube::Client::try_from(config)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn ca() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    fn kubeconfig(user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: default\nclusters:\n- name: kcp\n  cluster:\n    server: https://kcp.example.com:6443/clusters/root\n    certificate-authority-data: {}\n    proxy-url: http://evil.example:3128\ncontexts:\n- name: base\n  context: {{cluster: other, user: other}}\n- name: default\n  context: {{cluster: kcp, user: admin}}\nusers:\n- name: admin\n  user:\n{user}",
            b64(&ca())
        )
    }

    #[test]
    fn a_kubeconfig_becomes_server_ca_and_one_credential_and_nothing_else_of_it() {
        let k = kubeconfig(&format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n    exec: {{command: /bin/sh}}\n",
            b64("CERT"),
            b64("KEY-SECRET")
        ));
        let a = parse(k.as_bytes()).unwrap();
        assert_eq!(a.server, "https://kcp.example.com:6443/clusters/root");
        assert!(a.ca_pem.starts_with(b"-----BEGIN CERTIFICATE-----"));
        assert_eq!(
            a.credential,
            Credential::ClientCertificate { cert_pem: "CERT".into(), key_pem: Sensitive("KEY-SECRET".into()) }
        );
        assert!(!format!("{a:?}").contains("KEY-SECRET"), "the key never prints");
        let t = parse(kubeconfig("    token: TOKEN-SECRET\n").as_bytes()).unwrap();
        assert_eq!(t.credential, Credential::Token(Sensitive("TOKEN-SECRET".into())));
        assert!(!format!("{t:?}").contains("TOKEN-SECRET"));
    }

    #[test]
    fn a_kubeconfig_without_what_is_needed_or_of_the_wrong_shape_is_a_clear_error_quoting_no_secret() {
        let cases = [
            (kubeconfig("    exec: {command: /bin/sh}\n"), "no client-certificate-data"),
            (kubeconfig(&format!("    client-key-data: {}\n", b64("KEY-SECRET"))), "without the other"),
            (kubeconfig("    token: TOKEN-SECRET\n").replace("https://kcp", "http://kcp"), "not an https URL"),
            (
                kubeconfig("    token: TOKEN-SECRET\n").replace("current-context: default", "current-context: x"),
                "no context",
            ),
            ("token: [TOKEN-SECRET".to_string(), "does not parse"),
        ];
        for (text, want) in cases {
            let e = format!("{:#}", parse(text.as_bytes()).unwrap_err());
            assert!(e.contains(want), "{want}: {e}");
            assert!(!e.contains("SECRET"), "{e}");
        }
        let no_ca = kubeconfig("    token: T\n");
        let no_ca: String =
            no_ca.lines().filter(|l| !l.contains("certificate-authority-data")).collect::<Vec<_>>().join("\n");
        assert!(format!("{:#}", parse(no_ca.as_bytes()).unwrap_err()).contains("certificate-authority-data"));
    }
}
