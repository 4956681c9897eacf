//! The seed's layout with every part real, in pods on the real node (issue 24, items 2 and 3): cert-manager's
//! controller and the kcp-operator, built here from their source archives, reconcile a `RootShard`, a `Shard`,
//! a `FrontProxy` and a `Kubeconfig` into kcp Deployments on their own etcd StatefulSets; then the seed's Verify
//! section runs from a pod inside the cluster. The layout is installed once per binary (`testbed::seed`), on
//! this binary's own node (`node-bed-seed_layout`). Then kcp-keeper, installed by its own chart on that layout,
//! does each agent's job against the real programs (item 4; one module per agent, one install per binary).

use std::sync::OnceLock;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};
use testbed::node::{self, Node};
use testbed::seed::images::{KCP_IMAGE, PROBE_IMAGE};
use testbed::seed::layout::{self, ADMIN_GROUP, ADMIN_USER, EXTERNAL_HOST, EXTERNAL_PORT, FRONT_PROXY_IP, NAMESPACE};
use testbed::seed::{self, Installed};

mod ca_syncer;
mod consumer;
mod dns_rewriter;
mod doctor;
mod etcd_snapshotter;
mod everything;
mod kubeconfig_rotator;
mod restore_installation;
mod upgrade;

static LAYOUT: OnceLock<Result<Installed, String>> = OnceLock::new();

/// Held for writing by a test that changes the shared layout for a while (upgrade.rs rolls alpha's kcp to another
/// tag and back); a test that needs the layout as installed takes it for reading.
static LAYOUT_CHANGES: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn layout() -> &'static Installed {
    testbed::shared_for_binary(&LAYOUT, "seed layout", || seed::install(node::shared()))
}

static KEEPER: OnceLock<Result<chart::on_seed::Installed, String>> = OnceLock::new();

/// kcp-keeper installed by its chart on the Ready layout, once per binary.
fn keeper() -> &'static chart::on_seed::Installed {
    testbed::shared_for_binary(&KEEPER, "kcp-keeper on the seed layout", || async {
        layout();
        chart::on_seed::install(node::shared()).await
    })
}

/// `etcdctl endpoint status -w json` over the `members` members of `shard`'s etcd, run in its first member's pod.
fn etcd_status(node: &Node, shard: &str, members: u32) -> Result<Value> {
    let endpoints = layout::etcd_endpoints(shard, members).join(",");
    let pod = format!("etcd-{shard}-0");
    let out = node.kubectl(&[
        "exec",
        "-n",
        NAMESPACE,
        &pod,
        "--",
        "/usr/local/bin/etcdctl",
        &format!("--endpoints={endpoints}"),
        "endpoint",
        "status",
        "-w",
        "json",
    ])?;
    ensure!(out.status.success(), "etcdctl endpoint status: {}", String::from_utf8_lossy(&out.stderr));
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The probe pod of the Verify checks: kubectl, http-probe (a GET with no credentials at all, for the 401/403
/// pair: kubectl prompts for a password instead) and pause, no shell; the public name mapped to the front
/// proxy's ClusterIP as split-horizon DNS would answer it, the rendered admin kubeconfig and the server CA
/// mounted, and a ServiceAccount that may read the Deployments (rollout status).
const PROBE: &str = "seed-verify";
static PROBE_STARTED: OnceLock<Result<(), String>> = OnceLock::new();

fn probe() -> &'static () {
    testbed::shared_for_binary(&PROBE_STARTED, "seed probe pod", || start_probe(node::shared()))
}

async fn start_probe(node: &Node) -> Result<()> {
    layout();
    let work = node.dir.join("seed");
    let objects = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": PROBE, "namespace": NAMESPACE}}),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": PROBE, "namespace": NAMESPACE},
            "rules": [{"apiGroups": ["apps"], "resources": ["deployments", "replicasets"], "verbs": ["get", "list", "watch"]},
                      {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": PROBE, "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": PROBE},
            "subjects": [{"kind": "ServiceAccount", "name": PROBE, "namespace": NAMESPACE}],
        }),
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": PROBE, "namespace": NAMESPACE},
            "spec": {
                "serviceAccountName": PROBE,
                "hostAliases": [{"ip": FRONT_PROXY_IP, "hostnames": [EXTERNAL_HOST]}],
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "probe",
                    "image": PROBE_IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [
                        {"name": "admin", "mountPath": "/kcp/admin", "readOnly": true},
                        {"name": "ca", "mountPath": "/kcp/ca", "readOnly": true},
                    ],
                }],
                "volumes": [
                    {"name": "admin", "secret": {"secretName": layout::KUBECONFIG_SECRET}},
                    {"name": "ca", "secret": {"secretName": format!("{}-server-ca", layout::ROOT_SHARD)}},
                ],
            },
        }),
    ];
    seed::apply(node, &work, "verify", &objects)?;
    seed::kubectl_ok(
        node,
        &["wait", "-n", NAMESPACE, "--for=condition=Ready", &format!("pod/{PROBE}"), "--timeout=120s"],
    )?;
    Ok(())
}

/// `kubectl <args>` run inside the probe pod, at `-v=6` so every request's status code is logged: the exit
/// status, stdout, and the `<METHOD> <url> <code>` of each request it made.
struct InPod {
    success: bool,
    stdout: String,
    stderr: String,
    requests: Vec<(String, u16)>,
}

fn in_pod(node: &Node, args: &[&str]) -> Result<InPod> {
    let mut full = vec!["exec", "-n", NAMESPACE, PROBE, "-c", "probe", "--", "/kubectl", "-v=6"];
    full.extend_from_slice(args);
    let out = node.kubectl(&full)?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    Ok(InPod {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        requests: requests(&stderr),
        stderr,
    })
}

/// The requests of a `kubectl -v=6` log: lines like `... "Response" verb="GET" url="https://..." status="403
/// Forbidden" milliseconds=3` (klog's structured form) or `GET https://... 403 Forbidden in 3 milliseconds`.
fn requests(log: &str) -> Vec<(String, u16)> {
    let mut out = Vec::new();
    for line in log.lines() {
        let field = |name: &str| {
            let start = line.find(&format!("{name}=\""))? + name.len() + 2;
            let end = line[start..].find('"')? + start;
            Some(line[start..end].to_string())
        };
        if let (Some(url), Some(status)) = (field("url"), field("status")) {
            if let Some(code) = status.split_whitespace().next().and_then(|c| c.parse().ok()) {
                out.push((url, code));
            }
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if let Some(i) = words.iter().position(|w| ["GET", "POST"].contains(w))
            && let (Some(url), Some(code)) = (words.get(i + 1), words.get(i + 2).and_then(|c| c.parse().ok()))
            && url.starts_with("http")
        {
            out.push((url.to_string(), code));
        }
    }
    out
}

/// A GET with no credentials from the probe pod, trusting only the root shard's server CA: status and body.
fn anonymous_get(node: &Node, url: &str) -> Result<(u16, String)> {
    let args = ["exec", "-n", NAMESPACE, PROBE, "-c", "probe", "--", "/http-probe", "-ca", "/kcp/ca/tls.crt", url];
    let out = node.kubectl(&args)?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(out.status.success(), "http-probe {url}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    let (code, body) = stdout.split_once('\n').unwrap_or((&stdout, ""));
    Ok((code.parse().with_context(|| format!("http-probe printed {stdout:?}"))?, body.to_string()))
}

#[test]
fn requests_are_read_from_both_kubectl_log_forms() {
    let log = "I1201 10:00:00.1 1 round_trippers.go:632] \"Response\" verb=\"GET\" url=\"https://a:6443/api?timeout=32s\" status=\"403 Forbidden\" milliseconds=3\n\
               I1201 10:00:00.2 1 round_trippers.go:553] GET https://b:6443/readyz 200 OK in 4 milliseconds\n";
    assert_eq!(
        requests(log),
        vec![("https://a:6443/api?timeout=32s".to_string(), 403), ("https://b:6443/readyz".to_string(), 200)]
    );
}

#[tokio::test]
async fn the_operator_runs_the_root_shard_its_proxy_alpha_and_the_front_proxy_from_the_pinned_kcp_image_on_their_own_etcds()
-> Result<()> {
    // The layout as installed: not while upgrade.rs rolls alpha to another tag.
    let _layout = crate::LAYOUT_CHANGES.read().await;
    let node = node::shared();
    let installed = layout();
    eprintln!("layout Ready in {:.1?} after its objects were applied", installed.ready_in);
    let client = node.client().await?;
    let want = ["root-kcp", "root-proxy", "alpha-shard-kcp", "frontproxy-front-proxy"];
    for name in want {
        ensure!(installed.deployments.iter().any(|d| d == name), "no Deployment {name}: {:?}", installed.deployments);
    }
    let deployments = Api::<Deployment>::namespaced(client.clone(), NAMESPACE);
    for name in want {
        let d = deployments.get(name).await?;
        let spec = d.spec.template.spec.context("a Deployment has a pod template")?;
        for c in &spec.containers {
            ensure!(c.image.as_deref() == Some(KCP_IMAGE), "{name}/{} runs {:?}, not {KCP_IMAGE}", c.name, c.image);
        }
        seed::rollout(node, NAMESPACE, &format!("deployment/{name}"), "60s")?;
    }
    // Each shard on its own etcd: the root shard's pods name the three members of etcd-root, alpha's the one
    // of etcd-alpha, and the members are all Ready.
    for (deployment, shard, members) in [("root-kcp", "root", 3), ("alpha-shard-kcp", "alpha", 1)] {
        let d = deployments.get(deployment).await?;
        let args = d.spec.template.spec.map(|s| s.containers[0].args.clone().unwrap_or_default());
        let servers = args
            .unwrap_or_default()
            .iter()
            .find_map(|a| a.strip_prefix("--etcd-servers=").map(str::to_string))
            .with_context(|| format!("{deployment} has no --etcd-servers"))?;
        ensure!(servers.split(',').count() == members, "{deployment}: --etcd-servers={servers}");
        ensure!(servers.contains(&format!("etcd-{shard}-0.etcd-{shard}.")), "{deployment}: --etcd-servers={servers}");
    }
    // Ready is the kubelet's probe of each member's /health every 2 s: on a loaded machine a member may miss a few
    // for a while (seen: 1 of 3 Ready at one instant), so the members must all be Ready again within 2 minutes.
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    for (shard, members) in layout::ETCD_MEMBERS {
        let what = format!("etcd-{shard}'s {members} members Ready");
        testbed::eventually(std::time::Duration::from_secs(120), &what, || async {
            let list = pods.list(&ListParams::default().labels(&format!("app=etcd-{shard}"))).await.ok()?;
            let ready = list
                .items
                .iter()
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .count();
            (ready == members as usize).then_some(())
        })
        .await;
    }
    // None of the layout's images was pulled (they are imported: the bed's registry serves kcp-keeper's alone), so
    // the node's events name no pull outside kcp-keeper's namespace, where the agents' images are pulled.
    let events = seed::kubectl_ok(
        node,
        &[
            "get",
            "events",
            "-A",
            "--field-selector",
            "reason=Pulling",
            "-o",
            "custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name",
            "--no-headers",
        ],
    )?;
    let layout_pulls: Vec<&str> =
        events.lines().filter(|l| l.split_whitespace().next().is_some_and(|ns| ns != chart::NAMESPACE)).collect();
    ensure!(layout_pulls.is_empty(), "the layout's images were pulled: {layout_pulls:?}");
    Ok(())
}

#[tokio::test]
async fn the_seeds_verify_section_passes_from_a_pod_readyz_200_anonymous_403_on_a_shard_401_on_the_front_proxy_and_the_admin_kubeconfig_is_kcp_admin_at_root()
-> Result<()> {
    // The layout as installed: not while upgrade.rs rolls alpha to another tag.
    let _layout = crate::LAYOUT_CHANGES.read().await;
    let node = node::shared();
    let installed = layout();
    probe();
    let client = node.client().await?;

    // Rollout status of the root shard, the alpha shard and the front proxy, from inside the cluster.
    for name in ["root-kcp", "alpha-shard-kcp", "frontproxy-front-proxy"] {
        ensure!(installed.deployments.iter().any(|d| d == name), "no Deployment {name}");
        let run =
            in_pod(node, &["rollout", "status", "-n", NAMESPACE, &format!("deployment/{name}"), "--timeout=60s"])?;
        ensure!(
            run.success && run.stdout.contains("successfully rolled out"),
            "rollout status {name}: {}{}",
            run.stdout,
            run.stderr
        );
    }

    // /readyz through the front proxy, by its public name, its serving certificate verified against the server CA.
    let front_proxy = format!("https://{EXTERNAL_HOST}:{EXTERNAL_PORT}");
    let shard = format!("https://{}-shard-kcp.{NAMESPACE}.svc.cluster.local:6443", layout::SHARD);
    let (code, body) = anonymous_get(node, &format!("{front_proxy}/readyz"))?;
    ensure!(code == 200 && body.trim() == "ok", "readyz through the front proxy: {code} {body}");
    // Anonymous /api: a shard knows system:anonymous and forbids it (403); the front proxy refuses an
    // unauthenticated request outright (401). The front proxy routes only workspace paths (its bare `/api`
    // answers 404 page not found), so its /api is the root workspace's.
    let (code, body) = anonymous_get(node, &format!("{shard}/api"))?;
    ensure!(code == 403, "anonymous /api on the alpha shard: {code} {body}");
    let (code, body) = anonymous_get(node, &format!("{front_proxy}/clusters/root/api"))?;
    ensure!(code == 401, "anonymous /clusters/root/api on the front proxy: {code} {body}");

    // The admin kubeconfig the operator rendered: its current context is the front proxy's public name at
    // /clusters/root, and a SelfSubjectReview there says kcp-admin in system:kcp:admin.
    let secret = Api::<Secret>::namespaced(client, NAMESPACE).get(layout::KUBECONFIG_SECRET).await?;
    let kubeconfig = secret.data.and_then(|d| d.get("kubeconfig").cloned()).context("no kubeconfig key")?;
    let kubeconfig: Value = serde_yaml::from_slice(&kubeconfig.0)?;
    let current = kubeconfig["current-context"].as_str().context("no current-context")?;
    let cluster = kubeconfig["contexts"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == current))
        .and_then(|c| c["context"]["cluster"].as_str())
        .context("the current context names no cluster")?;
    let server = kubeconfig["clusters"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == cluster))
        .and_then(|c| c["cluster"]["server"].as_str())
        .context("the cluster has no server")?;
    ensure!(server == format!("https://{EXTERNAL_HOST}:{EXTERNAL_PORT}/clusters/root"), "rendered server {server}");
    let whoami = in_pod(node, &["--kubeconfig=/kcp/admin/kubeconfig", "auth", "whoami", "-o", "json"])?;
    ensure!(whoami.success, "auth whoami: {}{}", whoami.stdout, whoami.stderr);
    ensure!(
        whoami
            .requests
            .iter()
            .any(|(url, code)| url.contains("/clusters/root/apis/authentication.k8s.io/") && *code == 201),
        "the SelfSubjectReview did not go to /clusters/root: {:?}",
        whoami.requests
    );
    let review: Value = serde_json::from_str(&whoami.stdout)?;
    let user = &review["status"]["userInfo"];
    ensure!(user["username"] == ADMIN_USER, "SelfSubjectReview: {review}");
    ensure!(
        user["groups"].as_array().is_some_and(|g| g.iter().any(|g| g == ADMIN_GROUP)),
        "SelfSubjectReview: {review}"
    );
    Ok(())
}
