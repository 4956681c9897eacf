//! The images the seed's layout runs, built here with buildah (no registry can be reached) under the exact
//! references the layout names, so `ctr images import` puts them where kubelet looks and nothing is pulled:
//! kcp under the kcp-operator's default (`ghcr.io/kcp-dev/kcp:v0.32.3`, also pinned in every object), etcd,
//! the operator and cert-manager's controller under their upstream names, and a probe image (kubectl,
//! http-probe, kubeconfig-probe, openssl-probe, dns-lookup and pause) for the checks run from a pod. Each is `FROM scratch` with static binaries from the peer cache, laid out as
//! the upstream image lays them out (entrypoints, the non-root user, kcp's writable `/.kcp`).
//!
//! Built once per machine into `<cache>/images/seed/<name>.tar` (docker-archives) with their own buildah
//! storage beside the agents' (`<cache>/buildah-seed`), under a lock, so two test binaries never build twice and
//! `cargo xtask images` never sees them.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};

/// One image: its reference, the files it holds (peer artefact, path inside), its entrypoint and command.
pub struct Image {
    pub name: &'static str,
    pub reference: &'static str,
    files: &'static [(&'static str, &'static str)],
    entrypoint: &'static [&'static str],
    cmd: &'static [&'static str],
    /// Empty directories owned by the image's user (kcp writes under `/.kcp` unless told otherwise).
    writable_dirs: &'static [&'static str],
}

/// The user every upstream image of these runs as (distroless `nonroot`).
pub const USER: &str = "65532:65532";

pub const KCP_IMAGE: &str = "ghcr.io/kcp-dev/kcp:v0.32.3";
/// The kcp-operator's defaults for that image (`internal/resources/resources.go`: `ImageRepository`, `ImageTag`);
/// the layout pins both explicitly anyway.
pub const KCP_REPOSITORY: &str = "ghcr.io/kcp-dev/kcp";
pub const KCP_TAG: &str = "v0.32.3";
pub const ETCD_IMAGE: &str = "quay.io/coreos/etcd:v3.6.16";
pub const OPERATOR_IMAGE: &str = "ghcr.io/kcp-dev/kcp-operator:v0.9.0";
pub const CERT_MANAGER_REPOSITORY: &str = "quay.io/jetstack/cert-manager-controller";
pub const CERT_MANAGER_IMAGE: &str = "quay.io/jetstack/cert-manager-controller:v1.21.1";
/// kubectl (v1.37.2), http-probe, kubeconfig-probe, openssl-probe, dns-lookup and pause; the tag names the set of
/// files (the cache is keyed by the reference), so bump it when they change.
pub const PROBE_IMAGE: &str = "kcp-keeper.local/seed-probe:9";

pub static IMAGES: &[Image] = &[
    Image {
        name: "kcp",
        reference: KCP_IMAGE,
        files: &[("kcp", "/kcp"), ("kcp-front-proxy", "/kcp-front-proxy")],
        entrypoint: &["/kcp"],
        cmd: &["start"],
        writable_dirs: &["/.kcp"],
    },
    Image {
        name: "etcd",
        reference: ETCD_IMAGE,
        files: &[("etcd", "/usr/local/bin/etcd"), ("etcdctl", "/usr/local/bin/etcdctl")],
        entrypoint: &["/usr/local/bin/etcd"],
        cmd: &[],
        writable_dirs: &[],
    },
    Image {
        name: "kcp-operator",
        reference: OPERATOR_IMAGE,
        files: &[("kcp-operator", "/manager")],
        entrypoint: &["/manager"],
        cmd: &[],
        writable_dirs: &[],
    },
    Image {
        name: "cert-manager-controller",
        reference: CERT_MANAGER_IMAGE,
        files: &[("cert-manager-controller", "/app/cmd/controller/controller")],
        entrypoint: &["/app/cmd/controller/controller"],
        cmd: &[],
        writable_dirs: &[],
    },
    Image {
        name: "seed-probe",
        reference: PROBE_IMAGE,
        files: &[
            ("kubectl", "/kubectl"),
            ("http-probe", "/http-probe"),
            ("kubeconfig-probe", "/kubeconfig-probe"),
            ("openssl-probe", "/openssl-probe"),
            ("dns-lookup", "/dns-lookup"),
            ("pause", "/pause"),
        ],
        entrypoint: &["/pause"],
        cmd: &[],
        writable_dirs: &[],
    },
];

/// The peer artefacts the images are made of.
pub const PEERS: &[&str] = &[
    "kcp",
    "kcp-front-proxy",
    "etcd",
    "etcdctl",
    "kcp-operator",
    "cert-manager-controller",
    "kubectl",
    "http-probe",
    "kubeconfig-probe",
    "openssl-probe",
    "dns-lookup",
    "pause",
];

fn dir() -> PathBuf {
    peers::cache_root().join("images").join("seed")
}

fn buildah_output(args: &[&str]) -> Result<String> {
    Ok(peers::buildah::SEED.output(args)?.trim().to_string())
}

/// The docker-archive of every image, building the missing ones (first time on a machine only).
pub fn ensure(peers: &peers::Peers) -> Result<Vec<(&'static Image, PathBuf)>> {
    let dir = dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let lock = File::create(dir.join(".lock"))?;
    lock.lock().context("locking the seed image cache")?;
    let mut out = Vec::new();
    for image in IMAGES {
        // The reference carries the pinned version, so a changed pin is a new file.
        let archive = dir.join(format!("{}.tar", image.reference.replace(['/', ':'], "_")));
        if !archive.exists() {
            let started = Instant::now();
            build(image, peers, &archive)?;
            eprintln!("testbed: seed: built image {} in {:.1?}", image.reference, started.elapsed());
        }
        out.push((image, archive));
    }
    Ok(out)
}

fn build(image: &Image, peers: &peers::Peers, archive: &Path) -> Result<()> {
    let container = buildah_output(&["from", "--pull=never", "scratch"])?;
    let result = (|| -> Result<()> {
        for (artefact, inside) in image.files {
            let source = peers.path(artefact).display().to_string();
            buildah_output(&["copy", "--chmod", "0755", &container, &source, inside])?;
        }
        if !image.writable_dirs.is_empty() {
            let empty = tempfile::tempdir()?;
            let empty = empty.path().display().to_string();
            for dir in image.writable_dirs {
                buildah_output(&["copy", "--chown", USER, &container, &empty, dir])?;
            }
        }
        let entrypoint = serde_json::to_string(image.entrypoint)?;
        let mut config = vec!["config", "--entrypoint", &entrypoint, "--user", USER, "--workingdir", "/"];
        let cmd = serde_json::to_string(image.cmd)?;
        if !image.cmd.is_empty() {
            config.extend(["--cmd", &cmd]);
        }
        config.push(&container);
        buildah_output(&config)?;
        buildah_output(&["commit", "--quiet", &container, image.reference])?;
        let _ = std::fs::remove_file(archive);
        let partial = archive.with_extension("partial");
        let _ = std::fs::remove_file(&partial);
        buildah_output(&[
            "push",
            "--quiet",
            image.reference,
            &format!("docker-archive:{}:{}", partial.display(), image.reference),
        ])?;
        std::fs::rename(&partial, archive)?;
        Ok(())
    })();
    // The working container is a full vfs copy: never leave it behind.
    let removed = buildah_output(&["rm", &container]);
    result?;
    removed?;
    // Only the archive is needed; the stored image would be a second full copy.
    buildah_output(&["rmi", image.reference])?;
    Ok(())
}

/// A second tag of the kcp image, on the same build: a roll to it is a real one (a new ReplicaSet, new pods that
/// start kcp again on the shard's etcd) that changes nothing else. See [`tag_kcp`].
pub const KCP_SECOND_TAG: &str = "v0.32.3-retag";

/// Tags the kcp image in the node's containerd as `<KCP_REPOSITORY>:<tag>` (the same content, nothing pulled or
/// copied), so a kcp-operator object may name that tag; returns the reference. Idempotent.
pub fn tag_kcp(node: &crate::node::Node, tag: &str) -> Result<String> {
    let reference = format!("{KCP_REPOSITORY}:{tag}");
    node.ctr(&format!("ctr images tag {reference}"), &["images", "tag", "--force", KCP_IMAGE, &reference])?;
    Ok(reference)
}
