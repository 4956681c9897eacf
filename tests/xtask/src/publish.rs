//! `cargo xtask publish --registry HOST[:PORT][/PATH]`: the agents' images, each with a CycloneDX SBOM of what it
//! is built from, and the packaged chart, pushed to an OCI registry, with the tools a release pipeline uses:
//! buildah pushes the images, ORAS reads manifests and attaches each SBOM as an OCI referrer of its image, helm
//! pushes the chart. The version is the workspace's (the chart's and the images' lockstep version).
//!
//! A published version is never overwritten. Everything is checked before anything is pushed: an image whose
//! tag already holds another image (its config, which names every layer, differs) or a chart whose published
//! files differ from this tree's fails the whole publish, naming each; the same bytes again are left as they
//! are. A registry that cannot be reached fails before any push.
//!
//! The test bed's registry (`peers::registry`) is published to the same way: [`to_bed`], which `cargo xtask
//! images` runs after building, starts a writable registry on loopback over the bed's storage and publishes
//! there; the nodes' registries serve that storage read-only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::images::{self, AGENTS};

/// The SBOM's media type (and the referrer's artifact type).
pub const SBOM_TYPE: &str = "application/vnd.cyclonedx+json";
/// The chart's repository under the target: `<target>/charts/kcp-keeper`.
const CHART_PATH: &str = "charts";
const CHART: &str = "kcp-keeper";

/// Where to publish: `host[:port]` and an optional path prefix, and how to trust and log in to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub path: String,
    /// A CA bundle to trust the registry's certificate with, beside the system's roots.
    pub ca_file: Option<PathBuf>,
    /// Registry credentials in the Docker config format (`auths`), given to buildah, ORAS and helm alike.
    pub auth_file: Option<PathBuf>,
}

impl Target {
    /// Reads `HOST[:PORT][/PATH]`. A scheme, credentials, a query or an empty segment is refused: credentials
    /// belong in the auth file, never in a reference that ends up in logs.
    pub fn parse(spec: &str, ca_file: Option<PathBuf>, auth_file: Option<PathBuf>) -> Result<Self> {
        ensure!(
            !spec.contains("://"),
            "--registry {spec:?}: give HOST[:PORT][/PATH] without a scheme (it is always HTTPS)"
        );
        ensure!(!spec.contains('@'), "--registry: credentials do not go into the reference; use --auth-file");
        ensure!(
            !spec.is_empty() && !spec.contains(['?', '#', ' ']),
            "--registry {spec:?}: expected HOST[:PORT][/PATH]"
        );
        let (host, path) = spec.split_once('/').unwrap_or((spec, ""));
        ensure!(!host.is_empty(), "--registry {spec:?}: no host");
        ensure!(
            path.is_empty() || path.split('/').all(|s| !s.is_empty() && s == s.to_lowercase()),
            "--registry {spec:?}: the path must be lower-case segments without empty ones"
        );
        Ok(Self { host: host.to_string(), path: path.to_string(), ca_file, auth_file })
    }

    /// `host[:port][/path]/<name>`.
    pub fn repository(&self, name: &str) -> String {
        match self.path.as_str() {
            "" => format!("{}/{name}", self.host),
            path => format!("{}/{path}/{name}", self.host),
        }
    }

    fn chart_repository(&self) -> String {
        self.repository(CHART_PATH)
    }
}

/// What publishing did with one artefact.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Pushed(String),
    AlreadyThere(String),
}

/// Builds the working tree's images (unless `prebuilt`: then the ones `cargo xtask images` last built) and
/// publishes them and the chart to `target`.
pub fn publish(target: &Target, prebuilt: bool) -> Result<Vec<(String, Outcome)>> {
    let source = images::Source::working_tree()?;
    if !prebuilt {
        images::build_tree(&source)?;
    }
    publish_tree(target, &source)
}

/// Publishes the images built from `source` (in buildah's storage) and its chart to `target`.
pub fn publish_tree(target: &Target, source: &images::Source) -> Result<Vec<(String, Outcome)>> {
    let peers = peers::locate_only(&["oras", "helm"]).context("publish runs ORAS and helm from the peer cache")?;
    let root = source.root.clone();
    let version = images::lockstep_version(&root)?;
    let tools = Tools::new(target, peers.path("oras"), peers.path("helm"))?;

    // The registry answers at all: a refused connection or a certificate it cannot prove is not a "not found".
    tools.reachable(&target.repository(AGENTS[0]), &version)?;

    // Everything is checked before anything is pushed.
    let mut refused = Vec::new();
    let mut plan = Vec::new();
    for agent in AGENTS {
        let local = local_config_digest(&images::image_tag(agent, &version))?;
        let reference = format!("{}:{version}", target.repository(agent));
        match tools.remote_config_digest(&reference)? {
            None => plan.push((agent, reference, false)),
            Some(remote) if remote == local => plan.push((agent, reference, true)),
            Some(remote) => refused.push(format!(
                "{reference} is already published as another image (config {remote}; this build's is {local})"
            )),
        }
    }
    let scratch = tempfile::tempdir()?;
    let package = package_chart(&tools.helm, &root.join("charts").join(CHART), scratch.path())?;
    let chart_ref = format!("{}/{CHART}:{version}", target.chart_repository());
    let chart_there = match tools.pull_chart(&chart_ref, &version, &scratch.path().join("published"))? {
        None => false,
        Some(published) => {
            let differs = differing_files(
                &unpack(&package, &scratch.path().join("ours"))?,
                &unpack(&published, &scratch.path().join("theirs"))?,
            )?;
            if differs.is_empty() {
                true
            } else {
                refused.push(format!("{chart_ref} is already published with other files ({})", differs.join(", ")));
                true
            }
        }
    };
    if !refused.is_empty() {
        bail!(
            "nothing was pushed: a published version is never overwritten.\n  {}\nPublish a new version: raise it in \
             the workspace's Cargo.toml, the chart's version and appVersion, and add its CHANGELOG.md section",
            refused.join("\n  ")
        );
    }

    let mut outcomes = Vec::new();
    for (agent, reference, there) in plan {
        if there {
            outcomes.push((reference.clone(), Outcome::AlreadyThere(tools.digest(&reference)?)));
            continue;
        }
        let digest_file = scratch.path().join(format!("{agent}.digest"));
        let mut push = tools.buildah(&["push", "--quiet"]);
        push.arg("--digestfile").arg(&digest_file);
        push.arg(images::image_tag(agent, &version)).arg(format!("docker://{reference}"));
        crate::step(&format!("push {reference}"), push)?;
        let digest = std::fs::read_to_string(&digest_file)?.trim().to_string();
        let sbom = scratch.path().join(format!("{agent}.cdx.json"));
        std::fs::write(&sbom, serde_json::to_vec_pretty(&sbom_for(&root, agent, &version)?)?)?;
        tools.attach_sbom(&format!("{}@{digest}", target.repository(agent)), &sbom)?;
        outcomes.push((reference, Outcome::Pushed(digest)));
    }
    if chart_there {
        outcomes.push((chart_ref, Outcome::AlreadyThere(String::new())));
    } else {
        let mut push = tools.helm_command(&["push"]);
        push.arg(&package).arg(format!("oci://{}", target.chart_repository()));
        crate::step(&format!("push {chart_ref}"), push)?;
        outcomes.push((chart_ref, Outcome::Pushed(String::new())));
    }
    for (reference, outcome) in &outcomes {
        match outcome {
            Outcome::Pushed(d) => println!("pushed   {reference} {d}"),
            Outcome::AlreadyThere(d) => println!("unchanged {reference} {d} (already published with these bytes)"),
        }
    }
    Ok(outcomes)
}

/// The tools a publish runs, with the target's CA and credentials.
struct Tools {
    oras: PathBuf,
    helm: PathBuf,
    ca_file: Option<PathBuf>,
    auth_file: Option<PathBuf>,
    /// buildah reads CAs from a directory of `*.crt` files: one holding the target's CA.
    cert_dir: Option<tempfile::TempDir>,
    helm_home: tempfile::TempDir,
}

impl Tools {
    fn new(target: &Target, oras: &Path, helm: &Path) -> Result<Self> {
        let cert_dir = match &target.ca_file {
            None => None,
            Some(ca) => {
                let dir = tempfile::tempdir()?;
                std::fs::copy(ca, dir.path().join("ca.crt"))
                    .with_context(|| format!("reading the registry's CA {}", ca.display()))?;
                Some(dir)
            }
        };
        Ok(Self {
            oras: oras.to_path_buf(),
            helm: helm.to_path_buf(),
            ca_file: target.ca_file.clone(),
            auth_file: target.auth_file.clone(),
            cert_dir,
            helm_home: tempfile::tempdir()?,
        })
    }

    fn buildah(&self, args: &[&str]) -> Command {
        let mut cmd = peers::buildah::AGENTS.command(args);
        if let Some(dir) = &self.cert_dir {
            cmd.arg("--cert-dir").arg(dir.path());
        }
        if let Some(auth) = &self.auth_file {
            cmd.arg("--authfile").arg(auth);
        }
        cmd
    }

    fn oras(&self, args: &[&str]) -> Command {
        // ORAS (cobra) takes flags after the positional arguments too.
        let mut cmd = Command::new(&self.oras);
        cmd.args(args);
        if let Some(ca) = &self.ca_file {
            cmd.arg("--ca-file").arg(ca);
        }
        if let Some(auth) = &self.auth_file {
            cmd.arg("--registry-config").arg(auth);
        }
        cmd
    }

    /// helm with a home of its own (no user repositories or caches), the CA and credentials.
    fn helm_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.helm);
        cmd.args(args);
        let home = self.helm_home.path();
        cmd.env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"));
        if let Some(ca) = &self.ca_file {
            cmd.arg("--ca-file").arg(ca);
        }
        if let Some(auth) = &self.auth_file {
            cmd.arg("--registry-config").arg(auth);
        }
        cmd
    }

    /// `oras manifest fetch` of `reference`: `Ok(None)` when the registry answers that it has no such tag.
    fn manifest(&self, reference: &str) -> Result<Option<serde_json::Value>> {
        let out = self.oras(&["manifest", "fetch", reference]).output().context("starting oras")?;
        if out.status.success() {
            return Ok(Some(
                serde_json::from_slice(&out.stdout).with_context(|| format!("the manifest of {reference}"))?,
            ));
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        if is_not_found(&stderr) {
            return Ok(None);
        }
        bail!("reading {reference}: {}", stderr.trim())
    }

    fn reachable(&self, repository: &str, version: &str) -> Result<()> {
        self.manifest(&format!("{repository}:{version}"))
            .map(|_| ())
            .with_context(|| format!("the registry of {repository} cannot be used; nothing was pushed"))
    }

    fn remote_config_digest(&self, reference: &str) -> Result<Option<String>> {
        let Some(manifest) = self.manifest(reference)? else { return Ok(None) };
        let digest = manifest["config"]["digest"].as_str().with_context(|| {
            format!("{reference} is published, but as something other than an image manifest: {manifest}")
        })?;
        Ok(Some(digest.to_string()))
    }

    fn digest(&self, reference: &str) -> Result<String> {
        let out = self.oras(&["manifest", "fetch", "--descriptor", reference]).output()?;
        ensure!(out.status.success(), "reading {reference}: {}", String::from_utf8_lossy(&out.stderr).trim());
        let descriptor: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        Ok(descriptor["digest"].as_str().unwrap_or_default().to_string())
    }

    /// Attaches `sbom` to the image `subject` (`repo@digest`) as an OCI referrer, unless one is attached already.
    fn attach_sbom(&self, subject: &str, sbom: &Path) -> Result<()> {
        let out = self
            .oras(&["discover", "--format", "json", "--artifact-type", SBOM_TYPE, subject])
            .output()
            .context("starting oras")?;
        ensure!(
            out.status.success(),
            "listing the referrers of {subject}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let found: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        if found["referrers"].as_array().is_some_and(|r| !r.is_empty()) {
            return Ok(());
        }
        let dir = sbom.parent().context("the SBOM has a directory")?;
        let name = sbom.file_name().and_then(|n| n.to_str()).context("the SBOM's file name")?;
        let mut attach = self.oras(&["attach", "--artifact-type", SBOM_TYPE, subject, &format!("{name}:{SBOM_TYPE}")]);
        attach.current_dir(dir).stdout(Stdio::null());
        crate::step(&format!("attach the SBOM to {subject}"), attach)
    }

    /// `helm pull` of a published chart into `dir`: `Ok(None)` when the version is not published.
    fn pull_chart(&self, reference: &str, version: &str, dir: &Path) -> Result<Option<PathBuf>> {
        // Whether the tag exists is ORAS's answer (helm's "not found" is worded differently by each registry).
        if self.manifest(reference)?.is_none() {
            return Ok(None);
        }
        std::fs::create_dir_all(dir)?;
        let oci = format!("oci://{}", reference.rsplit_once(':').map_or(reference, |(r, _)| r));
        let dir_arg = dir.display().to_string();
        let out = self.helm_command(&["pull", &oci, "--version", version, "--destination", &dir_arg]).output()?;
        ensure!(out.status.success(), "helm pull {oci}: {}", String::from_utf8_lossy(&out.stderr).trim());
        Ok(Some(dir.join(format!("{CHART}-{version}.tgz"))))
    }
}

/// How ORAS words a registry's 404 (`MANIFEST_UNKNOWN`, `NAME_UNKNOWN`, or a bare not found).
fn is_not_found(stderr: &str) -> bool {
    stderr.contains(": not found") || stderr.contains("MANIFEST_UNKNOWN") || stderr.contains("NAME_UNKNOWN")
}

/// The config digest of a locally built image (its image ID): it names every layer and every label, so equal
/// digests are equal images.
fn local_config_digest(tag: &str) -> Result<String> {
    let out = peers::buildah::AGENTS
        .output(&["inspect", "--type", "image", "--format", "{{.FromImageID}}", tag])
        .with_context(|| format!("{tag} is not built: run `cargo xtask images` (or publish without --prebuilt)"))?;
    Ok(format!("sha256:{}", out.trim()))
}

fn package_chart(helm: &Path, chart: &Path, dir: &Path) -> Result<PathBuf> {
    let out = Command::new(helm).arg("package").arg(chart).arg("--destination").arg(dir).output()?;
    ensure!(out.status.success(), "helm package: {}", String::from_utf8_lossy(&out.stderr).trim());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout.trim().rsplit(": ").next().context("helm package printed no path")?;
    Ok(PathBuf::from(path))
}

fn unpack(archive: &Path, dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let status = Command::new("tar").arg("-xzf").arg(archive).arg("-C").arg(dir).status()?;
    ensure!(status.success(), "unpacking {}", archive.display());
    Ok(dir.to_path_buf())
}

/// The relative paths whose contents differ between two trees, or that only one has. A chart package's bytes
/// carry the time it was packaged; its files are what a publish must not change.
pub fn differing_files(a: &Path, b: &Path) -> Result<Vec<String>> {
    let (fa, fb) = (files(a)?, files(b)?);
    let names: BTreeSet<&String> = fa.keys().chain(fb.keys()).collect();
    Ok(names.into_iter().filter(|n| fa.get(*n) != fb.get(*n)).cloned().collect())
}

fn files(root: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let name = path.strip_prefix(root)?.display().to_string();
                out.insert(name, std::fs::read(&path)?);
            }
        }
    }
    Ok(out)
}

/// A CycloneDX 1.6 SBOM of an agent's image: the agent's crate and every crate it links (normal dependencies for
/// the static target, from `cargo metadata`), with the dependency graph, and for etcd-snapshotter the etcd
/// binaries and the CA bundle the image carries. No timestamp, so the same tree gives the same SBOM.
pub fn sbom_for(root: &Path, agent: &str, version: &str) -> Result<serde_json::Value> {
    let out = crate::cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--locked",
        "--filter-platform",
        crate::prereqs::MUSL_TARGET,
    ])
    .current_dir(root)
    .stderr(Stdio::inherit())
    .output()
    .context("starting cargo metadata")?;
    ensure!(out.status.success(), "cargo metadata failed");
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let mut sbom = sbom_from_metadata(&metadata, agent)?;
    if agent == "etcd-snapshotter" {
        let etcd = peers::PEERS.iter().find(|p| p.name == "etcd").map(|p| p.version).unwrap_or_default();
        let components = sbom["components"].as_array_mut().context("components")?;
        for (name, purl) in [
            ("etcd", format!("pkg:golang/go.etcd.io/etcd/server/v3@{etcd}")),
            ("etcdutl", format!("pkg:golang/go.etcd.io/etcd/etcdutl/v3@{etcd}")),
        ] {
            components.push(serde_json::json!({
                "type": "application", "bom-ref": purl, "name": name, "version": etcd, "purl": purl,
                "licenses": [{"license": {"id": "Apache-2.0"}}],
            }));
        }
        components.push(serde_json::json!({
            "type": "data", "bom-ref": "debian-ca-certificates", "name": "ca-certificates (Debian)",
            "description": "the public CA bundle at /etc/ssl/certs/ca-certificates.crt",
        }));
    }
    sbom["metadata"]["component"]["version"] = version.into();
    Ok(sbom)
}

/// [`sbom_for`] from `cargo metadata` output: the resolve graph walked from `agent` over normal dependencies.
pub fn sbom_from_metadata(metadata: &serde_json::Value, agent: &str) -> Result<serde_json::Value> {
    let packages: BTreeMap<&str, &serde_json::Value> = metadata["packages"]
        .as_array()
        .context("cargo metadata: packages")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let nodes: BTreeMap<&str, &serde_json::Value> = metadata["resolve"]["nodes"]
        .as_array()
        .context("cargo metadata: resolve")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let root = packages
        .values()
        .find(|p| p["name"] == agent && p["source"].is_null())
        .and_then(|p| p["id"].as_str())
        .with_context(|| format!("no workspace package {agent}"))?;
    let purl = |id: &str| {
        let p = packages[id];
        format!("pkg:cargo/{}@{}", p["name"].as_str().unwrap_or_default(), p["version"].as_str().unwrap_or_default())
    };
    let mut seen = BTreeSet::new();
    let mut stack = vec![root];
    let mut graph = Vec::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        let node = nodes.get(id).with_context(|| format!("cargo metadata has no resolve node for {id}"))?;
        let mut depends = BTreeSet::new();
        for dep in node["deps"].as_array().into_iter().flatten() {
            let normal = dep["dep_kinds"].as_array().into_iter().flatten().any(|k| k["kind"].is_null());
            if let (true, Some(pkg)) = (normal, dep["pkg"].as_str()) {
                depends.insert(purl(pkg));
                stack.push(pkg);
            }
        }
        graph.push(serde_json::json!({"ref": purl(id), "dependsOn": depends}));
    }
    let components: Vec<serde_json::Value> = seen
        .iter()
        .filter(|id| **id != root)
        .map(|id| {
            let p = packages[id];
            let mut c = serde_json::json!({
                "type": "library", "bom-ref": purl(id), "name": p["name"], "version": p["version"], "purl": purl(id),
            });
            if let Some(license) = p["license"].as_str() {
                c["licenses"] = serde_json::json!([{"expression": license}]);
            }
            c
        })
        .collect();
    graph.sort_by(|a, b| a["ref"].as_str().cmp(&b["ref"].as_str()));
    Ok(serde_json::json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "version": 1,
        "metadata": {
            "tools": {"components": [{"type": "application", "name": "cargo xtask publish"}]},
            "component": {"type": "application", "bom-ref": purl(root), "name": agent, "purl": purl(root),
                          "licenses": [{"license": {"id": "Apache-2.0"}}]},
        },
        "components": components,
        "dependencies": graph,
    }))
}

/// Publishes what `cargo xtask images` just built to the test bed's registry storage (`peers::registry`): its
/// TLS files made once, the storage emptied (a bed holds this tree's build, not a release history), a writable
/// registry on loopback for the push, stopped after it.
pub fn to_bed() -> Result<()> {
    let peers = peers::locate_only(&["registry", "oras", "helm"])?;
    let (ca, cert, key) = peers::registry::bed_tls();
    if !(ca.exists() && cert.exists() && key.exists()) {
        write_bed_tls(&ca, &cert, &key)?;
    }
    let storage = peers::registry::bed_storage();
    if storage.exists() {
        std::fs::remove_dir_all(&storage).with_context(|| format!("emptying {}", storage.display()))?;
    }
    std::fs::create_dir_all(&storage)?;
    let port = free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let config = peers::registry::bed_dir().join("publish.yml");
    std::fs::write(&config, peers::registry::config(&storage, &addr, &cert, &key, false))?;
    let log = peers::registry::bed_dir().join("publish.log");
    let mut registry = Command::new(peers.path("registry"));
    registry.arg("serve").arg(&config).envs(peers::registry::ENV.iter().copied());
    registry.stdout(Stdio::null()).stderr(std::fs::File::create(&log)?);
    crate::child::die_with_parent(&mut registry);
    let mut child = registry.spawn().context("starting the bed's registry")?;
    let result = (|| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&addr).is_err() {
            ensure!(
                Instant::now() < deadline,
                "the bed's registry did not listen on {addr} within 30 s; see {}",
                log.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let target = Target::parse(&format!("{addr}/{}", peers::registry::BED_PATH), Some(ca.clone()), None)?;
        // The previous release first (the upgrade test installs it), then this tree's build.
        publish_tree(&target, &crate::release::previous_images()?)?;
        publish_tree(&target, &images::Source::working_tree()?).map(|_| ())
    })();
    let _ = child.kill();
    let _ = child.wait();
    result.context("publishing to the test bed's registry")
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The bed registry's CA and its serving certificate for 127.0.0.1 and localhost, made once per machine.
fn write_bed_tls(ca: &Path, cert: &Path, key: &Path) -> Result<()> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
    std::fs::create_dir_all(ca.parent().context("tls dir")?)?;
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name.push(DnType::CommonName, "kcp-keeper test bed registry CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca_params.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(vec!["localhost".to_string()])?;
    leaf.subject_alt_names.push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    leaf.distinguished_name.push(DnType::CommonName, "kcp-keeper test bed registry");
    let leaf_pem = leaf.signed_by(&leaf_key, &issuer)?.pem();
    std::fs::write(key, leaf_key.serialize_pem())?;
    std::fs::write(cert, leaf_pem)?;
    std::fs::write(ca, ca_pem)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_host_port_and_path_and_refuses_schemes_and_credentials() {
        let t = Target::parse("127.0.0.1:5000/kcp-keeper", None, None).unwrap();
        assert_eq!(t.repository("ca-syncer"), "127.0.0.1:5000/kcp-keeper/ca-syncer");
        assert_eq!(t.chart_repository(), "127.0.0.1:5000/kcp-keeper/charts");
        assert_eq!(
            Target::parse("registry.example:443", None, None).unwrap().repository("x"),
            "registry.example:443/x"
        );
        for bad in ["https://r.example/x", "user:pw@r.example/x", "", "r.example//x", "r.example/X", "r.example/x?y"] {
            assert!(Target::parse(bad, None, None).is_err(), "{bad:?} was accepted");
        }
        let err = Target::parse("user:secret@r.example", None, None).unwrap_err().to_string();
        assert!(!err.contains("secret"), "the error repeats the credential: {err}");
    }

    #[test]
    fn the_sbom_lists_linked_crates_with_purls_and_leaves_out_dev_and_build_only_dependencies() {
        let sbom = sbom_for(&images::workspace_root(), "ca-syncer", "9.9.9").unwrap();
        assert_eq!(sbom["bomFormat"], "CycloneDX");
        assert_eq!(sbom["metadata"]["component"]["name"], "ca-syncer");
        assert_eq!(sbom["metadata"]["component"]["version"], "9.9.9");
        let names: BTreeSet<&str> =
            sbom["components"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        for linked in ["kube-client", "kcp-keeper-runtime", "rustls", "tokio"] {
            assert!(names.contains(linked), "{linked} is linked into ca-syncer but not in its SBOM");
        }
        // rcgen and the test bed are ca-syncer's dev-dependencies only; never linked into the agent.
        for not_linked in ["rcgen", "testbed", "peers"] {
            assert!(!names.contains(not_linked), "{not_linked} is in ca-syncer's SBOM, but not in its binary");
        }
        let purls = sbom["components"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["purl"].as_str().is_some_and(|p| p.starts_with("pkg:cargo/") && p.contains('@')));
        assert!(purls, "every component has a cargo purl with a version");
        assert_eq!(
            sbom,
            sbom_for(&images::workspace_root(), "ca-syncer", "9.9.9").unwrap(),
            "the SBOM is reproducible"
        );
    }

    #[test]
    fn differing_files_names_changed_added_and_removed_files_only() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        for (dir, files) in
            [(a.path(), [("same", "x"), ("changed", "1")]), (b.path(), [("same", "x"), ("changed", "2")])]
        {
            for (name, text) in files {
                std::fs::write(dir.join(name), text).unwrap();
            }
        }
        std::fs::create_dir(a.path().join("t")).unwrap();
        std::fs::write(a.path().join("t/only-a"), "").unwrap();
        assert_eq!(differing_files(a.path(), b.path()).unwrap(), vec!["changed".to_string(), "t/only-a".to_string()]);
    }
}
