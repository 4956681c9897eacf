//! `rotate`: kubeconfig-rotator's time from a renewed certificate Secret (what cert-manager writes) to every
//! target holding a kubeconfig built from it, proven first through the real kcp front proxy. An absolute
//! figure, with its parts: the proof alone (the same SelfSubjectReview through the front proxy, timed by the
//! bench with the new credential), the time until the first target is written (detection, build, proof, write),
//! and from the first to the last target.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use serde_json::json;
use testbed::agent_process::AgentUnderTest;
use testbed::kcp::pki::{ADMIN_GROUP, ADMIN_USER};

use crate::common::{self, MIB, Report, Row};
use crate::curve;
use e2e::layout::{self, HUB_NAMESPACE, KCP_NAMESPACE};

/// Targets unless the scale curve says otherwise.
const TARGETS: usize = 10;
/// The sizes of `rotate-curve` (targets) unless `--sizes` says otherwise.
pub const CURVE_SIZES: &[usize] = &[10, 100, 500];
/// The agent's own user, so the audit log tells its requests from the bench's.
const USER: &str = "bench-kubeconfig-rotator";
const SOURCE: &str = "kcp-admin-cert";
const KEY: &str = "admin.kubeconfig";

/// Every figure of one size.
struct Measured {
    total: Vec<f64>,
    to_first: Vec<f64>,
    spread: Vec<f64>,
    proofs: Vec<f64>,
    /// The agent's requests (audit log, Lease renewals apart) from the change until the last target was written.
    requests: Vec<f64>,
    hwm: u64,
}

pub async fn run(rounds: usize) -> Result<Report> {
    let Measured { total, to_first, spread, proofs, requests, hwm } = measure(rounds, TARGETS).await?;
    let m = |v: &[f64]| common::median(v);
    let rows = vec![
        Row::new(
            format!("renewed Secret -> all {TARGETS} targets updated and proven (median)"),
            common::secs(m(&total)),
        ),
        Row::new(
            "  of which: until the first target is written (watch, build, proof, write)",
            common::secs(m(&to_first)),
        ),
        Row::new("  of which: first -> last target written", common::secs(m(&spread))),
        Row::new(
            "  the proof alone: SelfSubjectReview through the front proxy (bench-timed)",
            common::secs(m(&proofs)),
        ),
        Row::new("agent peak RSS (VmHWM)", format!("{:.1} MiB", hwm as f64 / MIB)),
    ];
    Ok(Report {
        rows,
        json: json!({
            "targets": TARGETS, "rounds": rounds, "total_seconds": total, "to_first_target_seconds": to_first,
            "first_to_last_seconds": spread, "proof_seconds": proofs, "requests_per_renewal": requests,
            "agent_peak_rss_bytes": hwm,
        }),
    })
}

/// `rotate-curve`: `measure` at each size (a fresh control plane and kcp per size): time split into until the
/// first target and first to last, requests and peak memory (there is no other tool to compare with).
pub async fn curve(rounds: usize, sizes: &[usize]) -> Result<Report> {
    let mut points = Vec::new();
    for &targets in sizes {
        eprintln!("rotate-curve: {targets} targets");
        points.push((targets, measure(rounds, targets).await?));
    }
    let m = |v: &[f64]| common::median(v);
    let series =
        |f: &dyn Fn(&Measured) -> f64| -> Vec<(f64, f64)> { points.iter().map(|(n, p)| (*n as f64, f(p))).collect() };
    let time = vec![
        curve::Series::new("renewal to every target written", series(&|p| m(&p.total))),
        curve::Series::new("of which until the first target", series(&|p| m(&p.to_first))),
        curve::Series::new("of which first to last target", series(&|p| m(&p.spread))),
    ];
    let requests = vec![curve::Series::new("kubeconfig-rotator", series(&|p| m(&p.requests)))];
    let memory = vec![curve::Series::new("kubeconfig-rotator", series(&|p| p.hwm as f64 / MIB))];
    let mut rows = Vec::new();
    for (targets, p) in &points {
        rows.push(Row::new(
            format!("{targets} targets: renewed Secret -> all targets written"),
            common::secs(m(&p.total)),
        ));
        rows.push(Row::new(format!("{targets} targets:   of which until the first"), common::secs(m(&p.to_first))));
        rows.push(Row::new(format!("{targets} targets:   of which first -> last"), common::secs(m(&p.spread))));
        rows.push(Row::new(
            format!("{targets} targets: requests per renewal (audit log)"),
            format!("{:.0}", m(&p.requests)),
        ));
        rows.push(Row::new(format!("{targets} targets: agent peak RSS (VmHWM)"), common::mib(p.hwm)));
    }
    let (json_exponents, _svg) = curve::finish(
        &mut rows,
        (
            "rotate-curve",
            &format!("rotate: one renewed certificate to N target kubeconfigs ({rounds} round(s) per size)"),
            "targets",
        ),
        ("time to the last target", "requests per renewal"),
        curve::Measures { time, requests, memory },
    )?;
    Ok(Report {
        rows,
        json: json!({
            "rounds": rounds,
            "sizes": points.iter().map(|(n, p)| json!({
                "targets": n, "total_seconds": p.total, "to_first_target_seconds": p.to_first,
                "first_to_last_seconds": p.spread, "proof_seconds": p.proofs, "requests_per_renewal": p.requests,
                "agent_peak_rss_bytes": p.hwm,
            })).collect::<Vec<_>>(),
            "exponents": json_exponents,
        }),
    })
}

/// One fresh control plane and kcp layout; a rotator publishing one kubeconfig to `targets` Secrets.
async fn measure(rounds: usize, targets_count: usize) -> Result<Measured> {
    eprintln!("rotate: starting etcd, kube-apiserver and kcp (two shards, front proxy)");
    let bed = testbed::ControlPlane::start().await?;
    let layout = layout::seed(&bed).await?;
    let pki = &layout.kcp.pki;
    let front_proxy = layout.kcp.front_proxy.url.clone();
    let sources = Api::<Secret>::namespaced(bed.client(), KCP_NAMESPACE);
    let targets = Api::<Secret>::namespaced(bed.client(), HUB_NAMESPACE);
    let first = pki.client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], Duration::from_secs(3600))?;
    sources.create(&PostParams::default(), &cert_secret(&first)).await?;

    let target_lines: String = (0..targets_count)
        .map(|i| format!("  - {{namespace: {HUB_NAMESPACE}, name: kcp-admin-{i}, key: {KEY}}}\n"))
        .collect();
    let config = bed.subdir("kubeconfig-rotator")?.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "kubeconfigs:\n- name: built\n  source: {{certificateSecret: {{namespace: {KCP_NAMESPACE}, name: {SOURCE}, \
             server: \"{front_proxy}/clusters/root\", ca: {{namespace: {KCP_NAMESPACE}, name: root-server-ca, key: \
             tls.crt}}}}}}\n  expect: {{username: {ADMIN_USER}, groups: [\"{ADMIN_GROUP}\"]}}\n  targets:\n{target_lines}"
        ),
    )?;
    let binary = common::agent_binary("kubeconfig-rotator")?;
    let env = [("KCP_KEEPER_LOG_FORMAT", "plain")];
    let kubeconfig = bed.apiserver.user_kubeconfig(USER, &["system:masters"], Duration::from_secs(24 * 3600))?;
    let agent = AgentUnderTest::new(&bed, &binary, &config).kubeconfig(&kubeconfig);
    let agent = agent.namespace(KCP_NAMESPACE).identity("kubeconfig-rotator");
    let mut agent = agent.envs(&env).ready_within(Duration::from_secs(60)).start().await?;
    let pid = agent.process.pid().context("the agent exited")?;
    let t0 = Instant::now();
    wait_targets(&targets, targets_count, &marker(&first), t0).await.context("the first publication")?;

    let (mut total, mut to_first, mut spread, mut proofs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut requests = Vec::new();
    for round in 0..rounds {
        eprintln!("rotate: round {}/{rounds}", round + 1);
        // A different lifetime each round, as renewals have: a new certificate, a new kubeconfig.
        let cred = pki.client_ca.issue_client(
            ADMIN_USER,
            &[ADMIN_GROUP],
            Duration::from_secs(3600 + 60 * (round as u64 + 1)),
        )?;
        let before = testbed::audit::count(&bed.apiserver.audit_log, USER)?;
        let t0 = Instant::now();
        sources.replace(SOURCE, &PostParams::default(), &cert_secret(&cred)).await?;
        let (first_at, last_at) = wait_targets(&targets, targets_count, &marker(&cred), t0).await?;
        let after = testbed::audit::count(&bed.apiserver.audit_log, USER)?;
        // By kind, so a renewal that sends more than one write per target says what the rest were.
        let by_kind: BTreeMap<String, usize> = after
            .iter()
            .filter(|((_, resource), _)| resource != "leases")
            .map(|(k, n)| (format!("{} {}", k.0, k.1), n - before.get(k).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect();
        let sent: usize = by_kind.values().sum();
        eprintln!("rotate: round {}: {sent} requests by kind {by_kind:?}", round + 1);
        requests.push(sent as f64);
        total.push(last_at);
        to_first.push(first_at);
        spread.push(last_at - first_at);
        // The proof alone: what the agent asks the front proxy before it publishes, asked by the bench.
        let kubeconfig = targets
            .get("kcp-admin-0")
            .await?
            .data
            .and_then(|d| d.get(KEY).map(|v| String::from_utf8_lossy(&v.0).into_owned()))
            .context("the target's kubeconfig")?;
        let started = Instant::now();
        let user = self_subject_review(&kubeconfig).await?;
        proofs.push(started.elapsed().as_secs_f64());
        anyhow::ensure!(user == ADMIN_USER, "the published kubeconfig authenticates as {user:?}");
    }
    let hwm = common::status_bytes(pid, "VmHWM").context("VmHWM")?;
    agent.terminate(Duration::from_secs(10));

    Ok(Measured { total, to_first, spread, proofs, requests, hwm })
}

fn cert_secret(cred: &testbed::certs::Credential) -> Secret {
    Secret {
        metadata: ObjectMeta { name: Some(SOURCE.into()), ..Default::default() },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            ("tls.crt".to_string(), ByteString(cred.cert_pem.clone().into_bytes())),
            ("tls.key".to_string(), ByteString(cred.key_pem.clone().into_bytes())),
        ])),
        ..Default::default()
    }
}

/// The certificate as a kubeconfig carries it (`client-certificate-data`).
fn marker(cred: &testbed::certs::Credential) -> String {
    base64::engine::general_purpose::STANDARD.encode(&cred.cert_pem)
}

/// Lists the targets' namespace until all `count` targets hold `marker` (one list per poll, not a get per
/// target: at hundreds of targets a sweep of gets would itself take seconds): seconds from `t0` to the first and
/// to the last seen so.
async fn wait_targets(targets: &Api<Secret>, count: usize, marker: &str, t0: Instant) -> Result<(f64, f64)> {
    let mut first: Option<f64> = None;
    let names: std::collections::BTreeSet<String> = (0..count).map(|i| format!("kcp-admin-{i}")).collect();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let holding = targets
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|s| s.metadata.name.as_ref().is_some_and(|n| names.contains(n)))
            .filter(|s| {
                s.data
                    .as_ref()
                    .is_some_and(|d| d.get(KEY).is_some_and(|v| String::from_utf8_lossy(&v.0).contains(marker)))
            })
            .count();
        if holding > 0 {
            first.get_or_insert(t0.elapsed().as_secs_f64());
        }
        if holding == count {
            return Ok((first.unwrap_or_default(), t0.elapsed().as_secs_f64()));
        }
        anyhow::ensure!(Instant::now() < deadline, "{holding} of {count} targets updated within 300s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn self_subject_review(kubeconfig: &str) -> Result<String> {
    let client = testbed::kcp::client_from_yaml(kubeconfig).await?;
    let review = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
        .header("content-type", "application/json")
        .body(br#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#.to_vec())?;
    let answer: serde_json::Value = client.request(review).await?;
    Ok(answer["status"]["userInfo"]["username"].as_str().unwrap_or_default().to_string())
}
