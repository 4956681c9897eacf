//! Proofs that the test bed runs real kcp the way kcp-operator lays it out: a root shard and `alpha`, each on its
//! own etcd, behind a front proxy. One kcp serves every test in this binary ([`testbed::kcp::shared`]); each test
//! that writes works in a workspace of its own.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use testbed::kcp::pki::{ADMIN_GROUP, ADMIN_USER};
use testbed::kcp::{self, client_from_yaml};
use x509_parser::prelude::{FromDer, X509Certificate};

fn host_port(url: &str) -> &str {
    url.trim_start_matches("https://")
}

/// The DER subject of the first certificate in a PEM bundle.
fn subject_der(pem: &str) -> Vec<u8> {
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).expect("a certificate").to_vec();
    let (_, cert) = X509Certificate::from_der(&der).expect("parses");
    cert.subject().as_raw().to_vec()
}

#[tokio::test]
async fn every_shard_and_the_front_proxy_answer_readyz_ok() -> Result<()> {
    let kcp = kcp::shared();
    let _logs = kcp.logs_on_failure();
    for shard in &kcp.shards {
        let client = testbed::apiserver::client_from_file(&shard.admin_kubeconfig).await?;
        let body = client.request_text(http::Request::get("/readyz").body(Vec::new())?).await?;
        assert_eq!(body, "ok", "{} shard /readyz", shard.name);
    }
    let client = kcp.admin_client("root").await?;
    let body = client.request_text(http::Request::get("/readyz").body(Vec::new())?).await?;
    assert_eq!(body, "ok", "front proxy /readyz");
    eprintln!("kcp bed became ready in {:.1?}", kcp.ready_in);
    Ok(())
}

#[tokio::test]
async fn kcp_reports_the_pinned_version() -> Result<()> {
    let kcp = kcp::shared();
    let _logs = kcp.logs_on_failure();
    let client = testbed::apiserver::client_from_file(&kcp.shard("root").admin_kubeconfig).await?;
    let version = client.apiserver_version().await?;
    assert!(version.git_version.ends_with("+kcp-v0.32.3"), "root shard /version: {}", version.git_version);
    Ok(())
}

#[tokio::test]
async fn admin_client_certificate_through_the_front_proxy_is_the_certificates_user_and_groups() -> Result<()> {
    let kcp = kcp::shared();
    let _logs = kcp.logs_on_failure();
    let client = kcp.admin_client("root").await?;
    let review = serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let body = serde_json::to_vec(&review)?;
    let text = kcp::retry_bad_gateway(|| {
        let req = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
            .header("content-type", "application/json")
            .body(body.clone())
            .expect("a valid request");
        client.request_text(req)
    })
    .await?;
    let answer: serde_json::Value = serde_json::from_str(&text)?;
    let user = &answer["status"]["userInfo"];
    assert_eq!(user["username"], ADMIN_USER, "{answer}");
    let groups: Vec<&str> = user["groups"].as_array().into_iter().flatten().filter_map(|g| g.as_str()).collect();
    assert!(groups.contains(&ADMIN_GROUP) && groups.contains(&"system:authenticated"), "groups: {groups:?}");
    Ok(())
}

#[tokio::test]
async fn anonymous_request_through_the_front_proxy_is_refused() -> Result<()> {
    let kcp = kcp::shared();
    let _logs = kcp.logs_on_failure();
    let ca = kcp.pki.server_ca_bundle();
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fp\n  cluster:\n    server: {}/clusters/root\n    certificate-authority-data: {}\nusers:\n- name: anonymous\n  user: {{}}\ncontexts:\n- name: fp\n  context:\n    cluster: fp\n    user: anonymous\ncurrent-context: fp\n",
        kcp.front_proxy.url,
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, ca),
    );
    let anonymous = client_from_yaml(&yaml).await?;
    let err = Api::<ConfigMap>::default_namespaced(anonymous).list(&Default::default()).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 401 || s.code == 403), "expected 401/403, got {err}");
    Ok(())
}

#[tokio::test]
async fn workspace_on_alpha_is_served_by_alpha_and_stored_only_in_alphas_etcd() -> Result<()> {
    let kcp = kcp::shared();
    let _logs = kcp.logs_on_failure();
    let ws = kcp.workspace("alpha").await?;
    // Writes into the workspace through the front proxy land on the shard that holds it.
    let client = kcp.admin_client(&ws.path).await?;
    let cm =
        ConfigMap { metadata: ObjectMeta { name: Some("proof".into()), ..Default::default() }, ..Default::default() };
    let configmaps = Api::<ConfigMap>::namespaced(client, "default");
    let params = PostParams::default();
    match kcp::retry_bad_gateway(|| configmaps.create(&params, &cm)).await {
        Ok(_) => {}
        // 409: a retried create whose first attempt did reach the shard.
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }

    let on_alpha = kcp.etcd_keys_containing("alpha", &ws.cluster)?;
    assert!(
        on_alpha.iter().any(|k| k.ends_with(&format!("/{}/default/proof", ws.cluster))),
        "alpha's etcd holds the workspace's ConfigMap: {on_alpha:?}"
    );
    let on_root = kcp.etcd_keys_containing("root", &ws.cluster)?;
    assert!(
        !on_root.iter().any(|k| k.contains("configmaps") || k.contains("logicalclusters")),
        "root's etcd holds none of the workspace's objects: {on_root:?}"
    );
    Ok(())
}

#[tokio::test]
async fn workspace_on_root_is_stored_only_in_roots_etcd() -> Result<()> {
    let kcp = kcp::shared();
    let _logs = kcp.logs_on_failure();
    let ws = kcp.workspace("root").await?;
    let on_root = kcp.etcd_keys_containing("root", &ws.cluster)?;
    assert!(on_root.iter().any(|k| k.contains("logicalclusters")), "root's etcd holds its LogicalCluster: {on_root:?}");
    let on_alpha = kcp.etcd_keys_containing("alpha", &ws.cluster)?;
    assert!(on_alpha.is_empty(), "alpha's etcd holds nothing of it: {on_alpha:?}");
    Ok(())
}

#[tokio::test]
async fn front_proxy_chain_verifies_with_the_server_ca_bundle_and_not_with_an_unrelated_ca() -> Result<()> {
    let kcp = kcp::shared();
    let _logs = kcp.logs_on_failure();
    let addr = host_port(&kcp.front_proxy.url);
    testbed::tls::handshake(addr, "127.0.0.1", &kcp.pki.server_ca_bundle(), None).await?;
    // The root alone also verifies: the front proxy sends the intermediate with its certificate.
    testbed::tls::handshake(addr, "127.0.0.1", &kcp.pki.root_ca.cert_pem(), None).await?;
    let unrelated = testbed::certs::Ca::new("unrelated-ca", Duration::from_secs(3600))?;
    let err = testbed::tls::handshake(addr, "127.0.0.1", &unrelated.cert_pem(), None).await.unwrap_err();
    assert!(format!("{err:#}").contains("UnknownIssuer"), "expected an unknown issuer, got {err:#}");
    Ok(())
}

#[tokio::test]
async fn front_proxy_advertises_only_its_client_ca_and_rustls_still_authenticates() -> Result<()> {
    let kcp = kcp::shared();
    let _logs = kcp.logs_on_failure();
    let admin = kcp.pki.client(ADMIN_USER, &[ADMIN_GROUP], Duration::from_secs(3600))?;
    let shown = testbed::tls::handshake(
        host_port(&kcp.front_proxy.url),
        "127.0.0.1",
        &kcp.pki.server_ca_bundle(),
        Some(&admin),
    )
    .await?;
    let client_ca = std::fs::read_to_string(&kcp.front_proxy.client_ca_file)?;
    assert_eq!(shown.acceptable_client_cas, vec![subject_der(&client_ca)], "only the --client-ca-file bundle's CA");
    for other in [&kcp.pki.front_proxy_client_ca, &kcp.pki.root_ca, &kcp.pki.server_ca] {
        assert!(!shown.acceptable_client_cas.contains(&subject_der(&other.cert_pem())));
    }
    // kube + rustls send the client certificate whatever the server lists, and the front proxy accepts it.
    let client = kcp.admin_client("root").await?;
    Api::<ConfigMap>::namespaced(client, "default").list(&Default::default()).await?;
    Ok(())
}
