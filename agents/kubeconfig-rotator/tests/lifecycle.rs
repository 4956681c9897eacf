//! The binary as a process, without kcp: the lifecycle every agent has (ready, holding its Lease; SIGTERM exits 0
//! and releases it; a lost lease exits non-zero), a missing source that is reported and not fatal, and the
//! command line refusing what it cannot do with a clear message.

mod common;

use std::path::{Path, PathBuf};

use anyhow::Result;
use common::BINARY;
use testbed::agent_process::{self, AgentUnderTest, run_to_completion};

/// A configuration that becomes ready on any fresh bed: its source Secret does not exist, which is counted and
/// reported, not fatal (readiness is about the agent, not about one kubeconfig).
fn missing_source_config(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("config.yaml");
    std::fs::write(
        &path,
        "kubeconfigs:\n- name: absent\n  source: {secret: {namespace: default, name: absent, key: kubeconfig}}\n  expect: {username: kcp-admin}\n  targets:\n  - {namespace: default, name: absent-copy}\n",
    )?;
    Ok(path)
}

#[tokio::test]
async fn run_becomes_ready_holds_its_lease_and_on_sigterm_exits_0_releasing_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    agent_process::check_lifecycle(
        Path::new(BINARY),
        &missing_source_config(dir.path())?,
        "kcp-keeper-kubeconfig-rotator",
    )
    .await
}

#[tokio::test]
async fn a_leader_that_cannot_renew_its_lease_exits_non_zero_to_rejoin() -> Result<()> {
    let dir = tempfile::tempdir()?;
    agent_process::check_lost_lease_exits(Path::new(BINARY), &missing_source_config(dir.path())?).await
}

#[tokio::test]
async fn a_missing_source_is_counted_with_its_series_present_and_nothing_is_written() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let agent = AgentUnderTest::new(&bed, BINARY, missing_source_config(dir.path())?)
        .namespace(&ns)
        .identity("kubeconfig-rotator-0")
        .start()
        .await?;
    let errors = testbed::scrape::wait_for_metric(
        &agent,
        "kubeconfig_rotator_reconcile_errors_total{reason=\"source_missing\"}",
        "the missing source to be counted",
        |v| v >= 1.0,
    )
    .await;
    assert!(errors >= 1.0);
    let text = testbed::scrape::metrics(&agent).await;
    // Every series of the kubeconfig is there, with a value, though it never synced.
    for series in [
        "kubeconfig_rotator_certificate_not_after_timestamp_seconds{kubeconfig=\"absent\"}",
        "kubeconfig_rotator_last_sync_timestamp_seconds{kubeconfig=\"absent\"}",
        "kubeconfig_rotator_rotations_total{kubeconfig=\"absent\"}",
        "kubeconfig_rotator_verification_failures_total{kubeconfig=\"absent\",reason=\"expired\"}",
        "kubeconfig_rotator_target_in_sync{kubeconfig=\"absent\",namespace=\"default\",name=\"absent-copy\"}",
    ] {
        assert_eq!(testbed::scrape::metric(&text, series)?, 0.0, "{series}");
    }
    let copy = kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(bed.client(), "default")
        .get_opt("absent-copy")
        .await?;
    assert!(copy.is_none(), "nothing is published without a proven source");
    Ok(())
}

#[test]
fn an_invalid_configuration_fails_at_start_naming_the_field() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "kubeconfigs:\n- name: x\n  source: {secret: {namespace: a, name: b, key: k}}\n  targets: []\n",
    )?;
    let (code, _, err) = run_to_completion(Path::new(BINARY), &["rbac", "--config", &path.display().to_string()])?;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("kubeconfigs[0].expect: required"), "{err}");
    assert!(err.contains("kubeconfigs[0].targets: at least one target"), "{err}");
    Ok(())
}

#[test]
fn version_prints_the_version_and_commit() -> Result<()> {
    let (code, out, _) = run_to_completion(Path::new(BINARY), &["--version"])?;
    assert_eq!(code, Some(0));
    assert!(out.starts_with("kubeconfig-rotator ") && out.contains("commit"), "{out}");
    Ok(())
}
