//! The chart installed on a real node (`testbed::node`) with all four agents, configured for what the node runs:
//! the seed objects their configurations name (namespaces, source Secrets, the kcp-operator CRDs, the consumer
//! Deployment), etcd and S3 as processes inside the node behind selector-less Services that pods reach by DNS
//! name, then `helm install --wait` in a namespace (the node pulls the agents' images from the bed's registry)
//! enforcing the `restricted` Pod Security Standard. Shared by the node tests (`tests/node`) and
//! `cargo xtask demo --cluster`.

use std::time::{Duration, Instant};

use age::secrecy::ExposeSecret;
use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};
use testbed::node::{self, NODE_IP, Node};

use crate::{NAMESPACE, helm, run};

pub const AGENTS: [&str; 4] = ["ca-syncer", "dns-rewriter", "kubeconfig-rotator", "etcd-snapshotter"];
/// Ports of the peers inside the node (its own network, so fixed).
pub const ETCD_PORT: u16 = 23790;
pub const S3_PORT: u16 = 7070;
/// The root credentials of the node's versitygw (the agent's S3 Secret holds them).
pub const S3_KEY: &str = "kcpkeepernode";
pub const S3_SECRET: &str = "kcp-keeper-node-s3-secret";
/// The consumer Deployment kubeconfig-rotator restarts.
pub const HUB: &str = "railgrid-hub";
/// The ClusterTrustBundle ca-syncer writes the root CA into, and its signer (the name carries the signer's prefix).
pub const TRUST_BUNDLE: &str = "kcp-keeper.io:kcp-root-ca:primary";
pub const SIGNER: &str = "kcp-keeper.io/kcp-root-ca";

/// The chart's appVersion: the tag of every agent image.
pub fn version() -> Result<String> {
    let chart: Value = serde_yaml::from_str(&std::fs::read_to_string(crate::chart_dir().join("Chart.yaml"))?)?;
    Ok(chart["appVersion"].as_str().context("Chart.yaml has no appVersion")?.to_string())
}

pub async fn create<K>(client: &kube::Client, namespace: &str, object: Value) -> Result<()>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object)?;
    Api::<K>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating a {}", K::kind(&())))?;
    Ok(())
}

async fn namespace(client: &kube::Client, object: Value) -> Result<()> {
    let object: Namespace = serde_json::from_value(object)?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &object)
        .await
        .context("creating a namespace")?;
    Ok(())
}

/// A Service without a selector and its EndpointSlice: `name.namespace.svc` answers, through kube-proxy, on
/// `port`, for a peer listening on the node's address at `target`.
pub async fn peer_service(client: &kube::Client, namespace: &str, name: &str, port: u16, target: u16) -> Result<()> {
    create::<Service>(
        client,
        namespace,
        json!({"metadata": {"name": name}, "spec": {"ports": [{"name": "main", "port": port, "targetPort": target}]}}),
    )
    .await?;
    create::<EndpointSlice>(
        client,
        namespace,
        json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [NODE_IP.to_string()], "conditions": {"ready": true}}],
            "ports": [{"name": "main", "port": target, "protocol": "TCP"}],
        }),
    )
    .await
}

fn secret(name: &str, data: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> = data.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    json!({"metadata": {"name": name}, "stringData": data})
}

/// Every agent, configured for what runs on the node.
pub fn values() -> Value {
    json!({
        "caSyncer": {"enabled": true, "config": {"bundles": [{
            "name": "kcp-root-ca",
            "sources": [{"secret": {"namespace": "kcp-system", "name": "root-server-ca", "key": "ca.crt"}}],
            "targets": [{"secret": {"namespace": "railgrid-system", "name": "kcp-ca", "key": "ca.crt"}},
                        {"clusterTrustBundle": {"name": TRUST_BUNDLE, "signerName": SIGNER}}],
        }]}},
        "dnsRewriter": {"enabled": true, "config": {
            "mode": "k3s",
            "clusterDomain": "cluster.local",
            "rules": [{"host": "kcp-root.example.com", "service": {"namespace": "kcp-system", "name": "root-kcp"}, "port": 6443}],
            "resyncInterval": "5m",
        }},
        "kubeconfigRotator": {"enabled": true, "config": {
            "resyncInterval": "1m",
            "kubeconfigs": [{
                "name": "hub-admin",
                "source": {"secret": {"namespace": "kcp-system", "name": "hub-admin-kubeconfig", "key": "kubeconfig"}},
                "expect": {"username": "hub-admin", "groups": ["hub-admins"]},
                "targets": [{
                    "namespace": "railgrid-system",
                    "name": "railgrid-kcp",
                    "key": "admin.kubeconfig",
                    "restartDeployments": [HUB],
                }],
            }],
        }},
        "etcdSnapshotter": {
            "enabled": true,
            "s3Credentials": {"existingSecret": "etcd-backup-s3"},
            "ageIdentity": {"existingSecret": "etcd-backup-age"},
            "config": {
                "shards": [{
                    "name": "root",
                    "endpoints": [format!("http://etcd-root.kcp-system.svc.cluster.local:{ETCD_PORT}")],
                    // Every 20 seconds (cron with seconds): a scheduled snapshot soon after the install.
                    "schedule": {"cron": "*/20 * * * * *"},
                }],
                "storage": {
                    "bucket": "kcp-backups",
                    "prefix": "kcp/etcd",
                    "endpoint": format!("http://s3.kcp-system.svc.cluster.local:{S3_PORT}"),
                    "region": "us-east-1",
                    "pathStyle": true,
                    "credentials": {"secretDirectory": "/var/run/secrets/etcd-snapshotter/s3"},
                },
                "compression": "zstd",
                "encryption": {"ageRecipients": [age_identity().to_public().to_string()]},
                // A snapshot every 20 s: with keepLast 3 the one a test drills (40 MiB on a loaded machine) could
                // be pruned within a minute, before the test lists it again (as on the seed layout).
                "retention": {"keepLast": 30},
                "spill": {"directory": "/var/lib/etcd-snapshotter", "memoryBudget": "64Mi"},
                "drills": {
                    // Where the image carries them.
                    "etcd": "/etcd",
                    "etcdutl": "/etcdutl",
                    "directory": "/var/lib/etcd-snapshotter/drills",
                    "identityFile": "/var/run/secrets/etcd-snapshotter/age/identity.txt",
                },
            },
        },
    })
}

/// A throwaway age key pair (the snapshotter encrypts to the recipient; drills decrypt with the identity).
pub fn age_identity() -> &'static age::x25519::Identity {
    static IDENTITY: std::sync::OnceLock<age::x25519::Identity> = std::sync::OnceLock::new();
    IDENTITY.get_or_init(age::x25519::Identity::generate)
}

/// What the agents' configurations name: namespaces, the source Secrets, the Services of the peers, and the
/// peers themselves (etcd and S3 as processes inside the node, on its address; they die with the caller's
/// thread, as every [`testbed::process::Process`] does).
pub async fn seed(node: &Node, client: &kube::Client) -> Result<Vec<testbed::process::Process>> {
    namespace(
        client,
        json!({"metadata": {"name": NAMESPACE, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }}}),
    )
    .await?;
    // dns-rewriter discovers kcp-operator objects: the operator's real CRDs.
    testbed::crds::install(client, testbed::crds::read(&testbed::crds::kcp_operator())?).await?;
    for ns in ["kcp-system", "railgrid-system"] {
        namespace(client, json!({"metadata": {"name": ns}})).await?;
    }
    let year = Duration::from_secs(365 * 24 * 3600);
    let ca = testbed::certs::Ca::new("kcp-root-ca", year)?;
    create::<Secret>(client, "kcp-system", secret("root-server-ca", &[("ca.crt", &ca.cert_pem())])).await?;
    let kubeconfig = node.in_cluster_kubeconfig("hub-admin", &["hub-admins"], year)?;
    create::<Secret>(client, "kcp-system", secret("hub-admin-kubeconfig", &[("kubeconfig", &kubeconfig)])).await?;
    create::<Secret>(
        client,
        NAMESPACE,
        secret("etcd-backup-s3", &[("AWS_ACCESS_KEY_ID", S3_KEY), ("AWS_SECRET_ACCESS_KEY", S3_SECRET)]),
    )
    .await?;
    create::<Secret>(
        client,
        NAMESPACE,
        secret("etcd-backup-age", &[("identity.txt", age_identity().to_string().expose_secret())]),
    )
    .await?;
    create::<Service>(
        client,
        "kcp-system",
        json!({"metadata": {"name": "root-kcp"}, "spec": {"ports": [{"port": 6443}]}}),
    )
    .await?;

    let peers = peers::locate_only(&["etcd", "versitygw"])?;
    let data = node.dir.join("peers");
    std::fs::create_dir_all(data.join("s3/kcp-backups"))?;
    let etcd = node.spawn_inside(
        "etcd-root",
        peers.path("etcd"),
        vec![
            "--name=root".into(),
            format!("--data-dir={}", data.join("etcd").display()),
            format!("--listen-client-urls=http://{NODE_IP}:{ETCD_PORT}"),
            format!("--advertise-client-urls=http://{NODE_IP}:{ETCD_PORT}"),
            format!("--listen-peer-urls=http://{NODE_IP}:23800"),
            format!("--initial-advertise-peer-urls=http://{NODE_IP}:23800"),
            format!("--initial-cluster=root=http://{NODE_IP}:23800"),
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ],
    )?;
    let s3 = node.spawn_inside_with_env(
        "versitygw",
        peers.path("versitygw"),
        vec!["--port".into(), format!("{NODE_IP}:{S3_PORT}"), "posix".into(), data.join("s3").display().to_string()],
        &[("ROOT_ACCESS_KEY", S3_KEY), ("ROOT_SECRET_KEY", S3_SECRET)],
    )?;
    // The consumer of the kubeconfig kubeconfig-rotator publishes (it restarts it on every new content).
    create::<Deployment>(client, "railgrid-system", pause_deployment(HUB)).await?;
    peer_service(client, "kcp-system", "etcd-root", ETCD_PORT, ETCD_PORT).await?;
    peer_service(client, "kcp-system", "s3", S3_PORT, S3_PORT).await?;
    Ok(vec![etcd, s3])
}

/// A pod spec the `restricted` standard admits, running the pause image (never pulled).
pub fn restricted_pause_spec(volumes: Value, mounts: Value) -> Value {
    json!({
        "securityContext": {"runAsNonRoot": true, "runAsUser": 65535, "seccompProfile": {"type": "RuntimeDefault"}},
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "consumer",
            "image": peers::PAUSE_IMAGE,
            "imagePullPolicy": "Never",
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
    })
}

pub fn pause_deployment(name: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": restricted_pause_spec(json!([]), json!([]))},
        },
    })
}

/// `helm <verb> --wait` (install or upgrade) of the release `kcp-keeper` with `values`, on the node, from the
/// working tree's chart.
pub fn helm_release(node: &Node, verb: &str, values: &Value, timeout: &str) -> Result<crate::Output> {
    helm_release_of(node, verb, None, values, timeout)
}

/// [`helm_release`] of the chart published at `version` in the bed's registry (`None`: the working tree's).
pub fn helm_release_of(
    node: &Node,
    verb: &str,
    version: Option<&str>,
    values: &Value,
    timeout: &str,
) -> Result<crate::Output> {
    let home = tempfile::tempdir()?;
    let values_file = home.path().join("values.yaml");
    std::fs::write(&values_file, serde_yaml::to_string(values)?)?;
    let chart = match version {
        None => crate::chart_dir().display().to_string(),
        Some(_) => format!("oci://{}/{}/charts/kcp-keeper", node.registry()?, peers::registry::BED_PATH),
    };
    let kubeconfig = node.kubeconfig.display().to_string();
    let mut args = vec![
        verb,
        "kcp-keeper",
        &chart,
        "--namespace",
        NAMESPACE,
        "--kubeconfig",
        &kubeconfig,
        "--values",
        values_file.to_str().context("values path")?,
        "--wait",
        "--timeout",
        timeout,
    ];
    let ca = testbed::registry::bed_ca()?.display().to_string();
    if let Some(version) = version {
        args.extend(["--version", version, "--ca-file", &ca]);
    }
    run(helm(&args, home.path())?)
}

/// The chart on the node: the seed, then `helm install --wait` of [`values`], the images pulled from the bed's
/// registry.
pub struct Installed {
    /// How long `helm install --wait` took.
    pub took: Duration,
    /// etcd and S3 inside the node; they live as long as this (and the thread that started them).
    pub peers: Vec<testbed::process::Process>,
}

/// The agents' images (`cargo xtask images`) are in the bed's registry, which the node's containerd pulls the
/// chart's default references from (its mirror); nothing is imported.
pub fn agent_images_published(version: &str) -> Result<()> {
    for agent in AGENTS {
        node::agent_image_published(agent, version)?;
    }
    Ok(())
}

/// Each of `agents` was pulled by the node's containerd from the bed's registry: its manifest requested there
/// (the registry's access log) and the chart's default reference in containerd's images.
pub fn pulled_from_the_registry(node: &Node, agents: &[&str], version: &str) -> Result<()> {
    let log = node.registry_log()?;
    let images = node.images()?;
    for agent in agents {
        let request = format!("/v2/{}/{agent}/manifests/", peers::registry::BED_PATH);
        ensure!(
            log.contains(&request),
            "the node's registry was never asked for {request} (its log: {})",
            node.dir.join("logs/registry.log").display()
        );
        let tag = format!("{}/{agent}:{version}", peers::registry::PUBLIC);
        ensure!(images.iter().any(|i| i == &tag), "{tag} is not in the node's containerd: {images:?}");
    }
    Ok(())
}

pub async fn install(node: &Node) -> Result<Installed> {
    let client = node.client().await?;
    let version = version()?;
    agent_images_published(&version)?;
    let peers = seed(node, &client).await?;

    let install = Instant::now();
    let out = helm_release(node, "install", &values(), "5m")?;
    let took = install.elapsed();
    if !out.success {
        let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE).list(&ListParams::default()).await?;
        let summary: Vec<String> = pods
            .items
            .iter()
            .map(|p| {
                let status = p.status.clone().unwrap_or_default();
                format!(
                    "{} {:?} {:?}",
                    p.metadata.name.clone().unwrap_or_default(),
                    status.phase,
                    status
                        .container_statuses
                        .unwrap_or_default()
                        .iter()
                        .map(|c| (c.ready, c.state.clone()))
                        .collect::<Vec<_>>()
                )
            })
            .collect();
        bail!("helm install --wait failed after {took:.1?}: {}\npods: {summary:#?}", out.stderr);
    }
    eprintln!("helm install --wait of all four agents: {took:.1?}");
    pulled_from_the_registry(node, &AGENTS, &version)?;
    Ok(Installed { took, peers })
}

/// `kubectl exec` of the agent's own binary in its pod (its image, its mounts, its ServiceAccount, the cluster's
/// DNS): stdout when it exits 0, else why not.
pub fn exec_in_agent(node: &Node, agent: &str, command: &[&str]) -> Result<String> {
    let target = format!("deploy/kcp-keeper-{agent}");
    let mut args = vec!["exec", "-n", NAMESPACE, &target, "-c", agent, "--"];
    args.extend_from_slice(command);
    let out = node.kubectl(&args)?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "kubectl exec {agent} {command:?}: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// A pod's unlabelled metric (the admin port, through the apiserver's pod proxy) whose name starts with
/// `prefix` and ends with `suffix`: its full name and value.
pub fn pod_metric(node: &Node, pod: &str, prefix: &str, suffix: &str) -> Result<Option<(String, f64)>> {
    let path = format!("/api/v1/namespaces/{NAMESPACE}/pods/{pod}:9090/proxy/metrics");
    let out = node.kubectl(&["get", "--raw", &path])?;
    ensure!(out.status.success(), "metrics of {pod}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let (name, value) = l.split_once(' ')?;
        (name.starts_with(prefix) && name.ends_with(suffix))
            .then(|| Some((name.to_string(), value.trim().parse().ok()?)))?
    }))
}

/// An agent's pods: name, uid, restarts of its container, Ready.
pub async fn agent_pods(client: &kube::Client, agent: &str) -> Result<Vec<(String, String, i32, bool)>> {
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={agent}")))
        .await?;
    Ok(pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let status = p.status.clone().unwrap_or_default();
            let container = status.container_statuses.unwrap_or_default().into_iter().next().unwrap_or_default();
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.metadata.uid.clone().unwrap_or_default(),
                container.restart_count,
                container.ready,
            )
        })
        .collect())
}

/// The hub's pods when its rollout has settled: one Ready pod of the current template, no other pod left, after
/// a restart kubeconfig-rotator made: its restart annotation and the pod's uid.
pub async fn settled_hub(client: &kube::Client) -> Option<(String, String)> {
    let deployment = Api::<Deployment>::namespaced(client.clone(), "railgrid-system").get(HUB).await.ok()?;
    let status = deployment.status.clone()?;
    let settled = status.observed_generation == deployment.metadata.generation
        && status.updated_replicas == Some(1)
        && status.ready_replicas == Some(1)
        && status.replicas == Some(1);
    let annotation =
        deployment.spec.template.metadata?.annotations?.get("kcp-keeper.io/restarted-for-hub-admin").cloned()?;
    let pods = Api::<Pod>::namespaced(client.clone(), "railgrid-system")
        .list(&ListParams::default().labels(&format!("app={HUB}")))
        .await
        .ok()?;
    let [pod] = pods.items.as_slice() else { return None };
    let ready = pod.status.as_ref()?.conditions.as_ref()?.iter().any(|c| c.type_ == "Ready" && c.status == "True");
    let uid = pod.metadata.uid.clone()?;
    (settled && ready && pod.metadata.deletion_timestamp.is_none()).then_some((annotation, uid))
}
