//! Peers only the bench needs: the tools a user would install instead of an agent (Gardener's etcd-backup-restore
//! beside etcd-snapshotter, trust-manager beside ca-syncer). They are not in [`crate::PEERS`], so neither
//! `cargo xtask peers` nor `cargo xtask test` (nor [`crate::locate`]) builds or asks for them on a fresh machine;
//! the bench builds the ones it runs on first use, through [`ensure_bench`], into the same cache and with the
//! same scratch-directory, rename and lock mechanism as every other peer.

use std::time::Instant;

use crate::pins::{Peer, Recipe, SourceArchive};
use crate::{Error, Peers, Result, lock_peer, peers_dir};

pub const ETCD_BACKUP_RESTORE: &str = "v0.43.0";
pub const TRUST_MANAGER: &str = "v0.24.0";

pub static BENCH_PEERS: &[Peer] = &[
    Peer {
        name: "etcd-backup-restore",
        version: ETCD_BACKUP_RESTORE,
        recipe: Recipe::Source { source: &ETCD_BACKUP_RESTORE_SOURCE, builds: &[("etcdbrctl", ".")] },
        outputs: &["etcdbrctl"],
        expected_time: "about 3 minutes on 2 cores",
    },
    Peer {
        name: "trust-manager",
        version: TRUST_MANAGER,
        recipe: Recipe::GoInstall {
            packages: &["github.com/cert-manager/trust-manager/cmd/trust-manager"],
            cgo: false,
            tags: "",
        },
        outputs: &["trust-manager"],
        expected_time: "about 3 minutes on 2 cores",
    },
    Peer {
        name: "trust-manager-crds",
        version: TRUST_MANAGER,
        // The Bundle CRD (trust.cert-manager.io) and the newer ClusterBundle one, as the module ships them.
        recipe: Recipe::ModuleFiles {
            module: "github.com/cert-manager/trust-manager",
            subdir: "deploy/crds",
            output: "trust-manager-crds",
        },
        outputs: &["trust-manager-crds"],
        expected_time: "seconds",
    },
];

/// The module proxy refuses `github.com/gardener/etcd-backup-restore` (403), but its tree carries `vendor/`, so the
/// unmodified source archive builds offline, with `-mod=vendor` and no module proxy.
pub static ETCD_BACKUP_RESTORE_SOURCE: SourceArchive = SourceArchive {
    archive: "etcd-backup-restore-v0.43.0/etcd-backup-restore-v0.43.0-src.tar.gz",
    sha256: "fe1c81e5afc8989da7f7eabc8c6dc87c95809308c06c142b371bf23aae3dbc66",
    prefix: "etcd-backup-restore-v0.43.0",
    git_url: "https://github.com/gardener/etcd-backup-restore.git",
    tag: ETCD_BACKUP_RESTORE,
    commit: "833fe16d4c78db408db7970731129ba80294a862",
    ldflags: etcd_backup_restore_ldflags,
    vendored: true,
};

/// What its Makefile stamps (`pkg/version.Version` and `GitSHA`), so its start-up log (`etcd-backup-restore
/// Version: ...`) names the pin.
fn etcd_backup_restore_ldflags(source: &SourceArchive, _go_mod: &str) -> String {
    let pkg = "github.com/gardener/etcd-backup-restore/pkg/version";
    format!("-w -X {pkg}.Version={} -X {pkg}.GitSHA={}", source.tag, source.commit)
}

/// Paths of the named bench-only artefacts (`etcdbrctl`, `trust-manager`, `trust-manager-crds`), building each
/// missing peer first (printing progress to stderr; first time on a machine only).
pub fn ensure_bench(names: &[&str]) -> Result<Peers> {
    let mut artefacts = Vec::new();
    for name in names {
        let peer = BENCH_PEERS
            .iter()
            .find(|p| p.outputs.contains(name))
            .ok_or_else(|| Error::Other(format!("no bench peer builds an artefact named {name}")))?;
        if !peer.is_built() {
            let lock = lock_peer(&peers_dir(), peer.name, peer.version)?;
            // Another caller may have built it while this one waited for the lock.
            if !peer.is_built() {
                eprintln!("peers: building {} {} ({}; first time only)", peer.name, peer.version, peer.expected_time);
                let started = Instant::now();
                crate::build(peer)?;
                eprintln!("peers: built {} {} in {:.0?}", peer.name, peer.version, started.elapsed());
            }
            drop(lock);
        }
        artefacts.extend(peer.artefacts().into_iter().filter(|a| a.name == *name));
    }
    Ok(Peers { artefacts })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_peers_are_apart_from_the_peers_the_tests_build() {
        for peer in BENCH_PEERS {
            assert!(
                crate::PEERS.iter().all(|p| p.name != peer.name && p.outputs.iter().all(|o| !peer.outputs.contains(o))),
                "{} is also in PEERS, so `cargo xtask test` would build it",
                peer.name
            );
        }
    }

    #[test]
    fn etcdbrctl_is_stamped_with_the_pinned_tag_and_commit() {
        let flags = etcd_backup_restore_ldflags(&ETCD_BACKUP_RESTORE_SOURCE, "");
        assert!(flags.contains("pkg/version.Version=v0.43.0"), "{flags}");
        assert!(flags.contains("GitSHA=833fe16d4c78db408db7970731129ba80294a862"), "{flags}");
    }
}
