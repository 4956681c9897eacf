//! The dns-rewriter binary as a process: `run` becomes ready, holds its Lease, and exits 0 on SIGTERM releasing
//! it; a leader that cannot renew exits non-zero; a second SIGTERM during a stuck drain exits at once; an
//! invalid configuration fails at start naming the field; logs to a pipe or a file carry no colour codes;
//! `--version` works.

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
    let expected = format!("dns-rewriter {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(stdout.starts_with(&expected), "{stdout}");
}

/// Starts `run` on an invalid configuration (it logs `starting`, then fails) with `format` and stderr going to
/// `stderr`, and returns what it logged. `NO_COLOR` is removed so that only the terminal check can turn colour off.
fn logs_of_a_failed_start(format: &str, stderr: std::process::Stdio, read: impl FnOnce(&[u8]) -> String) -> String {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "mode: k3s\nnotAField: 1\n").unwrap();
    let out = std::process::Command::new(BINARY)
        .args(["run", "--config", &config.display().to_string()])
        .env("KCP_KEEPER_LOG_FORMAT", format)
        .env("KCP_KEEPER_LOG_LEVEL", "info")
        .env_remove("NO_COLOR")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .output()
        .expect("the binary starts");
    assert_eq!(out.status.code(), Some(1));
    read(&out.stderr)
}

#[test]
fn plain_logs_to_a_pipe_carry_no_colour_codes() {
    let logs = logs_of_a_failed_start("plain", std::process::Stdio::piped(), |piped| {
        String::from_utf8_lossy(piped).into_owned()
    });
    assert!(logs.contains("starting"), "the start line is logged: {logs}");
    assert!(logs.contains("INFO"), "{logs}");
    assert!(!logs.contains("\x1b["), "no ANSI escape in plain output to a pipe: {logs:?}");
}

#[test]
fn json_logs_to_a_file_carry_no_colour_codes_and_every_log_line_parses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stderr.log");
    let file = std::fs::File::create(&path).unwrap();
    let logs = logs_of_a_failed_start("json", file.into(), |_| std::fs::read_to_string(&path).unwrap());
    assert!(!logs.contains("\x1b["), "no ANSI escape in JSON: {logs:?}");
    let start = logs.lines().find(|l| l.contains("starting")).unwrap_or_else(|| panic!("no start line: {logs}"));
    let line: serde_json::Value = serde_json::from_str(start).unwrap_or_else(|e| panic!("{e}: {start}"));
    assert_eq!(line["level"], "INFO", "{start}");
}
