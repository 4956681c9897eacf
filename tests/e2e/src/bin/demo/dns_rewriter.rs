//! What dns-rewriter does in the demo: the kcp public names answer, inside the cluster, with their Services'
//! ClusterIPs. The demo's CoreDNS runs on k3s's Corefile shape; `kube-system/coredns-custom` is projected into
//! its `custom` directory the kubelet way, and the agent writes its key there. The rules come from the seeded
//! Services (explicit rules, as the seed's shards carry no virtual-workspace URL) and from discovery of the
//! operator's objects (the FrontProxy's external hostname). The summary lists each name and the address
//! CoreDNS itself answered, queried on loopback.

use std::time::Duration;

use anyhow::{Context, Result};
use e2e::layout::{KCP_NAMESPACE, SERVICES};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use testbed::CoreDns;
use testbed::agent_process::AgentProcess;
use testbed::projection::{Following, follow_configmap};

const CONFIGMAP: &str = "coredns-custom";

pub fn config(dns_port: u16) -> String {
    let rules: String = SERVICES
        .iter()
        .map(|s| {
            format!(
                "- {{host: {}, service: {{namespace: {KCP_NAMESPACE}, name: {}}}, port: 6443}}\n",
                s.public_hostname, s.name
            )
        })
        .collect();
    format!(
        "mode: k3s\nrules:\n{rules}discovery: {{namespace: {KCP_NAMESPACE}, rootShards: true, shards: true, frontProxies: true}}\n\
         verify: {{resolver: '127.0.0.1:{dns_port}', settle: 60s}}\n"
    )
}

/// What the chart and the kubelet do: create the empty `kube-system/coredns-custom` and keep it projected into
/// CoreDNS's `custom` directory while the returned handle lives.
pub async fn prepare(bed: &testbed::ControlPlane, dns: &CoreDns) -> Result<Following> {
    let cm =
        ConfigMap { metadata: ObjectMeta { name: Some(CONFIGMAP.into()), ..Default::default() }, ..Default::default() };
    Api::<ConfigMap>::namespaced(bed.client(), "kube-system").create(&PostParams::default(), &cm).await?;
    let custom = dns.dir.join("custom");
    Ok(follow_configmap(bed.client(), "kube-system", CONFIGMAP, &custom, Duration::from_millis(500)))
}

/// Waits for the agent's first successful cycle, then asks CoreDNS for every public name: each must answer its
/// Service's ClusterIP, and the agent's own verification must agree.
pub async fn cycle(dns: &CoreDns, agent: &mut AgentProcess) -> Result<String> {
    agent.wait_ready(Duration::from_secs(90)).await?;
    let mut answered = Vec::new();
    for svc in SERVICES {
        let got = dns.resolve_a(svc.public_hostname).await?;
        let got: Vec<String> = got.iter().map(ToString::to_string).collect();
        anyhow::ensure!(
            got == [svc.cluster_ip],
            "{} answered {got:?}, expected {} (Service {})",
            svc.public_hostname,
            svc.cluster_ip,
            svc.name
        );
        let series = format!("dns_rewriter_host_verified{{host=\"{}\"}}", svc.public_hostname);
        let verified = agent.metric(&series).await.with_context(|| format!("the agent's {series}"))?;
        anyhow::ensure!(verified == 1.0, "the agent reports {} not verified", svc.public_hostname);
        answered.push(format!("{} -> {}", svc.public_hostname, got.join(",")));
    }
    Ok(format!(
        "CoreDNS (127.0.0.1:{}) answers {} with the Services' ClusterIPs, from rules in kube-system/{CONFIGMAP}",
        dns.port,
        answered.join(", ")
    ))
}
