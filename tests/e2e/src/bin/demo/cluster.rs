//! `cargo xtask demo --cluster`: the same four agents, as pods. A one-node cluster (`testbed::node`: etcd,
//! kube-apiserver, controller-manager, scheduler, kube-proxy, containerd, kubelet and CoreDNS inside a network
//! namespace of their own), the images `cargo xtask images` built imported into its containerd, and the chart
//! installed with `helm install --wait` (`chart::on_node`, the set-up the chart's node tests use). Each `ok`
//! line is read from the cluster, what the agent in its pod did: the object it wrote, and the pod holding its
//! Lease.

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chart::NAMESPACE;
use chart::on_node::{self, HUB};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use testbed::node::Node;

/// How long each agent gets to show its first cycle once the install is Ready (a loaded 2-core machine).
const CYCLE: Duration = Duration::from_secs(180);

pub async fn run(once: bool) -> Result<ExitCode> {
    let started = Instant::now();
    let peers = peers::locate_only(testbed::node::PEERS)?;
    let dir = node_dir()?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    eprintln!("demo: starting a one-node cluster in {}", dir.display());
    let node = Node::start(&peers, &dir).await?;
    eprintln!("demo: importing the agents' images, seeding etcd, S3 and the kcp-like objects, helm install --wait");
    let installed = on_node::install(&node).await?;
    let client = node.client().await?;

    println!("cluster is up (node Ready in {:.0?}, helm install --wait in {:.0?}):", node.ready_in, installed.took);
    println!("  export KUBECONFIG={}", node.kubeconfig.display());
    println!("  kubectl get pods -A    (kubectl: {})", node.peers.path("kubectl").display());
    println!("  kubectl -n {NAMESPACE} logs deploy/kcp-keeper-etcd-snapshotter");
    println!("  helm -n {NAMESPACE} status kcp-keeper    (helm: {})", node.peers.path("helm").display());
    println!("  etcd and S3 run inside the node behind the Services kcp-system/etcd-root and kcp-system/s3");
    println!("  node files and logs: {}", node.dir.display());

    let lines = vec![
        line("ca-syncer", ca_syncer(&client).await),
        line("dns-rewriter", dns_rewriter(&client).await),
        line("kubeconfig-rotator", kubeconfig_rotator(&client).await),
        line("etcd-snapshotter", etcd_snapshotter(&node, &client).await),
    ];
    for line in &lines {
        println!("{line}");
    }
    eprintln!("demo: the cluster demo took {:.0?}", started.elapsed());
    let all_ok = lines.iter().all(|l| l.starts_with("ok "));
    if once {
        // Dropping the peers and the node stops them (and the node's reaper removes what is left).
        drop(installed);
        drop(node);
        return Ok(if all_ok { ExitCode::SUCCESS } else { ExitCode::FAILURE });
    }
    println!("running; the agents run in their pods (kubectl above); press Ctrl-C to stop the cluster");
    let _keep = (installed, node);
    std::future::pending::<()>().await;
    unreachable!()
}

/// Next to the demo binary (the target directory), cleared at the next start, so logs outlive a failed run
/// without piling up.
fn node_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    Ok(exe.parent().context("the demo binary has no directory")?.join("demo-cluster"))
}

fn line(agent: &str, result: Result<String>) -> String {
    match result {
        Ok(summary) => format!("ok {agent}: {summary}"),
        Err(e) => format!("FAIL {agent}: {e:#}"),
    }
}

/// `f` until it answers, at most `timeout`; an error naming `what` after that.
async fn within<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("no {what} after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The pod holding the agent's Lease: the replica that did the work.
async fn leader(client: &kube::Client, agent: &str) -> Result<String> {
    within(CYCLE, &format!("holder of Lease kcp-keeper-{agent}"), || async {
        let lease = Api::<Lease>::namespaced(client.clone(), NAMESPACE).get_opt(&format!("kcp-keeper-{agent}")).await;
        lease.ok()??.spec?.holder_identity.filter(|h| !h.is_empty())
    })
    .await
}

fn key_of(secret: Option<Secret>, key: &str) -> Option<String> {
    String::from_utf8(secret?.data?.get(key)?.0.clone()).ok()
}

async fn ca_syncer(client: &kube::Client) -> Result<String> {
    let source = Api::<Secret>::namespaced(client.clone(), "kcp-system").get("root-server-ca").await?;
    let ca = key_of(Some(source), "ca.crt").context("the source has no ca.crt")?;
    let ca = ca.trim().to_string();
    let targets = Api::<Secret>::namespaced(client.clone(), "railgrid-system");
    let bundle = within(CYCLE, "CA in Secret railgrid-system/kcp-ca", || async {
        key_of(targets.get_opt("kcp-ca").await.ok()?, "ca.crt").filter(|b| b.contains(&ca))
    })
    .await?;
    let count = bundle.matches("-----BEGIN CERTIFICATE-----").count();
    let pod = leader(client, "ca-syncer").await?;
    Ok(format!(
        "copied the CA of kcp-system/root-server-ca ({count} certificate(s)) into railgrid-system/kcp-ca, from pod {pod}"
    ))
}

async fn dns_rewriter(client: &kube::Client) -> Result<String> {
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
    let rule = "rewrite name exact kcp-root.example.com. root-kcp.kcp-system.svc.cluster.local.";
    within(CYCLE, "rule in kube-system/coredns-custom", || async {
        let cm = config_maps.get_opt("coredns-custom").await.ok()??;
        cm.data?.get("kcp-split-horizon.override").filter(|s| s.contains(rule)).map(|_| ())
    })
    .await?;
    let pod = leader(client, "dns-rewriter").await?;
    Ok(format!(
        "wrote kcp-root.example.com -> root-kcp.kcp-system.svc.cluster.local into k3s's kube-system/coredns-custom, \
         from pod {pod}"
    ))
}

async fn kubeconfig_rotator(client: &kube::Client) -> Result<String> {
    let source = Api::<Secret>::namespaced(client.clone(), "kcp-system").get("hub-admin-kubeconfig").await?;
    let source = key_of(Some(source), "kubeconfig").context("the source has no kubeconfig")?;
    let certificate = client_certificate(&source)?;
    let targets = Api::<Secret>::namespaced(client.clone(), "railgrid-system");
    within(CYCLE, "the proven kubeconfig in railgrid-system/railgrid-kcp", || async {
        let published = key_of(targets.get_opt("railgrid-kcp").await.ok()?, "admin.kubeconfig")?;
        (client_certificate(&published).ok()? == certificate).then_some(())
    })
    .await?;
    let hubs = Api::<Deployment>::namespaced(client.clone(), "railgrid-system");
    within(CYCLE, &format!("restart of railgrid-system/{HUB}"), || async {
        let annotations = hubs.get(HUB).await.ok()?.spec.template.metadata?.annotations?;
        annotations.contains_key("kcp-keeper.io/restarted-for-hub-admin").then_some(())
    })
    .await?;
    let pod = leader(client, "kubeconfig-rotator").await?;
    Ok(format!(
        "proved hub-admin's certificate against the apiserver (SelfSubjectReview), published it to \
         railgrid-system/railgrid-kcp and restarted deployment/{HUB}, from pod {pod}"
    ))
}

async fn etcd_snapshotter(node: &Node, client: &kube::Client) -> Result<String> {
    let list = ["/etcd-snapshotter", "list", "--shard", "root"];
    let listed = within(CYCLE, "scheduled snapshot of shard root", || async {
        on_node::exec_in_agent(node, "etcd-snapshotter", &list)
            .ok()
            .filter(|out| out.lines().any(|l| l.starts_with("root/")))
    })
    .await?;
    let id = listed.lines().find(|l| l.starts_with("root/")).and_then(|l| l.split_whitespace().next()).unwrap_or("?");
    let pod = leader(client, "etcd-snapshotter").await?;
    Ok(format!(
        "streamed snapshot {id} of etcd-root.kcp-system.svc:{} to s3://kcp-backups (s3.kcp-system.svc:{}), \
         encrypted, listed from inside pod {pod}",
        on_node::ETCD_PORT,
        on_node::S3_PORT
    ))
}

/// The client certificate a kubeconfig carries (its only user's `client-certificate-data`).
fn client_certificate(kubeconfig: &str) -> Result<String> {
    let doc: serde_json::Value = serde_yaml::from_str(kubeconfig)?;
    let data = doc["users"][0]["user"]["client-certificate-data"].as_str().context("no client-certificate-data")?;
    Ok(data.to_string())
}
