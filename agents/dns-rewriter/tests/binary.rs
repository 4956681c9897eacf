//! The dns-rewriter binary as a process: `run` becomes ready, holds its Lease, and exits 0 on SIGTERM releasing
//! it; a leader that cannot renew exits non-zero; a second SIGTERM during a stuck drain exits at once; an
//! invalid configuration fails at start naming the field; `--version` works.

mod common;

use std::path::{Path, PathBuf};

use anyhow::Result;
use common::BINARY;
use testbed::agent_process::{self, run_to_completion};

/// What the chart creates at install: the empty `kube-system/coredns-custom` the agent writes its key into.
fn prepare(client: kube::Client) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>> {
    Box::pin(common::create_coredns_custom(client))
}

/// A configuration that can become ready on a prepared test bed: k3s mode, no rule (the key holds the header
/// alone), nothing to verify.
fn ready_config(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("config.yaml");
    std::fs::write(&path, "mode: k3s\n")?;
    Ok(path)
}

#[tokio::test]
async fn run_becomes_ready_holds_its_lease_and_on_sigterm_exits_0_releasing_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = ready_config(dir.path())?;
    agent_process::check_lifecycle_prepared(Path::new(BINARY), &config, "kcp-keeper-dns-rewriter", prepare).await
}

#[tokio::test]
async fn a_leader_that_cannot_renew_its_lease_exits_non_zero_to_rejoin() -> Result<()> {
    let dir = tempfile::tempdir()?;
    agent_process::check_lost_lease_exits_prepared(Path::new(BINARY), &ready_config(dir.path())?, prepare).await
}

#[tokio::test]
async fn a_second_sigterm_during_a_stuck_drain_exits_at_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = ready_config(dir.path())?;
    agent_process::check_second_signal_exits_at_once_prepared(Path::new(BINARY), &config, prepare).await
}

#[test]
fn an_invalid_config_fails_at_start_naming_the_field() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "mode: k3s\nnotAField: 1\n")?;
    let (code, _, stderr) = run_to_completion(Path::new(BINARY), &["run", "--config", &config.display().to_string()])?;
    assert_eq!(code, Some(1));
    assert!(stderr.contains("notAField"), "{stderr}");
    Ok(())
}

#[test]
fn version_prints_version_and_commit() {
    let out = std::process::Command::new(BINARY).arg("--version").output().expect("the binary starts");
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("dns-rewriter 0.1.0 (commit "), "{stdout}");
}
