//! What a fresh machine must have before the README commands can run, each checked by what the build
//! actually does (not by whether a binary is on PATH), and installed when it can be.
//!
//! - protoc with the well-known `.proto` files: etcd-client's build script compiles etcd's protos, which
//!   import `google/protobuf/descriptor.proto`. Debian's `protobuf-compiler` only recommends
//!   `libprotobuf-dev`, which carries those files, so `--no-install-recommends` alone is not enough.
//! - rustfmt and clippy: `cargo xtask test` runs both; a minimal rustup profile lacks them.
//! - Go, new enough for the peers' go.mod files (the peers are built with `GOTOOLCHAIN=local`, so Go never
//!   downloads a newer toolchain behind our back).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

/// The oldest Go that builds every pinned peer (kube-apiserver v1.37 and kcp v0.32 declare `go 1.26.0`).
pub const MIN_GO: (u32, u32) = (1, 26);

/// Why protoc cannot do what etcd-client's build needs.
#[derive(Debug, PartialEq, Eq)]
pub enum ProtocGap {
    /// No protoc at `$PROTOC` or on PATH.
    Missing,
    /// protoc runs but cannot find the well-known types; carries protoc's own message.
    WellKnownTypes(String),
}

/// The protoc prost-build will run: `$PROTOC` if set, else `protoc` on PATH.
pub fn protoc_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PROTOC") {
        return Some(PathBuf::from(p));
    }
    find_on_path("protoc")
}

/// Compiles a one-line `.proto` importing `descriptor.proto` with `protoc`, exactly as a build would.
pub fn check_protoc(protoc: Option<&Path>) -> Result<(), ProtocGap> {
    let protoc = protoc.filter(|p| p.is_file()).ok_or(ProtocGap::Missing)?;
    let dir = tempfile::tempdir().map_err(|e| ProtocGap::WellKnownTypes(format!("no temp dir: {e}")))?;
    let probe = dir.path().join("probe.proto");
    std::fs::write(
        &probe,
        "syntax = \"proto3\";\nimport \"google/protobuf/descriptor.proto\";\nmessage Probe { google.protobuf.FileDescriptorProto d = 1; }\n",
    )
    .map_err(|e| ProtocGap::WellKnownTypes(format!("cannot write the probe: {e}")))?;
    let output = Command::new(protoc)
        .arg("--proto_path")
        .arg(dir.path())
        .arg("--descriptor_set_out")
        .arg(dir.path().join("probe.pb"))
        .arg(&probe)
        .output();
    match output {
        Err(_) => Err(ProtocGap::Missing),
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(ProtocGap::WellKnownTypes(String::from_utf8_lossy(&o.stderr).trim().to_string())),
    }
}

/// Makes protoc able to build etcd-client, installing the Debian packages that are missing.
pub fn ensure_protoc() -> Result<()> {
    match check_protoc(protoc_path().as_deref()) {
        Ok(()) => return Ok(()),
        Err(ProtocGap::Missing) => {
            eprintln!("xtask: protoc is missing (etcd-client's build compiles etcd's .proto files)");
            apt_install(&["protobuf-compiler", "libprotobuf-dev"])?;
        }
        Err(ProtocGap::WellKnownTypes(why)) => {
            eprintln!("xtask: protoc cannot find the well-known .proto files ({why})");
            apt_install(&["libprotobuf-dev"])?;
        }
    }
    match check_protoc(protoc_path().as_deref()) {
        Ok(()) => Ok(()),
        Err(ProtocGap::Missing) => bail!("protoc is still missing after the install; set PROTOC to a protoc binary"),
        Err(ProtocGap::WellKnownTypes(why)) => bail!(
            "protoc still cannot compile a .proto importing google/protobuf/descriptor.proto ({why}); \
             install libprotobuf-dev, or set PROTOC to a protoc that ships its include directory"
        ),
    }
}

/// Installs Debian packages with apt-get (through sudo when not root), refreshing empty package lists first.
fn apt_install(packages: &[&str]) -> Result<()> {
    let list = packages.join(" ");
    if find_on_path("apt-get").is_none() {
        bail!("apt-get is not available: install {list} with this system's package manager");
    }
    let root = is_root();
    if !root && find_on_path("sudo").is_none() {
        bail!("installing {list} needs root: run `sudo apt-get install {list}` once, or run as root");
    }
    let apt = |args: &[&str]| {
        let mut cmd = if root { Command::new("apt-get") } else { Command::new("sudo") };
        if !root {
            cmd.arg("apt-get");
        }
        cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    };
    if !apt_lists_present(Path::new("/var/lib/apt/lists")) {
        eprintln!("xtask: apt's package lists are empty; running apt-get update first");
        crate::step("apt-get update", apt(&["update"]))?;
    }
    eprintln!("xtask: installing {list} with apt-get");
    let mut args = vec!["install", "-y", "--no-install-recommends"];
    args.extend(packages);
    crate::step(&format!("apt-get install {list}"), apt(&args))
}

/// Whether apt has downloaded package lists (a fresh container image ships without them).
fn apt_lists_present(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().any(|e| e.file_name().to_string_lossy().contains("_Packages")))
        .unwrap_or(false)
}

/// Adds rustfmt and clippy when the toolchain lacks them (a minimal rustup profile has neither).
pub fn ensure_rust_components() -> Result<()> {
    for (component, subcommand) in [("rustfmt", "fmt"), ("clippy", "clippy")] {
        if crate::cargo(&[subcommand, "--version"]).output().is_ok_and(|o| o.status.success()) {
            continue;
        }
        eprintln!("xtask: `cargo {subcommand}` is missing; adding the {component} component with rustup");
        if find_on_path("rustup").is_none() {
            bail!("`cargo {subcommand}` is missing and rustup is not on PATH: install the {component} component");
        }
        let mut cmd = Command::new("rustup");
        cmd.args(["component", "add", component]);
        crate::step(&format!("rustup component add {component}"), cmd)?;
    }
    Ok(())
}

/// Fails with a clear message when Go is missing or older than [`MIN_GO`].
pub fn check_go() -> Result<()> {
    let output = Command::new("go").args(["env", "GOVERSION"]).env("GOTOOLCHAIN", "local").output();
    let output = match output {
        Ok(o) if o.status.success() => o,
        _ => bail!(
            "Go is missing: the test peers are built from source; install Go {}.{} or newer and put it on PATH",
            MIN_GO.0,
            MIN_GO.1
        ),
    };
    let version = String::from_utf8_lossy(&output.stdout).trim().to_string();
    match parse_go_version(&version) {
        Some(v) if v >= MIN_GO => Ok(()),
        Some(_) => bail!(
            "Go {version} is too old: the peers need Go {}.{} or newer (they are built with GOTOOLCHAIN=local, \
             so Go will not download a newer toolchain by itself)",
            MIN_GO.0,
            MIN_GO.1
        ),
        None => bail!("cannot read Go's version from `go env GOVERSION` (got {version:?})"),
    }
}

/// `go1.26.8` → (1, 26); also `go1.25rc1` → (1, 25).
fn parse_go_version(text: &str) -> Option<(u32, u32)> {
    let rest = text.strip_prefix("go")?;
    let mut parts = rest.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts.next()?.chars().take_while(|c| c.is_ascii_digit()).collect();
    Some((major, minor.parse().ok()?))
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths).map(|dir| dir.join(program)).find(|p| p.is_file())
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protoc_capability_passes_with_the_installed_well_known_types() {
        // `cargo xtask test` installs them before the tests run, so this must hold on every CI machine.
        assert_eq!(check_protoc(protoc_path().as_deref()), Ok(()));
    }

    #[test]
    fn protoc_capability_fails_when_protoc_has_no_well_known_types() {
        // protoc finds the well-known types only in `<its own dir>/../include` (/usr/bin -> /usr/include).
        // A copy in a fresh directory has no include dir beside it: the same protoc without the files.
        let dir = tempfile::tempdir().unwrap();
        let real = protoc_path().expect("protoc is installed by `cargo xtask test`");
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        let copy = dir.path().join("bin").join("protoc");
        std::fs::copy(&real, &copy).unwrap();
        match check_protoc(Some(&copy)) {
            Err(ProtocGap::WellKnownTypes(why)) => assert!(why.contains("descriptor.proto"), "{why}"),
            other => panic!("expected the well-known types to be missing, got {other:?}"),
        }
    }

    #[test]
    fn protoc_capability_reports_a_missing_protoc() {
        assert_eq!(check_protoc(Some(Path::new("/nonexistent/protoc"))), Err(ProtocGap::Missing));
        assert_eq!(check_protoc(None), Err(ProtocGap::Missing));
    }

    #[test]
    fn go_versions_are_read_from_go_env() {
        assert_eq!(parse_go_version("go1.26.8"), Some((1, 26)));
        assert_eq!(parse_go_version("go1.25rc1"), Some((1, 25)));
        assert_eq!(parse_go_version("devel +abc"), None);
        assert!(parse_go_version("go1.25.9").unwrap() < MIN_GO);
    }

    #[test]
    fn apt_lists_are_empty_in_a_fresh_image() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!apt_lists_present(dir.path()));
        std::fs::create_dir(dir.path().join("partial")).unwrap();
        std::fs::write(dir.path().join("lock"), "").unwrap();
        assert!(!apt_lists_present(dir.path()));
        std::fs::write(dir.path().join("deb_dists_bookworm_main_binary-amd64_Packages.lz4"), "").unwrap();
        assert!(apt_lists_present(dir.path()));
    }
}
