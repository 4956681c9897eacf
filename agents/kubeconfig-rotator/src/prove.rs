//! Proof that a candidate works: a SelfSubjectReview sent with the candidate itself to the server it will be
//! published with (for kcp, `<front proxy>/clusters/<workspace>`: kcp serves the review per workspace). The
//! answer must be 201 with the expected user and the expected groups among the reported ones.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use kube::config::AuthInfo;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::credential::Credential;
use crate::policy::{Expected, identity_matches};

const REVIEW_PATH: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
const TIMEOUT: Duration = Duration::from_secs(15);

/// Why a proof failed. The variant names are `reason` labels of the verification-failure counter; messages
/// carry no value from the candidate (no server, no certificate), only what kind of failure it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum ProofError {
    /// 401: kcp does not accept the certificate (signed by a CA it does not trust, or expired on its clock).
    #[error("the server refused the credential (401)")]
    Refused,
    #[error("the server answered the review with status {0}")]
    UnexpectedStatus(u16),
    /// Accepted, but as someone else.
    #[error("wrong identity: {0}")]
    WrongIdentity(&'static str),
    /// The server could not be reached or its certificate was not trusted by the candidate's CA data.
    #[error("the server could not be reached or did not verify against the candidate's CA data")]
    Unreachable,
    #[error("no client can be built from the candidate: {0}")]
    ClientConfig(&'static str),
    #[error("the review's answer could not be read")]
    BadAnswer,
}

/// Sends the review with `candidate` and checks the identity it proves.
pub async fn prove(candidate: &Credential, expected: &Expected) -> Result<(), ProofError> {
    let client = client(candidate)?;
    let body = serde_json::to_vec(&serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "SelfSubjectReview",
    }))
    .map_err(|_| ProofError::BadAnswer)?;
    let request = http::Request::post(REVIEW_PATH)
        .header("content-type", "application/json")
        .body(body)
        .map_err(|_| ProofError::ClientConfig("request"))?;
    let answer: serde_json::Value = match tokio::time::timeout(TIMEOUT, client.request(request)).await {
        Err(_) => return Err(ProofError::Unreachable),
        Ok(Ok(answer)) => answer,
        Ok(Err(kube::Error::Api(status))) if status.code == 401 => return Err(ProofError::Refused),
        Ok(Err(kube::Error::Api(status))) => return Err(ProofError::UnexpectedStatus(status.code)),
        Ok(Err(_)) => return Err(ProofError::Unreachable),
    };
    let user = &answer["status"]["userInfo"];
    let username = user["username"].as_str().ok_or(ProofError::BadAnswer)?;
    let groups: Vec<String> = user["groups"]
        .as_array()
        .map(|g| g.iter().filter_map(|v| v.as_str().map(String::from)).collect())
        .unwrap_or_default();
    identity_matches(expected, username, &groups).map_err(ProofError::WrongIdentity)
}

/// A client built from the candidate's parts alone, never from a kubeconfig: the server, trusted through exactly
/// the CA data, authenticating with exactly the client certificate and key. No proxy, no TLS override, no other
/// authentication (a token, an exec plugin) can be in it.
fn client(candidate: &Credential) -> Result<kube::Client, ProofError> {
    let url = candidate.server.parse::<http::Uri>().map_err(|_| ProofError::ClientConfig("server is not a URL"))?;
    let mut config = kube::Config::new(url);
    let roots: Vec<Vec<u8>> =
        CertificateDer::pem_slice_iter(&candidate.ca_pem).filter_map(Result::ok).map(|c| c.to_vec()).collect();
    config.root_cert = Some(roots);
    config.auth_info = serde_json::from_value::<AuthInfo>(serde_json::json!({
        "client-certificate-data": B64.encode(&candidate.cert_pem),
        "client-key-data": B64.encode(candidate.key_pem.expose()),
    }))
    .map_err(|_| ProofError::ClientConfig("client certificate"))?;
    config.connect_timeout = Some(TIMEOUT);
    config.read_timeout = Some(TIMEOUT);
    kube::Client::try_from(config).map_err(|_| ProofError::ClientConfig("TLS setup failed"))
}
