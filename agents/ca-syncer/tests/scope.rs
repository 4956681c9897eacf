//! ca-syncer with exactly the RBAC it documents (`ca-syncer rbac`), as a real ServiceAccount: it does its whole
//! job, it cannot read what the configuration does not name, and the apiserver's audit log shows it never
//! tried, and that an idle agent writes nothing.

mod common;

use std::path::Path;

use anyhow::Result;
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testbed::ControlPlane;
use testbed::agent_process::run_to_completion;
use testbed::certs::Ca;

/// A status code from a client call: 200 for success, the apiserver's code for its refusals.
fn code<T>(result: kube::Result<T>) -> u16 {
    match result {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(e) => panic!("not an apiserver answer: {e}"),
    }
}

struct Setup {
    bed: ControlPlane,
    /// Namespaces: the agent's own, sources, the named target, one the configuration never names.
    agent_ns: String,
    src: String,
    dst: String,
    elsewhere: String,
    config: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
    user: String,
}

/// A bed with sources, a named target, a selector target, secrets the agent must never see, the RBAC that
/// `ca-syncer rbac` renders for the configuration, and a ServiceAccount token bound to it.
async fn setup() -> Result<Setup> {
    let bed = ControlPlane::start().await?;
    let (agent_ns, src, dst, elsewhere) =
        (bed.namespace().await?, bed.namespace().await?, bed.namespace().await?, bed.namespace().await?);
    let root = Ca::new("kcp-root", YEAR)?;
    let server_ca = root.intermediate("root-server-ca", YEAR)?;
    let sources = Api::<Secret>::namespaced(bed.client(), &src);
    let source = secret(
        "root-server-ca",
        &[("tls.crt", &server_ca.cert_pem()), ("ca.crt", &root.cert_pem()), ("tls.key", &server_ca.key_pem())],
    );
    sources.create(&PostParams::default(), &source).await?;
    sources.create(&PostParams::default(), &secret("unlisted", &[("token", "not for ca-syncer")])).await?;
    Api::<Secret>::namespaced(bed.client(), &elsewhere)
        .create(&PostParams::default(), &secret("private", &[("tls.key", "not for ca-syncer")]))
        .await?;
    let config = write_config(
        &bed,
        &format!(
            "resyncInterval: 1s\nbundles:\n- name: kcp\n  sources:\n  - secret: {{namespace: {src}, name: root-server-ca, key: tls.crt}}\n  - secret: {{namespace: {src}, name: root-server-ca, key: ca.crt}}\n  targets:\n  - secret: {{namespace: {dst}, name: kcp-ca, key: ca.crt}}\n  - configMap: {{name: kcp-ca, key: ca.crt, namespaceSelector: {{matchLabels: {{trust-kcp: \"{agent_ns}\"}}}}}}\n"
        ),
    )?;
    let (code, rbac, stderr) = run_to_completion(
        Path::new(BINARY),
        &[
            "rbac",
            "--config",
            &config.display().to_string(),
            "--namespace",
            &agent_ns,
            "--service-account",
            "ca-syncer",
        ],
    )?;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(apply_yaml(&bed.client(), &rbac).await? >= 4, "{rbac}");
    let (kubeconfig, user) = bed.service_account_kubeconfig(&agent_ns, "ca-syncer").await?;
    Ok(Setup { bed, agent_ns, src, dst, elsewhere, config, kubeconfig, user })
}

async fn label(client: &kube::Client, ns: &str, value: &str) -> Result<()> {
    let patch = json!({"metadata": {"labels": {"trust-kcp": value}}});
    Api::<Namespace>::all(client.clone()).patch(ns, &PatchParams::default(), &Patch::Merge(patch)).await?;
    Ok(())
}

#[tokio::test]
async fn with_only_its_rendered_roles_it_does_its_whole_job_and_its_token_reads_nothing_else() -> Result<()> {
    let s = setup().await?;
    let selected = s.bed.namespace().await?;
    label(&s.bed.client(), &selected, &s.agent_ns).await?;
    let mut agent = agent(&s.bed, &s.config, &s.agent_ns).kubeconfig(&s.kubeconfig).spawn()?;
    agent.wait_ready(WAIT).await?;

    // The whole job: the named target and the selected namespace's ConfigMap, created from nothing.
    let client = s.bed.client();
    let bundle = key(&client, &s.dst, "kcp-ca", "ca.crt").await.expect("the named target is written");
    assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), 2);
    let cms = Api::<ConfigMap>::namespaced(client.clone(), &selected);
    let cm =
        testbed::eventually(WAIT, "the selector target", || async { cms.get_opt("kcp-ca").await.ok().flatten() }).await;
    assert_eq!(cm.data.unwrap()["ca.crt"], bundle);
    // A namespace labelled later gets its copy: the Namespace watch follows the selector.
    let later = s.bed.namespace().await?;
    label(&client, &later, &s.agent_ns).await?;
    let later_cms = Api::<ConfigMap>::namespaced(client.clone(), &later);
    testbed::eventually(WAIT, "a namespace labelled later", || async {
        later_cms.get_opt("kcp-ca").await.ok().flatten()
    })
    .await;

    // The bundle's rotation record, created and kept in the agent's own namespace with the documented RBAC.
    let record =
        Api::<ConfigMap>::namespaced(client.clone(), &s.agent_ns).get(&ca_syncer::state::object_name("kcp")).await?;
    assert!(record.data.is_some_and(|d| d.contains_key(ca_syncer::state::STATE_KEY)), "the record is written");

    // The audit log, before the test uses the token itself: every request the agent sent stayed inside its scope, and none was refused.
    let requests = testbed::audit::by_user(&s.bed.apiserver.audit_log, &s.user)?;
    assert!(requests.iter().any(|r| r.resource == "secrets" && r.verb == "watch"), "the agent's watches are logged");
    for r in &requests {
        let allowed = matches!(r.resource.as_str(), "secrets" | "configmaps" | "namespaces" | "events" | "leases" | "");
        assert!(allowed, "outside its scope: {r:?}");
        if r.resource == "secrets" && (r.verb == "list" || r.verb == "watch") && r.code == Some(200) {
            assert!(r.uri.contains("fieldSelector=metadata.name"), "a Secret list or watch without a name: {r:?}");
        }
    }
    let refused: Vec<_> = requests.iter().filter(|r| r.code == Some(403)).collect();
    assert!(refused.is_empty(), "the agent itself was refused: {refused:?}");
    // The same token, by hand: what the configuration does not name is forbidden.
    let token = testbed::apiserver::client_from_file(&s.kubeconfig).await?;
    let secrets = |ns: &str| Api::<Secret>::namespaced(token.clone(), ns);
    assert_eq!(code(secrets(&s.src).get("root-server-ca").await), 200, "the token works for what is named");
    assert_eq!(code(secrets(&s.elsewhere).list(&ListParams::default()).await), 403, "list in an unnamed namespace");
    assert_eq!(code(secrets(&s.elsewhere).get("private").await), 403, "get in an unnamed namespace");
    assert_eq!(code(secrets(&s.src).get("unlisted").await), 403, "get of an unnamed Secret");
    assert_eq!(code(secrets(&s.src).list(&ListParams::default()).await), 403, "list without a name");
    assert_eq!(code(Api::<Secret>::all(token.clone()).list(&ListParams::default()).await), 403, "cluster-wide list");
    assert_eq!(
        code(Api::<Secret>::all(token.clone()).list(&ListParams::default().fields("metadata.name=private")).await),
        403,
        "cluster-wide list of a name that is not a target"
    );

    assert!(agent.terminate(std::time::Duration::from_secs(10)).is_some_and(|st| st.success()));
    Ok(())
}

#[tokio::test]
async fn an_idle_agent_keeps_reconciling_and_writes_nothing_but_its_lease() -> Result<()> {
    let s = setup().await?;
    let agent = agent(&s.bed, &s.config, &s.agent_ns).kubeconfig(&s.kubeconfig).spawn()?;
    let series = "ca_syncer_last_sync_timestamp_seconds{bundle=\"kcp\"}";
    let first = wait_for_metric(&agent, series, "a first sync", |v| v > 0.0).await;
    let writes = |requests: &[testbed::audit::Request]| -> Vec<testbed::audit::Request> {
        requests.iter().filter(|r| r.is_write() && r.resource != "leases").cloned().collect()
    };
    // Settle: the first sync wrote the target (and its Event); from here on nothing changes.
    let settled = wait_for_metric(&agent, series, "a sync after the first", |v| v > first).await;
    // The first sync's Event is sent by a task of its own after the target's write: the baseline waits for it in
    // the audit log, or an Event landing after a later cycle's start would count as an idle write.
    let before = testbed::eventually(WAIT, "the first sync's write and its Event in the audit log", || async {
        let written = writes(&testbed::audit::by_user(&s.bed.apiserver.audit_log, &s.user).ok()?);
        let target = written.iter().any(|r| r.resource == "secrets");
        (target && written.iter().any(|r| r.resource == "events")).then_some(written)
    })
    .await;

    // Three more cycles (resyncInterval: 1s), proven by the timestamp moving.
    let mut last = settled;
    for _ in 0..3 {
        last = wait_for_metric(&agent, series, "another idle cycle", |v| v > last).await;
    }
    let after = writes(&testbed::audit::by_user(&s.bed.apiserver.audit_log, &s.user)?);
    assert_eq!(after, before, "idle cycles wrote something");
    let text = metrics(&agent).await;
    assert!(metric(&text, "ca_syncer_reconcile_duration_seconds_count")? >= 4.0, "{text}");
    assert_eq!(metric(&text, "ca_syncer_reconcile_errors_total{reason=\"target_write_failed\"}")?, 0.0);
    let _ = (&s.src, &s.dst, &s.elsewhere);
    Ok(())
}

#[tokio::test]
async fn a_follower_is_ready_once_its_caches_sync_and_never_writes() -> Result<()> {
    let s = setup().await?;
    // The leader runs as the admin, so every request of the ServiceAccount is the follower's.
    let mut leader = agent(&s.bed, &s.config, &s.agent_ns).identity("leader").spawn()?;
    leader.wait_ready(WAIT).await?;
    let mut follower = agent(&s.bed, &s.config, &s.agent_ns).identity("follower").kubeconfig(&s.kubeconfig).spawn()?;
    follower.wait_ready(WAIT).await?;
    assert_eq!(metric(&metrics(&follower).await, "ca_syncer_leader")?, 0.0, "the follower does not lead");
    assert_eq!(metric(&metrics(&leader).await, "ca_syncer_leader")?, 1.0);

    // The leader keeps syncing meanwhile (its timestamp moves twice), the follower only watches.
    let series = "ca_syncer_last_sync_timestamp_seconds{bundle=\"kcp\"}";
    let mut last = wait_for_metric(&leader, series, "a leader sync", |v| v > 0.0).await;
    for _ in 0..2 {
        last = wait_for_metric(&leader, series, "another leader sync", |v| v > last).await;
    }
    let requests = testbed::audit::by_user(&s.bed.apiserver.audit_log, &s.user)?;
    assert!(requests.iter().any(|r| r.resource == "secrets" && r.verb == "watch"), "the follower's caches are warm");
    assert!(requests.iter().any(|r| r.resource == "leases" && r.verb == "get"), "the follower reads the Lease");
    let writes: Vec<_> = requests.iter().filter(|r| r.is_write()).collect();
    assert!(writes.is_empty(), "a follower wrote: {writes:?}");
    let text = metrics(&follower).await;
    assert_eq!(metric(&text, "ca_syncer_reconcile_duration_seconds_count")?, 0.0, "a follower never reconciles");
    Ok(())
}

#[tokio::test]
async fn a_replica_whose_watch_cannot_list_is_not_ready_until_its_initial_list_arrives() -> Result<()> {
    use k8s_openapi::api::rbac::v1::Role;
    use kube::api::DeleteParams;
    let s = setup().await?;
    // Take away the source namespace's Role: the watch of the source cannot list.
    let roles = Api::<Role>::namespaced(s.bed.client(), &s.src);
    let taken = roles.get(ca_syncer::scope::rbac::ROLE_NAME).await?;
    roles.delete(ca_syncer::scope::rbac::ROLE_NAME, &DeleteParams::default()).await?;
    let agent = agent(&s.bed, &s.config, &s.agent_ns).kubeconfig(&s.kubeconfig).spawn()?;
    let readyz = || async {
        testbed::http::get(&format!("{}/readyz", agent.admin_url)).await.ok().map(|(code, _, body)| (code, body))
    };
    // It leads (its Lease works) and is alive, but says why it is not ready.
    wait_for_metric(&agent, "ca_syncer_leader", "leading", |v| v == 1.0).await;
    let denied = testbed::eventually(WAIT, "the watch refused", || async {
        let requests = testbed::audit::by_user(&s.bed.apiserver.audit_log, &s.user).ok()?;
        requests.into_iter().find(|r| r.resource == "secrets" && r.code == Some(403))
    })
    .await;
    assert_eq!(denied.namespace.as_deref(), Some(s.src.as_str()), "{denied:?}");
    assert_eq!(readyz().await, Some((503, "watches have not delivered their initial list".to_string())));

    // Give the Role back: the watch lists, and the replica becomes ready and does its job.
    let mut back = taken.clone();
    back.metadata = kube::api::ObjectMeta {
        name: taken.metadata.name.clone(),
        namespace: taken.metadata.namespace.clone(),
        ..Default::default()
    };
    roles.create(&PostParams::default(), &back).await?;
    testbed::eventually(std::time::Duration::from_secs(90), "ready once the list arrives", || async {
        readyz().await.filter(|(code, _)| *code == 200)
    })
    .await;
    assert!(key(&s.bed.client(), &s.dst, "kcp-ca", "ca.crt").await.is_some());
    Ok(())
}
