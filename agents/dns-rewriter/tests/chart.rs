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
    // A replica can be ready as a follower before it takes the Lease (tests/daemon.rs): wait for the leader's
    // first verified cycle rather than read it once.
    for host in HOSTS {
        let series = format!("dns_rewriter_host_verified{{host=\"{host}\"}}");
        agent.wait_for_metric(&series, WAIT, |v| v == 1.0).await;
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

/// The chart's pre-delete hook: rendered with the release's values, the Job is accepted by the real apiserver
/// (the bed has no kubelet, so it never runs here; the real node's tests can run it), and what it runs,
/// `dns-rewriter cleanup` with the chart's ServiceAccount and rendered configuration, removes the agent's key
/// from `coredns-custom` with the chart's Roles alone (no request refused), leaving the ConfigMap.
#[tokio::test]
async fn the_charts_cleanup_hook_is_accepted_and_cleanup_and_render_with_the_charts_account_need_no_more_rights()
-> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let release_ns = bed.namespace().await?;
    let client = bed.client();
    create_service(&client, &ns, "root-kcp", &[], false).await?;
    create_coredns_custom(client.clone()).await?;
    let values = format!(
        "replicas: 1\ndnsRewriter:\n  enabled: true\n  config:\n    mode: k3s\n    rules:\n    - {{host: kcp-root.example.com, service: {{namespace: {ns}, name: root-kcp}}}}\n    discovery: null\n    verify: {{resolver: '127.0.0.1:9'}}\n"
    );
    testbed::helm::install(&bed, &release_ns, &values)?;
    let values_file = bed.subdir("hook")?.join("values.yaml");
    std::fs::write(&values_file, &values)?;
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/kcp-keeper");
    let rendered = std::process::Command::new(bed.peers.path("helm"))
        .args(["template", "kcp-keeper"])
        .arg(&chart)
        .args(["--namespace", &release_ns, "--kube-version", "1.37.2", "--show-only"])
        .arg("templates/dns-rewriter-cleanup.yaml")
        .arg("--values")
        .arg(&values_file)
        .output()?;
    assert!(rendered.status.success(), "{}", String::from_utf8_lossy(&rendered.stderr));
    let job = String::from_utf8(rendered.stdout)?;
    assert!(job.contains("\"helm.sh/hook\": pre-delete") && job.contains("args: [cleanup]"), "{job}");
    let mut create = std::process::Command::new(bed.peers.path("kubectl"))
        .args(["create", "-f", "-", "--kubeconfig"])
        .arg(&bed.apiserver.admin_kubeconfig)
        .stdin(std::process::Stdio::piped())
        .output_with(job.as_bytes())?;
    assert!(create.status.success(), "the apiserver refused the hook Job: {}", String::from_utf8_lossy(&create.stderr));
    create.stdout.clear();

    // The agent's key, as the agent writes it, then cleanup with the chart's account.
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
    let patch = serde_json::json!({"data": {"kcp-split-horizon.override": "# Managed by kcp-keeper\n"}});
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .patch(K3S_CONFIGMAP, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
        .await?;
    let (code, _, stderr) = testbed::agent_process::run_to_completion(
        std::path::Path::new(BINARY),
        &["cleanup", "--kubeconfig", &kubeconfig.display().to_string(), "--config", &config.display().to_string()],
    )?;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(configmap_key(&client, K3S_CONFIGMAP, "kcp-split-horizon.override").await.is_none(), "the key is gone");
    let kept = Api::<ConfigMap>::namespaced(client.clone(), "kube-system").get_opt(K3S_CONFIGMAP).await?;
    assert!(kept.is_some(), "the ConfigMap stays");
    // The one-shots an operator runs in the agent's pod (`kubectl exec ... render`) read the rules' Services
    // with the daemon's rights: list, never get.
    let (code, stdout, stderr) = testbed::agent_process::run_to_completion(
        std::path::Path::new(BINARY),
        &["render", "--kubeconfig", &kubeconfig.display().to_string(), "--config", &config.display().to_string()],
    )?;
    assert_eq!(code, Some(0), "render with the chart's account: {stderr}");
    assert!(stdout.contains("kcp-root.example.com"), "{stdout}");
    let requests = testbed::audit::by_user(&bed.apiserver.audit_log, &user)?;
    assert!(requests.iter().any(|r| r.resource == "configmaps" && r.verb == "patch"), "its write is logged");
    assert!(!requests.iter().any(|r| r.code == Some(403)), "the chart's Roles refused cleanup or render: {requests:?}");
    Ok(())
}

trait OutputWith {
    fn output_with(&mut self, stdin: &[u8]) -> std::io::Result<std::process::Output>;
}

impl OutputWith for std::process::Command {
    /// Runs to completion with `stdin` as its standard input.
    fn output_with(&mut self, stdin: &[u8]) -> std::io::Result<std::process::Output> {
        let mut child = self.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn()?;
        std::io::Write::write_all(&mut child.stdin.take().expect("piped"), stdin)?;
        child.wait_with_output()
    }
}
