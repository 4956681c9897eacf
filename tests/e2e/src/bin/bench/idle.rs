//! `idle`: each agent alone against the demo's kcp layout with a realistic configuration (the demo's, with a
//! short resync so cycles come quickly): resident memory once it has settled, and the API requests each no-op
//! cycle costs. Requests come from the apiserver's own `apiserver_request_total` (by verb, before and after N
//! cycles, waited for on the agent's own cycle series), and, attributed exactly, from the audit log by the
//! agent's own user. Lease renewals (leader election, the apiserver's own identity lease) are counted apart:
//! they are the price of leading, not of a cycle.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use e2e::layout::{self, EXTERNAL_HOSTNAME, HUB_NAMESPACE, KCP_NAMESPACE, SERVICES};
use serde_json::json;
use testbed::agent_process::{AgentProcess, AgentUnderTest};

use crate::common::{self, MIB, Report, Row};

const MEMORY_TARGET_MIB: f64 = 20.0;

/// One agent's run: its configuration, the series that moves once per cycle, and how many cycles to count.
struct Subject {
    name: &'static str,
    config: String,
    /// The timestamp series set at the end of every cycle; a cycle is over once every one has moved. For
    /// etcd-snapshotter, each shard's last success: its shards' snapshots run one after the other on the same
    /// tick, and memory read once alpha's alone had moved could land in root's snapshot.
    cycle_series: Vec<String>,
    cycles: usize,
    env: Vec<(&'static str, &'static str)>,
}

pub async fn run() -> Result<Report> {
    eprintln!("idle: starting etcd, kube-apiserver, kcp (two shards, front proxy), S3 and CoreDNS");
    let bed = testbed::ControlPlane::start().await?;
    let layout = layout::seed(&bed).await?;
    let s3 = bed.s3().await?;
    let dns = bed.coredns(testbed::coredns::K3S_COREFILE).await?;
    let front_proxy = layout.kcp.front_proxy.url.clone();
    let snapshotter_dir = bed.subdir("etcd-snapshotter")?;
    let secret_dir = snapshotter_dir.join("s3-credentials");
    std::fs::create_dir_all(&secret_dir)?;
    std::fs::write(secret_dir.join("AWS_ACCESS_KEY_ID"), &s3.access_key)?;
    std::fs::write(secret_dir.join("AWS_SECRET_ACCESS_KEY"), &s3.secret_key)?;

    let subjects = [
        // First, while the seeded five-minute admin certificate is far from its renewal window: no-op cycles.
        Subject {
            name: "kubeconfig-rotator",
            config: format!(
                "resyncInterval: 1s\nkubeconfigs:\n- name: admin\n  source:\n    kubeconfig: {{namespace: {KCP_NAMESPACE}, \
                 name: admin, renderedSecret: admin-kubeconfig}}\n  renewBefore: 60s\n  server: {front_proxy}\n  targets:\n  \
                 - {{namespace: {HUB_NAMESPACE}, name: railgrid-kcp, key: admin.kubeconfig}}\n"
            ),
            cycle_series: vec!["kubeconfig_rotator_reconcile_pass_timestamp_seconds ".into()],
            cycles: 5,
            env: vec![],
        },
        Subject {
            name: "ca-syncer",
            config: format!(
                "resyncInterval: 1s\nbundles:\n- name: kcp-root-ca\n  sources:\n  - secret: {{namespace: {KCP_NAMESPACE}, \
                 name: root-server-ca, key: tls.crt}}\n  - secret: {{namespace: {KCP_NAMESPACE}, name: root-server-ca, key: \
                 ca.crt}}\n  targets:\n  - secret: {{namespace: {HUB_NAMESPACE}, name: kcp-ca, key: ca.crt}}\n  - configMap: \
                 {{namespace: {HUB_NAMESPACE}, name: kcp-ca, key: ca.crt}}\n  liveCheck:\n    url: {front_proxy}\n    \
                 serverName: {EXTERNAL_HOSTNAME}\n"
            ),
            cycle_series: vec!["ca_syncer_reconcile_pass_timestamp_seconds ".into()],
            cycles: 5,
            env: vec![],
        },
        Subject {
            name: "etcd-snapshotter",
            config: snapshotter_config(&layout.kcp, &s3, &secret_dir, &snapshotter_dir.join("spill")),
            cycle_series: layout
                .kcp
                .shards
                .iter()
                .map(|shard| format!("etcd_snapshotter_last_success_timestamp_seconds{{shard=\"{}\"}}", shard.name))
                .collect(),
            cycles: 2,
            env: vec![("AWS_EC2_METADATA_DISABLED", "true")],
        },
        Subject {
            name: "dns-rewriter",
            config: dns_config(dns.port),
            cycle_series: vec!["dns_rewriter_reconcile_pass_timestamp_seconds ".into()],
            cycles: 3,
            env: vec![],
        },
    ];

    let mut rows = Vec::new();
    let mut figures = Vec::new();
    for subject in subjects {
        // dns-rewriter's output reaches CoreDNS the kubelet way; the projection polls the ConfigMap, so it only
        // runs for that agent (its GETs are the bed's, attributed apart by the audit log).
        let _projection = if subject.name == "dns-rewriter" { Some(prepare_dns(&bed, &dns).await?) } else { None };
        let (row, figure) = measure(&bed, &subject).await.with_context(|| format!("idle: {}", subject.name))?;
        rows.extend(row);
        figures.push(figure);
    }
    Ok(Report { rows, json: json!({ "agents": figures }) })
}

async fn measure(bed: &testbed::ControlPlane, subject: &Subject) -> Result<(Vec<Row>, serde_json::Value)> {
    eprintln!("idle: {}", subject.name);
    let user = format!("bench-{}", subject.name);
    let kubeconfig = bed.apiserver.user_kubeconfig(&user, &["system:masters"], Duration::from_secs(24 * 3600))?;
    let config = bed.subdir(subject.name)?.join("config.yaml");
    std::fs::write(&config, &subject.config)?;
    let mut env = vec![("KCP_KEEPER_LOG_FORMAT", "plain")];
    env.extend(subject.env.iter().copied());
    let binary = common::agent_binary(subject.name)?;
    let agent = AgentUnderTest::new(bed, &binary, &config).kubeconfig(&kubeconfig).namespace(KCP_NAMESPACE);
    let mut agent = agent.identity(subject.name).envs(&env).ready_within(Duration::from_secs(90)).start().await?;
    let pid = agent.process.pid().context("the agent exited")?;
    // At ready, before its first cycle has done any work (for etcd-snapshotter: before its first snapshot, which
    // is where it sits between snapshots with an hourly schedule, bar what the allocator keeps after one).
    let rss_ready = common::status_bytes(pid, "VmRSS").context("VmRSS")?;
    let cycled_before_ready_read = agent.metric(&subject.cycle_series[0]).await.unwrap_or(0.0) > 0.0;
    // The first cycle does the work (publishes); the one after it is the first no-op. Count from there.
    let mut last = vec![0.0; subject.cycle_series.len()];
    wait_cycle(&agent, &subject.cycle_series, &mut last).await;
    wait_cycle(&agent, &subject.cycle_series, &mut last).await;
    let rss_settled = common::status_bytes(pid, "VmRSS").context("VmRSS")?;
    let client = bed.client();
    let before = common::apiserver_requests(&client).await?;
    let audit_before = testbed::audit::count(&bed.apiserver.audit_log, &user)?;
    for _ in 0..subject.cycles {
        wait_cycle(&agent, &subject.cycle_series, &mut last).await;
    }
    let after = common::apiserver_requests(&client).await?;
    let audit_after = testbed::audit::count(&bed.apiserver.audit_log, &user)?;
    let rss_end = common::status_bytes(pid, "VmRSS").context("VmRSS")?;
    let by_kind = common::resident_by_kind(pid);
    eprintln!(
        "idle: {} resident by mapping kind: {}",
        subject.name,
        by_kind.iter().map(|(k, b)| format!("{k} {}", common::mib(*b))).collect::<Vec<_>>().join(", ")
    );
    let hwm = common::status_bytes(pid, "VmHWM").context("VmHWM")?;
    agent.terminate(Duration::from_secs(10));

    let n = subject.cycles as f64;
    let all = common::delta(&before, &after);
    let (leases, work): (BTreeMap<_, _>, BTreeMap<_, _>) =
        all.into_iter().filter(|((_, resource), _)| !resource.is_empty()).partition(|((_, r), _)| r == "leases");
    let sum = |m: &BTreeMap<(String, String), f64>, writes: bool| -> f64 {
        // `+ 0.0`: an empty f64 sum is -0.0.
        m.iter().filter(|((verb, _), _)| !writes || common::is_write_verb(verb)).map(|(_, v)| v).sum::<f64>() / n + 0.0
    };
    let mut own: BTreeMap<(String, String), f64> = BTreeMap::new();
    for (key, count) in &audit_after {
        let moved = *count as f64 - audit_before.get(key).copied().unwrap_or(0) as f64;
        if moved > 0.0 {
            own.insert(key.clone(), moved);
        }
    }
    let (own_leases, own_work): (BTreeMap<_, _>, BTreeMap<_, _>) =
        own.into_iter().partition(|((_, r), _)| r == "leases");
    let rss = rss_settled.max(rss_end);
    let memory_note = if rss as f64 / MIB < MEMORY_TARGET_MIB {
        format!("< {MEMORY_TARGET_MIB} MiB")
    } else {
        format!("< {MEMORY_TARGET_MIB} MiB: missed by {:.1} MiB", rss as f64 / MIB - MEMORY_TARGET_MIB)
    };
    let rows = vec![
        Row::new(
            format!("{} resident: at ready / after its cycles ran (VmRSS; peak VmHWM)", subject.name),
            format!("{} / {} ({})", common::mib(rss_ready), common::mib(rss), common::mib(hwm)),
        )
        .target(memory_note),
        Row::new(
            format!("{} API requests per no-op cycle: all / writes (apiserver_request_total, no leases)", subject.name),
            format!("{:.1} / {:.1}", sum(&work, false), sum(&work, true)),
        ),
        Row::new(
            format!("{} of those by the agent's user: all / writes (audit log)", subject.name),
            format!("{:.1} / {:.1}", sum(&own_work, false), sum(&own_work, true)),
        )
        .target("0 writes"),
    ];
    let figure = json!({
        "agent": subject.name,
        "cycles": subject.cycles,
        "rss_at_ready_bytes": rss_ready,
        "a_cycle_had_run_at_the_ready_read": cycled_before_ready_read,
        "rss_bytes": rss,
        "rss_by_mapping_kind_bytes": by_kind,
        "vm_hwm_bytes": hwm,
        "apiserver_requests_per_cycle": common::by_verb_json(&work.iter().map(|(k, v)| (k.clone(), v / n)).collect()),
        "lease_requests_per_cycle": common::by_verb_json(&leases.iter().map(|(k, v)| (k.clone(), v / n)).collect()),
        "agent_user_requests_per_cycle": common::by_verb_json(&own_work.iter().map(|(k, v)| (k.clone(), v / n)).collect()),
        "agent_user_lease_requests_per_cycle":
            common::by_verb_json(&own_leases.iter().map(|(k, v)| (k.clone(), v / n)).collect()),
        "writes_per_cycle_by_agent_user": sum(&own_work, true),
    });
    Ok((rows, figure))
}

/// Waits until the cycle timestamp `series` moves past `last` and returns its new value.
/// Waits until every one of `series` has moved past its value in `last`, and records the new values there.
async fn wait_cycle(agent: &AgentProcess, series: &[String], last: &mut [f64]) {
    for (series, last) in series.iter().zip(last.iter_mut()) {
        let before = *last;
        *last = agent.wait_for_metric(series, Duration::from_secs(120), |v| v > before && v > 0.0).await;
    }
}

fn snapshotter_config(
    kcp: &testbed::kcp::Kcp,
    s3: &testbed::S3Server,
    secret_dir: &std::path::Path,
    spill: &std::path::Path,
) -> String {
    let shards: String = kcp
        .shards
        .iter()
        .map(|shard| {
            format!(
                "  - name: {}\n    endpoints: [{}]\n    schedule:\n      cron: \"*/10 * * * * *\"\n",
                shard.name,
                shard.etcd.client_urls()
            )
        })
        .collect();
    format!(
        "shards:\n{shards}storage:\n  bucket: {}\n  prefix: kcp/etcd\n  endpoint: {}\n  region: {}\n  pathStyle: true\n  \
         credentials:\n    secretDirectory: {}\ncompression: zstd\nretention:\n  keepLast: 4\n  hourly: 24\nspill:\n  \
         directory: {}\n  memoryBudget: 32Mi\n  partSize: 8Mi\n  partsInFlight: 2\n",
        s3.bucket,
        s3.endpoint,
        testbed::s3::REGION,
        secret_dir.display(),
        spill.display()
    )
}

fn dns_config(dns_port: u16) -> String {
    let rules: String = SERVICES
        .iter()
        .map(|s| {
            format!(
                "- {{host: {}, service: {{namespace: {KCP_NAMESPACE}, name: {}}}, port: 6443}}\n",
                s.public_hostname, s.name
            )
        })
        .collect();
    format!(
        "mode: k3s\nresyncInterval: 10s\nrules:\n{rules}discovery: {{namespace: {KCP_NAMESPACE}, rootShards: true, \
         shards: true, frontProxies: true}}\nverify: {{resolver: '127.0.0.1:{dns_port}', settle: 60s}}\n"
    )
}

/// What the chart and the kubelet do: the empty `kube-system/coredns-custom`, projected into CoreDNS's `custom`
/// directory while the handle lives.
pub async fn prepare_dns(
    bed: &testbed::ControlPlane,
    dns: &testbed::CoreDns,
) -> Result<testbed::projection::Following> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, ObjectMeta, PostParams};
    let cm = ConfigMap {
        metadata: ObjectMeta { name: Some("coredns-custom".into()), ..Default::default() },
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(bed.client(), "kube-system").create(&PostParams::default(), &cm).await?;
    Ok(testbed::projection::follow_configmap(
        bed.client(),
        "kube-system",
        "coredns-custom",
        &dns.dir.join("custom"),
        Duration::from_millis(500),
    ))
}
