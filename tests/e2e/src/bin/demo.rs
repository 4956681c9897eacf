//! `cargo xtask demo`: the local control plane with a kcp-like layout, and the agents running against it.
//! `--once` prints one line per agent (`ok <agent>: ...` / `FAIL <agent>: ...`) and exits 0 only if all are ok.
//! `--cluster` runs the agents as pods instead: a real one-node cluster and the chart (demo/cluster.rs).
#![forbid(unsafe_code)]

#[path = "demo/cluster.rs"]
mod cluster;
#[path = "demo/dns_rewriter.rs"]
mod dns_rewriter;
#[path = "demo/etcd_snapshotter.rs"]
mod etcd_snapshotter;
#[path = "demo/kubeconfig_rotator.rs"]
mod kubeconfig_rotator;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use e2e::layout::{self, EXTERNAL_HOSTNAME, HUB_NAMESPACE, KCP_NAMESPACE, SERVICES};
use testbed::agent_process::{AgentProcess, AgentUnderTest};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
struct Args {
    /// Exit after every agent has completed one cycle.
    #[arg(long, env = "KCP_KEEPER_DEMO_ONCE", value_parser = clap::builder::BoolishValueParser::new())]
    once: bool,
    /// Run the agents as pods: a one-node cluster (`testbed::node`, needs root) with the chart installed by Helm
    /// from the images `cargo xtask images` built.
    #[arg(long)]
    cluster: bool,
}

/// What ca-syncer does in the demo: the hub trusts kcp's server CA (intermediate and root), copied into a
/// Secret and a ConfigMap without the CA's private key, published only once the bundle verifies the real front
/// proxy's chain for its public hostname (dialled on loopback).
fn ca_syncer_config(front_proxy_url: &str) -> String {
    format!(
        r#"bundles:
- name: kcp-root-ca
  sources:
  - secret: {{namespace: kcp-system, name: root-server-ca, key: tls.crt}}
  - secret: {{namespace: kcp-system, name: root-server-ca, key: ca.crt}}
  targets:
  - secret: {{namespace: railgrid-system, name: kcp-ca, key: ca.crt}}
  - configMap: {{namespace: railgrid-system, name: kcp-ca, key: ca.crt}}
  liveCheck:
    url: {front_proxy_url}
    serverName: {EXTERNAL_HOSTNAME}
"#
    )
}

#[tokio::main]
async fn main() -> Result<ExitCode> {
    let args = Args::parse();
    // Installed first, so a stop during start-up is handled too. SIGTERM is what scripts, `timeout` and CI
    // runners send (through the xtask, which passes it on); Ctrl-C sends SIGINT.
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let demo = async { if args.cluster { cluster::run(args.once).await } else { run(args.once).await } };
    tokio::select! {
        result = demo => result,
        // Returning drops `run`'s future, and with it every peer and agent (killed and waited for) and the
        // test bed's temp dir.
        _ = interrupt.recv() => stopped("SIGINT"),
        _ = terminate.recv() => stopped("SIGTERM"),
    }
}

fn stopped(signal: &str) -> Result<ExitCode> {
    eprintln!("demo: {signal} received; stopping the agents and the control plane");
    Ok(ExitCode::SUCCESS)
}

async fn run(once: bool) -> Result<ExitCode> {
    eprintln!("demo: starting etcd and kube-apiserver");
    let bed = testbed::ControlPlane::start().await?;
    eprintln!("demo: starting kcp (root shard, alpha shard, front proxy, an etcd each) and seeding the layout");
    let layout = std::sync::Arc::new(layout::seed(&bed).await?);
    let s3 = bed.s3().await?;
    let dns = bed.coredns(testbed::coredns::K3S_COREFILE).await?;
    let _coredns_custom = dns_rewriter::prepare(&bed, &dns).await?;

    println!("control plane is up:");
    println!("  export KUBECONFIG={}", bed.apiserver.admin_kubeconfig.display());
    println!("  kubectl get services,secrets -n {KCP_NAMESPACE}    (kubectl: {})", bed.peers.path("kubectl").display());
    println!("  kubectl get rootshards,shards,frontproxies,kubeconfigs,certificates -n {KCP_NAMESPACE}");
    println!("  namespaces: {KCP_NAMESPACE}, {HUB_NAMESPACE}");
    for svc in SERVICES {
        println!("  service {}/{} {} (public name {})", KCP_NAMESPACE, svc.name, svc.cluster_ip, svc.public_hostname);
    }
    let kcp = &layout.kcp;
    let kcp_kubeconfig = bed.dir().join("kcp-admin.kubeconfig");
    std::fs::write(&kcp_kubeconfig, kcp.admin_kubeconfig("root")?)?;
    println!("  kcp ready in {:.0?}: front proxy {}", kcp.ready_in, kcp.front_proxy.url);
    println!("    kubectl --kubeconfig {} get workspaces", kcp_kubeconfig.display());
    for shard in &kcp.shards {
        println!("  kcp shard {}: {} on etcd {}", shard.name, shard.url, shard.etcd.client_urls());
    }
    println!("  S3: {} bucket {}", s3.endpoint, s3.bucket);
    println!("  CoreDNS: 127.0.0.1:{}", dns.port);
    println!("  data and logs: {}", bed.dir().display());

    let mut lines = Vec::new();
    let _operators = kubeconfig_rotator::operators(&bed, &layout).await?;
    let mut rotator =
        start_agent(&bed, "kubeconfig-rotator", &kubeconfig_rotator::config(&layout.kcp.front_proxy.url))?;
    lines.push(match kubeconfig_rotator::cycle(&bed, &mut rotator).await {
        Ok(summary) => format!("ok kubeconfig-rotator: {summary}"),
        Err(e) => format!("FAIL kubeconfig-rotator: {e:#}"),
    });
    let mut snapshotter = Graceful(etcd_snapshotter::start(&bed, &layout.kcp, &s3, KCP_NAMESPACE)?);
    lines.push(match etcd_snapshotter::cycle(&layout.kcp, &s3, &mut snapshotter).await {
        Ok(summary) => format!("ok etcd-snapshotter: {summary}"),
        Err(e) => format!("FAIL etcd-snapshotter: {e:#}"),
    });
    let mut ca_syncer = start_agent(&bed, "ca-syncer", &ca_syncer_config(&layout.kcp.front_proxy.url))?;
    lines.push(match ca_syncer_cycle(&bed, &layout, &mut ca_syncer).await {
        Ok(summary) => format!("ok ca-syncer: {summary}"),
        Err(e) => format!("FAIL ca-syncer: {e:#}"),
    });
    let mut dns_rewriter = start_agent(&bed, "dns-rewriter", &dns_rewriter::config(dns.port))?;
    lines.push(match dns_rewriter::cycle(&dns, &mut dns_rewriter).await {
        Ok(summary) => format!("ok dns-rewriter: {summary}"),
        Err(e) => format!("FAIL dns-rewriter: {e:#}"),
    });
    for line in &lines {
        println!("{line}");
    }
    let all_ok = lines.iter().all(|l| l.starts_with("ok "));
    if once {
        return Ok(if all_ok { ExitCode::SUCCESS } else { ExitCode::FAILURE });
    }
    println!("running; the agents' logs follow; press Ctrl-C to stop");
    let mut agents = [
        ("kubeconfig-rotator", rotator, 0),
        ("ca-syncer", ca_syncer, 0),
        ("dns-rewriter", dns_rewriter, 0),
        ("etcd-snapshotter", snapshotter, 0),
    ];
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        for (name, agent, printed) in &mut agents {
            let log = agent.process.log();
            for line in log[(*printed).min(log.len())..].lines() {
                println!("[{name}] {line}");
            }
            *printed = log.len();
        }
    }
}

/// An agent binary built next to this one (`cargo xtask demo` builds them first).
fn agent_binary(name: &str) -> Result<PathBuf> {
    let dir = std::env::current_exe()?.parent().context("the demo binary has no directory")?.to_path_buf();
    let path = dir.join(name);
    anyhow::ensure!(path.exists(), "{} is not built (run `cargo xtask demo`, which builds it)", path.display());
    Ok(path)
}

fn start_agent(bed: &testbed::ControlPlane, name: &str, config: &str) -> Result<Graceful> {
    let path = bed.subdir(name)?.join("config.yaml");
    std::fs::write(&path, config)?;
    let agent = AgentUnderTest::new(bed, agent_binary(name)?, &path)
        .namespace(KCP_NAMESPACE)
        .identity(name)
        .env("KCP_KEEPER_LOG_FORMAT", "plain")
        .spawn()?;
    Ok(Graceful(agent))
}

/// An agent the demo stops the way the kubelet stops a pod: SIGTERM, up to [`GRACE`] to finish, then SIGKILL.
/// Killed outright, an agent cannot stop what it started: a restore drill's etcd and kcp (the snapshotter drills
/// every 30 s here) would go on writing into the demo's directory after the demo itself had gone, and a demo
/// stopped by SIGTERM once left that directory behind.
struct Graceful(AgentProcess);

const GRACE: Duration = Duration::from_secs(10);

impl Drop for Graceful {
    fn drop(&mut self) {
        // The agent's own drop then kills it if it is still there after the grace.
        self.0.terminate(GRACE);
    }
}

impl std::ops::Deref for Graceful {
    type Target = AgentProcess;
    fn deref(&self) -> &AgentProcess {
        &self.0
    }
}

impl std::ops::DerefMut for Graceful {
    fn deref_mut(&mut self) -> &mut AgentProcess {
        &mut self.0
    }
}

/// Waits for ca-syncer's first full cycle, checks the hub's bundle holds the CA certificates and not the CA's
/// private key, and summarizes the cycle from the agent's own metrics.
async fn ca_syncer_cycle(
    bed: &testbed::ControlPlane,
    layout: &layout::Layout,
    agent: &mut AgentProcess,
) -> Result<String> {
    agent.wait_ready(Duration::from_secs(60)).await?;
    let secret =
        kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(bed.client(), HUB_NAMESPACE).get("kcp-ca").await?;
    let bundle = secret
        .data
        .and_then(|d| d.get("ca.crt").map(|v| String::from_utf8_lossy(&v.0).into_owned()))
        .unwrap_or_default();
    let key = layout.server_ca().key_pem();
    let key_line = key.lines().nth(1).unwrap_or_default();
    anyhow::ensure!(
        !bundle.contains("PRIVATE KEY") && !bundle.contains(key_line),
        "the hub's bundle holds key material"
    );
    anyhow::ensure!(
        bundle.contains(layout.server_ca().cert_pem().lines().nth(1).unwrap_or("?")),
        "the server CA is missing"
    );
    let (_, _, text) = testbed::http::get(&format!("{}/metrics", agent.admin_url)).await?;
    let values = |prefix: &str| -> Vec<f64> {
        text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse().ok()).collect()
    };
    let per_bundle = values("ca_syncer_bundle_certificates{");
    let targets = values("ca_syncer_target_in_sync{").iter().filter(|v| **v == 1.0).count();
    Ok(format!(
        "synced {} bundle(s) with {} certificate(s) into {targets} target(s) after verifying the kcp front proxy at \
         {}, no private key copied",
        per_bundle.len(),
        per_bundle.iter().sum::<f64>(),
        layout.kcp.front_proxy.url
    ))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// `KCP_KEEPER_DEMO_ONCE` takes the forms every boolean variable takes (`kcp_keeper_runtime::args::boolean_env`), through the
    /// argument's own value parser, the one clap applies to the variable's value.
    #[test]
    fn once_takes_1_0_true_false_yes_no_from_the_environment() {
        let command = super::Args::command();
        let arg = command.get_arguments().find(|a| a.get_id() == "once").unwrap();
        assert_eq!(arg.get_env().and_then(|v| v.to_str()), Some("KCP_KEEPER_DEMO_ONCE"));
        let parse = |text: &str| {
            let probe = clap::Arg::new("v").long("v").value_parser(arg.get_value_parser().clone());
            let matches = clap::Command::new("probe").arg(probe).try_get_matches_from(["probe", "--v", text]).ok()?;
            matches.get_one::<bool>("v").copied()
        };
        for (form, value) in [("1", true), ("0", false), ("true", true), ("false", false), ("yes", true), ("no", false)]
        {
            assert_eq!(parse(form), Some(value), "KCP_KEEPER_DEMO_ONCE={form}");
        }
        assert_eq!(parse("maybe"), None);
    }
}
