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
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::json;
use testbed::agent_process::AgentUnderTest;
use testbed::kcp::pki::{ADMIN_GROUP, ADMIN_USER};

use crate::common::{self, MIB, Report, Row};
use e2e::layout::{self, HUB_NAMESPACE, KCP_NAMESPACE};

const TARGETS: usize = 10;
const SOURCE: &str = "kcp-admin-cert";
const KEY: &str = "admin.kubeconfig";

pub async fn run(rounds: usize) -> Result<Report> {
    eprintln!("rotate: starting etcd, kube-apiserver and kcp (two shards, front proxy)");
    let bed = testbed::ControlPlane::start().await?;
    let layout = layout::seed(&bed).await?;
    let pki = &layout.kcp.pki;
    let front_proxy = layout.kcp.front_proxy.url.clone();
    let sources = Api::<Secret>::namespaced(bed.client(), KCP_NAMESPACE);
    let targets = Api::<Secret>::namespaced(bed.client(), HUB_NAMESPACE);
    let first = pki.client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], Duration::from_secs(3600))?;
    sources.create(&PostParams::default(), &cert_secret(&first)).await?;

    let target_lines: String = (0..TARGETS)
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
    let agent = AgentUnderTest::new(&bed, &binary, &config).namespace(KCP_NAMESPACE).identity("kubeconfig-rotator");
    let mut agent = agent.envs(&env).ready_within(Duration::from_secs(60)).start().await?;
    let pid = agent.process.pid().context("the agent exited")?;
    let t0 = Instant::now();
    wait_targets(&targets, &marker(&first), t0).await.context("the first publication")?;

    let (mut total, mut to_first, mut spread, mut proofs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        eprintln!("rotate: round {}/{rounds}", round + 1);
        // A different lifetime each round, as renewals have: a new certificate, a new kubeconfig.
        let cred = pki.client_ca.issue_client(
            ADMIN_USER,
            &[ADMIN_GROUP],
            Duration::from_secs(3600 + 60 * (round as u64 + 1)),
        )?;
        let t0 = Instant::now();
        sources.replace(SOURCE, &PostParams::default(), &cert_secret(&cred)).await?;
        let (first_at, last_at) = wait_targets(&targets, &marker(&cred), t0).await?;
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
            "first_to_last_seconds": spread, "proof_seconds": proofs, "agent_peak_rss_bytes": hwm,
        }),
    })
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

/// Polls every target until all hold `marker`: seconds from `t0` to the first and to the last seen so.
async fn wait_targets(targets: &Api<Secret>, marker: &str, t0: Instant) -> Result<(f64, f64)> {
    let mut first: Option<f64> = None;
    let mut done = [false; TARGETS];
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        for (i, done) in done.iter_mut().enumerate().filter(|(_, d)| !**d) {
            let holds = targets
                .get_opt(&format!("kcp-admin-{i}"))
                .await?
                .and_then(|s| s.data)
                .is_some_and(|d| d.get(KEY).is_some_and(|v| String::from_utf8_lossy(&v.0).contains(marker)));
            if holds {
                *done = true;
                first.get_or_insert(t0.elapsed().as_secs_f64());
            }
        }
        if done.iter().all(|d| *d) {
            return Ok((first.unwrap_or_default(), t0.elapsed().as_secs_f64()));
        }
        anyhow::ensure!(Instant::now() < deadline, "not every target updated within 120s");
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
