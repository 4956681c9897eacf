//! dns-rewriter, in its pod, discovering the public names from the kcp-operator's real objects (the FrontProxy's
//! `spec.external`, each shard's server certificate names) and the Services the operator made for them, writing
//! k3s's `coredns-custom`, which CoreDNS in a pod imports; a pod then resolves every name to its Service's fixed
//! ClusterIP.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use chart::dns_on_node::{NODE_LOCAL, import_node_cache_image, lookup_from_a_pod, node_local_daemonset};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use testbed::node::{
    self,
    cluster_dns::{self, CLUSTER_DNS_IP, EDGE_IP, EXTERNAL_ADDRESS, EXTERNAL_NAME, Form},
};
use testbed::seed::images::PROBE_IMAGE;
use testbed::seed::layout::{EXTERNAL_HOST, FRONT_PROXY_IP, NAMESPACE, SHARD_HOSTS};

/// Each public name, the Service the operator made for its object, and that Service's fixed ClusterIP.
fn wanted() -> [(&'static str, &'static str, &'static str); 3] {
    [
        (EXTERNAL_HOST, "frontproxy-front-proxy", FRONT_PROXY_IP),
        (SHARD_HOSTS[0].1, "root-kcp", SHARD_HOSTS[0].2),
        (SHARD_HOSTS[1].1, "alpha-shard-kcp", SHARD_HOSTS[1].2),
    ]
}

#[tokio::test]
async fn dns_rewriter_discovers_the_public_names_from_the_operators_objects_and_a_pod_resolves_each_to_its_services_fixed_cluster_ip()
-> Result<()> {
    // The layout as installed: not while upgrade.rs rolls alpha to another tag.
    let _layout = crate::LAYOUT_CHANGES.read().await;
    crate::keeper();
    let node = node::shared();
    let client = node.client().await?;
    let services = Api::<Service>::namespaced(client.clone(), NAMESPACE);
    for (_, service, ip) in wanted() {
        let cluster_ip = services.get(service).await?.spec.and_then(|s| s.cluster_ip);
        ensure!(cluster_ip.as_deref() == Some(ip), "Service {service}: ClusterIP {cluster_ip:?}, not {ip}");
    }
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
    let snippet = testbed::eventually(Duration::from_secs(120), "every discovered name in coredns-custom", || async {
        let cm = config_maps.get_opt("coredns-custom").await.ok()??;
        let snippet = cm.data?.get("kcp-split-horizon.override").cloned()?;
        wanted().iter().all(|(host, ..)| snippet.contains(&format!(" {host}. "))).then_some(snippet)
    })
    .await;
    for (host, service, _) in wanted() {
        let rule = format!("rewrite name exact {host}. {service}.{NAMESPACE}.svc.cluster.local.");
        ensure!(snippet.contains(&rule), "no `{rule}` in:\n{snippet}");
    }
    // From a pod, through CoreDNS's Service: the shipped `dns-rewriter check` asks for every name.
    let answered = lookup_from_a_pod(node, &client).await?;
    for (host, _, ip) in wanted() {
        let line = answered
            .lines()
            .find(|l| l.starts_with(&format!("{host} ")))
            .with_context(|| format!("no line for {host}:\n{answered}"))?;
        let columns: Vec<&str> = line.split_whitespace().collect();
        ensure!(columns.get(1) == Some(&ip), "{host}: expected {ip}:\n{answered}");
        ensure!(columns.get(2) == Some(&ip), "{host}: answered other than {ip}:\n{answered}");
    }
    eprintln!("{answered}");
    Ok(())
}

/// What `dns-lookup` printed in a plain pod (no `dnsConfig`, no `hostAliases`, the default `ClusterFirst`): the
/// nameservers the kubelet gave it, and each name's addresses (or `error ...`).
pub(crate) struct Lookup {
    nameservers: Vec<String>,
    pub(crate) answers: std::collections::BTreeMap<String, String>,
    pub(crate) log: String,
}

/// Runs `dns-lookup` over the public names, the name no rule covers and a short cluster name in a plain pod
/// `name` of the hub's namespace (as a hub resolves), until every name resolved (or thrice failed).
async fn plain_pod_lookup(node: &testbed::node::Node, client: &kube::Client, name: &str) -> Result<Lookup> {
    let mut names: Vec<&str> = wanted().iter().map(|(host, ..)| *host).collect();
    names.extend([EXTERNAL_NAME, "kubernetes.default"]);
    lookup_names(node, client, name, &names).await
}

/// `dns-lookup` of `names` in a plain pod `name` of the hub's namespace, until every name resolved (or thrice
/// failed).
pub(crate) async fn lookup_names(
    node: &testbed::node::Node,
    client: &kube::Client,
    name: &str,
    names: &[&str],
) -> Result<Lookup> {
    let namespace = chart::on_seed::HUB_NAMESPACE;
    let mut command = vec!["/dns-lookup"];
    command.extend(names);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "OnFailure",
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "lookup",
                "image": PROBE_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": command,
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }))?;
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    let _ = pods.delete(name, &DeleteParams::default().grace_period(0)).await;
    testbed::eventually(Duration::from_secs(60), "an earlier lookup pod gone", || async {
        pods.get_opt(name).await.ok().and_then(|p| p.is_none().then_some(()))
    })
    .await;
    pods.create(&PostParams::default(), &pod).await?;
    let passed = chart::dns_on_node::passed_or_failed_thrice(&pods, name).await;
    let mut args = vec!["logs", "-n", namespace, name];
    if !passed {
        args.push("--previous");
    }
    let out = node.kubectl(&args)?;
    let log = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = pods.delete(name, &DeleteParams::default().grace_period(0)).await;
    ensure!(passed, "a name did not resolve from a plain pod, thrice; the last time:\n{log}");
    let mut lookup = Lookup { nameservers: Vec::new(), answers: Default::default(), log: log.clone() };
    for line in log.lines() {
        match line.split_once(' ') {
            Some(("nameserver", at)) => lookup.nameservers.push(at.to_string()),
            Some((name, answer)) => {
                lookup.answers.insert(name.to_string(), answer.to_string());
            }
            None => {}
        }
    }
    Ok(lookup)
}

/// The pod was given the kubelet's cluster DNS alone, each public name answered its Service's ClusterIP, the name
/// no rule covers its upstream address, and a short cluster name went through the search list.
fn resolved_through_the_rules(lookup: &Lookup, form: &str) -> Result<()> {
    let cluster_dns = CLUSTER_DNS_IP.to_string();
    ensure!(
        lookup.nameservers == [cluster_dns.clone()],
        "{form}: the pod's nameservers, not [{cluster_dns}]:\n{}",
        lookup.log
    );
    for (host, _, ip) in wanted() {
        ensure!(lookup.answers.get(host).map(String::as_str) == Some(ip), "{form}: {host} not {ip}:\n{}", lookup.log);
    }
    let external = EXTERNAL_ADDRESS.to_string();
    ensure!(
        lookup.answers.get(EXTERNAL_NAME) == Some(&external),
        "{form}: {EXTERNAL_NAME} not {external}:\n{}",
        lookup.log
    );
    let api = testbed::node::KUBERNETES_SERVICE_IP.to_string();
    ensure!(
        lookup.answers.get("kubernetes.default") == Some(&api),
        "{form}: kubernetes.default not {api}:\n{}",
        lookup.log
    );
    Ok(())
}

/// The seed's Verify lookup the way a user runs it: a plain pod that names no DNS server resolves through the
/// kubelet's cluster DNS, CoreDNS in a pod behind `kube-dns`. In k3s form (dns-rewriter's `k3s` mode,
/// `coredns-custom` imported) and in kubeadm form (the Corefile in its ConfigMap, nothing imported;
/// dns-rewriter switched to `corefile` mode by a `helm upgrade`), each public name answers its Service's
/// ClusterIP and a name no rule covers goes upstream. Between the two, the kubeadm Corefile without the rules
/// answers the public name at the edge (the upstream's answer): the rules make the difference, not the bed.
/// Then NodeLocal DNSCache in front of it (`node_local_dns`), with its own control.
#[tokio::test]
async fn a_plain_pod_resolves_the_public_names_to_their_services_in_k3s_and_kubeadm_form_and_behind_node_local_dns()
-> Result<()> {
    crate::keeper();
    let node = node::shared();
    let client = node.client().await?;
    // The cluster DNS changes form for a while: no other test of the layout meanwhile.
    let _changing = crate::LAYOUT_CHANGES.write().await;
    let k3s = plain_pod_lookup(node, &client, "lookup-k3s").await?;
    resolved_through_the_rules(&k3s, "k3s form")?;
    eprintln!("k3s form:\n{}", k3s.log);

    let result = kubeadm_form(node, &client).await;
    // Back to the install's form and values whatever happened: the other tests expect k3s mode.
    let out = chart::on_node::helm_release(node, "upgrade", &chart::on_seed::values(), "5m")?;
    cluster_dns::set_form(&client, Form::K3s).await?;
    ensure!(out.success, "helm upgrade back to k3s mode: {}{}", out.stdout, out.stderr);
    result?;
    k3s_again(node, &client, "lookup-k3s-again").await?;

    let result = node_local_dns(node, &client).await;
    let out = chart::on_node::helm_release(node, "upgrade", &chart::on_seed::values(), "5m")?;
    ensure!(out.success, "helm upgrade back to the install's values: {}{}", out.stdout, out.stderr);
    result?;
    k3s_again(node, &client, "lookup-k3s-last").await
}

/// The cluster DNS in k3s form answers the rules again (a plain pod's lookup).
async fn k3s_again(node: &'static testbed::node::Node, client: &kube::Client, pod: &str) -> Result<()> {
    testbed::eventually_seen(Duration::from_secs(120), "k3s form answering again", || async {
        let lookup = plain_pod_lookup(node, client, pod).await?;
        Ok(resolved_through_the_rules(&lookup, "k3s form again").map_err(|e| format!("{e:#}")))
    })
    .await
}

/// NodeLocal DNSCache's link-local address (kubeadm's default).
const NODE_LOCAL_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(169, 254, 20, 10);

/// NodeLocal DNSCache in front of the cluster DNS, in iptables mode as kubeadm's docs deploy it: node-cache as a
/// DaemonSet pod on the host network bound to the link-local address and the kube-dns ClusterIP, which pods keep
/// as their nameserver (the bed intercepts DNS to both, as node-cache's own setup would). The control first:
/// with dns-rewriter told to leave node-local-dns alone, a plain pod gets the public name at the edge
/// (node-local-dns answered, sending it upstream past the cluster DNS's rules) while a cluster name still
/// answers; then with the install's values dns-rewriter writes its block into node-local-dns's Corefile and the
/// same plain pod resolves every public name to its Service. Everything it added is removed at the end.
async fn node_local_dns(node: &'static testbed::node::Node, client: &kube::Client) -> Result<()> {
    import_node_cache_image(node)?;
    let coredns = testbed::node::cluster_dns::pod_address(client).await?;
    let mut values = chart::on_seed::values();
    values["dnsRewriter"]["config"]["nodeLocalDns"] = serde_json::json!({"enabled": false});
    let out = chart::on_node::helm_release(node, "upgrade", &values, "5m")?;
    ensure!(out.success, "helm upgrade with nodeLocalDns off: {}{}", out.stdout, out.stderr);

    // kubeadm's iptables-mode Corefile: bound to both addresses; the cluster domain to the cluster DNS (its pod's
    // address: the node's own network has no route to the Service range), the rest to the node's resolver.
    let corefile = testbed::coredns::node_local_corefile(
        &NODE_LOCAL_IP.to_string(),
        &format!("{}:53", testbed::node::NODE_IP),
        &format!("{}:9253", testbed::node::NODE_IP),
        &format!("{NODE_LOCAL_IP}:8080"),
    )
    .replace("__PILLAR__DNS__SERVER__", &CLUSTER_DNS_IP.to_string())
    .replace("__PILLAR__CLUSTER__DNS__", &format!("{coredns}:53"));
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
    let config_map: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NODE_LOCAL}, "data": {"Corefile": corefile}}))?;
    config_maps.create(&PostParams::default(), &config_map).await?;
    let daemon_sets = Api::<DaemonSet>::namespaced(client.clone(), "kube-system");
    let result = async {
        let _intercepted = cluster_dns::intercept(node, &[NODE_LOCAL_IP, CLUSTER_DNS_IP])?;
        let daemon_set: DaemonSet = serde_json::from_value(node_local_daemonset(&[NODE_LOCAL_IP, CLUSTER_DNS_IP]))?;
        daemon_sets.create(&PostParams::default(), &daemon_set).await?;
        testbed::eventually(Duration::from_secs(120), "node-local-dns Ready", || async {
            (daemon_sets.get(NODE_LOCAL).await.ok()?.status?.number_ready == 1).then_some(())
        })
        .await;
        let (edge, api) = (EDGE_IP.to_string(), testbed::node::KUBERNETES_SERVICE_IP.to_string());
        let control = testbed::eventually_seen(Duration::from_secs(120), "the edge through node-local-dns", || async {
            let lookup = plain_pod_lookup(node, client, "lookup-node-local-control").await?;
            let public = lookup.answers.get(EXTERNAL_HOST).cloned().unwrap_or_default();
            let cluster = lookup.answers.get("kubernetes.default").cloned().unwrap_or_default();
            Ok(if public == edge && cluster == api { Ok(lookup.log) } else { Err(lookup.log) })
        })
        .await?;
        eprintln!("NodeLocal DNSCache, dns-rewriter leaving it alone (the control):\n{control}");

        let out = chart::on_node::helm_release(node, "upgrade", &chart::on_seed::values(), "5m")?;
        ensure!(out.success, "helm upgrade with nodeLocalDns on: {}{}", out.stdout, out.stderr);
        testbed::eventually(Duration::from_secs(120), "dns-rewriter's block in node-local-dns's Corefile", || async {
            let corefile = config_maps.get(NODE_LOCAL).await.ok()?.data?.get("Corefile").cloned()?;
            corefile.contains(&format!("{EXTERNAL_HOST}:53")).then_some(())
        })
        .await;
        let through =
            testbed::eventually_seen(Duration::from_secs(180), "the rules through node-local-dns", || async {
                let lookup = plain_pod_lookup(node, client, "lookup-node-local").await?;
                Ok(resolved_through_the_rules(&lookup, "NodeLocal DNSCache")
                    .map(|()| lookup.log)
                    .map_err(|e| format!("{e:#}")))
            })
            .await?;
        eprintln!("NodeLocal DNSCache with dns-rewriter's block:\n{through}");
        anyhow::Ok(())
    }
    .await;
    let _ = daemon_sets.delete(NODE_LOCAL, &DeleteParams::default()).await;
    testbed::eventually(Duration::from_secs(120), "node-local-dns's pod gone", || async {
        let pods = Api::<Pod>::namespaced(client.clone(), "kube-system");
        let left = pods.list(&ListParams::default().labels(&format!("k8s-app={NODE_LOCAL}"))).await.ok()?;
        left.items.is_empty().then_some(())
    })
    .await;
    let _ = config_maps.delete(NODE_LOCAL, &DeleteParams::default()).await;
    result
}

async fn kubeadm_form(node: &'static testbed::node::Node, client: &kube::Client) -> Result<()> {
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
    cluster_dns::set_form(client, Form::Kubeadm).await?;
    // Without the rules (nothing imported yet, the Corefile holds none): the upstream's edge answer, once
    // CoreDNS has loaded the new Corefile (the kubelet projects it within its sync period).
    let edge = EDGE_IP.to_string();
    testbed::eventually_seen(Duration::from_secs(120), "the public name at the edge without the rules", || async {
        let lookup = plain_pod_lookup(node, client, "lookup-no-rules").await?;
        let got = lookup.answers.get(EXTERNAL_HOST).cloned().unwrap_or_default();
        Ok(if got == edge { Ok(()) } else { Err(lookup.log) })
    })
    .await?;
    let mut values = chart::on_seed::values();
    values["dnsRewriter"]["config"]["mode"] = "corefile".into();
    values["dnsRewriter"]["config"]["corefile"] =
        serde_json::json!({"namespace": "kube-system", "name": "coredns", "serverBlock": ".:53"});
    let out = chart::on_node::helm_release(node, "upgrade", &values, "5m")?;
    ensure!(out.success, "helm upgrade to corefile mode: {}{}", out.stdout, out.stderr);
    testbed::eventually(Duration::from_secs(120), "every rule in the kubeadm Corefile", || async {
        let corefile = config_maps.get("coredns").await.ok()?.data?.get("Corefile").cloned()?;
        wanted().iter().all(|(host, ..)| corefile.contains(&format!(" {host}. "))).then_some(())
    })
    .await;
    let kubeadm = testbed::eventually_seen(Duration::from_secs(120), "kubeadm form answering the rules", || async {
        let lookup = plain_pod_lookup(node, client, "lookup-kubeadm").await?;
        Ok(resolved_through_the_rules(&lookup, "kubeadm form").map(|()| lookup.log).map_err(|e| format!("{e:#}")))
    })
    .await?;
    eprintln!("kubeadm form:\n{kubeadm}");
    Ok(())
}
