//! The process lifecycle every agent has, proven on the ca-syncer binary against a real apiserver: ready,
//! holding its Lease; SIGTERM exits 0 and releases it; a lost lease exits non-zero; a second SIGTERM during a
//! stuck drain exits at once.

mod common;

use std::path::{Path, PathBuf};

use anyhow::Result;
use common::*;
use testbed::agent_process::{self, run_to_completion};
use testbed::certs::Ca;

/// A configuration that can become ready on any fresh test bed: an inline CA into a Secret in `default`.
fn ready_config(dir: &Path) -> Result<PathBuf> {
    let ca = Ca::new("lifecycle-ca", YEAR)?;
    let indented: String = ca.cert_pem().lines().map(|l| format!("      {l}\n")).collect();
    let path = dir.join("config.yaml");
    std::fs::write(
        &path,
        format!(
            "bundles:\n- name: lifecycle\n  sources:\n  - inline: |\n{indented}  targets:\n  - secret: {{namespace: default, name: lifecycle-ca, key: ca.crt}}\n"
        ),
    )?;
    Ok(path)
}

#[tokio::test]
async fn run_becomes_ready_holds_its_lease_and_on_sigterm_exits_0_releasing_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    agent_process::check_lifecycle(Path::new(BINARY), &ready_config(dir.path())?, "kcp-keeper-ca-syncer").await
}

#[tokio::test]
async fn a_leader_that_cannot_renew_its_lease_exits_non_zero_to_rejoin() -> Result<()> {
    let dir = tempfile::tempdir()?;
    agent_process::check_lost_lease_exits(Path::new(BINARY), &ready_config(dir.path())?).await
}

#[tokio::test]
async fn a_second_sigterm_during_a_stuck_drain_exits_at_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    agent_process::check_second_signal_exits_at_once(Path::new(BINARY), &ready_config(dir.path())?).await
}

#[test]
fn an_invalid_config_fails_at_start_naming_the_field() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "bundles: []\nnotAField: 1\n")?;
    let (code, _, stderr) = run_to_completion(Path::new(BINARY), &["run", "--config", &config.display().to_string()])?;
    assert_eq!(code, Some(1));
    assert!(stderr.contains("unknown field `notAField`"), "{stderr}");
    Ok(())
}

#[test]
fn version_prints_version_and_commit() -> Result<()> {
    let (code, stdout, _) = run_to_completion(Path::new(BINARY), &["--version"])?;
    assert_eq!(code, Some(0));
    assert!(stdout.starts_with("ca-syncer 0.1.0 (commit "), "{stdout}");
    Ok(())
}
