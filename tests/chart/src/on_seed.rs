//! kcp-keeper on the seed's layout (`testbed::seed`, issue 24 item 4): its own chart, `helm install --wait` in a
//! namespace enforcing the `restricted` Pod Security Standard, the agents' shipped images imported (never
//! pulled), configured for the objects the real kcp-operator and cert-manager made: the hub's `Kubeconfig`, the
//! root shard's server CA, the front proxy, the operator's Services, both shards' etcds. Shared by the test
//! binary `seed_layout` and `cargo xtask demo --cluster`.

use std::time::{Duration, Instant};

use crate::NAMESPACE as KEEPER_NAMESPACE;
use crate::on_node::{self, HUB, S3_KEY, S3_PORT, S3_SECRET, create, pause_deployment, version};
use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};
use testbed::node::{self, Node};
use testbed::seed::images::KCP_IMAGE;
use testbed::seed::layout::{
    self, EXTERNAL_HOST, FRONT_PROXY_SERVICE_URL, HUB_KUBECONFIG, HUB_KUBECONFIG_SECRET, NAMESPACE,
};

/// The hub's namespace, Secret and key the rotator publishes to.
pub const HUB_NAMESPACE: &str = "railgrid-system";
pub const HUB_SECRET: &str = "railgrid-kcp";
pub const HUB_KEY: &str = "admin.kubeconfig";
/// The rotator's name for the hub's kubeconfig (its restart annotation is `kcp-keeper.io/restarted-for-<it>`).
pub const ROTATED: &str = "hub-admin";
/// Where ca-syncer writes the root shard's server CA for the hub.
pub const CA_TARGET: &str = "kcp-server-ca";

/// The chart's values for the layout. One replica of each agent: the layout already fills the 2-core node
/// (the operator's four kcp Deployments, four etcd members, cert-manager, the operator).
pub fn values() -> Value {
    let server_ca =
        json!({"namespace": NAMESPACE, "name": format!("{}-server-ca", layout::ROOT_SHARD), "key": "tls.crt"});
    json!({
        "replicas": 1,
        "kubeconfigRotator": {"enabled": true, "config": {
            "resyncInterval": "10s",
            "kubeconfigs": [{
                "name": ROTATED,
                "source": {"kubeconfig": {
                    "namespace": NAMESPACE,
                    "name": HUB_KUBECONFIG,
                    "renderedSecret": HUB_KUBECONFIG_SECRET,
                    "serverCA": server_ca,
                }},
                // The operator renders the public name; in the cluster the front proxy is reached by its Service
                // name, which its serving certificate carries too. The `/clusters/root` path is kept.
                "server": FRONT_PROXY_SERVICE_URL,
                "targets": [{
                    "namespace": HUB_NAMESPACE,
                    "name": HUB_SECRET,
                    "key": HUB_KEY,
                    "restartDeployments": [HUB],
                }],
            }],
        }},
        // The names the operator's objects carry, each to the Service the operator made for it; verified through
        // kube-dns (CoreDNS in a pod, importing coredns-custom as k3s's does).
        "dnsRewriter": {"enabled": true, "config": {
            "mode": "k3s",
            "clusterDomain": "cluster.local",
            "discovery": {"namespace": NAMESPACE, "rootShards": true, "shards": true, "frontProxies": true},
            "resyncInterval": "5m",
        }},
        // Both shards' etcds (the root shard's three members, one client each, a follower preferred), into S3 inside
        // the node; drills at the kcp level run the kcp binary of the very image the operator runs, mounted as an
        // image volume (the agent's image carries etcd and etcdutl only).
        "etcdSnapshotter": {
            "enabled": true,
            "s3Credentials": {"existingSecret": "etcd-backup-s3"},
            // kcp itself runs in the pod during a drill.
            "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}},
            "extraVolumes": [{"name": "kcp", "image": {"reference": KCP_IMAGE, "pullPolicy": "IfNotPresent"}}],
            "extraVolumeMounts": [{"name": "kcp", "mountPath": KCP_MOUNT, "readOnly": true}],
            "config": {
                "shards": layout::ETCD_MEMBERS.iter().map(|(shard, members)| {
                    let mut s = json!({
                        "name": shard,
                        "endpoints": layout::etcd_endpoints(shard, *members),
                        // Every 20 seconds (cron with seconds): a scheduled snapshot soon after the install.
                        "schedule": {"cron": "*/20 * * * * *"},
                        // Deltas every 5 s: the shards share points in time, which the installation's restore
                        // goes back to.
                        "deltas": {"enabled": true, "interval": "5s"},
                    });
                    // A snapshot before every kcp upgrade: each shard's own operator object, by name.
                    let kind = if *shard == layout::ROOT_SHARD { "RootShard" } else { "Shard" };
                    s["beforeUpgrade"] = json!({"kind": kind, "namespace": NAMESPACE, "name": shard});
                    if *shard == layout::ROOT_SHARD {
                        // What the restored kcp must serve: the root workspace's default namespace. Drills are run
                        // by the test (one-shot); the schedule is once a year.
                        s["drill"] = json!({
                            "schedule": {"cron": "0 0 0 1 1 *"},
                            "kcp": {"objects": [{"workspace": "root", "path": "/api/v1/namespaces/default"}]},
                        });
                    }
                    s
                }).collect::<Vec<_>>(),
                "storage": {
                    "bucket": "kcp-backups",
                    "prefix": S3_PREFIX,
                    "endpoint": format!("http://s3.{KEEPER_NAMESPACE}.svc.cluster.local:{S3_PORT}"),
                    "region": "us-east-1",
                    "pathStyle": true,
                    "credentials": {"secretDirectory": "/var/run/secrets/etcd-snapshotter/s3"},
                },
                "compression": "zstd",
                // Ten minutes of the 20 s schedule: a drill on a loaded machine took 77 s (kcp ready in 72 s), and
                // with keepLast 3 the snapshot it drilled was pruned before the test could list it.
                "retention": {"keepLast": 30},
                "spill": {"directory": "/var/lib/etcd-snapshotter", "memoryBudget": "64Mi"},
                "drills": {
                    "etcd": "/etcd",
                    "etcdutl": "/etcdutl",
                    "kcp": format!("{KCP_MOUNT}/kcp"),
                    "directory": "/var/lib/etcd-snapshotter/drills",
                },
            },
        },
        "caSyncer": {"enabled": true, "config": {"bundles": [{
            "name": "kcp-server-ca",
            "sources": [{"secret": server_ca}],
            "targets": [{"secret": {"namespace": HUB_NAMESPACE, "name": CA_TARGET, "key": "ca.crt"}}],
            // The live front proxy, by its Service, verified for the public name the hub uses.
            "liveCheck": {"url": format!("{FRONT_PROXY_SERVICE_URL}/readyz"), "serverName": EXTERNAL_HOST},
        }]}},
    })
}

pub struct Installed {
    /// How long `helm install --wait` took.
    pub took: Duration,
    /// S3 (versitygw) inside the node; it lives as long as this (and the thread that started it).
    pub _s3: testbed::process::Process,
}

/// Where the snapshotter's pod mounts the kcp image.
const KCP_MOUNT: &str = "/opt/kcp";
pub const S3_PREFIX: &str = "kcp/etcd";

/// versitygw inside the node, on its address, behind the Service `s3` in the release namespace; the agent's
/// Secret with its credentials.
async fn s3(node: &Node, client: &kube::Client) -> Result<testbed::process::Process> {
    let peers = peers::locate_only(&["versitygw"])?;
    std::fs::create_dir_all(node.dir.join("peers/s3/kcp-backups"))?;
    let s3 = node.spawn_inside_with_env(
        "versitygw",
        peers.path("versitygw"),
        vec![
            "--port".into(),
            format!("{}:{S3_PORT}", node::NODE_IP),
            "posix".into(),
            node.dir.join("peers/s3").display().to_string(),
        ],
        &[("ROOT_ACCESS_KEY", S3_KEY), ("ROOT_SECRET_KEY", S3_SECRET)],
    )?;
    on_node::peer_service(client, KEEPER_NAMESPACE, "s3", S3_PORT, S3_PORT).await?;
    create::<Secret>(
        client,
        KEEPER_NAMESPACE,
        json!({"metadata": {"name": "etcd-backup-s3"},
               "stringData": {"AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET}}),
    )
    .await?;
    Ok(s3)
}

/// A snapshot's manifest as the bucket holds it.
pub fn manifest(node: &Node, id: &str) -> Result<Value> {
    object(node, &format!("{id}/manifest.json"))
}

/// A JSON object under the snapshotter's prefix, as the bucket holds it (versitygw's posix backend, on the
/// node's disk).
pub fn object(node: &Node, key: &str) -> Result<Value> {
    let path = node.dir.join("peers/s3/kcp-backups").join(S3_PREFIX).join(key);
    Ok(serde_json::from_str(&std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?)?)
}

/// The agents' images imported, the hub's namespace and its consumer Deployment, the release namespace
/// (restricted), then `helm install --wait`.
pub async fn install(node: &Node) -> Result<Installed> {
    let client = node.client().await?;
    let version = version()?;
    on_node::agent_images_published(&version)?;
    let namespaces = Api::<Namespace>::all(client.clone());
    for (name, labels) in [
        (
            KEEPER_NAMESPACE,
            json!({"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}),
        ),
        (HUB_NAMESPACE, json!({})),
    ] {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
        namespaces.create(&PostParams::default(), &ns).await?;
    }
    create::<Deployment>(&client, HUB_NAMESPACE, pause_deployment(HUB)).await?;
    let s3 = s3(node, &client).await?;
    let started = Instant::now();
    let out = on_node::helm_release(node, "install", &values(), "5m")?;
    let took = started.elapsed();
    if !out.success {
        let pods = Api::<Pod>::namespaced(client.clone(), KEEPER_NAMESPACE).list(&ListParams::default()).await?;
        let summary: Vec<String> = pods
            .items
            .iter()
            .map(|p| format!("{} {:?}", p.metadata.name.clone().unwrap_or_default(), p.status.clone().map(|s| s.phase)))
            .collect();
        let logs =
            node.kubectl(&["logs", "-n", KEEPER_NAMESPACE, "-l", "app.kubernetes.io/part-of=kcp-keeper", "--tail=20"])?;
        bail!(
            "helm install --wait failed after {took:.1?}: {}\npods: {summary:#?}\n{}",
            out.stderr,
            String::from_utf8_lossy(&logs.stdout)
        );
    }
    eprintln!("kcp-keeper Ready on the layout: helm install --wait took {took:.1?}");
    Ok(Installed { took, _s3: s3 })
}

/// The name of the agent's (one) running pod.
pub fn agent_pod(node: &Node, agent: &str) -> Result<String> {
    let selector = format!("app.kubernetes.io/name={agent}");
    let out = node.kubectl(&[
        "get",
        "pods",
        "-n",
        KEEPER_NAMESPACE,
        "-l",
        &selector,
        "--field-selector=status.phase=Running",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ])?;
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    ensure!(
        out.status.success() && !name.is_empty(),
        "no running {agent} pod: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(name)
}

/// A pod's metrics (its admin port, through the apiserver's pod proxy).
pub fn pod_metrics(node: &Node, pod: &str) -> Result<String> {
    let path = format!("/api/v1/namespaces/{KEEPER_NAMESPACE}/pods/{pod}:9090/proxy/metrics");
    let out = node.kubectl(&["get", "--raw", &path])?;
    ensure!(out.status.success(), "metrics of {pod}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
