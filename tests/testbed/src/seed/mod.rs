//! The seed's layout on the real node (`crate::node`), every part the real program as the operator runs it:
//! cert-manager's controller (its own chart's Deployment and RBAC, rendered by `helm template` from the same
//! source tree the binary and the CRDs come from), the kcp-operator (its CRDs and RBAC from its archive), a
//! self-signed `Issuer`, an etcd StatefulSet per shard, and the `RootShard`, `Shard`, `FrontProxy` and
//! `Kubeconfig` objects the operator turns into kcp Deployments and an admin kubeconfig.
//!
//! cert-manager's webhook is not run: the CRDs of v1.21.1 serve only `v1` (no conversion is needed), and the
//! objects the operator writes (Certificates, Issuers) are valid without its admission checks. The chart's
//! webhook and cainjector templates are left out of the rendering for that reason.

mod broken_chain;
pub mod images;
pub mod layout;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

use crate::node::Node;
use layout::{CERT_MANAGER_NAMESPACE, NAMESPACE, OPERATOR_NAMESPACE};

/// The peer artefacts the layout needs besides the node's own.
pub const PEERS: &[&str] = &[
    "cert-manager-controller-crds",
    "cert-manager-chart",
    "kcp-operator-crds",
    "kcp-operator-deploy-crds",
    "kcp-operator-rbac",
    "helm",
];

fn progress(msg: &str) {
    eprintln!("testbed: seed: {msg}");
}

/// The layout, installed and Ready.
pub struct Installed {
    /// From applying the seed's objects until the operator's Deployments were all Available and the admin
    /// kubeconfig was rendered.
    pub ready_in: Duration,
    /// The Deployments the operator made in `kcp-system` (root shard, its proxy, `alpha`, the front proxy).
    pub deployments: Vec<String>,
}

/// Builds the images (first time only), imports them, installs cert-manager and the operator, applies the
/// layout and waits until it serves.
pub async fn install(node: &Node) -> Result<Installed> {
    let mut names: Vec<&str> = PEERS.to_vec();
    names.extend(images::PEERS);
    let peers = peers::locate_only(&names)?;
    let started = Instant::now();
    for (image, archive) in images::ensure(&peers)? {
        node.import_image(&archive).with_context(|| format!("importing {}", image.reference))?;
    }
    let present = node.images()?;
    for image in images::IMAGES {
        ensure!(
            present.iter().any(|i| i == image.reference),
            "{} is not in the node's containerd: {present:?}",
            image.reference
        );
    }
    progress(&format!("images built and imported in {:.1?}", started.elapsed()));
    let client = node.client().await?;
    let work = node.dir.join("seed");
    std::fs::create_dir_all(&work)?;
    let namespaces: Vec<Value> = [CERT_MANAGER_NAMESPACE, OPERATOR_NAMESPACE, NAMESPACE]
        .iter()
        .map(|ns| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
        .collect();
    apply(node, &work, "namespaces", &namespaces)?;

    // cert-manager: the CRDs of the controller's own tree, then its chart's controller objects only.
    crate::crds::install(&client, crate::crds::read(peers.path("cert-manager-controller-crds"))?).await?;
    // The chart checks the cluster's version; `helm template` knows none unless told (the node's).
    let kube_version = node.peers.artefacts.iter().find(|a| a.name == "kube-apiserver").map(|a| a.version);
    let kube_version = kube_version.context("the node has no kube-apiserver peer")?;
    let rendered = cert_manager_manifests(peers.path("helm"), peers.path("cert-manager-chart"), kube_version, &work)?;
    kubectl_ok(node, &["apply", "--server-side", "-f", &rendered])?;

    // The operator: its CRDs (both API groups), its RBAC, its Deployment.
    let mut crds = crate::crds::read(peers.path("kcp-operator-crds"))?;
    crds.extend(crate::crds::read(peers.path("kcp-operator-deploy-crds"))?);
    crate::crds::install(&client, crds).await?;
    let rbac = peers.path("kcp-operator-rbac");
    for file in ["role.yaml", "leader_election_role.yaml"] {
        let path = rbac.join(file).display().to_string();
        kubectl_ok(node, &["apply", "--server-side", "-n", OPERATOR_NAMESPACE, "-f", &path])?;
    }
    apply(node, &work, "operator", &layout::operator())?;
    rollout(node, CERT_MANAGER_NAMESPACE, "deployment/cert-manager", "3m")?;
    rollout(node, OPERATOR_NAMESPACE, "deployment/kcp-operator", "3m")?;
    progress(&format!("cert-manager and the kcp-operator Ready at {:.1?}", started.elapsed()));

    // The layout, started again once from an empty namespace when cert-manager broke a chain on the way
    // (`broken_chain`: it cannot recover) or it did not serve within its time; the first attempt's state is
    // printed, so a retry is never silent.
    let mut attempt = 1;
    loop {
        match layout(node, &client, &work).await {
            Ok(installed) => return Ok(installed),
            Err(e) if attempt == 1 => {
                progress(&format!("the layout did not come up, starting it again from an empty {NAMESPACE}: {e:#}"));
                reset(node)?;
                attempt += 1;
            }
            Err(e) => return Err(e.context("the layout did not come up on the second attempt either")),
        }
    }
}

/// Applies the layout's objects (an Issuer, the etcds, the operator's objects) and waits until the operator's
/// Deployments are Available and the admin kubeconfig is rendered.
async fn layout(node: &Node, client: &kube::Client, work: &Path) -> Result<Installed> {
    let layout_started = Instant::now();
    let mut objects = vec![layout::issuer()];
    for (shard, members) in layout::ETCD_MEMBERS {
        objects.extend(layout::etcd(shard, members));
    }
    objects.extend([
        layout::root_shard(),
        layout::shard(),
        layout::front_proxy(),
        layout::kubeconfig(),
        layout::hub_kubeconfig(),
    ]);
    apply(node, work, "layout", &objects)?;
    for (shard, _) in layout::ETCD_MEMBERS {
        rollout(node, NAMESPACE, &format!("statefulset/etcd-{shard}"), "5m")?;
    }
    progress(&format!("etcd Ready at {:.1?} after the layout was applied", layout_started.elapsed()));

    let deployments = Api::<Deployment>::namespaced(client.clone(), NAMESPACE);
    // The root shard, its proxy, the alpha shard and the front proxy: the operator creates each once the
    // certificates it mounts exist, so they appear one by one.
    let deadline = Instant::now() + Duration::from_secs(600);
    let names = loop {
        let list = deployments.list(&ListParams::default()).await?;
        let names: Vec<String> = list.items.iter().filter_map(|d| d.metadata.name.clone()).collect();
        let ready = list.items.iter().all(available);
        if names.len() >= 4 && ready {
            break names;
        }
        if let Err(e) = broken_chain::check(client).await {
            bail!("{e:#}\n{}", describe(node)?);
        }
        if Instant::now() > deadline {
            bail!("the operator's Deployments were not all Available within 10 minutes: {}", describe(node)?);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let secrets = Api::<Secret>::namespaced(client.clone(), NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(300);
    while secrets.get_opt(layout::KUBECONFIG_SECRET).await?.is_none() {
        if Instant::now() > deadline {
            bail!("the operator rendered no {} within 5 minutes: {}", layout::KUBECONFIG_SECRET, describe(node)?);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let ready_in = layout_started.elapsed();
    progress(&format!("layout Ready in {ready_in:.1?}: {names:?}"));
    Ok(Installed { ready_in, deployments: names })
}

/// Deletes the layout's namespace (every object the layout and the operator made in it: the operator's objects
/// first, so it does not make again what the namespace's deletion removes) and makes it again, empty.
fn reset(node: &Node) -> Result<()> {
    let started = Instant::now();
    kubectl_ok(
        node,
        &["delete", "-n", NAMESPACE, "rootshards,shards,frontproxies,kubeconfigs", "--all", "--wait", "--timeout=5m"],
    )?;
    kubectl_ok(node, &["delete", "namespace", NAMESPACE, "--wait", "--timeout=5m"])?;
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    apply(node, &node.dir.join("seed"), "namespace-again", &[namespace])?;
    progress(&format!("{NAMESPACE} deleted and made again in {:.1?}", started.elapsed()));
    Ok(())
}

/// Waits until the layout is as a test that changed it must leave it: every Deployment of the kcp components
/// rolled out with no pod of an older revision left, no pod of the namespace being deleted, and every address a
/// Service's EndpointSlices offer as ready a Running pod's; and that it stays so for `quiet` (the operator may
/// roll a Deployment again for a certificate it re-issued a moment later). The other tests of a binary use the
/// layout as soon as such a test lets go of it: a request then sent to an address of a pod already gone is never
/// answered. Fails after 5 minutes with the layout's state.
pub async fn settled(node: &Node, client: &kube::Client, quiet: Duration) -> Result<()> {
    // When the layout was last seen settled without a break since.
    let since = std::cell::Cell::new(None::<Instant>);
    let settled = crate::eventually_seen(Duration::from_secs(300), "the layout settled", || async {
        if let Some(why) = unsettled(client).await? {
            since.set(None);
            return Ok(Err(why));
        }
        let from = since.get().unwrap_or_else(Instant::now);
        since.set(Some(from));
        Ok(if from.elapsed() >= quiet { Ok(()) } else { Err(format!("settled for {:.0?}", from.elapsed())) })
    })
    .await;
    settled.map_err(|e| anyhow::anyhow!("{e:#}\n{}", describe(node).unwrap_or_default()))
}

/// What keeps the layout from being settled, if anything.
async fn unsettled(client: &kube::Client) -> Result<Option<String>> {
    let deployments = Api::<Deployment>::namespaced(client.clone(), NAMESPACE).list(&ListParams::default()).await?;
    for d in &deployments.items {
        let want = d.spec.replicas.unwrap_or(1);
        let all = d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        if !available(d) || all != want {
            return Ok(Some(format!(
                "deployment/{} rolling: {:?}",
                d.metadata.name.as_deref().unwrap_or(""),
                d.status
            )));
        }
    }
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE).list(&ListParams::default()).await?;
    let mut running = Vec::new();
    for pod in &pods.items {
        let name = pod.metadata.name.as_deref().unwrap_or("");
        if pod.metadata.deletion_timestamp.is_some() {
            return Ok(Some(format!("pod/{name} is being deleted")));
        }
        let status = pod.status.as_ref();
        if status.and_then(|s| s.phase.as_deref()) == Some("Running") {
            running.extend(status.and_then(|s| s.pod_ip.clone()));
        }
    }
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), NAMESPACE).list(&ListParams::default()).await?;
    for slice in &slices.items {
        for endpoint in slice.endpoints.iter().flatten() {
            let ready = endpoint.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false);
            if let Some(gone) = endpoint.addresses.iter().find(|a| ready && !running.contains(a)) {
                let name = slice.metadata.name.as_deref().unwrap_or("");
                return Ok(Some(format!("endpointslice/{name} offers {gone}, no Running pod's address")));
            }
        }
    }
    Ok(None)
}

fn available(d: &Deployment) -> bool {
    let want = d.spec.replicas.unwrap_or(1);
    let status = d.status.clone().unwrap_or_default();
    status.observed_generation >= d.metadata.generation
        && status.updated_replicas.unwrap_or(0) >= want
        && status.available_replicas.unwrap_or(0) >= want
}

/// What is running in the layout's namespaces and the last events, for a failure message. The kcp components'
/// logs come first: what a log collector keeps of a long message is its start.
pub fn describe(node: &Node) -> Result<String> {
    let mut out = String::new();
    // The end of each kcp component's log (its previous run too, when it restarted).
    for deployment in ["alpha-shard-kcp", "root-kcp", "root-proxy", "frontproxy-front-proxy"] {
        for previous in ["--previous=true", "--previous=false"] {
            let target = format!("deployment/{deployment}");
            let o = node.kubectl(&["logs", "-n", NAMESPACE, &target, previous, "--tail=8"])?;
            out.push_str(&format!("\n--- logs {deployment} {previous}\n"));
            // A kcp log line can run to kilobytes (a CRD's name, a whole mapping); its start says what it is.
            for line in String::from_utf8_lossy(&o.stdout).lines().chain(String::from_utf8_lossy(&o.stderr).lines()) {
                out.extend(line.chars().take(700));
                out.push('\n');
            }
        }
    }
    for args in [
        &["get", "events", "-A", "--field-selector=type=Warning", "--sort-by=.lastTimestamp"][..],
        &["get", "pods,deployments,statefulsets,certificates,issuers", "-A", "-o", "wide"][..],
        &["get", "events", "-A", "--sort-by=.lastTimestamp"][..],
        &["get", "rootshards,shards,frontproxies,kubeconfigs", "-n", NAMESPACE, "-o", "yaml"][..],
    ] {
        let o = node.kubectl(args)?;
        out.push_str(&format!("\n--- kubectl {}\n", args.join(" ")));
        out.push_str(&String::from_utf8_lossy(&o.stdout));
        out.push_str(&String::from_utf8_lossy(&o.stderr));
    }
    Ok(out)
}

/// `kubectl rollout status` (what the seed's Verify section runs), failing with the state of the layout.
pub fn rollout(node: &Node, namespace: &str, object: &str, timeout: &str) -> Result<()> {
    let o = node.kubectl(&["rollout", "status", "-n", namespace, object, &format!("--timeout={timeout}")])?;
    if !o.status.success() {
        bail!(
            "kubectl rollout status {namespace}/{object}: {}{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
            describe(node)?
        );
    }
    Ok(())
}

pub fn kubectl_ok(node: &Node, args: &[&str]) -> Result<String> {
    let o = node.kubectl(args)?;
    ensure!(
        o.status.success(),
        "kubectl {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Objects as one YAML file under `work`, applied server-side.
pub fn apply(node: &Node, work: &Path, name: &str, objects: &[Value]) -> Result<()> {
    let file = work.join(format!("{name}.yaml"));
    let mut text = String::new();
    for object in objects {
        text.push_str("---\n");
        text.push_str(&serde_yaml::to_string(object)?);
    }
    std::fs::write(&file, text)?;
    kubectl_ok(node, &["apply", "--server-side", "-f", &file.display().to_string()])?;
    Ok(())
}

/// cert-manager's chart from its source tree, rendered for the controller alone (Deployment, ServiceAccount,
/// RBAC, Service): image pinned to the controller built here, no webhook, no cainjector, no startup check.
fn cert_manager_manifests(helm: &Path, chart: &Path, kube_version: &str, work: &Path) -> Result<String> {
    let home = work.join("helm");
    std::fs::create_dir_all(&home)?;
    let mut cmd = std::process::Command::new(helm);
    cmd.args(["template", "cert-manager"])
        .arg(chart)
        .args(["--namespace", CERT_MANAGER_NAMESPACE, "--kube-version", kube_version])
        .args(["--set", &format!("image.repository={}", images::CERT_MANAGER_REPOSITORY)])
        .args(["--set", &format!("image.tag={}", peers::CERT_MANAGER_CONTROLLER)])
        .args(["--set", "image.pullPolicy=IfNotPresent"])
        .args(["--set", "replicaCount=1"]);
    for template in ["deployment.yaml", "serviceaccount.yaml", "rbac.yaml", "service.yaml"] {
        cmd.args(["--show-only", &format!("templates/{template}")]);
    }
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    let out = cmd.output().context("starting helm template")?;
    ensure!(out.status.success(), "helm template cert-manager: {}", String::from_utf8_lossy(&out.stderr));
    let file: PathBuf = work.join("cert-manager.yaml");
    std::fs::write(&file, &out.stdout)?;
    Ok(file.display().to_string())
}
