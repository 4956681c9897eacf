//! ca-syncer as the Helm chart (charts/kcp-keeper) deploys it: `helm install` into the test bed's apiserver,
//! then the agent binary runs locally with a token minted for the ServiceAccount the chart created and the
//! configuration file the chart rendered into its ConfigMap (the bed has no kubelet, so the chart's pod never
//! runs). It does its job with only the chart's Roles, the apiserver refuses it nothing, and the same token
//! reads no Secret the configuration does not name; a read-once consumer is rolled with those Roles. Every ca_syncer_ metric the chart's alerts read is in its
//! `/metrics`.

mod common;

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use kube::api::{Api, PostParams};
use testbed::ControlPlane;
use testbed::certs::Ca;

const ACCOUNT: &str = "kcp-keeper-ca-syncer";

/// A kubeconfig with a TokenRequest token for the chart's ServiceAccount.
async fn chart_account_kubeconfig(bed: &ControlPlane, namespace: &str) -> Result<(std::path::PathBuf, String)> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
        ..Default::default()
    };
    let minted = Api::<ServiceAccount>::namespaced(bed.client(), namespace)
        .create_token_request(ACCOUNT, &PostParams::default(), &request)
        .await
        .context("TokenRequest for the chart's ServiceAccount")?;
    let token = minted.status.and_then(|s| s.token).context("no token")?;
    let user = format!("system:serviceaccount:{namespace}:{ACCOUNT}");
    Ok((bed.apiserver.token_kubeconfig(&user, &token)?, user))
}

#[tokio::test]
async fn installed_by_the_chart_it_syncs_with_the_chart_roles_and_its_token_reads_nothing_else() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let (release_ns, src, dst) = (bed.namespace().await?, bed.namespace().await?, bed.namespace().await?);
    let root = Ca::new("kcp-root", YEAR)?;
    let sources = Api::<Secret>::namespaced(bed.client(), &src);
    sources.create(&PostParams::default(), &secret("root-server-ca", &[("ca.crt", &root.cert_pem())])).await?;
    sources.create(&PostParams::default(), &secret("unlisted", &[("token", "not for ca-syncer")])).await?;
    // A second bundle whose source holds a private key: rejected, so the alerts' error series exist too.
    let with_key = format!("{}{}", root.cert_pem(), root.key_pem());
    sources.create(&PostParams::default(), &secret("with-key", &[("ca.crt", &with_key)])).await?;

    let values = format!(
        "replicas: 1\ndnsRewriter: {{enabled: false}}\ncaSyncer:\n  enabled: true\n  config:\n    resyncInterval: 1s\n    bundles:\n    - name: kcp\n      sources:\n      - secret: {{namespace: {src}, name: root-server-ca, key: ca.crt}}\n      targets:\n      - secret: {{namespace: {dst}, name: kcp-ca, key: ca.crt, restartDeployments: [hub]}}\n    - name: bad\n      sources:\n      - secret: {{namespace: {src}, name: with-key, key: ca.crt}}\n      targets:\n      - secret: {{namespace: {dst}, name: bad-ca, key: ca.crt}}\n"
    );
    // A read-once consumer of the bundle: rolled with the chart's Roles (get/patch on it by name).
    let hub: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hub"},
        "spec": {
            "selector": {"matchLabels": {"app": "hub"}},
            "template": {"metadata": {"labels": {"app": "hub"}}, "spec": {"containers": [{"name": "hub", "image": "hub"}]}},
        },
    }))?;
    let deployments = Api::<Deployment>::namespaced(bed.client(), &dst);
    deployments.create(&PostParams::default(), &hub).await?;
    testbed::helm::install(&bed, &release_ns, &values)?;
    let rendered = Api::<ConfigMap>::namespaced(bed.client(), &release_ns).get(ACCOUNT).await?;
    let config = write_config(&bed, &rendered.data.context("ConfigMap data")?["config.yaml"])?;
    let (kubeconfig, user) = chart_account_kubeconfig(&bed, &release_ns).await?;

    let mut agent =
        agent(&bed, &config, &release_ns).identity("kcp-keeper-ca-syncer-0").kubeconfig(&kubeconfig).spawn()?;
    agent.wait_ready(WAIT).await?;
    let bundle = key(&bed.client(), &dst, "kcp-ca", "ca.crt").await.expect("the target is written");
    assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), 1);
    let record =
        Api::<ConfigMap>::namespaced(bed.client(), &release_ns).get(&ca_syncer::state::object_name("kcp")).await?;
    assert!(record.data.is_some(), "the rotation record is written in the release namespace");

    let keys = ca_syncer::consumers::keys("kcp");
    let hash = ca_syncer::consumers::content_hash(&bundle);
    testbed::eventually(WAIT, "the consumer rolled for the bundle", || async {
        let d = deployments.get_opt("hub").await.ok()??;
        (kcp_keeper_runtime::consumer_restart::restarted_for(&d, &keys)? == hash).then_some(())
    })
    .await;

    // Every ca_syncer_ metric the chart's alerts read is in this agent's real /metrics.
    agent
        .wait_for_metric("ca_syncer_source_errors_total{bundle=\"bad\",reason=\"private_key\"}", WAIT, |v| v >= 1.0)
        .await;
    let alerting = testbed::alert_rules::metric_names(&["common.rules.yaml", "ca-syncer.rules.yaml"], "ca_syncer_")?;
    assert!(alerting.len() >= 5, "{alerting:?}");
    let missing = testbed::alert_rules::missing_from(&alerting, &agent.metrics().await);
    assert!(missing.is_empty(), "alerts read metrics this agent does not export: {missing:?}");

    let requests = testbed::audit::by_user(&bed.apiserver.audit_log, &user)?;
    assert!(requests.iter().any(|r| r.resource == "secrets" && r.verb == "watch"), "the agent's requests are logged");
    let refused: Vec<_> = requests.iter().filter(|r| r.code == Some(403)).collect();
    assert!(refused.is_empty(), "the chart's Roles refused the agent: {refused:?}");

    let token = testbed::apiserver::client_from_file(&kubeconfig).await?;
    let got = Api::<Secret>::namespaced(token.clone(), &src).get("unlisted").await;
    assert!(matches!(got, Err(kube::Error::Api(ref s)) if s.code == 403), "a Secret beside the source: {got:?}");
    let listed = Api::<Secret>::namespaced(token, &src).list(&Default::default()).await;
    assert!(matches!(listed, Err(kube::Error::Api(ref s)) if s.code == 403), "listing without a name: {listed:?}");

    assert!(agent.terminate(std::time::Duration::from_secs(10)).is_some_and(|st| st.success()));
    Ok(())
}
