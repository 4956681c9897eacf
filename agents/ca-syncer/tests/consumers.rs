//! Read-once consumers of a bundle, against a real apiserver: the Deployments a target names are rolled (one
//! pod-template annotation, so `metadata.generation` counts the rolls: no controller runs in the bed) once per
//! real change of what the target holds, a consumer that is missing is reported and rolled once it exists, and a
//! restart window defers a roll but never past the deadline of the bundle the consumer holds.

mod common;

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use ca_syncer::certs::{EmptyPolicy, parse_certificates};
use ca_syncer::consumers::{content_hash, keys};
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use kcp_keeper_runtime::consumer_restart::{Kind, held_until, restart_patch, restarted_for};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testbed::agent_process::run_to_completion;
use testbed::certs::Ca;
use testbed::{ControlPlane, eventually};
use time::OffsetDateTime;

const BUNDLE: &str = "kcp";

fn workload(name: &str) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "hub", "image": "hub"}]}},
        },
    }))?)
}

/// What the target ConfigMap `kcp-ca` holds now, and its hash.
async fn target(client: &kube::Client, ns: &str) -> Option<(String, String)> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns).get_opt("kcp-ca").await.ok()??;
    let pem = cm.data?.get("ca.crt")?.clone();
    let hash = content_hash(&pem);
    Some((pem, hash))
}

fn series(name: &str, ns: &str, consumer: &str) -> String {
    format!("ca_syncer_{name}{{bundle=\"{BUNDLE}\",namespace=\"{ns}\",kind=\"Deployment\",name=\"{consumer}\"}}")
}

async fn event_notes(client: &kube::Client, ns: &str, reason: &str) -> Vec<String> {
    let events = Api::<Event>::namespaced(client.clone(), ns).list(&ListParams::default()).await;
    let items = events.map(|l| l.items).unwrap_or_default();
    items.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).filter_map(|e| e.note).collect()
}

/// The config: Secret `source` in `src` into ConfigMap `kcp-ca` in `dst`, which names `consumers`.
fn config(src: &str, dst: &str, consumers: &str) -> String {
    config_with(src, dst, consumers, "")
}

/// [`config`] with more bundle settings (`extra`: `  key: value\n` lines).
fn config_with(src: &str, dst: &str, consumers: &str, extra: &str) -> String {
    format!(
        "resyncInterval: 1s\nbundles:\n- name: {BUNDLE}\n{extra}  sources:\n  - secret: {{namespace: {src}, name: source, key: ca.crt}}\n  targets:\n  - configMap: {{namespace: {dst}, name: kcp-ca, key: ca.crt, {consumers}}}\n"
    )
}

#[tokio::test]
async fn a_real_ca_change_rolls_the_named_deployment_once_and_a_missing_one_once_it_exists_with_the_rendered_roles()
-> Result<()> {
    let bed = ControlPlane::start().await?;
    let (src, dst) = (bed.namespace().await?, bed.namespace().await?);
    let client = bed.client();
    let sources = Api::<Secret>::namespaced(client.clone(), &src);
    let old = Ca::new("kcp-ca-old", YEAR)?;
    sources.create(&PostParams::default(), &secret("source", &[("ca.crt", &old.cert_pem())])).await?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), &dst);
    deployments.create(&PostParams::default(), &workload("hub")?).await?;
    // With only the Roles `ca-syncer rbac` renders: get/patch on exactly `hub` and `late` is enough.
    let agent_ns = bed.namespace().await?;
    let path = write_config(&bed, &config(&src, &dst, "restartDeployments: [hub, late]"))?;
    let args =
        ["rbac", "--config", &path.display().to_string(), "--namespace", &agent_ns, "--service-account", "ca-syncer"];
    let (code, rbac, stderr) = run_to_completion(Path::new(BINARY), &args)?;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(rbac.contains("deployments"), "{rbac}");
    apply_yaml(&client, &rbac).await?;
    let (kubeconfig, _) = bed.service_account_kubeconfig(&agent_ns, "ca-syncer").await?;
    let mut agent = agent(&bed, &path, &agent_ns).kubeconfig(&kubeconfig).spawn()?;
    agent.wait_ready(WAIT).await?;
    let keys = keys(BUNDLE);

    // First publication: `hub` was never rolled by the agent, so it is rolled for what the target holds.
    let (_, first) = eventually(WAIT, "the first publication", || target(&client, &dst)).await;
    let rolled_for = |name: &'static str, hash: String| {
        let (deployments, keys) = (deployments.clone(), keys.clone());
        async move {
            let d = deployments.get_opt(name).await.ok()??;
            (restarted_for(&d, &keys)? == hash).then_some(d)
        }
    };
    let hub = eventually(WAIT, "hub rolled for the first bundle", || rolled_for("hub", first.clone())).await;
    assert_eq!(hub.metadata.generation, Some(2), "one roll since it was created");

    // `late` does not exist: reported (Event on the target, pending metric), and the bundle is retried.
    let pending = series("consumer_restart_pending", &dst, "late");
    wait_for_metric(&agent, &pending, "the missing consumer pending", |v| v == 1.0).await;
    eventually(WAIT, "a ConsumerMissing Event on the target", || async {
        let notes = event_notes(&client, &dst, "ConsumerMissing").await;
        notes.iter().any(|n| n.contains("late")).then_some(())
    })
    .await;
    let errors = "ca_syncer_reconcile_errors_total{reason=\"consumer_missing\"}";
    wait_for_metric(&agent, errors, "the bundle failing for its missing consumer", |v| v >= 1.0).await;

    // A real CA change: the target now holds the new CA and retains the old one; `hub` is rolled once more.
    let new = Ca::new("kcp-ca-new", YEAR)?;
    sources.replace("source", &PostParams::default(), &secret("source", &[("ca.crt", &new.cert_pem())])).await?;
    let (pem, second) = eventually(WAIT, "the new CA published", || async {
        target(&client, &dst).await.filter(|(_, hash)| *hash != first)
    })
    .await;
    assert!(pem.contains(new.cert_pem().trim()) && pem.contains(old.cert_pem().trim()), "new CA, old retained");
    let hub = eventually(WAIT, "hub rolled for the new bundle", || rolled_for("hub", second.clone())).await;
    assert_eq!(hub.metadata.generation, Some(3), "exactly one roll for the change");
    // It records until when the bundle it now holds is good: the earliest notAfter in it (the retained CA's).
    let earliest = parse_certificates(pem.as_bytes(), EmptyPolicy::Reject)?.iter().map(|c| c.not_after()).min();
    let recorded = held_until(&hub, &keys).map(|t| t.unix_timestamp());
    assert_eq!(recorded, earliest.map(|t| t.unix_timestamp()), "held-until is the bundle's earliest notAfter");

    // The consumer created later is rolled for what the target holds now, and nothing is pending any more.
    deployments.create(&PostParams::default(), &workload("late")?).await?;
    eventually(WAIT, "late rolled once it exists", || rolled_for("late", second.clone())).await;
    wait_for_metric(&agent, &pending, "nothing pending", |v| v == 0.0).await;

    // Passes that change nothing roll nothing: wait for several more reconciles, then look again.
    let passes = "ca_syncer_reconcile_duration_seconds_count";
    let now = wait_for_metric(&agent, passes, "a pass", |v| v >= 1.0).await;
    wait_for_metric(&agent, passes, "three more passes", |v| v >= now + 3.0).await;
    assert_eq!(deployments.get("hub").await?.metadata.generation, Some(3), "no roll without a change");
    assert_eq!(deployments.get("late").await?.metadata.generation, Some(2), "one roll for late");
    assert_eq!(target(&client, &dst).await.map(|(_, h)| h), Some(second));
    Ok(())
}

/// A Deployment as the agent's earlier roll for content `hash` would have left it, holding a bundle good until
/// `held`.
async fn rolled_earlier(api: &Api<Deployment>, ns: &str, name: &str, held: OffsetDateTime) -> Result<()> {
    api.create(&PostParams::default(), &workload(name)?).await?;
    let patch = restart_patch(Kind::Deployment, ns, name, &keys(BUNDLE), "0000", held);
    api.patch(name, &PatchParams::apply("kcp-keeper"), &Patch::Apply(&patch)).await?;
    Ok(())
}

#[tokio::test]
async fn a_roll_outside_its_window_waits_but_never_past_the_held_bundles_deadline_minus_the_margin() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let (src, dst) = (bed.namespace().await?, bed.namespace().await?);
    let client = bed.client();
    let ca = Ca::new("kcp-ca", YEAR)?;
    Api::<Secret>::namespaced(client.clone(), &src)
        .create(&PostParams::default(), &secret("source", &[("ca.crt", &ca.cert_pem())]))
        .await?;
    // Both hold an older bundle. `patient`'s is good for 30 more days: it waits for the window, which opens on
    // 29 February only (closed for this test). `due`'s stops being good in an hour and 20 s: with a margin of
    // an hour, it is rolled in 20 s, window or not.
    let deployments = Api::<Deployment>::namespaced(client.clone(), &dst);
    let now = OffsetDateTime::now_utc();
    rolled_earlier(&deployments, &dst, "patient", now + time::Duration::days(30)).await?;
    rolled_earlier(&deployments, &dst, "due", now + time::Duration::seconds(3600 + 20)).await?;
    let consumers =
        "restartDeployments: [patient, due], restartWindow: {cron: \"0 0 29 2 *\", duration: 1h, margin: 1h}";
    let mut agent = start_agent(&bed, &src, &config(&src, &dst, consumers))?;
    agent.wait_ready(WAIT).await?;
    let (_, hash) = eventually(WAIT, "the first publication", || target(&client, &dst)).await;

    let deferred = series("consumer_restart_deferred_until_timestamp_seconds", &dst, "patient");
    let until = wait_for_metric(&agent, &deferred, "patient's roll deferred", |v| v > 0.0).await;
    let deadline = (now + time::Duration::days(30) - time::Duration::hours(1)).unix_timestamp() as f64;
    assert!(until <= deadline, "deferred no later than its deadline");
    eventually(WAIT, "a RestartDeferred Event", || async {
        (!event_notes(&client, &dst, "RestartDeferred").await.is_empty()).then_some(())
    })
    .await;
    let keys = keys(BUNDLE);
    eventually(Duration::from_secs(90), "due rolled at its deadline", || async {
        let d = deployments.get_opt("due").await.ok()??;
        (restarted_for(&d, &keys)? == hash).then_some(())
    })
    .await;
    let patient = deployments.get("patient").await?;
    assert_eq!(restarted_for(&patient, &keys).as_deref(), Some("0000"), "not rolled outside its window");
    assert_eq!(patient.metadata.generation, Some(2), "its pod template untouched since it was set up");
    // The agent records a consumer's series after its roll has landed, so the test, which saw the roll through
    // its own read, waits for the record rather than scraping once (a CI run scraped between the two).
    let due_deferred = series("consumer_restart_deferred_until_timestamp_seconds", &dst, "due");
    wait_for_metric(&agent, &due_deferred, "due no longer deferred once rolled", |v| v == 0.0).await;
    let text = metrics(&agent).await;
    assert_eq!(metric(&text, &series("consumer_restart_pending", &dst, "patient"))?, 0.0, "deferred is not pending");
    assert!(metric(&text, &deferred)? > 0.0, "patient still deferred after due's roll");
    Ok(())
}

#[tokio::test]
async fn a_roll_deferred_by_its_window_still_happens_before_the_retained_ca_leaves_the_rotation_overlap() -> Result<()>
{
    let bed = ControlPlane::start().await?;
    let (src, dst) = (bed.namespace().await?, bed.namespace().await?);
    let client = bed.client();
    let sources = Api::<Secret>::namespaced(client.clone(), &src);
    let old = Ca::new("kcp-ca-old", YEAR)?;
    sources.create(&PostParams::default(), &secret("source", &[("ca.crt", &old.cert_pem())])).await?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), &dst);
    deployments.create(&PostParams::default(), &workload("hub")?).await?;
    // The window is closed for this test; the old CA is retained for an hour and 40 s after it leaves the
    // sources: with a margin of an hour, `hub` (holding only the old CA) must be rolled within 40 s of the change,
    // although the bundle it holds is good for a year.
    let consumers = "restartDeployments: [hub], restartWindow: {cron: \"0 0 29 2 *\", duration: 1h, margin: 1h}";
    let mut agent = start_agent(&bed, &src, &config_with(&src, &dst, consumers, "  rotationGrace: 3640s\n"))?;
    agent.wait_ready(WAIT).await?;
    let keys = keys(BUNDLE);
    let rolled_for = |hash: String| {
        let (deployments, keys) = (deployments.clone(), keys.clone());
        async move {
            let d = deployments.get_opt("hub").await.ok()??;
            (restarted_for(&d, &keys)? == hash).then_some(d)
        }
    };
    // Never rolled by the agent: rolled at once, window or not.
    let (_, first) = eventually(WAIT, "the first publication", || target(&client, &dst)).await;
    eventually(WAIT, "hub rolled for the first bundle", || rolled_for(first.clone())).await;

    let new = Ca::new("kcp-ca-new", YEAR)?;
    sources.replace("source", &PostParams::default(), &secret("source", &[("ca.crt", &new.cert_pem())])).await?;
    let (_, second) = eventually(WAIT, "the new CA published beside the retained one", || async {
        target(&client, &dst).await.filter(|(pem, _)| pem.matches("BEGIN CERTIFICATE").count() == 2)
    })
    .await;
    let deferred = series("consumer_restart_deferred_until_timestamp_seconds", &dst, "hub");
    let until = wait_for_metric(&agent, &deferred, "the roll deferred", |v| v > 0.0).await;
    let year_away = (OffsetDateTime::now_utc() + time::Duration::days(300)).unix_timestamp() as f64;
    assert!(until < year_away, "deferred to the overlap's end, not to the held bundle's notAfter");
    let hub =
        eventually(Duration::from_secs(120), "hub rolled before the overlap ends", || rolled_for(second.clone())).await;
    assert_eq!(hub.metadata.generation, Some(3), "one roll per bundle");
    Ok(())
}
