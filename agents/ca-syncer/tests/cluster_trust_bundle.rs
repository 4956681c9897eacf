//! A ClusterTrustBundle target on the test bed's real kube-apiserver (which serves certificates.k8s.io/v1 and runs
//! the ClusterTrustBundleAttest admission plugin), with only the Roles `ca-syncer rbac` renders: the bundle is
//! created with the configured signer, follows a CA change, and the token may write no other bundle.

mod common;

use std::path::Path;

use anyhow::Result;
use common::*;
use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use testbed::ControlPlane;
use testbed::agent_process::run_to_completion;
use testbed::certs::Ca;

const SIGNER: &str = "kcp-keeper.io/kcp-root-ca";

#[tokio::test]
async fn a_cluster_trust_bundle_gets_the_bundle_with_its_signer_and_follows_a_ca_change_with_the_rendered_roles()
-> Result<()> {
    let bed = ControlPlane::start().await?;
    // The API version the configuration writes is the one this apiserver serves.
    let served = bed.client().list_api_group_resources("certificates.k8s.io/v1").await?;
    assert!(served.resources.iter().any(|r| r.name == "clustertrustbundles"), "certificates.k8s.io/v1 serves it");

    let (agent_ns, src) = (bed.namespace().await?, bed.namespace().await?);
    // Unique per run: ClusterTrustBundles are cluster-scoped and the bed may be shared by other tests.
    let name = format!("kcp-keeper.io:kcp-root-ca:{src}");
    let root = Ca::new("kcp-root", YEAR)?;
    let sources = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(bed.client(), &src);
    sources.create(&Default::default(), &secret("root-ca", &[("ca.crt", &root.cert_pem())])).await?;
    let config = write_config(
        &bed,
        &format!(
            "resyncInterval: 1s\nbundles:\n- name: kcp\n  sources:\n  - secret: {{namespace: {src}, name: root-ca, key: ca.crt}}\n  targets:\n  - clusterTrustBundle: {{name: \"{name}\", signerName: {SIGNER}}}\n"
        ),
    )?;
    let args =
        ["rbac", "--config", &config.display().to_string(), "--namespace", &agent_ns, "--service-account", "ca-syncer"];
    let (code, rbac, stderr) = run_to_completion(Path::new(BINARY), &args)?;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(rbac.contains("attest") && rbac.contains(SIGNER), "{rbac}");
    apply_yaml(&bed.client(), &rbac).await?;
    let (kubeconfig, user) = bed.service_account_kubeconfig(&agent_ns, "ca-syncer").await?;
    let mut agent = agent(&bed, &config, &agent_ns).kubeconfig(&kubeconfig).spawn()?;
    agent.wait_ready(WAIT).await?;

    let bundles = Api::<ClusterTrustBundle>::all(bed.client());
    let written =
        testbed::eventually(WAIT, "the ClusterTrustBundle", || async { bundles.get_opt(&name).await.ok().flatten() })
            .await;
    assert_eq!(written.spec.signer_name.as_deref(), Some(SIGNER));
    assert_eq!(written.spec.trust_bundle.trim(), root.cert_pem().trim());

    // A new CA joins the sources: the bundle holds both (the old one stays until its notAfter).
    let next = Ca::new("kcp-root-next", YEAR)?;
    let both = format!("{}{}", next.cert_pem(), root.cert_pem());
    sources.patch("root-ca", &PatchParams::default(), &Patch::Merge(json!({"stringData": {"ca.crt": both}}))).await?;
    let updated = testbed::eventually(WAIT, "both CAs in the ClusterTrustBundle", || async {
        bundles
            .get_opt(&name)
            .await
            .ok()
            .flatten()
            .filter(|b| b.spec.trust_bundle.matches("BEGIN CERTIFICATE").count() == 2)
    })
    .await;
    assert!(updated.spec.trust_bundle.contains(next.cert_pem().trim()));

    // Nothing was refused, and the token cannot write a bundle of another name or for another signer.
    let requests = testbed::audit::by_user(&bed.apiserver.audit_log, &user)?;
    let refused: Vec<_> = requests.iter().filter(|r| r.code == Some(403)).collect();
    assert!(refused.is_empty(), "the agent was refused: {refused:?}");
    let token = Api::<ClusterTrustBundle>::all(testbed::apiserver::client_from_file(&kubeconfig).await?);
    let other = |name: &str, signer: &str| {
        json!({"apiVersion": "certificates.k8s.io/v1", "kind": "ClusterTrustBundle", "metadata": {"name": name},
               "spec": {"signerName": signer, "trustBundle": root.cert_pem()}})
    };
    let apply = PatchParams::apply("intruder");
    let elsewhere = format!("kcp-keeper.io:kcp-root-ca:other-{src}");
    let other_name = token.patch(&elsewhere, &apply, &Patch::Apply(other(&elsewhere, SIGNER))).await;
    assert!(matches!(other_name, Err(kube::Error::Api(ref s)) if s.code == 403), "{other_name:?}");
    let signer = format!("example.com:other:{src}");
    let other_signer = token.patch(&signer, &apply, &Patch::Apply(other(&signer, "example.com/other"))).await;
    assert!(matches!(other_signer, Err(kube::Error::Api(ref s)) if s.code == 403), "{other_signer:?}");

    assert!(agent.terminate(std::time::Duration::from_secs(10)).is_some_and(|st| st.success()));
    Ok(())
}
