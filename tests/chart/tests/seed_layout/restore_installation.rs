//! The whole installation back to one point with `etcd-snapshotter restore-installation`, on the real layout: kcp
//! stopped through the kcp-operator's objects, both shards' running etcds given the point, kcp started root
//! first, and the result proven through the front proxy with the hub's own kubeconfig.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use serde_json::{Value, json};
use testbed::node::{self, Node};
use testbed::seed::layout::{self, NAMESPACE};

/// The label this test puts on kcp's Shard objects, so a workspace is placed on the shard it names.
const SHARD_LABEL: &str = "kcp-keeper.io/test-shard";
/// The agent's Deployment and ServiceAccount.
const AGENT: &str = "kcp-keeper-etcd-snapshotter";

/// `kubectl <args>` on the host with `stdin` fed to it: its exit status and output.
fn kubectl_with_stdin(node: &Node, args: &[&str], stdin: &[u8]) -> Result<(bool, String, String)> {
    let mut child = Command::new(node.peers.path("kubectl"))
        .arg("--kubeconfig")
        .arg(&node.kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting kubectl")?;
    child.stdin.take().context("kubectl's stdin")?.write_all(stdin)?;
    let out = child.wait_with_output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// kubectl against kcp (the front proxy, as the operator's admin kubeconfig names it), from the probe pod.
fn kcp(node: &Node, args: &[&str], stdin: Option<&[u8]>) -> Result<String> {
    let mut full = vec!["exec", "-i", "-n", NAMESPACE, "seed-verify", "-c", "probe", "--", "/kubectl"];
    full.push("--kubeconfig=/kcp/admin/kubeconfig");
    full.extend_from_slice(args);
    let (ok, stdout, stderr) = kubectl_with_stdin(node, &full, stdin.unwrap_or_default())?;
    ensure!(ok, "kubectl {args:?} against kcp: {stderr}{stdout}");
    Ok(stdout)
}

/// Workspace `name` under root, placed on `shard`, once Ready.
async fn workspace(node: &Node, name: &str, shard: &str) -> Result<()> {
    let ws = json!({
        "apiVersion": "tenancy.kcp.io/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": name},
        "spec": {"location": {"selector": {"matchLabels": {SHARD_LABEL: shard}}}},
    });
    kcp(node, &["create", "-f", "-"], Some(ws.to_string().as_bytes()))?;
    testbed::eventually(Duration::from_secs(180), &format!("workspace {name} Ready"), || async {
        let phase = kcp(node, &["get", "workspace", name, "-o", "jsonpath={.status.phase}"], None).ok()?;
        (phase == "Ready").then_some(())
    })
    .await;
    Ok(())
}

/// The names of root's workspaces through the front proxy, sorted.
fn workspaces(node: &Node) -> Result<Vec<String>> {
    let out = kcp(node, &["get", "workspaces", "-o", "jsonpath={.items[*].metadata.name}"], None)?;
    let mut names: Vec<String> = out.split_whitespace().map(String::from).collect();
    names.sort();
    Ok(names)
}

/// `etcd-snapshotter <args>` in the agent's pod: exit status and output.
fn in_agent(node: &Node, args: &[&str], stdin: &[u8]) -> Result<(bool, String, String)> {
    let target = format!("deploy/{AGENT}");
    let mut full =
        vec!["exec", "-i", "-n", chart::NAMESPACE, &target, "-c", "etcd-snapshotter", "--", "/etcd-snapshotter"];
    full.extend_from_slice(args);
    kubectl_with_stdin(node, &full, stdin)
}

/// The Role `restore-installation` needs in kcp's namespace (docs/etcd-snapshotter.md), bound to the agent's
/// ServiceAccount for this test only.
fn restore_rbac() -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "kcp-keeper-restore-installation", "namespace": NAMESPACE},
            "rules": [
                {"apiGroups": ["operator.kcp.io"], "resources": ["rootshards", "shards", "frontproxies"],
                 "verbs": ["get", "list", "patch"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "kcp-keeper-restore-installation", "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kcp-keeper-restore-installation"},
            "subjects": [{"kind": "ServiceAccount", "name": AGENT, "namespace": chart::NAMESPACE}],
        }),
    ]
}

/// `shard`'s etcd with its volumes lost: scaled to 0, its cluster token changed, scaled back, every member Ready on
/// an empty data directory.
async fn wipe_etcd(node: &Node, shard: &str) -> Result<()> {
    let name = format!("etcd-{shard}");
    let members = layout::ETCD_MEMBERS.iter().find(|(s, _)| *s == shard).map(|(_, m)| *m).context("a layout shard")?;
    testbed::seed::kubectl_ok(node, &["scale", "-n", NAMESPACE, "statefulset", &name, "--replicas=0"])?;
    testbed::eventually(Duration::from_secs(120), &format!("{name}'s pods gone"), || async {
        let pods = testbed::seed::kubectl_ok(
            node,
            &["get", "pods", "-n", NAMESPACE, "-l", &format!("app={name}"), "-o", "name"],
        )
        .ok()?;
        pods.trim().is_empty().then_some(())
    })
    .await;
    let token = "/spec/template/spec/containers/0/args/8";
    let patch = json!([
        {"op": "test", "path": token, "value": format!("--initial-cluster-token={name}")},
        {"op": "replace", "path": token, "value": format!("--initial-cluster-token={name}-rebuilt")},
    ]);
    testbed::seed::kubectl_ok(
        node,
        &["patch", "-n", NAMESPACE, "statefulset", &name, "--type=json", "-p", &patch.to_string()],
    )?;
    testbed::seed::kubectl_ok(
        node,
        &["scale", "-n", NAMESPACE, "statefulset", &name, &format!("--replicas={members}")],
    )?;
    testbed::seed::rollout(node, NAMESPACE, &format!("statefulset/{name}"), "240s")?;
    Ok(())
}

#[tokio::test]
async fn restore_installation_brings_both_shards_back_to_a_point_between_two_creations_after_their_etcd_volumes_were_lost_through_the_operator_and_proves_it_through_the_front_proxy()
-> Result<()> {
    crate::keeper();
    crate::probe();
    let node = node::shared();
    // kcp is stopped and started: no other test of the binary may use it meanwhile.
    let _changing = crate::LAYOUT_CHANGES.write().await;
    for shard in [layout::ROOT_SHARD, layout::SHARD] {
        kcp(node, &["label", "--overwrite", "shards.core.kcp.io", shard, &format!("{SHARD_LABEL}={shard}")], None)?;
    }
    let before = ["restore-before-root", "restore-before-alpha"];
    let after = ["restore-after-root", "restore-after-alpha"];
    workspace(node, before[0], layout::ROOT_SHARD).await?;
    workspace(node, before[1], layout::SHARD).await?;
    // The point comes once each shard's agent has received and proven every write made so far, the workspaces'
    // too (a restore to a time replays what the agent had received by then).
    for (shard, members) in layout::ETCD_MEMBERS {
        let status = crate::etcd_status(node, shard, members)?;
        let revision = status[0]["Status"]["header"]["revision"].as_u64().context("no revision in etcd's status")?;
        testbed::eventually(
            Duration::from_secs(120),
            &format!("{shard}'s deltas past revision {revision}"),
            || async {
                let point = chart::on_seed::object(node, &format!("{shard}/recovery-point.json")).ok()?;
                (point["revision"].as_u64()? >= revision).then_some(())
            },
        )
        .await;
    }
    // The point is restorable once every shard's deltas reach past it. The agent here snapshots every 20 s, and
    // each snapshot starts a new delta session a few seconds after the one before stopped: a time in that gap no
    // restore can place (plan refuses it and names the nearest ones), so a point that stays refused once both
    // shards' deltas are past it is given up for a later one.
    let mut refused = Vec::new();
    let at_text = loop {
        let at_text = Timestamp::now().to_string();
        let placed = testbed::eventually_seen(Duration::from_secs(60), &format!("plan --at {at_text}"), || async {
            let (ok, _, err) = in_agent(node, &["plan", "--at", &at_text], b"")?;
            Ok(if ok { Ok(()) } else { Err(err) })
        })
        .await;
        match placed {
            Ok(()) => break at_text,
            Err(e) => refused.push(format!("{e:#}")),
        }
        ensure!(refused.len() < 4, "no point could be planned:\n{}", refused.join("\n"));
    };
    for why in &refused {
        eprintln!("a point given up for a later one: {why}");
    }
    workspace(node, after[0], layout::ROOT_SHARD).await?;
    workspace(node, after[1], layout::SHARD).await?;
    let listed = workspaces(node)?;
    ensure!(before.iter().chain(&after).all(|w| listed.contains(&w.to_string())), "{listed:?}");
    let old_snapshots: Vec<String> = [layout::ROOT_SHARD, layout::SHARD]
        .iter()
        .map(|shard| crate::etcd_snapshotter::newest(node, shard).context("a snapshot before the wipe"))
        .collect::<Result<_>>()?;
    // The disaster: both shards' etcd volumes lost. Each etcd comes back empty under a new cluster token, as a
    // re-created cluster would (the same token would give the same cluster id, which the restore refuses).
    for (shard, _) in layout::ETCD_MEMBERS {
        wipe_etcd(node, shard).await?;
    }

    let objects = restore_rbac();
    testbed::seed::apply(node, &node.dir.join("seed"), "restore-installation-rbac", &objects)?;
    // The operator's admin kubeconfig (the hub's is renewed every 100 s, faster than kcp restarts), at the front
    // proxy's Service name, which its serving certificate carries.
    let client = node.client().await?;
    let secret = Api::<Secret>::namespaced(client.clone(), NAMESPACE).get(layout::KUBECONFIG_SECRET).await?;
    let admin = secret.data.and_then(|d| d.get("kubeconfig").cloned()).context("the admin kubeconfig")?.0;
    let admin = String::from_utf8(admin)?;
    let server = format!("https://{}:{}", layout::EXTERNAL_HOST, layout::EXTERNAL_PORT);
    ensure!(admin.contains(&server), "the admin kubeconfig names another server: {admin}");
    let admin = admin.replace(&server, layout::FRONT_PROXY_SERVICE_URL);

    // Without --yes: the plan, and nothing stopped.
    let (ok, out, err) = in_agent(
        node,
        &["restore-installation", "--root-shard", &format!("{NAMESPACE}/{}", layout::ROOT_SHARD), "--at", &at_text],
        b"",
    )?;
    ensure!(ok && out.contains("run again with --yes"), "{out}{err}");
    ensure!(out.contains("stop and start RootShard root") && out.contains("Shard alpha"), "{out}");

    let started = Timestamp::now();
    let args = [
        "restore-installation",
        "--root-shard",
        &format!("{NAMESPACE}/{}", layout::ROOT_SHARD),
        "--at",
        &at_text,
        "--yes",
        "--kcp-kubeconfig",
        "-",
    ];
    // Interrupted once it has begun restoring the shards (kcp stopped, perhaps an etcd half written): SIGTERM to
    // the command in the pod, as a drained node or Ctrl-C sends it. It says where it stopped.
    let first = {
        let (args, admin) = (args.map(String::from), admin.clone());
        std::thread::spawn(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            in_agent(node, &args, admin.as_bytes())
        })
    };
    let record =
        node.dir.join("peers/s3/kcp-backups").join(chart::on_seed::S3_PREFIX).join("installation-restore.json");
    let step = testbed::eventually(Duration::from_secs(600), "the restore's record at its restoring step", || async {
        let record: Value = serde_json::from_str(&std::fs::read_to_string(&record).ok()?).ok()?;
        (record["step"] != "stopping").then(|| record["step"].clone())
    })
    .await;
    let pids: Vec<u32> = testbed::process::command_lines()
        .into_iter()
        .filter(|(_, line)| line.starts_with("/etcd-snapshotter restore-installation"))
        .map(|(pid, _)| pid)
        .collect();
    ensure!(pids.len() == 1, "one restore-installation process, found {pids:?}");
    Command::new("kill").args(["-TERM", &pids[0].to_string()]).status()?;
    let (ok, out, err) = first.join().expect("the first run's thread")?;
    eprintln!("restore-installation interrupted at step {step}:\n{out}{err}");
    ensure!(!ok && err.contains("interrupted by SIGTERM") && err.contains("run the same command again"), "{out}{err}");

    // Run again: it carries on from the recorded step and finishes.
    let (ok, out, err) = in_agent(node, &args, admin.as_bytes())?;
    eprintln!("restore-installation ({:.0} s):\n{out}{err}", Timestamp::now().duration_since(started).as_secs_f64());
    ensure!(
        ok && out.contains("resuming restore") && out.contains("proven through kcp"),
        "restore-installation failed:\n{out}{err}"
    );
    let finished = Timestamp::now();

    // Exactly the workspaces of the point, through the front proxy with the operator's admin kubeconfig.
    let listed = workspaces(node)?;
    for name in before {
        ensure!(listed.contains(&name.to_string()), "{name} is not back: {listed:?}");
    }
    for name in after {
        ensure!(!listed.contains(&name.to_string()), "{name}, created after the point, is back: {listed:?}");
    }
    // The workspace placed on alpha serves its content on alpha again.
    kcp(
        node,
        &[
            "--server",
            &format!("https://{}:6443/clusters/root:{}", layout::EXTERNAL_HOST, before[1]),
            "get",
            "namespaces",
        ],
        None,
    )?;

    // The agent carries on: a scheduled snapshot of each shard after the restore, of the re-created cluster, beside
    // the snapshots of the cluster before, which are kept.
    for shard in [layout::ROOT_SHARD, layout::SHARD] {
        let id = testbed::eventually(Duration::from_secs(240), "a snapshot after the restore", || async {
            let newest = crate::etcd_snapshotter::newest(node, shard)?;
            let manifest = chart::on_seed::manifest(node, &newest).ok()?;
            let at: Timestamp = manifest["startedAt"].as_str()?.parse().ok()?;
            (at > finished).then_some(newest)
        })
        .await;
        eprintln!("{shard}: {id} after the restore");
        let old = &old_snapshots[if shard == layout::ROOT_SHARD { 0 } else { 1 }];
        let (new_cluster, old_cluster) = (
            chart::on_seed::manifest(node, &id)?["clusterId"].clone(),
            chart::on_seed::manifest(node, old)?["clusterId"].clone(),
        );
        ensure!(
            new_cluster != old_cluster,
            "{shard}: the snapshot after the restore is of cluster {new_cluster}, as before"
        );
        let listed =
            chart::on_node::exec_in_agent(node, "etcd-snapshotter", &["/etcd-snapshotter", "list", "--shard", shard])?;
        ensure!(listed.contains(old.as_str()), "{old} of the cluster before is gone:\n{listed}");
    }
    for object in objects.iter().rev() {
        let kind = object["kind"].as_str().unwrap_or_default().to_lowercase();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        testbed::seed::kubectl_ok(node, &["delete", "-n", NAMESPACE, &kind, name])?;
    }
    testbed::seed::settled(node, &client, Duration::from_secs(20)).await
}
