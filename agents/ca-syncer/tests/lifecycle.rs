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
    let expected = format!("ca-syncer {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(stdout.starts_with(&expected), "{stdout}");
    Ok(())
}

/// A private key and a token, pasted under fields of the wrong type: what must never be echoed.
const PASTED_KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7pastedKeyBody\n-----END PRIVATE KEY-----\n";
const PASTED_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.pastedTokenBody0123456789";

fn pasted_configs() -> [(String, &'static str); 2] {
    let key: String = PASTED_KEY.lines().map(|l| format!("  {l}\n")).collect();
    [
        (format!("bundles: |\n{key}"), "bundles: expected a sequence, found string"),
        (
            format!(
                "bundles:\n- name: a\n  sources:\n  - publicRoots: {{}}\n  targets:\n  - secret: {{namespace: n, name: t, key: ca.crt}}\n  dropExpired: {PASTED_TOKEN}\n"
            ),
            "bundles[0].dropExpired: expected a boolean, found string",
        ),
    ]
}

fn assert_not_echoed(text: &str) {
    for secret in
        ["MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcw", "pastedKeyBody", "PRIVATE KEY", "pastedTokenBody", "eyJhbGci"]
    {
        assert!(!text.contains(secret), "{secret} echoed in:\n{text}");
    }
}

#[test]
fn a_key_or_token_under_a_field_of_the_wrong_type_fails_the_start_by_path_and_type_without_echoing_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    for (text, expected) in pasted_configs() {
        let config = dir.path().join("config.yaml");
        std::fs::write(&config, text)?;
        let (code, stdout, stderr) =
            run_to_completion(Path::new(BINARY), &["run", "--config", &config.display().to_string()])?;
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
        assert_not_echoed(&format!("{stdout}\n{stderr}"));
    }
    Ok(())
}

#[tokio::test]
async fn a_key_or_token_under_a_field_of_the_wrong_type_is_refused_on_reload_without_echoing_it() -> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let dir = tempfile::tempdir()?;
    let good = ready_config(dir.path())?;
    let config =
        write_config(&bed, &std::fs::read_to_string(good)?.replace("namespace: default", &format!("namespace: {ns}")))?;
    let mut agent = agent(&bed, &config, &ns).spawn()?;
    agent.wait_ready(WAIT).await?;
    for (round, (text, expected)) in pasted_configs().into_iter().enumerate() {
        // Swapped in whole, as kubelet does, so no half-written file is ever read.
        let staged = config.with_extension("staged");
        std::fs::write(&staged, text)?;
        std::fs::rename(&staged, &config)?;
        let count = (round + 1) as f64;
        wait_for_metric(&agent, "ca_syncer_config_reload_errors_total{reason=\"parse\"}", "the parse error", |v| {
            v == count
        })
        .await;
        let log = agent.process.log();
        assert!(log.contains(expected), "{expected} in:\n{log}");
        assert_not_echoed(&format!("{log}\n{}", metrics(&agent).await));
    }
    Ok(())
}
