//! The ca-syncer binary against a real apiserver: what reaches targets, what never does, and when nothing is
//! written at all.

mod common;

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use common::*;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use testbed::certs::Ca;
use testbed::tls::TlsServer;
use testbed::{ControlPlane, assert_no_secret_material, eventually};

async fn events(client: &kube::Client, ns: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), ns).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default()
}

/// Certificates in a PEM text, in order, as their base64 bodies (enough to compare sets).
fn bodies(pem: &str) -> Vec<String> {
    pem.split("-----END CERTIFICATE-----").filter(|b| b.contains("BEGIN")).map(|b| b.trim().to_string()).collect()
}

fn body(pem: &str) -> String {
    bodies(pem).remove(0)
}

#[tokio::test]
async fn cert_manager_shaped_source_yields_only_certificates_and_the_key_goes_nowhere() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let (src, dst) = (bed.namespace().await?, bed.namespace().await?);
    let root = Ca::new("kcp-root", YEAR)?;
    let server_ca = root.intermediate("root-server-ca", YEAR)?;
    let key_pem = server_ca.key_pem();
    let source = secret(
        "root-server-ca",
        &[("tls.crt", &server_ca.cert_pem()), ("ca.crt", &root.cert_pem()), ("tls.key", &key_pem)],
    );
    Api::<Secret>::namespaced(bed.client(), &src).create(&PostParams::default(), &source).await?;
    let config = format!(
        "bundles:\n- name: kcp\n  sources:\n  - secret: {{namespace: {src}, name: root-server-ca, key: tls.crt}}\n  - secret: {{namespace: {src}, name: root-server-ca, key: ca.crt}}\n  targets:\n  - secret: {{namespace: {dst}, name: kcp-ca, key: ca.crt}}\n  - configMap: {{namespace: {dst}, name: kcp-ca, key: ca.crt}}\n"
    );
    let mut agent = start_agent(&bed, &src, &config)?;
    agent.wait_ready(WAIT).await?;

    let bundle = key(&bed.client(), &dst, "kcp-ca", "ca.crt").await.expect("target written");
    let mut expected = vec![body(&root.cert_pem()), body(&server_ca.cert_pem())];
    expected.sort();
    let mut got = bodies(&bundle);
    got.sort();
    assert_eq!(got, expected, "both CA certificates, nothing else");
    let target = Api::<Secret>::namespaced(bed.client(), &dst).get("kcp-ca").await?;
    assert_eq!(target.data.as_ref().map(|d| d.len()), Some(1), "only the configured key");
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(bed.client(), &dst).get("kcp-ca").await?;
    assert_eq!(cm.data.unwrap()["ca.crt"], bundle, "Secret and ConfigMap targets carry the same bytes");

    // One Event for the pass, on the bundle's source, naming both targets (by kind, as the bundle writes both).
    let client = bed.client();
    let published = eventually(WAIT, "one Published Event for the pass", || async {
        events(&client, &src).await.into_iter().find(|e| e.reason.as_deref() == Some("Published"))
    })
    .await;
    let regarding = published.regarding.clone().unwrap_or_default();
    assert_eq!((regarding.kind.as_deref(), regarding.name.as_deref()), (Some("Secret"), Some("root-server-ca")));
    let note = published.note.clone().unwrap_or_default();
    let written = format!("Written (2): Secret {dst}/kcp-ca, ConfigMap {dst}/kcp-ca.");
    assert!(
        note.starts_with("bundle kcp (2 certificates): 2 written, 0 unchanged") && note.contains(&written),
        "{note}"
    );
    assert!(events(&client, &dst).await.is_empty(), "no Event per target");
    // Every byte a consumer, an operator or a log reader could see: decoded target data, Events, the log.
    let mut everything = agent.process.log();
    for s in Api::<Secret>::namespaced(bed.client(), &dst).list(&ListParams::default()).await?.items {
        for v in s.data.unwrap_or_default().values() {
            everything.push_str(&String::from_utf8_lossy(&v.0));
        }
    }
    everything.push_str(&serde_json::to_string(&events(&bed.client(), &src).await)?);
    assert!(everything.contains("Published"), "an Event says what was done");
    testbed::leaks::assert_no_secret_material(&everything.replace("BEGIN CERTIFICATE-----", ""), &[&key_pem]);
    assert!(!bundle.contains("PRIVATE"));
    assert!(agent.terminate(Duration::from_secs(10)).is_some_and(|s| s.success()));
    Ok(())
}

#[tokio::test]
async fn a_source_with_a_private_key_block_is_rejected_whole_and_targets_keep_their_last_good_bundle() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let ca = Ca::new("good-ca", YEAR)?;
    let (api, agent) = start_one_bundle(&bed, &ns, &ns, "guarded", &ca.cert_pem(), "").await?;
    let good = key(&bed.client(), &ns, "bundle", "ca.crt").await.expect("first bundle");

    let other = Ca::new("other-ca", YEAR)?;
    let poisoned = format!("{}{}", other.cert_pem(), other.key_pem());
    api.patch("source", &PatchParams::default(), &Patch::Merge(json!({"stringData": {"ca.crt": poisoned}}))).await?;
    let client = bed.client();
    eventually(WAIT, "a SourceRejected Event", || async {
        events(&client, &ns).await.into_iter().find(|e| e.reason.as_deref() == Some("SourceRejected"))
    })
    .await;
    wait_for_metric(
        &agent,
        "ca_syncer_source_errors_total{bundle=\"guarded\",reason=\"private_key\"}",
        "the key counted",
        |v| v >= 1.0,
    )
    .await;
    assert_eq!(
        key(&bed.client(), &ns, "bundle", "ca.crt").await.as_deref(),
        Some(good.as_str()),
        "last good bundle kept"
    );
    let log = agent.process.log();
    // The rejection's own line names the bundle, the source and the kind of problem.
    let rejection =
        log.lines().find(|l| l.contains("source rejected")).unwrap_or_else(|| panic!("no rejection line:\n{log}"));
    for part in ["\"bundle\":\"guarded\"", "\"source\":0", "private key"] {
        assert!(rejection.contains(part), "{part} in {rejection}");
    }
    let rejected = events(&bed.client(), &ns).await;
    testbed::leaks::assert_no_secret_material(&format!("{log}\n{rejected:?}"), &[&other.key_pem(), &other.cert_pem()]);

    // Garbage is rejected the same way, and so are PEM headers: each counted, the last good bundle kept.
    let cases = [
        ("not a certificate".to_string(), "text_outside_blocks"),
        (ca.cert_pem().replacen("-----\n", "-----\nProc-Type: 4,ENCRYPTED\n", 1), "pem_headers"),
    ];
    for (content, reason) in cases {
        api.patch("source", &PatchParams::default(), &Patch::Merge(json!({"stringData": {"ca.crt": content}}))).await?;
        let series = format!("ca_syncer_source_errors_total{{bundle=\"guarded\",reason=\"{reason}\"}}");
        wait_for_metric(&agent, &series, reason, |v| v >= 1.0).await;
        assert_eq!(key(&bed.client(), &ns, "bundle", "ca.crt").await.as_deref(), Some(good.as_str()), "{reason}");
    }
    Ok(())
}

#[tokio::test]
async fn a_rotated_out_ca_stays_until_its_not_after_then_only_the_new_one_remains() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    // cert-manager >= 1.18 rotates the key: the new CA is a different certificate. The old one expires soon.
    let old = Ca::new("kcp-ca", Duration::from_secs(35))?;
    let new = Ca::new("kcp-ca", YEAR)?;
    let (api, _agent) = start_one_bundle(&bed, &ns, &ns, "rotating", &old.cert_pem(), "").await?;
    api.patch("source", &PatchParams::default(), &Patch::Merge(json!({"stringData": {"ca.crt": new.cert_pem()}})))
        .await?;

    let client = bed.client();
    let both = eventually(WAIT, "old and new CA together", || async {
        key(&client, &ns, "bundle", "ca.crt").await.filter(|b| bodies(b).len() == 2)
    })
    .await;
    assert!(both.contains(&body(&old.cert_pem())) && both.contains(&body(&new.cert_pem())));
    let only_new = eventually(Duration::from_secs(60), "the old CA to leave after its notAfter", || async {
        key(&client, &ns, "bundle", "ca.crt").await.filter(|b| bodies(b).len() == 1)
    })
    .await;
    assert_eq!(bodies(&only_new), vec![body(&new.cert_pem())]);
    Ok(())
}

#[tokio::test]
async fn output_is_byte_stable_across_source_order_and_an_idle_cycle_writes_nothing() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let (a, b, c) = (Ca::new("a-ca", YEAR)?, Ca::new("b-ca", YEAR)?, Ca::new("c-ca", YEAR)?);
    let api = Api::<Secret>::namespaced(bed.client(), &ns);
    api.create(&PostParams::default(), &secret("one", &[("ca.crt", &format!("{}{}", a.cert_pem(), b.cert_pem()))]))
        .await?;
    api.create(&PostParams::default(), &secret("two", &[("ca.crt", &format!("{}{}", c.cert_pem(), a.cert_pem()))]))
        .await?;
    let src = |n: &str| format!("  - secret: {{namespace: {ns}, name: {n}, key: ca.crt}}\n");
    let config = format!(
        "resyncInterval: 1s\nbundles:\n- name: forward\n  sources:\n{}{}  targets:\n  - secret: {{namespace: {ns}, name: forward, key: ca.crt}}\n- name: backward\n  sources:\n{}{}  targets:\n  - secret: {{namespace: {ns}, name: backward, key: ca.crt}}\n",
        src("one"),
        src("two"),
        src("two"),
        src("one"),
    );
    let mut agent = start_agent(&bed, &ns, &config)?;
    agent.wait_ready(WAIT).await?;
    let forward = key(&bed.client(), &ns, "forward", "ca.crt").await.unwrap();
    assert_eq!(bodies(&forward).len(), 3, "a appears once");
    assert_eq!(Some(forward.clone()), key(&bed.client(), &ns, "backward", "ca.crt").await, "identical bytes");

    let synced = |text: &str| {
        let series = "ca_syncer_last_sync_timestamp_seconds{bundle=\"forward\"}";
        text.lines().find(|l| l.starts_with(series)).and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    // No settling: the cycles right after the first write may find a cache that has not seen it yet, and still
    // write nothing (the agent reads such a target fresh instead; tests/writes.rs for a thousand of them).
    let mut last = synced(&metrics(&agent).await).expect("the last-sync series exists");
    let rv = api.get("forward").await?.metadata.resource_version;
    let writes_series = "ca_syncer_target_writes_total{bundle=\"forward\"}";
    let writes = metric(&metrics(&agent).await, writes_series)?;
    // Unrelated Secrets wake nothing (the watches are scoped); the 1s resync runs cycles, proven by the
    // last-sync timestamp moving.
    for i in 0..3 {
        api.create(&PostParams::default(), &secret(&format!("noise-{i}"), &[])).await?;
    }
    for _ in 0..3 {
        last =
            eventually(WAIT, "another idle cycle", || async { synced(&metrics(&agent).await).filter(|v| *v > last) })
                .await;
    }
    assert_eq!(api.get("forward").await?.metadata.resource_version, rv);
    assert_eq!(metric(&metrics(&agent).await, writes_series)?, writes, "no write in idle cycles");
    Ok(())
}

#[tokio::test]
async fn selector_targets_follow_namespaces_are_restored_and_foreign_secrets_are_left_alone() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let src = bed.namespace().await?;
    let ca = Ca::new("kcp-ca", YEAR)?;
    Api::<Secret>::namespaced(bed.client(), &src)
        .create(&PostParams::default(), &secret("source", &[("ca.crt", &ca.cert_pem())]))
        .await?;
    // A namespace that already holds a same-named Secret of someone else's.
    let foreign_ns = "trusting-foreign";
    bed.create_namespace(foreign_ns).await?;
    let namespaces = Api::<Namespace>::all(bed.client());
    let label = |ns: &str| {
        let ns = ns.to_string();
        let api = namespaces.clone();
        async move {
            let patch = json!({"metadata": {"labels": {"kcp-keeper.io/trust-kcp": "true"}}});
            api.patch(&ns, &PatchParams::default(), &Patch::Merge(patch)).await
        }
    };
    Api::<Secret>::namespaced(bed.client(), foreign_ns)
        .create(&PostParams::default(), &secret("kcp-ca", &[("ca.crt", "theirs")]))
        .await?;
    label(foreign_ns).await?;
    let config = format!(
        "bundles:\n- name: fleet\n  sources:\n  - secret: {{namespace: {src}, name: source, key: ca.crt}}\n  targets:\n  - secret:\n      name: kcp-ca\n      key: ca.crt\n      namespaceSelector:\n        matchLabels: {{kcp-keeper.io/trust-kcp: \"true\"}}\n"
    );
    let _agent = start_agent(&bed, &src, &config)?;

    let fresh = "trusting-new";
    bed.create_namespace(fresh).await?;
    label(fresh).await?;
    let client = bed.client();
    let written = eventually(Duration::from_secs(60), "a newly labelled namespace to get its Secret", || async {
        key(&client, fresh, "kcp-ca", "ca.crt").await
    })
    .await;
    assert_eq!(body(&written), body(&ca.cert_pem()));

    let targets = Api::<Secret>::namespaced(bed.client(), fresh);
    targets.delete("kcp-ca", &DeleteParams::default()).await?;
    eventually(Duration::from_secs(60), "the deleted target to be recreated", || async {
        key(&client, fresh, "kcp-ca", "ca.crt").await
    })
    .await;
    targets
        .patch("kcp-ca", &PatchParams::default(), &Patch::Merge(json!({"stringData": {"ca.crt": "hand edit"}})))
        .await?;
    eventually(Duration::from_secs(60), "the hand edit to be put back", || async {
        key(&client, fresh, "kcp-ca", "ca.crt").await.filter(|k| k.contains("BEGIN CERTIFICATE"))
    })
    .await;

    assert_eq!(key(&bed.client(), foreign_ns, "kcp-ca", "ca.crt").await.as_deref(), Some("theirs"), "left alone");
    // Reported in the pass's Event on the source, by name and why.
    let failing = format!(" Failed, not owned (adopt: false) (1): {foreign_ns}/kcp-ca.");
    eventually(Duration::from_secs(60), "the foreign Secret to be reported", || async {
        events(&client, &src).await.into_iter().find(|e| {
            e.reason.as_deref() == Some("PublishFailed")
                && e.type_.as_deref() == Some("Warning")
                && e.note.as_deref().is_some_and(|n| n.contains(&failing))
        })
    })
    .await;
    assert!(events(&client, foreign_ns).await.is_empty(), "nothing on the foreign Secret itself");
    Ok(())
}

/// Many targets failing at once: the operator sees one Warning Event for the pass, on the bundle's source, that
/// counts every failure and names the first twenty with why (the rest counted), and every failing target reads
/// `target_in_sync 0` with its own series; the Event carries no certificate.
#[tokio::test]
async fn thirty_targets_not_owned_at_once_give_one_warning_counting_all_thirty_and_each_reads_0() -> Result<()> {
    const FAILING: usize = 30;
    let bed = ControlPlane::start().await?;
    let src = bed.namespace().await?;
    let ca = Ca::new("kcp-ca", YEAR)?;
    Api::<Secret>::namespaced(bed.client(), &src)
        .create(&PostParams::default(), &secret("source", &[("ca.crt", &ca.cert_pem())]))
        .await?;
    let label = ("edge.kcp-keeper.io/trust", "true");
    let (mut failing, mut written) = (Vec::new(), Vec::new());
    for i in 0..FAILING + 2 {
        let name = format!("edge-{i:02}");
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([(label.0.to_string(), label.1.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(bed.client()).create(&PostParams::default(), &ns).await?;
        // All but two hold a Secret of that name someone else wrote.
        if i < FAILING {
            Api::<Secret>::namespaced(bed.client(), &name)
                .create(&PostParams::default(), &secret("kcp-ca", &[("ca.crt", "theirs")]))
                .await?;
            failing.push(name);
        } else {
            written.push(name);
        }
    }
    let config = format!(
        "bundles:\n- name: edge\n  sources:\n  - secret: {{namespace: {src}, name: source, key: ca.crt}}\n  targets:\n  - secret: {{name: kcp-ca, key: ca.crt, namespaceSelector: {{matchLabels: {{{}: \"{}\"}}}}}}\n",
        label.0, label.1
    );
    let agent = start_agent(&bed, &src, &config)?;
    let client = bed.client();
    // The first pass writes the two and fails the thirty; the retries find the two unchanged.
    let event = eventually(WAIT, "the first pass's Warning", || async {
        events(&client, &src).await.into_iter().find(|e| {
            e.reason.as_deref() == Some("PublishFailed") && e.note.as_deref().is_some_and(|n| n.contains(" 2 written,"))
        })
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let regarding = event.regarding.clone().unwrap_or_default();
    assert_eq!((regarding.namespace.as_deref(), regarding.name.as_deref()), (Some(src.as_str()), Some("source")));
    let note = event.note.clone().unwrap_or_default();
    assert!(note.starts_with("bundle edge (1 certificate): 2 written, 0 unchanged, 0 skipped, 30 failed."), "{note}");
    let named: Vec<&String> = failing.iter().filter(|ns| note.contains(&format!("{ns}/kcp-ca"))).collect();
    assert_eq!(named.len(), kcp_keeper_runtime::events::NAMES_SHOWN, "twenty named: {note}");
    assert!(note.contains(" Failed, not owned (adopt: false) (30): edge-00/kcp-ca, "), "{note}");
    assert!(note.contains("edge-19/kcp-ca and 10 more."), "{note}");
    assert!(note.contains("First error: Secret edge-00/kcp-ca exists and was not created by kcp-keeper"), "{note}");
    assert!(note.contains(" Written (2): edge-30/kcp-ca, edge-31/kcp-ca."), "{note}");
    testbed::leaks::assert_no_secret_material(&note, &[&ca.cert_pem()]);

    // Every failing target shows in the metrics, each with its own series, beside the two written.
    let series = |ns: &str| {
        format!("ca_syncer_target_in_sync{{bundle=\"edge\",kind=\"Secret\",namespace=\"{ns}\",name=\"kcp-ca\"}}")
    };
    wait_for_metric(&agent, &series("edge-29"), "the last failing target at 0", |v| v == 0.0).await;
    let text = metrics(&agent).await;
    for ns in &failing {
        assert_eq!(metric(&text, &series(ns))?, 0.0, "{ns}");
    }
    for ns in &written {
        assert_eq!(metric(&text, &series(ns))?, 1.0, "{ns}");
    }
    assert!(metric(&text, "ca_syncer_reconcile_errors_total{reason=\"target_not_owned\"}")? >= 1.0, "{text}");

    // Retried passes fail the same way: never an Event per target, at most one per pass, each counting all 30.
    let passes = "ca_syncer_reconcile_duration_seconds_count";
    wait_for_metric(&agent, passes, "a retried pass", |v| v >= 3.0).await;
    for ns in failing.iter().chain(&written) {
        assert!(events(&client, ns).await.is_empty(), "an Event in target namespace {ns}");
    }
    let warnings: Vec<Event> =
        events(&client, &src).await.into_iter().filter(|e| e.reason.as_deref() == Some("PublishFailed")).collect();
    let passes = metric(&metrics(&agent).await, passes)?;
    assert!(warnings.len() as f64 <= passes, "{} Events for {passes} passes", warnings.len());
    for warning in &warnings {
        let note = warning.note.as_deref().unwrap_or_default();
        assert!(note.contains(" 30 failed.") && note.contains("and 10 more."), "{note}");
    }
    for ns in &failing {
        assert_eq!(key(&client, ns, "kcp-ca", "ca.crt").await.as_deref(), Some("theirs"), "{ns} left alone");
    }
    Ok(())
}

#[tokio::test]
async fn adopt_takes_over_an_existing_secret() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let ca = Ca::new("kcp-ca", YEAR)?;
    let api = Api::<Secret>::namespaced(bed.client(), &ns);
    api.create(&PostParams::default(), &secret("source", &[("ca.crt", &ca.cert_pem())])).await?;
    api.create(&PostParams::default(), &secret("kubev-kcp-front-proxy-ca", &[("ca.crt", "")])).await?;
    let config = format!(
        "bundles:\n- name: adopted\n  sources:\n  - secret: {{namespace: {ns}, name: source, key: ca.crt}}\n  targets:\n  - secret: {{namespace: {ns}, name: kubev-kcp-front-proxy-ca, key: ca.crt}}\n    adopt: true\n"
    );
    let mut agent = start_agent(&bed, &ns, &config)?;
    agent.wait_ready(WAIT).await?;
    let got = key(&bed.client(), &ns, "kubev-kcp-front-proxy-ca", "ca.crt").await.unwrap();
    assert_eq!(body(&got), body(&ca.cert_pem()));
    Ok(())
}

#[tokio::test]
async fn a_bundle_that_does_not_verify_the_live_endpoint_is_not_published_and_one_that_does_is() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let real = Ca::new("front-proxy-ca", YEAR)?;
    let wrong = Ca::new("front-proxy-ca", YEAR)?;
    let leaf = real.issue_server(&["kcp.example.com"], &[], YEAR)?;
    let server = TlsServer::start(&leaf, &[]).await?;
    let api = Api::<Secret>::namespaced(bed.client(), &ns);
    api.create(&PostParams::default(), &secret("wrong", &[("ca.crt", &wrong.cert_pem())])).await?;
    api.create(&PostParams::default(), &secret("right", &[("ca.crt", &real.cert_pem())])).await?;
    let bundle = |name: &str| {
        format!(
            "- name: {name}\n  sources:\n  - secret: {{namespace: {ns}, name: {name}, key: ca.crt}}\n  targets:\n  - secret: {{namespace: {ns}, name: {name}-bundle, key: ca.crt}}\n  liveCheck: {{url: \"{}\", serverName: kcp.example.com}}\n",
            server.url()
        )
    };
    let config = format!("bundles:\n{}{}", bundle("wrong"), bundle("right"));
    let agent = start_agent(&bed, &ns, &config)?;
    let client = bed.client();
    eventually(WAIT, "the verified bundle to be published", || async {
        key(&client, &ns, "right-bundle", "ca.crt").await
    })
    .await;
    eventually(WAIT, "a LiveCheckFailed Event", || async {
        events(&client, &ns).await.into_iter().find(|e| e.reason.as_deref() == Some("LiveCheckFailed"))
    })
    .await;
    assert!(key(&bed.client(), &ns, "wrong-bundle", "ca.crt").await.is_none(), "the unverified bundle is not written");
    let in_sync = format!(
        "ca_syncer_target_in_sync{{bundle=\"wrong\",kind=\"Secret\",namespace=\"{ns}\",name=\"wrong-bundle\"}}"
    );
    wait_for_metric(&agent, &in_sync, "the unverified target reads 0", |v| v == 0.0).await;
    let text = metrics(&agent).await;
    let failures = format!(
        "ca_syncer_live_check_failures_total{{bundle=\"wrong\",endpoint=\"{}\",reason=\"not_verified\"}}",
        server.url()
    );
    assert!(metric(&text, &failures)? >= 1.0, "{text}");
    Ok(())
}

#[tokio::test]
async fn empty_means_public_roots_writes_nothing_when_the_public_roots_do_not_verify_the_endpoint() -> Result<()> {
    // The endpoint is served from a private CA, so the public roots cannot verify it: the key must not be
    // written empty. (The positive case, with a test root named as the public roots, is the next test.)
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let private = Ca::new("private", YEAR)?;
    let server = TlsServer::start(&private.issue_server(&["localhost"], &[], YEAR)?, &[]).await?;
    let api = Api::<Secret>::namespaced(bed.client(), &ns);
    api.create(&PostParams::default(), &secret("frontproxy-ca", &[("ca.crt", "")])).await?;
    let config = format!(
        "bundles:\n- name: kubev\n  sources:\n  - secret: {{namespace: {ns}, name: frontproxy-ca, key: ca.crt}}\n  targets:\n  - secret: {{namespace: {ns}, name: kubev-kcp-front-proxy-ca, key: ca.crt}}\n  emptyMeansPublicRoots: true\n  liveCheck: {{url: \"{}\", serverName: localhost}}\n",
        server.url()
    );
    let agent = start_agent(&bed, &ns, &config)?;
    let client = bed.client();
    eventually(WAIT, "a LiveCheckFailed Event", || async {
        events(&client, &ns).await.into_iter().find(|e| e.reason.as_deref() == Some("LiveCheckFailed"))
    })
    .await;
    assert!(api.get_opt("kubev-kcp-front-proxy-ca").await?.is_none(), "no empty key without proof");
    assert_no_secret_material(&agent.process.log(), &[]);
    Ok(())
}

#[tokio::test]
async fn metrics_report_certificates_not_after_sync_state_and_freshness() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let ca = Ca::new("metrics-ca", YEAR)?;
    let (_, agent) = start_one_bundle(&bed, &ns, &ns, "observed", &ca.cert_pem(), "").await?;
    let text = metrics(&agent).await;
    assert_eq!(metric(&text, "ca_syncer_bundle_certificates{bundle=\"observed\"}")?, 1.0, "{text}");
    let not_after = metric(&text, "ca_syncer_certificate_not_after_timestamp_seconds{bundle=\"observed\"")?;
    let expected = ca_not_after(&ca);
    assert!((not_after - expected).abs() < 2.0, "{not_after} vs {expected}");
    assert_eq!(
        metric(&text, &format!("ca_syncer_target_in_sync{{bundle=\"observed\",kind=\"Secret\",namespace=\"{ns}\""))?,
        1.0
    );
    assert!(metric(&text, "ca_syncer_last_sync_timestamp_seconds{bundle=\"observed\"}")? > 1.7e9);
    assert!(text.contains("ca_syncer_build_info"));
    // Which public roots the binary carries, readable without the binary: the release and its size.
    let roots = format!(
        "ca_syncer_public_roots_info{{package=\"webpki-root-certs\",version=\"{}\",certificates=\"{}\"}}",
        ca_syncer::sources::PUBLIC_ROOTS_VERSION,
        ca_syncer::sources::public_roots().len()
    );
    assert_eq!(metric(&text, &roots)?, 1.0, "{text}");
    Ok(())
}

fn ca_not_after(ca: &Ca) -> f64 {
    let pem = ca.cert_pem();
    let certs = ca_syncer::certs::parse_certificates(pem.as_bytes(), ca_syncer::certs::EmptyPolicy::Reject).unwrap();
    certs[0].not_after().unix_timestamp() as f64
}

#[test]
fn render_prints_each_bundle_with_subject_issuer_and_not_after_without_a_cluster() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (inline, file) = (Ca::new("inline-ca", YEAR)?, Ca::new("file-ca", YEAR)?);
    let file_path = dir.path().join("extra.crt");
    std::fs::write(&file_path, file.cert_pem())?;
    let indented: String = inline.cert_pem().lines().map(|l| format!("      {l}\n")).collect();
    let config = format!(
        "bundles:\n- name: rendered\n  sources:\n  - inline: |\n{indented}  - file: {}\n  targets:\n  - secret: {{namespace: ns, name: bundle, key: ca.crt}}\n",
        file_path.display()
    );
    let config_path = dir.path().join("config.yaml");
    std::fs::write(&config_path, config)?;
    let (code, stdout, stderr) = testbed::agent_process::run_to_completion(
        Path::new(BINARY),
        &["render", "--config", &config_path.display().to_string()],
    )?;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("# bundle rendered: 2 certificates"), "{stdout}");
    let roots = format!("# public roots: webpki-root-certs {}, ", ca_syncer::sources::PUBLIC_ROOTS_VERSION);
    assert!(
        stdout.lines().next().is_some_and(|l| l.starts_with(&roots) && l.ends_with("certificates (compiled in)")),
        "{stdout}"
    );
    assert!(stdout.contains("subject=\"CN=inline-ca\" issuer=\"CN=inline-ca\" notAfter="), "{stdout}");
    assert!(stdout.contains(&body(&file.cert_pem())) && stdout.contains(&body(&inline.cert_pem())));
    Ok(())
}

#[tokio::test]
async fn every_source_kind_feeds_one_bundle_with_the_public_roots_included() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let (from_cm, from_file, from_inline) =
        (Ca::new("cm-ca", YEAR)?, Ca::new("file-ca", YEAR)?, Ca::new("inline-ca", YEAR)?);
    let cm = k8s_openapi::api::core::v1::ConfigMap {
        metadata: ObjectMeta { name: Some("extra-ca".into()), ..Default::default() },
        data: Some([("ca.crt".to_string(), from_cm.cert_pem())].into()),
        ..Default::default()
    };
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(bed.client(), &ns)
        .create(&PostParams::default(), &cm)
        .await?;
    let file = bed.subdir("ca-file")?.join("ca.crt");
    std::fs::write(&file, from_file.cert_pem())?;
    let indented: String = from_inline.cert_pem().lines().map(|l| format!("      {l}\n")).collect();
    let config = format!(
        "bundles:\n- name: everything\n  sources:\n  - configMap: {{namespace: {ns}, name: extra-ca, key: ca.crt}}\n  - file: {}\n  - inline: |\n{indented}  - publicRoots: {{}}\n  targets:\n  - secret: {{namespace: {ns}, name: bundle, key: ca.crt}}\n",
        file.display()
    );
    let mut agent = start_agent(&bed, &ns, &config)?;
    agent.wait_ready(WAIT).await?;
    let bundle = key(&bed.client(), &ns, "bundle", "ca.crt").await.expect("target written");
    let got = bodies(&bundle);
    for ca in [&from_cm, &from_file, &from_inline] {
        assert!(got.contains(&body(&ca.cert_pem())), "every source's CA is in the bundle");
    }
    let public = ca_syncer::sources::public_roots().len();
    assert_eq!(got.len(), public + 3, "the public roots plus the three private CAs");
    Ok(())
}

fn fingerprint(pem: &str) -> String {
    let certs = ca_syncer::certs::parse_certificates(pem.as_bytes(), ca_syncer::certs::EmptyPolicy::Reject).unwrap();
    certs[0].fingerprint().to_string()
}

#[tokio::test]
async fn a_forged_rotation_annotation_with_an_injected_ca_is_put_back_in_one_cycle_with_an_event() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let (agent_ns, ns) = (bed.namespace().await?, bed.namespace().await?);
    let (ours, injected) = (Ca::new("kcp-ca", YEAR)?, Ca::new("attacker-ca", YEAR)?);
    // No resync to speak of: only the cycle the edit itself triggers can put it back.
    let (api, agent) =
        start_one_bundle(&bed, &ns, &agent_ns, "guarded", &ours.cert_pem(), "resyncInterval: 1h\n").await?;
    let good = key(&bed.client(), &ns, "bundle", "ca.crt").await.expect("published");
    let record = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(bed.client(), &agent_ns)
        .get("ca-syncer-state-guarded")
        .await?;
    assert!(
        record.data.unwrap()["state.json"].contains(&fingerprint(&ours.cert_pem())),
        "the record is kept by the agent"
    );

    // Someone who can edit the target adds a CA to the data and its fingerprint to the annotation.
    let forged = format!(
        r#"{{"version":1,"published":["{}","{}"]}}"#,
        fingerprint(&ours.cert_pem()),
        fingerprint(&injected.cert_pem())
    );
    let edit = json!({
        "metadata": {"annotations": {"ca-syncer.kcp-keeper.io/rotation-state": forged}},
        "stringData": {"ca.crt": format!("{good}{}", injected.cert_pem())},
    });
    let cycles = metric(&metrics(&agent).await, "ca_syncer_reconcile_duration_seconds_count")?;
    api.patch("bundle", &PatchParams::default(), &Patch::Merge(edit)).await?;
    let client = bed.client();
    eventually(WAIT, "the injected CA removed", || async {
        key(&client, &ns, "bundle", "ca.crt").await.filter(|k| *k == good)
    })
    .await;
    let event = eventually(WAIT, "a ForeignCertificateRemoved Event", || async {
        events(&client, &ns).await.into_iter().find(|e| e.reason.as_deref() == Some("ForeignCertificateRemoved"))
    })
    .await;
    // On the bundle's source, naming the target and how many were removed.
    assert_eq!(event.regarding.and_then(|r| r.name).as_deref(), Some("source"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    assert!(note.contains(&format!("removed from (1): {ns}/bundle (1).")), "{note}");
    let after = api.get("bundle").await?;
    let annotation = after.metadata.annotations.unwrap_or_default()["ca-syncer.kcp-keeper.io/rotation-state"].clone();
    assert!(
        !annotation.contains(&fingerprint(&injected.cert_pem())),
        "the forged annotation is put back: {annotation}"
    );
    // A cycle is counted once it has returned, after its write and its Event: wait for the count.
    let series = "ca_syncer_reconcile_duration_seconds_count";
    let took = wait_for_metric(&agent, series, "the cycle the edit triggered", |v| v >= cycles + 1.0).await - cycles;
    assert!((1.0..=2.0).contains(&took), "put back by the cycle the edit triggered (and its own echo): {took}");
    Ok(())
}

#[tokio::test]
async fn a_rejected_source_leaves_its_targets_at_0_and_keeps_the_not_after_of_what_they_still_hold() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let ca = Ca::new("kept-ca", YEAR)?;
    let (api, agent) = start_one_bundle(&bed, &ns, &ns, "alarmed", &ca.cert_pem(), "").await?;
    let in_sync =
        format!("ca_syncer_target_in_sync{{bundle=\"alarmed\",kind=\"Secret\",namespace=\"{ns}\",name=\"bundle\"}}");
    wait_for_metric(&agent, &in_sync, "in sync", |v| v == 1.0).await;
    api.patch("source", &PatchParams::default(), &Patch::Merge(json!({"stringData": {"ca.crt": "garbage"}}))).await?;
    wait_for_metric(&agent, &in_sync, "the target out of sync reads 0", |v| v == 0.0).await;
    let text = metrics(&agent).await;
    let not_after = metric(&text, "ca_syncer_certificate_not_after_timestamp_seconds{bundle=\"alarmed\"")?;
    assert!((not_after - ca_not_after(&ca)).abs() < 2.0, "the still-published CA keeps its notAfter: {text}");
    Ok(())
}

#[tokio::test]
async fn bundle_certificates_counts_the_published_bundle_with_a_retained_ca_not_the_sources() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let (old, new) = (Ca::new("kcp-ca", YEAR)?, Ca::new("kcp-ca", YEAR)?);
    let (api, agent) = start_one_bundle(&bed, &ns, &ns, "rotating", &old.cert_pem(), "").await?;
    let series = "ca_syncer_bundle_certificates{bundle=\"rotating\"}";
    wait_for_metric(&agent, series, "one certificate", |v| v == 1.0).await;
    api.patch("source", &PatchParams::default(), &Patch::Merge(json!({"stringData": {"ca.crt": new.cert_pem()}})))
        .await?;
    wait_for_metric(&agent, series, "the new CA and the retained old one", |v| v == 2.0).await;
    // The count is set before the target is written, a CA's notAfter series once the write has landed: wait for it.
    for ca in [&old, &new] {
        let series = format!("sha256=\"{}\"", &fingerprint(&ca.cert_pem())[..16]);
        eventually(WAIT, &format!("the notAfter series with {series}"), || async {
            metrics(&agent).await.lines().any(|l| l.contains(&series)).then_some(())
        })
        .await;
    }
    Ok(())
}

#[tokio::test]
async fn a_file_source_that_is_rejected_is_reported_on_the_agents_lease() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let ca = Ca::new("file-ca", YEAR)?;
    let file = bed.subdir("ca-file")?.join("ca.crt");
    std::fs::write(&file, format!("{}{}", ca.cert_pem(), ca.key_pem()))?;
    let config = format!(
        "bundles:\n- name: filed\n  sources:\n  - file: {}\n  targets:\n  - secret: {{namespace: {ns}, name: bundle, key: ca.crt}}\n",
        file.display()
    );
    let agent = start_agent(&bed, &ns, &config)?;
    let client = bed.client();
    let event = eventually(WAIT, "a SourceRejected Event on the Lease", || async {
        events(&client, &ns).await.into_iter().find(|e| e.reason.as_deref() == Some("SourceRejected"))
    })
    .await;
    let regarding = event.regarding.clone().expect("regarding");
    assert_eq!((regarding.kind.as_deref(), regarding.name.as_deref()), (Some("Lease"), Some("kcp-keeper-ca-syncer")));
    assert!(event.note.as_deref().is_some_and(|n| n.contains("private key")), "{event:?}");
    assert_no_secret_material(&format!("{event:?}\n{}", agent.process.log()), &[&ca.key_pem()]);
    Ok(())
}

#[tokio::test]
async fn a_target_in_a_terminating_namespace_is_skipped_counted_and_not_retried_every_cycle() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let (ns, doomed) = (bed.namespace().await?, bed.namespace().await?);
    let ca = Ca::new("kcp-ca", YEAR)?;
    Api::<Secret>::namespaced(bed.client(), &ns)
        .create(&PostParams::default(), &secret("source", &[("ca.crt", &ca.cert_pem())]))
        .await?;
    // kube-apiserver alone has no namespace controller: a deleted namespace stays Terminating.
    Api::<Namespace>::all(bed.client()).delete(&doomed, &DeleteParams::default()).await?;
    let config = format!(
        "resyncInterval: 1s\nbundles:\n- name: spread\n  sources:\n  - secret: {{namespace: {ns}, name: source, key: ca.crt}}\n  targets:\n  - secret: {{namespace: {ns}, name: bundle, key: ca.crt}}\n  - secret: {{namespace: {doomed}, name: bundle, key: ca.crt}}\n"
    );
    let agent = start_agent(&bed, &ns, &config)?;
    let skipped = "ca_syncer_skipped_targets{bundle=\"spread\",reason=\"terminating\"}";
    wait_for_metric(&agent, skipped, "the terminating target counted", |v| v == 1.0).await;
    let series = "ca_syncer_last_sync_timestamp_seconds{bundle=\"spread\"}";
    let mut last = wait_for_metric(&agent, series, "the other target synced", |v| v > 0.0).await;
    for _ in 0..3 {
        last = wait_for_metric(&agent, series, "another cycle", |v| v > last).await;
    }
    let text = metrics(&agent).await;
    assert!(!text.contains(&format!("namespace=\"{doomed}\"")), "its target left the in-sync series: {text}");
    let creates: Vec<_> = testbed::audit::by_user(&bed.apiserver.audit_log, testbed::apiserver::ADMIN_USER)
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.resource == "secrets" && r.namespace.as_deref() == Some(doomed.as_str()) && r.is_write())
        .collect();
    assert_eq!(creates.len(), 1, "one refused create, then skipped: {creates:?}");
    Ok(())
}

#[tokio::test]
async fn a_write_over_an_object_changed_since_it_was_read_is_refused_not_taken_over() -> Result<()> {
    use ca_syncer::reconcile::write_checked;
    use kcp_keeper_runtime::apply::{ApplyError, Ownership};
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let api = Api::<Secret>::namespaced(bed.client(), &ns);
    let desired = |text: &str| json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bundle", "namespace": ns}, "data": {"ca.crt": base64(text)}});
    write_checked(&api, desired("ours"), Ownership::Owned { adopt: false }, None).await?;
    // The agent reads the object (its ownership check passes on this copy)...
    let read = api.get("bundle").await?;
    // ...someone else takes it over before the write...
    let takeover = json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": "someone-else"}}, "stringData": {"ca.crt": "theirs"}});
    api.patch("bundle", &PatchParams::default(), &Patch::Merge(takeover)).await?;
    // ...and the write, made over what was read, is refused.
    let refused = write_checked(&api, desired("ours again"), Ownership::Owned { adopt: false }, Some(&read)).await;
    assert!(matches!(refused, Err(ApplyError::Conflict { .. })), "{refused:?}");
    assert_eq!(key(&bed.client(), &ns, "bundle", "ca.crt").await.as_deref(), Some("theirs"), "not taken over");
    // The next cycle reads the change and sees a foreign object.
    let fresh = api.get("bundle").await?;
    let next = write_checked(&api, desired("ours again"), Ownership::Owned { adopt: false }, Some(&fresh)).await;
    assert!(matches!(next, Err(ApplyError::Foreign { .. })), "{next:?}");
    Ok(())
}

fn base64(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

#[test]
fn a_file_source_holding_the_machines_ca_bundle_with_certifi_style_comments_is_rendered_whole() -> Result<()> {
    let system = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt")?;
    let count = system.matches("-----BEGIN CERTIFICATE-----").count();
    assert!(count > 100, "the machine's CA bundle: {count}");
    // certifi's cacert.pem: a comment block before each certificate, blank lines between.
    let commented = system.replace(
        "-----BEGIN CERTIFICATE-----",
        "\n# Issuer: CN=Example O=Example\n# Subject: CN=Example O=Example\n# Label: \"Example\"\n# SHA256 Fingerprint: 00:11\n-----BEGIN CERTIFICATE-----",
    );
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("cacert.pem");
    std::fs::write(&file, commented)?;
    let config_path = dir.path().join("config.yaml");
    std::fs::write(
        &config_path,
        format!(
            "bundles:\n- name: distro\n  sources:\n  - file: {}\n  targets:\n  - secret: {{namespace: ns, name: bundle, key: ca.crt}}\n",
            file.display()
        ),
    )?;
    let (code, stdout, stderr) = testbed::agent_process::run_to_completion(
        Path::new(BINARY),
        &["render", "--config", &config_path.display().to_string()],
    )?;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let rendered: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("# bundle distro: ")?.strip_suffix(" certificates")?.parse().ok())
        .expect(&stdout);
    // Duplicates in the system bundle (if any) collapse; nothing is lost otherwise.
    assert!(rendered > 100 && rendered <= count, "{rendered} of {count}");
    Ok(())
}

#[tokio::test]
async fn empty_means_public_roots_writes_the_empty_key_only_where_the_public_roots_verify_the_endpoint() -> Result<()> {
    // The test names the "public roots" (a test root) in place of the compiled-in ones: one endpoint is served
    // under that root, the other under a private CA.
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let (public, private) = (Ca::new("test-public-root", YEAR)?, Ca::new("private", YEAR)?);
    let roots = bed.subdir("public-roots")?.join("roots.pem");
    std::fs::write(&roots, public.cert_pem())?;
    let trusted = TlsServer::start(&public.issue_server(&["localhost"], &[], YEAR)?, &[]).await?;
    let untrusted = TlsServer::start(&private.issue_server(&["localhost"], &[], YEAR)?, &[]).await?;
    let api = Api::<Secret>::namespaced(bed.client(), &ns);
    api.create(&PostParams::default(), &secret("frontproxy-ca", &[("ca.crt", "")])).await?;
    let bundle = |name: &str, url: String| {
        format!(
            "- name: {name}\n  sources:\n  - secret: {{namespace: {ns}, name: frontproxy-ca, key: ca.crt}}\n  targets:\n  - secret: {{namespace: {ns}, name: {name}, key: ca.crt}}\n  emptyMeansPublicRoots: true\n  liveCheck: {{url: \"{url}\", serverName: localhost}}\n"
        )
    };
    let config = format!("bundles:\n{}{}", bundle("verified", trusted.url()), bundle("unverified", untrusted.url()));
    let path = write_config(&bed, &config)?;
    let env = [("CA_SYNCER_PUBLIC_ROOTS_FILE", roots.to_str().expect("utf-8 path"))];
    let _agent = agent(&bed, &path, &ns).envs(&env).spawn()?;
    let client = bed.client();
    let written = eventually(WAIT, "the verified bundle's empty key", || async {
        Api::<Secret>::namespaced(client.clone(), &ns).get_opt("verified").await.ok().flatten()
    })
    .await;
    let data = written.data.unwrap_or_default();
    assert_eq!(data.get("ca.crt").map(|v| v.0.len()), Some(0), "the key is written, and empty");
    // One Event on the bundles' shared source, naming the bundle that was not published.
    eventually(WAIT, "a LiveCheckFailed Event for the other", || async {
        events(&client, &ns).await.into_iter().find(|e| {
            e.reason.as_deref() == Some("LiveCheckFailed")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("frontproxy-ca")
                && e.note.as_deref().is_some_and(|n| n.starts_with("bundle unverified not published"))
        })
    })
    .await;
    assert!(api.get_opt("unverified").await?.is_none(), "no empty key where the public roots do not verify");
    Ok(())
}
