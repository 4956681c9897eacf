//! Pins and builds the real programs kcp-keeper's tests talk to.
//!
//! Every peer is built from the Go module proxy once per machine into a cache outside the checkout
//! (`$KCP_KEEPER_CACHE`, default `~/.cache/kcp-keeper`). A peer's directory only appears once its build
//! finished (it is built in a scratch directory and renamed into place), so an interrupted build is simply
//! redone and a finished one is never redone. A file lock keeps parallel callers from building twice.
//!
//! kcp cannot come from a module download (its go.mod replaces modules with in-tree directories); it is built
//! from a pinned source archive in the third-party directory ([`third_party_dir`]).

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

mod bench_peers;
pub mod buildah;
mod pins;
pub mod registry;
mod seed_peers;

pub use bench_peers::{BENCH_PEERS, ETCD_BACKUP_RESTORE, TRUST_MANAGER, ensure_bench};
pub use pins::{PAUSE_IMAGE, PEERS, Peer, Recipe, SourceArchive};
pub use seed_peers::{CERT_MANAGER_CONTROLLER, KCP_OPERATOR, SEED_PEERS};

/// Errors while building or locating peers. Messages say what to run next.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("`{command}` failed ({status}); its output is above")]
    Command { command: String, status: String },
    #[error("{0}")]
    Other(String),
    #[error("peer {name} {version} is not built yet: run `cargo xtask peers`")]
    Missing { name: String, version: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io<T>(what: impl fmt::Display, r: std::io::Result<T>) -> Result<T> {
    r.map_err(|e| Error::Io(what.to_string(), e))
}

/// The cache root shared by every checkout on this machine.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("KCP_KEEPER_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".cache").join("kcp-keeper")
}

/// Where pinned upstream archives live: `$KCP_KEEPER_THIRD_PARTY`, by default `../shared/third_party` beside the
/// checkout (where this project's CI keeps them).
pub fn third_party_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KCP_KEEPER_THIRD_PARTY") {
        return PathBuf::from(dir);
    }
    // CARGO_MANIFEST_DIR is <checkout>/tests/peers.
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let checkout = checkout.canonicalize().unwrap_or(checkout);
    checkout.parent().unwrap_or(&checkout).join("shared").join("third_party")
}

fn peers_dir() -> PathBuf {
    cache_root().join("peers")
}

/// One built artefact: a binary or a directory of CRD manifests.
#[derive(Debug, Clone)]
pub struct Artefact {
    pub name: &'static str,
    pub version: &'static str,
    pub path: PathBuf,
}

impl fmt::Display for Artefact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.name, self.version, self.path.display())
    }
}

/// Paths of every peer, as the test bed needs them.
#[derive(Debug, Clone)]
pub struct Peers {
    pub artefacts: Vec<Artefact>,
}

impl Peers {
    /// Path of the artefact with this name (`kube-apiserver`, `etcd`, `cert-manager-crds`, ...).
    pub fn path(&self, name: &str) -> &Path {
        &self.artefacts.iter().find(|a| a.name == name).unwrap_or_else(|| panic!("no peer artefact named {name}")).path
    }
}

impl Peer {
    fn dir(&self) -> PathBuf {
        peers_dir().join(format!("{}-{}", self.name, self.version))
    }

    fn artefacts(&self) -> Vec<Artefact> {
        self.outputs
            .iter()
            .map(|out| Artefact { name: out, version: self.version, path: self.dir().join(out) })
            .collect()
    }

    fn is_built(&self) -> bool {
        self.artefacts().iter().all(|a| a.path.exists())
    }
}

/// Paths of every peer, failing with a hint when one is not built.
pub fn locate() -> Result<Peers> {
    let mut artefacts = Vec::new();
    for peer in PEERS {
        if !peer.is_built() {
            return Err(Error::Missing { name: peer.name.into(), version: peer.version.into() });
        }
        artefacts.extend(peer.artefacts());
    }
    Ok(Peers { artefacts })
}

/// Paths of the named artefacts only, for a bed that needs a few peers (kcp's needs etcd and kcp, not helm);
/// the seed layout's peers ([`SEED_PEERS`]) are found here too.
pub fn locate_only(names: &[&str]) -> Result<Peers> {
    let mut artefacts = Vec::new();
    for name in names {
        let peer = PEERS
            .iter()
            .chain(SEED_PEERS)
            .find(|p| p.outputs.contains(name))
            .ok_or_else(|| Error::Other(format!("no peer builds an artefact named {name}")))?;
        let artefact = peer.artefacts().into_iter().find(|a| a.name == *name).expect("listed in outputs");
        if !artefact.path.exists() {
            return Err(Error::Missing { name: peer.name.into(), version: peer.version.into() });
        }
        artefacts.push(artefact);
    }
    Ok(Peers { artefacts })
}

/// Builds every missing peer, the seed layout's included (printing progress to stderr), and returns all paths.
pub fn ensure_all() -> Result<Peers> {
    for peer in PEERS.iter().chain(SEED_PEERS) {
        if peer.is_built() {
            continue;
        }
        let lock = lock_peer(&peers_dir(), peer.name, peer.version)?;
        // Another caller may have built it while this one waited for the lock.
        if !peer.is_built() {
            eprintln!("peers: building {} {} ({}; first time only)", peer.name, peer.version, peer.expected_time);
            let started = Instant::now();
            build(peer)?;
            eprintln!("peers: built {} {} in {:.0?}", peer.name, peer.version, started.elapsed());
        }
        drop(lock);
    }
    let mut peers = locate()?;
    peers.artefacts.extend(SEED_PEERS.iter().flat_map(Peer::artefacts));
    Ok(peers)
}

/// Creates the cache directory, takes the peer's lock (waiting for another build of it to finish) and clears what
/// a killed build of it left behind: under the lock no other build of this peer is running, so its scratch dirs
/// are stale. One lock per peer, so two callers needing different peers build them side by side. Other builds
/// cached beside the peers (the test bed's control-plane template) lock the same way, their scratch dirs named
/// `.build-<name>-<pid>` in `dir`.
pub fn lock_peer(dir: &Path, name: &str, version: &str) -> Result<fs::File> {
    fs::create_dir_all(dir).map_err(|e| {
        Error::Other(format!(
            "cannot create the peer cache {}: {e}; set KCP_KEEPER_CACHE to a writable directory",
            dir.display()
        ))
    })?;
    let lock_path = dir.join(format!(".lock-{name}-{version}"));
    let lock = fs::File::create(&lock_path).map_err(|e| {
        Error::Other(format!(
            "cannot write in the peer cache {}: {e}; set KCP_KEEPER_CACHE to a writable directory",
            dir.display()
        ))
    })?;
    if lock.try_lock().is_err() {
        eprintln!("peers: another build of {name} {version} holds {}, waiting", lock_path.display());
        io("locking the peer cache", lock.lock())?;
    }
    let stale = format!(".build-{name}-");
    for entry in io(dir.display(), fs::read_dir(dir))? {
        let entry = io(dir.display(), entry)?;
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = file_name.strip_prefix(&stale) else { continue };
        // A builder that locks differently (an older checkout's single cache lock) may be running: only a dir
        // whose builder process is gone is stale.
        if pid.parse::<u32>().is_ok_and(|pid| pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists())
        {
            eprintln!("peers: {} belongs to running process {pid}; leaving it", entry.path().display());
            continue;
        }
        eprintln!("peers: removing {}, left by an interrupted build", entry.path().display());
        io("removing an interrupted build", fs::remove_dir_all(entry.path()))?;
    }
    Ok(lock)
}

fn build(peer: &Peer) -> Result<()> {
    let scratch = peers_dir().join(format!(".build-{}-{}", peer.name, std::process::id()));
    if scratch.exists() {
        io("clearing a stale build dir", fs::remove_dir_all(&scratch))?;
    }
    io("creating a build dir", fs::create_dir_all(&scratch))?;
    let out = scratch.join("out");
    io("creating the output dir", fs::create_dir_all(&out))?;
    match &peer.recipe {
        Recipe::GoInstall { packages, cgo, tags } => {
            let mut cmd = go(&scratch);
            cmd.env("GOBIN", &out).arg("install").arg("-trimpath");
            if *cgo {
                cmd.env("CGO_ENABLED", "1");
            }
            if !tags.is_empty() {
                cmd.args(["-tags", tags]);
            }
            for package in *packages {
                eprintln!("peers: go install {package}@{}", peer.version);
                cmd.arg(format!("{package}@{}", peer.version));
            }
            run(cmd)?;
        }
        Recipe::Wrapper { go_mod, builds, ldflags } => {
            let module = scratch.join("module");
            io("creating the wrapper module", fs::create_dir_all(&module))?;
            io("writing go.mod", fs::write(module.join("go.mod"), go_mod(peer.version)?))?;
            for (binary, package) in *builds {
                eprintln!("peers: go build {package}");
                let mut cmd = go(&module);
                // -mod=mod lets `go build` fill go.sum for the wrapper module from the proxy.
                cmd.env("GOFLAGS", "-mod=mod -buildvcs=false")
                    .args(["build", "-trimpath", "-ldflags", &ldflags(peer.version), "-o"])
                    .arg(out.join(binary))
                    .arg(package);
                run(cmd)?;
            }
        }
        Recipe::ModuleFiles { module, subdir, output } => {
            let dir = module_dir(module, peer.version)?;
            copy_dir(&dir.join(subdir), &out.join(output))?;
        }
        Recipe::Source { source, builds } => {
            let tree = source_tree(source, &third_party_dir(), &scratch)?;
            let go_mod = io("reading the source's go.mod", fs::read_to_string(tree.join("go.mod")))?;
            let ldflags = (source.ldflags)(source, &go_mod);
            for (binary, package) in *builds {
                eprintln!("peers: go build {package}");
                let mut cmd = go(&tree);
                if source.vendored {
                    // Everything from the tree's vendor/; no module proxy is asked.
                    cmd.env("GOFLAGS", "-mod=vendor -buildvcs=false").env("GOPROXY", "off");
                }
                cmd.args(["build", "-trimpath", "-ldflags", &ldflags, "-o"]).arg(out.join(binary)).arg(package);
                run(cmd)?;
            }
        }
        Recipe::SourceModule { source, module, replaces, builds, files } => {
            let tree = source_tree(source, &third_party_dir(), &scratch)?;
            let module_dir = tree.join(module);
            for (replaced, archive) in *replaces {
                let replacement = source_tree(archive, &third_party_dir(), &scratch)?;
                eprintln!("peers: go mod edit -replace {replaced}={}", replacement.display());
                let mut edit = go(&module_dir);
                edit.arg("mod").arg("edit").arg(format!("-replace={replaced}={}", replacement.display()));
                run(edit)?;
            }
            let go_mod = io("reading the module's go.mod", fs::read_to_string(module_dir.join("go.mod")))?;
            let ldflags = (source.ldflags)(source, &go_mod);
            for (binary, package) in *builds {
                eprintln!("peers: go build {package} in {module}");
                let mut cmd = go(&module_dir);
                cmd.env("GOFLAGS", "-mod=mod -buildvcs=false")
                    .args(["build", "-trimpath", "-ldflags", &ldflags, "-o"])
                    .arg(out.join(binary))
                    .arg(package);
                run(cmd)?;
            }
            for (from, output) in *files {
                copy_dir(&tree.join(from), &out.join(output))?;
            }
        }
        Recipe::Program { go_mod, main_go, output } => {
            let module = scratch.join("module");
            io("creating the program's module", fs::create_dir_all(&module))?;
            io("writing go.mod", fs::write(module.join("go.mod"), go_mod(peer.version)?))?;
            io("writing main.go", fs::write(module.join("main.go"), main_go))?;
            eprintln!("peers: go build {output}");
            let mut cmd = go(&module);
            cmd.env("GOFLAGS", "-mod=mod -buildvcs=false")
                .args(["build", "-trimpath", "-o"])
                .arg(out.join(output))
                .arg(".");
            run(cmd)?;
        }
        Recipe::StaticC { main_c, output, libs } => {
            let source = scratch.join("main.c");
            io("writing main.c", fs::write(&source, main_c))?;
            eprintln!("peers: gcc -static {output}");
            let mut gcc = Command::new("gcc");
            gcc.args(["-O2", "-Wall", "-Werror", "-static", "-o"]).arg(out.join(output)).arg(&source);
            gcc.args(libs.iter().map(|l| format!("-l{l}")));
            run(gcc).map_err(|e| {
                Error::Other(format!("{e} (gcc -static needs gcc, libc6-dev and the libraries' -dev packages)"))
            })?;
        }
        Recipe::Pause { kubernetes } => {
            let source = module_dir("k8s.io/kubernetes", kubernetes)?.join("build/pause");
            build_pause(&source, peer.version, kubernetes, &scratch, &out)?;
        }
    }
    let dest = peer.dir();
    if dest.exists() {
        io("replacing an incomplete peer dir", fs::remove_dir_all(&dest))?;
    }
    io("moving the peer into place", fs::rename(&out, &dest))?;
    io("removing the build dir", fs::remove_dir_all(&scratch))?;
    Ok(())
}

/// `pause` compiled as Kubernetes' `build/pause/Makefile` compiles it (`-Os -Wall -Werror -static
/// -DVERSION=v<tag>-<rev>`, the revision being the Kubernetes release here, as the Makefile's is `git describe`), then `pause.tar`: a docker-archive image of it under [`PAUSE_IMAGE`], written here
/// (a layer tar, its config and `manifest.json`), so no container tool is needed to make it.
fn build_pause(source: &Path, version: &str, rev: &str, scratch: &Path, out: &Path) -> Result<()> {
    let makefile = io("reading build/pause/Makefile", fs::read_to_string(source.join("Makefile")))?;
    let tag = makefile.lines().find_map(|l| l.strip_prefix("TAG ?=")).map(str::trim);
    if tag != Some(version) {
        return Err(Error::Other(format!(
            "build/pause/Makefile says TAG ?= {}, the pin says {version}: update PAUSE in pins.rs",
            tag.unwrap_or("(none)")
        )));
    }
    let rootfs = scratch.join("rootfs");
    io("creating the pause rootfs", fs::create_dir_all(&rootfs))?;
    eprintln!("peers: gcc -static build/pause/linux/pause.c");
    let mut gcc = Command::new("gcc");
    gcc.args(["-Os", "-Wall", "-Werror", "-static"])
        .arg(format!("-DVERSION=v{version}-{rev}"))
        .arg("-o")
        .arg(rootfs.join("pause"))
        .arg(source.join("linux/pause.c"));
    run(gcc).map_err(|e| Error::Other(format!("{e} (gcc -static needs a C compiler and libc6-dev)")))?;
    io("copying pause", fs::copy(rootfs.join("pause"), out.join("pause")))?;

    let image = scratch.join("image");
    io("creating the image dir", fs::create_dir_all(&image))?;
    let mut layer = Command::new("tar");
    layer
        .args(["--owner=0", "--group=0", "--numeric-owner", "--mtime=@0", "-cf"])
        .arg(image.join("layer.tar"))
        .arg("-C")
        .arg(&rootfs)
        .arg("pause");
    run(layer)?;
    let layer_sha = sha256_file(&image.join("layer.tar"))?;
    let layer_dir = image.join(&layer_sha);
    io("creating the layer dir", fs::create_dir_all(&layer_dir))?;
    io("moving the layer", fs::rename(image.join("layer.tar"), layer_dir.join("layer.tar")))?;
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        // 65535 is the user Kubernetes' own pause image runs as.
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_sha}")]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": format!("gcc -static build/pause/linux/pause.c (v{version}-{rev})")}],
    });
    let config = config.to_string();
    let config_sha = sha256_bytes(config.as_bytes());
    let config_name = format!("{config_sha}.json");
    io("writing the image config", fs::write(image.join(&config_name), &config))?;
    let manifest = serde_json::json!([{
        "Config": config_name,
        "RepoTags": [PAUSE_IMAGE],
        "Layers": [format!("{layer_sha}/layer.tar")],
    }]);
    io("writing manifest.json", fs::write(image.join("manifest.json"), manifest.to_string()))?;
    let mut archive = Command::new("tar");
    archive
        .args(["--owner=0", "--group=0", "--numeric-owner", "--mtime=@0", "-cf"])
        .arg(out.join("pause.tar"))
        .arg("-C")
        .arg(&image)
        .args(["manifest.json", &config_name, &format!("{layer_sha}/layer.tar")]);
    run(archive)
}

fn sha256_bytes(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The pinned source tree unpacked (or cloned) under `scratch`, after checking it is the pinned one.
fn source_tree(source: &SourceArchive, third_party: &Path, scratch: &Path) -> Result<PathBuf> {
    let archive = third_party.join(source.archive);
    if archive.exists() {
        eprintln!("peers: checking {}", archive.display());
        let actual = sha256_file(&archive)?;
        if actual != source.sha256 {
            return Err(Error::Other(format!(
                "{} has sha256 {actual}, the pin says {}: refusing to build it",
                archive.display(),
                source.sha256
            )));
        }
        let mut tar = Command::new("tar");
        tar.arg("-xzf").arg(&archive).arg("-C").arg(scratch);
        run(tar)?;
        let tree = scratch.join(source.prefix);
        if !tree.join("go.mod").exists() {
            return Err(Error::Other(format!("{} did not unpack into {}/", archive.display(), source.prefix)));
        }
        return Ok(tree);
    }
    // Without the archive, the tag from git; a tag can be moved, so the commit is checked too.
    eprintln!(
        "peers: {} not found (set KCP_KEEPER_THIRD_PARTY); cloning {} {}",
        archive.display(),
        source.git_url,
        source.tag
    );
    let tree = scratch.join(source.prefix);
    let mut clone = Command::new("git");
    clone.args(["clone", "--quiet", "--depth=1", "--branch", source.tag, source.git_url]).arg(&tree);
    run(clone)?;
    let head = Command::new("git")
        .arg("-C")
        .arg(&tree)
        .args(["rev-parse", "HEAD^{commit}"])
        .output()
        .map_err(|e| Error::Io("starting git rev-parse".into(), e))?;
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    if head != source.commit {
        return Err(Error::Other(format!(
            "{} {} is commit {head}, the pin says {}: refusing to build it",
            source.git_url, source.tag, source.commit
        )));
    }
    Ok(tree)
}

/// Hex sha256 of a file, streamed (the kcp archive is tens of MiB).
fn sha256_file(path: &Path) -> Result<String> {
    use sha2::Digest;
    let mut file = io(path.display(), fs::File::open(path))?;
    let mut hasher = sha2::Sha256::new();
    io(path.display(), std::io::copy(&mut file, &mut hasher))?;
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A `go` command with the settings every peer build shares: static binaries, no toolchain switching.
fn go(dir: &Path) -> Command {
    let mut cmd = Command::new("go");
    cmd.current_dir(dir).env("CGO_ENABLED", "0").env("GOTOOLCHAIN", "local").env("GOFLAGS", "-buildvcs=false");
    cmd
}

fn run(mut cmd: Command) -> Result<()> {
    let command = format!("{cmd:?}");
    let status = cmd.status().map_err(|e| Error::Io(format!("starting {command}"), e))?;
    if !status.success() {
        return Err(Error::Command { command, status: status.to_string() });
    }
    Ok(())
}

/// Asks the module proxy for a module version (`go mod download -json`) and returns one field of the answer.
fn download_field(module: &str, version: &str, field: &str) -> Result<PathBuf> {
    let output = go(&std::env::temp_dir())
        .args(["mod", "download", "-json", &format!("{module}@{version}")])
        .output()
        .map_err(|e| Error::Io("starting go mod download".into(), e))?;
    let what = format!("go mod download {module}@{version}");
    let info: serde_json::Value =
        serde_json::from_slice(&output.stdout).map_err(|e| Error::Other(format!("{what}: unreadable output: {e}")))?;
    if let Some(err) = info.get("Error").and_then(|e| e.as_str()) {
        return Err(Error::Other(format!("{what}: {err}")));
    }
    info.get(field)
        .and_then(|d| d.as_str())
        .map(PathBuf::from)
        .ok_or_else(|| Error::Other(format!("{what}: no {field} in its answer")))
}

/// The extracted source directory of a module version.
pub fn module_dir(module: &str, version: &str) -> Result<PathBuf> {
    download_field(module, version, "Dir")
}

/// A module version's go.mod as the proxy serves it.
pub fn module_go_mod(module: &str, version: &str) -> Result<String> {
    let path = download_field(module, version, "GoMod")?;
    io(path.display(), fs::read_to_string(&path))
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    io(to.display(), fs::create_dir_all(to))?;
    for entry in io(from.display(), fs::read_dir(from))? {
        let entry = io(from.display(), entry)?;
        let target = to.join(entry.file_name());
        if io(entry.path().display(), entry.file_type())?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            io(target.display(), fs::copy(entry.path(), &target))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive_with_go_mod(dir: &Path) -> (PathBuf, String) {
        let tree = dir.join("src").join("demo-v1");
        fs::create_dir_all(&tree).unwrap();
        fs::write(tree.join("go.mod"), "module demo\n").unwrap();
        let archive = dir.join("third_party").join("demo.tar.gz");
        fs::create_dir_all(archive.parent().unwrap()).unwrap();
        let mut tar = Command::new("tar");
        tar.arg("-czf").arg(&archive).arg("-C").arg(dir.join("src")).arg("demo-v1");
        run(tar).unwrap();
        let sha = sha256_file(&archive).unwrap();
        (archive, sha)
    }

    fn source(sha256: &'static str) -> SourceArchive {
        SourceArchive {
            archive: "demo.tar.gz",
            sha256,
            prefix: "demo-v1",
            git_url: "https://git.invalid/demo.git",
            tag: "v1",
            commit: "0000000000000000000000000000000000000000",
            ldflags: |_, _| String::new(),
            vendored: false,
        }
    }

    #[test]
    fn source_archive_with_the_pinned_sha256_is_unpacked() {
        let dir = tempfile::tempdir().unwrap();
        let (archive, sha) = archive_with_go_mod(dir.path());
        let scratch = dir.path().join("scratch");
        fs::create_dir_all(&scratch).unwrap();
        let sha: &'static str = Box::leak(sha.into_boxed_str());
        let tree = source_tree(&source(sha), archive.parent().unwrap(), &scratch).unwrap();
        assert_eq!(fs::read_to_string(tree.join("go.mod")).unwrap(), "module demo\n");
    }

    #[test]
    fn source_archive_with_another_sha256_is_refused_before_unpacking() {
        let dir = tempfile::tempdir().unwrap();
        let (archive, _) = archive_with_go_mod(dir.path());
        let scratch = dir.path().join("scratch");
        fs::create_dir_all(&scratch).unwrap();
        let wrong = "0000000000000000000000000000000000000000000000000000000000000000";
        let err = source_tree(&source(wrong), archive.parent().unwrap(), &scratch).unwrap_err().to_string();
        assert!(err.contains("refusing to build it") && err.contains(wrong), "{err}");
        assert_eq!(fs::read_dir(&scratch).unwrap().count(), 0, "nothing was unpacked");
    }

    #[test]
    fn pause_is_a_static_binary_in_a_docker_archive_under_the_pinned_name() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("pause");
        fs::create_dir_all(source.join("linux")).unwrap();
        fs::write(source.join("Makefile"), "TAG ?= 9.9\nREV = $(shell git describe)\n").unwrap();
        fs::write(
            source.join("linux/pause.c"),
            "#include <stdio.h>\n#define S(x) #x\n#define V(x) S(x)\nint main(void) { return puts(V(VERSION)) < 0; }\n",
        )
        .unwrap();
        let (scratch, out) = (dir.path().join("scratch"), dir.path().join("out"));
        fs::create_dir_all(&scratch).unwrap();
        fs::create_dir_all(&out).unwrap();
        let err = build_pause(&source, "9.8", "v1.0.0", &scratch, &out).unwrap_err().to_string();
        assert!(err.contains("TAG ?= 9.9") && err.contains("9.8"), "{err}");
        build_pause(&source, "9.9", "v1.0.0", &scratch, &out).unwrap();
        let printed = Command::new(out.join("pause")).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&printed.stdout), "v9.9-v1.0.0\n");
        let listing = Command::new("tar").arg("-tf").arg(out.join("pause.tar")).output().unwrap();
        let listing = String::from_utf8_lossy(&listing.stdout);
        assert!(listing.lines().any(|l| l == "manifest.json") && listing.contains("/layer.tar"), "{listing}");
        let manifest =
            Command::new("tar").arg("-xOf").arg(out.join("pause.tar")).arg("manifest.json").output().unwrap();
        let manifest: serde_json::Value = serde_json::from_slice(&manifest.stdout).unwrap();
        assert_eq!(manifest[0]["RepoTags"][0], PAUSE_IMAGE);
    }

    #[test]
    fn the_pause_image_name_carries_the_pinned_version() {
        assert!(PAUSE_IMAGE.ends_with(&format!(":{}", pins::PAUSE)), "{PAUSE_IMAGE}");
    }

    #[test]
    fn an_unwritable_cache_is_reported_with_the_way_out() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        fs::write(&file, "").unwrap();
        let err = lock_peer(&file.join("peers"), "etcd", "v1").unwrap_err().to_string();
        assert!(err.contains("cannot create the peer cache") && err.contains("KCP_KEEPER_CACHE"), "{err}");
    }

    #[test]
    fn a_killed_build_leaves_nothing_behind_for_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        // No process has a PID this large (pid_max is at most 2^22).
        let stale = dir.path().join(".build-kubernetes-99999999").join("out");
        fs::create_dir_all(&stale).unwrap();
        fs::write(stale.join("kube-apiserver"), "half").unwrap();
        let finished = dir.path().join("etcd-v3.6.16");
        fs::create_dir_all(&finished).unwrap();
        let other = dir.path().join(".build-kcp-99999998");
        fs::create_dir_all(&other).unwrap();
        let _lock = lock_peer(dir.path(), "kubernetes", "v1.37.2").unwrap();
        assert!(!dir.path().join(".build-kubernetes-99999999").exists(), "the stale build dir is still there");
        assert!(finished.exists(), "a finished peer was removed");
        assert!(other.exists(), "another peer's build (maybe running) was removed");
        let running = dir.path().join(format!(".build-kubernetes-{}", std::os::unix::process::parent_id()));
        fs::create_dir_all(&running).unwrap();
        drop(_lock);
        let _lock = lock_peer(dir.path(), "kubernetes", "v1.37.2").unwrap();
        assert!(running.exists(), "the build dir of a running process was removed");
    }
}
