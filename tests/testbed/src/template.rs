//! The control plane's etcd as it stands once a fresh apiserver has bootstrapped and the CRDs are Established,
//! built once per machine and copied into every [`crate::ControlPlane`]. A fresh start spends about half of an
//! apiserver's start-up CPU writing its bootstrap objects and installing the CRDs (measured here: 4.5-5.3 CPU
//! seconds fresh, 2.2-2.7 from a copy, and 3 to 5 s less wall time), and a full test run starts some two hundred
//! control planes on two cores. Each bed still runs an apiserver and an etcd of its own; only their first
//! minute of writes is shared.
//!
//! The copy is keyed by everything that shapes it (the apiserver and etcd builds, the CRDs, [`FORMAT`]), so a new
//! pin or CRD builds a new one. It is built under the peers' lock in the machine cache (`<cache>/testbed`), in a
//! scratch directory renamed into place once complete, so a killed build leaves nothing that is read as a template
//! (and the next build's lock removes what it left).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::{ApiServer, Etcd, crds};

/// Bumped when what a template holds, or how it is made, changes.
const FORMAT: u32 = 1;
/// The template's name in the cache, before its key; its lock and scratch dirs are named after it too.
const NAME: &str = "control-plane";
/// The etcd cluster's name in a bed, and so its one member's data directory (`<name>-0`).
pub const ETCD_NAME: &str = "kube";
/// How long the template's apiserver and etcd may take to stop cleanly (etcd commits its database on SIGTERM).
const STOP_GRACE: Duration = Duration::from_secs(20);

/// The template's member data directory, built first if this machine has none for these peers and CRDs.
pub async fn member_dir(peers: &peers::Peers, crds: &[CustomResourceDefinition]) -> Result<PathBuf> {
    member_dir_in(&peers::cache_root().join("testbed"), peers, crds).await
}

/// [`member_dir`] with the cache directory given.
pub async fn member_dir_in(root: &Path, peers: &peers::Peers, crds: &[CustomResourceDefinition]) -> Result<PathBuf> {
    let key = format!("{:016x}", key(peers, crds)?);
    let placed = root.join(format!("{NAME}-{key}"));
    let ready = placed.join(member());
    if ready.is_dir() {
        return Ok(ready);
    }
    // Test binaries and the threads inside one ask at once; one builds, the others wait and copy. The peers'
    // lock also clears what a killed build left.
    let _lock = peers::lock_peer(root, NAME, &key)?;
    if ready.is_dir() {
        return Ok(ready);
    }
    let scratch = root.join(format!(".build-{NAME}-{}", std::process::id()));
    let built = build(peers, crds, &scratch).await;
    let result = built.and_then(|built_member| {
        // Sparse, so the WAL's preallocated tail costs no disk in the cache nor in each copy.
        let staged = scratch.join("template");
        std::fs::create_dir_all(&staged)?;
        copy_sparse(&built_member, &staged.join(member()))?;
        std::fs::rename(&staged, &placed).with_context(|| format!("placing {}", placed.display()))
    });
    let _ = std::fs::remove_dir_all(&scratch);
    result.context("building the control plane's etcd template")?;
    eprintln!("test bed: built the control plane template {}", ready.display());
    Ok(ready)
}

/// Copies a template member directory to `to` (which must not exist), keeping holes as holes.
pub fn copy_sparse(from: &Path, to: &Path) -> Result<()> {
    let status = Command::new("cp").args(["-a", "--sparse=always"]).arg(from).arg(to).status().context("running cp")?;
    ensure!(status.success(), "cp -a {} {} failed: {status}", from.display(), to.display());
    Ok(())
}

/// The member directory's name inside an etcd cluster's directory.
pub fn member() -> String {
    format!("{ETCD_NAME}-0")
}

/// Starts a one-member etcd and an apiserver in `dir`, waits for the apiserver, installs the CRDs, and stops both
/// cleanly; returns the member's data directory.
async fn build(peers: &peers::Peers, crds: &[CustomResourceDefinition], dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let mut etcd = Etcd::start(peers.path("etcd"), &dir.join("etcd"), ETCD_NAME, 1).await?;
    let mut apiserver = ApiServer::start(peers.path("kube-apiserver"), dir, &etcd.client_urls()).await?;
    let client = apiserver.admin_client().await?;
    crds::install(&client, crds.to_vec()).await.context("installing CRDs")?;
    drop(client);
    apiserver.process.stop(STOP_GRACE);
    // etcd commits and closes its database on SIGTERM, then dies of the signal it re-raises: exited is enough.
    let stopped = etcd.members[0].process.signal_and_wait(nix::sys::signal::Signal::SIGTERM, STOP_GRACE);
    ensure!(stopped.is_some(), "the template's etcd did not stop within {STOP_GRACE:?} of SIGTERM");
    Ok(dir.join("etcd").join(member()))
}

/// What the template is made of: the peers' paths (which carry their versions), the CRDs, [`FORMAT`].
fn key(peers: &peers::Peers, crds: &[CustomResourceDefinition]) -> Result<u64> {
    let mut hasher = std::hash::DefaultHasher::new();
    FORMAT.hash(&mut hasher);
    for peer in ["etcd", "kube-apiserver"] {
        let path = peers.path(peer);
        path.hash(&mut hasher);
        // A rebuilt binary at the same path (the same pin) writes the same objects; its size tells a changed build.
        std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?.len().hash(&mut hasher);
    }
    serde_json::to_string(crds)?.hash(&mut hasher);
    Ok(hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparse_copy_keeps_content_and_leaves_zero_runs_unallocated() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("from");
        std::fs::create_dir_all(from.join("wal")).unwrap();
        let mut data = vec![7u8; 4096];
        data.extend(vec![0u8; 8 << 20]);
        std::fs::write(from.join("wal").join("0.wal"), &data).unwrap();
        let to = dir.path().join("to");
        copy_sparse(&from, &to).unwrap();
        let copied = to.join("wal").join("0.wal");
        assert_eq!(std::fs::read(&copied).unwrap(), data);
        use std::os::unix::fs::MetadataExt;
        let allocated = std::fs::metadata(&copied).unwrap().blocks() * 512;
        assert!(allocated < 1 << 20, "{allocated} bytes allocated for 4 KiB of data");
    }
}
