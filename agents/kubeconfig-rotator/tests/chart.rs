//! kubeconfig-rotator as the Helm chart (charts/kcp-keeper) deploys it: `helm install` into the test bed's
//! apiserver, then the agent binary runs locally with a token minted for the ServiceAccount the chart created and
//! the configuration file the chart rendered into its ConfigMap (the bed has no kubelet, so the chart's pod never
//! runs). With only the chart's Roles it does its whole job against the real cert-manager controller and
//! kcp-operator (host processes, testbed::operators) and real kcp: publishes a proven kubeconfig, forces an
//! overdue renewal, nudges the stale render, publishes the renewed certificate and restarts the consumer; the apiserver refuses it nothing, and the same token reads no Secret
//! the configuration does not name. Every kubeconfig_rotator_ metric the chart's alerts read is in its `/metrics`.

mod common;

use std::time::Duration;

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use kubeconfig_rotator::credential;
use serde_json::json;
use testbed::agent_process::AgentUnderTest;

const ACCOUNT: &str = "kcp-keeper-kubeconfig-rotator";

async fn generation(layout: &Layout, name: &str) -> i64 {
    let d = Api::<Deployment>::namespaced(layout.bed.client(), &layout.dst).get(name).await.expect("the consumer");
    d.metadata.generation.unwrap_or_default()
}

#[tokio::test]
async fn installed_by_the_chart_it_renews_proves_publishes_and_restarts_with_the_chart_roles_and_reads_nothing_else()
-> Result<()> {
    let mut layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    // cert-manager renews this certificate on its own only 5 s before its end: the renewal the agent forces once
    // less than its renewBefore (100 s of 120 s) is left comes long before.
    layout.operator("2m", Some("5s")).await?;
    let client = layout.bed.client();
    let hub: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "hub"},
        "spec": {"selector": {"matchLabels": {"app": "hub"}},
                 "template": {"metadata": {"labels": {"app": "hub"}}, "spec": {"containers": [{"name": "hub", "image": "hub"}]}}},
    }))?;
    Api::<Deployment>::namespaced(client.clone(), &layout.dst).create(&PostParams::default(), &hub).await?;
    Api::<Secret>::namespaced(client.clone(), &layout.src)
        .create(&PostParams::default(), &secret("unlisted", &[("kubeconfig", b"not for the rotator")]))
        .await?;

    let (src, dst) = (&layout.src, &layout.dst);
    let values = format!(
        "replicas: 1\ndnsRewriter: {{enabled: false}}\nkubeconfigRotator:\n  enabled: true\n  config:\n    resyncInterval: 5s\n    kubeconfigs:\n    - name: {KUBECONFIG}\n      source: {{kubeconfig: {{namespace: {src}, name: {KUBECONFIG}, renderedSecret: {RENDERED}, serverCA: {{namespace: {src}, name: root-server-ca, key: tls.crt}}}}}}\n      renewBefore: 100s\n      targets:\n      - {{namespace: {dst}, name: {TARGET}, key: {TARGET_KEY}, restartDeployments: [hub]}}\n"
    );
    testbed::helm::install(&layout.bed, &layout.agent, &values)?;
    let rendered = Api::<ConfigMap>::namespaced(client.clone(), &layout.agent).get(ACCOUNT).await?;
    let config = layout.write_config(&rendered.data.context("ConfigMap data")?["config.yaml"])?;
    let (kubeconfig, user) = testbed::helm::chart_account_kubeconfig(&layout.bed, &layout.agent, ACCOUNT).await?;
    let mut agent = AgentUnderTest::new(&layout.bed, BINARY, &config)
        .namespace(&layout.agent)
        .identity("kcp-keeper-kubeconfig-rotator-0")
        .kubeconfig(&kubeconfig)
        .ready_within(WAIT)
        .start()
        .await?;

    let first = testbed::eventually(WAIT, "the first publication", || async { layout.target_serial().await }).await;
    let published = key(&layout.target().await.context("target")?, TARGET_KEY).context("target key")?;
    assert_eq!(self_subject_review(&published).await?, testbed::kcp::pki::ADMIN_USER, "kcp accepts what was published");
    // Less than renewBefore is left after 20 s: forced renewal (certificates/status), nudge (the Kubeconfig),
    // the renewed certificate published (the target Secret) and the consumer restarted (its Deployment).
    let cert_name = kubeconfig_rotator::config::certificate_name(KUBECONFIG);
    let sources = Api::<Secret>::namespaced(client.clone(), src);
    let renewed = testbed::eventually(Duration::from_secs(90), "a forced renewal to be issued", || async {
        let s = sources.get_opt(&cert_name).await.ok()??;
        let serial = credential::cert_info(&key(&s, "tls.crt")?).ok()?.serial;
        (serial != first).then_some(serial)
    })
    .await;
    testbed::eventually(WAIT, "the target to carry the renewed certificate", || async {
        layout.target_serial().await.filter(|s| *s == renewed)
    })
    .await;
    testbed::eventually(WAIT, "the consumer restarted for the renewed content", || async {
        (generation(&layout, "hub").await >= 3).then_some(())
    })
    .await;
    assert!(!layout.events(src, "RenewalForced").await.is_empty(), "an Event says the renewal was forced");

    // Every kubeconfig_rotator_ metric the chart's alerts read is in this agent's real /metrics.
    let alerting = testbed::alert_rules::metric_names(
        &["common.rules.yaml", "kubeconfig-rotator.rules.yaml"],
        "kubeconfig_rotator_",
    )?;
    assert!(alerting.len() >= 5, "{alerting:?}");
    let missing = testbed::alert_rules::missing_from(&alerting, &testbed::scrape::metrics(&agent).await);
    assert!(missing.is_empty(), "alerts read metrics this agent does not export: {missing:?}");

    let requests = testbed::audit::by_user(&layout.bed.apiserver.audit_log, &user)?;
    for (resource, verb) in
        [("secrets", "patch"), ("kubeconfigs", "patch"), ("certificates", "patch"), ("deployments", "patch")]
    {
        assert!(requests.iter().any(|r| r.resource == resource && r.verb == verb), "{verb} {resource} is logged");
    }
    let refused: Vec<_> = requests.iter().filter(|r| r.code == Some(403)).collect();
    assert!(refused.is_empty(), "the chart's Roles refused the agent: {refused:?}");

    let token = testbed::apiserver::client_from_file(&kubeconfig).await?;
    let got = Api::<Secret>::namespaced(token.clone(), src).get("unlisted").await;
    assert!(matches!(got, Err(kube::Error::Api(ref s)) if s.code == 403), "a Secret beside the source: {got:?}");
    let listed = Api::<Secret>::namespaced(token, dst).list(&Default::default()).await;
    assert!(matches!(listed, Err(kube::Error::Api(ref s)) if s.code == 403), "listing without a name: {listed:?}");

    let status = agent.terminate(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "exit after SIGTERM: {status:?}");
    testbed::assert_no_secret_material(&agent.process.log(), &[]);
    Ok(())
}
