//! NodeLocal DNSCache against the real `node-cache` (kubernetes/dns 1.26.7, the `node-cache` peer), run as a
//! host process on a loopback address without its dummy interface and iptables rules (this kernel has no dummy
//! interfaces; `-setupinterface=false -setupiptables=false`). Its Corefile is kubeadm's `node-local-dns` shape,
//! held in ConfigMap `kube-system/node-local-dns` on the test bed's apiserver and projected the kubelet way
//! to the file node-cache reads as its base Corefile; node-cache fills `__PILLAR__CLUSTER__DNS__` from
//! `$KUBE_DNS_SERVICE_HOST`, the cluster DNS: a real CoreDNS (kubeadm-shaped, its Corefile in
//! `kube-system/coredns`, also projected) on port 53 of another loopback address. A third CoreDNS plays the
//! node's upstream resolver, answering the public name with the edge address, as the internet would.

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use common::*;
use dns_rewriter::hostname::Hostname;
use dns_rewriter::node_local;
use dns_rewriter::verify;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use testbed::process::Process;
use testbed::{ControlPlane, CoreDns};

/// What the node's upstream resolver answers for the public name: the edge (a TLS-terminating load balancer).
const EDGE: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 7);
const HOST: &str = "kcp-root.example.com";
const NODE_LOCAL_CONFIGMAP: &str = "node-local-dns";

/// Three loopback addresses of this test's own (node-local-dns, the cluster DNS, the upstream): the process id
/// keeps two test runs side by side apart, and a count the tests of this binary, which run at once. CoreDNS binds
/// port 53 with SO_REUSEPORT, so a second test on the same address would not fail to start: the kernel would
/// split the queries between two tests' servers.
fn addresses() -> (Ipv4Addr, Ipv4Addr, Ipv4Addr) {
    static CALLS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    assert!(n < 8, "eight sets of addresses per binary at most");
    let pid = std::process::id();
    let (a, b) = ((pid >> 8) as u8, (pid & 0xff) as u8);
    let base = |last: u8| Ipv4Addr::new(127, a.wrapping_add(100) | 0x40, b, last + n);
    (base(10), base(20), base(30))
}

/// node-local-dns's Corefile as kubeadm deploys it in IPVS mode, at the test's addresses and ports.
fn node_local_corefile(local: Ipv4Addr, upstream: Ipv4Addr, metrics: u16, health: u16) -> String {
    testbed::coredns::node_local_corefile(
        &local.to_string(),
        &upstream.to_string(),
        &format!("{local}:{metrics}"),
        &format!("{local}:{health}"),
    )
}

/// A resolver that asks only `ip:53`.
fn resolver_at(ip: Ipv4Addr) -> Result<hickory_resolver::TokioResolver> {
    verify::resolver(SocketAddr::new(IpAddr::V4(ip), 53), Duration::from_secs(2))
}

/// Waits until `ip:53` answers `host` with exactly `expected`.
async fn wait_through(ip: Ipv4Addr, host: &str, expected: IpAddr, timeout: Duration) -> Result<()> {
    let resolver = resolver_at(ip)?;
    let host = Hostname::parse(host)?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let check = verify::check_one(&resolver, &host, Some(expected)).await;
        if check.outcome == verify::Outcome::Match {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{ip} still answers {host:?} with {:?} ({}), not {expected}",
            check.answered,
            check.outcome
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Creates ConfigMap `kube-system/name` with `Corefile`, projects it into `volume` the kubelet way and keeps
/// it projected while the handle lives.
async fn projected_corefile(
    client: &kube::Client,
    name: &str,
    corefile: &str,
    volume: &Path,
) -> Result<testbed::projection::Following> {
    let data = BTreeMap::from([("Corefile".to_string(), corefile.to_string())]);
    let cm = ConfigMap {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        data: Some(data.clone()),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system").create(&PostParams::default(), &cm).await?;
    testbed::projection::project_strings(volume, &data)?;
    Ok(testbed::projection::follow_configmap(client.clone(), "kube-system", name, volume, PROJECTION))
}

/// The cluster DNS: kubeadm-shaped, on `ip:53`, its Corefile the projected `kube-system/coredns` (CoreDNS reads
/// a symlink into the volume, as `/etc/coredns/Corefile` in its pod).
async fn cluster_dns(bed: &ControlPlane, ip: Ipv4Addr) -> Result<(CoreDns, String, testbed::projection::Following)> {
    let corefile = format!(
        ".:53 {{
    errors
    bind {ip}
    ready 127.0.0.1:{{{{ready_port}}}}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {{{{kubeconfig}}}} testbed
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    reload 2s 1s
}}
"
    );
    let dir = bed.subdir("cluster-dns")?;
    let dns = CoreDns::start(bed.peers.path("coredns"), &dir, &corefile, kubeconfig(bed)).await?;
    let written = std::fs::read_to_string(dir.join("Corefile"))?;
    let volume = dir.join("volume");
    let following = projected_corefile(&bed.client(), COREFILE_CONFIGMAP, &written, &volume).await?;
    let link = dir.join("Corefile.link");
    std::os::unix::fs::symlink(volume.join("Corefile"), &link)?;
    std::fs::rename(&link, dir.join("Corefile"))?;
    Ok((dns, written, following))
}

/// The node's upstream resolver: answers the public name with the edge address.
async fn upstream_dns(bed: &ControlPlane, ip: Ipv4Addr) -> Result<CoreDns> {
    let corefile = format!(
        ".:53 {{\n    bind {ip}\n    ready 127.0.0.1:{{{{ready_port}}}}\n    hosts {{\n        {EDGE} {HOST}\n    }}\n}}\n"
    );
    CoreDns::start(bed.peers.path("coredns"), &bed.subdir("upstream-dns")?, &corefile, kubeconfig(bed)).await
}

/// node-cache on `local`, its base Corefile the projected `kube-system/node-local-dns`, the cluster DNS found
/// as node-cache finds it in a pod (`$KUBE_DNS_SERVICE_HOST`, the `kube-dns` Service's environment variable).
fn node_cache(bed: &ControlPlane, dir: &Path, local: Ipv4Addr, cluster: Ipv4Addr, metrics: u16) -> Result<Process> {
    let args = [
        format!("-localip={local}"),
        "-setupinterface=false".into(),
        "-setupiptables=false".into(),
        "-skipteardown".into(),
        // A reload at once when node-cache rewrites the Corefile, instead of the reload plugin's 30 s.
        "-reloadwithsignal".into(),
        format!("-basecorefile={}", dir.join("volume/Corefile").display()),
        format!("-conf={}", dir.join("Corefile").display()),
        format!("-metrics-listen-address={local}:{metrics}"),
    ];
    let cluster = cluster.to_string();
    Process::start_with_env(
        "node-cache",
        bed.peers.path("node-cache"),
        args.to_vec(),
        &[("KUBE_DNS_SERVICE_HOST", cluster.as_str())],
        dir.join("node-cache.log"),
    )
}

fn agent_config(ns: &str, cluster: Ipv4Addr, rules: &str) -> String {
    format!(
        "mode: corefile\ncorefile: {{serverBlock: '.:53'}}\nverify: {{resolver: '{cluster}:53', settle: 60s}}\nresyncInterval: 10s\nrules:\n{rules}",
    )
    .replace("{ns}", ns)
}

#[tokio::test]
async fn behind_node_local_dns_the_public_name_answers_the_edge_before_the_agent_and_the_service_after_it() -> Result<()>
{
    let (bed, ns, client) = fresh_bed().await?;
    let root = create_service(&client, &ns, "root-kcp", &[], false).await?.context("a ClusterIP")?;
    let (local, cluster, upstream) = addresses();
    let (_cluster_dns, _, _kubelet) = cluster_dns(&bed, cluster).await?;
    let _upstream_dns = upstream_dns(&bed, upstream).await?;

    let dir = bed.subdir("node-local-dns")?;
    let (metrics, health) = (testbed::process::free_port()?, testbed::process::free_port()?);
    let original = node_local_corefile(local, upstream, metrics, health);
    let _node_kubelet = projected_corefile(&client, NODE_LOCAL_CONFIGMAP, &original, &dir.join("volume")).await?;
    let mut cache = node_cache(&bed, &dir, local, cluster, metrics)?;

    // Before the agent: node-local-dns sends the public name to the upstream, which answers the edge.
    let before = wait_through(local, HOST, IpAddr::V4(EDGE), WAIT).await;
    if before.is_err() {
        let log = std::fs::read_to_string(dir.join("node-cache.log")).unwrap_or_default();
        eprintln!("node-cache log:\n{log}");
    }
    before?;
    ensure!(cache.wait_exit(Duration::ZERO).is_none(), "node-cache is running");

    let rule = format!("- {{host: {HOST}, service: {{namespace: {ns}, name: root-kcp}}}}\n");
    let path = write_config(&bed, &agent_config(&ns, cluster, &rule))?;
    let agent = agent(&bed, &ns, &path).start().await?;
    agent.wait_for_metric("dns_rewriter_node_local_dns_detected ", WAIT, |v| v == 1.0).await;
    // Verified means every resolver a pod can be given answered the ClusterIP: the cluster DNS and node-cache.
    agent.wait_for_metric(&format!("dns_rewriter_host_verified{{host=\"{HOST}\"}}"), WAIT * 2, |v| v == 1.0).await;
    wait_through(local, HOST, root, WAIT).await?;
    ensure!(agent.metric("dns_rewriter_node_local_dns_write_timestamp_seconds ").await? > 0.0);

    let (written, _) = configmap_key(&client, NODE_LOCAL_CONFIGMAP, "Corefile").await.context("node-local-dns")?;
    assert_eq!(node_local::removed(&written)?, original, "every byte outside our block is the original's");
    assert!(written.contains(&format!("{HOST}:53 {{\n")), "{written}");
    assert!(written.contains("    forward . __PILLAR__CLUSTER__DNS__ {\n"), "{written}");
    let events = testbed::agent_process::events_about(&client, "kube-system", NODE_LOCAL_CONFIGMAP).await;
    assert!(events.iter().any(|(reason, _)| reason == "NodeLocalDnsWritten"), "{events:?}");

    // Without the rule (reloaded live) the block goes, byte for byte, and the name answers the edge again.
    std::fs::write(&path, agent_config(&ns, cluster, ""))?;
    testbed::eventually(Duration::from_secs(60), "node-local-dns's Corefile to be the original again", || async {
        let (now, _) = configmap_key(&client, NODE_LOCAL_CONFIGMAP, "Corefile").await?;
        (now == original).then_some(())
    })
    .await;
    wait_through(local, HOST, IpAddr::V4(EDGE), WAIT).await?;
    ensure!(cache.wait_exit(Duration::ZERO).is_none(), "node-cache is still running");
    Ok(())
}

#[tokio::test]
async fn a_node_local_dns_corefile_the_agent_cannot_read_is_refused_with_a_reason_and_the_cluster_dns_is_written()
-> Result<()> {
    let (bed, ns, client) = fresh_bed().await?;
    let root = create_service(&client, &ns, "root-kcp", &[], false).await?.context("a ClusterIP")?;
    let (local, cluster, upstream) = addresses();
    let (_cluster_dns, original_coredns, _kubelet) = cluster_dns(&bed, cluster).await?;
    // An interface name in `bind` is not a word the agent reads: nothing may be guessed into this Corefile.
    let unreadable =
        node_local_corefile(local, upstream, 9253, 8080).replacen(&format!("bind {local} "), "bind lo ", 1);
    let data = BTreeMap::from([("Corefile".to_string(), unreadable.clone())]);
    let cm = ConfigMap {
        metadata: ObjectMeta { name: Some(NODE_LOCAL_CONFIGMAP.into()), ..Default::default() },
        data: Some(data),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system").create(&PostParams::default(), &cm).await?;

    let rule = format!("- {{host: {HOST}, service: {{namespace: {ns}, name: root-kcp}}}}\n");
    let path = write_config(&bed, &agent_config(&ns, cluster, &rule))?;
    let agent = agent(&bed, &ns, &path).start().await?;
    agent.wait_for_metric("dns_rewriter_reconcile_errors_total{reason=\"node_local_dns\"}", WAIT, |v| v >= 1.0).await;
    // The cluster DNS's rules are written regardless, and answer.
    wait_through(cluster, HOST, root, WAIT).await?;
    let (coredns, _) = configmap_key(&client, COREFILE_CONFIGMAP, "Corefile").await.context("coredns")?;
    assert_ne!(coredns, original_coredns, "the cluster DNS's Corefile got its block");
    let (now, _) = configmap_key(&client, NODE_LOCAL_CONFIGMAP, "Corefile").await.context("node-local-dns")?;
    assert_eq!(now, unreadable, "nothing written into a Corefile the agent cannot read");
    let events = testbed::agent_process::events_about(&client, "kube-system", NODE_LOCAL_CONFIGMAP).await;
    assert!(
        events.iter().any(|(reason, note)| reason == "NodeLocalDnsNotWritten" && note.contains("bind")),
        "{events:?}"
    );
    Ok(())
}
