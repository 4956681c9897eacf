//! The live check: before a bundle is published, it must verify the chain every configured TLS endpoint
//! presents, exactly as a consumer trusting only this bundle would (rustls, full verification, the configured
//! name). Failures name the endpoint and the kind of problem, never the bundle's content.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use tokio::net::TcpStream;

use crate::certs::Certificate;
use crate::config::Endpoint;

const TIMEOUT: Duration = Duration::from_secs(10);

/// Why a bundle did not verify; the metric label is the variant's name (`not_verified`, ...).
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum LiveCheckError {
    #[error("no certificate in the bundle can be a trust anchor")]
    NoAnchors,
    #[error("connecting to {addr}: {reason}")]
    Unreachable { addr: String, reason: String },
    /// The handshake failed: typically the bundle does not verify the presented chain.
    #[error("TLS handshake with {addr} as {server_name}: {reason}")]
    NotVerified { addr: String, server_name: String, reason: String },
}

/// One endpoint that did not verify, named by its URL as configured (without userinfo: the name goes into
/// logs, Events and the `endpoint` label of `live_check_failures_total`).
#[derive(Debug, thiserror::Error)]
#[error("{url}: {error}")]
pub struct EndpointFailure {
    url: String,
    pub error: LiveCheckError,
}

impl EndpointFailure {
    pub fn new(url: &str, error: LiveCheckError) -> Self {
        Self { url: kcp_keeper_runtime::redact::url(url), error }
    }

    /// The endpoint's URL as it may be shown.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// The endpoints of one bundle that did not verify (at least one), in the configured order.
#[derive(Debug)]
pub struct Failures(pub Vec<EndpointFailure>);

impl std::fmt::Display for Failures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        write!(f, "{} endpoint(s) not verified: {}", self.0.len(), names.join("; "))
    }
}

impl std::error::Error for Failures {}

/// Connects to the endpoint and completes a TLS handshake trusting only `roots`.
pub async fn verify(check: &Endpoint, roots: &[Certificate]) -> Result<(), LiveCheckError> {
    let mut store = rustls::RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(roots.iter().map(|c| CertificateDer::from(c.der().to_vec())));
    if added == 0 {
        return Err(LiveCheckError::NoAnchors);
    }
    let config = rustls::ClientConfig::builder().with_root_certificates(store).with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));

    let addr = &check.address;
    let connect = |reason: String| LiveCheckError::Unreachable { addr: addr.clone(), reason };
    let tcp = tokio::time::timeout(TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| connect("timed out".into()))?
        .map_err(|e| connect(e.to_string()))?;
    let handshake = |reason: String| LiveCheckError::NotVerified {
        addr: addr.clone(),
        server_name: check.server_name.to_str().into_owned(),
        reason,
    };
    tokio::time::timeout(TIMEOUT, connector.connect(check.server_name.clone(), tcp))
        .await
        .map_err(|_| handshake("timed out".into()))?
        .map_err(|e| handshake(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The configuration refuses a liveCheck URL with userinfo; a failure redacts it all the same, since its
    /// name goes into logs, Events and a metric label.
    #[test]
    fn a_failing_endpoint_is_named_without_userinfo_in_its_message_and_label() {
        let failure = EndpointFailure::new("https://admin:hunter2@kcp.example.com:6443", LiveCheckError::NoAnchors);
        assert_eq!(failure.url(), "https://REDACTED@kcp.example.com:6443");
        let shown = Failures(vec![failure]).to_string();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("https://REDACTED@kcp.example.com:6443: no certificate"), "{shown}");
    }
}
