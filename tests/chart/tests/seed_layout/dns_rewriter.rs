//! dns-rewriter, in its pod, discovering the public names from the kcp-operator's real objects (the FrontProxy's
//! `spec.external`, each shard's server certificate names) and the Services the operator made for them, writing
//! k3s's `coredns-custom`, which CoreDNS in a pod imports; a pod then resolves every name to its Service's fixed
//! ClusterIP.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use chart::dns_on_node::lookup_from_a_pod;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::Api;
use testbed::node;
use testbed::seed::layout::{EXTERNAL_HOST, FRONT_PROXY_IP, NAMESPACE, SHARD_HOSTS};

/// Each public name, the Service the operator made for its object, and that Service's fixed ClusterIP.
fn wanted() -> [(&'static str, &'static str, &'static str); 3] {
    [
        (EXTERNAL_HOST, "frontproxy-front-proxy", FRONT_PROXY_IP),
        (SHARD_HOSTS[0].1, "root-kcp", SHARD_HOSTS[0].2),
        (SHARD_HOSTS[1].1, "alpha-shard-kcp", SHARD_HOSTS[1].2),
    ]
}

#[tokio::test]
async fn dns_rewriter_discovers_the_public_names_from_the_operators_objects_and_a_pod_resolves_each_to_its_services_fixed_cluster_ip()
-> Result<()> {
    // The layout as installed: not while upgrade.rs rolls alpha to another tag.
    let _layout = crate::LAYOUT_CHANGES.read().await;
    crate::keeper();
    let node = node::shared();
    let client = node.client().await?;
    let services = Api::<Service>::namespaced(client.clone(), NAMESPACE);
    for (_, service, ip) in wanted() {
        let cluster_ip = services.get(service).await?.spec.and_then(|s| s.cluster_ip);
        ensure!(cluster_ip.as_deref() == Some(ip), "Service {service}: ClusterIP {cluster_ip:?}, not {ip}");
    }
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
    let snippet = testbed::eventually(Duration::from_secs(120), "every discovered name in coredns-custom", || async {
        let cm = config_maps.get_opt("coredns-custom").await.ok()??;
        let snippet = cm.data?.get("kcp-split-horizon.override").cloned()?;
        wanted().iter().all(|(host, ..)| snippet.contains(&format!(" {host}. "))).then_some(snippet)
    })
    .await;
    for (host, service, _) in wanted() {
        let rule = format!("rewrite name exact {host}. {service}.{NAMESPACE}.svc.cluster.local.");
        ensure!(snippet.contains(&rule), "no `{rule}` in:\n{snippet}");
    }
    // From a pod, through CoreDNS's Service: the shipped `dns-rewriter check` asks for every name.
    let answered = lookup_from_a_pod(node, &client).await?;
    for (host, _, ip) in wanted() {
        let line = answered
            .lines()
            .find(|l| l.starts_with(&format!("{host} ")))
            .with_context(|| format!("no line for {host}:\n{answered}"))?;
        let columns: Vec<&str> = line.split_whitespace().collect();
        ensure!(columns.get(1) == Some(&ip), "{host}: expected {ip}:\n{answered}");
        ensure!(columns.get(2) == Some(&ip), "{host}: answered other than {ip}:\n{answered}");
    }
    eprintln!("{answered}");
    Ok(())
}
