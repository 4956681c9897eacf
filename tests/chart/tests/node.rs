//! The chart on a real node (`testbed::node`): `helm install --wait` of all four agents in a namespace that
//! enforces the `restricted` Pod Security Standard, every pod Ready from the shipped image (imported into the
//! node's containerd, never pulled), the peers the agents talk to (etcd, S3) inside the node behind Services that
//! pods reach by their DNS names. One node per test binary.

use std::time::{Duration, Instant};

use age::secrecy::ExposeSecret;
use anyhow::{Context, Result, ensure};
use chart::{NAMESPACE, helm, run};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};
use testbed::node::{self, NODE_IP, Node};

const AGENTS: [&str; 4] = ["ca-syncer", "dns-rewriter", "kubeconfig-rotator", "etcd-snapshotter"];
/// Ports of the peers inside the node (its own network, so fixed).
const ETCD_PORT: u16 = 23790;
const S3_PORT: u16 = 7070;
const S3_KEY: &str = "kcpkeepernode";
const S3_SECRET: &str = "kcp-keeper-node-s3-secret";

fn version() -> Result<String> {
    let chart: Value = serde_yaml::from_str(&std::fs::read_to_string(chart::chart_dir().join("Chart.yaml"))?)?;
    Ok(chart["appVersion"].as_str().context("Chart.yaml has no appVersion")?.to_string())
}

async fn create<K>(client: &kube::Client, namespace: &str, object: Value) -> Result<()>
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
async fn peer_service(client: &kube::Client, namespace: &str, name: &str, port: u16, target: u16) -> Result<()> {
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

/// Every agent, configured for what runs on this node.
fn values(node: &Node) -> Result<Value> {
    let _ = node;
    Ok(json!({
        "caSyncer": {"enabled": true, "config": {"bundles": [{
            "name": "kcp-root-ca",
            "sources": [{"secret": {"namespace": "kcp-system", "name": "root-server-ca", "key": "ca.crt"}}],
            "targets": [{"secret": {"namespace": "railgrid-system", "name": "kcp-ca", "key": "ca.crt"}}],
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
                "targets": [{"namespace": "railgrid-system", "name": "railgrid-kcp", "key": "admin.kubeconfig"}],
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
                    "schedule": {"cron": "*/5 * * * *"},
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
                "retention": {"keepLast": 3},
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
    }))
}

/// A throwaway age key pair for the test (the snapshotter encrypts to the recipient; drills decrypt with the
/// identity).
fn age_identity() -> &'static age::x25519::Identity {
    static IDENTITY: std::sync::OnceLock<age::x25519::Identity> = std::sync::OnceLock::new();
    IDENTITY.get_or_init(age::x25519::Identity::generate)
}

/// The source CA ca-syncer first copies.
static CA_BEFORE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// What the agents' configurations name: namespaces, the source Secrets, the Services of the peers, and the
/// peers themselves (etcd and S3 as processes inside the node, on its address).
async fn seed(node: &Node, client: &kube::Client) -> Result<Vec<testbed::process::Process>> {
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
    CA_BEFORE.set(ca.cert_pem()).ok();
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
    peer_service(client, "kcp-system", "etcd-root", ETCD_PORT, ETCD_PORT).await?;
    peer_service(client, "kcp-system", "s3", S3_PORT, S3_PORT).await?;
    Ok(vec![etcd, s3])
}

#[tokio::test]
async fn helm_install_wait_runs_every_agent_from_its_shipped_image_in_a_restricted_namespace() -> Result<()> {
    let node = node::shared();
    let client = node.client().await?;
    let version = version()?;
    let started = Instant::now();
    for agent in AGENTS {
        node.import_image(&node::agent_image_archive(agent)?)?;
    }
    let images = node.images()?;
    for agent in AGENTS {
        let tag = format!("ghcr.io/kcp-keeper/{agent}:{version}");
        ensure!(images.iter().any(|i| i == &tag), "{tag} is not in the node's containerd: {images:?}");
    }
    eprintln!("images imported in {:.1?}", started.elapsed());
    let _peers = seed(node, &client).await?;

    let home = tempfile::tempdir()?;
    let values_file = home.path().join("values.yaml");
    std::fs::write(&values_file, serde_yaml::to_string(&values(node)?)?)?;
    let chart_dir = chart::chart_dir();
    let kubeconfig = node.kubeconfig.display().to_string();
    let args = [
        "install",
        "kcp-keeper",
        chart_dir.to_str().context("chart path")?,
        "--namespace",
        NAMESPACE,
        "--kubeconfig",
        &kubeconfig,
        "--values",
        values_file.to_str().context("values path")?,
        "--wait",
        "--timeout",
        "5m",
    ];
    let install = Instant::now();
    let out = run(helm(&args, home.path())?)?;
    let took = install.elapsed();
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
    ensure!(out.success, "helm install --wait failed after {took:.1?}: {}\npods: {summary:#?}", out.stderr);
    eprintln!("helm install --wait of all four agents: {took:.1?}");

    // Every Deployment's pods are Ready, each running the shipped image.
    let deployments = Api::<Deployment>::namespaced(client.clone(), NAMESPACE).list(&ListParams::default()).await?;
    ensure!(deployments.items.len() == 4, "{} Deployments", deployments.items.len());
    for d in &deployments.items {
        let status = d.status.clone().unwrap_or_default();
        let wanted = d.spec.replicas.unwrap_or(1);
        ensure!(status.ready_replicas == Some(wanted), "{:?}: {status:?}", d.metadata.name);
    }
    ensure!(pods.items.len() >= 4, "{summary:#?}");
    for pod in &pods.items {
        let status = pod.status.clone().unwrap_or_default();
        for c in status.container_statuses.unwrap_or_default() {
            ensure!(c.ready, "{:?} container {} not ready", pod.metadata.name, c.name);
            ensure!(c.image.starts_with("ghcr.io/kcp-keeper/"), "{} runs {}", c.name, c.image);
            ensure!(c.image.ends_with(&format!(":{version}")), "{} runs {}", c.name, c.image);
        }
    }
    // Nothing was pulled: kubelet found every image present.
    let events = Api::<Event>::namespaced(client.clone(), NAMESPACE).list(&ListParams::default()).await?;
    let pulling: Vec<_> = events.items.iter().filter(|e| e.reason.as_deref() == Some("Pulling")).collect();
    ensure!(pulling.is_empty(), "kubelet tried to pull: {pulling:?}");

    ca_syncer_reaches_a_consumer_pod(node, &client).await
}

/// Secret `railgrid-system/kcp-ca`'s `ca.crt`.
async fn target_bundle(client: &kube::Client) -> Option<String> {
    let secret = Api::<Secret>::namespaced(client.clone(), "railgrid-system").get_opt("kcp-ca").await.ok()??;
    let bytes = secret.data?.get("ca.crt")?.0.clone();
    String::from_utf8(bytes).ok()
}

/// ca-syncer, in its pod, copied the source CA into the target Secret in another namespace; a consumer pod mounts
/// that Secret; after the source CA changes, the target follows and the file the kubelet projected into the
/// consumer's volume holds the new CA.
async fn ca_syncer_reaches_a_consumer_pod(node: &Node, client: &kube::Client) -> Result<()> {
    let before = CA_BEFORE.get().context("seeded")?.trim().to_string();
    let started = Instant::now();
    testbed::eventually(Duration::from_secs(60), "ca-syncer to write the target Secret", || async {
        target_bundle(client).await.filter(|b| b.contains(&before))
    })
    .await;
    eprintln!("ca-syncer (in its pod) wrote railgrid-system/kcp-ca after {:.1?}", started.elapsed());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "consumer"},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65535, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "consumer",
                "image": peers::PAUSE_IMAGE,
                "imagePullPolicy": "Never",
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "ca", "mountPath": "/etc/kcp-ca", "readOnly": true}],
            }],
            "volumes": [{"name": "ca", "secret": {"secretName": "kcp-ca"}}],
        },
    }))?;
    let pods = Api::<Pod>::namespaced(client.clone(), "railgrid-system");
    pods.create(&PostParams::default(), &pod).await?;
    let uid = testbed::eventually(Duration::from_secs(120), "the consumer pod Running", || async {
        let pod = pods.get("consumer").await.ok()?;
        (pod.status?.phase.as_deref() == Some("Running")).then_some(pod.metadata.uid?)
    })
    .await;
    let file = node.kubelet_root().join(format!("pods/{uid}/volumes/kubernetes.io~secret/ca/ca.crt"));
    let mounted = node.read_inside(&file)?;
    ensure!(mounted.contains(&before), "the consumer's mounted ca.crt lacks the source CA:\n{mounted}");

    // The source CA changes (a new CA, as a re-issued root would be).
    let after = testbed::certs::Ca::new("kcp-root-ca-2", Duration::from_secs(365 * 24 * 3600))?.cert_pem();
    let patch = json!({"stringData": {"ca.crt": after}});
    Api::<Secret>::namespaced(client.clone(), "kcp-system")
        .patch("root-server-ca", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
        .await?;
    let changed = Instant::now();
    let after = after.trim().to_string();
    testbed::eventually(Duration::from_secs(60), "the new CA in the target Secret", || async {
        target_bundle(client).await.filter(|b| b.contains(&after))
    })
    .await;
    let in_secret = changed.elapsed();
    testbed::eventually(Duration::from_secs(180), "the new CA in the consumer's mounted file", || async {
        node.read_inside(&file).ok().filter(|m| m.contains(&after))
    })
    .await;
    eprintln!(
        "a source CA change reached the target Secret in {in_secret:.1?} and the consumer pod's mounted file in {:.1?}",
        changed.elapsed()
    );
    Ok(())
}
