//! Real kcp on loopback: a root shard and a second shard (`alpha`), each on its own etcd, behind a
//! `kcp-front-proxy`, with certificates laid out as kcp-operator lays them out ([`pki`]).
//!
//! kcp takes tens of seconds to become ready, so a test binary starts it once ([`shared`]) and each test works in
//! its own workspace ([`Kcp::workspace`]); `cargo xtask test` goes further and starts one for every test binary
//! ([`shared_bed`]). The demo starts its own ([`Kcp::start`]).

pub mod args;
pub mod pki;
pub mod shared_bed;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use crate::Etcd;
use crate::process::{Process, free_port, wait_until};
use pki::{ADMIN_GROUP, ADMIN_USER, KcpPki, write, write_ca_secret};

/// kcp writes no Shard label of its own; the bed labels each Shard object with this so a workspace can be placed
/// on a chosen shard (`spec.location.selector`).
pub const SHARD_LABEL: &str = "kcp-keeper.test/shard";
/// The shards the bed runs, root first.
pub const SHARDS: [&str; 2] = ["root", "alpha"];

/// How long a kcp process may take to answer `/readyz` ok. Cold starts on a loaded 2-core machine take tens of
/// seconds.
const READY_TIMEOUT: Duration = Duration::from_secs(240);

pub struct Shard {
    pub name: &'static str,
    pub url: String,
    pub etcd: Etcd,
    pub process: Process,
    /// A kubeconfig (system:masters, directly to this shard) for checks that bypass the front proxy.
    pub admin_kubeconfig: PathBuf,
}

pub struct FrontProxy {
    pub url: String,
    pub process: Process,
    /// The bundle the front proxy authenticates client certificates with (`--client-ca-file`).
    pub client_ca_file: PathBuf,
}

pub struct Kcp {
    pub pki: KcpPki,
    pub shards: Vec<Shard>,
    pub front_proxy: FrontProxy,
    pub etcdctl: PathBuf,
    /// From the first process started until the front proxy and both shards answered `/readyz` ok.
    pub ready_in: Duration,
    pub dir: PathBuf,
}

/// Start-up progress on stderr: kcp is slow enough that a silent start looks hung.
fn progress(msg: &str) {
    eprintln!("testbed: kcp: {msg}");
}

impl Kcp {
    /// Starts the etcds, the root shard, `alpha` and the front proxy under `dir`. The front proxy's serving
    /// certificate also names `front_proxy_hostnames` (the public hostname a kubeconfig or a live check uses).
    pub async fn start(peers: &peers::Peers, dir: &Path, front_proxy_hostnames: &[&str]) -> Result<Self> {
        crate::init_crypto();
        let started = Instant::now();
        let pki = KcpPki::new()?;
        let cas = dir.join("ca");
        let server_ca = write_ca_secret(&cas, "root-server-ca", &pki.ca_secret_data(&pki.server_ca))?;
        let client_ca = write_ca_secret(&cas, "root-client-ca", &pki.ca_secret_data(&pki.client_ca))?;
        let fp_client_ca =
            write_ca_secret(&cas, "root-front-proxy-client-ca", &pki.ca_secret_data(&pki.front_proxy_client_ca))?;
        let server_bundle = write(&cas, "server-ca-bundle.crt", &pki.server_ca_bundle())?;
        let sa_pub = write(&cas, "service-account.pub", pki.service_account_pub_pem())?;
        let sa_key = write(&cas, "service-account.key", pki.service_account_key_pem())?;

        let ports: Vec<u16> = (0..SHARDS.len()).map(|_| free_port()).collect::<Result<_>>()?;
        let fp_port = free_port()?;
        let fp_url = format!("https://127.0.0.1:{fp_port}");
        let root_url = format!("https://127.0.0.1:{}", ports[0]);
        // Credentials kcp's processes use among themselves, all from the client CA.
        let common = dir.join("common");
        let root_admin = write(
            &common,
            "root-shard-admin.kubeconfig",
            &pki.kubeconfig_with_context(&root_url, "shard-admin", &["system:masters"], "shard-base")?,
        )?;
        let (lca, elca) = logical_cluster_admins(&pki, &common, &root_url, &fp_url)?;

        let mut shards = Vec::new();
        for (i, name) in SHARDS.into_iter().enumerate() {
            let shard_dir = dir.join(name);
            progress(&format!("starting the {name} shard's etcd"));
            let etcd = Etcd::start(peers.path("etcd"), &shard_dir.join("etcd"), &format!("{name}-etcd"), 1).await?;
            let url = format!("https://127.0.0.1:{}", ports[i]);
            let serving = pki.serving(&[])?;
            let shard_client =
                pki.client(&format!("kcp-shard-{name}"), &["system:masters"], Duration::from_secs(365 * 24 * 3600))?;
            let flags = args::ShardFlags {
                name: name.into(),
                port: ports[i],
                etcd_servers: etcd.client_urls(),
                root_directory: shard_dir.join("kcp"),
                external_url: fp_url.clone(),
                tls_cert: write(&shard_dir, "tls.crt", &serving.cert_pem)?,
                tls_key: write(&shard_dir, "tls.key", &serving.key_pem)?,
                client_ca: client_ca.join("tls.crt"),
                root_ca: server_ca.join("ca.crt"),
                requestheader_ca: fp_client_ca.join("tls.crt"),
                service_account_pub: sa_pub.clone(),
                service_account_key: sa_key.clone(),
                shard_client_cert: write(&shard_dir, "shard-client.crt", &shard_client.cert_pem)?,
                shard_client_key: write(&shard_dir, "shard-client.key", &shard_client.key_pem)?,
                logical_cluster_admin_kubeconfig: lca.clone(),
                external_logical_cluster_admin_kubeconfig: elca.clone(),
                root_shard_kubeconfig: (i > 0).then(|| root_admin.clone()),
            };
            let admin_kubeconfig =
                write(&shard_dir, "admin.kubeconfig", &pki.kubeconfig(&url, "shard-admin", &["system:masters"])?)?;
            progress(&format!("starting the {name} shard on {url} (log {})", shard_dir.join("kcp.log").display()));
            let process = Process::start(
                &format!("kcp {name} shard"),
                peers.path("kcp"),
                args::shard(&flags),
                shard_dir.join("kcp.log"),
            )?;
            let mut shard = Shard { name, url, etcd, process, admin_kubeconfig };
            // The root shard must serve before another shard can register with it.
            if i == 0 {
                wait_ready(&mut shard.process, &shard.admin_kubeconfig).await?;
                progress(&format!("root shard ready after {:.0?}", started.elapsed()));
            }
            shards.push(shard);
        }
        for shard in shards.iter_mut().skip(1) {
            wait_ready(&mut shard.process, &shard.admin_kubeconfig).await?;
            progress(&format!("{} shard ready after {:.0?}", shard.name, started.elapsed()));
        }

        let fp_dir = dir.join("front-proxy");
        let serving = pki.serving(front_proxy_hostnames)?;
        let request_header =
            pki.front_proxy_client_ca.issue_client("kcp-front-proxy", &[], Duration::from_secs(365 * 24 * 3600))?;
        let rh_cert = write(&fp_dir, "requestheader.crt", &request_header.cert_pem)?;
        let rh_key = write(&fp_dir, "requestheader.key", &request_header.key_pem)?;
        let mapping = args::mapping_yaml(
            &root_url,
            &server_bundle.display().to_string(),
            &rh_cert.display().to_string(),
            &rh_key.display().to_string(),
        );
        // The shards kubeconfig has no server: the front proxy fills in each shard's URL.
        let shards_kubeconfig = pki.kubeconfig("\"\"", "shard-admin", &["system:masters"])?;
        let flags = args::FrontProxyFlags {
            port: fp_port,
            root_directory: fp_dir.join("state"),
            mapping_file: write(&fp_dir, "mapping.yaml", &mapping)?,
            root_kubeconfig: root_admin.clone(),
            shards_kubeconfig: write(&fp_dir, "shards.kubeconfig", &shards_kubeconfig)?,
            client_ca: client_ca.join("tls.crt"),
            tls_cert: write(&fp_dir, "tls.crt", &serving.cert_pem)?,
            tls_key: write(&fp_dir, "tls.key", &serving.key_pem)?,
        };
        let fp_admin = write(&fp_dir, "admin.kubeconfig", &pki.kubeconfig(&fp_url, ADMIN_USER, &[ADMIN_GROUP])?)?;
        progress(&format!("starting the front proxy on {fp_url} (log {})", fp_dir.join("front-proxy.log").display()));
        let mut process = Process::start(
            "kcp-front-proxy",
            peers.path("kcp-front-proxy"),
            args::front_proxy(&flags),
            fp_dir.join("front-proxy.log"),
        )?;
        wait_ready(&mut process, &fp_admin).await?;
        let front_proxy = FrontProxy { url: fp_url, process, client_ca_file: flags.client_ca };

        let mut kcp = Self {
            pki,
            shards,
            front_proxy,
            etcdctl: peers.path("etcdctl").to_path_buf(),
            ready_in: Duration::ZERO,
            dir: dir.to_path_buf(),
        };
        kcp.label_shards().await?;
        kcp.ready_in = started.elapsed();
        progress(&format!("root shard, alpha shard and front proxy ready in {:.1?}", kcp.ready_in));
        Ok(kcp)
    }

    pub fn shard(&self, name: &str) -> &Shard {
        self.shards.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no shard {name}"))
    }

    /// A kubeconfig as kcp-operator renders one for a `Kubeconfig` targeting the front proxy: server
    /// `<front proxy>/clusters/<workspace>`, the server CA bundle, a client certificate from the client CA.
    pub fn admin_kubeconfig(&self, workspace: &str) -> Result<String> {
        self.pki.kubeconfig(&format!("{}/clusters/{workspace}", self.front_proxy.url), ADMIN_USER, &[ADMIN_GROUP])
    }

    /// An admin client (kube + rustls) for a workspace path through the front proxy.
    pub async fn admin_client(&self, workspace: &str) -> Result<kube::Client> {
        client_from_yaml(&self.admin_kubeconfig(workspace)?).await
    }

    /// Starts another root shard process on `etcd_servers` (e.g. an etcd restored from a snapshot of the root
    /// shard's) with this bed's serving certificate and CAs, under `dir`, and waits until its `/readyz` is ok.
    /// Returns the process and its URL.
    ///
    /// It reaches nothing live: its Shard objects still name the bed's shards, and the bed may be shared with
    /// test binaries running now, so its logical-cluster-admin kubeconfigs point at itself and its shard client
    /// certificate comes from a CA of its own that no shard trusts.
    pub async fn start_root_shard_on(
        &self,
        peers: &peers::Peers,
        etcd_servers: &str,
        dir: &Path,
    ) -> Result<(Process, String)> {
        let (root, cas) = (self.dir.join("root"), self.dir.join("ca"));
        let port = free_port()?;
        let url = format!("https://127.0.0.1:{port}");
        let own = dir.join("credentials");
        let (lca, elca) = logical_cluster_admins(&self.pki, &own, &url, &url)?;
        let untrusted =
            KcpPki::new()?.client("kcp-shard-restored", &["system:masters"], Duration::from_secs(24 * 3600))?;
        let flags = args::ShardFlags {
            name: "root".into(),
            port,
            etcd_servers: etcd_servers.into(),
            root_directory: dir.join("kcp"),
            external_url: self.front_proxy.url.clone(),
            tls_cert: root.join("tls.crt"),
            tls_key: root.join("tls.key"),
            client_ca: cas.join("root-client-ca").join("tls.crt"),
            root_ca: cas.join("root-server-ca").join("ca.crt"),
            requestheader_ca: cas.join("root-front-proxy-client-ca").join("tls.crt"),
            service_account_pub: cas.join("service-account.pub"),
            service_account_key: cas.join("service-account.key"),
            shard_client_cert: write(&own, "shard-client.crt", &untrusted.cert_pem)?,
            shard_client_key: write(&own, "shard-client.key", &untrusted.key_pem)?,
            logical_cluster_admin_kubeconfig: lca,
            external_logical_cluster_admin_kubeconfig: elca,
            root_shard_kubeconfig: None,
        };
        let admin = write(dir, "admin.kubeconfig", &self.pki.kubeconfig(&url, "shard-admin", &["system:masters"])?)?;
        let mut process =
            Process::start("kcp restored root shard", peers.path("kcp"), args::shard(&flags), dir.join("kcp.log"))?;
        wait_ready(&mut process, &admin).await?;
        Ok((process, url))
    }

    /// Labels every Shard object (in the root workspace) with [`SHARD_LABEL`] once all have registered.
    async fn label_shards(&self) -> Result<()> {
        let api: Api<DynamicObject> = Api::all_with(self.admin_client("root").await?, &shard_resource());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        for name in SHARDS {
            loop {
                let patch = json!({"metadata": {"labels": {SHARD_LABEL: name}}});
                match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => break,
                    Err(e) if tokio::time::Instant::now() > deadline => {
                        bail!("Shard {name} did not appear in the root workspace: {e}")
                    }
                    // A shard registers its Shard object shortly after it is ready.
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
        Ok(())
    }

    /// Creates a workspace with a random name under root, placed on `shard`, through the front proxy, and waits
    /// until it is Ready.
    pub async fn workspace(&self, shard: &str) -> Result<Workspace> {
        let name = format!("test-{:08x}", rand::random::<u32>());
        let api: Api<DynamicObject> = Api::all_with(self.admin_client("root").await?, &workspace_resource());
        let mut ws = DynamicObject::new(&name, &workspace_resource());
        ws.data = json!({"spec": {"location": {"selector": {"matchLabels": {SHARD_LABEL: shard}}}}});
        let params = PostParams::default();
        match retry_bad_gateway(|| api.create(&params, &ws)).await {
            Ok(_) => {}
            // 409: a retried create whose first attempt did reach the shard.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e).with_context(|| format!("creating workspace {name}")),
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let ws = api.get(&name).await?;
            if ws.data["status"]["phase"] == "Ready" {
                let cluster = ws.data["spec"]["cluster"].as_str().context("a Ready workspace names its cluster")?;
                let url = ws.data["spec"]["URL"].as_str().unwrap_or_default();
                return Ok(Workspace { path: format!("root:{name}"), name, cluster: cluster.into(), url: url.into() });
            }
            if tokio::time::Instant::now() > deadline {
                bail!("workspace {name} not Ready within 60s: {}", ws.data["status"]);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Keys in a shard's etcd that contain `needle` (read with etcdctl, as an operator would).
    pub fn etcd_keys_containing(&self, shard: &str, needle: &str) -> Result<Vec<String>> {
        let endpoints = self.shard(shard).etcd.client_urls();
        let out = std::process::Command::new(&self.etcdctl)
            .args(["--endpoints", &endpoints, "get", "/", "--prefix", "--keys-only"])
            .output()
            .context("running etcdctl")?;
        if !out.status.success() {
            bail!("etcdctl get failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).lines().filter(|k| k.contains(needle)).map(String::from).collect())
    }

    /// The tail of every kcp process's log, for a failing test.
    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        for p in self.shards.iter().map(|s| &s.process).chain([&self.front_proxy.process]) {
            out.push_str(&format!("===== {} log =====\n{}\n", p.name(), p.log_tail()));
        }
        out
    }

    /// Prints [`Kcp::log_tails`] when dropped during a panic: the shared bed is never dropped, so a test holds one
    /// of these to keep kcp's side of a failure visible.
    pub fn logs_on_failure(&self) -> LogsOnFailure<'_> {
        LogsOnFailure(self)
    }
}

pub struct LogsOnFailure<'a>(&'a Kcp);

impl Drop for LogsOnFailure<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}kcp files kept in {}", self.0.log_tails(), self.0.dir.display());
        }
    }
}

pub struct Workspace {
    pub name: String,
    /// `root:<name>`, the path clients use in `/clusters/<path>`.
    pub path: String,
    /// The logical cluster's id, as stored in etcd keys.
    pub cluster: String,
    /// `spec.URL`: the front proxy URL clients are told.
    pub url: String,
}

/// Runs a request again while the front proxy answers 502. Go's reverse proxy cannot resend a request whose body
/// it already wrote when the shard closes the HTTP/2 connection (GOAWAY) under it, which happens now and then on a
/// busy machine; a GET is resent by the transport itself, a POST or PATCH surfaces as 502.
pub async fn retry_bad_gateway<T, F, Fut>(mut request: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match request().await {
            Err(kube::Error::Api(s)) if s.code == 502 && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

pub fn workspace_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("tenancy.kcp.io", "v1alpha1", "Workspace"))
}

pub fn shard_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("core.kcp.io", "v1alpha1", "Shard"))
}

pub async fn client_from_yaml(yaml: &str) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::from_yaml(yaml)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// Waits until `/readyz` answers ok to a client with `kubeconfig`'s credentials.
async fn wait_ready(process: &mut Process, kubeconfig: &Path) -> Result<()> {
    let client = crate::apiserver::client_from_file(kubeconfig).await?;
    wait_until(process, READY_TIMEOUT, "ready", || {
        let client = client.clone();
        async move {
            client.request_text(http::Request::get("/readyz").body(Vec::new())?).await?;
            Ok(())
        }
    })
    .await
}

static SHARED: OnceLock<Result<Kcp, String>> = OnceLock::new();
static PRIVATE: OnceLock<Result<Kcp, String>> = OnceLock::new();

/// The kcp of this test binary, shared by every test in it. With [`shared_bed::ENV`] set (`cargo xtask test` sets
/// it) it is the bed that variable's file describes, shared with other test binaries too; else it is started on
/// first use. Either way a test isolates itself in workspaces and objects with names of its own, and changes
/// nothing of the bed itself (its processes, certificates, flags): a test that must, starts a bed of its own
/// ([`private`]).
///
/// A bed of its own is started from a thread that lives as long as the binary, because the kernel kills a peer
/// when the thread that spawned it exits (PR_SET_PDEATHSIG), and each test runs on a thread of its own. Files go
/// under the target directory (`kcp-bed-<binary>`), cleared at the next run, so logs outlive a failed run without
/// piling up.
pub fn shared() -> &'static Kcp {
    match std::env::var_os(shared_bed::ENV).filter(|v| !v.is_empty()) {
        Some(file) => crate::shared_for_binary(&SHARED, "shared kcp bed", move || async move {
            shared_bed::attach(Path::new(&file)).await
        }),
        None => private(),
    }
}

/// A kcp of this test binary's own, whatever [`shared_bed::ENV`] says, shared only by the tests in this binary:
/// for tests that change the bed itself (e.g. replace a shard's serving certificate).
pub fn private() -> &'static Kcp {
    crate::shared_for_binary(&PRIVATE, "kcp bed", start_shared)
}

/// The peers kcp's part of the bed runs.
pub const PEERS: &[&str] = &["etcd", "etcdctl", "kcp", "kcp-front-proxy"];

async fn start_shared() -> Result<Kcp> {
    let peers = peers::locate_only(PEERS)?;
    let exe = std::env::current_exe()?;
    let stem = exe.file_stem().and_then(|s| s.to_str()).unwrap_or("tests").to_string();
    // target/<profile>/deps/<binary> -> target/<profile>/kcp-bed-<binary>
    let base = exe.parent().and_then(Path::parent).context("the test binary has no target directory")?;
    let dir = base.join(format!("kcp-bed-{stem}"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    progress(&format!("starting the shared kcp bed in {}", dir.display()));
    Kcp::start(&peers, &dir, &[]).await
}

/// The kubeconfigs kcp's controllers act through, written under `dir`: the logical-cluster-admin one at
/// `shard_url`, the external one at `external_url` (the front proxy, or the shard itself when it must reach
/// nothing else).
fn logical_cluster_admins(pki: &KcpPki, dir: &Path, shard_url: &str, external_url: &str) -> Result<(PathBuf, PathBuf)> {
    let lca = pki.kubeconfig(shard_url, "logical-cluster-admin", &["system:kcp:logical-cluster-admin"])?;
    let elca =
        pki.kubeconfig(external_url, "external-logical-cluster-admin", &["system:kcp:external-logical-cluster-admin"])?;
    Ok((
        write(dir, "logical-cluster-admin.kubeconfig", &lca)?,
        write(dir, "external-logical-cluster-admin.kubeconfig", &elca)?,
    ))
}
