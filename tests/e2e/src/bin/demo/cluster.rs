//! `cargo xtask demo --cluster`: the same four agents, as pods, on the seed's layout. A one-node cluster
//! (`testbed::node`: etcd, kube-apiserver, controller-manager, scheduler, kube-proxy, containerd, kubelet and
//! CoreDNS inside a network namespace of their own), the seed's layout in it (`testbed::seed`: cert-manager's
//! controller, the kcp-operator, the RootShard `root` on 3 etcd members, the Shard `alpha` on 1, the FrontProxy
//! `frontproxy`, the Kubeconfigs), then the chart installed with `helm install --wait` configured for it
//! (`chart::on_seed`, the set-up of the chart's `seed_layout` tests). Each `ok` line is read from the cluster,
//! what the agent in its pod did against the real programs, and the pod holding its Lease.

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chart::NAMESPACE;
use chart::on_node::{self, HUB};
use chart::on_seed::{self, CA_TARGET, HUB_KEY, HUB_NAMESPACE, HUB_SECRET, ROTATED};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use testbed::node::Node;
use testbed::seed::layout::{self, EXTERNAL_HOST, HUB_KUBECONFIG, NAMESPACE as KCP_NAMESPACE};

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
    eprintln!(
        "demo: the seed's layout: cert-manager, the kcp-operator, etcd, RootShard, Shard, FrontProxy, Kubeconfigs"
    );
    let layout = testbed::seed::install(&node).await?;
    eprintln!("demo: importing the agents' images, S3 in the node, helm install --wait");
    let installed = on_seed::install(&node).await?;
    let client = node.client().await?;

    println!(
        "cluster is up (node Ready in {:.0?}, the seed's layout in {:.0?}, helm install --wait in {:.0?}):",
        node.ready_in, layout.ready_in, installed.took
    );
    println!("  export KUBECONFIG={}", node.kubeconfig.display());
    println!("  kubectl get pods -A    (kubectl: {})", node.peers.path("kubectl").display());
    println!("  kubectl -n {NAMESPACE} logs deploy/kcp-keeper-etcd-snapshotter");
    println!("  helm -n {NAMESPACE} status kcp-keeper    (helm: {})", node.peers.path("helm").display());
    println!("  kubectl get rootshards,shards,frontproxies,kubeconfigs -n {KCP_NAMESPACE}");
    println!("  S3 runs inside the node behind the Service {NAMESPACE}/s3");
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
    let source = format!("{}-server-ca", layout::ROOT_SHARD);
    let ca = key_of(Api::<Secret>::namespaced(client.clone(), KCP_NAMESPACE).get_opt(&source).await?, "tls.crt")
        .context("the server CA has no tls.crt")?;
    let ca = ca.trim().to_string();
    let targets = Api::<Secret>::namespaced(client.clone(), HUB_NAMESPACE);
    let bundle = within(CYCLE, &format!("the server CA in Secret {HUB_NAMESPACE}/{CA_TARGET}"), || async {
        key_of(targets.get_opt(CA_TARGET).await.ok()?, "ca.crt").filter(|b| b.contains(&ca))
    })
    .await?;
    let count = bundle.matches("-----BEGIN CERTIFICATE-----").count();
    let pod = leader(client, "ca-syncer").await?;
    Ok(format!(
        "verified the live front proxy for {EXTERNAL_HOST} with the operator's {KCP_NAMESPACE}/{source} and copied it \
         ({count} certificate(s)) into {HUB_NAMESPACE}/{CA_TARGET}, from pod {pod}"
    ))
}

async fn dns_rewriter(client: &kube::Client) -> Result<String> {
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
    let mut hosts: Vec<&str> = vec![EXTERNAL_HOST];
    hosts.extend(layout::SHARD_HOSTS.iter().map(|(_, host, _)| *host));
    within(CYCLE, "the discovered names in kube-system/coredns-custom", || async {
        let cm = config_maps.get_opt("coredns-custom").await.ok()??;
        let snippet = cm.data?.get("kcp-split-horizon.override").cloned()?;
        hosts.iter().all(|h| snippet.contains(&format!("rewrite name exact {h}. "))).then_some(())
    })
    .await?;
    let pod = leader(client, "dns-rewriter").await?;
    Ok(format!(
        "discovered {} from the operator's FrontProxy, RootShard and Shard and wrote each to its Service into k3s's \
         kube-system/coredns-custom, from pod {pod}",
        hosts.join(", ")
    ))
}

async fn kubeconfig_rotator(client: &kube::Client) -> Result<String> {
    let certificates = Api::<Secret>::namespaced(client.clone(), KCP_NAMESPACE);
    let targets = Api::<Secret>::namespaced(client.clone(), HUB_NAMESPACE);
    // cert-manager's current certificate of the Kubeconfig, published (it renews every 100 s: compare afresh).
    within(CYCLE, &format!("the operator's kubeconfig in {HUB_NAMESPACE}/{HUB_SECRET}"), || async {
        let issued = key_of(certificates.get_opt(&format!("kubeconfig-cert-{HUB_KUBECONFIG}")).await.ok()?, "tls.crt")?;
        let published = key_of(targets.get_opt(HUB_SECRET).await.ok()?, HUB_KEY)?;
        let published = client_certificate(&published).ok()?;
        let published: k8s_openapi::ByteString = serde_json::from_value(serde_json::json!(published)).ok()?;
        let published = String::from_utf8(published.0).ok()?;
        issued.starts_with(published.trim()).then_some(())
    })
    .await?;
    let hubs = Api::<Deployment>::namespaced(client.clone(), HUB_NAMESPACE);
    within(CYCLE, &format!("restart of {HUB_NAMESPACE}/{HUB}"), || async {
        let annotations = hubs.get(HUB).await.ok()?.spec.template.metadata?.annotations?;
        annotations.contains_key(&format!("kcp-keeper.io/restarted-for-{ROTATED}")).then_some(())
    })
    .await?;
    let pod = leader(client, "kubeconfig-rotator").await?;
    Ok(format!(
        "followed Kubeconfig {KCP_NAMESPACE}/{HUB_KUBECONFIG} (cert-manager's certificate, the operator's render), proved it \
         through the front proxy (SelfSubjectReview), published it to {HUB_NAMESPACE}/{HUB_SECRET} and restarted \
         deployment/{HUB}, from pod {pod}"
    ))
}

async fn etcd_snapshotter(node: &Node, client: &kube::Client) -> Result<String> {
    let mut ids = Vec::new();
    for (shard, members) in layout::ETCD_MEMBERS {
        let list = ["/etcd-snapshotter", "list", "--shard", shard];
        let listed = within(CYCLE, &format!("scheduled snapshot of shard {shard}"), || async {
            on_node::exec_in_agent(node, "etcd-snapshotter", &list)
                .ok()
                .filter(|out| out.lines().any(|l| l.starts_with(&format!("{shard}/"))))
        })
        .await?;
        let prefix = format!("{shard}/");
        let id = listed.lines().find(|l| l.starts_with(&prefix)).and_then(|l| l.split_whitespace().next());
        ids.push(format!("{} (etcd-{shard}, {members} member(s))", id.unwrap_or("?")));
    }
    let pod = leader(client, "etcd-snapshotter").await?;
    Ok(format!(
        "streamed snapshots {} to s3://kcp-backups ({NAMESPACE}/s3), listed from inside pod {pod}",
        ids.join(" and ")
    ))
}

/// The client certificate a kubeconfig carries (its only user's `client-certificate-data`).
fn client_certificate(kubeconfig: &str) -> Result<String> {
    let doc: serde_json::Value = serde_yaml::from_str(kubeconfig)?;
    let data = doc["users"][0]["user"]["client-certificate-data"].as_str().context("no client-certificate-data")?;
    Ok(data.to_string())
}
