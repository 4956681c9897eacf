//! The test bed's OCI registry (the Distribution peer, `registry`): where it keeps its files and how it is
//! configured. `cargo xtask images` publishes the agents' images, their SBOMs and the chart into the bed's
//! storage (a registry on loopback, writable, only while it publishes); every node of the test bed then serves
//! that storage read-only from a registry inside its own network namespace, which its containerd pulls from.

use std::path::{Path, PathBuf};

use crate::cache_root;

/// Where the chart's defaults pull the agents from (`image.registry`): what a release is published to. The
/// bed's nodes configure their containerd with the bed's registry as this host's mirror, so the chart's defaults
/// pull from the bed, as a cluster with a registry mirror does.
pub const PUBLIC: &str = "ghcr.io/kcp-keeper";

/// The path under the registry's host the bed publishes to: `<host>/kcp-keeper/<agent>:<version>`, and the
/// chart at `<host>/kcp-keeper/charts/kcp-keeper:<version>`.
pub const BED_PATH: &str = "kcp-keeper";

/// The bed registry's files under the machine cache: `storage/` (the registry's filesystem storage) and `tls/`
/// (`ca.pem`, the bed registry's CA, and the serving `cert.pem`/`key.pem` for 127.0.0.1 and localhost).
pub fn bed_dir() -> PathBuf {
    cache_root().join("registry")
}

/// The registry's storage directory.
pub fn bed_storage() -> PathBuf {
    bed_dir().join("storage")
}

/// The bed registry's TLS files: (CA, serving certificate, serving key).
pub fn bed_tls() -> (PathBuf, PathBuf, PathBuf) {
    let tls = bed_dir().join("tls");
    (tls.join("ca.pem"), tls.join("cert.pem"), tls.join("key.pem"))
}

/// Whether `<agent>:<version>` (a repository under [`BED_PATH`]) is in the bed's storage: the tag's link file
/// the registry writes last when it takes a manifest.
pub fn bed_has(repository: &str, tag: &str) -> bool {
    tags_dir(repository).join(tag).join("current/link").exists()
}

/// The tags of a repository under [`BED_PATH`] in the bed's storage (e.g. `charts/kcp-keeper`: every version
/// published there), sorted.
pub fn bed_tags(repository: &str) -> Vec<String> {
    let mut tags: Vec<String> = std::fs::read_dir(tags_dir(repository))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("current/link").exists())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    tags.sort();
    tags
}

fn tags_dir(repository: &str) -> PathBuf {
    bed_storage().join("docker/registry/v2/repositories").join(BED_PATH).join(repository).join("_manifests/tags")
}

/// The registry's configuration: filesystem `storage`, TLS on `addr` (`host:port`), deletes refused (a published
/// version is never taken back), and, with `read_only`, every write refused (the nodes' registries serve what
/// the bed published, several at once, from one storage). No telemetry leaves the process: Distribution's
/// OpenTelemetry exporter is switched off by the environment the caller sets ([`ENV`]).
pub fn config(storage: &Path, addr: &str, cert: &Path, key: &Path, read_only: bool) -> String {
    format!(
        "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: false\n  maintenance:\n    uploadpurging:\n      enabled: false\n    readonly:\n      enabled: {read_only}\nhttp:\n  addr: {addr}\n  secret: kcp-keeper-bed\n  tls:\n    certificate: {cert}\n    key: {key}\n",
        storage = storage.display(),
        cert = cert.display(),
        key = key.display(),
    )
}

/// The environment the registry runs with: no OpenTelemetry export (it would try to reach a collector).
pub const ENV: &[(&str, &str)] = &[("OTEL_TRACES_EXPORTER", "none"), ("OTEL_SDK_DISABLED", "true")];
