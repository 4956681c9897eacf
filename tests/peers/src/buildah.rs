//! buildah as the test bed uses it: rootful, the vfs storage driver (no overlay mounts needed inside the test
//! bed's namespaces), its storage under the machine cache so every checkout shares what was built. The agents'
//! images (the xtask) and the seed layout's (testbed::seed) each keep a store of their own, so pruning one never
//! removes the other's.

use std::process::Command;

use crate::{Error, Result, cache_root};

/// One buildah storage under the machine cache, named by its directory.
#[derive(Debug, Clone, Copy)]
pub struct Store(pub &'static str);

/// The agents' images, built by `cargo xtask images`.
pub const AGENTS: Store = Store("buildah");
/// The seed layout's images (kcp, etcd, the operator, cert-manager), built by testbed::seed on first use.
pub const SEED: Store = Store("buildah-seed");

impl Store {
    /// The store's directory under the machine cache.
    pub fn root(self) -> std::path::PathBuf {
        cache_root().join(self.0)
    }

    /// `buildah <args>` on this store.
    pub fn command(self, args: &[&str]) -> Command {
        let root = self.root();
        let mut cmd = Command::new("buildah");
        cmd.arg("--root").arg(root.join("storage"));
        cmd.arg("--runroot").arg(root.join("run"));
        cmd.args(["--storage-driver", "vfs"]).args(args);
        cmd
    }

    /// Runs `buildah <args>` on this store and returns its stdout, failing with its stderr.
    pub fn output(self, args: &[&str]) -> Result<String> {
        let output =
            self.command(args).output().map_err(|e| Error::Io("starting buildah (the xtask installs it)".into(), e))?;
        if !output.status.success() {
            return Err(Error::Other(format!(
                "`buildah {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}
