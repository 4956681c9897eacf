//! The chart's NetworkPolicy on the shared node and install (see main.rs), enforced by a real implementation:
//! kube-router's firewall, started for this test only (`Node::enforce_network_policies`; kube-network-policies
//! cannot run on this kernel, see `peers::pins::KUBE_ROUTER`). A listener in a pod of another namespace, at an
//! address no agent's configuration names, on 443 and 6443: from each agent's own pod (its network namespace:
//! its address, its veth, its policy) a connection there succeeds while the release has no policy, fails once
//! `networkPolicy.enabled` renders the policies, and succeeds again once they are gone; the same for kubelet's
//! port on the node's own address. Meanwhile every agent stays Ready and etcd-snapshotter publishes a new
//! snapshot, through DNS, etcd and S3 the policy must allow.

#[allow(unused_imports)]
use super::*;

use std::net::{Ipv4Addr, SocketAddr};

use k8s_openapi::api::core::v1::Namespace;
use testbed::node::{NODE_IP, tcp_connects};

/// The ports an exfiltration would use: the apiserver's Service port and its usual endpoint port.
const PORTS: [u16; 2] = [443, 6443];
/// The namespace of the listener: no policy there, nothing of the release.
const OUTSIDE: &str = "netpol-outside";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The node's address as a NetworkPolicyPeer: the apiserver's endpoint, the bed's cluster DNS (CoreDNS as a
/// process on the node address, where a cluster has kube-dns pods) and the etcd and S3 behind their Services.
fn node_address() -> Value {
    json!([{"ipBlock": {"cidr": format!("{NODE_IP}/32")}}])
}

/// The install's values with every agent's policy on, each peer the configuration names spelled out.
fn enforced_values() -> Value {
    let mut values = on_node::values();
    values["networkPolicy"] = json!({
        "enabled": true,
        "apiServer": {"to": node_address()},
        "dns": {"to": node_address()},
        "etcdSnapshotter": {"etcd": {"to": node_address()}, "s3": {"to": node_address()}},
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

/// Snapshot ids of shard root, as the agent lists them from its pod.
fn snapshot_ids(node: &Node) -> Result<Vec<String>> {
    let listed = exec_in_agent(node, "etcd-snapshotter", &["/etcd-snapshotter", "list", "--shard", "root"])?;
    Ok(listed
        .lines()
        .filter(|l| l.starts_with("root/"))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

#[tokio::test]
async fn with_the_charts_networkpolicy_enforced_agents_stay_ready_and_snapshot_but_cannot_reach_an_unnamed_address_on_443_or_6443()
-> Result<()> {
    installed();
    let _exclusive = RELEASE.write().await;
    let node = node::shared();
    let client = node.client().await?;
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

    let outcome = async {
        // Without a policy, enforcement on: every agent pod reaches the listener (so a failure below is the
        // policy's doing, not the bed's).
        let open = reach_from_agents(node, &client, &targets).await?;
        let refused: Vec<_> = open.iter().filter(|(_, _, ok)| !ok).collect();
        ensure!(refused.is_empty(), "without a NetworkPolicy, these could not reach {ip}: {refused:?}");
        let to_listener = open.iter().filter(|(_, addr, _)| addr.ip() == ip).count();
        ensure!(listener.accepted() >= to_listener, "the listener counted {} of {to_listener}", listener.accepted());

        let before = snapshot_ids(node)?;
        helm_upgrade(node, &enforced_values())?;
        let started = Instant::now();
        // kube-router applies a policy asynchronously: every connection fails within a minute...
        let mut last = Vec::new();
        while started.elapsed() < Duration::from_secs(60) {
            last = reach_from_agents(node, &client, &targets).await?;
            if last.iter().all(|(_, _, ok)| !ok) {
                break;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let through: Vec<_> = last.iter().filter(|(_, _, ok)| *ok).collect();
        ensure!(
            through.is_empty(),
            "with networkPolicy.enabled, agent pods still reach addresses no configuration names: {through:?}"
        );
        eprintln!("every agent pod refused {targets:?} after {:.1?}", started.elapsed());
        // ... and stays failing.
        let again = reach_from_agents(node, &client, &targets).await?;
        ensure!(again.iter().all(|(_, _, ok)| !ok), "a connection got through on a second try: {again:?}");

        // The agents keep working behind their policies: Ready, and a new snapshot through DNS, etcd and S3.
        let fresh = testbed::eventually(Duration::from_secs(180), "a new snapshot under the policy", || async {
            let now = snapshot_ids(node).ok()?;
            now.into_iter().find(|id| !before.contains(id))
        })
        .await;
        eprintln!("etcd-snapshotter published {fresh} under its NetworkPolicy");
        ready_agent_pods(&client).await?;
        Ok(())
    }
    .await;

    // The release as the other tests expect it, and the control: without the policies, the connections work.
    let restored = helm_upgrade(node, &values(node)?);
    let reopened = async {
        restored?;
        let started = Instant::now();
        loop {
            let now = reach_from_agents(node, &client, &targets).await?;
            if now.iter().all(|(_, _, ok)| *ok) {
                return Ok(());
            }
            ensure!(started.elapsed() < Duration::from_secs(60), "without the policies, still refused: {now:?}");
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    .await;
    drop(listener);
    drop(enforcement);
    let _ = Api::<Namespace>::all(client.clone()).delete(OUTSIDE, &Default::default()).await;
    outcome?;
    reopened
}
