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
use testbed::agent_process::{AgentProcess, AgentUnderTest};
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

pub const BINARY: &str = env!("CARGO_BIN_EXE_dns-rewriter");
/// Bound for anything the agent does on its own (start, a cycle, a reload); generous for a loaded machine.
pub const WAIT: Duration = Duration::from_secs(60);
/// How often the test's kubelet looks at a ConfigMap (the real one: its sync period plus cache TTL).
pub const PROJECTION: Duration = Duration::from_millis(500);
pub const K3S_CONFIGMAP: &str = "coredns-custom";
pub const COREFILE_CONFIGMAP: &str = "coredns";

/// Creates the empty `kube-system/coredns-custom`, as the chart does at install (the agent writes its key there
/// but never creates the ConfigMap).
pub async fn create_coredns_custom(client: kube::Client) -> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let cm = ConfigMap {
        metadata: ObjectMeta { name: Some(K3S_CONFIGMAP.into()), ..Default::default() },
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client, "kube-system").create(&PostParams::default(), &cm).await?;
    Ok(())
}

/// A real CoreDNS on a k3s-shaped Corefile whose `custom` directory is `kube-system/coredns-custom` (created
/// empty here), projected the kubelet way while the returned handle lives.
pub async fn k3s_coredns(bed: &ControlPlane, corefile: &str) -> Result<(CoreDns, testbed::projection::Following)> {
    create_coredns_custom(bed.client()).await?;
    let dns = bed.coredns(corefile).await?;
    let custom = dns.dir.join("custom");
    let following =
        testbed::projection::follow_configmap(bed.client(), "kube-system", K3S_CONFIGMAP, &custom, PROJECTION);
    Ok((dns, following))
}

/// A real CoreDNS on a kubeadm-shaped Corefile that lives in ConfigMap `kube-system/coredns` (key `Corefile`),
/// projected the kubelet way: CoreDNS reads `<dir>/Corefile`, a symlink into the projected volume, as it reads
/// `/etc/coredns/Corefile` in a pod. Returns the Corefile as first written, its server block key, and the handle.
pub async fn corefile_coredns(bed: &ControlPlane) -> Result<(CoreDns, String, String, testbed::projection::Following)> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let dns = bed.coredns(testbed::coredns::KUBEADM_COREFILE).await?;
    let original = std::fs::read_to_string(dns.dir.join("Corefile"))?;
    let data = BTreeMap::from([("Corefile".to_string(), original.clone())]);
    let cm = ConfigMap {
        metadata: ObjectMeta { name: Some(COREFILE_CONFIGMAP.into()), ..Default::default() },
        data: Some(data.clone()),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(bed.client(), "kube-system").create(&PostParams::default(), &cm).await?;
    let volume = dns.dir.join("volume");
    testbed::projection::project_strings(&volume, &data)?;
    let link = dns.dir.join("Corefile.link");
    std::os::unix::fs::symlink(volume.join("Corefile"), &link)?;
    std::fs::rename(&link, dns.dir.join("Corefile"))?;
    let following =
        testbed::projection::follow_configmap(bed.client(), "kube-system", COREFILE_CONFIGMAP, &volume, PROJECTION);
    let server = format!(".:{}", dns.port);
    Ok((dns, original, server, following))
}

/// The value of `key` in ConfigMap `kube-system/name`, and the ConfigMap's resourceVersion.
pub async fn configmap_key(client: &kube::Client, name: &str, key: &str) -> Option<(String, String)> {
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "kube-system")
        .get_opt(name)
        .await
        .ok()??;
    let rv = cm.metadata.resource_version.clone().unwrap_or_default();
    cm.data?.get(key).map(|v| (v.clone(), rv))
}

/// Writes `config` into a fresh directory of the bed; returns its path.
pub fn write_config(bed: &ControlPlane, config: &str) -> Result<std::path::PathBuf> {
    let path = bed.subdir("dns-rewriter")?.join("config.yaml");
    std::fs::write(&path, config)?;
    Ok(path)
}

/// `dns-rewriter run` as the admin, its Lease in `lease_ns` under identity `dns-rewriter-0`, ready within
/// [`WAIT`]: `.start().await` waits for ready, `.spawn()` does not.
pub fn agent<'a>(bed: &'a ControlPlane, lease_ns: &str, config: &Path) -> AgentUnderTest<'a> {
    AgentUnderTest::new(bed, BINARY, config).namespace(lease_ns).identity("dns-rewriter-0").ready_within(WAIT)
}

/// `dns_rewriter_reconcile_pass_timestamp_seconds`: when the last cycle finished.
pub async fn last_cycle(agent: &AgentProcess) -> f64 {
    agent.metric("dns_rewriter_reconcile_pass_timestamp_seconds ").await.expect("the cycle timestamp series")
}

/// Waits until `n` more cycles have finished after `since` (a cycle timestamp), each observed.
pub async fn wait_cycles(agent: &AgentProcess, since: f64, n: usize) -> f64 {
    let mut at = since;
    for _ in 0..n {
        let before = at;
        at = agent.wait_for_metric("dns_rewriter_reconcile_pass_timestamp_seconds ", WAIT, |v| v > before).await;
    }
    at
}

/// The Events about ConfigMap `kube-system/name`: (reason, note).
pub async fn events_about(client: &kube::Client, name: &str) -> Vec<(String, String)> {
    testbed::agent_process::events_about(client, "kube-system", name).await
}

/// Creates a kcp-operator object (validated by the operator's real CRDs, which the bed installs).
pub async fn create_operator_object(
    client: &kube::Client,
    ns: &str,
    kind: dns_rewriter::discovery::Kind,
    name: &str,
    spec: serde_json::Value,
) -> Result<()> {
    use kube::api::DynamicObject;
    let resource = dns_rewriter::cluster::api_resource(kind);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    let mut obj = DynamicObject::new(name, &resource);
    obj.data = serde_json::json!({ "spec": spec });
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

/// The operator's Services (its labels) and objects shaped like the seed's (tests/e2e/src/layout.rs), with
/// every field the real CRDs require: a root shard named by its virtual-workspace URL and certificate DNS
/// names, a shard by its URL, a front proxy by its external hostname (port 443, which its Service lacks).
/// Returns the explicit rules that say the same, as configuration YAML.
pub async fn seed_operator(client: &kube::Client, ns: &str) -> Result<String> {
    use dns_rewriter::discovery::Kind;
    use serde_json::json;
    for (name, component, instance) in [
        ("root-kcp", "rootshard", "root"),
        ("alpha-shard-kcp", "shard", "alpha"),
        ("frontproxy-front-proxy", "front-proxy", "frontproxy"),
    ] {
        let labels = [
            ("app.kubernetes.io/component", component),
            ("app.kubernetes.io/instance", instance),
            ("app.kubernetes.io/managed-by", "kcp-operator"),
        ];
        create_service(client, ns, name, &labels, false).await?;
    }
    let etcd = |name: &str| json!({"endpoints": [format!("http://{name}-etcd.kcp-system.svc.cluster.local:2379")]});
    let root = json!({
        "cache": {"embedded": {"enabled": true}},
        "certificates": {"issuerRef": {"kind": "Issuer", "name": "root-ca"}},
        "etcd": etcd("root"),
        "external": {"hostname": "kcp.example.com", "port": 443},
        "extraArgs": ["--shard-virtual-workspace-url=https://root.kcp.example.com:6443"],
        "certificateTemplates": {"server": {"spec": {"dnsNames": ["root.kcp.example.com", "kcp-root.example.com"]}}},
    });
    create_operator_object(client, ns, Kind::RootShard, "root", root).await?;
    let alpha = json!({
        "rootShard": {"ref": {"name": "root"}},
        "etcd": etcd("alpha"),
        "extraArgs": ["--shard-virtual-workspace-url=https://alpha.kcp.example.com:6443"],
    });
    create_operator_object(client, ns, Kind::Shard, "alpha", alpha).await?;
    let proxy =
        json!({"rootShard": {"ref": {"name": "root"}}, "external": {"hostname": "kcp.example.com", "port": 443}});
    create_operator_object(client, ns, Kind::FrontProxy, "frontproxy", proxy).await?;
    Ok(format!(
        "rules:\n\
         - {{host: kcp.example.com, service: {{namespace: {ns}, name: frontproxy-front-proxy}}, port: 443}}\n\
         - {{host: root.kcp.example.com, service: {{namespace: {ns}, name: root-kcp}}, port: 6443}}\n\
         - {{host: kcp-root.example.com, service: {{namespace: {ns}, name: root-kcp}}}}\n\
         - {{host: alpha.kcp.example.com, service: {{namespace: {ns}, name: alpha-shard-kcp}}, port: 6443}}\n"
    ))
}

/// A fresh test bed, a fresh namespace in it, and the admin's client.
pub async fn fresh_bed() -> Result<(ControlPlane, String, kube::Client)> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let client = bed.client();
    Ok((bed, ns, client))
}
