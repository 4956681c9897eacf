//! The kubeconfig-rotator binary is not built yet: it must say so and fail, never run and report ready.

#[test]
fn the_unbuilt_binary_refuses_to_run_and_says_why() {
    let binary = env!("CARGO_BIN_EXE_kubeconfig-rotator");
    for args in [&["run", "--config", "/nonexistent.yaml"][..], &[][..], &["--version"][..]] {
        let out = std::process::Command::new(binary).args(args).output().expect("the binary starts");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("kubeconfig-rotator is not built yet"), "{args:?}: {stderr}");
    }
}
