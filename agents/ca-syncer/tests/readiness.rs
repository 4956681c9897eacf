//! Readiness that means something, on the ca-syncer binary: it follows the apiserver's reachability, and a
//! failing item is reported by metrics, not by taking the leader out of service.

mod common;

use std::time::Duration;

use anyhow::Result;
use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use testbed::ControlPlane;
use testbed::agent_process::AgentProcess;
use testbed::certs::Ca;

async fn readyz(agent: &AgentProcess) -> u16 {
    testbed::http::get(&format!("{}/readyz", agent.admin_url)).await.map(|(code, _, _)| code).unwrap_or(0)
}

#[tokio::test]
async fn a_replica_that_cannot_reach_the_apiserver_is_not_ready_until_it_answers_again() -> Result<()> {
    let mut bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let ca = Ca::new("reach-ca", YEAR)?;
    Api::<Secret>::namespaced(bed.client(), &ns)
        .create(&PostParams::default(), &secret("source", &[("ca.crt", &ca.cert_pem())]))
        .await?;
    let path = write_config(
        &bed,
        &format!(
            "bundles:\n- name: reach\n  sources:\n  - secret: {{namespace: {ns}, name: source, key: ca.crt}}\n  targets:\n  - secret: {{namespace: {ns}, name: bundle, key: ca.crt}}\n"
        ),
    )?;
    // Without leader election: a leader that cannot renew exits, which is proven elsewhere; here the process
    // must stay up and say it is not ready.
    let env = [("KCP_KEEPER_LEADER_ELECTION", "false")];
    let mut agent = agent(&bed, &path, &ns).envs(&env).spawn()?;
    agent.wait_ready(WAIT).await?;

    bed.apiserver.process.kill();
    testbed::eventually(WAIT, "/readyz 503 while the apiserver is gone", || async {
        (readyz(&agent).await == 503).then_some(())
    })
    .await;
    assert_eq!(testbed::http::get(&format!("{}/livez", agent.admin_url)).await?.0, 200, "alive all the same");

    bed.apiserver.restart().await?;
    testbed::eventually(Duration::from_secs(60), "/readyz 200 once the apiserver answers", || async {
        (readyz(&agent).await == 200).then_some(())
    })
    .await;
    Ok(())
}

#[tokio::test]
async fn one_failing_bundle_is_counted_by_reason_and_the_leader_is_ready_with_the_others_synced() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let ca = Ca::new("good-ca", YEAR)?;
    Api::<Secret>::namespaced(bed.client(), &ns)
        .create(&PostParams::default(), &secret("source", &[("ca.crt", &ca.cert_pem())]))
        .await?;
    let config = format!(
        "bundles:\n- name: good\n  sources:\n  - secret: {{namespace: {ns}, name: source, key: ca.crt}}\n  targets:\n  - secret: {{namespace: {ns}, name: good, key: ca.crt}}\n- name: broken\n  sources:\n  - secret: {{namespace: {ns}, name: missing, key: ca.crt}}\n  targets:\n  - secret: {{namespace: {ns}, name: broken, key: ca.crt}}\n"
    );
    let mut agent = start_agent(&bed, &ns, &config)?;
    agent.wait_ready(WAIT).await?;
    assert!(key(&bed.client(), &ns, "good", "ca.crt").await.is_some(), "the good bundle is published");
    assert!(key(&bed.client(), &ns, "broken", "ca.crt").await.is_none(), "the broken one is not");
    let text = metrics(&agent).await;
    assert!(metric(&text, "ca_syncer_reconcile_errors_total{reason=\"source_unusable\"}")? >= 1.0, "{text}");
    assert_eq!(
        metric(&text, "ca_syncer_reconcile_errors_total{reason=\"live_check_failed\"}")?,
        0.0,
        "every reason is exported"
    );
    assert!(metric(&text, "ca_syncer_reconcile_duration_seconds_count")? >= 2.0, "{text}");
    assert_eq!(metric(&text, "ca_syncer_leader")?, 1.0);
    // Backoff: retried without a trigger, with growing delays (1s, 2s, 4s, 8s, each plus up to as much jitter).
    // The first failures may come faster (the good target's own write wakes every bundle once); once settled,
    // the 3rd to the 5th failure take at least 4s + 8s, and far less than the resync would.
    let series = "ca_syncer_reconcile_errors_total{reason=\"source_unusable\"}";
    wait_for_metric(&agent, series, "a 3rd failure", |v| v >= 3.0).await;
    let third = tokio::time::Instant::now();
    testbed::eventually(Duration::from_secs(40), "a 5th failure", || async {
        metric(&metrics(&agent).await, series).ok().filter(|v| *v >= 5.0)
    })
    .await;
    let took = third.elapsed();
    assert!(took >= Duration::from_secs(11) && took <= Duration::from_secs(30), "3rd to 5th failure: {took:?}");
    Ok(())
}
