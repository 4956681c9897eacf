//! `cargo xtask images`: the agents' container images, built without a container engine.
//!
//! Each image is `FROM scratch` with one static (musl) binary, plus `etcd` and `etcdutl` for the snapshotter
//! (its drills and restores run them) and Debian's public CA bundle (its S3 client's roots). The binaries are built first, staged into a small build context under
//! `target/images/<agent>/` (the Dockerfiles COPY from there; the checkout never becomes a build context), and
//! built with buildah: `--isolation chroot` and the vfs driver work as root with no daemon, no overlay and no
//! runtime; the storage lives in the machine cache beside the peers, so it survives fresh clones and never
//! fills the checkout. Every image is then proven: its OCI labels read back, `--version` run inside it as its
//! own non-root user, and its size printed.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

use crate::prereqs::{self, MUSL_TARGET};

/// The agents, each with its image directory `images/<agent>/` and its binary of the same name, and the
/// `kcp-keeper` tool, whose image runs `kcp-keeper doctor --serve` in the cluster (the chart's `doctor`).
pub const AGENTS: [&str; 5] = ["ca-syncer", "dns-rewriter", "kubeconfig-rotator", "etcd-snapshotter", "kcp-keeper"];

/// Peer binaries the snapshotter's image carries.
const SNAPSHOTTER_PEERS: [&str; 2] = ["etcd", "etcdutl"];

/// Where the chart pulls the agents from (`image.registry` in the chart's values): the local tags match it.
pub const REGISTRY: &str = peers::registry::PUBLIC;

const SOURCE: &str = "https://github.com/kcp-keeper/kcp-keeper";

/// The user every image runs as (the distroless `nonroot` ids): numeric, so no /etc/passwd is needed.
pub const USER: &str = "65532:65532";

pub(crate) fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// `cargo xtask images`: builds, checks and sizes every agent image, then publishes them and the chart to the
/// test bed's registry (`publish::to_bed`), which the bed's nodes pull from.
pub fn images() -> Result<()> {
    build()?;
    crate::step_with("publish the images and the chart to the test bed's registry", crate::publish::to_bed)
}

/// A source tree images are built from: the working tree, or a release's tree (`release::previous`).
#[derive(Debug, Clone)]
pub struct Source {
    pub root: PathBuf,
    /// The commit (the `revision` label).
    pub revision: String,
    /// The commit's time in seconds since the epoch (the images' `created`).
    pub created: String,
}

impl Source {
    /// The checkout this xtask runs from, at its HEAD.
    pub fn working_tree() -> Result<Self> {
        let root = workspace_root();
        Ok(Self { revision: git_revision(&root)?, created: git_commit_time(&root, "HEAD")?, root })
    }
}

/// Builds, checks and sizes every agent image of the working tree, into buildah's local storage.
pub fn build() -> Result<()> {
    build_tree(&Source::working_tree()?)
}

/// Builds, checks and sizes every agent image of `source`, into buildah's local storage.
pub fn build_tree(source: &Source) -> Result<()> {
    let started = Instant::now();
    let root = source.root.clone();
    prereqs::ensure_protoc()?;
    prereqs::ensure_musl_target()?;
    prereqs::ensure_musl_cc()?;
    let buildah_version = prereqs::ensure_buildah()?;
    let ca_bundle = prereqs::ensure_ca_bundle()?;
    prereqs::check_rootless_buildah()?;
    let peers = crate::ensure_peers()?;
    let version = lockstep_version(&root)?;
    let (revision, created) = (source.revision.clone(), source.created.clone());
    eprintln!(
        "xtask: images {version} at {revision}, buildah {buildah_version}, storage {}",
        peers::buildah::AGENTS.root().display()
    );

    // The static build has its own target directory in the machine cache: a clean clone (CI) then rebuilds
    // only the workspace crates, not every dependency for a second target and profile.
    let target_dir = build_dir();
    let mut build = crate::cargo(&["build", "--release", "--locked", "--target", MUSL_TARGET, "--bins"]);
    build.arg("--manifest-path").arg(root.join("Cargo.toml"));
    build.arg("--target-dir").arg(&target_dir);
    for agent in AGENTS {
        build.args(["--package", agent]);
    }
    // Only the shipped binaries lose their symbols; the release profile others build with stays as it is.
    build.env("CARGO_PROFILE_RELEASE_STRIP", "symbols");
    // cargo's JSON messages name every crate compiled for the target: the SBOM check reads them.
    let messages = root.join("target").join("images").join("static-build.json");
    std::fs::create_dir_all(root.join("target").join("images"))?;
    build.arg("--message-format=json-render-diagnostics").stdout(File::create(&messages)?);
    crate::step("static agent binaries", build)?;
    crate::supply_chain::sbom_step(&root, &messages)?;

    let binaries = target_dir.join(MUSL_TARGET).join("release");
    let mut sizes = Vec::new();
    for agent in AGENTS {
        let mut files = vec![binaries.join(agent)];
        if agent == "etcd-snapshotter" {
            files.extend(SNAPSHOTTER_PEERS.iter().map(|name| peers.path(name).to_path_buf()));
        }
        for file in &files {
            ensure!(
                is_static_elf(file)?,
                "{} is dynamically linked: a FROM scratch image has no loader for it",
                file.display()
            );
        }
        if agent == "etcd-snapshotter" {
            files.push(ca_bundle.clone());
        }
        let context = stage_context(&root.join("target").join("images").join(agent), &files)?;
        let tag = image_tag(agent, &version);
        let mut bud = buildah(&["build", "--isolation", "chroot"]);
        bud.arg("--file").arg(root.join("images").join(agent).join("Dockerfile"));
        bud.args(["--build-arg", &format!("VERSION={version}"), "--build-arg", &format!("REVISION={revision}")]);
        // Created at the commit's time, so the same tree builds the same image (a publish compares them).
        bud.args(["--timestamp", &created, "--tag", &tag]).arg(&context);
        crate::step(&format!("image {tag}"), bud)?;

        let facts = inspect(&tag)?;
        check_facts(&tag, &facts, &expected_labels(agent, &version, &revision))?;
        let mut commands = vec![(format!("/{agent}"), vec!["--version"], format!("{agent} {version} "))];
        if agent == "etcd-snapshotter" {
            let etcd_version = peers.artefacts.iter().find(|a| a.name == "etcd").expect("etcd is a peer").version;
            let bare = etcd_version.trim_start_matches('v');
            commands.push(("/etcd".into(), vec!["--version"], format!("etcd Version: {bare}")));
            commands.push(("/etcdutl".into(), vec!["version"], format!("etcdutl version: {bare}")));
        }
        if agent == "etcd-snapshotter" {
            check_ca_bundle_inside(&tag, &ca_bundle)?;
        }
        for (program, args, expected) in commands {
            let out = run_inside(&tag, &program, &args)?;
            ensure!(
                out.lines().next().is_some_and(|l| l.starts_with(&expected)),
                "`{program} {}` inside {tag} printed {out:?}, expected a first line starting with {expected:?}",
                args.join(" ")
            );
            eprintln!("xtask: {tag}: {program} {} -> {}", args.join(" "), out.lines().next().unwrap_or(""));
        }
        sizes.push((tag, facts.size));
    }
    // Rebuilding moves a tag to a new image; the old one would stay in vfs storage (a full copy per layer).
    let mut prune = buildah(&["rmi", "--prune"]);
    prune.stdout(std::process::Stdio::null());
    crate::step("remove untagged images", prune)?;
    for (tag, size) in &sizes {
        println!("{tag} {}", human_size(*size));
    }
    eprintln!("xtask: images built and checked in {:.0?}", started.elapsed());
    Ok(())
}

/// Where the static binaries are built: under the machine cache, shared by every checkout.
fn build_dir() -> PathBuf {
    peers::cache_root().join("images-target")
}

fn buildah(args: &[&str]) -> Command {
    peers::buildah::AGENTS.command(args)
}

/// Runs buildah and returns its stdout, failing with its stderr.
fn buildah_output(args: &[&str]) -> Result<String> {
    Ok(peers::buildah::AGENTS.output(args)?)
}

/// `<registry>/<agent>:<version>`, the reference the chart's defaults resolve to.
pub fn image_tag(agent: &str, version: &str) -> String {
    format!("{REGISTRY}/{agent}:{version}")
}

/// The OCI annotations every image carries.
pub fn expected_labels(agent: &str, version: &str, revision: &str) -> BTreeMap<String, String> {
    [
        ("org.opencontainers.image.title", agent),
        ("org.opencontainers.image.source", SOURCE),
        ("org.opencontainers.image.version", version),
        ("org.opencontainers.image.revision", revision),
        ("org.opencontainers.image.licenses", "Apache-2.0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// What `buildah inspect` says about an image, as far as the checks need it.
#[derive(Debug, PartialEq, Eq)]
pub struct ImageFacts {
    pub user: String,
    pub labels: BTreeMap<String, String>,
    /// Config plus layers, as the manifest in local storage records them.
    pub size: u64,
}

fn inspect(tag: &str) -> Result<ImageFacts> {
    let json = buildah_output(&["inspect", "--type", "image", tag])?;
    parse_inspect(&json).with_context(|| format!("reading `buildah inspect` of {tag}"))
}

/// Reads `buildah inspect --type image` output (its `OCIv1` config and its `Manifest`, a JSON string).
pub fn parse_inspect(json: &str) -> Result<ImageFacts> {
    let inspect: serde_json::Value = serde_json::from_str(json.trim())?;
    let config = &inspect["OCIv1"]["config"];
    let user = config["User"].as_str().unwrap_or_default().to_string();
    let labels = match config.get("Labels") {
        None | Some(serde_json::Value::Null) => BTreeMap::new(),
        Some(labels) => serde_json::from_value(labels.clone()).context("labels that are not strings")?,
    };
    let manifest = inspect["Manifest"].as_str().context("no manifest")?;
    Ok(ImageFacts { user, labels, size: manifest_size(manifest)? })
}

/// The image runs as the numeric non-root user (a name would need an /etc/passwd the image lacks) and carries
/// every expected label.
pub fn check_facts(tag: &str, facts: &ImageFacts, labels: &BTreeMap<String, String>) -> Result<()> {
    ensure!(facts.user == USER, "{tag} runs as {:?}, expected {USER}", facts.user);
    for (key, value) in labels {
        ensure!(
            facts.labels.get(key) == Some(value),
            "{tag} has {key}={:?}, expected {value:?}",
            facts.labels.get(key)
        );
    }
    Ok(())
}

/// Runs a program inside a working container of the image (as the image's user) and returns its stdout.
fn run_inside(tag: &str, program: &str, args: &[&str]) -> Result<String> {
    let container = buildah_output(&["from", "--pull=never", tag])?.trim().to_string();
    let mut run = vec!["run", "--isolation", "chroot", container.as_str(), "--", program];
    run.extend(args);
    let out = buildah_output(&run);
    // The working container is a full vfs copy of the image: never leave it behind, even on failure.
    let removed = buildah_output(&["rm", &container]);
    let out = out?;
    removed?;
    Ok(out)
}

/// The CA bundle in the image is the one staged, byte for byte: read back from a mounted working container.
/// Mounting needs root (rootless buildah would need `buildah unshare`); without it the check is skipped, said.
fn check_ca_bundle_inside(tag: &str, staged: &Path) -> Result<()> {
    if !prereqs::is_root() {
        eprintln!("xtask: {tag}: not root, so the CA bundle inside is not read back (the build COPYed it)");
        return Ok(());
    }
    let container = buildah_output(&["from", "--pull=never", tag])?.trim().to_string();
    let inside = buildah_output(&["mount", &container]).and_then(|mount| {
        let path = Path::new(mount.trim()).join(prereqs::CA_BUNDLE.trim_start_matches('/'));
        std::fs::read(&path).with_context(|| format!("reading {} inside {tag}", prereqs::CA_BUNDLE))
    });
    let removed = buildah_output(&["rm", &container]);
    let inside = inside?;
    removed?;
    let staged = std::fs::read(staged).with_context(|| format!("reading {}", staged.display()))?;
    ensure!(inside == staged, "{} inside {tag} differs from the staged bundle", prereqs::CA_BUNDLE);
    let count = prereqs::certificate_count(&String::from_utf8_lossy(&inside));
    eprintln!("xtask: {tag}: {} holds {count} public CA certificates", prereqs::CA_BUNDLE);
    Ok(())
}

/// Sum of the config's and every layer's `size` in an OCI image manifest.
pub fn manifest_size(manifest: &str) -> Result<u64> {
    let manifest: serde_json::Value = serde_json::from_str(manifest.trim())?;
    let size = |d: &serde_json::Value| d.get("size").and_then(serde_json::Value::as_u64);
    let config = manifest.get("config").and_then(size).context("the manifest has no config size")?;
    let layers = manifest.get("layers").and_then(serde_json::Value::as_array).context("the manifest has no layers")?;
    layers.iter().try_fold(config, |sum, layer| Ok(sum + size(layer).context("a layer without a size")?))
}

/// `12345678` → `11.8 MiB`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// Whether an ELF file needs no dynamic loader (it has no PT_INTERP program header): the only kind a
/// `FROM scratch` image can run. Static-pie binaries, Rust's musl default, count as static.
pub fn is_static_elf(path: &Path) -> Result<bool> {
    const PT_INTERP: u32 = 3;
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let read = |offset: u64, len: usize| -> Result<Vec<u8>> {
        let mut buf = vec![0; len];
        file.read_exact_at(&mut buf, offset).with_context(|| format!("reading {}", path.display()))?;
        Ok(buf)
    };
    let header = read(0, 64)?;
    // 64-bit (class 2), little-endian (data 1): the only kind built here.
    ensure!(
        header[..4] == *b"\x7fELF" && header[4] == 2 && header[5] == 1,
        "{} is not an ELF64 LE file",
        path.display()
    );
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let phoff = u64::from_le_bytes(header[0x20..0x28].try_into().expect("8 bytes"));
    let (entry_size, count) = (u16_at(&header, 0x36) as usize, u16_at(&header, 0x38) as usize);
    ensure!(entry_size >= 4, "{} has program headers of {entry_size} bytes", path.display());
    let table = read(phoff, entry_size * count)?;
    Ok(table.chunks_exact(entry_size).all(|ph| u32::from_le_bytes(ph[..4].try_into().expect("4 bytes")) != PT_INTERP))
}

/// A fresh build context holding exactly `files` (hard links where possible: the binaries are tens of MiB).
fn stage_context(dir: &Path, files: &[PathBuf]) -> Result<PathBuf> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for file in files {
        let name = file.file_name().context("a staged file has no name")?;
        let target = dir.join(name);
        if std::fs::hard_link(file, &target).is_err() {
            std::fs::copy(file, &target)
                .with_context(|| format!("copying {} into {}", file.display(), dir.display()))?;
        }
    }
    Ok(dir.to_path_buf())
}

/// A commit's time in seconds since the epoch: the images' `created`.
pub(crate) fn git_commit_time(root: &Path, commit: &str) -> Result<String> {
    let output = Command::new("git").arg("-C").arg(root).args(["log", "-1", "--format=%ct", commit]).output()?;
    ensure!(output.status.success(), "git log failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// The commit the images are built from (the `revision` label).
fn git_revision(root: &Path) -> Result<String> {
    let output =
        Command::new("git").arg("-C").arg(root).args(["rev-parse", "HEAD"]).output().context("starting git")?;
    ensure!(output.status.success(), "git rev-parse HEAD failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// The one version the agents and the chart share; fails when they have drifted apart.
pub fn lockstep_version(root: &Path) -> Result<String> {
    let chart = chart_app_version(&root.join("charts/kcp-keeper/Chart.yaml"))?;
    let agents = agent_versions(root)?;
    check_lockstep(&chart, &agents)?;
    Ok(chart)
}

/// Every agent's crate version equals the chart's appVersion (the chart's default image tag).
pub fn check_lockstep(app_version: &str, agents: &BTreeMap<String, String>) -> Result<()> {
    for agent in AGENTS {
        match agents.get(agent) {
            None => bail!("no crate named {agent} in the workspace"),
            Some(v) if v != app_version => {
                bail!("{agent} is version {v} but the chart's appVersion is {app_version}: they move in lockstep")
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn chart_app_version(chart_yaml: &Path) -> Result<String> {
    let text = std::fs::read_to_string(chart_yaml).with_context(|| format!("reading {}", chart_yaml.display()))?;
    let chart: serde_yaml::Value =
        serde_yaml::from_str(&text).with_context(|| format!("parsing {}", chart_yaml.display()))?;
    chart
        .get("appVersion")
        .and_then(serde_yaml::Value::as_str)
        .map(str::to_string)
        .with_context(|| format!("{} has no appVersion string", chart_yaml.display()))
}

/// Crate versions of the workspace members, as cargo resolves them (`version.workspace = true` included).
fn agent_versions(root: &Path) -> Result<BTreeMap<String, String>> {
    let output = crate::cargo(&["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(root)
        .output()
        .context("starting cargo metadata")?;
    ensure!(output.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).context("reading cargo metadata")?;
    let packages =
        metadata.get("packages").and_then(serde_json::Value::as_array).context("no packages in cargo metadata")?;
    Ok(packages
        .iter()
        .filter_map(|p| Some((p.get("name")?.as_str()?.to_string(), p.get("version")?.as_str()?.to_string())))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_app_version_equals_every_agent_crate_version() {
        let root = workspace_root();
        let chart = chart_app_version(&root.join("charts/kcp-keeper/Chart.yaml")).unwrap();
        check_lockstep(&chart, &agent_versions(&root).unwrap()).unwrap();
    }

    #[test]
    fn a_drifted_agent_version_fails_the_lockstep_check() {
        let mut agents: BTreeMap<String, String> = AGENTS.iter().map(|a| (a.to_string(), "0.2.0".into())).collect();
        check_lockstep("0.2.0", &agents).unwrap();
        agents.insert("dns-rewriter".into(), "0.3.0".into());
        let err = check_lockstep("0.2.0", &agents).unwrap_err().to_string();
        assert!(err.contains("dns-rewriter is version 0.3.0") && err.contains("appVersion is 0.2.0"), "{err}");
        agents.remove("ca-syncer");
        let err = check_lockstep("0.2.0", &agents).unwrap_err().to_string();
        assert!(err.contains("no crate named ca-syncer"), "{err}");
    }

    #[test]
    fn local_tags_use_the_charts_default_registry() {
        let values = std::fs::read_to_string(workspace_root().join("charts/kcp-keeper/values.yaml")).unwrap();
        let values: serde_yaml::Value = serde_yaml::from_str(&values).unwrap();
        assert_eq!(values["image"]["registry"].as_str(), Some(REGISTRY));
        assert_eq!(image_tag("ca-syncer", "0.1.0"), "ghcr.io/kcp-keeper/ca-syncer:0.1.0");
    }

    #[test]
    fn every_label_names_the_image_and_its_exact_source() {
        let labels = expected_labels("dns-rewriter", "0.1.0", "3d112c7aa");
        assert_eq!(labels["org.opencontainers.image.title"], "dns-rewriter");
        assert_eq!(labels["org.opencontainers.image.version"], "0.1.0");
        assert_eq!(labels["org.opencontainers.image.revision"], "3d112c7aa");
        assert_eq!(labels["org.opencontainers.image.source"], SOURCE);
    }

    #[test]
    fn every_dockerfile_is_from_scratch_with_the_numeric_user_and_the_labels() {
        for agent in AGENTS {
            let path = workspace_root().join("images").join(agent).join("Dockerfile");
            let text = std::fs::read_to_string(&path).unwrap();
            let instructions: Vec<&str> =
                text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
            assert_eq!(instructions.first(), Some(&"FROM scratch"), "{agent}: one stage, nothing beneath it");
            assert_eq!(text.matches("FROM ").count(), 1, "{agent}");
            assert!(instructions.contains(&format!("USER {USER}").as_str()), "{agent}: USER {USER}");
            assert!(instructions.contains(&format!("ENTRYPOINT [\"/{agent}\"]").as_str()), "{agent}: entrypoint");
            for key in expected_labels(agent, "v", "r").keys() {
                assert!(text.contains(key.as_str()), "{agent}: label {key}");
            }
            let copies_ca_bundle =
                instructions.contains(&"COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt");
            assert_eq!(copies_ca_bundle, agent == "etcd-snapshotter", "{agent}: only the S3 client needs public roots");
        }
    }

    #[test]
    fn a_bundle_with_a_few_certificates_is_counted_as_such() {
        let one = "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n";
        assert_eq!(prereqs::certificate_count(&one.repeat(3)), 3);
        assert_eq!(prereqs::certificate_count("no PEM here"), 0);
    }

    /// `buildah inspect --type image` of a one-layer image, as buildah 1.28 prints it (trimmed).
    const INSPECT: &str = r#"{"Type":"buildah 0.0.1","OCIv1":{"architecture":"amd64","os":"linux",
        "config":{"User":"65532:65532","Entrypoint":["/ca-syncer"],
        "Labels":{"io.buildah.version":"1.28.2","org.opencontainers.image.version":"0.1.0"}}},
        "Manifest":"{\"schemaVersion\":2,\"config\":{\"size\":891},\"layers\":[{\"size\":25792000}]}"}"#;

    #[test]
    fn inspect_output_gives_the_user_the_labels_and_the_size() {
        let facts = parse_inspect(INSPECT).unwrap();
        assert_eq!(facts.user, "65532:65532");
        assert_eq!(facts.labels["org.opencontainers.image.version"], "0.1.0");
        assert_eq!(facts.size, 25_792_891);
        assert!(parse_inspect(r#"{"OCIv1":{"config":{}}}"#).is_err(), "no manifest");
    }

    #[test]
    fn an_image_without_the_user_or_a_label_fails_its_check() {
        let mut facts = parse_inspect(INSPECT).unwrap();
        let wanted: BTreeMap<String, String> =
            [("org.opencontainers.image.version".to_string(), "0.1.0".to_string())].into();
        check_facts("t", &facts, &wanted).unwrap();
        let wrong: BTreeMap<String, String> =
            [("org.opencontainers.image.version".to_string(), "0.2.0".to_string())].into();
        let err = check_facts("t", &facts, &wrong).unwrap_err().to_string();
        assert!(err.contains("expected \"0.2.0\""), "{err}");
        facts.user = "root".into();
        let err = check_facts("t", &facts, &wanted).unwrap_err().to_string();
        assert!(err.contains("runs as \"root\""), "{err}");
    }

    #[test]
    fn manifest_size_adds_the_config_and_every_layer() {
        let manifest = r#"{"schemaVersion":2,"config":{"size":1200},"layers":[{"size":1000000},{"size":34}]}"#;
        assert_eq!(manifest_size(manifest).unwrap(), 1_001_234);
        assert!(manifest_size(r#"{"config":{"size":1},"layers":[{"digest":"x"}]}"#).is_err());
        assert!(manifest_size("not json").is_err());
    }

    #[test]
    fn sizes_are_printed_in_binary_units() {
        assert_eq!(human_size(512), "512 B");
        assert_eq!(human_size(2048), "2.0 KiB");
        assert_eq!(human_size(12_345_678), "11.8 MiB");
        assert_eq!(human_size(3 * 1024 * 1024 * 1024), "3.0 GiB");
    }

    #[test]
    fn a_go_peer_built_without_cgo_is_static_and_a_system_binary_is_not() {
        // etcd from the peer cache is built with CGO_ENABLED=0 (what the snapshotter image needs); coreutils'
        // ls links glibc dynamically. Both are real binaries, so the check reads real program headers.
        let peers = peers::locate_only(&["etcd"]).expect("the peers are built by `cargo xtask test`");
        assert!(is_static_elf(peers.path("etcd")).unwrap());
        assert!(!is_static_elf(Path::new("/bin/ls")).unwrap());
    }

    #[test]
    fn a_file_that_is_not_elf_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("script");
        std::fs::write(&script, format!("#!/bin/sh\n{}\n", "x".repeat(80))).unwrap();
        let err = is_static_elf(&script).unwrap_err().to_string();
        assert!(err.contains("not an ELF64 LE file"), "{err}");
        std::fs::write(&script, "short").unwrap();
        assert!(is_static_elf(&script).is_err());
    }
}
