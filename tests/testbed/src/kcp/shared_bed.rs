//! One kcp bed for many test binaries. kcp takes about a minute to start on this machine, and five test binaries
//! need one; `cargo xtask test` therefore starts a single bed process (the `kcp-bed` binary, [`serve`]) and
//! names the file it describes the bed in with [`ENV`] for every test binary, as envtest's
//! `USE_EXISTING_CLUSTER` does. [`super::shared`] attaches to that bed instead of starting its own; a plain
//! `cargo test` (no [`ENV`]) still starts one per binary.
//!
//! The file carries the CAs' private keys: a test issues client certificates from the client CA and writes the
//! server CA Secret as kcp-operator does. It is the bed's own credentials, written 0600 beside the bed's logs.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::pki::KcpPki;
use super::{FrontProxy, Kcp, SHARDS, Shard};
use crate::etcd::{Etcd, EtcdMember};
use crate::process::Process;

/// The environment variable naming a shared bed's file.
pub const ENV: &str = "KCP_KEEPER_TEST_KCP";
/// The file a bed started in `dir` describes itself in.
pub const FILE: &str = "bed.json";
/// How long a test binary waits for the bed to write its file: the bed may still be starting when the first
/// test binaries run (kcp's own start allows four minutes per process).
const ATTACH_TIMEOUT: Duration = Duration::from_secs(900);

/// What a bed process writes once: its description, or why it could not start.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum BedFile {
    Ready(Box<Description>),
    Failed(String),
}

/// Everything a test binary reads of a [`Kcp`]: addresses, files and credentials, no process.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Description {
    dir: PathBuf,
    etcdctl: PathBuf,
    ready_in_ms: u64,
    pki: super::pki::PkiPem,
    shards: Vec<ShardEntry>,
    front_proxy_url: String,
    front_proxy_client_ca_file: PathBuf,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ShardEntry {
    name: String,
    url: String,
    admin_kubeconfig: PathBuf,
    etcd: Vec<MemberEntry>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MemberEntry {
    name: String,
    client_url: String,
    peer_url: String,
}

impl Kcp {
    fn describe(&self) -> Description {
        Description {
            dir: self.dir.clone(),
            etcdctl: self.etcdctl.clone(),
            ready_in_ms: self.ready_in.as_millis() as u64,
            pki: self.pki.to_pem(),
            shards: self
                .shards
                .iter()
                .map(|s| ShardEntry {
                    name: s.name.into(),
                    url: s.url.clone(),
                    admin_kubeconfig: s.admin_kubeconfig.clone(),
                    etcd: s
                        .etcd
                        .members
                        .iter()
                        .map(|m| MemberEntry {
                            name: m.name.clone(),
                            client_url: m.client_url.clone(),
                            peer_url: m.peer_url.clone(),
                        })
                        .collect(),
                })
                .collect(),
            front_proxy_url: self.front_proxy.url.clone(),
            front_proxy_client_ca_file: self.front_proxy.client_ca_file.clone(),
        }
    }

    /// The bed `d` describes, its processes owned by the bed process ([`Process::elsewhere`]): their logs are
    /// read from where [`Kcp::start`] puts them.
    fn from_description(d: Description) -> Result<Self> {
        let mut shards = Vec::new();
        for entry in d.shards {
            let name = SHARDS
                .into_iter()
                .find(|n| *n == entry.name)
                .with_context(|| format!("the shared bed names a shard {} this test bed does not run", entry.name))?;
            let shard_dir = d.dir.join(name);
            let members = entry
                .etcd
                .into_iter()
                .map(|m| EtcdMember {
                    process: Process::elsewhere(&m.name, shard_dir.join("etcd").join(format!("{}.log", m.name))),
                    name: m.name,
                    client_url: m.client_url,
                    peer_url: m.peer_url,
                })
                .collect();
            shards.push(Shard {
                name,
                url: entry.url,
                etcd: Etcd { members, peers: None },
                process: Process::elsewhere(&format!("kcp {name} shard"), shard_dir.join("kcp.log")),
                admin_kubeconfig: entry.admin_kubeconfig,
            });
        }
        let front_proxy = FrontProxy {
            url: d.front_proxy_url,
            process: Process::elsewhere("kcp-front-proxy", d.dir.join("front-proxy").join("front-proxy.log")),
            client_ca_file: d.front_proxy_client_ca_file,
        };
        Ok(Self {
            pki: KcpPki::from_pem(&d.pki)?,
            shards,
            front_proxy,
            etcdctl: d.etcdctl,
            ready_in: Duration::from_millis(d.ready_in_ms),
            dir: d.dir,
        })
    }
}

/// The bed process: starts kcp under `dir` (cleared first), writes `dir`/[`FILE`] and keeps kcp running until
/// its standard input closes (the xtask that started it ended or stopped it). A failed start is written to the
/// file too, so test binaries waiting for it fail at once with the reason. Runs on the calling thread: the kernel
/// kills each peer when the thread that started it exits (PR_SET_PDEATHSIG), and this one lives as long as the
/// bed does.
pub fn serve(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let started = runtime.block_on(async {
        let peers = peers::locate_only(super::PEERS)?;
        Kcp::start(&peers, &dir.join("kcp"), &[]).await
    });
    let kcp = match started {
        Ok(kcp) => kcp,
        Err(e) => {
            write_file(dir, &BedFile::Failed(format!("{e:#}")))?;
            return Err(e);
        }
    };
    write_file(dir, &BedFile::Ready(Box::new(kcp.describe())))?;
    eprintln!("testbed: kcp: the shared bed is ready: {}={}", ENV, dir.join(FILE).display());
    // Until the xtask closes our stdin (or dies: then the pipe closes too, and the parent-death signal comes).
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    eprintln!("testbed: kcp: stopping the shared bed");
    drop(kcp);
    Ok(())
}

/// Writes the file whole or not at all (a test binary may be polling for it): a temporary file, then a rename.
fn write_file(dir: &Path, content: &BedFile) -> Result<()> {
    let tmp = dir.join(format!("{FILE}.tmp"));
    let mut file = std::fs::File::options().create(true).truncate(true).write(true).mode(0o600).open(&tmp)?;
    file.write_all(&serde_json::to_vec(content)?)?;
    file.sync_all()?;
    std::fs::rename(&tmp, dir.join(FILE)).with_context(|| format!("writing {}", dir.join(FILE).display()))
}

/// The bed described by `file`, waiting (up to [`ATTACH_TIMEOUT`]) until the bed process has written it, and
/// checking the front proxy answers before any test relies on it.
pub(super) async fn attach(file: &Path) -> Result<Kcp> {
    super::progress(&format!("attaching to the shared kcp bed of {} ({ENV})", file.display()));
    let deadline = tokio::time::Instant::now() + ATTACH_TIMEOUT;
    let text = loop {
        match std::fs::read(file) {
            Ok(text) => break text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => bail!("reading the shared kcp bed's file {} ({ENV}): {e}", file.display()),
        }
    };
    let kcp = match serde_json::from_slice(&text).with_context(|| format!("parsing {}", file.display()))? {
        BedFile::Ready(d) => Kcp::from_description(*d)?,
        BedFile::Failed(why) => bail!("the shared kcp bed did not start: {why}"),
    };
    let client = kcp.admin_client("root").await?;
    client
        .request_text(http::Request::get("/readyz").body(Vec::new())?)
        .await
        .with_context(|| format!("the shared kcp bed's front proxy {} does not answer", kcp.front_proxy.url))?;
    Ok(kcp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, UnixTime};

    fn description(pki: &KcpPki) -> Description {
        Description {
            dir: "/bed".into(),
            etcdctl: "/peers/etcdctl".into(),
            ready_in_ms: 41_500,
            pki: pki.to_pem(),
            shards: SHARDS
                .iter()
                .map(|name| ShardEntry {
                    name: name.to_string(),
                    url: format!("https://127.0.0.1:1{}", name.len()),
                    admin_kubeconfig: format!("/bed/{name}/admin.kubeconfig").into(),
                    etcd: vec![MemberEntry {
                        name: format!("{name}-etcd-0"),
                        client_url: "http://127.0.0.1:2379".into(),
                        peer_url: "http://127.0.0.1:2380".into(),
                    }],
                })
                .collect(),
            front_proxy_url: "https://127.0.0.1:6443".into(),
            front_proxy_client_ca_file: "/bed/ca/root-client-ca/tls.crt".into(),
        }
    }

    /// Read back through the file's JSON, as a test binary reads it.
    fn round_trip(d: Description) -> Kcp {
        let json = serde_json::to_vec(&BedFile::Ready(Box::new(d))).unwrap();
        match serde_json::from_slice(&json).unwrap() {
            BedFile::Ready(d) => Kcp::from_description(*d).unwrap(),
            BedFile::Failed(why) => panic!("{why}"),
        }
    }

    #[test]
    fn a_client_certificate_issued_by_an_attached_bed_verifies_against_the_beds_own_client_ca() {
        crate::init_crypto();
        let pki = KcpPki::new().unwrap();
        let attached = round_trip(description(&pki));
        let cred = attached.pki.client("kcp-admin", &["system:kcp:admin"], Duration::from_secs(3600)).unwrap();

        // Verified as kcp verifies it: the bed's client CA bundle (--client-ca-file) as the only root.
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(pki.client_ca.cert_pem().as_bytes()).unwrap()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder(roots.into()).build().unwrap();
        let leaf = CertificateDer::from_pem_slice(cred.cert_pem.as_bytes()).unwrap();
        verifier.verify_client_cert(&leaf, &[], UnixTime::now()).expect("the bed's client CA accepts it");

        // And a CA of another bed does not.
        let other = KcpPki::new().unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(other.client_ca.cert_pem().as_bytes()).unwrap()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder(roots.into()).build().unwrap();
        assert!(verifier.verify_client_cert(&leaf, &[], UnixTime::now()).is_err());
    }

    #[test]
    fn an_attached_bed_has_the_beds_addresses_certificates_and_log_files_and_owns_no_process() {
        let pki = KcpPki::new().unwrap();
        let attached = round_trip(description(&pki));
        assert_eq!(attached.front_proxy.url, "https://127.0.0.1:6443");
        assert_eq!(attached.pki.server_ca_bundle(), pki.server_ca_bundle());
        assert_eq!(attached.pki.service_account_key_pem(), pki.service_account_key_pem());
        assert_eq!(attached.shard("alpha").etcd.client_urls(), "http://127.0.0.1:2379");
        assert_eq!(attached.ready_in, Duration::from_millis(41_500));
        for shard in &attached.shards {
            assert_eq!(shard.process.pid(), None, "{}", shard.name);
            assert!(shard.etcd.members.iter().all(|m| m.process.pid().is_none()));
        }
        assert_eq!(attached.front_proxy.process.pid(), None);
    }

    #[test]
    fn a_shard_this_bed_does_not_run_is_refused() {
        let pki = KcpPki::new().unwrap();
        let mut d = description(&pki);
        d.shards[1].name = "beta".into();
        let err = Kcp::from_description(d).err().expect("refused");
        assert!(format!("{err:#}").contains("shard beta"), "{err:#}");
    }

    #[test]
    fn a_bed_that_failed_to_start_is_reported_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        write_file(dir.path(), &BedFile::Failed("kcp root shard exited".into())).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let err = runtime.block_on(attach(&dir.path().join(FILE))).err().expect("an error");
        assert!(format!("{err:#}").contains("did not start: kcp root shard exited"), "{err:#}");
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(dir.path().join(FILE)).unwrap().permissions());
        assert_eq!(mode & 0o077, 0, "the file holds CA keys: only its owner reads it");
    }
}
