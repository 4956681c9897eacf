//! `kcp-keeper doctor` against the seed's real layout (issue 29 item 3): the doctor runs inside the node's
//! network, where pods are (the way the seed's Verify section runs, from inside the cluster), and reads the
//! operator's real objects, Deployments and Services: the rollout of every RootShard, Shard and FrontProxy
//! Deployment, `/readyz` through the front proxy, anonymous `/api` 401 on the front proxy and 403 on a shard,
//! and the split-horizon lookup of the public name through a real CoreDNS in front of the cluster DNS, with
//! the rewrite rule (ok) and without it, where the name answers the edge (FAIL).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use kcp_keeper_doctor::options::Options;
use kcp_keeper_doctor::verdict::{Level, Report, Verdict};
use testbed::node::{self, NODE_IP, Node};
use testbed::process::Process;
use testbed::seed::layout::{EXTERNAL_HOST, FRONT_PROXY, NAMESPACE};

/// The address the public name answers outside the cluster (TEST-NET-3): the edge, which pods must not use.
const EDGE_IP: &str = "203.0.113.10";

/// A directory of the node's for this module's files, removed when dropped (a failed run too).
struct Scratch(PathBuf);

impl Scratch {
    fn new(node: &Node, name: &str) -> Result<Self> {
        let dir = node.dir.join(format!("doctor-{name}"));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CoreDNS inside the node in front of the cluster DNS (as a cluster's DNS with the dns-rewriter's rule in
/// it would be), on `127.0.0.1:<port>` of the node's network. Upstream the public name answers the edge
/// (a `hosts` entry with fallthrough, as public DNS would), so without the rewrite rule a pod gets the edge.
fn cluster_dns(node: &Node, scratch: &Scratch, port: u16, rule: bool) -> Result<Process> {
    let rewrite = if rule {
        format!("    rewrite name exact {EXTERNAL_HOST}. {FRONT_PROXY}-front-proxy.{NAMESPACE}.svc.cluster.local.\n")
    } else {
        String::new()
    };
    let corefile = format!(
        ".:{port} {{\n    bind 127.0.0.1\n    errors\n{rewrite}    hosts {{\n        {EDGE_IP} {EXTERNAL_HOST}\n        fallthrough\n    }}\n    forward . {NODE_IP}:53\n}}\n"
    );
    let file = scratch.0.join(format!("Corefile-{port}-{rule}"));
    std::fs::write(&file, corefile)?;
    node.spawn_inside(
        &format!("doctor-coredns-{port}"),
        node.peers.path("coredns"),
        vec!["-conf".into(), file.display().to_string()],
    )
}

/// The doctor, run from inside the node's network with an admin client of its own made there (a client's
/// connections belong to the runtime and network namespace it was made in).
async fn doctor(node: &'static Node, options: Options) -> Result<Report> {
    let kubeconfig = node.in_cluster_kubeconfig("doctor-test", &["system:masters"], Duration::from_secs(3600))?;
    node.in_network(move || async move {
        let parsed = kube::config::Kubeconfig::from_yaml(&kubeconfig)?;
        let mut config =
            kube::Config::from_custom_kubeconfig(parsed, &kube::config::KubeConfigOptions::default()).await?;
        // The apiserver at the node's address (its serving certificate names it): the test's resolver (the
        // host's) does not know cluster names, and the node's own network has no route to ClusterIPs.
        config.cluster_url = format!("https://{NODE_IP}:6443").parse()?;
        let client = kube::Client::try_from(config)?;
        let report = kcp_keeper_doctor::run(&client, &options).await;
        anyhow::Ok(report)
    })
    .await?
}

fn options(dns_port: u16) -> Options {
    Options {
        namespace: NAMESPACE.into(),
        cluster_dns: Some(SocketAddr::from(([127, 0, 0, 1], dns_port))),
        // The node's own network routes pod addresses (the CNI bridge) but not ClusterIPs (kube-proxy's rules
        // act on pods' traffic): the requests go to each Service's ready endpoint, as they would from a pod.
        via_endpoints: true,
        ..Options::default()
    }
}

fn results<'a>(report: &'a Report, check: &str) -> Vec<(&'a str, Level)> {
    report.of(check).into_iter().map(|v| (v.subject.as_str(), v.result)).collect()
}

/// Runs the doctor until its split-horizon line passes `want` (each CoreDNS takes a moment to listen).
async fn until(node: &'static Node, port: u16, what: &str, want: fn(&Verdict) -> bool) -> Result<Report> {
    testbed::eventually_seen(Duration::from_secs(60), what, || async move {
        let report = doctor(node, options(port)).await?;
        Ok(if report.of("split-horizon").first().is_some_and(|v| want(v)) { Ok(report) } else { Err(report.text()) })
    })
    .await
}

/// The split-horizon line at `level`; a FAIL must be the edge's answer, not a resolver that does not answer yet
/// (that is a FAIL too).
fn is(level: Level) -> fn(&Verdict) -> bool {
    match level {
        Level::Ok => |v| v.result == Level::Ok,
        Level::Fail => |v| v.result == Level::Fail && v.saw.contains(EDGE_IP),
        Level::Warn => |v| v.result == Level::Warn,
        Level::NotChecked => |v| v.result == Level::NotChecked,
    }
}

#[tokio::test]
async fn doctor_from_inside_the_cluster_passes_the_seeds_verify_section_on_the_real_layout_rollouts_readyz_401_403_and_split_horizon()
-> Result<()> {
    // The layout as installed: not while upgrade.rs rolls alpha to another tag.
    let _layout = crate::LAYOUT_CHANGES.read().await;
    let node = node::shared();
    super::layout();
    let scratch = Scratch::new(node, "verify")?;
    let _dns = cluster_dns(node, &scratch, 15301, true)?;
    // The CoreDNS just started: wait until the doctor sees the split horizon answered (any result but a
    // resolver that does not answer), then judge that run.
    let report = until(node, 15301, "the split horizon answered", |v| !v.saw.contains("did not answer")).await?;
    eprint!("{}", report.text());
    let rollouts = results(&report, "rollout");
    for name in ["root-kcp", "root-proxy", "alpha-shard-kcp", "frontproxy-front-proxy"] {
        let subject = format!("deployment/{name}");
        assert!(rollouts.contains(&(subject.as_str(), Level::Ok)), "{subject}: {}", report.text());
    }
    assert_eq!(results(&report, "readyz"), vec![("frontproxy/frontproxy", Level::Ok)], "{}", report.text());
    let anonymous = results(&report, "anonymous-api");
    assert!(anonymous.contains(&("frontproxy/frontproxy", Level::Ok)), "{}", report.text());
    assert!(anonymous.contains(&("shard/alpha", Level::Ok)), "{}", report.text());
    let split = report.of("split-horizon");
    assert_eq!(split.len(), 1, "{}", report.text());
    assert_eq!(split[0].result, Level::Ok, "{}", report.text());
    // The object rules on the real objects: every image pinned, the proxy's too.
    assert!(report.of("pinned-images").iter().all(|v| v.result == Level::Ok), "{}", report.text());
    assert!(report.of("proxy-image").iter().all(|v| v.result == Level::Ok), "{}", report.text());
    assert_ne!(report.worst(), Level::Fail, "{}", report.text());
    Ok(())
}

#[tokio::test]
async fn doctor_split_horizon_fails_when_the_rewrite_rule_is_removed_and_the_name_answers_the_edge_and_is_ok_once_it_is_back()
-> Result<()> {
    // The layout as installed: not while upgrade.rs rolls alpha to another tag.
    let _layout = crate::LAYOUT_CHANGES.read().await;
    let node = node::shared();
    super::layout();
    let scratch = Scratch::new(node, "split")?;
    let port = 15302;
    let split = |report: &Report| {
        let lines = report.of("split-horizon");
        assert_eq!(lines.len(), 1, "{}", report.text());
        lines[0].clone()
    };
    let with_rule = cluster_dns(node, &scratch, port, true)?;
    let report = until(node, port, "ok with the rewrite rule", is(Level::Ok)).await?;
    assert!(split(&report).saw.contains("front proxy's Service"), "{}", split(&report).saw);
    drop(with_rule);

    let without = cluster_dns(node, &scratch, port, false)?;
    let report = until(node, port, "FAIL without the rewrite rule", is(Level::Fail)).await?;
    let line = split(&report);
    assert!(line.saw.contains(EDGE_IP), "the FAIL names the edge address it got: {}", line.saw);
    assert!(line.runbook.ends_with("#doctor-split-horizon"), "{}", line.runbook);
    drop(without);

    let _back = cluster_dns(node, &scratch, port, true)?;
    until(node, port, "ok with the rule back", is(Level::Ok)).await.context("putting the rule back")?;
    Ok(())
}

/// `kcp_keeper_doctor_check{check,result}` of the chart's doctor pod, read through the apiserver's pod proxy:
/// `(check, result) -> lines`.
fn doctor_checks(node: &Node) -> Result<std::collections::BTreeMap<(String, String), u64>> {
    let pod = chart::on_seed::agent_pod(node, "doctor")?;
    let text = chart::on_seed::pod_metrics(node, &pod)?;
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("kcp_keeper_doctor_check{")) {
        let (labels, value) =
            line.trim_start_matches("kcp_keeper_doctor_check{").split_once("} ").context(line.to_string())?;
        let label = |name: &str| {
            labels.split(',').find_map(|l| l.strip_prefix(&format!("{name}=\""))?.strip_suffix('"')).map(str::to_string)
        };
        let (Some(check), Some(result)) = (label("check"), label("result")) else { continue };
        out.insert((check, result), value.trim().parse().with_context(|| line.to_string())?);
    }
    Ok(out)
}

/// The CA ConfigMap the doctor is pointed at (`doctor.caConfigMaps`), in the release's namespace: the in-cluster
/// doctor reads no Secret.
const DOCTOR_CA: &str = "doctor-watched-ca";
/// The ConfigMap holding kcp's server CA certificate without its key (`doctor.verify.serverCA`).
const SERVER_CA: &str = "doctor-kcp-server-ca";

async fn put_configmap(client: &kube::Client, name: &str, pem: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let map: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": chart::NAMESPACE},
        "data": {"ca.crt": pem},
    }))?;
    let api = kube::Api::<ConfigMap>::namespaced(client.clone(), chart::NAMESPACE);
    api.patch(name, &kube::api::PatchParams::apply("doctor-test").force(), &kube::api::Patch::Apply(&map)).await?;
    Ok(())
}

async fn put_ca(client: &kube::Client, validity: Duration) -> Result<()> {
    let ca = testbed::certs::Ca::new("doctor-watched-ca", validity)?;
    put_configmap(client, DOCTOR_CA, &ca.cert_pem()).await
}

/// Copies the certificate (never the key) of the RootShard's server CA, as an operator or a ca-syncer ConfigMap
/// target would, into [`SERVER_CA`].
async fn put_server_ca(client: &kube::Client) -> Result<()> {
    use k8s_openapi::api::core::v1::Secret;
    let name = format!("{}-server-ca", testbed::seed::layout::ROOT_SHARD);
    let secret = kube::Api::<Secret>::namespaced(client.clone(), NAMESPACE).get(&name).await?;
    let cert = secret.data.and_then(|d| d.get("tls.crt").cloned()).context("the server CA's tls.crt")?;
    put_configmap(client, SERVER_CA, std::str::from_utf8(&cert.0)?).await
}

/// Polls the pod's metrics until `want` holds of them.
async fn until_metrics(
    node: &'static Node,
    what: &str,
    want: impl Fn(&std::collections::BTreeMap<(String, String), u64>) -> bool,
) -> Result<std::collections::BTreeMap<(String, String), u64>> {
    let want = &want;
    testbed::eventually_seen(Duration::from_secs(180), what, || async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(match doctor_checks(node) {
            Ok(checks) if want(&checks) => Ok(checks),
            Ok(checks) => Err(format!("{checks:?}")),
            Err(e) => Err(format!("{e:#}")),
        })
    })
    .await
}

fn count(checks: &std::collections::BTreeMap<(String, String), u64>, check: &str, result: &str) -> u64 {
    checks.get(&(check.to_string(), result.to_string())).copied().unwrap_or(0)
}

#[tokio::test]
async fn doctor_run_by_the_chart_in_the_cluster_exports_its_verify_and_dns_rules_checks_ok_and_a_ca_near_its_end_as_fail_until_it_is_renewed()
-> Result<()> {
    // The layout as installed: not while upgrade.rs rolls alpha to another tag.
    let _layout = crate::LAYOUT_CHANGES.read().await;
    let node = node::shared();
    super::layout();
    super::keeper();
    let client = node.client().await?;
    // The kcp-keeper image (`cargo xtask images`), pulled from the bed's registry like the agents'.
    node::agent_image_published("kcp-keeper", &chart::on_node::version()?)?;
    // A CA with 2 days left: inside --fail-days (7).
    put_ca(&client, Duration::from_secs(2 * 86400)).await?;
    put_server_ca(&client).await?;
    let mut values = chart::on_seed::values();
    values["doctor"] = serde_json::json!({
        "enabled": true,
        "interval": 5,
        "kcp": {"namespace": NAMESPACE, "rootShards": [testbed::seed::layout::ROOT_SHARD],
                "shards": [testbed::seed::layout::SHARD], "frontProxies": [FRONT_PROXY]},
        "caConfigMaps": [{"namespace": chart::NAMESPACE, "name": DOCTOR_CA}],
        "verify": {"serverCA": {"namespace": chart::NAMESPACE, "name": SERVER_CA}},
    });
    // The release's other values are the install's own: only the doctor's objects change.
    let out = chart::on_node::helm_release(node, "upgrade", &values, "5m")?;
    anyhow::ensure!(out.success, "helm upgrade with the doctor: {}{}", out.stdout, out.stderr);

    // dns-rewriter's verification of its three names, read from its replicas through the chart's headless
    // Service: each one ok.
    let checks = until_metrics(node, "ca-expiry FAIL and the three DNS rules verified", |c| {
        count(c, "ca-expiry", "fail") == 1 && count(c, "dns-rules", "ok") == 3
    })
    .await?;
    eprintln!("{checks:#?}");
    assert_eq!(count(&checks, "dns-rules", "fail"), 0, "{checks:#?}");
    // Its Verify checks, from its own pod with the chart's Roles: every rollout, /readyz, the 401/403 pair and
    // the split horizon through the cluster's DNS (dns-rewriter's rule) pass; no read was forbidden.
    for (check, lines) in [("rollout", 4), ("readyz", 1), ("anonymous-api", 2), ("split-horizon", 1)] {
        assert_eq!(count(&checks, check, "ok"), lines, "{check}: {checks:#?}");
        assert_eq!(count(&checks, check, "fail"), 0, "{check}: {checks:#?}");
    }
    assert_eq!(count(&checks, "read", "fail"), 0, "{checks:#?}");

    // Renewed: a year left, and the line turns ok (the FAIL reads 0, not absent; ca-syncer's bundles, read
    // from its metrics, add lines of their own).
    put_ca(&client, Duration::from_secs(365 * 86400)).await?;
    until_metrics(node, "ca-expiry ok once renewed", |c| {
        count(c, "ca-expiry", "ok") >= 1
            && count(c, "ca-expiry", "fail") == 0
            && c.contains_key(&("ca-expiry".into(), "fail".into()))
    })
    .await?;
    Ok(())
}
