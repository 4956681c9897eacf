//! Lookups from a pod through the node's cluster DNS (CoreDNS in a pod, `testbed::node::cluster_dns`) with the
//! shipped `dns-rewriter check`, and node-local-dns in front of it: shared by the node tests and the seed layout's (both install the chart
//! into [`crate::NAMESPACE`], where the agent's ConfigMap `kcp-keeper-dns-rewriter` is).

use std::time::Duration;

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use serde_json::{Value, json};
use testbed::node::{self, Node};

use crate::NAMESPACE;
use crate::on_node::{create, version};

/// The ClusterIP of the node's cluster DNS (CoreDNS in a pod behind `kube-dns`, the kubelet's `clusterDNS`:
/// `testbed::node::cluster_dns`, in k3s form unless a test switches it).
pub const COREDNS_IP: &str = "10.96.0.10";

/// The ServiceAccount `name` with the rights `dns-rewriter check` needs (a Role and RoleBinding of that name in
/// kcp-system): its own, so a probe pod never borrows the agent's.
pub async fn dns_check_account(client: &kube::Client, name: &str) -> Result<()> {
    create::<k8s_openapi::api::core::v1::ServiceAccount>(client, NAMESPACE, json!({"metadata": {"name": name}}))
        .await?;
    create::<Role>(
        client,
        "kcp-system",
        json!({"metadata": {"name": name}, "rules": [
            {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list"]},
            // The chart's default configuration discovers names from the operator's objects too.
            {"apiGroups": ["operator.kcp.io"], "resources": ["rootshards", "shards", "frontproxies"], "verbs": ["list"]},
        ]}),
    )
    .await?;
    create::<RoleBinding>(
        client,
        "kcp-system",
        json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "namespace": NAMESPACE, "name": name}],
        }),
    )
    .await
}

/// A restricted pod `name` running the shipped `dns-rewriter check` with the agent's configuration against
/// `resolver` (`ip:port`), as the ServiceAccount `account`, restarted on failure.
pub fn dns_check_pod(name: &str, account: &str, resolver: &str) -> Result<Value> {
    Ok(json!({
        "metadata": {"name": name},
        "spec": {
            "serviceAccountName": account,
            "restartPolicy": "OnFailure",
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "check",
                "image": format!("ghcr.io/kcp-keeper/dns-rewriter:{}", version()?),
                "imagePullPolicy": "Never",
                "args": ["check", "--config", "/etc/kcp-keeper/config.yaml", "--resolver", resolver],
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [{"name": "config", "mountPath": "/etc/kcp-keeper", "readOnly": true}],
            }],
            "volumes": [{"name": "config", "configMap": {"name": "kcp-keeper-dns-rewriter"}}],
        },
    }))
}

/// A pod asks the CoreDNS Service for every configured name: the shipped `dns-rewriter check` (its image, the
/// agent's ConfigMap mounted), run until it passes (`restartPolicy: OnFailure`); its output.
///
/// Not `kubectl exec` into the agent's pod: `check` reads each rule's Service with a `get`, which the agent's
/// Role (list and watch, what the daemon uses) does not grant, so it runs under a ServiceAccount of its own
/// (get and list on Services where the rules point).
pub async fn lookup_from_a_pod(node: &Node, client: &kube::Client) -> Result<String> {
    dns_check_account(client, "dns-probe").await?;
    let pod = dns_check_pod("dns-probe", "dns-probe", &format!("{COREDNS_IP}:53"))?;
    create::<Pod>(client, NAMESPACE, pod).await?;
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    if !passed_or_failed_thrice(&pods, "dns-probe").await {
        let out = node.kubectl(&["logs", "-n", NAMESPACE, "dns-probe", "--previous"])?;
        bail!("the lookup failed thrice; the last time:\n{}", String::from_utf8_lossy(&out.stdout));
    }
    let out = node.kubectl(&["logs", "-n", NAMESPACE, "dns-probe"])?;
    ensure!(out.status.success(), "kubectl logs: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits for the pod `name` (`restartPolicy: OnFailure`) to succeed (true) or to have failed three times
/// (false), for at most three minutes.
pub async fn passed_or_failed_thrice(pods: &Api<Pod>, name: &str) -> bool {
    testbed::eventually(Duration::from_secs(180), &format!("pod {name} to pass or fail thrice"), || async {
        let status = pods.get(name).await.ok()?.status?;
        let restarts = status.container_statuses.as_ref()?.first()?.restart_count;
        match status.phase.as_deref() {
            Some("Succeeded") => Some(true),
            _ if restarts >= 3 => Some(false),
            _ => None,
        }
    })
    .await
}

/// The node-cache image the node imports (built here from the peer; the name is ours, never pulled).
pub const NODE_CACHE_IMAGE: &str = "kcp-keeper.test/node-cache:peer";
/// node-local-dns's DaemonSet and ConfigMap name and `k8s-app` label, as kubeadm's manifest names them.
pub const NODE_LOCAL: &str = "node-local-dns";

/// node-cache's image, built from the peer and imported into the node's containerd.
pub fn import_node_cache_image(node: &Node) -> Result<()> {
    let node_cache = peers::locate_only(&["node-cache"])?;
    let archive = node::image::single_binary_image(
        &node.dir,
        NODE_CACHE_IMAGE,
        node_cache.path("node-cache"),
        "node-cache",
        "0:0",
    )?;
    node.import_image(&archive)
}

/// The node-local-dns DaemonSet: node-cache without its dummy interface and iptables rules
/// (`-setupinterface=false -setupiptables=false`, as this kernel needs: the bed puts the addresses on the node's
/// loopback and writes the rules, `testbed::node::cluster_dns::intercept`), its base Corefile the projected
/// ConfigMap, which it watches and re-renders into `-conf` (`-reloadwithsignal`: reloaded at once, not after the
/// reload plugin's interval), root (port 53, as kubeadm's manifest runs it). `on_host` not empty: as a cluster
/// runs it, on the host network bound to those addresses (the link-local one, and in iptables mode the kube-dns
/// ClusterIP too); empty: in a pod of its own, bound to the pod's address.
pub fn node_local_daemonset(on_host: &[std::net::Ipv4Addr]) -> Value {
    let (local, metrics, env) = match on_host {
        [] => (
            "$(POD_IP)".to_string(),
            "$(POD_IP):9353".to_string(),
            json!([{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]),
        ),
        ips => (
            ips.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
            format!("{}:9353", node::NODE_IP),
            json!([]),
        ),
    };
    json!({
        "metadata": {"name": NODE_LOCAL, "labels": {"k8s-app": NODE_LOCAL}},
        "spec": {
            "selector": {"matchLabels": {"k8s-app": NODE_LOCAL}},
            "template": {
                "metadata": {"labels": {"k8s-app": NODE_LOCAL}},
                "spec": {
                    "hostNetwork": !on_host.is_empty(),
                    "dnsPolicy": "Default",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "node-cache",
                        "image": NODE_CACHE_IMAGE,
                        "imagePullPolicy": "Never",
                        "env": env,
                        "args": [
                            format!("-localip={local}"),
                            "-setupinterface=false",
                            "-setupiptables=false",
                            "-skipteardown",
                            "-reloadwithsignal",
                            "-basecorefile=/etc/coredns/Corefile.base",
                            "-conf=/run/node-cache/Corefile",
                            format!("-metrics-listen-address={metrics}"),
                        ],
                        "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": false},
                        "volumeMounts": [
                            {"name": "config", "mountPath": "/etc/coredns", "readOnly": true},
                            {"name": "run", "mountPath": "/run/node-cache"},
                        ],
                    }],
                    "volumes": [
                        {"name": "config", "configMap": {"name": NODE_LOCAL, "items": [{"key": "Corefile", "path": "Corefile.base"}]}},
                        {"name": "run", "emptyDir": {}},
                    ],
                },
            },
        },
    })
}
