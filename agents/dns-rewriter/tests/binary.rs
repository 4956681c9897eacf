//! The dns-rewriter binary as the chart runs it, against the real test bed.

use std::path::Path;

use testbed::agent_process::{check_lifecycle, check_second_signal_exits_at_once, run_to_completion};

const BINARY: &str = env!("CARGO_BIN_EXE_dns-rewriter");

#[tokio::test]
async fn run_with_example_config_becomes_ready_holds_lease_and_exits_cleanly_on_sigterm() -> anyhow::Result<()> {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("example.yaml");
    check_lifecycle(Path::new(BINARY), &config, "kcp-keeper-dns-rewriter").await
}

#[test]
fn invalid_config_fails_at_start_naming_the_field() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "resyncInterval: 5m\nresyncIntervall: 1m\n")?;
    let (code, _, stderr) = run_to_completion(Path::new(BINARY), &["run", "--config", &config.display().to_string()])?;
    assert_eq!(code, Some(1));
    assert!(stderr.contains("unknown field `resyncIntervall`"), "{stderr}");
    Ok(())
}

#[test]
fn version_prints_version_and_commit() -> anyhow::Result<()> {
    let (code, stdout, _) = run_to_completion(Path::new(BINARY), &["--version"])?;
    assert_eq!(code, Some(0));
    assert!(stdout.starts_with("dns-rewriter 0.1.0 (commit "), "{stdout}");
    Ok(())
}

/// A runtime property, proven once through a real binary.
#[tokio::test]
async fn a_second_sigterm_during_a_stuck_drain_exits_at_once() -> anyhow::Result<()> {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("example.yaml");
    check_second_signal_exits_at_once(Path::new(BINARY), &config).await
}
