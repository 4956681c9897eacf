//! The node's cluster DNS as clusters run it: CoreDNS in a pod (a Deployment in kube-system behind the
//! `kube-dns` Service at [`CLUSTER_DNS_IP`], the kubelet's `clusterDNS`), so every pod that names no DNS server
//! resolves through it, dns-rewriter's rules included. Two forms, as the distributions ship it:
//!
//! - [`Form::K3s`] (the node starts with it): the Corefile imports `/etc/coredns/custom/*.override`, where the
//!   kubelet projects the optional ConfigMap `coredns-custom` (dns-rewriter's `k3s` mode writes there);
//! - [`Form::Kubeadm`]: the Corefile in the ConfigMap `coredns` and nothing imported (dns-rewriter's `corefile`
//!   mode edits that ConfigMap).
//!
//! Names outside the cluster domain go upstream to the node's resolver (CoreDNS on the node's address, as a
//! cloud network's resolver would be), which answers the seed's public names with their public edge
//! addresses and [`EXTERNAL_NAME`] with [`EXTERNAL_ADDRESS`], so a pod sees where a name goes without a rule.

use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use super::{NODE_IP, Node};
use crate::seed::layout::{EXTERNAL_HOST, SHARD_HOSTS};

/// The kube-dns Service's ClusterIP, the kubelet's `clusterDNS` (kube-dns's customary address, in the range's
/// static band, so no dynamically allocated Service takes it).
pub const CLUSTER_DNS_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// The CoreDNS image the node imports (built here from the peer; the name is ours, never pulled).
pub const COREDNS_IMAGE: &str = "kcp-keeper.test/coredns:peer";
/// The public name's address outside the cluster (TEST-NET-3): the edge, which pods must not be sent to.
pub const EDGE_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
/// A name no rule covers, answered by the upstream resolver alone.
pub const EXTERNAL_NAME: &str = "registry.upstream.example.net";
/// [`EXTERNAL_NAME`]'s address (TEST-NET-2).
pub const EXTERNAL_ADDRESS: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 53);

/// Which distribution's CoreDNS layout the cluster DNS has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    K3s,
    Kubeadm,
}

/// The cluster DNS's Corefile in `form`.
pub fn corefile(form: Form) -> String {
    let import = match form {
        Form::K3s => "    import /etc/coredns/custom/*.override\n",
        Form::Kubeadm => "",
    };
    format!(
        ".:53 {{\n    errors\n    health :8080\n    ready :8181\n    kubernetes cluster.local in-addr.arpa ip6.arpa {{\n        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n        ttl 5\n    }}\n{import}    forward . {NODE_IP}:53\n    cache 5 {{\n        disable success cluster.local\n        disable denial cluster.local\n    }}\n    loop\n    reload 2s 1s\n    loadbalance\n}}\n"
    )
}

/// The node's own resolver (the upstream of the cluster DNS) answers these, as public DNS would: the seed's public
/// names at the edge, and [`EXTERNAL_NAME`].
pub fn upstream_hosts() -> String {
    let mut lines = vec![format!("{EDGE_IP} {EXTERNAL_HOST}")];
    for (i, (_, host, _)) in SHARD_HOSTS.iter().enumerate() {
        lines.push(format!("{} {host}", Ipv4Addr::new(203, 0, 113, 11 + i as u8)));
    }
    lines.push(format!("{EXTERNAL_ADDRESS} {EXTERNAL_NAME}"));
    lines.join("\n        ")
}

/// Starts the cluster DNS in [`Form::K3s`] and waits for its pod to be Ready.
pub(super) async fn start(node: &Node, client: &kube::Client) -> Result<()> {
    let archive = super::image::single_binary_image(
        &node.dir,
        COREDNS_IMAGE,
        node.peers.path("coredns"),
        "coredns",
        "65532:65532",
    )?;
    node.import_image(&archive)?;
    let meta = json!({"name": "coredns", "namespace": "kube-system"});
    server_side(
        &Api::<ConfigMap>::namespaced(client.clone(), "kube-system"),
        "coredns",
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"Corefile": corefile(Form::K3s)}}),
    )
    .await?;
    server_side(
        &Api::<ServiceAccount>::namespaced(client.clone(), "kube-system"),
        "coredns",
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}),
    )
    .await?;
    // What the kubernetes plugin reads (as k3s's and kubeadm's system:coredns role grants).
    server_side(
        &Api::<ClusterRole>::all(client.clone()),
        "system:coredns",
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        }),
    )
    .await?;
    server_side(
        &Api::<ClusterRoleBinding>::all(client.clone()),
        "system:coredns",
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
            "subjects": [{"kind": "ServiceAccount", "namespace": "kube-system", "name": "coredns"}],
        }),
    )
    .await?;
    server_side(
        &Api::<Service>::namespaced(client.clone(), "kube-system"),
        "kube-dns",
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
            "spec": {
                "clusterIP": CLUSTER_DNS_IP.to_string(),
                "selector": {"k8s-app": "kube-dns"},
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": 53, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": 53, "protocol": "TCP"},
                ],
            },
        }),
    )
    .await?;
    server_side(&Api::<Deployment>::namespaced(client.clone(), "kube-system"), "coredns", deployment()).await?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), "kube-system");
    let ready = crate::eventually_seen(Duration::from_secs(120), "the cluster DNS pod (CoreDNS) Ready", || async {
        let status = deployments.get("coredns").await.ok().and_then(|d| d.status);
        let ready = status.as_ref().and_then(|s| s.ready_replicas);
        Ok(if ready == Some(1) { Ok(()) } else { Err(format!("{status:?}")) })
    })
    .await;
    ready.map_err(|e| {
        let log = std::fs::read_to_string(node.dir.join("logs/kubelet.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        e.context(format!("kubelet's last lines: {tail:#?}"))
    })
}

/// The cluster DNS pod's address (one of the kube-dns Service's endpoints): where a host-network client sends
/// what it would send the Service (the node's own network has no route to the Service range).
pub async fn pod_address(client: &kube::Client) -> Result<String> {
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), "kube-system")
        .list(&kube::api::ListParams::default().labels("k8s-app=kube-dns"))
        .await?;
    pods.items.into_iter().find_map(|p| p.status?.pod_ip).context("the cluster DNS pod has no address")
}

/// Switches the cluster DNS to `form` (its ConfigMap's Corefile; CoreDNS reloads it once the kubelet has
/// projected it).
pub async fn set_form(client: &kube::Client, form: Form) -> Result<()> {
    let object = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "coredns", "namespace": "kube-system"},
        "data": {"Corefile": corefile(form)},
    });
    server_side(&Api::<ConfigMap>::namespaced(client.clone(), "kube-system"), "coredns", object).await
}

/// The CoreDNS Deployment, as kubeadm's manifest runs it (not root, read-only root filesystem, no capabilities;
/// port 53 through the pod's own `ip_unprivileged_port_start`, a safe sysctl).
fn deployment() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "coredns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
            "template": {
                "metadata": {"labels": {"k8s-app": "kube-dns"}},
                "spec": {
                    "serviceAccountName": "coredns",
                    "dnsPolicy": "Default",
                    "priorityClassName": "system-cluster-critical",
                    "securityContext": {
                        "runAsNonRoot": true,
                        "seccompProfile": {"type": "RuntimeDefault"},
                        "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "53"}],
                    },
                    "containers": [{
                        "name": "coredns",
                        "image": COREDNS_IMAGE,
                        "imagePullPolicy": "Never",
                        "args": ["-conf", "/etc/coredns/Corefile"],
                        "ports": [
                            {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                            {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                        ],
                        // CoreDNS's own manifest's probes (a 5 s timeout): with the 1 s default, a node starved for
                        // seconds restarted the cluster DNS under the tests.
                        "livenessProbe": {
                            "httpGet": {"path": "/health", "port": 8080},
                            "initialDelaySeconds": 60, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 5,
                        },
                        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2, "timeoutSeconds": 5},
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "volumeMounts": [
                            {"name": "config", "mountPath": "/etc/coredns", "readOnly": true},
                            {"name": "custom", "mountPath": "/etc/coredns/custom", "readOnly": true},
                        ],
                    }],
                    "volumes": [
                        {"name": "config", "configMap": {"name": "coredns", "items": [{"key": "Corefile", "path": "Corefile"}]}},
                        {"name": "custom", "configMap": {"name": "coredns-custom", "optional": true}},
                    ],
                },
            },
        },
    })
}

async fn server_side<K>(api: &Api<K>, name: &str, object: Value) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::apply("kcp-keeper-testbed").force(), &Patch::Apply(object))
        .await
        .with_context(|| format!("applying {name}"))?;
    Ok(())
}

/// NodeLocal DNSCache's interception in iptables mode, as node-cache's own `-setupiptables` and dummy interface
/// set it up (neither works in this bed: no `dummy` link type, no iptables in node-cache's image): each address on
/// the node's loopback, and DNS to and from it exempt from connection tracking (`raw` NOTRACK), so kube-proxy's
/// DNAT of the kube-dns ClusterIP never applies and a host-network node-cache bound to that address answers the
/// pods that keep it as their nameserver. Undone when dropped.
pub struct Intercepted<'a> {
    node: &'a Node,
    rules: Vec<Vec<String>>,
    _addresses: Vec<super::netpol::LocalAddress<'a>>,
}

/// Intercepts DNS to `addresses` on the node ([`Intercepted`]).
pub fn intercept<'a>(node: &'a Node, addresses: &[Ipv4Addr]) -> Result<Intercepted<'a>> {
    let mut intercepted = Intercepted { node, rules: Vec::new(), _addresses: Vec::new() };
    for ip in addresses {
        intercepted._addresses.push(node.add_local_address(*ip)?);
        for proto in ["udp", "tcp"] {
            let ip = format!("{ip}/32");
            for (table, chain, dir, port) in [
                ("raw", "PREROUTING", "-d", "--dport"),
                ("raw", "OUTPUT", "-d", "--dport"),
                ("raw", "OUTPUT", "-s", "--sport"),
                ("filter", "INPUT", "-d", "--dport"),
                ("filter", "OUTPUT", "-s", "--sport"),
            ] {
                let target = if table == "raw" { "NOTRACK" } else { "ACCEPT" };
                let rule: Vec<String> =
                    [chain, dir, &ip, "-p", proto, port, "53", "-j", target].iter().map(|s| s.to_string()).collect();
                let mut add = vec!["-w".to_string(), "-t".into(), table.into(), "-I".into()];
                add.extend(rule.iter().cloned());
                node.run_inside("iptables -I", &[std::path::Path::new("iptables")], &add)?;
                let mut delete = vec!["-w".to_string(), "-t".into(), table.into(), "-D".into()];
                delete.extend(rule);
                intercepted.rules.push(delete);
            }
        }
    }
    super::progress(&format!("DNS to {addresses:?} answered on the node (NodeLocal DNSCache, iptables mode)"));
    Ok(intercepted)
}

impl Drop for Intercepted<'_> {
    fn drop(&mut self) {
        for rule in self.rules.drain(..).rev() {
            if let Err(e) = self.node.run_inside("iptables -D", &[std::path::Path::new("iptables")], &rule) {
                eprintln!("testbed: node: removing the rule {rule:?}: {e:#}");
            }
        }
    }
}
