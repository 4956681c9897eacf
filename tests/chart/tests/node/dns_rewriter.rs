//! dns-rewriter's tests on the shared node and install (see main.rs), beyond the install-wide ones there.

#[allow(unused_imports)]
use super::*;

use k8s_openapi::api::core::v1::ConfigMap;

/// A kubeadm-shaped Corefile ConfigMap of this test's own (the shared install's CoreDNS pod reads
/// `kube-system/coredns`, k3s-shaped, which the other tests need as it is).
const COREFILE_CONFIGMAP: &str = "kcp-keeper-test-kubeadm-coredns";

/// `helm install --wait` of the shared release again, with the values the other tests expect (the peers and
/// objects `seed` made are still there: an uninstall removes only the release's own objects).
fn helm_reinstall(node: &Node) -> Result<()> {
    let out = on_node::helm_release(node, "install", &values(node)?, "5m")?;
    ensure!(out.success, "helm install (again) failed: {}", out.stderr);
    Ok(())
}

async fn corefile(client: &kube::Client) -> Option<String> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), "kube-system").get_opt(COREFILE_CONFIGMAP).await.ok()??;
    cm.data?.get("Corefile").cloned()
}

/// The shared release, switched to Corefile mode on a kubeadm-shaped Corefile, writes its block; `helm
/// uninstall` runs the chart's pre-delete hook (`dns-rewriter cleanup` as a Job, in a pod on the node, with the
/// agent's ServiceAccount and Roles) and the Corefile is byte for byte what it was before the agent's first
/// write. The release is installed again afterwards for the other tests.
#[tokio::test]
async fn helm_uninstall_runs_the_cleanup_hook_and_leaves_the_corefile_byte_for_byte_as_before_install() -> Result<()> {
    installed();
    let _exclusive = RELEASE.write().await;
    let node = node::shared();
    let client = node.client().await?;
    let original = testbed::coredns::KUBEADM_DEFAULT_COREFILE;
    create::<ConfigMap>(
        &client,
        "kube-system",
        json!({"metadata": {"name": COREFILE_CONFIGMAP}, "data": {"Corefile": original}}),
    )
    .await?;

    let mut corefile_values = values(node)?;
    corefile_values["dnsRewriter"]["config"]["mode"] = json!("corefile");
    corefile_values["dnsRewriter"]["config"]["corefile"] = json!({"name": COREFILE_CONFIGMAP});
    helm_upgrade(node, &corefile_values)?;
    let written = testbed::eventually(Duration::from_secs(120), "the block written into the Corefile", || async {
        corefile(&client).await.filter(|c| c.contains("rewrite name exact kcp-root.example.com."))
    })
    .await;
    ensure!(written.contains("# kcp-keeper:begin dns-rewriter"), "{written}");

    let home = tempfile::tempdir()?;
    let kubeconfig = node.kubeconfig.display().to_string();
    let started = Instant::now();
    let out = run(helm(
        &[
            "uninstall",
            "kcp-keeper",
            "--namespace",
            NAMESPACE,
            "--kubeconfig",
            &kubeconfig,
            "--wait",
            "--timeout",
            "5m",
        ],
        home.path(),
    )?)?;
    let uninstall = out.success;
    let after = corefile(&client).await;
    // Whatever happened, the other tests get their release back.
    let reinstalled = helm_reinstall(node);
    ensure!(uninstall, "helm uninstall failed: {}", out.stderr);
    eprintln!("helm uninstall (with its pre-delete hook) took {:.1?}", started.elapsed());
    let after = after.context("the Corefile ConfigMap is kept")?;
    assert_eq!(after, original, "helm uninstall left the Corefile exactly as it was before install");
    reinstalled?;
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system").delete(COREFILE_CONFIGMAP, &Default::default()).await?;
    Ok(())
}

/// Where node-local-dns listens: its pod's own IP (node-cache's `-localip`, from the downward API, filled into the
/// Corefile's `bind __PILLAR__LOCAL__DNS__` by node-cache, as kubernetes/dns's manifest has it before kubeadm's
/// `sed`). Not the host network as kubeadm runs it: its 169.254.20.10 lives on a dummy interface node-cache
/// creates, which this kernel lacks (`-setupinterface=false`), the node's own address has the kubelet's cluster
/// DNS on port 53, and the node's network has no route to the Service range (seen: node-cache on the CNI
/// bridge's address forwarding to the kube-dns ClusterIP got `connect: network is unreachable`), while a pod
/// reaches the cluster DNS Service and every pod reaches the pod. The address is a variable to the agent, so it
/// verifies through the cluster DNS alone here (`ClusterBlock::listen_addresses`).
/// What the node's upstream resolver answers for the public name: the edge (a TLS-terminating load balancer),
/// as the internet would.
const EDGE: &str = "203.0.113.7";
/// The upstream resolver's port on the node's address (53 there is the kubelet's cluster DNS).
const UPSTREAM_PORT: u16 = 5353;
const PUBLIC_HOST: &str = "kcp-root.example.com";

/// node-local-dns's Corefile as kubeadm deploys it, its listen address left for node-cache, the root zone
/// forwarded to the node's upstream.
fn node_local_corefile() -> String {
    let local = "__PILLAR__LOCAL__DNS__";
    let upstream = format!("{}:{UPSTREAM_PORT}", node::NODE_IP);
    testbed::coredns::node_local_corefile(local, &upstream, ":9253", &format!("{local}:8080"))
}

/// A pod whose only resolver is node-local-dns (`dnsPolicy: None`, its address the one nameserver) runs the
/// shipped `dns-rewriter check` asking that same address, once (`restartPolicy: Never`): what it answered for
/// the public name (`-` for nothing), once the pod has finished.
async fn answer_behind_node_local_dns(
    node: &Node,
    client: &kube::Client,
    local: &str,
    attempt: usize,
) -> Result<String> {
    let name = format!("node-local-dns-probe-{attempt}");
    let mut pod = dns_check_pod(&name, "node-local-dns-probe", &format!("{local}:53"))?;
    pod["metadata"]["labels"] = json!({"app": "node-local-dns-probe"});
    // Run once: its answer is the result, whichever it is.
    pod["spec"]["restartPolicy"] = json!("Never");
    pod["spec"]["dnsPolicy"] = json!("None");
    pod["spec"]["dnsConfig"] = json!({"nameservers": [local], "searches": ["kcp-keeper.svc.cluster.local", "svc.cluster.local", "cluster.local"]});
    create::<Pod>(client, NAMESPACE, pod).await?;
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    testbed::eventually(Duration::from_secs(120), "the probe pod to finish", || async {
        let phase = pods.get(&name).await.ok()?.status?.phase?;
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(())
    })
    .await;
    let out = node.kubectl(&["logs", "-n", NAMESPACE, &name])?;
    ensure!(out.status.success(), "kubectl logs {name}: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = pods.delete(&name, &Default::default()).await;
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&format!("{PUBLIC_HOST} ")))
        .with_context(|| format!("{name}: no line for {PUBLIC_HOST}:\n{stdout}"))?;
    Ok(line.split_whitespace().nth(2).unwrap_or("-").to_string())
}

/// How many times each dns-rewriter pod has logged a configuration change (its watches rebuilt).
fn config_reloads(node: &Node, pods: &[(String, String, i32, bool)]) -> Result<Vec<usize>> {
    pods.iter()
        .map(|(pod, ..)| {
            let out = node.kubectl(&["logs", "-n", NAMESPACE, pod])?;
            ensure!(out.status.success(), "kubectl logs {pod}: {}", String::from_utf8_lossy(&out.stderr));
            Ok(String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains("rebuilding watches")).count())
        })
        .collect()
}

/// NodeLocal DNSCache on the real node, as the DaemonSet's pod (node-cache 1.26.7 built here), its Corefile
/// kubeadm's `node-local-dns` shape forwarding cluster.local to the CoreDNS Service and everything else to the
/// node's upstream, which answers the public kcp name with the edge. A pod whose resolver is node-local-dns gets
/// the edge while the shared release's dns-rewriter is told not to manage node-local-dns; once it is (the
/// default), the agent writes its block into node-local-dns's Corefile, the kubelet projects it, node-cache
/// reloads it, and the same pod's lookup answers the Service's ClusterIP; the agent reports it detected
/// node-local-dns.
#[tokio::test]
async fn behind_node_local_dns_as_a_daemonset_pod_the_public_name_answers_the_edge_before_the_agent_and_the_cluster_ip_after()
-> Result<()> {
    installed();
    let _exclusive = RELEASE.write().await;
    let node = node::shared();
    let client = node.client().await?;
    // In a task of its own, so a panic in a wait (testbed::eventually) still reaches the clean-up below.
    let outcome = match tokio::spawn(node_local_dns_before_and_after(node, client.clone())).await {
        Ok(outcome) => outcome,
        Err(panicked) => Err(anyhow::anyhow!("the test body panicked: {panicked}")),
    };
    // Whatever happened: node-local-dns gone, the release's values as the other tests expect them.
    let ds = Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(client.clone(), "kube-system");
    let _ = ds.delete(NODE_LOCAL, &Default::default()).await;
    let _ = Api::<ConfigMap>::namespaced(client.clone(), "kube-system").delete(NODE_LOCAL, &Default::default()).await;
    let _ = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .delete_collection(&Default::default(), &ListParams::default().labels("app=node-local-dns-probe"))
        .await;
    let restored = helm_upgrade(node, &values(node)?);
    outcome?;
    restored?;
    // The agent sees node-local-dns gone before the next test.
    testbed::eventually(Duration::from_secs(60), "dns-rewriter to see node-local-dns gone", || async {
        let pods = agent_pods(&client, "dns-rewriter").await.ok()?;
        pods.iter()
            .all(|(pod, ..)| {
                pod_metric(node, pod, "dns_rewriter_node_local_dns_detected", "")
                    .ok()
                    .flatten()
                    .is_none_or(|m| m.1 == 0.0)
            })
            .then_some(())
    })
    .await;
    Ok(())
}

async fn node_local_dns_before_and_after(node: &'static Node, client: kube::Client) -> Result<()> {
    let client = &client;
    let started = Instant::now();
    let cluster_ip = Api::<Service>::namespaced(client.clone(), "kcp-system")
        .get("root-kcp")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("root-kcp has no ClusterIP")?;

    // Not managed, first: the release's dns-rewriter told to leave node-local-dns alone, and both its pods
    // have reloaded that before node-local-dns's ConfigMap exists.
    let agents = agent_pods(client, "dns-rewriter").await?;
    let reloads = config_reloads(node, &agents)?;
    let mut unmanaged = values(node)?;
    unmanaged["dnsRewriter"]["config"]["nodeLocalDns"] = json!({"enabled": false});
    helm_upgrade(node, &unmanaged)?;
    // Each pod has reloaded, or its container restarted (read from the same projected file at its start, and
    // `kubectl logs` then shows only the new container's lines, so its count could never grow). A full run on a
    // loaded machine once timed out here after 120 s with no way to tell which: the wait now says what it saw.
    let reloaded = testbed::eventually_seen(
        Duration::from_secs(180),
        "dns-rewriter to reload nodeLocalDns.enabled: false",
        || async {
            let now = config_reloads(node, &agents)?;
            let restarts = agent_pods(client, "dns-rewriter").await?;
            let mut seen = Vec::new();
            let mut all = true;
            for ((pod, _, restarts_before, _), (now, before)) in agents.iter().zip(now.iter().zip(&reloads)) {
                let restarted = restarts.iter().find(|p| &p.0 == pod).map(|p| (p.2, p.3));
                let done = now > before || restarted.is_some_and(|(count, ready)| count > *restarts_before && ready);
                all &= done;
                seen.push(format!("{pod}: reloads {before} -> {now}, container (restarts, ready) {restarted:?}"));
            }
            Ok(if all { Ok(()) } else { Err(seen.join("; ")) })
        },
    )
    .await;
    if let Err(e) = reloaded {
        let tails: Vec<String> = agents
            .iter()
            .map(|(pod, ..)| {
                let out = node.kubectl(&["logs", "-n", NAMESPACE, pod, "--tail=20"]);
                let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
                format!("--- {pod}, its last 20 lines:\n{text}")
            })
            .collect();
        anyhow::bail!("{e:#}\n{}", tails.join("\n"));
    }

    // The node's upstream resolver, on the node: the edge for the public name.
    let upstream_dir = node.dir.join("node-local-upstream");
    std::fs::create_dir_all(&upstream_dir)?;
    let upstream_corefile = upstream_dir.join("Corefile");
    std::fs::write(
        &upstream_corefile,
        format!(
            ".:{UPSTREAM_PORT} {{\n    bind {}\n    hosts {{\n        {EDGE} {PUBLIC_HOST}\n    }}\n}}\n",
            node::NODE_IP
        ),
    )?;
    let _upstream = node.spawn_inside(
        "node-local-upstream",
        node.peers.path("coredns"),
        vec!["-conf".into(), upstream_corefile.display().to_string()],
    )?;

    import_node_cache_image(node)?;
    let original = node_local_corefile();
    create::<ConfigMap>(
        client,
        "kube-system",
        json!({"metadata": {"name": NODE_LOCAL}, "data": {"Corefile": original}}),
    )
    .await?;
    create::<k8s_openapi::api::apps::v1::DaemonSet>(client, "kube-system", node_local_daemonset(&[])).await?;
    dns_check_account(client, "node-local-dns-probe").await?;
    let pods = Api::<Pod>::namespaced(client.clone(), "kube-system");
    let local = testbed::eventually(Duration::from_secs(120), "the node-local-dns pod Running", || async {
        let listed = pods.list(&ListParams::default().labels(&format!("k8s-app={NODE_LOCAL}"))).await.ok()?;
        let status = listed.items.first()?.status.clone()?;
        (status.phase.as_deref() == Some("Running")).then_some(status.pod_ip?)
    })
    .await;

    let mut attempt = 0;
    let before = testbed::eventually(Duration::from_secs(120), "node-local-dns to answer the public name", || {
        attempt += 1;
        let attempt = attempt;
        let local = local.clone();
        async move { answer_behind_node_local_dns(node, client, &local, attempt).await.ok().filter(|a| a != "-") }
    })
    .await;
    ensure!(before != cluster_ip, "before the agent manages node-local-dns it already answers {cluster_ip}");
    ensure!(before == EDGE, "node-local-dns answered {before}, not the upstream's edge {EDGE}");
    let unchanged = Api::<ConfigMap>::namespaced(client.clone(), "kube-system").get(NODE_LOCAL).await?;
    ensure!(
        unchanged.data.and_then(|d| d.get("Corefile").cloned()).as_deref() == Some(original.as_str()),
        "node-local-dns's Corefile was written while not managed"
    );
    eprintln!("behind node-local-dns, before the agent: {PUBLIC_HOST} -> {before} ({:.1?})", started.elapsed());

    // Managed: the release's values as shipped (nodeLocalDns on by default).
    let managed = Instant::now();
    helm_upgrade(node, &values(node)?)?;
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
    let written = testbed::eventually(Duration::from_secs(120), "the agent's block in node-local-dns", || async {
        let cm = config_maps.get_opt(NODE_LOCAL).await.ok()??;
        cm.data?.get("Corefile").filter(|c| c.contains(&format!("{PUBLIC_HOST}:53 {{"))).cloned()
    })
    .await;
    ensure!(written.contains("# kcp-keeper:begin dns-rewriter"), "{written}");
    eprintln!("dns-rewriter wrote node-local-dns's Corefile {:.1?} after the upgrade:\n{written}", managed.elapsed());
    // The kubelet projects the new ConfigMap (its sync period), node-cache sees its base Corefile change, renders
    // and reloads it: polled with one probe pod after another, the last answer kept for the failure message.
    let deadline = Instant::now() + Duration::from_secs(120);
    let after = loop {
        attempt += 1;
        let answer = answer_behind_node_local_dns(node, client, &local, attempt).await;
        match &answer {
            Ok(a) if *a == cluster_ip => break a.clone(),
            _ if Instant::now() > deadline => {
                let log = node.kubectl(&["logs", "-n", "kube-system", &format!("ds/{NODE_LOCAL}"), "--tail=60"])?;
                bail!(
                    "node-local-dns still answers {answer:?}, not {cluster_ip}, 120s after the agent's write; node-cache:\n{}",
                    String::from_utf8_lossy(&log.stdout)
                );
            }
            _ => eprintln!("behind node-local-dns, waiting: {answer:?}"),
        }
    };
    eprintln!(
        "behind node-local-dns, after the agent: {PUBLIC_HOST} -> {after} ({:.1?} after the upgrade)",
        managed.elapsed()
    );
    let detected = testbed::eventually(Duration::from_secs(60), "dns_rewriter_node_local_dns_detected 1", || async {
        let pods = agent_pods(client, "dns-rewriter").await.ok()?;
        pods.iter().find_map(|(pod, ..)| {
            let metric = pod_metric(node, pod, "dns_rewriter_node_local_dns_detected", "").ok()??;
            (metric.1 == 1.0).then(|| format!("{pod}: {} {}", metric.0, metric.1))
        })
    })
    .await;
    eprintln!("{detected}");
    for (pod, ..) in agent_pods(client, "dns-rewriter").await? {
        let verified = pod_metric(node, &pod, &format!("dns_rewriter_host_verified{{host=\"{PUBLIC_HOST}\""), "}")?;
        eprintln!("{pod}: host_verified {verified:?}");
    }
    eprintln!("node-local-dns test body: {:.1?}", started.elapsed());
    Ok(())
}
