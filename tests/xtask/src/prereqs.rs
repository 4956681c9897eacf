//! What a fresh machine must have before the README commands can run, each checked by what the build
//! actually does (not by whether a binary is on PATH), and installed when it can be.
//!
//! - protoc with the well-known `.proto` files: etcd-client's build script compiles etcd's protos, which
//!   import `google/protobuf/descriptor.proto`. Debian's `protobuf-compiler` only recommends
//!   `libprotobuf-dev`, which carries those files, so `--no-install-recommends` alone is not enough.
//! - rustfmt and clippy: `cargo xtask test` runs both; a minimal rustup profile lacks them.
//! - Go, new enough for the peers' go.mod files (the peers are built with `GOTOOLCHAIN=local`, so Go never
//!   downloads a newer toolchain behind our back).
//! - For `cargo xtask images`: Rust's musl target (its `std`), a C compiler for musl (ring, aws-lc-sys and
//!   zstd-sys compile C for the target: cc-rs picks `musl-gcc`, from Debian's `musl-tools`), and buildah.
//! - For the peers of the real node (`testbed::node`): a cgo build against libseccomp (runc's seccomp support,
//!   which the restricted profile's `RuntimeDefault` needs: Debian's `libseccomp-dev` and `pkg-config`), a static
//!   C build (Kubernetes' pause, `gcc -static`: `gcc` and `libc6-dev`), a static C build against OpenSSL (the
//!   seed layout's openssl-probe, `gcc -static ... -lssl -lcrypto`: Debian's `libssl-dev`); to run the node, the CNI plugins
//!   (Debian's `containernetworking-plugins` in `/usr/lib/cni`), iptables (kube-proxy's iptables mode) and
//!   ipset (kube-router's NetworkPolicy firewall, which the node runs for the enforcement tests).
//! - For ca-syncer's trust store tests: Java's keytool and `openssl pkcs12`, which read its JKS and PKCS#12
//!   files back.
//! - For the supply chain step (supply_chain.rs): cargo-deny, built with `cargo install` at a pinned version.

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

/// Rust's fully static target: the images are `FROM scratch`, so the agents may link nothing at run time.
pub const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";

/// Whether a rustlib directory for a target holds its standard library (what `rustup target add` installs).
fn has_std(target_lib_dir: &Path) -> bool {
    std::fs::read_dir(target_lib_dir)
        .map(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("libstd-") && name.ends_with(".rlib")
            })
        })
        .unwrap_or(false)
}

/// `<sysroot>/lib/rustlib/<target>/lib` of the rustc cargo runs.
fn target_lib_dir(target: &str) -> Option<PathBuf> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let output = Command::new(rustc).args(["--print", "sysroot"]).output().ok()?;
    output.status.success().then_some(())?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    Some(sysroot.join("lib").join("rustlib").join(target).join("lib"))
}

/// Adds the musl target's standard library with rustup when the toolchain lacks it.
pub fn ensure_musl_target() -> Result<()> {
    if target_lib_dir(MUSL_TARGET).is_some_and(|dir| has_std(&dir)) {
        return Ok(());
    }
    eprintln!("xtask: the {MUSL_TARGET} target is missing (the images hold static binaries); adding it with rustup");
    if find_on_path("rustup").is_none() {
        bail!("the {MUSL_TARGET} target is missing and rustup is not on PATH: add that target to the toolchain");
    }
    let mut cmd = Command::new("rustup");
    cmd.args(["target", "add", MUSL_TARGET]);
    crate::step(&format!("rustup target add {MUSL_TARGET}"), cmd)?;
    match target_lib_dir(MUSL_TARGET) {
        Some(dir) if has_std(&dir) => Ok(()),
        _ => bail!("rustup added {MUSL_TARGET} but rustc still has no standard library for it"),
    }
}

/// The C compiler cc-rs uses for the musl target: `$CC_x86_64_unknown_linux_musl`, else `musl-gcc`.
fn musl_cc() -> PathBuf {
    std::env::var_os(format!("CC_{}", MUSL_TARGET.replace('-', "_")))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("musl-gcc"))
}

/// Compiles and links a static C program against musl with `cc`, as the C parts of the agents' build do;
/// on failure returns the compiler's own message.
pub fn check_musl_cc(cc: &Path) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("no temp dir: {e}"))?;
    let probe = dir.path().join("probe.c");
    std::fs::write(&probe, "#include <stdio.h>\nint main(void) { return puts(\"probe\") < 0; }\n")
        .map_err(|e| format!("cannot write the probe: {e}"))?;
    let output = Command::new(cc).arg("-static").arg("-o").arg(dir.path().join("probe")).arg(&probe).output();
    match output {
        Err(e) => Err(format!("cannot run {}: {e}", cc.display())),
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
    }
}

/// Makes a musl C compiler available, installing Debian's `musl-tools` when it is missing.
pub fn ensure_musl_cc() -> Result<()> {
    let cc = musl_cc();
    let Err(why) = check_musl_cc(&cc) else { return Ok(()) };
    eprintln!("xtask: no C compiler for musl ({why}); ring and zstd-sys compile C for the images");
    apt_install(&["musl-tools"])?;
    check_musl_cc(&cc).map_err(|why| {
        anyhow::anyhow!(
            "{} still cannot build a static C program after installing musl-tools ({why}); \
             set CC_x86_64_unknown_linux_musl to a musl C compiler",
            cc.display()
        )
    })
}

/// Debian's bundle of public CA certificates (package `ca-certificates`): the etcd-snapshotter image carries it
/// at the same path, where its S3 client looks, so S3 over HTTPS works from `FROM scratch`.
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Fewer certificates than this is not a public-roots bundle (Debian's holds about 140).
const MIN_PUBLIC_ROOTS: usize = 50;

/// How many certificates a PEM text holds.
pub fn certificate_count(pem: &str) -> usize {
    pem.matches("-----BEGIN CERTIFICATE-----").count()
}

fn ca_bundle_gap() -> Option<String> {
    match std::fs::read_to_string(CA_BUNDLE) {
        Err(e) => Some(format!("cannot read {CA_BUNDLE}: {e}")),
        Ok(text) if certificate_count(&text) < MIN_PUBLIC_ROOTS => {
            Some(format!("{CA_BUNDLE} holds {} certificates", certificate_count(&text)))
        }
        Ok(_) => None,
    }
}

/// Makes the public CA bundle available, installing Debian's `ca-certificates` when it is missing or thin.
pub fn ensure_ca_bundle() -> Result<PathBuf> {
    if let Some(why) = ca_bundle_gap() {
        eprintln!("xtask: no public CA bundle ({why}); the etcd-snapshotter image carries one for S3 over HTTPS");
        apt_install(&["ca-certificates"])?;
        if let Some(why) = ca_bundle_gap() {
            anyhow::bail!("still no public CA bundle after installing ca-certificates: {why}");
        }
    }
    Ok(PathBuf::from(CA_BUNDLE))
}

/// The cargo-deny that the supply chain step installs when none of its minor version runs: the newest release when
/// it was pinned, and it builds with the workspace's Rust (cargo-deny 0.20 needs Rust 1.88). Its configuration
/// keys and its advisory database layout (supply_chain.rs) are those of this version.
pub const CARGO_DENY_VERSION: &str = "0.20.2";

/// `cargo-deny 0.20.2` (what `cargo deny --version` prints) → `0.20.2`.
pub fn parse_cargo_deny_version(text: &str) -> Option<&str> {
    let version = text.trim().strip_prefix("cargo-deny ")?.split_whitespace().next()?;
    version.chars().next().filter(char::is_ascii_digit).map(|_| version)
}

/// Whether a cargo-deny version reads our deny.toml as the pinned one does: the same `0.minor` (cargo-deny's
/// breaking changes come with a new minor version while it is 0.x).
pub fn cargo_deny_compatible(version: &str) -> bool {
    let minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
    minor(version) == minor(CARGO_DENY_VERSION)
}

/// The version of the `cargo deny` that runs, if one does.
fn cargo_deny_version() -> Option<String> {
    let output = crate::cargo(&["deny", "--version"]).output().ok()?;
    output.status.success().then_some(())?;
    parse_cargo_deny_version(&String::from_utf8_lossy(&output.stdout)).map(str::to_string)
}

/// Installs cargo-deny [`CARGO_DENY_VERSION`] with `cargo install --locked` when `cargo deny` does not run or is of
/// another minor version (a build of a few minutes, once per machine).
pub fn ensure_cargo_deny() -> Result<()> {
    match cargo_deny_version() {
        Some(version) if cargo_deny_compatible(&version) => return Ok(()),
        Some(version) => eprintln!(
            "xtask: `cargo deny` is {version}; the supply chain step needs {CARGO_DENY_VERSION}'s configuration \
             format: installing cargo-deny {CARGO_DENY_VERSION} over it with cargo install (a few minutes, once)"
        ),
        None => eprintln!(
            "xtask: `cargo deny` is missing (the supply chain step checks licenses, duplicates, sources and \
             advisories with it): installing cargo-deny {CARGO_DENY_VERSION} with cargo install (a few minutes, once)"
        ),
    }
    let spec = format!("cargo-deny@{CARGO_DENY_VERSION}");
    crate::step(&format!("cargo install --locked {spec}"), crate::cargo(&["install", "--locked", &spec]))?;
    match cargo_deny_version() {
        Some(version) if cargo_deny_compatible(&version) => Ok(()),
        Some(version) => bail!(
            "`cargo deny --version` says {version} after installing {CARGO_DENY_VERSION}: \
                                is another cargo-deny earlier on PATH?"
        ),
        None => bail!("`cargo deny --version` still fails after installing cargo-deny {CARGO_DENY_VERSION}"),
    }
}

/// buildah's version line (`buildah version 1.28.2 (image-spec 1.0.2-dev, runtime-spec 1.0.2-dev)`) → `1.28.2`.
pub fn parse_buildah_version(text: &str) -> Option<&str> {
    let version = text.trim().strip_prefix("buildah version ")?.split_whitespace().next()?;
    version.chars().next().filter(char::is_ascii_digit).map(|_| version)
}

/// The version of a buildah that runs, if one does.
pub fn buildah_version() -> Option<String> {
    let output = Command::new("buildah").arg("--version").output().ok()?;
    output.status.success().then_some(())?;
    parse_buildah_version(&String::from_utf8_lossy(&output.stdout)).map(str::to_string)
}

/// Installs buildah through apt when none runs; returns its version.
pub fn ensure_buildah() -> Result<String> {
    if let Some(version) = buildah_version() {
        return Ok(version);
    }
    eprintln!("xtask: buildah is missing (it builds the images without a container engine)");
    apt_install(&["buildah"])?;
    buildah_version().ok_or_else(|| anyhow::anyhow!("`buildah --version` still fails after installing buildah"))
}

/// Whether `/etc/subuid`-style text (`user:start:count` or `uid:start:count` per line) grants `user` (or `uid`)
/// a range: rootless buildah maps container uid N (here 65532) to the Nth subordinate id, so it needs 65532.
pub fn has_subordinate_range(text: &str, user: &str, uid: u32) -> bool {
    text.lines().any(|line| {
        let mut fields = line.trim().split(':');
        let (Some(owner), Some(_start), Some(count)) = (fields.next(), fields.next(), fields.next()) else {
            return false;
        };
        (owner == user || owner == uid.to_string()) && count.parse::<u64>().is_ok_and(|c| c >= 65532)
    })
}

/// As root buildah needs nothing more; rootless, it needs subordinate uid and gid ranges covering the images'
/// user. Says how to add them rather than guessing a range for the machine.
pub fn check_rootless_buildah() -> Result<()> {
    if is_root() {
        return Ok(());
    }
    let uid = nix::unistd::getuid();
    let user = nix::unistd::User::from_uid(uid).ok().flatten().map(|u| u.name).unwrap_or_else(|| uid.to_string());
    for file in ["/etc/subuid", "/etc/subgid"] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if !has_subordinate_range(&text, &user, uid.as_raw()) {
            bail!(
                "rootless buildah needs subordinate ids for {user} in {file} (a range over 65532: the images run as \
                 65532:65532); add them once with `sudo usermod --add-subuids 100000-165535 --add-subgids \
                 100000-165535 {user}`, or run as root"
            );
        }
    }
    Ok(())
}

/// Compiles and links a C program with `cc` and `extra` arguments, as a build would; the compiler's message on
/// failure.
fn check_c_build(source: &str, extra: &[&str]) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("no temp dir: {e}"))?;
    let probe = dir.path().join("probe.c");
    std::fs::write(&probe, source).map_err(|e| format!("cannot write the probe: {e}"))?;
    let output = Command::new("cc").arg("-o").arg(dir.path().join("probe")).arg(&probe).args(extra).output();
    match output {
        Err(e) => Err(format!("cannot run cc: {e}")),
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
    }
}

/// What cgo does for runc's seccomp package: `pkg-config --cflags --libs libseccomp`, then a C build with them.
pub fn check_seccomp_cgo() -> Result<(), String> {
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "libseccomp"])
        .output()
        .map_err(|e| format!("cannot run pkg-config: {e}"))?;
    if !flags.status.success() {
        return Err(String::from_utf8_lossy(&flags.stderr).trim().to_string());
    }
    let flags = String::from_utf8_lossy(&flags.stdout).to_string();
    let flags: Vec<&str> = flags.split_whitespace().collect();
    check_c_build("#include <seccomp.h>\nint main(void) { return seccomp_version() == 0; }\n", &flags)
}

/// A static C build against OpenSSL's `libssl.a` and `libcrypto.a`, as the seed's openssl-probe is built.
const STATIC_OPENSSL_C: &str =
    "#include <openssl/ssl.h>\nint main(void) { return SSL_CTX_new(TLS_client_method()) == 0; }\n";
const STATIC_OPENSSL_FLAGS: &[&str] = &["-static", "-lssl", "-lcrypto", "-lpthread"];

/// Makes the peer builds' C parts work: runc's cgo with libseccomp, pause's `gcc -static`, openssl-probe's
/// `gcc -static` against libssl.
pub fn ensure_peer_c_builds() -> Result<()> {
    let static_c = "#include <stdio.h>\nint main(void) { return puts(\"probe\") < 0; }\n";
    let mut missing = Vec::new();
    if let Err(why) = check_c_build(static_c, &["-static"]) {
        eprintln!("xtask: no static C build ({why}); Kubernetes' pause is compiled with gcc -static");
        missing.extend(["gcc", "libc6-dev"]);
    }
    if let Err(why) = check_c_build(STATIC_OPENSSL_C, STATIC_OPENSSL_FLAGS) {
        eprintln!("xtask: no static C build against OpenSSL ({why}); the seed's openssl-probe links libssl.a");
        missing.push("libssl-dev");
    }
    if let Err(why) = check_seccomp_cgo() {
        eprintln!("xtask: no libseccomp for cgo ({why}); runc is built with seccomp support");
        missing.extend(["libseccomp-dev", "pkg-config"]);
    }
    if missing.is_empty() {
        return Ok(());
    }
    apt_install(&missing)?;
    check_c_build(static_c, &["-static"]).map_err(|why| anyhow::anyhow!("still no static C build: {why}"))?;
    check_c_build(STATIC_OPENSSL_C, STATIC_OPENSSL_FLAGS)
        .map_err(|why| anyhow::anyhow!("still no static C build against OpenSSL after installing libssl-dev: {why}"))?;
    check_seccomp_cgo().map_err(|why| anyhow::anyhow!("still no libseccomp for cgo after installing it: {why}"))
}

/// Where the node's containerd looks for CNI plugins (Debian's `containernetworking-plugins` puts them there).
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// The plugins the node's CNI configuration chains.
const CNI_PLUGINS: [&str; 4] = ["bridge", "host-local", "loopback", "portmap"];

/// Runs each plugin's `VERSION` command, as the CNI library does before using one.
pub fn check_cni_plugins(dir: &Path) -> Result<(), String> {
    for plugin in CNI_PLUGINS {
        let path = dir.join(plugin);
        let output = Command::new(&path)
            .env("CNI_COMMAND", "VERSION")
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
        if !output.status.success() || !String::from_utf8_lossy(&output.stdout).contains("supportedVersions") {
            return Err(format!("{} VERSION failed: {}", path.display(), String::from_utf8_lossy(&output.stderr)));
        }
    }
    Ok(())
}

/// `iptables` and `iptables-restore` run (kube-proxy's iptables mode uses both, and `ip6tables` to probe).
fn check_iptables() -> Result<(), String> {
    for program in ["iptables", "iptables-restore", "ip6tables"] {
        match Command::new(program).arg("--version").output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => return Err(format!("{program} --version failed: {}", String::from_utf8_lossy(&o.stderr))),
            Err(e) => return Err(format!("cannot run {program}: {e}")),
        }
    }
    Ok(())
}

/// kube-router's firewall keeps a NetworkPolicy's peers in ipsets, through the `ipset` program (`ipset
/// restore`); `ipset version` talks to the kernel, so a missing kernel side fails here too.
fn check_ipset() -> Result<(), String> {
    match Command::new("ipset").arg("version").output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("ipset version failed: {}", String::from_utf8_lossy(&o.stderr))),
        Err(e) => Err(format!("cannot run ipset: {e}")),
    }
}

/// What the real node runs beside the peers: the CNI plugins, iptables, ipset, nsenter.
pub fn ensure_node_tools() -> Result<()> {
    let mut missing = Vec::new();
    if let Err(why) = check_cni_plugins(Path::new(CNI_BIN_DIR)) {
        eprintln!("xtask: the CNI plugins are missing ({why}); the test bed's node gives its pods a bridge network");
        missing.push("containernetworking-plugins");
    }
    if let Err(why) = check_iptables() {
        eprintln!("xtask: iptables is missing ({why}); the test bed's node runs kube-proxy in iptables mode");
        missing.push("iptables");
    }
    if let Err(why) = check_ipset() {
        eprintln!("xtask: ipset is missing ({why}); the node's NetworkPolicy enforcement (kube-router) needs it");
        missing.push("ipset");
    }
    if find_on_path("nsenter").is_none() {
        eprintln!("xtask: nsenter is missing; the test bed's node starts its processes in its namespaces with it");
        missing.push("util-linux");
    }
    if missing.is_empty() {
        return Ok(());
    }
    apt_install(&missing)?;
    check_cni_plugins(Path::new(CNI_BIN_DIR)).map_err(|why| anyhow::anyhow!("still no CNI plugins: {why}"))?;
    check_iptables().map_err(|why| anyhow::anyhow!("still no iptables: {why}"))?;
    check_ipset().map_err(|why| anyhow::anyhow!("still no ipset: {why}"))
}

/// Whether `program args` runs and exits 0 (a JRE whose keytool cannot start fails here, not only a missing one).
fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program).args(args).output().is_ok_and(|o| o.status.success())
}

/// ca-syncer's trust store tests read its JKS and PKCS#12 files back with the real tools Java and OpenSSL users
/// have: Java's `keytool` (Debian's `default-jre-headless`) and `openssl pkcs12` (Debian's `openssl`).
pub fn ensure_trust_store_tools() -> Result<()> {
    let mut missing = Vec::new();
    if !runs("keytool", &["-help"]) {
        eprintln!("xtask: keytool does not run; ca-syncer's tests read its JKS and PKCS#12 stores back with it");
        missing.push("default-jre-headless");
    }
    if !runs("openssl", &["pkcs12", "-help"]) {
        eprintln!("xtask: `openssl pkcs12` does not run; ca-syncer's tests read its PKCS#12 stores back with it");
        missing.push("openssl");
    }
    if missing.is_empty() {
        return Ok(());
    }
    apt_install(&missing)?;
    for (program, args) in [("keytool", &["-help"][..]), ("openssl", &["pkcs12", "-help"][..])] {
        if !runs(program, args) {
            bail!("`{program} {}` still does not run after the install", args.join(" "));
        }
    }
    Ok(())
}

/// Where Debian's libfaketime puts the library the robustness suite preloads to run an agent with its clock
/// ahead (`libfaketime` package; the suite looks in the same places).
pub const LIBFAKETIME: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
];

/// Installs libfaketime when none of [`LIBFAKETIME`] is there: etcd-snapshotter's robustness suite runs a
/// replica with its clock ahead through it.
pub fn ensure_libfaketime() -> Result<()> {
    let present = || LIBFAKETIME.iter().any(|p| Path::new(p).is_file());
    if present() {
        return Ok(());
    }
    eprintln!("xtask: libfaketime is missing (the robustness suite runs an agent with its clock ahead through it)");
    apt_install(&["libfaketime"])?;
    if !present() {
        bail!("libfaketime is still missing after the install: none of {}", LIBFAKETIME.join(", "));
    }
    Ok(())
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths).map(|dir| dir.join(program)).find(|p| p.is_file())
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The free space, in GiB, below which a full `cargo xtask test` warns first. A fresh clone with the peers cached
/// writes its target directory (debug test binaries, the images' release build), two node beds' containerd stores
/// and the tests' own data in two lanes: CI's fresh clone passed with about 16 GiB free and ran out with 11, and
/// later (the suite had grown) ran out with 18, so this keeps a margin. A full run also removes the superseded
/// builds of its test binaries first ([`crate::prune`]). A run that fills the disk fails every binary after it with
/// "No space left on device", far from the cause, so the shortfall is named first.
pub const FULL_RUN_GIB: u64 = 30;

/// The mount point and free space (GiB) of the filesystem holding `path`, from `df`, which every machine kind
/// here has.
pub fn free_gib(path: &Path) -> Result<(String, u64)> {
    let out = Command::new("df").args(["--output=target,avail", "-B1G"]).arg(path).output()?;
    parse_df(&String::from_utf8_lossy(&out.stdout))
        .ok_or_else(|| anyhow::anyhow!("df printed no free space for {}", path.display()))
}

/// The mount point and the number under `df --output=target,avail`'s header.
pub fn parse_df(text: &str) -> Option<(String, u64)> {
    let mut fields = text.lines().nth(1)?.split_whitespace();
    let mount = fields.next()?.to_string();
    let avail = fields.next()?.trim_end_matches('G').parse().ok()?;
    Some((mount, avail))
}

/// Says so before a full run when the filesystem of the target directory or of the temp directory (once, when they
/// are one) has less free space than [`FULL_RUN_GIB`]. A warning, not a refusal: an existing target directory
/// already holds much of what the run writes.
pub fn warn_on_little_disk(target: &Path) {
    let mut warned = Vec::new();
    for (what, path) in [("target directory", target.to_path_buf()), ("temp directory", std::env::temp_dir())] {
        match free_gib(&path) {
            Ok((mount, free)) if free < FULL_RUN_GIB && !warned.contains(&mount) => {
                eprintln!(
                    "xtask: warning: {free} GiB free on {mount}, which holds the {what} ({}); a full run from a fresh \
                     clone writes nearly all of it (test binaries, images, two node beds, test data): below \
                     {FULL_RUN_GIB} GiB it may fill up, and binaries then fail with 'No space left on device'. Free \
                     space first (old target directories, `cargo clean`).",
                    path.display()
                );
                warned.push(mount);
            }
            Ok(_) => {}
            Err(e) => eprintln!("xtask: warning: could not read the free space for the {what}: {e:#}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_and_free_space_are_read_from_dfs_target_and_avail_columns() {
        assert_eq!(parse_df("Mounted on Avail\n/           19G\n"), Some(("/".into(), 19)));
        assert_eq!(parse_df("Mounted on Avail\n"), None);
        assert_eq!(parse_df("Mounted on Avail\n/  n/a\n"), None);
    }

    #[test]
    fn the_free_space_of_this_machines_temp_dir_is_a_number() {
        free_gib(&std::env::temp_dir()).unwrap();
    }

    #[test]
    fn the_trust_store_tools_run_once_ensured() {
        // `cargo xtask test` installs them before ca-syncer's tests, so this must hold on every CI machine.
        assert!(runs("keytool", &["-help"]) && runs("openssl", &["pkcs12", "-help"]));
        assert!(!runs("keytool-that-does-not-exist", &["-help"]), "a missing program does not run");
    }

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
        // A child forked by another test while the copy was open for writing keeps it open, and exec then fails
        // with ETXTBSY (read here as Missing) until that child has exec'd: try again until the copy runs.
        let mut result = check_protoc(Some(&copy));
        for _ in 0..50 {
            if result != Err(ProtocGap::Missing) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
            result = check_protoc(Some(&copy));
        }
        match result {
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
    fn cargo_deny_versions_are_read_and_only_the_pinned_minor_is_taken() {
        assert_eq!(parse_cargo_deny_version("cargo-deny 0.20.2\n"), Some("0.20.2"));
        assert_eq!(parse_cargo_deny_version("cargo-deny \n"), None);
        assert_eq!(parse_cargo_deny_version("cargo-audit 0.22.2"), None);
        assert!(cargo_deny_compatible(CARGO_DENY_VERSION));
        assert!(cargo_deny_compatible("0.20.9"));
        assert!(!cargo_deny_compatible("0.14.2"), "an older cargo-deny reads another configuration format");
        assert!(!cargo_deny_compatible("0.21.0"));
    }

    #[test]
    fn buildah_versions_are_read_from_its_version_line() {
        let line = "buildah version 1.28.2 (image-spec 1.0.2-dev, runtime-spec 1.0.2-dev)\n";
        assert_eq!(parse_buildah_version(line), Some("1.28.2"));
        assert_eq!(parse_buildah_version("buildah version 1.39.0\n"), Some("1.39.0"));
        assert_eq!(parse_buildah_version("podman version 4.3.1"), None);
        assert_eq!(parse_buildah_version("buildah version \n"), None);
    }

    #[test]
    fn rootless_buildah_needs_a_subordinate_range_over_the_images_user() {
        let text = "alice:100000:65536\n1001:200000:65536\nbob:300000:1000\n";
        assert!(has_subordinate_range(text, "alice", 1000));
        assert!(has_subordinate_range(text, "carol", 1001), "by uid");
        assert!(!has_subordinate_range(text, "bob", 1002), "65532 lies outside a range of 1000");
        assert!(!has_subordinate_range(text, "dave", 1003));
        assert!(!has_subordinate_range("", "alice", 1000));
    }

    #[test]
    fn a_target_lib_dir_without_std_is_not_installed() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!has_std(&dir.path().join("missing")));
        std::fs::write(dir.path().join("libcore-0123.rlib"), "").unwrap();
        assert!(!has_std(dir.path()));
        std::fs::write(dir.path().join("libstd-0123.rlib"), "").unwrap();
        assert!(has_std(dir.path()));
    }

    #[test]
    fn the_host_target_has_its_std() {
        // The toolchain that builds this test has the host's std: the check must see it.
        let host = target_lib_dir("x86_64-unknown-linux-gnu").unwrap();
        assert!(has_std(&host), "{}", host.display());
    }

    #[test]
    fn the_node_tools_are_there_after_the_xtask_installed_them() {
        // `cargo xtask test` runs ensure_peer_c_builds and ensure_node_tools before the tests.
        assert_eq!(check_seccomp_cgo(), Ok(()));
        assert_eq!(check_cni_plugins(Path::new(CNI_BIN_DIR)), Ok(()));
        assert_eq!(check_iptables(), Ok(()));
    }

    #[test]
    fn missing_cni_plugins_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let why = check_cni_plugins(dir.path()).unwrap_err();
        assert!(why.contains("bridge"), "{why}");
    }

    #[test]
    fn a_missing_musl_compiler_is_reported() {
        let why = check_musl_cc(Path::new("/nonexistent/musl-gcc")).unwrap_err();
        assert!(why.contains("cannot run /nonexistent/musl-gcc"), "{why}");
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
