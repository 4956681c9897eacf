//! Helpers shared by the dns-rewriter tests against the real test bed.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use dns_rewriter::hostname::{Domain, Hostname};
use dns_rewriter::rules::{RuleSet, ServiceRef, Target};
use hickory_resolver::proto::rr::{RData, RecordType};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use kube::api::{Api, ObjectMeta, PostParams};
use testbed::{ControlPlane, CoreDns};

pub fn domain() -> Domain {
    Domain::parse("cluster.local").unwrap()
}

/// Creates a Service with one port (6443) and optional labels; the apiserver allocates its ClusterIP
/// (`headless` asks for `clusterIP: None`). Returns the ClusterIP (None when headless).
pub async fn create_service(
    client: &kube::Client,
    ns: &str,
    name: &str,
    labels: &[(&str, &str)],
    headless: bool,
) -> Result<Option<IpAddr>> {
    let svc = Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: headless.then(|| "None".to_string()),
            ports: Some(vec![ServicePort { name: Some("https".into()), port: 6443, ..Default::default() }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .with_context(|| format!("creating Service {ns}/{name}"))?;
    let ip = created.spec.and_then(|s| s.cluster_ip).context("the apiserver sets clusterIP")?;
    Ok(if headless { None } else { Some(ip.parse()?) })
}

/// A rule set from (public name, namespace, Service, ClusterIP).
pub fn rules(entries: &[(&str, &str, &str, IpAddr)]) -> RuleSet {
    let mut set = RuleSet::new();
    for (host, ns, name, ip) in entries {
        let target = Target { service: ServiceRef::parse(ns, name).unwrap(), cluster_ip: Some(*ip) };
        set.insert(Hostname::parse(host).unwrap(), target).unwrap();
    }
    set
}

/// The A records CoreDNS answers for `name`: (owner name without the trailing dot, address). Empty when
/// it answers no record (NXDOMAIN, REFUSED, SERVFAIL).
pub async fn answers(dns: &CoreDns, name: &str) -> Vec<(String, IpAddr)> {
    let resolver = dns_rewriter::verify::resolver(SocketAddr::from(([127, 0, 0, 1], dns.port)), Duration::from_secs(2))
        .expect("a resolver");
    let Ok(lookup) = resolver.lookup(format!("{name}.").as_str(), RecordType::A).await else { return Vec::new() };
    lookup
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some((r.name.to_ascii().trim_end_matches('.').to_string(), IpAddr::V4(a.0))),
            _ => None,
        })
        .collect()
}

/// Waits (bounded) until `name` answers exactly `expected` under `name` itself.
pub async fn wait_answer(dns: &CoreDns, name: &str, expected: IpAddr, timeout: Duration) {
    let want = vec![(name.to_string(), expected)];
    let what = format!("{name} to answer {expected} under its own name");
    testbed::eventually(timeout, &what, || {
        let want = want.clone();
        async move {
            let got = answers(dns, name).await;
            (got == want).then_some(())
        }
    })
    .await;
}

/// Waits (bounded) until `name` answers no record.
pub async fn wait_no_answer(dns: &CoreDns, name: &str, timeout: Duration) {
    testbed::eventually(timeout, &format!("{name} to stop answering"), || async move {
        answers(dns, name).await.is_empty().then_some(())
    })
    .await;
}

/// Starts CoreDNS on `corefile` after projecting `custom` (key -> content) into its `custom` directory the
/// kubelet way, so the files are there when CoreDNS first reads its configuration.
pub async fn coredns_with(bed: &ControlPlane, corefile: &str, custom: &BTreeMap<String, String>) -> Result<CoreDns> {
    let dir = bed.subdir("coredns")?;
    testbed::projection::project_strings(&dir.join("custom"), custom)?;
    CoreDns::start(bed.peers.path("coredns"), &dir, corefile, &bed.apiserver.admin_kubeconfig).await
}

/// Where the test bed's kubeconfig is, for the binary.
pub fn kubeconfig(bed: &ControlPlane) -> &Path {
    &bed.apiserver.admin_kubeconfig
}
