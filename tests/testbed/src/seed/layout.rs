//! The seed's layout as objects (pure: no I/O): the self-signed `Issuer`, an etcd StatefulSet per shard, the
//! `RootShard` `root`, the `Shard` `alpha`, the `FrontProxy` `frontproxy` and the admin `Kubeconfig`
//! `kcp-kubeconfig-frontproxy`, every kcp image pinned (the root shard's proxy included), plus the Deployment of
//! the kcp-operator as its `config/manager` ships it.

use serde_json::{Value, json};

use super::images::{KCP_REPOSITORY, KCP_TAG, OPERATOR_IMAGE};

pub const NAMESPACE: &str = "kcp-system";
pub const OPERATOR_NAMESPACE: &str = "kcp-operator";
pub const CERT_MANAGER_NAMESPACE: &str = "cert-manager";
pub const ISSUER: &str = "selfsigned";
pub const ROOT_SHARD: &str = "root";
pub const SHARD: &str = "alpha";
pub const FRONT_PROXY: &str = "frontproxy";
pub const KUBECONFIG: &str = "kcp-kubeconfig-frontproxy";
/// The Secret the operator renders the admin kubeconfig into.
pub const KUBECONFIG_SECRET: &str = "kcp-kubeconfig-frontproxy";
pub const ADMIN_USER: &str = "kcp-admin";
pub const ADMIN_GROUP: &str = "system:kcp:admin";
/// The public name of the kcp instance (the RootShard's `spec.external`), which the rendered kubeconfig's server
/// names. Nothing outside resolves it here: pods that use it map it to the front proxy's fixed ClusterIP.
pub const EXTERNAL_HOST: &str = "kcp.seed.example.com";
pub const EXTERNAL_PORT: u16 = 6443;
/// The front proxy Service's ClusterIP, fixed (in the node's Service range) so pods can map the public name to it.
pub const FRONT_PROXY_IP: &str = "10.96.100.100";
/// Each shard's own public name (its server certificate carries it, through the operator's certificate template,
/// beside the operator's in-cluster names), and its Service's fixed ClusterIP: what split-horizon DNS maps the name
/// to (dns-rewriter discovers both from the operator's objects).
pub const SHARD_HOSTS: [(&str, &str, &str); 2] = [
    (ROOT_SHARD, "root.kcp.seed.example.com", "10.96.100.101"),
    (SHARD, "alpha.kcp.seed.example.com", "10.96.100.102"),
];

fn shard_host(shard: &str) -> (&'static str, &'static str) {
    let (_, host, ip) = SHARD_HOSTS.iter().find(|(s, ..)| *s == shard).expect("a shard of the layout");
    (host, ip)
}

fn server_certificate_names(shard: &str) -> Value {
    json!({"server": {"spec": {"dnsNames": [shard_host(shard).0]}}})
}

fn fixed_cluster_ip(shard: &str) -> Value {
    json!({"spec": {"clusterIP": shard_host(shard).1}})
}

/// The hub's own `Kubeconfig`, beside the seed's: the one kcp-keeper's rotator follows. Its validity is short so
/// that cert-manager renews it every 100 s within a test ([`HUB_RENEW_BEFORE`]); the seed's admin kubeconfig keeps its year,
/// as nothing re-renders it when its certificate renews until kcp-keeper does (the operator's render would expire
/// under the seed's own Verify checks, which run without kcp-keeper).
pub const HUB_KUBECONFIG: &str = "railgrid-hub-admin";
pub const HUB_KUBECONFIG_SECRET: &str = "railgrid-hub-admin-kubeconfig";
pub const HUB_USER: &str = "railgrid-hub";
pub const HUB_VALIDITY: &str = "300s";
/// cert-manager renews the hub's certificate this long before its end: 100 s after it was issued, as at two thirds
/// of 150 s before, but with 200 s rather than 50 s for the new certificate to reach the hub (cert-manager's
/// issuance, the operator's render, the rotator's publish, the kubelet's refresh of the mounted Secret). On a
/// loaded 2-core machine that path once took far longer than 50 s (the first renewal reached the hub 192 s into a
/// wait that expected it at about 100 s) and the probe was refused with 401s, most likely on a certificate past
/// its end: a margin of the bed's short lifetime, not one a real hub (a year's certificate) runs on.
pub const HUB_RENEW_BEFORE: &str = "200s";
/// The front proxy's in-cluster name, which its serving certificate carries beside the public one.
pub const FRONT_PROXY_SERVICE_URL: &str = "https://frontproxy-front-proxy.kcp-system.svc.cluster.local:6443";
/// Members of each shard's etcd: the root shard on 3, `alpha` on 1.
pub const ETCD_MEMBERS: [(&str, u32); 2] = [(ROOT_SHARD, 3), (SHARD, 1)];

fn kcp_image() -> Value {
    json!({"repository": KCP_REPOSITORY, "tag": KCP_TAG})
}

/// The operator's defaults request a whole core per shard (limits 2 cores, 2 GiB): on this 2-core node the root
/// and `alpha` shards alone would take every core, and the surge pod of each rolling update (the operator rolls
/// a Deployment whenever a certificate it mounts is renewed) could never be scheduled. Small requests, kcp's
/// memory limit kept, no CPU limit (throttling kcp on a loaded machine only slows the test down).
fn resources() -> Value {
    json!({"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}})
}

fn host_aliases() -> Value {
    json!({"spec": {"template": {"spec": {"hostAliases": [{"ip": FRONT_PROXY_IP, "hostnames": [EXTERNAL_HOST]}]}}}})
}

pub fn issuer() -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Issuer",
        "metadata": {"name": ISSUER, "namespace": NAMESPACE},
        "spec": {"selfSigned": {}},
    })
}

/// `etcd-<shard>`'s StatefulSet members' client URLs (each member by its stable DNS name).
pub fn etcd_endpoints(shard: &str, members: u32) -> Vec<String> {
    (0..members).map(|i| format!("http://etcd-{shard}-{i}.etcd-{shard}.{NAMESPACE}.svc.cluster.local:2379")).collect()
}

/// The headless Service and the StatefulSet of a shard's etcd. The members find each other by their stable
/// names, so the Service publishes not-ready addresses (a member is not ready before it has a quorum) and the
/// members start in parallel. Data on an emptyDir: the node has no storage provisioner, and a test etcd is
/// thrown away with the node; `--unsafe-no-fsync` for the same reason (the disk is shared by six engineers).
pub fn etcd(shard: &str, members: u32) -> Vec<Value> {
    let name = format!("etcd-{shard}");
    let peers: Vec<String> = (0..members)
        .map(|i| format!("{name}-{i}=http://{name}-{i}.{name}.{NAMESPACE}.svc.cluster.local:2380"))
        .collect();
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": true,
            "selector": {"app": name},
            "ports": [{"name": "client", "port": 2379}, {"name": "peer", "port": 2380}],
        },
    });
    let statefulset = json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "serviceName": name,
            "replicas": members,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "fsGroup": 65532,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "etcd",
                        "image": super::images::ETCD_IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "args": [
                            "--name=$(POD_NAME)",
                            "--data-dir=/var/lib/etcd/data",
                            "--listen-client-urls=http://0.0.0.0:2379",
                            format!("--advertise-client-urls=http://$(POD_NAME).{name}.{NAMESPACE}.svc.cluster.local:2379"),
                            "--listen-peer-urls=http://0.0.0.0:2380",
                            format!("--initial-advertise-peer-urls=http://$(POD_NAME).{name}.{NAMESPACE}.svc.cluster.local:2380"),
                            format!("--initial-cluster={}", peers.join(",")),
                            "--initial-cluster-state=new",
                            format!("--initial-cluster-token={name}"),
                            "--unsafe-no-fsync",
                            "--log-level=warn",
                        ],
                        "ports": [{"name": "client", "containerPort": 2379}, {"name": "peer", "containerPort": 2380}],
                        // /health is a quorum read: the default 1 s timeout failed it on a loaded machine.
                        "readinessProbe": {"httpGet": {"path": "/health", "port": 2379}, "periodSeconds": 2, "timeoutSeconds": 5},
                        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
                    }],
                    "volumes": [{"name": "data", "emptyDir": {}}],
                },
            },
        },
    });
    vec![service, statefulset]
}

/// One replica of everything: the node has 2 cores for six engineers (the operator's default is 2).
pub fn root_shard() -> Value {
    json!({
        "apiVersion": "operator.kcp.io/v1alpha1",
        "kind": "RootShard",
        "metadata": {"name": ROOT_SHARD, "namespace": NAMESPACE},
        "spec": {
            "external": {"hostname": EXTERNAL_HOST, "port": EXTERNAL_PORT},
            "certificates": {"issuerRef": {"group": "cert-manager.io", "kind": "Issuer", "name": ISSUER}},
            "cache": {"embedded": {"enabled": true}},
            "etcd": {"endpoints": etcd_endpoints(ROOT_SHARD, ETCD_MEMBERS[0].1)},
            "image": kcp_image(),
            "replicas": 1,
            "resources": resources(),
            "proxy": {"image": kcp_image(), "replicas": 1, "resources": resources()},
            "deploymentTemplate": host_aliases(),
            "certificateTemplates": server_certificate_names(ROOT_SHARD),
            "serviceTemplate": fixed_cluster_ip(ROOT_SHARD),
        },
    })
}

pub fn shard() -> Value {
    json!({
        "apiVersion": "operator.kcp.io/v1alpha1",
        "kind": "Shard",
        "metadata": {"name": SHARD, "namespace": NAMESPACE},
        "spec": {
            "rootShard": {"ref": {"name": ROOT_SHARD}},
            "etcd": {"endpoints": etcd_endpoints(SHARD, ETCD_MEMBERS[1].1)},
            "image": kcp_image(),
            "replicas": 1,
            "resources": resources(),
            "deploymentTemplate": host_aliases(),
            "certificateTemplates": server_certificate_names(SHARD),
            "serviceTemplate": fixed_cluster_ip(SHARD),
        },
    })
}

pub fn front_proxy() -> Value {
    json!({
        "apiVersion": "operator.kcp.io/v1alpha1",
        "kind": "FrontProxy",
        "metadata": {"name": FRONT_PROXY, "namespace": NAMESPACE},
        "spec": {
            "rootShard": {"ref": {"name": ROOT_SHARD}},
            // The public name the front proxy serves (the RootShard's `external` names the same): the operator
            // renders it into the Kubeconfigs that target the front proxy, dns-rewriter discovers it.
            "external": {"hostname": EXTERNAL_HOST, "port": EXTERNAL_PORT},
            "image": kcp_image(),
            "replicas": 1,
            "resources": resources(),
            "serviceTemplate": {"spec": {"clusterIP": FRONT_PROXY_IP}},
        },
    })
}

/// The admin kubeconfig of seed 000: `kcp-admin` in `system:kcp:admin`, through the front proxy.
pub fn kubeconfig() -> Value {
    json!({
        "apiVersion": "operator.kcp.io/v1alpha1",
        "kind": "Kubeconfig",
        "metadata": {"name": KUBECONFIG, "namespace": NAMESPACE},
        "spec": {
            "username": ADMIN_USER,
            "groups": [ADMIN_GROUP],
            "validity": "8766h",
            "secretRef": {"name": KUBECONFIG_SECRET},
            "target": {"frontProxyRef": {"name": FRONT_PROXY}},
        },
    })
}

/// The hub's admin kubeconfig ([`HUB_KUBECONFIG`]): in `system:kcp:admin` like the seed's, valid [`HUB_VALIDITY`]
/// and renewed [`HUB_RENEW_BEFORE`] before its end (the operator copies the template's `renewBefore` to the
/// Certificate).
pub fn hub_kubeconfig() -> Value {
    json!({
        "apiVersion": "operator.kcp.io/v1alpha1",
        "kind": "Kubeconfig",
        "metadata": {"name": HUB_KUBECONFIG, "namespace": NAMESPACE},
        "spec": {
            "username": HUB_USER,
            "groups": [ADMIN_GROUP],
            "validity": HUB_VALIDITY,
            "certificateTemplate": {"spec": {"renewBefore": HUB_RENEW_BEFORE}},
            "secretRef": {"name": HUB_KUBECONFIG_SECRET},
            "target": {"frontProxyRef": {"name": FRONT_PROXY}},
        },
    })
}

/// The operator as `config/manager/manager.yaml` runs it (its args, probes, security context), with the pinned
/// image; its ServiceAccount is bound to the ClusterRole and leader-election Role of `config/rbac`.
pub fn operator() -> Vec<Value> {
    let account = "kcp-operator";
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": account, "namespace": OPERATOR_NAMESPACE}}),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kcp-operator-manager"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "manager-role"},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": OPERATOR_NAMESPACE}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "kcp-operator-leader-election", "namespace": OPERATOR_NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "leader-election-role"},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": OPERATOR_NAMESPACE}],
        }),
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "kcp-operator", "namespace": OPERATOR_NAMESPACE},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app.kubernetes.io/name": "kcp-operator"}},
                "template": {
                    "metadata": {"labels": {"app.kubernetes.io/name": "kcp-operator"}},
                    "spec": {
                        "serviceAccountName": account,
                        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                        "terminationGracePeriodSeconds": 10,
                        "containers": [{
                            "name": "manager",
                            "image": OPERATOR_IMAGE,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["/manager"],
                            "args": ["--leader-elect", "--health-probe-bind-address=:8081", "--zap-time-encoding=iso8601"],
                            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8081}, "initialDelaySeconds": 15, "periodSeconds": 20},
                            "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8081}, "initialDelaySeconds": 5, "periodSeconds": 10},
                        }],
                    },
                },
            },
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kcp_component_pins_its_image_the_root_shards_proxy_included() {
        let pinned = kcp_image();
        assert_eq!(root_shard()["spec"]["image"], pinned);
        assert_eq!(root_shard()["spec"]["proxy"]["image"], pinned);
        assert_eq!(shard()["spec"]["image"], pinned);
        assert_eq!(front_proxy()["spec"]["image"], pinned);
    }

    #[test]
    fn every_kcp_component_requests_a_tenth_of_a_core_so_a_rolling_update_fits_on_the_two_core_node() {
        for resources in [
            &root_shard()["spec"]["resources"],
            &root_shard()["spec"]["proxy"]["resources"],
            &shard()["spec"]["resources"],
            &front_proxy()["spec"]["resources"],
        ] {
            assert_eq!(resources["requests"]["cpu"], "100m", "{resources}");
        }
    }

    #[test]
    fn no_shard_sets_a_base_url() {
        assert!(root_shard()["spec"].get("shardBaseURL").is_none());
        assert!(shard()["spec"].get("shardBaseURL").is_none());
    }

    #[test]
    fn the_root_etcd_has_three_members_named_in_its_initial_cluster() {
        let objects = etcd(ROOT_SHARD, 3);
        let args = objects[1]["spec"]["template"]["spec"]["containers"][0]["args"].as_array().unwrap();
        let initial = args.iter().find_map(|a| a.as_str()?.strip_prefix("--initial-cluster=")).unwrap();
        assert_eq!(initial.split(',').count(), 3, "{initial}");
        assert_eq!(objects[1]["spec"]["replicas"], 3);
        assert_eq!(etcd_endpoints(ROOT_SHARD, 3).len(), 3);
    }
}
