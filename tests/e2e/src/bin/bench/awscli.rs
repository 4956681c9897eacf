//! The AWS CLI, the baseline's uploader: a virtualenv under the cache (`<cache>/awscli`) with the `awscli`
//! package, created when missing. Checked by capability (`aws --version` answers); a Python without ensurepip
//! gets Debian's python3-venv through apt-get (sudo when not root), said on stderr, as the xtask does.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

/// The `aws` executable, installed first if needed.
pub fn ensure() -> Result<PathBuf> {
    let venv = peers::cache_root().join("awscli");
    let aws = venv.join("bin").join("aws");
    if answers(&aws) {
        return Ok(aws);
    }
    eprintln!("bench: installing the AWS CLI into a virtualenv at {}", venv.display());
    if !Command::new("python3").args(["-c", "import ensurepip, venv"]).status().is_ok_and(|s| s.success()) {
        eprintln!("bench: python3 cannot create virtualenvs (no ensurepip); installing python3-venv with apt-get");
        apt_install("python3-venv")?;
    }
    let _ = std::fs::remove_dir_all(&venv);
    check(Command::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv")?;
    check(Command::new(venv.join("bin").join("pip")).args(["install", "--quiet", "awscli"]), "pip install awscli")?;
    anyhow::ensure!(answers(&aws), "{} does not answer --version after installing", aws.display());
    Ok(aws)
}

fn answers(aws: &Path) -> bool {
    Command::new(aws).arg("--version").output().is_ok_and(|o| o.status.success())
}

fn check(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {what}"))?;
    anyhow::ensure!(status.success(), "{what} failed: {status}");
    Ok(())
}

fn apt_install(package: &str) -> Result<()> {
    let root = is_root();
    let apt = |args: &[&str]| -> Result<()> {
        let mut cmd = if root { Command::new("apt-get") } else { Command::new("sudo") };
        if !root {
            cmd.arg("apt-get");
        }
        cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        check(&mut cmd, &format!("apt-get {}", args.join(" ")))
    };
    let lists_present = std::fs::read_dir("/var/lib/apt/lists")
        .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().ends_with("_Packages")))
        .unwrap_or(false);
    if !lists_present {
        eprintln!("bench: apt's package lists are empty; running apt-get update first");
        apt(&["update"])?;
    }
    apt(&["install", "-y", "--no-install-recommends", package])
}

/// Whether this process runs as root (the effective uid `id -u` prints).
fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
