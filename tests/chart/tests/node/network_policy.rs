//! The chart's NetworkPolicy on the shared node and install (see main.rs), enforced by a real implementation:
//! kube-router's firewall, started for this test only (`Node::enforce_network_policies`; kube-network-policies
//! cannot run on this kernel, see `peers::pins::KUBE_ROUTER`). One test, the whole picture:
//!
//! - a listener in a pod of another namespace, at an address no agent's configuration names, on 443 and 6443:
//!   from each agent's own pod (its network namespace: its address, its veth, its policy) a connection there
//!   succeeds while the release has no policy, fails once `networkPolicy.enabled` renders the policies, and
//!   succeeds again once they are gone; the same for kubelet's port on the node's own address;
//! - NodeLocal DNSCache in front of the cluster DNS, as a cluster runs it: node-cache on the host network at its
//!   link-local address, which dns-rewriter verifies its rule through (node-local-dns's `bind` addresses) and
//!   etcd-snapshotter's pods resolve through (the resolv.conf the kubelet writes in IPVS mode). The control: with
//!   every policy on but `networkPolicy.dns.nodeLocalDns` empty, node-local-dns answers the node but not the
//!   agents' pods, and dns-rewriter does not count its rule verified;
//! - with the chart's node-local rule, each agent does its job behind its policy: dns-rewriter's rule verified
//!   through the cluster DNS and node-local-dns, etcd-snapshotter publishing a snapshot to its store and copying
//!   it to a second store, both reached by name through node-local-dns (and a process started in its pod then
//!   lists the second store: a new pod's first lookups can precede kube-router's rules for it), kubeconfig-rotator
//!   publishing a renewed kubeconfig it proved against the apiserver, ca-syncer carrying a CA change.
//!
//! Not here: node-local-dns in iptables mode (also bound to the kube-dns ClusterIP, which pods keep as their
//! nameserver): kube-router lets every pod's traffic to the Service range into the node before any policy
//! (v2.1.0's `KUBE-ROUTER-INPUT` returns early for `--service-cluster-ip-range`), so that rule cannot fail here;
//! the render tests cover it. Nor STS (no STS server on the bed).

#[allow(unused_imports)]
use super::*;

use std::net::{Ipv4Addr, SocketAddr};

use chart::on_node::{S3_KEY, S3_PORT, S3_SECRET, peer_service};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use testbed::node::{NODE_IP, tcp_connects};

/// The ports an exfiltration would use: the apiserver's Service port and its usual endpoint port.
const PORTS: [u16; 2] = [443, 6443];
/// The namespace of the listener: no policy there, nothing of the release.
const OUTSIDE: &str = "netpol-outside";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// One DNS question's wait, from a pod or the node.
const DNS_TIMEOUT: Duration = Duration::from_secs(3);

/// NodeLocal DNSCache's link-local listen address (the chart's default `networkPolicy.dns.nodeLocalDns`).
const NODE_LOCAL_IP: Ipv4Addr = Ipv4Addr::new(169, 254, 20, 10);
/// The port the bed's CoreDNS pod listens on (as kubeadm's does): where the kube-dns Service's 53 is translated to,
/// so where the policy sees a lookup through the Service.
const COREDNS_POD_PORT: u16 = 53;
/// dns-rewriter's rule (on_node's values) and its Lease.
const PUBLIC_HOST: &str = "kcp-root.example.com";
const DNS_REWRITER_LEASE: &str = "kcp-keeper-dns-rewriter";

/// The second store: a versitygw of its own on the node's address, its own keys, behind Service
/// `kcp-system/s3-offsite`, as the first one is (on_node's `seed`).
const OFFSITE: &str = "s3-offsite";
const OFFSITE_PORT: u16 = 7073;
const OFFSITE_BUCKET: &str = "kcp-backups-offsite";
const OFFSITE_SECRET: &str = "etcd-backup-s3-offsite";
const OFFSITE_KEY: &str = "kcpkeeperoffsite";
const OFFSITE_SECRET_KEY: &str = "kcp-keeper-node-s3-offsite-secret";
/// Shard root's directory under the prefix both stores use.
const SHARD_DIR: &str = "kcp/etcd/root/";

/// The node's address as a NetworkPolicyPeer: the apiserver's endpoint, the bed's cluster DNS (CoreDNS as a
/// process on the node address, which the kubelet gives pods), and the etcd and the two S3 behind their Services.
fn node_peer() -> Value {
    json!({"ipBlock": {"cidr": format!("{NODE_IP}/32")}})
}

/// The install's values with every agent's policy on, each peer the configuration names spelled out, and a
/// second store; node-local-dns's address in the DNS rule only with `node_local_rule`.
fn enforced_values(node_local_rule: bool) -> Value {
    let mut values = on_node::values();
    let snapshotter = &mut values["etcdSnapshotter"];
    snapshotter["secondaryS3Credentials"] = json!({"existingSecret": OFFSITE_SECRET});
    snapshotter["config"]["secondary"] = json!({
        // A copy pass soon after each snapshot.
        "interval": "5s",
        "storage": {
            "bucket": OFFSITE_BUCKET,
            "prefix": "kcp/etcd",
            "endpoint": format!("http://{OFFSITE}.kcp-system.svc.cluster.local:{OFFSITE_PORT}"),
            "region": "us-east-1",
            "pathStyle": true,
            "credentials": {"secretDirectory": "/var/run/secrets/etcd-snapshotter/s3-secondary"},
        },
        "retention": {"keepLast": 30},
    });
    let node = json!([node_peer()]);
    let node_local: Vec<String> = if node_local_rule { vec![NODE_LOCAL_IP.to_string()] } else { Vec::new() };
    values["networkPolicy"] = json!({
        "enabled": true,
        "apiServer": {"to": node},
        "dns": {
            // The bed's cluster DNS on the node's address, and the chart's default: the kube-dns pods.
            "to": [node_peer(), {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            }],
            "ports": [COREDNS_POD_PORT],
            "nodeLocalDns": node_local,
        },
        "etcdSnapshotter": {"etcd": {"to": node}, "s3": {"to": node}, "secondary": {"to": node}},
    });
    values
}

/// Each agent's pods: (agent, pod name, uid), the Ready ones only.
async fn ready_agent_pods(client: &kube::Client) -> Result<Vec<(&'static str, String, String)>> {
    let mut out = Vec::new();
    for agent in AGENTS {
        let pods = agent_pods(client, agent).await?;
        ensure!(!pods.is_empty(), "{agent} has no pod");
        for (name, uid, _, ready) in pods {
            ensure!(ready, "{agent}'s pod {name} is not Ready");
            out.push((agent, name, uid));
        }
    }
    Ok(out)
}

/// kubelet's port on the node's address: no agent's policy names it, so with enforcement on the node's own
/// address (the INPUT path, where the apiserver, DNS, etcd and S3 of this bed are) is filtered too.
const KUBELET_PORT: u16 = 10250;

/// For each agent pod and each of `targets`: whether a connection from the pod was established.
async fn reach_from_agents(
    node: &Node,
    client: &kube::Client,
    targets: &[SocketAddr],
) -> Result<Vec<(String, SocketAddr, bool)>> {
    let mut out = Vec::new();
    for (agent, pod, uid) in ready_agent_pods(client).await? {
        for &addr in targets {
            let connected = node.in_pod_network(&uid, move || tcp_connects(addr, CONNECT_TIMEOUT)).await?;
            out.push((format!("{agent} ({pod})"), addr, connected));
        }
    }
    Ok(out)
}

/// Every agent pod refused on every target within a minute (kube-router applies a policy asynchronously), and
/// still refused on a second try.
async fn refused_everywhere(node: &Node, client: &kube::Client, targets: &[SocketAddr]) -> Result<()> {
    let started = Instant::now();
    testbed::eventually_seen(Duration::from_secs(60), "every agent pod refused on every target", || async {
        let reached = reach_from_agents(node, client, targets).await?;
        let through: Vec<_> = reached.iter().filter(|(_, _, ok)| *ok).collect();
        Ok(if through.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "with networkPolicy.enabled, agent pods still reach addresses no configuration names: {through:?}"
            ))
        })
    })
    .await?;
    eprintln!("every agent pod refused {targets:?} after {:.1?}", started.elapsed());
    let again = reach_from_agents(node, client, targets).await?;
    ensure!(again.iter().all(|(_, _, ok)| !ok), "a connection got through on a second try: {again:?}");
    Ok(())
}

#[tokio::test]
async fn with_the_charts_networkpolicy_enforced_each_agent_does_its_job_through_node_local_dns_only_with_its_rule_and_reaches_no_unnamed_address_on_443_or_6443()
-> Result<()> {
    installed();
    let _exclusive = RELEASE.write().await;
    let node = node::shared();
    let client = node.client().await?;
    let started = Instant::now();
    let enforcement = node.enforce_network_policies().await?;

    let outside: Namespace = serde_json::from_value(json!({"metadata": {"name": OUTSIDE}}))?;
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &outside).await?;
    let listener_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "listener", "labels": {"app": "netpol-listener"}},
        "spec": restricted_pause_spec(json!([]), json!([])),
    }))?;
    let pods = Api::<Pod>::namespaced(client.clone(), OUTSIDE);
    pods.create(&PostParams::default(), &listener_pod).await?;
    let (uid, ip) = testbed::eventually(Duration::from_secs(120), "the listener pod Running", || async {
        let pod = pods.get("listener").await.ok()?;
        let status = pod.status?;
        (status.phase.as_deref() == Some("Running"))
            .then_some((pod.metadata.uid?, status.pod_ip?.parse::<Ipv4Addr>().ok()?))
    })
    .await;
    let listener = node.listen_in_pod(&uid, &PORTS).await?;
    let mut targets: Vec<SocketAddr> = PORTS.iter().map(|&p| SocketAddr::from((ip, p))).collect();
    targets.push(SocketAddr::from((NODE_IP, KUBELET_PORT)));

    // Without a policy, enforcement on: every agent pod reaches the listener (so a failure below is the policy's
    // doing, not the bed's).
    let open = async {
        let open = reach_from_agents(node, &client, &targets).await?;
        let refused: Vec<_> = open.iter().filter(|(_, _, ok)| !ok).collect();
        ensure!(refused.is_empty(), "without a NetworkPolicy, these could not reach {ip}: {refused:?}");
        let to_listener = open.iter().filter(|(_, addr, _)| addr.ip() == ip).count();
        ensure!(listener.accepted() >= to_listener, "the listener counted {} of {to_listener}", listener.accepted());
        Ok(())
    }
    .await;
    // The body in a task of its own, so a panic in a wait (testbed::eventually) still reaches the clean-up below.
    let outcome = match open {
        Ok(()) => match tokio::spawn(behind_the_policies(node, client.clone(), targets.clone())).await {
            Ok(outcome) => outcome,
            Err(panicked) => Err(anyhow::anyhow!("the test body panicked: {panicked}")),
        },
        Err(e) => Err(e),
    };

    // The release as the other tests expect it, and the control: without the policies, the connections work.
    let restored = restore(node, &client).await;
    let reopened = async {
        restored?;
        testbed::eventually_seen(Duration::from_secs(60), "every connection through without the policies", || async {
            let now = reach_from_agents(node, &client, &targets).await?;
            Ok(if now.iter().all(|(_, _, ok)| *ok) { Ok(()) } else { Err(format!("still refused: {now:?}")) })
        })
        .await
    }
    .await;
    drop(listener);
    drop(enforcement);
    let _ = Api::<Namespace>::all(client.clone()).delete(OUTSIDE, &Default::default()).await;
    eprintln!("the network policy test took {:.1?}", started.elapsed());
    outcome?;
    reopened
}

/// Everything under enforcement: the peers this test adds, the control (every policy but node-local-dns's rule),
/// then the chart's full policy and each agent's job.
async fn behind_the_policies(node: &'static Node, client: kube::Client, targets: Vec<SocketAddr>) -> Result<()> {
    let client = &client;
    let started = Instant::now();
    let coredns = testbed::node::cluster_dns::pod_address(client).await?;
    let cluster_ip = service_ip(client, "kcp-system", "root-kcp").await?;
    let _offsite = second_store(node, client).await?;
    let offsite_ip = service_ip(client, "kcp-system", OFFSITE).await?;
    import_node_cache_image(node)?;
    let _local = node.add_local_address(NODE_LOCAL_IP)?;
    eprintln!("CoreDNS pod, the second store, node-cache's image and address ready after {:.1?}", started.elapsed());

    // The control: every policy on, node-local-dns not in the DNS rule (the upgrade rolls etcd-snapshotter: it
    // mounts the second store's credentials).
    let control = Instant::now();
    helm_upgrade(node, &enforced_values(false))?;
    eprintln!("policies on (without node-local-dns's rule), etcd-snapshotter rolled: {:.1?}", control.elapsed());
    refused_everywhere(node, client, &targets).await?;

    // node-local-dns: its ConfigMap first, so dns-rewriter's block is in it before node-cache starts (no wait
    // for the kubelet to project a change), then the DaemonSet on the host network.
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
    let corefile = node_local_corefile(&format!("{coredns}:{COREDNS_POD_PORT}"));
    create::<ConfigMap>(
        client,
        "kube-system",
        json!({"metadata": {"name": NODE_LOCAL}, "data": {"Corefile": corefile}}),
    )
    .await?;
    testbed::eventually(Duration::from_secs(60), "dns-rewriter's block in node-local-dns's Corefile", || async {
        let cm = config_maps.get_opt(NODE_LOCAL).await.ok()??;
        cm.data?.get("Corefile").filter(|c| c.contains(&format!("{PUBLIC_HOST}:53 {{"))).map(|_| ())
    })
    .await;
    create::<DaemonSet>(client, "kube-system", node_local_daemonset(&[NODE_LOCAL_IP])).await?;
    let local = SocketAddr::from((NODE_LOCAL_IP, 53));
    let offsite_name = format!("{OFFSITE}.kcp-system.svc.cluster.local");
    testbed::eventually_seen(Duration::from_secs(90), "node-local-dns answering on the node", || async {
        let public = node.dns_from_node(local, PUBLIC_HOST, DNS_TIMEOUT).await?;
        let store = node.dns_from_node(local, &offsite_name, DNS_TIMEOUT).await?;
        let answered = public.as_deref() == Ok(&[cluster_ip][..]) && store.as_deref() == Ok(&[offsite_ip][..]);
        Ok(if answered { Ok(()) } else { Err(format!("{PUBLIC_HOST}: {public:?}, {offsite_name}: {store:?}")) })
    })
    .await?;
    eprintln!(
        "node-local-dns at {local} answers {PUBLIC_HOST} -> {cluster_ip} on the node ({:.1?})",
        control.elapsed()
    );

    // Without its rule, the agents' lookups through node-local-dns get no answer (the node's do, above), and
    // dns-rewriter does not count its rule verified.
    let leader = dns_rewriter_leader(client).await?;
    testbed::eventually_seen(Duration::from_secs(30), "dns-rewriter's rule not verified", || async {
        Ok(match host_verified(node, &leader.0)? {
            Some(0.0) => Ok(()),
            other => Err(format!("host_verified of {}: {other:?}", leader.0)),
        })
    })
    .await?;
    let askers = dns_askers(client, &leader).await?;
    for (who, uid, name) in &askers {
        let answer = node.dns_from_pod(uid, local, name, DNS_TIMEOUT).await?;
        ensure!(answer.is_err(), "without node-local-dns's rule, {who} asked {local} for {name} and got {answer:?}");
    }
    eprintln!("without node-local-dns's rule: no answer from {local} to {askers:?}; {PUBLIC_HOST} not verified");

    // The chart's node-local rule: the same lookups are answered, and each agent does its job.
    let full = Instant::now();
    helm_upgrade(node, &enforced_values(true))?;
    // Changes for ca-syncer and kubeconfig-rotator to carry, made at once so their work overlaps the waits below.
    let ca = testbed::certs::Ca::new("kcp-root-ca-behind-policy", Duration::from_secs(365 * 24 * 3600))?.cert_pem();
    Api::<Secret>::namespaced(client.clone(), "kcp-system")
        .patch("root-server-ca", &PatchParams::default(), &Patch::Merge(&json!({"stringData": {"ca.crt": ca}})))
        .await?;
    let renewed = node.in_cluster_kubeconfig("hub-admin", &["hub-admins"], Duration::from_secs(2 * 365 * 24 * 3600))?;
    let certificate = client_certificate(&renewed)?;
    Api::<Secret>::namespaced(client.clone(), "kcp-system")
        .patch(
            "hub-admin-kubeconfig",
            &PatchParams::default(),
            &Patch::Merge(&json!({"stringData": {"kubeconfig": renewed}})),
        )
        .await?;
    // A new cycle of dns-rewriter's (a change to a ConfigMap it watches) rather than its backoff's next retry.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let nudge = json!({"metadata": {"annotations": {"kcp-keeper.test/nudged": now.to_string()}}});
    config_maps.patch(NODE_LOCAL, &PatchParams::default(), &Patch::Merge(&nudge)).await?;

    for (who, uid, name) in &dns_askers(client, &leader).await? {
        let answer = testbed::eventually_seen(Duration::from_secs(60), "an answer through node-local-dns", || async {
            Ok(match node.dns_from_pod(uid, local, name, DNS_TIMEOUT).await? {
                Ok(addresses) if !addresses.is_empty() => Ok(addresses),
                other => Err(format!("{who} asking {local} for {name}: {other:?}")),
            })
        })
        .await?;
        eprintln!("with node-local-dns's rule, {who} asked {local} for {name}: {answer:?}");
    }
    testbed::eventually_seen(Duration::from_secs(90), "dns-rewriter's rule verified", || async {
        Ok(match host_verified(node, &leader.0)? {
            Some(1.0) => Ok(()),
            other => Err(format!("host_verified of {}: {other:?}", leader.0)),
        })
    })
    .await?;
    eprintln!(
        "dns-rewriter ({}) verified {PUBLIC_HOST} through the cluster DNS and {local} ({:.1?} after the upgrade)",
        leader.0,
        full.elapsed()
    );
    // etcd-snapshotter's pods resolve through node-local-dns from here on: they are Ready once their bucket
    // answers, by name. Its snapshots are counted from there.
    resolve_through_node_local(client, true).await?;
    let out = node.kubectl(&[
        "rollout",
        "status",
        "-n",
        NAMESPACE,
        "deployment/kcp-keeper-etcd-snapshotter",
        "--timeout=180s",
    ])?;
    ensure!(out.status.success(), "etcd-snapshotter's rollout: {}", String::from_utf8_lossy(&out.stderr));
    let primary_before = manifests(node, S3_PORT, "kcp-backups", S3_KEY, S3_SECRET).await?;
    eprintln!(
        "etcd-snapshotter's pods resolving through node-local-dns Ready ({:.1?} after the upgrade)",
        full.elapsed()
    );
    let ca = ca.trim().to_string();
    testbed::eventually(Duration::from_secs(60), "ca-syncer to carry the CA change", || async {
        target_bundle(client).await.filter(|b| b.contains(&ca))
    })
    .await;
    eprintln!("ca-syncer carried a CA change ({:.1?} after the upgrade)", full.elapsed());
    testbed::eventually(Duration::from_secs(90), "kubeconfig-rotator to publish the renewal", || async {
        let published = target_kubeconfig(client).await?;
        (client_certificate(&published).ok()? == certificate).then_some(())
    })
    .await;
    eprintln!(
        "kubeconfig-rotator proved and published a renewed kubeconfig ({:.1?} after the upgrade)",
        full.elapsed()
    );
    let fresh = testbed::eventually_seen(Duration::from_secs(120), "a new snapshot on the primary store", || async {
        let now = manifests(node, S3_PORT, "kcp-backups", S3_KEY, S3_SECRET).await?;
        Ok(now.into_iter().find(|k| !primary_before.contains(k)).ok_or_else(|| "none yet".to_string()))
    })
    .await?;
    eprintln!("etcd-snapshotter published {fresh} ({:.1?} after the upgrade)", full.elapsed());
    testbed::eventually_seen(Duration::from_secs(90), "the new snapshot on the second store", || async {
        let copied = manifests(node, OFFSITE_PORT, OFFSITE_BUCKET, OFFSITE_KEY, OFFSITE_SECRET_KEY).await?;
        Ok(if copied.contains(&fresh) { Ok(()) } else { Err(format!("the second store holds {copied:?}")) })
    })
    .await?;
    eprintln!("etcd-snapshotter copied {fresh} to the second store ({:.1?} after the upgrade)", full.elapsed());
    // A process started now in a pod behind node-local-dns (so its lookups are new, made under the policy
    // kube-router has by now applied to the pod: a pod's first moments can precede that) lists both stores by name.
    let (pod, _) = snapshotters_behind_node_local(client)
        .await?
        .into_iter()
        .find(|(_, ready)| *ready)
        .context("no Ready etcd-snapshotter pod behind node-local-dns")?;
    let id = fresh.trim_end_matches("/manifest.json");
    for store in ["primary", "secondary"] {
        let command = ["/etcd-snapshotter", "list", "--shard", "root", "--store", store];
        let mut args = vec!["exec", "-n", NAMESPACE, &pod, "-c", "etcd-snapshotter", "--"];
        args.extend(command);
        let listed = node.kubectl(&args)?;
        let stdout = String::from_utf8_lossy(&listed.stdout);
        ensure!(
            listed.status.success() && stdout.lines().any(|l| l.starts_with(&format!("root/{id} "))),
            "{command:?} in {pod}: {}\n{stdout}{}",
            listed.status,
            String::from_utf8_lossy(&listed.stderr)
        );
    }
    eprintln!("`list --store primary|secondary` in {pod}, through node-local-dns, lists root/{id} on both");
    refused_everywhere(node, client, &targets).await?;
    ready_agent_pods(client).await?;
    eprintln!("behind the policies: {:.1?}", started.elapsed());
    Ok(())
}

/// A Service's ClusterIP.
async fn service_ip(client: &kube::Client, namespace: &str, name: &str) -> Result<Ipv4Addr> {
    let service = Api::<Service>::namespaced(client.clone(), namespace).get(name).await?;
    Ok(service.spec.and_then(|s| s.cluster_ip).with_context(|| format!("{name} has no ClusterIP"))?.parse()?)
}

/// The second store, started: versitygw on the node's address with its bucket, its Service, and the Secret
/// with its own keys in the release namespace. The process stops when the handle is dropped.
async fn second_store(node: &Node, client: &kube::Client) -> Result<testbed::process::Process> {
    let data = node.dir.join("peers/s3-offsite");
    std::fs::create_dir_all(data.join(OFFSITE_BUCKET))?;
    let versitygw = peers::locate_only(&["versitygw"])?;
    let process = node.spawn_inside_with_env(
        "versitygw-offsite",
        versitygw.path("versitygw"),
        vec!["--port".into(), format!("{NODE_IP}:{OFFSITE_PORT}"), "posix".into(), data.display().to_string()],
        &[("ROOT_ACCESS_KEY", OFFSITE_KEY), ("ROOT_SECRET_KEY", OFFSITE_SECRET_KEY)],
    )?;
    peer_service(client, "kcp-system", OFFSITE, OFFSITE_PORT, OFFSITE_PORT).await?;
    create::<Secret>(
        client,
        NAMESPACE,
        json!({"metadata": {"name": OFFSITE_SECRET}, "stringData": {
            "AWS_ACCESS_KEY_ID": OFFSITE_KEY,
            "AWS_SECRET_ACCESS_KEY": OFFSITE_SECRET_KEY,
        }}),
    )
    .await?;
    Ok(process)
}

/// The manifests of shard root's snapshots in a store on the node (its own API, from inside the node's network),
/// relative to the shard's directory: `<id>/manifest.json`, so both stores' keys compare.
async fn manifests(node: &Node, port: u16, bucket: &str, key: &str, secret: &str) -> Result<Vec<String>> {
    let (bucket, key, secret) = (bucket.to_string(), key.to_string(), secret.to_string());
    node.in_network(move || async move {
        let s3 = testbed::s3::client(&format!("http://{NODE_IP}:{port}"), &key, &secret);
        let mut keys = Vec::new();
        let mut token = None;
        loop {
            let page =
                s3.list_objects_v2().bucket(&bucket).prefix(SHARD_DIR).set_continuation_token(token).send().await?;
            keys.extend(
                page.contents()
                    .iter()
                    .filter_map(|o| o.key())
                    .filter(|k| k.ends_with("/manifest.json"))
                    .map(|k| k.trim_start_matches(SHARD_DIR).to_string()),
            );
            token = page.next_continuation_token().map(str::to_string);
            if token.is_none() {
                return Ok(keys);
            }
        }
    })
    .await?
}

/// etcd-snapshotter's pods resolve through node-local-dns (`on`), with the resolv.conf the kubelet writes when
/// its `clusterDNS` is node-local-dns's address (NodeLocal DNSCache in IPVS mode; this node's kubelet names the
/// node's own address), or through the kubelet's again. A change of the pod template: the Deployment rolls, and
/// a `helm upgrade` keeps it (it changes only what it rendered) and waits for that rollout too.
async fn resolve_through_node_local(client: &kube::Client, on: bool) -> Result<()> {
    let spec = if on {
        json!({"dnsPolicy": "None", "dnsConfig": {
            "nameservers": [NODE_LOCAL_IP.to_string()],
            "searches": [format!("{NAMESPACE}.svc.cluster.local"), "svc.cluster.local", "cluster.local"],
            "options": [{"name": "ndots", "value": "5"}],
        }})
    } else {
        json!({"dnsPolicy": "ClusterFirst", "dnsConfig": null})
    };
    Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .patch(
            "kcp-keeper-etcd-snapshotter",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"template": {"spec": spec}}})),
        )
        .await?;
    Ok(())
}

/// dns-rewriter's leader: (pod name, uid).
async fn dns_rewriter_leader(client: &kube::Client) -> Result<(String, String)> {
    let holder = lease_holder(client, DNS_REWRITER_LEASE).await.context("dns-rewriter's Lease has no holder")?;
    let pods = agent_pods(client, "dns-rewriter").await?;
    let (name, uid, ..) = pods.into_iter().find(|p| p.0 == holder).with_context(|| format!("no pod {holder}"))?;
    Ok((name, uid))
}

/// Who asks node-local-dns, and for what: dns-rewriter's leader for the public name it verifies, each of
/// etcd-snapshotter's Ready pods for the second store's name. (who, pod uid, name)
async fn dns_askers(client: &kube::Client, leader: &(String, String)) -> Result<Vec<(String, String, String)>> {
    let mut out = vec![(format!("dns-rewriter ({})", leader.0), leader.1.clone(), PUBLIC_HOST.to_string())];
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/name=etcd-snapshotter"))
        .await?;
    for pod in pods.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        if pod_ready(pod) {
            let (name, uid) =
                (pod.metadata.name.clone().unwrap_or_default(), pod.metadata.uid.clone().unwrap_or_default());
            out.push((format!("etcd-snapshotter ({name})"), uid, format!("{OFFSITE}.kcp-system.svc.cluster.local")));
        }
    }
    ensure!(out.len() > 1, "no Ready etcd-snapshotter pod");
    Ok(out)
}

/// etcd-snapshotter's pods resolving through node-local-dns: (name, Ready).
async fn snapshotters_behind_node_local(client: &kube::Client) -> Result<Vec<(String, bool)>> {
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/name=etcd-snapshotter"))
        .await?;
    Ok(pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.spec.as_ref().and_then(|s| s.dns_policy.as_deref()) == Some("None"))
        .map(|p| (p.metadata.name.clone().unwrap_or_default(), pod_ready(p)))
        .collect())
}

/// Whether a pod's Ready condition is true.
fn pod_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// `dns_rewriter_host_verified` of the public name on `pod`.
fn host_verified(node: &Node, pod: &str) -> Result<Option<f64>> {
    let metric = pod_metric(node, pod, &format!("dns_rewriter_host_verified{{host=\"{PUBLIC_HOST}\""), "}")?;
    Ok(metric.map(|m| m.1))
}

/// node-local-dns's Corefile as kubeadm deploys it in IPVS mode (`bind` the link-local address alone), the
/// cluster domain forwarded to `cluster_dns` (the CoreDNS pod: the node's network has no route to the Service
/// range, so not `__PILLAR__CLUSTER__DNS__`, the kube-dns ClusterIP), the rest to the node's cluster DNS.
fn node_local_corefile(cluster_dns: &str) -> String {
    testbed::coredns::node_local_corefile(
        &NODE_LOCAL_IP.to_string(),
        &format!("{NODE_IP}:53"),
        &format!("{NODE_IP}:9253"),
        &format!("{NODE_LOCAL_IP}:8080"),
    )
    .replace("__PILLAR__CLUSTER__DNS__", cluster_dns)
}

/// Back to the release the other tests expect: etcd-snapshotter resolving through the kubelet's DNS, no
/// node-local-dns, the install's values (no policies, no second store), and the agent seeing node-local-dns gone.
/// Every step runs; the first failure is returned.
async fn restore(node: &Node, client: &kube::Client) -> Result<()> {
    let mut failures = Vec::new();
    if let Err(e) = resolve_through_node_local(client, false).await {
        failures.push(format!("etcd-snapshotter's resolver: {e:#}"));
    }
    let ds = Api::<DaemonSet>::namespaced(client.clone(), "kube-system");
    let _ = ds.delete(NODE_LOCAL, &Default::default()).await;
    let _ = Api::<ConfigMap>::namespaced(client.clone(), "kube-system").delete(NODE_LOCAL, &Default::default()).await;
    if let Err(e) = helm_upgrade(node, &values(node)?) {
        failures.push(format!("{e:#}"));
    }
    let _ = Api::<Service>::namespaced(client.clone(), "kcp-system").delete(OFFSITE, &Default::default()).await;
    let _ = Api::<EndpointSlice>::namespaced(client.clone(), "kcp-system").delete(OFFSITE, &Default::default()).await;
    let _ = Api::<Secret>::namespaced(client.clone(), NAMESPACE).delete(OFFSITE_SECRET, &Default::default()).await;
    let gone = testbed::eventually_seen(Duration::from_secs(60), "dns-rewriter to see node-local-dns gone", || async {
        let mut seen = Vec::new();
        for (pod, ..) in agent_pods(client, "dns-rewriter").await? {
            let detected = pod_metric(node, &pod, "dns_rewriter_node_local_dns_detected", "")?;
            if detected.as_ref().is_some_and(|m| m.1 != 0.0) {
                seen.push(format!("{pod}: {detected:?}"));
            }
        }
        Ok(if seen.is_empty() { Ok(()) } else { Err(seen.join(", ")) })
    })
    .await;
    if let Err(e) = gone {
        failures.push(format!("{e:#}"));
    }
    match failures.first() {
        None => Ok(()),
        Some(_) => anyhow::bail!("restoring the release: {}", failures.join("; ")),
    }
}
