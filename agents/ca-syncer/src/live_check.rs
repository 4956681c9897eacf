//! The live check: before a bundle is published, it must verify the chain a configured TLS endpoint presents,
//! exactly as a consumer trusting only this bundle would (rustls, full verification, the configured name).

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

use crate::certs::Certificate;
use crate::config::LiveCheck;

const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum LiveCheckError {
    #[error("{0:?} is not an https URL with a host")]
    BadUrl(String),
    #[error("{0:?} is not a valid server name")]
    BadServerName(String),
    #[error("no certificate in the bundle can be a trust anchor")]
    NoAnchors,
    #[error("connecting to {addr}: {reason}")]
    Connect { addr: String, reason: String },
    /// The handshake failed: typically the bundle does not verify the presented chain.
    #[error("TLS handshake with {addr} as {server_name}: {reason}")]
    Handshake { addr: String, server_name: String, reason: String },
}

impl LiveCheckError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            LiveCheckError::BadUrl(_) | LiveCheckError::BadServerName(_) => "config",
            LiveCheckError::NoAnchors => "no_anchors",
            LiveCheckError::Connect { .. } => "unreachable",
            LiveCheckError::Handshake { .. } => "not_verified",
        }
    }
}

/// Connects to the endpoint and completes a TLS handshake trusting only `roots`.
pub async fn verify(check: &LiveCheck, roots: &[Certificate]) -> Result<(), LiveCheckError> {
    let uri: http::Uri = check.url.parse().map_err(|_| LiveCheckError::BadUrl(check.url.clone()))?;
    let host = uri
        .host()
        .filter(|_| uri.scheme_str() == Some("https"))
        .ok_or_else(|| LiveCheckError::BadUrl(check.url.clone()))?;
    // IPv6 literals come bracketed from the URI; the socket address wants them bracketed too.
    let addr = format!("{host}:{}", uri.port_u16().unwrap_or(443));
    let name = check.server_name.clone().unwrap_or_else(|| host.trim_matches(['[', ']']).to_string());
    let server_name = ServerName::try_from(name.clone()).map_err(|_| LiveCheckError::BadServerName(name.clone()))?;

    let mut store = rustls::RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(roots.iter().map(|c| CertificateDer::from(c.der().to_vec())));
    if added == 0 {
        return Err(LiveCheckError::NoAnchors);
    }
    let config = rustls::ClientConfig::builder().with_root_certificates(store).with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));

    let connect = |reason: String| LiveCheckError::Connect { addr: addr.clone(), reason };
    let tcp = tokio::time::timeout(TIMEOUT, TcpStream::connect(&addr))
        .await
        .map_err(|_| connect("timed out".into()))?
        .map_err(|e| connect(e.to_string()))?;
    let handshake =
        |reason: String| LiveCheckError::Handshake { addr: addr.clone(), server_name: name.clone(), reason };
    tokio::time::timeout(TIMEOUT, connector.connect(server_name, tcp))
        .await
        .map_err(|_| handshake("timed out".into()))?
        .map_err(|e| handshake(e.to_string()))?;
    Ok(())
}
