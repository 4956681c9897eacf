//! The dns-rewriter binary: its daemon is not built yet, so `run` must say so and fail, never run and report
//! ready; `--version` works.

#[test]
fn run_is_not_built_yet_and_refuses_saying_why() {
    let binary = env!("CARGO_BIN_EXE_dns-rewriter");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/example.yaml");
    let out =
        std::process::Command::new(binary).args(["run", "--config", example]).output().expect("the binary starts");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("dns-rewriter run is not built yet"), "{stderr}");
}

#[test]
fn version_prints_version_and_commit() {
    let binary = env!("CARGO_BIN_EXE_dns-rewriter");
    let out = std::process::Command::new(binary).arg("--version").output().expect("the binary starts");
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("dns-rewriter 0.1.0 (commit "), "{stdout}");
}
