//! Records the git commit the binaries were built from, for `--version` and the build-info metric.
use std::process::Command;

fn main() {
    let commit = std::env::var("KCP_KEEPER_COMMIT").ok().filter(|c| !c.is_empty()).or_else(|| {
        let out = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    });
    println!("cargo:rustc-env=KCP_KEEPER_COMMIT={}", commit.unwrap_or_else(|| "unknown".into()));
    println!("cargo:rerun-if-env-changed=KCP_KEEPER_COMMIT");
    // HEAD moves on commit and checkout; refs/heads covers commits on the current branch.
    println!("cargo:rerun-if-changed=../../.git/HEAD");
    println!("cargo:rerun-if-changed=../../.git/refs/heads");
}
