//! A real OCI registry for the test bed: the CNCF Distribution registry (peer `registry`), serving TLS with the
//! bed registry's certificate (`peers::registry::bed_tls`, made by `cargo xtask images`).
//!
//! [`Registry::start`] runs one on loopback with an empty storage of its own, writable: the publish tests push
//! to it. The nodes (`testbed::node`) run theirs inside their network namespace over the storage `cargo xtask
//! images` published to, read-only.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::process::Process;

/// A registry on loopback, stopped when dropped.
pub struct Registry {
    /// `127.0.0.1:<port>`.
    pub host: String,
    /// The CA its certificate chains to.
    pub ca_file: PathBuf,
    /// Its storage (the Distribution layout) and its log.
    pub dir: PathBuf,
    process: Process,
}

/// The bed registry's CA, failing with what to run when `cargo xtask images` has not made it.
pub fn bed_ca() -> Result<PathBuf> {
    let (ca, cert, key) = peers::registry::bed_tls();
    ensure!(
        ca.exists() && cert.exists() && key.exists(),
        "the test bed's registry has no TLS files in {}: run `cargo xtask images` (cargo xtask test does)",
        peers::registry::bed_dir().display()
    );
    Ok(ca)
}

impl Registry {
    /// A writable registry with an empty storage under `dir`, on a free loopback port; returns once it answers.
    pub fn start(peers: &peers::Peers, dir: &Path) -> Result<Self> {
        let ca_file = bed_ca()?;
        let (_, cert, key) = peers::registry::bed_tls();
        std::fs::create_dir_all(dir.join("storage"))?;
        let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port();
        let host = format!("127.0.0.1:{port}");
        let config = dir.join("config.yml");
        std::fs::write(&config, peers::registry::config(&dir.join("storage"), &host, &cert, &key, false))?;
        let process = Process::start_with_env(
            "registry",
            peers.path("registry"),
            vec!["serve".into(), config.display().to_string()],
            peers::registry::ENV,
            dir.join("registry.log"),
        )?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&host).is_err() {
            ensure!(Instant::now() < deadline, "the registry did not listen on {host} within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self { host, ca_file, dir: dir.to_path_buf(), process })
    }

    /// Whether the registry holds `<repository>:<tag>` (its storage's tag link, written last when it takes a
    /// manifest).
    pub fn has(&self, repository: &str, tag: &str) -> bool {
        self.dir
            .join("storage/docker/registry/v2/repositories")
            .join(repository)
            .join("_manifests/tags")
            .join(tag)
            .join("current/link")
            .exists()
    }

    /// Its access log so far.
    pub fn log(&self) -> Result<String> {
        std::fs::read_to_string(self.dir.join("registry.log")).context("reading the registry's log")
    }

    /// Stops it (a registry that is down, for the tests of what a client then says).
    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(5));
    }
}
