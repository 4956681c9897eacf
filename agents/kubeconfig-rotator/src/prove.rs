//! Proof that a candidate works: a SelfSubjectReview sent with the candidate itself to the server it will be
//! published with (for kcp, `<front proxy>/clusters/<workspace>`: kcp serves the review per workspace). The
//! answer must be 201 with the expected user and the expected groups among the reported ones. Then each configured
//! right (`verify.rights`) is asked with a SelfSubjectAccessReview, with the candidate, at its server moved to the
//! right's workspace: an identity whose group lost a binding proves who it is but not what it may do.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use kube::config::AuthInfo;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::config::Right;
use crate::credential::Credential;
use crate::policy::{Expected, identity_matches};

const REVIEW_PATH: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
const ACCESS_REVIEW_PATH: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
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
    /// Authenticated as expected, but a SelfSubjectAccessReview denies a configured right (named from the
    /// configuration, never from the candidate).
    #[error("missing right: {0}")]
    MissingRight(String),
}

/// Sends the review with `candidate` and checks the identity it proves.
pub async fn prove(candidate: &Credential, expected: &Expected) -> Result<(), ProofError> {
    let client = client_at(candidate, &candidate.server)?;
    let review = serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let answer = send(&client, REVIEW_PATH, review).await?;
    let user = &answer["status"]["userInfo"];
    let username = user["username"].as_str().ok_or(ProofError::BadAnswer)?;
    let groups: Vec<String> = user["groups"]
        .as_array()
        .map(|g| g.iter().filter_map(|v| v.as_str().map(String::from)).collect())
        .unwrap_or_default();
    identity_matches(expected, username, &groups).map_err(ProofError::WrongIdentity)?;
    for right in &expected.rights {
        prove_right(candidate, right).await?;
    }
    Ok(())
}

/// One SelfSubjectAccessReview with the candidate, at its server moved to the right's workspace (kcp answers
/// access reviews per workspace).
async fn prove_right(candidate: &Credential, right: &Right) -> Result<(), ProofError> {
    let at = match &right.workspace {
        Some(ws) => format!("{}/clusters/{ws}", base_of(&candidate.server)),
        None => candidate.server.clone(),
    };
    let client = client_at(candidate, &at)?;
    let answer = send(&client, ACCESS_REVIEW_PATH, access_review(right)).await?;
    match answer["status"]["allowed"].as_bool() {
        Some(true) => Ok(()),
        Some(false) => Err(ProofError::MissingRight(right.to_string())),
        None => Err(ProofError::BadAnswer),
    }
}

/// The SelfSubjectAccessReview asking for `right`: its namespace and object name when configured (empty ones
/// mean every namespace and every object, which a RoleBinding or a Role with resourceNames does not grant).
fn access_review(right: &Right) -> serde_json::Value {
    let (resource, subresource) = right.resource.split_once('/').unwrap_or((&right.resource, ""));
    serde_json::json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {
            "verb": right.verb, "group": right.group, "resource": resource, "subresource": subresource,
            "namespace": right.namespace.as_deref().unwrap_or_default(), "name": right.name.as_deref().unwrap_or_default(),
        }},
    })
}

/// Posts `review` to `path`, mapping every failure to a reason that carries nothing from the candidate.
async fn send(client: &kube::Client, path: &str, review: serde_json::Value) -> Result<serde_json::Value, ProofError> {
    let body = serde_json::to_vec(&review).map_err(|_| ProofError::BadAnswer)?;
    let request = http::Request::post(path)
        .header("content-type", "application/json")
        .body(body)
        .map_err(|_| ProofError::ClientConfig("request"))?;
    match tokio::time::timeout(TIMEOUT, client.request(request)).await {
        Err(_) => Err(ProofError::Unreachable),
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(kube::Error::Api(status))) if status.code == 401 => Err(ProofError::Refused),
        Ok(Err(kube::Error::Api(status))) => Err(ProofError::UnexpectedStatus(status.code)),
        Ok(Err(_)) => Err(ProofError::Unreachable),
    }
}

/// `https://host:port` of `https://host:port/path`.
fn base_of(server: &str) -> &str {
    let rest = server.strip_prefix("https://").unwrap_or(server);
    match rest.find('/') {
        Some(i) => &server[..server.len() - rest.len() + i],
        None => server,
    }
}

/// A client built from the candidate's parts alone, never from a kubeconfig: `server` (the candidate's, or it in
/// another workspace), trusted through exactly the CA data, authenticating with exactly the client certificate and
/// key. No proxy, no TLS override, no other authentication (a token, an exec plugin) can be in it.
fn client_at(candidate: &Credential, server: &str) -> Result<kube::Client, ProofError> {
    let url = server.parse::<http::Uri>().map_err(|_| ProofError::ClientConfig("server is not a URL"))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_of_a_server_drops_only_its_path() {
        assert_eq!(base_of("https://fp:6443/clusters/root"), "https://fp:6443");
        assert_eq!(base_of("https://fp:6443"), "https://fp:6443");
    }

    #[test]
    fn a_missing_right_names_verb_resource_group_and_workspace() {
        let right = |group: &str, workspace: Option<&str>| Right {
            verb: "get".into(),
            resource: "workspaces".into(),
            group: group.into(),
            workspace: workspace.map(String::from),
            namespace: None,
            name: None,
        };
        let e = ProofError::MissingRight(right("tenancy.kcp.io", Some("root:org")).to_string());
        assert_eq!(e.to_string(), "missing right: get workspaces.tenancy.kcp.io in workspace root:org");
        assert_eq!(right("", None).to_string(), "get workspaces at the kubeconfig's server");
    }

    #[test]
    fn an_access_review_asks_in_the_rights_namespace_for_its_object_or_else_everywhere() {
        let mut right = Right {
            verb: "get".into(),
            resource: "deployments/scale".into(),
            group: "apps".into(),
            workspace: None,
            namespace: Some("team-a".into()),
            name: Some("hub".into()),
        };
        let asked = &access_review(&right)["spec"]["resourceAttributes"];
        assert_eq!(
            (&asked["namespace"], &asked["name"], &asked["resource"], &asked["subresource"]),
            (&"team-a".into(), &"hub".into(), &"deployments".into(), &"scale".into())
        );
        (right.namespace, right.name) = (None, None);
        let asked = &access_review(&right)["spec"]["resourceAttributes"];
        assert_eq!((&asked["namespace"], &asked["name"]), (&"".into(), &"".into()));
    }
}
