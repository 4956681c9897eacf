//! `dns`: dns-rewriter's time from a Service change to every host answering the new address through a real
//! CoreDNS (k3s's Corefile shape, `reload 2s`, the agent's ConfigMap projected the kubelet way), split into the
//! bench creating the Services (one after another), from the last one created to our write (the agent's
//! `dns_rewriter_write_timestamp_seconds`) and the rest (projection into CoreDNS's directory and CoreDNS's
//! reload). The change: the Services of a round's hosts appear (their rules were configured from the start and
//! wait on `service_missing`), so the agent must write their lines. Each round
//! has hosts of its own: a host that never had a line cannot answer before our write is loaded (a recreated
//! Service of a host whose line was only just dropped could, through the `kubernetes` plugin, before any write).
//! Also: writes per no-op cycle, from the audit log by the agent's own user.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::json;
use testbed::agent_process::AgentUnderTest;

use crate::common::{self, MIB, Report, Row};
use crate::curve;

/// Hosts per round unless the scale curve says otherwise.
pub const HOSTS: usize = 5;
/// The sizes of `dns-curve` (hosts per round, so rules per round) unless `--sizes` says otherwise.
pub const CURVE_SIZES: &[usize] = &[10, 100, 1000];
const NS: &str = "kcp-system";
const USER: &str = "bench-dns-rewriter";

/// Round `None` is the hosts whose Services exist from the start (so the agent has verified lines to begin
/// with); round `Some(r)` the hosts whose Services appear in round `r`.
fn host(round: Option<usize>, i: usize) -> String {
    match round {
        None => format!("shard-{i}.kcp.example.com"),
        Some(r) => format!("r{r}-shard-{i}.kcp.example.com"),
    }
}

fn service(round: Option<usize>, i: usize) -> String {
    match round {
        None => format!("shard-{i}-kcp"),
        Some(r) => format!("r{r}-shard-{i}-kcp"),
    }
}

fn all_rounds(rounds: usize) -> impl Iterator<Item = Option<usize>> {
    std::iter::once(None).chain((0..rounds).map(Some))
}

/// Every figure of one size.
struct Measured {
    total: Vec<f64>,
    /// Creating the round's Services, one after another (the bench's part of the change).
    create: Vec<f64>,
    /// From the last Service created to the agent's write.
    write: Vec<f64>,
    reload: Vec<f64>,
    /// The agent's requests (audit log, Lease renewals apart) from a round's change until its pass ended.
    requests: Vec<f64>,
    writes_per_noop_cycle: f64,
    hwm: u64,
}

pub async fn run(rounds: usize) -> Result<Report> {
    let Measured { total, create, write, reload, requests, writes_per_noop_cycle, hwm } =
        measure(rounds, HOSTS).await?;
    let m = |v: &[f64]| common::median(v);
    let rows = vec![
        Row::new(
            format!("{HOSTS} Services created -> their hosts answer through CoreDNS (median)"),
            common::secs(m(&total)),
        ),
        Row::new("  of which: creating the Services (the bench, one after another)", common::secs(m(&create))),
        Row::new("  of which: last Service created -> our write (agent's write timestamp)", common::secs(m(&write))),
        Row::new("  of which: projection into CoreDNS + CoreDNS reload (reload 2s)", common::secs(m(&reload))),
        Row::new(
            "writes per no-op cycle by the agent's user (audit log, 3 cycles)",
            format!("{writes_per_noop_cycle:.1}"),
        )
        .target("0"),
        Row::new("agent peak RSS (VmHWM)", format!("{:.1} MiB", hwm as f64 / MIB)),
    ];
    Ok(Report {
        rows,
        json: json!({
            "hosts": HOSTS, "rounds": rounds, "total_seconds": total, "create_seconds": create, "write_seconds": write,
            "projection_and_reload_seconds": reload, "requests_per_change": requests,
            "writes_per_noop_cycle": writes_per_noop_cycle, "agent_peak_rss_bytes": hwm,
        }),
    })
}

/// `dns-curve`: `measure` at each size (a fresh control plane and CoreDNS per size), time split into our write
/// and CoreDNS's part (projection and reload; there is no other tool to compare with), requests and peak memory.
pub async fn curve(rounds: usize, sizes: &[usize]) -> Result<Report> {
    let mut points = Vec::new();
    for &hosts in sizes {
        eprintln!("dns-curve: {hosts} hosts per round");
        points.push((hosts, measure(rounds, hosts).await?));
    }
    let m = |v: &[f64]| common::median(v);
    let series =
        |f: &dyn Fn(&Measured) -> f64| -> Vec<(f64, f64)> { points.iter().map(|(n, p)| (*n as f64, f(p))).collect() };
    let time = vec![
        curve::Series::new("change to every host answering", series(&|p| m(&p.total))),
        curve::Series::new("of which creating the Services (bench)", series(&|p| m(&p.create))),
        curve::Series::new("of which last Service created to our write", series(&|p| m(&p.write))),
        curve::Series::new("of which projection + CoreDNS reload", series(&|p| m(&p.reload))),
    ];
    let requests = vec![curve::Series::new("dns-rewriter", series(&|p| m(&p.requests)))];
    let memory = vec![curve::Series::new("dns-rewriter", series(&|p| p.hwm as f64 / MIB))];
    let mut rows = Vec::new();
    for (hosts, p) in &points {
        rows.push(Row::new(
            format!("{hosts} hosts: Services created -> every host answers"),
            common::secs(m(&p.total)),
        ));
        rows.push(Row::new(
            format!("{hosts} hosts:   of which creating the Services (bench)"),
            common::secs(m(&p.create)),
        ));
        rows.push(Row::new(
            format!("{hosts} hosts:   of which last Service created -> our write"),
            common::secs(m(&p.write)),
        ));
        rows.push(Row::new(
            format!("{hosts} hosts:   of which projection + CoreDNS reload"),
            common::secs(m(&p.reload)),
        ));
        rows.push(Row::new(
            format!("{hosts} hosts: requests per change (audit log)"),
            format!("{:.0}", m(&p.requests)),
        ));
        rows.push(Row::new(format!("{hosts} hosts: agent peak RSS (VmHWM)"), common::mib(p.hwm)));
    }
    let (json_exponents, _svg) = curve::finish(
        &mut rows,
        (
            "dns-curve",
            &format!("dns: N Services appear until their N hosts answer through CoreDNS ({rounds} round(s) per size)"),
            "hosts (rules) per round",
        ),
        ("time to every host answering", "requests per change"),
        curve::Measures { time, requests, memory },
    )?;
    Ok(Report {
        rows,
        json: json!({
            "rounds": rounds,
            "sizes": points.iter().map(|(n, p)| json!({
                "hosts": n, "total_seconds": p.total, "create_seconds": p.create, "write_seconds": p.write,
                "projection_and_reload_seconds": p.reload, "requests_per_change": p.requests,
                "writes_per_noop_cycle": p.writes_per_noop_cycle, "agent_peak_rss_bytes": p.hwm,
            })).collect::<Vec<_>>(),
            "exponents": json_exponents,
        }),
    })
}

/// One fresh control plane and CoreDNS; `hosts` rules whose Services exist from the start, and `hosts` more per
/// round whose Services appear in that round.
async fn measure(rounds: usize, hosts: usize) -> Result<Measured> {
    eprintln!("dns: starting etcd, kube-apiserver and CoreDNS");
    let bed = testbed::ControlPlane::start().await?;
    bed.create_namespace(NS).await?;
    let dns = bed.coredns(testbed::coredns::K3S_COREFILE).await?;
    let _projection = crate::idle::prepare_dns(&bed, &dns).await?;
    let services = Api::<Service>::namespaced(bed.client(), NS);
    for i in 0..hosts {
        create_service(&services, &service(None, i)).await?;
    }
    let rules: String = all_rounds(rounds)
        .flat_map(|round| (0..hosts).map(move |i| (round, i)))
        .map(|(round, i)| {
            format!(
                "- {{host: {}, service: {{namespace: {NS}, name: {}}}, port: 6443}}\n",
                host(round, i),
                service(round, i)
            )
        })
        .collect();
    let config = bed.subdir("dns-rewriter")?.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "mode: k3s\nrules:\n{rules}verify: {{resolver: '127.0.0.1:{}', settle: 60s}}\nresyncInterval: 10s\n",
            dns.port
        ),
    )?;
    let kubeconfig = bed.apiserver.user_kubeconfig(USER, &["system:masters"], Duration::from_secs(24 * 3600))?;
    let binary = common::agent_binary("dns-rewriter")?;
    let env = [("KCP_KEEPER_LOG_FORMAT", "plain")];
    let agent = AgentUnderTest::new(&bed, &binary, &config).kubeconfig(&kubeconfig).namespace(NS);
    let mut agent = agent.identity("dns-rewriter").envs(&env).ready_within(Duration::from_secs(60)).start().await?;
    let pid = agent.process.pid().context("the agent exited")?;
    for i in 0..hosts {
        let series = format!("dns_rewriter_host_verified{{host=\"{}\"}}", host(None, i));
        agent.wait_for_metric(&series, Duration::from_secs(90), |v| v == 1.0).await;
    }

    let (mut total, mut write, mut reload, mut requests) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut create = Vec::new();
    for round in 0..rounds {
        eprintln!("dns: round {}/{rounds}", round + 1);
        let written = agent.metric("dns_rewriter_write_timestamp_seconds ").await?;
        let before = testbed::audit::count(&bed.apiserver.audit_log, USER)?;
        let t0 = Instant::now();
        let t0_unix = unix_now();
        let mut expected = BTreeMap::new();
        for i in 0..hosts {
            expected.insert(host(Some(round), i), create_service(&services, &service(Some(round), i)).await?);
        }
        let created = t0.elapsed().as_secs_f64();
        wait_answers(&dns, &expected, Duration::from_secs(120)).await?;
        let answered = t0.elapsed().as_secs_f64();
        let wrote = agent.metric("dns_rewriter_write_timestamp_seconds ").await?;
        anyhow::ensure!(wrote > written, "every host answers but the agent reports no write");
        total.push(answered);
        create.push(created);
        write.push(wrote - t0_unix - created);
        reload.push(answered - (wrote - t0_unix));
        // The cycle that wrote goes on verifying through the resolver; the next round starts once it has ended,
        // or its change would wait for that verification and count it as ours.
        agent
            .wait_for_metric("dns_rewriter_reconcile_pass_timestamp_seconds ", Duration::from_secs(90), |v| v >= wrote)
            .await;
        let after = testbed::audit::count(&bed.apiserver.audit_log, USER)?;
        let sent: usize = after
            .iter()
            .filter(|((_, resource), _)| resource != "leases")
            .map(|(k, n)| n - before.get(k).copied().unwrap_or(0))
            .sum();
        requests.push(sent as f64);
    }

    // No-op cycles: the rules and Services stay; count the agent's writes over three of them.
    let before = testbed::audit::count(&bed.apiserver.audit_log, USER)?;
    let mut last = agent.metric("dns_rewriter_reconcile_pass_timestamp_seconds ").await?;
    for _ in 0..3 {
        last = agent
            .wait_for_metric("dns_rewriter_reconcile_pass_timestamp_seconds ", Duration::from_secs(60), |v| v > last)
            .await;
    }
    let after = testbed::audit::count(&bed.apiserver.audit_log, USER)?;
    let writes: usize = after
        .iter()
        .filter(|((verb, resource), _)| resource != "leases" && common::is_write_verb(verb))
        .map(|(k, n)| n - before.get(k).copied().unwrap_or(0))
        .sum();
    let hwm = common::status_bytes(pid, "VmHWM").context("VmHWM")?;
    agent.terminate(Duration::from_secs(10));

    Ok(Measured { total, create, write, reload, requests, writes_per_noop_cycle: writes as f64 / 3.0, hwm })
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

async fn create_service(services: &Api<Service>, name: &str) -> Result<Ipv4Addr> {
    let svc = Service {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort { name: Some("https".into()), port: 6443, ..Default::default() }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = services.create(&PostParams::default(), &svc).await?;
    Ok(created.spec.and_then(|s| s.cluster_ip).context("a ClusterIP")?.parse()?)
}

/// Asks CoreDNS on loopback for every host until each answers its expected address.
async fn wait_answers(dns: &testbed::CoreDns, expected: &BTreeMap<String, Ipv4Addr>, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut pending: Vec<&String> = expected.keys().collect();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for name in pending {
            let got = dns.resolve_a(name).await.unwrap_or_default();
            if got != [expected[name]] {
                still.push(name);
            }
        }
        pending = still;
        anyhow::ensure!(Instant::now() < deadline, "hosts not answering their new address: {pending:?}");
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}
