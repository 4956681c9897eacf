//! kubeconfig-rotator as a process against a real apiserver (the hub), the real cert-manager controller and
//! kcp-operator running on it as host processes (testbed::operators), and real kcp: every credential is proven
//! with a SelfSubjectReview at `/clusters/root` through the real front proxy. kcp is shared by the tests of this
//! binary (it takes about a minute to start); each test has its own apiserver and namespaces.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use common::*;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kubeconfig_rotator::credential;
use kubeconfig_rotator::target::restart_keys;
use serde::Deserialize;
use serde_json::json;
use testbed::agent_process::run_to_completion;
use testbed::certs::{Ca, Credential};
use testbed::kcp::pki::{ADMIN_GROUP, ADMIN_USER};
use testbed::scrape::{apply_yaml, metric, metrics, wait_for_metric};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

const HOUR: Duration = Duration::from_secs(3600);

/// A Deployment that reads the kubeconfig once at start (no controller runs, so `metadata.generation` counts the
/// pod-template changes, i.e. the restarts).
async fn consumer(layout: &Layout, name: &str) -> Result<()> {
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "hub", "image": "hub"}]}},
        },
    }))?;
    Api::<Deployment>::namespaced(layout.bed.client(), &layout.dst).create(&PostParams::default(), &deployment).await?;
    Ok(())
}

async fn generation(layout: &Layout, name: &str) -> i64 {
    let d =
        Api::<Deployment>::namespaced(layout.bed.client(), &layout.dst).get(name).await.expect("the consumer exists");
    d.metadata.generation.unwrap_or_default()
}

fn operator_config(layout: &Layout, extra: &str, target_extra: &str) -> String {
    format!(
        "resyncInterval: 5s\nkubeconfigs:\n- name: {KUBECONFIG}\n  source: {{kubeconfig: {{namespace: {src}, name: {KUBECONFIG}, renderedSecret: {RENDERED}, serverCA: {{namespace: {src}, name: root-server-ca, key: tls.crt}}}}}}\n{extra}  targets:\n  - {{namespace: {dst}, name: {TARGET}, key: {TARGET_KEY}, restartDeployments: [hub]{target_extra}}}\n",
        src = layout.src,
        dst = layout.dst,
    )
}

fn not_after(secret: &Secret) -> OffsetDateTime {
    let text = annotation(secret, "kcp-keeper.io/not-after").expect("the target carries its notAfter");
    OffsetDateTime::parse(&text, &Rfc3339).expect("RFC 3339")
}

/// The client certificate inside a kubeconfig.
fn client_cert(kubeconfig: &[u8]) -> credential::CertInfo {
    credential::peek(kubeconfig).expect("a kubeconfig with a client certificate")
}

#[tokio::test]
async fn the_target_stays_valid_across_rotations_for_a_probe_every_200ms_through_the_front_proxy() -> Result<()> {
    let mut layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    layout.operator("2m", None).await?;
    consumer(&layout, "hub").await?;
    let port = front_proxy_port(layout.kcp);
    // The operator renders `https://localhost:<port>`; the target gets the loopback address instead, as the hub gets
    // the in-cluster Service, and the candidate is proven with that address.
    let config = layout.write_config(&operator_config(
        &layout,
        &format!("  server: https://127.0.0.1:{port}\n"),
        ", splitKeys: true",
    ))?;
    let mut agent = layout.start(&config).await?;
    let first = testbed::eventually(WAIT, "the first publication", || async { layout.target().await }).await;
    let first_not_after = not_after(&first);

    // The probe: re-read the target, authenticate with it, every 200 ms, until past the first notAfter and three
    // serials were seen.
    let mut serials = BTreeSet::new();
    let mut hashes = BTreeSet::new();
    let (mut probes, mut failures, mut unanswered) = (0, Vec::new(), Vec::new());
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let deadline = first_not_after + time::Duration::seconds(120);
    loop {
        tick.tick().await;
        let now = OffsetDateTime::now_utc();
        if (now > first_not_after + time::Duration::seconds(2) && serials.len() >= 3) || now > deadline {
            break;
        }
        let target = layout.target().await.expect("the target stays");
        let kubeconfig = key(&target, TARGET_KEY).expect("the target key stays");
        probes += 1;
        match self_subject_review(&kubeconfig).await {
            Ok(user) if user == ADMIN_USER => {}
            Ok(user) => failures.push(format!("probe {probes}: authenticated as {user}")),
            // The front proxy's own 502: its backend, the shard, did not answer (now and then on a busy machine);
            // the credential was accepted. Anything else (401, 403, a TLS or connection error) is a refusal.
            Err(e) if matches!(e.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 502) => {
                unanswered.push(format!("probe {probes}: {e}"))
            }
            Err(e) => failures.push(format!("probe {probes}: {e}")),
        }
        serials.insert(client_cert(&kubeconfig).serial);
        hashes.insert(annotation(&target, "kcp-keeper.io/content-hash").expect("hash annotation"));
    }
    eprintln!(
        "probe: {probes} requests, {} serials, {} failures, {} not answered",
        serials.len(),
        failures.len(),
        unanswered.len()
    );
    assert!(failures.is_empty(), "{} of {probes} probes failed: {failures:?}", failures.len());
    assert!(
        unanswered.len() * 100 <= probes,
        "the front proxy answered 502 to {} of {probes}: {unanswered:?}",
        unanswered.len()
    );
    assert!(serials.len() >= 3, "serials seen: {serials:?}");
    assert!(OffsetDateTime::now_utc() > first_not_after, "the probe ran past the first certificate's notAfter");

    let target = layout.target().await.expect("target");
    let kubeconfig = key(&target, TARGET_KEY).expect("key");
    let published = credential::parse(&kubeconfig, OffsetDateTime::now_utc()).expect("the target parses");
    assert!(published.server.starts_with(&format!("https://127.0.0.1:{port}/clusters/root")), "server rewritten");
    assert_eq!(key(&target, "tls.crt").as_deref(), Some(&published.cert_pem[..]), "split tls.crt");
    assert_eq!(key(&target, "ca.crt").as_deref(), Some(&published.ca_pem[..]), "split ca.crt");
    assert_eq!(key(&target, "tls.key").as_deref(), Some(&published.key_pem.expose()[..]), "split tls.key");

    // One restart per published content, none for the cycles in between (the resync ran every 5 s).
    // (The restart follows the write the probe may just have seen: wait for it; an extra restart never matches.)
    let restarts = 1 + hashes.len() as i64;
    testbed::eventually(WAIT, "one restart per published content", || async {
        (generation(&layout, "hub").await == restarts).then_some(())
    })
    .await;
    let text = metrics(&agent).await;
    let series = |name: &str| format!("kubeconfig_rotator_{name}{{kubeconfig=\"{KUBECONFIG}\"}}");
    assert_eq!(metric(&text, &series("rotations_total"))?, (hashes.len() - 1) as f64);
    assert!(metric(&text, &series("nudges_total"))? >= 2.0, "renewals at renewal time were picked up by nudges");
    assert_eq!(
        metric(&text, &series("certificate_not_after_timestamp_seconds"))?,
        published.cert.not_after.unix_timestamp() as f64
    );
    assert!(metric(&text, &series("last_sync_timestamp_seconds"))? > 0.0);
    assert!(metric(&text, &series("certificate_expiry_seconds"))? > 0.0);
    let target_series = format!(
        "kubeconfig_rotator_target_in_sync{{kubeconfig=\"{KUBECONFIG}\",namespace=\"{}\",name=\"{TARGET}\"}}",
        layout.dst
    );
    assert_eq!(metric(&text, &target_series)?, 1.0);
    assert_eq!(
        metric(
            &text,
            &format!(
                "kubeconfig_rotator_verification_failures_total{{kubeconfig=\"{KUBECONFIG}\",reason=\"refused\"}}"
            )
        )?,
        0.0
    );
    // One Event per pass, on the source (the Kubeconfig), naming the target it rotated; none on the target.
    let rotated = layout.events(&layout.src, "Rotated").await;
    let target = format!("Rotated (1): {}/{TARGET} (from serial ", layout.dst);
    assert!(rotated.iter().any(|n| n.contains(&target)), "an Event on the source says it rotated: {rotated:?}");
    assert!(layout.events(&layout.dst, "Rotated").await.is_empty(), "no Event per target");

    // `status` shows the kubeconfig in sync; `rotate` forces one more certificate, which reaches the target.
    let kubeconfig_path = layout.bed.apiserver.admin_kubeconfig.display().to_string();
    let config_path = config.display().to_string();
    let (code, out, err) =
        run_to_completion(Path::new(BINARY), &["status", "--config", &config_path, "--kubeconfig", &kubeconfig_path])?;
    assert_eq!(code, Some(0), "{err}");
    let row = out.lines().find(|l| l.starts_with(KUBECONFIG)).unwrap_or_else(|| panic!("no row in {out}"));
    assert!(row.contains(&format!("CN={ADMIN_USER}")) && row.trim_end().ends_with("yes"), "{out}");
    let before = published.cert.serial.clone();
    let (code, out, err) = run_to_completion(
        Path::new(BINARY),
        &["rotate", KUBECONFIG, "--config", &config_path, "--kubeconfig", &kubeconfig_path],
    )?;
    assert_eq!(code, Some(0), "{out}{err}");
    testbed::eventually(WAIT, "the target to carry the certificate `rotate` asked for", || async {
        layout.target_serial().await.filter(|s| *s != before)
    })
    .await;

    let status = agent.terminate(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "exit after SIGTERM: {status:?}");
    let key_pem = String::from_utf8(published.key_pem.expose().clone())?;
    let log = agent.process.log();
    testbed::assert_no_secret_material(&log, &[&key_pem]);
    testbed::assert_no_secret_material(&layout.all_event_notes().await, &[&key_pem]);
    Ok(())
}

#[tokio::test]
async fn with_exactly_its_rbac_it_forces_an_overdue_renewal_on_status_and_nudges_the_stale_render() -> Result<()> {
    let mut layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    // cert-manager renews this certificate on its own only 5 s before its end: the renewal the agent forces once
    // less than its renewBefore (100 s of 120 s) is left comes long before.
    layout.operator("2m", Some("5s")).await?;
    consumer(&layout, "hub").await?;
    let config = layout.write_config(&operator_config(&layout, "  renewBefore: 100s\n", ""))?;
    let (code, rbac, err) = run_to_completion(
        Path::new(BINARY),
        &["rbac", "--config", &config.display().to_string(), "--namespace", &layout.agent],
    )?;
    assert_eq!(code, Some(0), "{err}");
    assert!(apply_yaml(&layout.bed.client(), &rbac).await? >= 6, "{rbac}");
    let (token_kubeconfig, _user) = layout.bed.service_account_kubeconfig(&layout.agent, "kubeconfig-rotator").await?;
    let mut agent = layout.rotator(&config).kubeconfig(&token_kubeconfig).ready_within(WAIT).start().await?;
    let first = testbed::eventually(WAIT, "the first publication", || async { layout.target_serial().await }).await;
    let certificates: Api<DynamicObject> =
        Api::namespaced_with(layout.bed.client(), &layout.src, &testbed::operators::certificate_resource());
    let cert_name = format!("kubeconfig-cert-{KUBECONFIG}");
    let spec_before = certificates.get(&cert_name).await?.data["spec"].clone();

    // Less than renewBefore (100 s of 120 s) is left after 20 s: the agent forces a renewal, cert-manager issues,
    // and the operator, which re-renders on its own only at its 10-hour resync (nothing it watches changes when
    // cert-manager renews), must be nudged.
    let secrets = Api::<Secret>::namespaced(layout.bed.client(), &layout.src);
    let issued = testbed::eventually(Duration::from_secs(90), "a forced renewal to be issued", || async {
        let s = secrets.get_opt(&cert_name).await.ok()??;
        let serial = credential::cert_info(&key(&s, "tls.crt")?).ok()?.serial;
        (serial != first).then_some(serial)
    })
    .await;
    let issued_at = tokio::time::Instant::now();
    testbed::eventually(WAIT, "the target to carry the renewed certificate", || async {
        layout.target_serial().await.filter(|s| *s == issued)
    })
    .await;
    let took = issued_at.elapsed();
    eprintln!("renewed certificate reached the target {took:?} after it was issued");
    // Without the nudge the operator re-renders at its 10-hour resync: any bound far below it proves the nudge,
    // and a generous one leaves the chain (notice, nudge, render, proof through the front proxy, publish) room on
    // a loaded machine.
    assert!(took < Duration::from_secs(45), "a stale render waits for a nudge, not a resync: {took:?}");

    let certificate = certificates.get(&cert_name).await?;
    assert_eq!(certificate.data["spec"], spec_before, "the Certificate spec is never edited");
    for entry in certificate.metadata.managed_fields.iter().flatten() {
        if entry.manager.as_deref() == Some("kcp-keeper") {
            assert_eq!(entry.subresource.as_deref(), Some("status"), "kcp-keeper writes only the status: {entry:?}");
        }
    }
    assert!(!layout.events(&layout.src, "RenewalForced").await.is_empty(), "an Event says the renewal was forced");
    assert!(!layout.events(&layout.src, "RenderRequested").await.is_empty(), "an Event says it nudged");
    let series = |name: &str| format!("kubeconfig_rotator_{name}{{kubeconfig=\"{KUBECONFIG}\"}}");
    assert!(wait_for_metric(&agent, &series("forced_renewals_total"), "a forced renewal", |v| v >= 1.0).await >= 1.0);
    assert!(wait_for_metric(&agent, &series("nudges_total"), "a nudge", |v| v >= 1.0).await >= 1.0);
    let text = metrics(&agent).await;
    assert_eq!(metric(&text, "kubeconfig_rotator_reconcile_errors_total{reason=\"renewal_failed\"}")?, 0.0);
    assert_eq!(metric(&text, "kubeconfig_rotator_reconcile_errors_total{reason=\"nudge_failed\"}")?, 0.0);
    assert_eq!(metric(&text, "kubeconfig_rotator_reconcile_errors_total{reason=\"restart_failed\"}")?, 0.0);
    // The restart follows the target's write: wait for it rather than race it.
    testbed::eventually(WAIT, "the consumer to be restarted for the renewed content", || async {
        (generation(&layout, "hub").await >= 3).then_some(())
    })
    .await;
    let status = agent.terminate(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "exit after SIGTERM: {status:?}");
    testbed::assert_no_secret_material(&agent.process.log(), &[]);
    Ok(())
}

/// The restart annotation of consumer `name`, if it exists and carries one.
async fn restarted_for(layout: &Layout, name: &str) -> Option<String> {
    let d = Api::<Deployment>::namespaced(layout.bed.client(), &layout.dst).get_opt(name).await.ok()??;
    d.spec.template.metadata?.annotations?.get(&format!("kcp-keeper.io/restarted-for-{KUBECONFIG}")).cloned()
}

#[tokio::test]
async fn a_consumer_created_after_the_first_publish_is_reported_pending_and_restarted_on_a_later_pass() -> Result<()> {
    let mut layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    layout.operator("1h", None).await?;
    let config = layout.write_config(&operator_config(&layout, "", ""))?;
    let agent = layout.start(&config).await?;
    let target = testbed::eventually(WAIT, "the first publication", || async { layout.target().await }).await;
    let hash = annotation(&target, "kcp-keeper.io/content-hash").expect("hash annotation");
    let pending = format!(
        "kubeconfig_rotator_consumer_restart_pending{{kubeconfig=\"{KUBECONFIG}\",namespace=\"{}\",kind=\"Deployment\",name=\"hub\"}}",
        layout.dst
    );
    wait_for_metric(&agent, &pending, "the missing consumer pending", |v| v == 1.0).await;
    testbed::eventually(WAIT, "an Event saying the consumer is missing", || async {
        let notes = layout.events(&layout.dst, "ConsumerMissing").await;
        (!notes.is_empty()).then_some(())
    })
    .await;
    let missing = "kubeconfig_rotator_reconcile_errors_total{reason=\"consumer_missing\"}";
    wait_for_metric(&agent, missing, "the missing consumer counted", |v| v >= 1.0).await;

    // The consumer appears after the target was written: no pass writes the target again (it is unchanged), yet
    // the consumer is restarted for the content the target holds.
    consumer(&layout, "hub").await?;
    testbed::eventually(WAIT, "the late consumer restarted for the held content", || async {
        restarted_for(&layout, "hub").await.filter(|h| *h == hash)
    })
    .await;
    wait_for_metric(&agent, &pending, "nothing pending", |v| v == 0.0).await;
    assert_eq!(generation(&layout, "hub").await, 2, "restarted once");
    let held = layout.target().await.and_then(|t| annotation(&t, "kcp-keeper.io/content-hash"));
    assert_eq!(held.as_deref(), Some(hash.as_str()), "the target was not rewritten to get there");
    testbed::assert_no_secret_material(&agent.process.log(), &[]);
    Ok(())
}

/// A kubeconfig for the front proxy's root workspace with `cred`, trusting kcp's server CA.
fn kubeconfig_for(layout: &Layout, cred: &Credential, user: &str) -> String {
    let server = format!("{}/clusters/root", layout.kcp.front_proxy.url);
    testbed::apiserver::kubeconfig_yaml(&server, &layout.kcp.pki.server_ca_bundle(), cred, user)
}

#[tokio::test]
async fn bad_candidates_are_never_published_and_a_longer_lived_target_is_never_replaced() -> Result<()> {
    let layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    let client_ca = &layout.kcp.pki.client_ca;
    let sources = Api::<Secret>::namespaced(layout.bed.client(), &layout.src);
    let good = client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 365)?;
    let good_kubeconfig = kubeconfig_for(&layout, &good, ADMIN_USER);
    sources.create(&PostParams::default(), &secret("plain", &[("kubeconfig", good_kubeconfig.as_bytes())])).await?;
    let config = layout.write_config(&format!(
        "resyncInterval: 2s\nkubeconfigs:\n- name: plain\n  source: {{secret: {{namespace: {src}, name: plain, key: kubeconfig}}}}\n  expect: {{username: {ADMIN_USER}, groups: [\"{ADMIN_GROUP}\"]}}\n  targets:\n  - {{namespace: {dst}, name: {TARGET}, key: {TARGET_KEY}}}\n",
        src = layout.src,
        dst = layout.dst,
    ))?;
    let agent = layout.start(&config).await?;
    let published = testbed::eventually(WAIT, "the first publication", || async {
        key(&layout.target().await?, TARGET_KEY).filter(|k| client_cert(k).serial == serial_of(&good))
    })
    .await;

    let short = client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], Duration::from_secs(2))?;
    testbed::eventually(WAIT, "the short certificate to expire", || async {
        (OffsetDateTime::now_utc() > short.not_after).then_some(())
    })
    .await;
    let other = client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR)?;
    let mismatched = Credential { key_pem: other.key_pem.clone(), ..good.clone() };
    let rogue = Ca::new("rogue-client-ca", HOUR * 24)?.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR)?;
    let intruder = client_ca.issue_client("intruder", &[ADMIN_GROUP], HOUR)?;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("expired", kubeconfig_for(&layout, &short, ADMIN_USER).into_bytes()),
        ("unparsable", b"this is not a kubeconfig".to_vec()),
        ("key_mismatch", kubeconfig_for(&layout, &mismatched, ADMIN_USER).into_bytes()),
        ("refused", kubeconfig_for(&layout, &rogue, ADMIN_USER).into_bytes()),
        ("wrong_identity", kubeconfig_for(&layout, &intruder, "intruder").into_bytes()),
    ];
    let mut secrets =
        vec![good.key_pem.clone(), other.key_pem.clone(), rogue.key_pem.clone(), intruder.key_pem.clone()];
    for (reason, kubeconfig) in cases {
        put_source(&layout, kubeconfig).await?;
        let series =
            format!("kubeconfig_rotator_verification_failures_total{{kubeconfig=\"plain\",reason=\"{reason}\"}}");
        wait_for_metric(&agent, &series, &format!("a rejection for {reason}"), |v| v >= 1.0).await;
        let held = key(&layout.target().await.expect("target"), TARGET_KEY);
        assert_eq!(held.as_deref(), Some(&published[..]), "{reason}: the target keeps its valid credential");
    }
    // A rejection is counted before its Event is sent: the last one's may not be recorded yet, so wait for it.
    testbed::eventually(WAIT, "an Event on the source per rejection, one saying refused", || async {
        let rejections = layout.events(&layout.src, "CandidateRejected").await;
        (rejections.len() >= 5 && rejections.iter().any(|n| n.contains("refused"))).then_some(())
    })
    .await;

    // A valid, proven credential that expires sooner than the target's is not published.
    let shorter = client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR)?;
    put_source(&layout, kubeconfig_for(&layout, &shorter, ADMIN_USER).into_bytes()).await?;
    let kept = format!("Kept, lasting longer than the candidate (1): {}/{TARGET} (serial ", layout.dst);
    testbed::eventually(WAIT, "a KeptLonger Event on the source naming the target", || async {
        let notes = layout.events(&layout.src, "KeptLonger").await;
        notes.iter().any(|n| n.contains(&kept)).then_some(notes)
    })
    .await;
    assert_eq!(key(&layout.target().await.expect("target"), TARGET_KEY).as_deref(), Some(&published[..]));
    // A longer-lived one is.
    let longer = client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 700)?;
    put_source(&layout, kubeconfig_for(&layout, &longer, ADMIN_USER).into_bytes()).await?;
    testbed::eventually(WAIT, "the longer-lived credential to be published", || async {
        key(&layout.target().await?, TARGET_KEY).filter(|k| client_cert(k).serial == serial_of(&longer))
    })
    .await;
    let rotations =
        wait_for_metric(&agent, "kubeconfig_rotator_rotations_total{kubeconfig=\"plain\"}", "a rotation", |v| v >= 1.0)
            .await;
    assert_eq!(rotations, 1.0);

    secrets.extend([shorter.key_pem.clone(), longer.key_pem.clone()]);
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
    testbed::assert_no_secret_material(&agent.process.log(), &secrets);
    testbed::assert_no_secret_material(&layout.all_event_notes().await, &secrets);
    Ok(())
}

#[tokio::test]
async fn a_certificate_secret_is_built_into_a_kubeconfig_proven_and_published() -> Result<()> {
    let layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    let pki = &layout.kcp.pki;
    let cred = pki.client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR)?;
    let sources = Api::<Secret>::namespaced(layout.bed.client(), &layout.src);
    let client_secret =
        secret("kcp-admin-cert", &[("tls.crt", cred.cert_pem.as_bytes()), ("tls.key", cred.key_pem.as_bytes())]);
    sources.create(&PostParams::default(), &client_secret).await?;
    let server_ca = secret("root-server-ca", &[("tls.crt", pki.server_ca.cert_pem().as_bytes())]);
    sources.create(&PostParams::default(), &server_ca).await?;
    let config = layout.write_config(&format!(
        "resyncInterval: 1s\nkubeconfigs:\n- name: built\n  source: {{certificateSecret: {{namespace: {src}, name: kcp-admin-cert, server: \"{fp}/clusters/root\", ca: {{namespace: {src}, name: root-server-ca, key: tls.crt}}}}}}\n  expect: {{username: {ADMIN_USER}, groups: [\"{ADMIN_GROUP}\"]}}\n  targets:\n  - {{namespace: {dst}, name: {TARGET}, key: {TARGET_KEY}}}\n",
        src = layout.src,
        dst = layout.dst,
        fp = layout.kcp.front_proxy.url,
    ))?;
    let agent = layout.start(&config).await?;
    let kubeconfig =
        testbed::eventually(WAIT, "the built kubeconfig", || async { key(&layout.target().await?, TARGET_KEY) }).await;
    assert_eq!(self_subject_review(&kubeconfig).await?, ADMIN_USER, "the published kubeconfig authenticates");
    assert_eq!(client_cert(&kubeconfig).not_after.unix_timestamp(), cred.not_after.unix_timestamp());

    // Cycles with nothing new write nothing: the target's resourceVersion stays through several synced cycles.
    let rv = layout.target().await.and_then(|t| t.metadata.resource_version).expect("resourceVersion");
    let synced = "kubeconfig_rotator_last_sync_timestamp_seconds{kubeconfig=\"built\"}";
    let first_sync = wait_for_metric(&agent, synced, "a sync", |v| v > 0.0).await;
    wait_for_metric(&agent, synced, "three more synced cycles", |v| v >= first_sync + 3.0).await;
    let after = layout.target().await.and_then(|t| t.metadata.resource_version).expect("resourceVersion");
    assert_eq!(after, rv, "a no-op cycle must not write the target");

    let (code, _out, err) = run_to_completion(
        Path::new(BINARY),
        &[
            "rotate",
            "built",
            "--config",
            &config.display().to_string(),
            "--kubeconfig",
            &layout.bed.apiserver.admin_kubeconfig.display().to_string(),
        ],
    )?;
    assert_eq!(code, Some(1), "only an operator source can be re-issued");
    assert!(err.contains("only a kcp-operator Kubeconfig can be re-issued"), "{err}");
    testbed::assert_no_secret_material(&agent.process.log(), &[&cred.key_pem]);
    Ok(())
}

fn serial_of(cred: &Credential) -> String {
    credential::cert_info(cred.cert_pem.as_bytes()).expect("a certificate").serial
}

/// A loopback "server" that counts the connections it accepts and keeps every byte sent to it.
struct Attacker {
    port: u16,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    received: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Attacker {
    async fn start() -> Result<Self> {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (a, r) = (accepted.clone(), received.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                a.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let r = r.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        r.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                });
            }
        });
        Ok(Self { port, accepted, received, task })
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The kubeconfig of `kubeconfig_for` with `edit` applied to its YAML.
fn edited(layout: &Layout, cred: &Credential, edit: impl FnOnce(&mut serde_yaml::Value)) -> Vec<u8> {
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&kubeconfig_for(layout, cred, ADMIN_USER)).expect("YAML");
    edit(&mut doc);
    serde_yaml::to_string(&doc).expect("YAML").into_bytes()
}

fn set(doc: &mut serde_yaml::Value, list: &str, inner: &str, field: &str, value: serde_yaml::Value) {
    doc[list][0][inner].as_mapping_mut().expect("a map").insert(field.into(), value);
}

#[tokio::test]
async fn a_candidate_carrying_more_than_server_ca_and_client_certificate_is_refused_naming_the_field_and_never_used()
-> Result<()> {
    let layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    let client_ca = &layout.kcp.pki.client_ca;
    let sources = Api::<Secret>::namespaced(layout.bed.client(), &layout.src);
    let good = client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 365)?;
    sources
        .create(
            &PostParams::default(),
            &secret("plain", &[("kubeconfig", kubeconfig_for(&layout, &good, ADMIN_USER).as_bytes())]),
        )
        .await?;
    let config = layout.write_config(&format!(
        "resyncInterval: 2s\nkubeconfigs:\n- name: plain\n  source: {{secret: {{namespace: {src}, name: plain, key: kubeconfig}}}}\n  expect: {{username: {ADMIN_USER}, groups: [\"{ADMIN_GROUP}\"]}}\n  targets:\n  - {{namespace: {dst}, name: {TARGET}, key: {TARGET_KEY}}}\n",
        src = layout.src,
        dst = layout.dst,
    ))?;
    let agent = layout.start(&config).await?;
    let published = testbed::eventually(WAIT, "the first publication", || async {
        key(&layout.target().await?, TARGET_KEY).filter(|k| client_cert(k).serial == serial_of(&good))
    })
    .await;
    let doc: serde_yaml::Value = serde_yaml::from_slice(&published)?;
    for user in doc["users"].as_sequence().expect("users") {
        let fields: Vec<&str> = user["user"].as_mapping().expect("a user").keys().filter_map(|k| k.as_str()).collect();
        assert_eq!(fields, ["client-certificate-data", "client-key-data"], "published from the parsed parts alone");
    }
    assert_eq!(self_subject_review(&published).await?, ADMIN_USER, "the rendering authenticates");
    let series = "kubeconfig_rotator_verification_failures_total{kubeconfig=\"plain\",reason=\"unsupported_field\"}";
    assert_eq!(metric(&metrics(&agent).await, series)?, 0.0, "the reason is exported at 0 from the start");

    // The exfiltration attempt: whoever can write the source points the server at themselves and asks for the
    // agent's own token (tokenFile), over plain HTTP. No request may reach them.
    let attacker = Attacker::start().await?;
    let dir = layout.bed.subdir("attack")?;
    let token_file = dir.join("token");
    let token = "exfiltrated-service-account-token-7d1f";
    std::fs::write(&token_file, token)?;
    let marker = dir.join("exec-ran");
    let candidate = client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 700)?;
    let attacker_url = format!("http://127.0.0.1:{}/clusters/root", attacker.port);
    let token_path = token_file.display().to_string();
    let rogue_ca = Ca::new("not-the-kcp-server-ca", HOUR)?.cert_pem();
    let yaml = |s: &str| serde_yaml::from_str::<serde_yaml::Value>(s).expect("YAML");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "users.user.tokenFile",
            edited(&layout, &candidate, |d| {
                d["clusters"][0]["cluster"]["server"] = attacker_url.clone().into();
                set(d, "users", "user", "tokenFile", token_path.clone().into());
            }),
        ),
        (
            "users.user.exec",
            edited(&layout, &candidate, |d| {
                let exec = format!(
                    "{{apiVersion: client.authentication.k8s.io/v1beta1, command: /bin/sh, args: [-c, 'touch {}'], interactiveMode: Never}}",
                    marker.display()
                );
                set(d, "users", "user", "exec", yaml(&exec));
            }),
        ),
        (
            "clusters.cluster.insecure-skip-tls-verify",
            edited(&layout, &candidate, |d| {
                d["clusters"][0]["cluster"]["certificate-authority-data"] = base64_encode(rogue_ca.as_bytes()).into();
                set(d, "clusters", "cluster", "insecure-skip-tls-verify", true.into());
            }),
        ),
        ("users.user.token", edited(&layout, &candidate, |d| set(d, "users", "user", "token", token.into()))),
        (
            "users.user.auth-provider",
            edited(&layout, &candidate, |d| set(d, "users", "user", "auth-provider", yaml("{name: oidc}"))),
        ),
        ("users.user.username", edited(&layout, &candidate, |d| set(d, "users", "user", "username", "admin".into()))),
        ("users.user.password", edited(&layout, &candidate, |d| set(d, "users", "user", "password", token.into()))),
        (
            "clusters.cluster.proxy-url",
            edited(&layout, &candidate, |d| {
                set(d, "clusters", "cluster", "proxy-url", format!("http://127.0.0.1:{}", attacker.port).into())
            }),
        ),
        (
            "clusters.cluster.tls-server-name",
            edited(&layout, &candidate, |d| set(d, "clusters", "cluster", "tls-server-name", "localhost".into())),
        ),
        (
            "clusters.cluster.certificate-authority",
            edited(&layout, &candidate, |d| {
                set(d, "clusters", "cluster", "certificate-authority", token_path.clone().into())
            }),
        ),
        (
            "users.user.client-key",
            edited(&layout, &candidate, |d| set(d, "users", "user", "client-key", token_path.clone().into())),
        ),
        (
            "contexts (more than one, none current)",
            edited(&layout, &candidate, |d| {
                let mut other = d["contexts"][0].clone();
                other["name"] = "other".into();
                d["contexts"].as_sequence_mut().expect("a list").push(other);
                d.as_mapping_mut().expect("a map").remove("current-context");
            }),
        ),
    ];
    for (n, (field, kubeconfig)) in cases.into_iter().enumerate() {
        put_source(&layout, kubeconfig).await?;
        let want = (n + 1) as f64;
        testbed::eventually(WAIT, &format!("{field}: refused, or a request at the attacker"), || async {
            let refused = metric(&metrics(&agent).await, series).ok().filter(|v| *v >= want);
            refused.or_else(|| (attacker.accepted() > 0).then_some(0.0))
        })
        .await;
        assert_eq!(attacker.accepted(), 0, "{field}: a request reached the attacker's server");
        assert!(!marker.exists(), "{field}: the exec plugin ran");
        let held = key(&layout.target().await.expect("target"), TARGET_KEY);
        assert_eq!(held.as_deref(), Some(&published[..]), "{field}: the target is left as it is");
        let named = format!("unsupported field {field}");
        // The refusal is counted just before it is logged: wait for the line rather than race it.
        testbed::eventually(WAIT, &format!("{field}: the log naming the field"), || async {
            agent.process.log().contains(&named).then_some(())
        })
        .await;
        // Events on the source are rate limited per reason (a burst of 5, then one a minute): the first refusal's
        // is checked, the rest are named in the log.
        if n == 0 {
            testbed::eventually(WAIT, &format!("a CandidateRejected Event naming {field}"), || async {
                let notes = layout.events(&layout.src, "CandidateRejected").await;
                notes.iter().any(|n| n.contains(&named)).then_some(())
            })
            .await;
        }
    }
    // Nothing else was counted for these candidates: each was refused before any proof.
    let text = metrics(&agent).await;
    for reason in ["refused", "unreachable", "wrong_identity", "client_config"] {
        let other =
            format!("kubeconfig_rotator_verification_failures_total{{kubeconfig=\"plain\",reason=\"{reason}\"}}");
        assert_eq!(metric(&text, &other)?, 0.0, "{reason}");
    }
    assert!(attacker.received.lock().unwrap().is_empty(), "the attacker received nothing");
    let secrets = [good.key_pem.as_str(), candidate.key_pem.as_str(), token];
    testbed::assert_no_secret_material(&agent.process.log(), &secrets);
    testbed::assert_no_secret_material(&layout.all_event_notes().await, &secrets);
    assert!(!agent.process.log().contains(&token_path), "the token file's path is never echoed");
    Ok(())
}

#[tokio::test]
async fn a_longer_lived_target_that_kcp_no_longer_accepts_is_replaced_by_a_proven_candidate() -> Result<()> {
    let layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    let good = layout.kcp.pki.client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 365)?;
    let sources = Api::<Secret>::namespaced(layout.bed.client(), &layout.src);
    let source = secret("plain", &[("kubeconfig", kubeconfig_for(&layout, &good, ADMIN_USER).as_bytes())]);
    sources.create(&PostParams::default(), &source).await?;
    // The target holds a credential that lasts longer but is signed by a client CA kcp does not trust (an old
    // client CA, a hand-pasted one).
    let stale =
        Ca::new("retired-client-ca", HOUR * 24 * 800)?.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 700)?;
    let held = secret(TARGET, &[(TARGET_KEY, kubeconfig_for(&layout, &stale, ADMIN_USER).as_bytes())]);
    Api::<Secret>::namespaced(layout.bed.client(), &layout.dst).create(&PostParams::default(), &held).await?;
    let config = layout.write_config(&format!(
        "resyncInterval: 2s\nkubeconfigs:\n- name: plain\n  source: {{secret: {{namespace: {src}, name: plain, key: kubeconfig}}}}\n  expect: {{username: {ADMIN_USER}, groups: [\"{ADMIN_GROUP}\"]}}\n  targets:\n  - {{namespace: {dst}, name: {TARGET}, key: {TARGET_KEY}, adopt: true}}\n",
        src = layout.src,
        dst = layout.dst,
    ))?;
    let agent = layout.start(&config).await?;
    let published = testbed::eventually(WAIT, "the unproven target replaced by the proven candidate", || async {
        key(&layout.target().await?, TARGET_KEY).filter(|k| client_cert(k).serial == serial_of(&good))
    })
    .await;
    assert_eq!(self_subject_review(&published).await?, ADMIN_USER, "what replaced it authenticates");
    let notes = layout.events(&layout.src, "KeptLonger").await;
    assert!(notes.is_empty(), "an unproven target is never kept: {notes:?}");
    let replaced = format!(
        "failing its proof (1): {}/{TARGET} (serial {}: the server refused the credential (401)).",
        layout.dst,
        serial_of(&stale)
    );
    testbed::eventually(WAIT, "an Event on the source saying why it was replaced", || async {
        let notes = layout.events(&layout.src, "ReplacedUnproven").await;
        notes.iter().any(|n| n.contains(&replaced)).then_some(())
    })
    .await;
    testbed::assert_no_secret_material(&agent.process.log(), &[&good.key_pem, &stale.key_pem]);
    testbed::assert_no_secret_material(&layout.all_event_notes().await, &[&good.key_pem, &stale.key_pem]);
    Ok(())
}

#[tokio::test]
async fn a_longer_lived_target_for_another_front_proxy_name_is_replaced_by_the_candidate_for_the_rewritten_server()
-> Result<()> {
    let layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    let port = front_proxy_port(layout.kcp);
    let client_ca = &layout.kcp.pki.client_ca;
    // The source points at the front proxy's loopback address; `server:` rewrites the candidate to its other name,
    // `localhost`, as a moved front proxy would be.
    let good = client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 365)?;
    let sources = Api::<Secret>::namespaced(layout.bed.client(), &layout.src);
    let source = secret("plain", &[("kubeconfig", kubeconfig_for(&layout, &good, ADMIN_USER).as_bytes())]);
    sources.create(&PostParams::default(), &source).await?;
    // The target holds a credential that lasts longer, for the same user, from the client CA kcp trusts, and
    // that works: but at the old name, the source's own server before the rewrite.
    let old = client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 700)?;
    let held_kubeconfig = kubeconfig_for(&layout, &old, ADMIN_USER);
    assert_eq!(self_subject_review(held_kubeconfig.as_bytes()).await?, ADMIN_USER, "the held credential works");
    let held = secret(TARGET, &[(TARGET_KEY, held_kubeconfig.as_bytes())]);
    Api::<Secret>::namespaced(layout.bed.client(), &layout.dst).create(&PostParams::default(), &held).await?;
    let config = layout.write_config(&format!(
        "resyncInterval: 2s\nkubeconfigs:\n- name: plain\n  source: {{secret: {{namespace: {src}, name: plain, key: kubeconfig}}}}\n  expect: {{username: {ADMIN_USER}, groups: [\"{ADMIN_GROUP}\"]}}\n  server: https://localhost:{port}\n  targets:\n  - {{namespace: {dst}, name: {TARGET}, key: {TARGET_KEY}, adopt: true}}\n",
        src = layout.src,
        dst = layout.dst,
    ))?;
    let agent = layout.start(&config).await?;
    let published = testbed::eventually(WAIT, "the target pointed at the rewritten server", || async {
        key(&layout.target().await?, TARGET_KEY).filter(|k| client_cert(k).serial == serial_of(&good))
    })
    .await;
    let parsed = credential::parse(&published, OffsetDateTime::now_utc()).expect("the target parses");
    assert_eq!(parsed.server, format!("https://localhost:{port}/clusters/root"), "the rewritten server");
    assert_eq!(self_subject_review(&published).await?, ADMIN_USER, "what replaced it authenticates");
    let replaced = format!("another server (1): {}/{TARGET} (serial {}).", layout.dst, serial_of(&old));
    testbed::eventually(WAIT, "an Event on the source saying why it was replaced", || async {
        let notes = layout.events(&layout.src, "ReplacedOtherServer").await;
        notes.iter().any(|n| n.contains(&replaced)).then_some(())
    })
    .await;

    // Settled: later passes keep the candidate (it is now what the target holds), never the old credential.
    let synced = "kubeconfig_rotator_last_sync_timestamp_seconds{kubeconfig=\"plain\"}";
    let first_sync = wait_for_metric(&agent, synced, "a sync", |v| v > 0.0).await;
    wait_for_metric(&agent, synced, "two more synced cycles", |v| v >= first_sync + 2.0).await;
    let held = key(&layout.target().await.expect("target"), TARGET_KEY);
    assert_eq!(held.as_deref(), Some(&published[..]), "the candidate stays");
    let notes = layout.events(&layout.src, "KeptLonger").await;
    assert!(notes.is_empty(), "a target for another server is never kept: {notes:?}");
    let notes = layout.all_event_notes().await;
    assert!(!notes.contains("localhost") && !notes.contains("127.0.0.1"), "no server in an Event: {notes}");
    testbed::assert_no_secret_material(&agent.process.log(), &[&good.key_pem, &old.key_pem]);
    testbed::assert_no_secret_material(&notes, &[&good.key_pem, &old.key_pem]);
    Ok(())
}

/// Replaces the kubeconfig of the plain source `plain`.
async fn put_source(layout: &Layout, kubeconfig: Vec<u8>) -> kube::Result<()> {
    let patch = json!({"data": {"kubeconfig": base64_encode(&kubeconfig)}});
    let sources = Api::<Secret>::namespaced(layout.bed.client(), &layout.src);
    sources.patch("plain", &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ())
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A plain `secret` source holding `cred`'s kubeconfig for the front proxy, and a configuration publishing it to
/// the target with `target_extra` (inside the target's flow map).
async fn plain_source(layout: &Layout, cred: &Credential, target_extra: &str) -> Result<std::path::PathBuf> {
    let sources = Api::<Secret>::namespaced(layout.bed.client(), &layout.src);
    let source = secret("plain", &[("kubeconfig", kubeconfig_for(layout, cred, ADMIN_USER).as_bytes())]);
    sources.create(&PostParams::default(), &source).await?;
    layout.write_config(&format!(
        "resyncInterval: 2s\nkubeconfigs:\n- name: {KUBECONFIG}\n  source: {{secret: {{namespace: {src}, name: plain, key: kubeconfig}}}}\n  expect: {{username: {ADMIN_USER}, groups: [\"{ADMIN_GROUP}\"]}}\n  targets:\n  - {{namespace: {dst}, name: {TARGET}, key: {TARGET_KEY}{target_extra}}}\n",
        src = layout.src,
        dst = layout.dst,
    ))
}

/// A pod template that reads the kubeconfig once at start, for any workload kind.
fn workload_spec(name: &str) -> serde_json::Value {
    json!({
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "hub"}]}},
    })
}

/// The restart annotation on the pod template and `metadata.generation` of workload `name` (no controller runs,
/// so the generation counts pod-template changes: the restarts).
async fn workload_state<K>(layout: &Layout, name: &str) -> Option<(Option<String>, i64)>
where
    K: kcp_keeper_runtime::consumer_restart::Workload,
{
    let live = Api::<K>::namespaced(layout.bed.client(), &layout.dst).get_opt(name).await.ok()??;
    let generation = live.meta().generation.unwrap_or_default();
    Some((kcp_keeper_runtime::consumer_restart::restarted_for(&live, &restart_keys(KUBECONFIG)), generation))
}

fn consumer_series(layout: &Layout, series: &str, kind: &str, name: &str) -> String {
    format!(
        "kubeconfig_rotator_{series}{{kubeconfig=\"{KUBECONFIG}\",namespace=\"{}\",kind=\"{kind}\",name=\"{name}\"}}",
        layout.dst
    )
}

#[tokio::test]
async fn statefulset_and_daemonset_consumers_are_restarted_and_a_refused_restart_is_pending_and_retried_until_it_succeeds()
-> Result<()> {
    let layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    let good = layout.kcp.pki.client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 365)?;
    let config = plain_source(&layout, &good, ", restartStatefulSets: [db], restartDaemonSets: [node-agent]").await?;
    let client = layout.bed.client();
    let mut db = json!({"metadata": {"name": "db"}, "spec": workload_spec("db")});
    db["spec"]["serviceName"] = json!("db");
    Api::<StatefulSet>::namespaced(client.clone(), &layout.dst)
        .create(&PostParams::default(), &serde_json::from_value(db)?)
        .await?;
    let agent_ds = json!({"metadata": {"name": "node-agent"}, "spec": workload_spec("node-agent")});
    Api::<DaemonSet>::namespaced(client.clone(), &layout.dst)
        .create(&PostParams::default(), &serde_json::from_value(agent_ds)?)
        .await?;

    // The agent's exact RBAC, less the DaemonSet grant: its restart is refused (403) until the grant is back.
    let (code, rbac, err) = run_to_completion(
        Path::new(BINARY),
        &["rbac", "--config", &config.display().to_string(), "--namespace", &layout.agent],
    )?;
    assert_eq!(code, Some(0), "{err}");
    assert!(rbac.contains("statefulsets") && rbac.contains("daemonsets"), "both kinds granted by name:\n{rbac}");
    let without_daemonsets: Vec<String> = serde_yaml::Deserializer::from_str(&rbac)
        .map(|doc| {
            let mut v = serde_yaml::Value::deserialize(doc).expect("YAML");
            if let Some(rules) = v.get_mut("rules").and_then(|r| r.as_sequence_mut()) {
                rules.retain(|r| !serde_yaml::to_string(&r["resources"]).unwrap_or_default().contains("daemonsets"));
            }
            serde_yaml::to_string(&v).expect("YAML")
        })
        .collect();
    apply_yaml(&client, &without_daemonsets.join("---\n")).await?;
    let (token_kubeconfig, _user) = layout.bed.service_account_kubeconfig(&layout.agent, "kubeconfig-rotator").await?;
    let agent = layout.rotator(&config).kubeconfig(&token_kubeconfig).ready_within(WAIT).start().await?;

    let target = testbed::eventually(WAIT, "the first publication", || async { layout.target().await }).await;
    let hash = annotation(&target, "kcp-keeper.io/content-hash").expect("hash annotation");
    testbed::eventually(WAIT, "the StatefulSet restarted for the published content", || async {
        workload_state::<StatefulSet>(&layout, "db").await.filter(|(h, _)| h.as_deref() == Some(hash.as_str()))
    })
    .await;
    let ds_pending = consumer_series(&layout, "consumer_restart_pending", "DaemonSet", "node-agent");
    wait_for_metric(&agent, &ds_pending, "the refused DaemonSet restart pending", |v| v == 1.0).await;
    let failed = "kubeconfig_rotator_reconcile_errors_total{reason=\"restart_failed\"}";
    let first_failures = wait_for_metric(&agent, failed, "the refused restart counted", |v| v >= 1.0).await;
    wait_for_metric(&agent, failed, "the refused restart retried", |v| v > first_failures).await;
    testbed::eventually(WAIT, "a RestartFailed Event on the DaemonSet", || async {
        let notes = layout.events(&layout.dst, "RestartFailed").await;
        notes.iter().any(|n| n.contains("DaemonSet")).then_some(())
    })
    .await;
    assert_eq!(workload_state::<DaemonSet>(&layout, "node-agent").await.expect("the DaemonSet").0, None);
    let sts_pending = consumer_series(&layout, "consumer_restart_pending", "StatefulSet", "db");
    assert_eq!(metric(&metrics(&agent).await, &sts_pending)?, 0.0, "the StatefulSet is not pending");

    // The grant is back: the next retry restarts the DaemonSet, with no write of the target in between.
    apply_yaml(&client, &rbac).await?;
    testbed::eventually(WAIT, "the DaemonSet restarted once its restart is allowed", || async {
        workload_state::<DaemonSet>(&layout, "node-agent").await.filter(|(h, _)| h.as_deref() == Some(hash.as_str()))
    })
    .await;
    wait_for_metric(&agent, &ds_pending, "nothing pending", |v| v == 0.0).await;
    assert_eq!(workload_state::<StatefulSet>(&layout, "db").await.map(|s| s.1), Some(2), "restarted once");
    assert_eq!(workload_state::<DaemonSet>(&layout, "node-agent").await.map(|s| s.1), Some(2), "restarted once");
    let held = layout.target().await.and_then(|t| annotation(&t, "kcp-keeper.io/content-hash"));
    assert_eq!(held.as_deref(), Some(hash.as_str()), "the target was not rewritten to get there");
    testbed::assert_no_secret_material(&agent.process.log(), &[&good.key_pem]);
    Ok(())
}

/// A Deployment last restarted by the agent for content `hash`, holding a credential valid until `held_not_after`.
async fn restarted_consumer(layout: &Layout, name: &str, hash: &str, held_not_after: OffsetDateTime) -> Result<()> {
    let api = Api::<Deployment>::namespaced(layout.bed.client(), &layout.dst);
    let deployment: Deployment =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": workload_spec(name)}))?;
    api.create(&PostParams::default(), &deployment).await?;
    // The two annotations applied as the agent's field manager, as its own earlier restart would have left them.
    let restart = kcp_keeper_runtime::consumer_restart::restart_patch(
        kubeconfig_rotator::config::ConsumerKind::Deployment,
        &layout.dst,
        name,
        &restart_keys(KUBECONFIG),
        hash,
        held_not_after,
    );
    api.patch(name, &PatchParams::apply("kcp-keeper"), &Patch::Apply(&restart)).await?;
    Ok(())
}

#[tokio::test]
async fn a_restart_waits_for_its_window_but_never_past_the_held_credentials_not_after_minus_the_margin() -> Result<()> {
    let layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    let good = layout.kcp.pki.client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 365)?;
    // The window opens once a year (on 29 February, at most every four years): it is closed for this test.
    let config = plain_source(
        &layout,
        &good,
        ", restartDeployments: [patient, due], restartWindow: {cron: \"0 0 29 2 *\", duration: 1h, margin: 1h}",
    )
    .await?;
    // Both were restarted for an older content. `patient` holds a credential valid for 30 more days: it waits for
    // the window. `due` holds one whose notAfter minus the margin comes in 20 s: it is restarted then, window or not.
    let now = OffsetDateTime::now_utc();
    restarted_consumer(&layout, "patient", "0000000000000000", now + time::Duration::days(30)).await?;
    restarted_consumer(&layout, "due", "0000000000000000", now + time::Duration::seconds(3600 + 20)).await?;
    let agent = layout.start(&config).await?;
    let target = testbed::eventually(WAIT, "the first publication", || async { layout.target().await }).await;
    let hash = annotation(&target, "kcp-keeper.io/content-hash").expect("hash annotation");

    let deferred =
        consumer_series(&layout, "consumer_restart_deferred_until_timestamp_seconds", "Deployment", "patient");
    let until = wait_for_metric(&agent, &deferred, "the patient restart deferred", |v| v > 0.0).await;
    assert!(
        until <= (now + time::Duration::days(30) - time::Duration::hours(1)).unix_timestamp() as f64,
        "deferred no later than its deadline"
    );
    testbed::eventually(WAIT, "a RestartDeferred Event", || async {
        let notes = layout.events(&layout.dst, "RestartDeferred").await;
        (!notes.is_empty()).then_some(())
    })
    .await;
    let deployments = Api::<Deployment>::namespaced(layout.bed.client(), &layout.dst);
    testbed::eventually(Duration::from_secs(90), "the due consumer restarted at its deadline", || async {
        let d = deployments.get_opt("due").await.ok()??;
        (kcp_keeper_runtime::consumer_restart::restarted_for(&d, &restart_keys(KUBECONFIG))? == hash).then_some(())
    })
    .await;
    let due = deployments.get("due").await?;
    let recorded = kcp_keeper_runtime::consumer_restart::held_until(&due, &restart_keys(KUBECONFIG))
        .expect("the held notAfter recorded");
    assert_eq!(recorded.unix_timestamp(), good.not_after.unix_timestamp(), "it now holds the published credential");
    // The patient one, many passes later, still waits, and nothing is pending.
    let patient = deployments.get("patient").await?;
    let patient_for = kcp_keeper_runtime::consumer_restart::restarted_for(&patient, &restart_keys(KUBECONFIG));
    assert_eq!(patient_for.as_deref(), Some("0000000000000000"), "not restarted outside its window");
    assert_eq!(patient.metadata.generation, Some(2), "its pod template untouched since it was set up");
    // The agent records a consumer's series after its restart has landed, so the test, which saw the restart
    // through its own read, waits for the record rather than scraping once (ca-syncer's twin test raced it in CI).
    let due_deferred =
        consumer_series(&layout, "consumer_restart_deferred_until_timestamp_seconds", "Deployment", "due");
    wait_for_metric(&agent, &due_deferred, "due no longer deferred once restarted", |v| v == 0.0).await;
    let text = metrics(&agent).await;
    assert_eq!(metric(&text, &consumer_series(&layout, "consumer_restart_pending", "Deployment", "patient"))?, 0.0);
    assert_eq!(metric(&text, &consumer_series(&layout, "consumer_restart_pending", "Deployment", "due"))?, 0.0);
    Ok(())
}

/// The certificates (DER) in a PEM bundle.
fn ders(pem: &[u8]) -> Vec<Vec<u8>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem).filter_map(Result::ok).map(|c| c.to_vec()).collect()
}

#[tokio::test]
async fn after_a_server_ca_change_the_old_ca_still_valid_is_published_beside_the_new_one_and_an_expired_one_is_dropped()
-> Result<()> {
    let layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    let pki = &layout.kcp.pki;
    let good = pki.client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 365)?;
    let sources = Api::<Secret>::namespaced(layout.bed.client(), &layout.src);
    let source = secret("plain", &[("kubeconfig", kubeconfig_for(&layout, &good, ADMIN_USER).as_bytes())]);
    sources.create(&PostParams::default(), &source).await?;
    // Two targets the agent published earlier (their content hash is theirs), each trusting a previous server CA:
    // one still valid for a month, one already expired.
    let previous = Ca::new("previous-server-ca", HOUR * 24 * 30)?;
    let expired = Ca::new("expired-server-ca", Duration::from_secs(2))?;
    let held = pki.client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 30)?;
    let server = format!("{}/clusters/root", layout.kcp.front_proxy.url);
    let targets = Api::<Secret>::namespaced(layout.bed.client(), &layout.dst);
    for (name, ca) in [(TARGET, &previous), ("expired-kc", &expired)] {
        let bytes = testbed::apiserver::kubeconfig_yaml(&server, &ca.cert_pem(), &held, ADMIN_USER);
        let mut s = secret(name, &[(TARGET_KEY, bytes.as_bytes())]);
        s.metadata.annotations =
            Some([("kcp-keeper.io/content-hash".to_string(), credential::content_hash(bytes.as_bytes()))].into());
        targets.create(&PostParams::default(), &s).await?;
    }
    testbed::eventually(WAIT, "the expired CA to expire", || async { expired_now(&expired).then_some(()) }).await;
    let config = layout.write_config(&format!(
        "resyncInterval: 2s\nkubeconfigs:\n- name: {KUBECONFIG}\n  source: {{secret: {{namespace: {src}, name: plain, key: kubeconfig}}}}\n  expect: {{username: {ADMIN_USER}, groups: [\"{ADMIN_GROUP}\"]}}\n  targets:\n  - {{namespace: {dst}, name: {TARGET}, key: {TARGET_KEY}, adopt: true, splitKeys: true}}\n  - {{namespace: {dst}, name: expired-kc, key: {TARGET_KEY}, adopt: true}}\n",
        src = layout.src,
        dst = layout.dst,
    ))?;
    let agent = layout.start(&config).await?;
    let serial = serial_of(&good);
    let published = testbed::eventually(WAIT, "the candidate published", || async {
        key(&layout.target().await?, TARGET_KEY).filter(|k| client_cert(k).serial == serial)
    })
    .await;
    let ca = credential::peek_ca(&published).expect("CA data");
    let current = ders(pki.server_ca_bundle().as_bytes());
    let bundle = ders(&ca);
    assert!(current.iter().all(|c| bundle.contains(c)), "the current server CA is published");
    assert!(bundle.contains(&ders(previous.cert_pem().as_bytes())[0]), "the previous CA, still valid, stays beside it");
    assert_eq!(bundle.len(), current.len() + 1, "nothing else");
    let split = key(&layout.target().await.expect("target"), "ca.crt").expect("split ca.crt");
    assert_eq!(split, ca, "the split ca.crt carries the same bundle");
    assert_eq!(self_subject_review(&published).await?, ADMIN_USER, "a client built from it verifies the real kcp");

    let other = testbed::eventually(WAIT, "the second target published", || async {
        let s = targets.get_opt("expired-kc").await.ok()??;
        key(&s, TARGET_KEY).filter(|k| client_cert(k).serial == serial)
    })
    .await;
    let other_bundle = ders(&credential::peek_ca(&other).expect("CA data"));
    assert_eq!(other_bundle, current, "an expired previous CA is not carried over");

    // The overlap is byte-stable: passes with nothing new leave the target alone.
    let rv = layout.target().await.and_then(|t| t.metadata.resource_version);
    let synced = format!("kubeconfig_rotator_last_sync_timestamp_seconds{{kubeconfig=\"{KUBECONFIG}\"}}");
    let first = wait_for_metric(&agent, &synced, "a sync", |v| v > 0.0).await;
    wait_for_metric(&agent, &synced, "two more synced passes", |v| v >= first + 2.0).await;
    assert_eq!(layout.target().await.and_then(|t| t.metadata.resource_version), rv, "not rewritten");
    testbed::assert_no_secret_material(&agent.process.log(), &[&good.key_pem, &held.key_pem]);
    Ok(())
}

fn expired_now(ca: &Ca) -> bool {
    kubeconfig_rotator::overlap::expired(ca.cert_pem().as_bytes(), OffsetDateTime::now_utc()).is_some()
}

#[tokio::test]
async fn a_candidate_whose_group_lost_a_binding_is_refused_naming_the_missing_right_and_its_workspace() -> Result<()> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    // kcp is shared by this binary's tests: the user, group and RBAC objects are named after this test's namespace.
    let who = format!("rights-{}", layout.src);
    let kcp = layout.kcp.admin_client("root").await?;
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": who},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
    }))?;
    Api::<ClusterRole>::all(kcp.clone()).create(&PostParams::default(), &role).await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": who},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": who},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": who}],
    }))?;
    let bindings = Api::<ClusterRoleBinding>::all(kcp.clone());
    bindings.create(&PostParams::default(), &binding).await?;

    let rights = "    - {verb: get, resource: configmaps, workspace: root}\n    - {verb: list, resource: configmaps, workspace: root}\n";
    let delete = kube::api::DeleteParams::default();
    let unbind = bindings.delete(&who, &delete);
    let (agent, first, second) =
        published_then_refused_once_unbound(&layout, &who, rights, unbind, "get configmaps in workspace root").await?;
    let text = metrics(&agent).await;
    for reason in ["refused", "wrong_identity", "unreachable"] {
        let other = format!(
            "kubeconfig_rotator_verification_failures_total{{kubeconfig=\"{KUBECONFIG}\",reason=\"{reason}\"}}"
        );
        assert_eq!(metric(&text, &other)?, 0.0, "{reason}: the identity itself still proves");
    }
    Api::<ClusterRole>::all(kcp).delete(&who, &Default::default()).await?;
    testbed::assert_no_secret_material(&agent.process.log(), &[&first.key_pem, &second.key_pem]);
    Ok(())
}

/// The rights scenario both rights tests share: a kubeconfig for `who` (user and group) holding `rights`
/// (`verify.rights` lines) is published, never refused for a missing right; then `unbind` takes the grant away,
/// and a longer-lived certificate for the same identity is refused with an Event naming `named`, the target
/// keeping what it holds. Returns the agent and both credentials.
async fn published_then_refused_once_unbound<E>(
    layout: &Layout,
    who: &str,
    rights: &str,
    unbind: impl std::future::Future<Output = Result<E, kube::Error>>,
    named: &str,
) -> Result<(testbed::agent_process::AgentProcess, Credential, Credential)> {
    let client_ca = &layout.kcp.pki.client_ca;
    let first = client_ca.issue_client(who, &[who], HOUR * 24 * 365)?;
    let sources = Api::<Secret>::namespaced(layout.bed.client(), &layout.src);
    sources
        .create(
            &PostParams::default(),
            &secret("plain", &[("kubeconfig", kubeconfig_for(layout, &first, who).as_bytes())]),
        )
        .await?;
    let config = layout.write_config(&format!(
        "resyncInterval: 2s\nkubeconfigs:\n- name: {KUBECONFIG}\n  source: {{secret: {{namespace: {src}, name: plain, key: kubeconfig}}}}\n  expect: {{username: {who}, groups: [{who}]}}\n  verify:\n    rights:\n{rights}  targets:\n  - {{namespace: {dst}, name: {TARGET}, key: {TARGET_KEY}}}\n",
        src = layout.src,
        dst = layout.dst,
    ))?;
    let agent = layout.start(&config).await?;
    let series = format!(
        "kubeconfig_rotator_verification_failures_total{{kubeconfig=\"{KUBECONFIG}\",reason=\"missing_right\"}}"
    );
    let published = testbed::eventually(WAIT, "the candidate holding its rights published", || async {
        key(&layout.target().await?, TARGET_KEY).filter(|k| client_cert(k).serial == serial_of(&first))
    })
    .await;
    assert_eq!(metric(&metrics(&agent).await, &series)?, 0.0, "never refused for a missing right (exported at 0)");

    unbind.await?;
    let second = client_ca.issue_client(who, &[who], HOUR * 24 * 700)?;
    let patch = json!({"data": {"kubeconfig": base64_encode(kubeconfig_for(layout, &second, who).as_bytes())}});
    sources.patch("plain", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    wait_for_metric(&agent, &series, "the candidate refused for a missing right", |v| v >= 1.0).await;
    testbed::eventually(WAIT, "an Event naming the missing right", || async {
        let notes = layout.events(&layout.src, "CandidateRejected").await;
        notes.iter().any(|n| n.contains(named)).then_some(())
    })
    .await;
    let held = key(&layout.target().await.expect("target"), TARGET_KEY);
    assert_eq!(held.as_deref(), Some(&published[..]), "the target keeps what it holds");
    Ok((agent, first, second))
}

#[tokio::test]
async fn a_right_granted_by_a_rolebinding_in_one_namespace_on_one_name_is_proven_there_and_the_candidate_published()
-> Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    // kcp is shared by this binary's tests: the user, group, namespace and RBAC objects are named after this
    // test's namespace. The group holds nothing in the workspace but what a RoleBinding grants in one namespace:
    // get on one ConfigMap by name, list on all of that namespace's.
    let who = format!("ns-rights-{}", layout.src);
    let kcp = layout.kcp.admin_client("root").await?;
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": who}}))?;
    Api::<Namespace>::all(kcp.clone()).create(&PostParams::default(), &namespace).await?;
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": who},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["hub"], "verbs": ["get"]},
                  {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}],
    }))?;
    Api::<Role>::namespaced(kcp.clone(), &who).create(&PostParams::default(), &role).await?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": who},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": who},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": who}],
    }))?;
    let bindings = Api::<RoleBinding>::namespaced(kcp.clone(), &who);
    bindings.create(&PostParams::default(), &binding).await?;

    // Asked without its namespace, or without its name, either right is denied: only asked where it is granted
    // is the candidate published; once the RoleBinding goes, the refusal names the right with both.
    let rights = format!(
        "    - {{verb: get, resource: configmaps, namespace: {who}, name: hub, workspace: root}}\n    - {{verb: list, resource: configmaps, namespace: {who}, workspace: root}}\n"
    );
    let named = format!("get configmaps named hub in namespace {who} in workspace root");
    let delete = kube::api::DeleteParams::default();
    let unbind = bindings.delete(&who, &delete);
    let (agent, first, second) = published_then_refused_once_unbound(&layout, &who, &rights, unbind, &named).await?;
    Api::<Namespace>::all(kcp).delete(&who, &Default::default()).await?;
    testbed::assert_no_secret_material(&agent.process.log(), &[&first.key_pem, &second.key_pem]);
    Ok(())
}

/// Labels namespace `ns` with `labels` (a JSON object; a null value removes the label).
async fn label_namespace(layout: &Layout, ns: &str, labels: serde_json::Value) -> Result<()> {
    let api = Api::<k8s_openapi::api::core::v1::Namespace>::all(layout.bed.client());
    api.patch(ns, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": labels}}))).await?;
    Ok(())
}

fn target_series(series: &str, ns: &str) -> String {
    format!("kubeconfig_rotator_{series}{{kubeconfig=\"{KUBECONFIG}\",namespace=\"{ns}\",name=\"{TARGET}\"}}")
}

#[tokio::test]
async fn a_selector_target_reaches_allowed_namespaces_labelled_later_never_one_its_tenant_labelled_never_overwrites_a_foreign_secret_and_is_withdrawn_when_unlabelled()
-> Result<()> {
    let layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    let client = layout.bed.client();
    let good = layout.kcp.pki.client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 365)?;
    let sources = Api::<Secret>::namespaced(client.clone(), &layout.src);
    let source = secret("plain", &[("kubeconfig", kubeconfig_for(&layout, &good, ADMIN_USER).as_bytes())]);
    sources.create(&PostParams::default(), &source).await?;
    // `selected` matches from the start; `dev` carries the label but fails the matchExpressions requirement;
    // `foreign` matches but already holds a Secret of that name someone else wrote; `late` is labelled later;
    // `tenant` is labelled by its own tenant, who may label that namespace and no other, and is not allowed.
    let [selected, dev, foreign, late, tenant] = [
        layout.bed.namespace().await?,
        layout.bed.namespace().await?,
        layout.bed.namespace().await?,
        layout.bed.namespace().await?,
        layout.bed.namespace().await?,
    ];
    let config = layout.write_config(&format!(
        "resyncInterval: 2s\nkubeconfigs:\n- name: {KUBECONFIG}\n  source: {{secret: {{namespace: {src}, name: plain, key: kubeconfig}}}}\n  expect: {{username: {ADMIN_USER}, groups: [\"{ADMIN_GROUP}\"]}}\n  targets:\n  - {{name: {TARGET}, key: {TARGET_KEY}, restartDeployments: [hub], namespaceSelector: {{matchLabels: {{kcp-hub: railgrid}}, matchExpressions: [{{key: tier, operator: In, values: [prod, staging]}}]}}, allowedNamespaces: [{selected}, {dev}, {foreign}, {late}]}}\n",
        src = layout.src,
    ))?;
    // The tenant's own rights: patch on its Namespace object, granted by a RoleBinding in it (a request on a
    // Namespace is authorized in that namespace), as a tenancy tool or a namespace-admin role grants it.
    let tenant_rbac = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: label-own-namespace, namespace: {tenant}}}\nrules:\n- {{apiGroups: [\"\"], resources: [namespaces], resourceNames: [{tenant}], verbs: [get, patch]}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: label-own-namespace, namespace: {tenant}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: label-own-namespace}}\nsubjects:\n- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant-admin}}\n"
    );
    apply_yaml(&client, &tenant_rbac).await?;
    let tenant_client = layout.bed.user_client("tenant-admin", &[]).await?;
    let tenant_namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(tenant_client);
    let labels = json!({"metadata": {"labels": {"kcp-hub": "railgrid", "tier": "prod"}}});
    let by_tenant = |ns: String| {
        let (api, labels) = (tenant_namespaces.clone(), labels.clone());
        async move { api.patch(&ns, &PatchParams::default(), &Patch::Merge(labels)).await.map(|_| ()) }
    };
    by_tenant(tenant.clone()).await?;
    let refused = |r: kube::Result<()>| matches!(r, Err(kube::Error::Api(s)) if s.code == 403);
    assert!(refused(by_tenant(selected.clone()).await), "the tenant labels its own namespace and no other");
    label_namespace(&layout, &selected, json!({"kcp-hub": "railgrid", "tier": "prod"})).await?;
    label_namespace(&layout, &dev, json!({"kcp-hub": "railgrid", "tier": "dev"})).await?;
    label_namespace(&layout, &foreign, json!({"kcp-hub": "railgrid", "tier": "staging"})).await?;
    let theirs = secret(TARGET, &[(TARGET_KEY, b"someone else's kubeconfig".as_slice())]);
    Api::<Secret>::namespaced(client.clone(), &foreign).create(&PostParams::default(), &theirs).await?;
    for ns in [&selected, &late] {
        let hub = json!({"metadata": {"name": "hub"}, "spec": workload_spec("hub")});
        Api::<Deployment>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &serde_json::from_value(hub)?)
            .await?;
    }
    // Hub Deployment for the foreign namespace too, so only the foreign Secret keeps it from converging.
    let hub = json!({"metadata": {"name": "hub"}, "spec": workload_spec("hub")});
    Api::<Deployment>::namespaced(client.clone(), &foreign)
        .create(&PostParams::default(), &serde_json::from_value(hub)?)
        .await?;

    // With exactly what `rbac` renders: a ClusterRole for the selector target, limited to its name, and a Role
    // to write it in each allowed namespace.
    let (code, rbac, err) = run_to_completion(
        Path::new(BINARY),
        &["rbac", "--config", &config.display().to_string(), "--namespace", &layout.agent],
    )?;
    assert_eq!(code, Some(0), "{err}");
    assert!(rbac.contains("kind: ClusterRole\n") && rbac.contains(&format!("- {TARGET}")), "{rbac}");
    apply_yaml(&client, &rbac).await?;
    let (token_kubeconfig, user) = layout.bed.service_account_kubeconfig(&layout.agent, "kubeconfig-rotator").await?;
    let agent = layout.rotator(&config).kubeconfig(&token_kubeconfig).ready_within(WAIT).start().await?;

    let in_namespace = |ns: String| {
        let client = client.clone();
        async move { Api::<Secret>::namespaced(client, &ns).get_opt(TARGET).await.ok().flatten() }
    };
    let published = testbed::eventually(WAIT, "the target in the selected namespace", || {
        let found = in_namespace(selected.clone());
        async move { found.await.filter(|s| annotation(s, "kcp-keeper.io/content-hash").is_some()) }
    })
    .await;
    let hash = annotation(&published, "kcp-keeper.io/content-hash").expect("hash");
    assert_eq!(client_cert(&key(&published, TARGET_KEY).expect("kubeconfig")).serial, serial_of(&good));
    testbed::eventually(WAIT, "its consumer restarted", || async {
        let live = Api::<Deployment>::namespaced(client.clone(), &selected).get_opt("hub").await.ok()??;
        (kcp_keeper_runtime::consumer_restart::restarted_for(&live, &restart_keys(KUBECONFIG))? == hash).then_some(())
    })
    .await;

    // The foreign Secret: refused, reported in the pass's Warning on the source, left byte for byte as it was.
    let not_owned = format!(" Failed, not owned (adopt: false) (1): {foreign}/{TARGET}.");
    testbed::eventually(WAIT, "a PublishFailed Event on the source naming the foreign namespace", || async {
        let notes = layout.events(&layout.src, "PublishFailed").await;
        notes.iter().any(|n| n.contains(&not_owned)).then_some(())
    })
    .await;
    assert!(layout.events(&foreign, "PublishFailed").await.is_empty(), "nothing on the foreign Secret itself");
    wait_for_metric(&agent, &target_series("target_in_sync", &foreign), "the foreign target not in sync", |v| v == 0.0)
        .await;
    let left = in_namespace(foreign.clone()).await.expect("the foreign Secret");
    assert_eq!(key(&left, TARGET_KEY).as_deref(), Some(b"someone else's kubeconfig".as_slice()));
    assert!(annotation(&left, "kcp-keeper.io/content-hash").is_none(), "nothing of ours was added");

    // A namespace labelled after start gets it (the Namespace watch wakes the agent), with its consumer.
    label_namespace(&layout, &late, json!({"kcp-hub": "railgrid", "tier": "staging"})).await?;
    testbed::eventually(WAIT, "the target in the namespace labelled later", || {
        let found = in_namespace(late.clone());
        let hash = hash.clone();
        async move { found.await.filter(|s| annotation(s, "kcp-keeper.io/content-hash") == Some(hash)) }
    })
    .await;
    wait_for_metric(&agent, &target_series("target_in_sync", &late), "the late target in sync", |v| v == 1.0).await;

    // The matchExpressions requirement holds the `dev` namespace out; the tenant's label, set before `late`'s,
    // did not bring the kubeconfig into a namespace the allow list does not name.
    assert!(in_namespace(dev.clone()).await.is_none(), "tier=dev is not selected");
    assert!(in_namespace(tenant.clone()).await.is_none(), "a namespace its tenant labelled gets nothing");
    assert!(layout.events(&tenant, "Published").await.is_empty(), "nothing was published there");
    let told = layout.all_event_notes().await;
    assert!(!told.contains(&format!("{tenant}/")), "no Event names the tenant's namespace: {told}");

    // The target is watched across the cluster, by its name only: every cluster-wide Secret request the agent
    // made carried that field selector, and its token reads no other Secret anywhere.
    let cluster_wide: Vec<_> = testbed::audit::by_user(&layout.bed.apiserver.audit_log, &user)?
        .into_iter()
        .filter(|r| r.resource == "secrets" && r.namespace.is_none())
        .collect();
    assert!(!cluster_wide.is_empty(), "the agent lists and watches its selector target across the cluster");
    let by_name = format!("fieldSelector=metadata.name%3D{TARGET}");
    assert!(cluster_wide.iter().all(|r| r.uri.contains(&by_name)), "{cluster_wide:?}");
    let token = testbed::apiserver::client_from_file(&token_kubeconfig).await?;
    let refused = |r: kube::Result<_>| matches!(r, Err(kube::Error::Api(s)) if s.code == 403);
    let all = Api::<Secret>::all(token.clone());
    assert!(refused(all.list(&kube::api::ListParams::default()).await.map(|_| ())), "cluster-wide list");
    let other = kube::api::ListParams::default().fields("metadata.name=kubeconfig-cert-hub");
    assert!(refused(all.list(&other).await.map(|_| ())), "cluster-wide list of another name");
    let beside = Api::<Secret>::namespaced(token.clone(), &selected).get_opt("hub-private").await.map(|_| ());
    assert!(refused(beside.map(|_| ())), "another Secret in a selected namespace");
    // Even the agent cannot write the target where the allow list does not name the namespace.
    let planted = Api::<Secret>::namespaced(token, &tenant)
        .create(&PostParams::default(), &secret(TARGET, &[(TARGET_KEY, b"x".as_slice())]))
        .await
        .map(|_| ());
    assert!(refused(planted), "the agent's token writes no target outside the allow list");

    // Unlabelled: the namespace is no longer selected, so its copy of the admin kubeconfig is deleted, with an
    // Event there, and its series go. The foreign Secret in a selected namespace is never deleted.
    label_namespace(&layout, &selected, json!({"tier": null})).await?;
    testbed::eventually(WAIT, "the unlabelled namespace's copy deleted", || async {
        in_namespace(selected.clone()).await.is_none().then_some(())
    })
    .await;
    // The foreign Secret fails every pass, so the pass that withdraws is a PublishFailed one: its note says both.
    let withdrawn = format!("Withdrawn, no longer selected or allowed (1): {selected}/{TARGET}.");
    testbed::eventually(WAIT, "an Event on the source saying it was withdrawn", || async {
        let notes = layout.events(&layout.src, "PublishFailed").await;
        notes.iter().any(|n| n.contains(&withdrawn) && n.contains(&not_owned)).then_some(())
    })
    .await;
    testbed::eventually(WAIT, "the unlabelled namespace's series dropped", || async {
        (!metrics(&agent).await.contains(&format!("namespace=\"{selected}\""))).then_some(())
    })
    .await;
    assert!(in_namespace(late.clone()).await.is_some(), "a namespace still selected keeps its copy");
    let left = in_namespace(foreign.clone()).await.expect("the foreign Secret");
    assert_eq!(key(&left, TARGET_KEY).as_deref(), Some(b"someone else's kubeconfig".as_slice()));

    testbed::assert_no_secret_material(&agent.process.log(), &[&good.key_pem]);
    Ok(())
}

#[tokio::test]
async fn a_server_ca_rotated_before_kcp_serves_from_it_is_published_beside_the_held_ca_and_refused_as_unreachable_without_overlap()
-> Result<()> {
    let layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    let client_ca = &layout.kcp.pki.client_ca;
    let first = client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 30)?;
    let config = plain_source(&layout, &first, "").await?;
    let agent = layout.start(&config).await?;
    testbed::eventually(WAIT, "the first credential published", || async {
        (layout.target_serial().await? == serial_of(&first)).then_some(())
    })
    .await;

    // cert-manager re-issued the server CA with a new key, and the operator rendered the kubeconfig with the new
    // CA alone, while kcp still serves from the old one: its serving certificates are re-issued later.
    let next_ca = Ca::new("testbed-server-ca", HOUR * 24 * 365)?;
    let with_next_ca = |cred: &Credential| {
        edited(&layout, cred, |doc| {
            let data = base64_encode(next_ca.cert_pem().as_bytes());
            set(doc, "clusters", "cluster", "certificate-authority-data", data.into());
        })
    };
    let second = client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 60)?;
    let alone = with_next_ca(&second);
    assert!(self_subject_review(&alone).await.is_err(), "the new CA alone does not verify kcp's server yet");
    put_source(&layout, alone).await?;
    let published = testbed::eventually(WAIT, "the renewed credential published", || async {
        let target = layout.target().await?;
        (annotation(&target, "kcp-keeper.io/serial")? == serial_of(&second)).then(|| key(&target, TARGET_KEY))?
    })
    .await;
    let parsed = credential::parse(&published, OffsetDateTime::now_utc()).expect("the target parses");
    assert!(credential::ca_contains(&parsed.ca_pem, next_ca.cert_pem().as_bytes()), "it trusts the new CA");
    let serving = layout.kcp.pki.server_ca_bundle();
    assert!(credential::ca_contains(&parsed.ca_pem, serving.as_bytes()), "and the CA kcp serves from now");
    assert_eq!(self_subject_review(&published).await?, ADMIN_USER, "what is published works now");
    drop(agent);

    // Without the overlap, a candidate whose CA does not verify the server is refused as unreachable and the
    // target keeps what it holds.
    let strict = layout.write_config(&format!(
        "resyncInterval: 2s\nkubeconfigs:\n- name: {KUBECONFIG}\n  caOverlap: false\n  source: {{secret: {{namespace: {src}, name: plain, key: kubeconfig}}}}\n  expect: {{username: {ADMIN_USER}, groups: [\"{ADMIN_GROUP}\"]}}\n  targets:\n  - {{namespace: {dst}, name: {TARGET}, key: {TARGET_KEY}}}\n",
        src = layout.src,
        dst = layout.dst,
    ))?;
    let agent = layout.start(&strict).await?;
    let third = client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR * 24 * 90)?;
    put_source(&layout, with_next_ca(&third)).await?;
    let series =
        format!("kubeconfig_rotator_verification_failures_total{{kubeconfig=\"{KUBECONFIG}\",reason=\"unreachable\"}}");
    wait_for_metric(&agent, &series, "the candidate refused as unreachable", |v| v >= 1.0).await;
    let held = key(&layout.target().await.expect("target"), TARGET_KEY);
    assert_eq!(held.as_deref(), Some(&published[..]), "the target keeps the credential that works");
    let keys: [&str; 3] = [&first.key_pem, &second.key_pem, &third.key_pem];
    testbed::assert_no_secret_material(&agent.process.log(), &keys);
    testbed::assert_no_secret_material(&layout.all_event_notes().await, &keys);
    Ok(())
}

/// The agent's requests to the target Secret since audit-log entry `from`: (verb, status code).
fn target_requests(layout: &Layout, user: &str, from: usize) -> Result<Vec<(String, Option<u16>)>> {
    let all = testbed::audit::by_user(&layout.bed.apiserver.audit_log, user)?;
    let target = |r: &&testbed::audit::Request| {
        r.resource == "secrets"
            && r.namespace.as_deref() == Some(layout.dst.as_str())
            && r.name.as_deref() == Some(TARGET)
    };
    Ok(all.iter().skip(from).filter(target).map(|r| (r.verb.clone(), r.code)).collect())
}

#[tokio::test]
async fn a_renewal_over_its_own_write_its_store_has_not_seen_reads_nothing_and_never_writes_over_a_change_made_since()
-> Result<()> {
    let mut layout = Layout::new().await?;
    let _logs = layout.kcp.logs_on_failure();
    let pki = &layout.kcp.pki;
    // No source yet: the agent starts, lists the target (there is none) and writes nothing.
    let config = layout.write_config(&format!(
        "resyncInterval: 1h\nkubeconfigs:\n- name: {KUBECONFIG}\n  source: {{secret: {{namespace: {src}, name: plain, key: kubeconfig}}}}\n  expect: {{username: {ADMIN_USER}, groups: [\"{ADMIN_GROUP}\"]}}\n  targets:\n  - {{namespace: {dst}, name: {TARGET}, key: {TARGET_KEY}}}\n",
        src = layout.src,
        dst = layout.dst,
    ))?;
    let (code, rbac, err) = run_to_completion(
        Path::new(BINARY),
        &["rbac", "--config", &config.display().to_string(), "--namespace", &layout.agent],
    )?;
    assert_eq!(code, Some(0), "{err}");
    apply_yaml(&layout.bed.client(), &rbac).await?;
    let (token_kubeconfig, user) = layout.bed.service_account_kubeconfig(&layout.agent, "kubeconfig-rotator").await?;
    let agent = layout.rotator(&config).kubeconfig(&token_kubeconfig).env("KCP_KEEPER_LEADER_ELECTION", "false");
    let mut agent = agent.ready_within(WAIT).start().await?;

    // Freeze the target's store: the agent may still get, create and patch the target, but no longer list or
    // watch it, and the apiserver's restart ends the watch it has. The store keeps what it held: nothing.
    let roles = Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(layout.bed.client(), &layout.dst);
    for mut role in roles.list(&Default::default()).await?.items {
        for rule in role.rules.iter_mut().flatten() {
            if rule.resources.iter().flatten().any(|r| r == "secrets") {
                rule.verbs.retain(|v| v != "list" && v != "watch");
            }
        }
        role.metadata.managed_fields = None;
        roles.replace(&role.metadata.name.clone().unwrap_or_default(), &PostParams::default(), &role).await?;
    }
    let restarted_at = testbed::audit::by_user(&layout.bed.apiserver.audit_log, &user)?.len();
    layout.bed.apiserver.restart().await?;
    testbed::eventually(WAIT, "the target's watch refused after the restart", || async {
        let refused = target_requests(&layout, &user, restarted_at).ok()?;
        refused.iter().any(|(verb, code)| (verb == "list" || verb == "watch") && *code == Some(403)).then_some(())
    })
    .await;

    // The first publication: the store does not hold the target, so the agent reads it (there is none) and
    // creates it.
    let sources = Api::<Secret>::namespaced(layout.bed.client(), &layout.src);
    let first = pki.client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR)?;
    let source = secret("plain", &[("kubeconfig", kubeconfig_for(&layout, &first, ADMIN_USER).as_bytes())]);
    sources.create(&PostParams::default(), &source).await?;
    let holds = |cred: &Credential| {
        let serial = client_cert(kubeconfig_for(&layout, cred, ADMIN_USER).as_bytes()).serial;
        let layout = &layout;
        async move {
            testbed::eventually(WAIT, "the target to hold the newest certificate", || async {
                layout.target_serial().await.filter(|s| *s == serial)
            })
            .await
        }
    };
    holds(&first).await;

    // A pass soon after, woken by a change to the source that leaves its content as it is: the target is what the
    // agent last wrote, and nothing of it is read.
    let from = testbed::audit::by_user(&layout.bed.apiserver.audit_log, &user)?.len();
    let synced = format!("kubeconfig_rotator_last_sync_timestamp_seconds{{kubeconfig=\"{KUBECONFIG}\"}}");
    let last = metric(&metrics(&agent).await, &synced)?;
    let touch = json!({"metadata": {"annotations": {"touched": "yes"}}});
    sources.patch("plain", &PatchParams::default(), &Patch::Merge(&touch)).await?;
    wait_for_metric(&agent, &synced, "a pass after the touch", |v| v > last).await;
    // The refused watch's own retries (list and watch, 403) are the freeze, not the pass: left out.
    let reads_and_writes = |from| -> Result<Vec<(String, Option<u16>)>> {
        let all = target_requests(&layout, &user, from)?;
        Ok(all.into_iter().filter(|(verb, _)| verb != "list" && verb != "watch").collect())
    };
    assert_eq!(reads_and_writes(from)?, vec![], "a pass with nothing to write reads no target");

    // A renewal while the store still does not hold the target: one write over our own, no read.
    let from = testbed::audit::by_user(&layout.bed.apiserver.audit_log, &user)?.len();
    let second = pki.client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR + Duration::from_secs(60))?;
    put_source(&layout, kubeconfig_for(&layout, &second, ADMIN_USER).into_bytes()).await?;
    holds(&second).await;
    let requests = reads_and_writes(from)?;
    assert_eq!(requests, vec![("patch".to_string(), Some(200))], "one write and no read of the target");

    // Someone deletes the target: the write over our own fails, and the agent reads and creates it again.
    let targets = Api::<Secret>::namespaced(layout.bed.client(), &layout.dst);
    targets.delete(TARGET, &Default::default()).await?;
    let third = pki.client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR + Duration::from_secs(120))?;
    put_source(&layout, kubeconfig_for(&layout, &third, ADMIN_USER).into_bytes()).await?;
    holds(&third).await;

    // Someone replaces it with a Secret of their own: it is never written over.
    targets.delete(TARGET, &Default::default()).await?;
    let foreign = secret(TARGET, &[(TARGET_KEY, b"someone else's".as_slice())]);
    targets.create(&PostParams::default(), &foreign).await?;
    let fourth = pki.client_ca.issue_client(ADMIN_USER, &[ADMIN_GROUP], HOUR + Duration::from_secs(180))?;
    put_source(&layout, kubeconfig_for(&layout, &fourth, ADMIN_USER).into_bytes()).await?;
    testbed::eventually(WAIT, "a PublishFailed Event for the foreign Secret", || async {
        let notes = layout.events(&layout.src, "PublishFailed").await;
        notes.iter().any(|n| n.contains(TARGET)).then_some(())
    })
    .await;
    let kept = targets.get(TARGET).await?;
    assert_eq!(key(&kept, TARGET_KEY).as_deref(), Some(b"someone else's".as_slice()), "the foreign Secret is kept");

    let status = agent.terminate(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "exit after SIGTERM: {status:?}");
    testbed::assert_no_secret_material(&agent.process.log(), &[&first.key_pem, &second.key_pem]);
    Ok(())
}
