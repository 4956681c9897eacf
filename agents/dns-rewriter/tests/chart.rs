//! dns-rewriter as the Helm chart (charts/kcp-keeper) deploys it: `helm install` into the test bed's
//! apiserver, then the agent binary runs locally with a token minted for the ServiceAccount the chart created
//! and the configuration file the chart rendered into its ConfigMap (the bed has no kubelet, so the chart's pod
//! never runs; the values point the resolver at the bed's loopback CoreDNS). It discovers the hostnames, writes
//! its one ConfigMap, CoreDNS answers every host, and the apiserver refuses it nothing. Every dns_rewriter_
//! metric the chart's alerts read is in its `/metrics`.

mod common;

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::api::{Api, PostParams};
use testbed::ControlPlane;
use testbed::audit::Request;
use testbed::coredns::K3S_COREFILE;

const ACCOUNT: &str = "kcp-keeper-dns-rewriter";
const HOSTS: [&str; 4] = ["alpha.kcp.example.com", "kcp-root.example.com", "kcp.example.com", "root.kcp.example.com"];

#[tokio::test]
async fn installed_by_the_chart_it_writes_its_configmap_with_the_chart_roles_and_coredns_answers() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let release_ns = bed.namespace().await?;
    let client = bed.client();
    seed_operator(&client, &ns).await?;
    let (dns, _kubelet) = k3s_coredns(&bed, K3S_COREFILE).await?;

    let values = format!(
        "replicas: 1\ndnsRewriter:\n  enabled: true\n  config:\n    mode: k3s\n    discovery: {{namespace: {ns}, rootShards: true, shards: true, frontProxies: true}}\n    verify: {{resolver: '127.0.0.1:{}', settle: 60s}}\n    resyncInterval: 10s\n",
        dns.port
    );
    testbed::helm::install(&bed, &release_ns, &values)?;
    let rendered = Api::<ConfigMap>::namespaced(client.clone(), &release_ns).get(ACCOUNT).await?;
    let config = write_config(&bed, &rendered.data.context("ConfigMap data")?["config.yaml"])?;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
        ..Default::default()
    };
    let minted = Api::<ServiceAccount>::namespaced(client.clone(), &release_ns)
        .create_token_request(ACCOUNT, &PostParams::default(), &request)
        .await?;
    let token = minted.status.and_then(|s| s.token).context("no token")?;
    let user = format!("system:serviceaccount:{release_ns}:{ACCOUNT}");
    let kubeconfig = bed.apiserver.token_kubeconfig(&user, &token)?;

    let mut agent =
        agent(&bed, &release_ns, &config).kubeconfig(&kubeconfig).identity("kcp-keeper-dns-rewriter-0").start().await?;
    for host in HOSTS {
        let series = format!("dns_rewriter_host_verified{{host=\"{host}\"}}");
        assert_eq!(agent.metric(&series).await?, 1.0, "{host}");
    }
    configmap_key(&client, K3S_CONFIGMAP, "kcp-split-horizon.override").await.context("the key is written")?;
    // Every dns_rewriter_ metric the chart's alerts read is in this agent's real /metrics.
    let alerting =
        testbed::alert_rules::metric_names(&["common.rules.yaml", "dns-rewriter.rules.yaml"], "dns_rewriter_")?;
    assert!(alerting.len() >= 4, "{alerting:?}");
    let missing = testbed::alert_rules::missing_from(&alerting, &agent.metrics().await);
    assert!(missing.is_empty(), "alerts read metrics this agent does not export: {missing:?}");

    let requests = testbed::audit::by_user(&bed.apiserver.audit_log, &user)?;
    assert!(requests.iter().any(|r| r.resource == "configmaps" && r.verb == "patch"), "its write is logged");
    let refused: Vec<&Request> = requests.iter().filter(|r| r.code == Some(403)).collect();
    assert!(refused.is_empty(), "the chart's Roles refused the agent: {refused:?}");
    assert!(!requests.iter().any(|r| r.resource == "secrets"), "no Secret is ever read");

    assert!(agent.terminate(std::time::Duration::from_secs(10)).is_some_and(|st| st.success()));
    Ok(())
}
