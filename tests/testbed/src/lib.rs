//! The test bed: real peers started on 127.0.0.1 with free ports and temp dirs, stopped on drop, as
//! controller-runtime's envtest does for Go operators. Used by every cross-process test and by the demo.
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! let bed = testbed::ControlPlane::start().await?;
//! let ns = bed.namespace().await?;
//! let client = bed.client();
//! # Ok(()) }
//! ```

pub mod agent_process;
pub mod alert_rules;
pub mod apiserver;
pub mod audit;
pub mod certs;
pub mod coredns;
pub mod crds;
pub mod etcd;
pub mod fault_proxy;
pub mod helm;
pub mod http;
pub mod kcp;
pub mod leaks;
pub mod metrics;
pub mod node;
pub mod operators;
pub mod peer_net;
pub mod process;
pub mod projection;
pub mod registry;
pub mod s3;
pub mod scrape;
pub mod seed;
pub mod template;
pub mod tls;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};

pub use apiserver::ApiServer;
pub use coredns::CoreDns;
pub use etcd::Etcd;
pub use leaks::assert_no_secret_material;
pub use s3::S3Server;

/// Installs the rustls crypto provider once per process (two providers are linked: kube's ring and the
/// AWS SDK's aws-lc, so rustls cannot pick one by itself).
pub fn init_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// An etcd, a kube-apiserver on it with RBAC and client-certificate users, and the kcp-operator and
/// cert-manager CRDs installed. Further peers (S3, CoreDNS, shard etcds, kcp) start on demand in the same temp dir.
pub struct ControlPlane {
    pub peers: peers::Peers,
    pub etcd: Etcd,
    pub apiserver: ApiServer,
    client: kube::Client,
    /// Last, so it is removed after the etcd and the apiserver above have stopped.
    dir: BedDir,
}

/// The bed's temp dir, removed after the etcd and the apiserver above (it is the last field). `TempDir` gives up
/// silently at the first error; this says so instead. Whatever else writes into the dir (kcp, S3, agents, which
/// stop their drills on SIGTERM) is stopped by its owner before the bed is dropped.
struct BedDir(Option<tempfile::TempDir>);

impl Drop for BedDir {
    fn drop(&mut self) {
        let Some(dir) = self.0.take() else { return };
        let path = dir.keep();
        if let Err(e) = std::fs::remove_dir_all(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("test bed: {} not removed: {e}", path.display());
        }
    }
}

impl ControlPlane {
    /// Starts a one-member etcd and the apiserver. The etcd starts from a copy of [`template`]'s: what a fresh
    /// apiserver writes at start and the CRDs are there already, so only their start is paid, not their writes.
    pub async fn start() -> Result<Self> {
        init_crypto();
        let peers = peers::locate()?;
        let mut crds = crds::read(peers.path("cert-manager-crds"))?;
        crds.extend(crds::read(&crds::kcp_operator())?);
        let dir = tempfile::Builder::new().prefix("kcp-keeper-testbed-").tempdir()?;
        let etcd_dir = dir.path().join("etcd");
        std::fs::create_dir_all(&etcd_dir)?;
        template::copy_sparse(&template::member_dir(&peers, &crds).await?, &etcd_dir.join(template::member()))?;
        let etcd = Etcd::start(peers.path("etcd"), &etcd_dir, template::ETCD_NAME, 1).await?;
        let apiserver = ApiServer::start(peers.path("kube-apiserver"), dir.path(), &etcd.client_urls()).await?;
        let client = apiserver.admin_client().await?;
        // The apiserver reads the copied CRDs at start; each must be served before a test uses it.
        crds::wait_established(&client, crds.iter().filter_map(|c| c.metadata.name.clone()).collect())
            .await
            .context("the template's CRDs")?;
        Ok(Self { peers, etcd, apiserver, client, dir: BedDir(Some(dir)) })
    }

    /// The admin client (`system:masters`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// A client for a client-certificate user with these groups; RBAC decides what it may do.
    pub async fn user_client(&self, user: &str, groups: &[&str]) -> Result<kube::Client> {
        self.apiserver.user_client(user, groups).await
    }

    /// Creates ServiceAccount `namespace/name`, mints a token for it (TokenRequest, one hour) and returns a
    /// kubeconfig using it, and the user name the apiserver knows it by.
    pub async fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> Result<(PathBuf, String)> {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        use k8s_openapi::api::core::v1::ServiceAccount;
        let accounts = Api::<ServiceAccount>::namespaced(self.client(), namespace);
        let account = ServiceAccount {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            ..Default::default()
        };
        accounts.create(&PostParams::default(), &account).await.context("creating the ServiceAccount")?;
        let request = TokenRequest {
            spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
            ..Default::default()
        };
        let minted =
            accounts.create_token_request(name, &PostParams::default(), &request).await.context("TokenRequest")?;
        let token = minted.status.and_then(|s| s.token).context("the TokenRequest has no token")?;
        let user = format!("system:serviceaccount:{namespace}:{name}");
        Ok((self.apiserver.token_kubeconfig(&user, &token)?, user))
    }

    /// The temp dir holding every peer's data and logs.
    pub fn dir(&self) -> &Path {
        self.dir.0.as_ref().expect("dir is kept until drop").path()
    }

    /// A fresh directory inside the bed's temp dir.
    pub fn subdir(&self, name: &str) -> Result<PathBuf> {
        let path = self.dir().join(format!("{name}-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&path)?;
        Ok(path)
    }

    /// Creates a namespace with a random name for one test.
    pub async fn namespace(&self) -> Result<String> {
        let name = format!("test-{:08x}", rand::random::<u32>());
        self.create_namespace(&name).await?;
        Ok(name)
    }

    /// Creates a namespace with a given name.
    pub async fn create_namespace(&self, name: &str) -> Result<()> {
        let ns =
            Namespace { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() };
        Api::<Namespace>::all(self.client()).create(&PostParams::default(), &ns).await?;
        Ok(())
    }

    /// Starts the S3 server (versitygw) with a bucket.
    pub async fn s3(&self) -> Result<S3Server> {
        S3Server::start(self.peers.path("versitygw"), &self.subdir("s3")?).await
    }

    /// Starts CoreDNS with `corefile` (see [`coredns::KUBEADM_COREFILE`] for the placeholders).
    pub async fn coredns(&self, corefile: &str) -> Result<CoreDns> {
        CoreDns::start(self.peers.path("coredns"), &self.subdir("coredns")?, corefile, &self.apiserver.admin_kubeconfig)
            .await
    }

    /// Starts real kcp (root shard, `alpha`, front proxy, an etcd each) in this bed's temp dir; the front proxy's
    /// certificate also names `front_proxy_hostnames`. Tests share one per binary instead: [`kcp::shared`].
    pub async fn kcp(&self, front_proxy_hostnames: &[&str]) -> Result<kcp::Kcp> {
        kcp::Kcp::start(&self.peers, &self.subdir("kcp")?, front_proxy_hostnames).await
    }

    /// Starts another etcd cluster (a kcp shard's) with 1 or 3 members.
    pub async fn etcd(&self, name: &str, members: usize) -> Result<Etcd> {
        Etcd::start(self.peers.path("etcd"), &self.subdir(name)?, name, members).await
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // A failed test keeps its data and logs; a passing one cleans up.
        if std::thread::panicking()
            && let Some(dir) = self.dir.0.take()
        {
            eprintln!("test bed files kept in {}", dir.keep().display());
        }
    }
}

/// Polls `f` until it returns `Some`, panicking with `what` after `timeout`. For asserting on what an agent
/// running in another process eventually does.
pub async fn eventually<T, F, Fut>(timeout: std::time::Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// [`eventually`] for a poll that can fail and can say what it saw: `f` gives `Ok(Ok(v))` when the condition
/// holds, `Ok(Err(seen))` to poll again, and `Err(e)` to stop with that error. On timeout the error names `what`
/// and the last `seen`, so a test that never got there says where it was.
pub async fn eventually_seen<T, F, Fut>(timeout: std::time::Duration, what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<std::result::Result<T, String>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let seen = match f().await? {
            Ok(v) => return Ok(v),
            Err(seen) => seen,
        };
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}; last seen: {seen}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A peer shared by every test of one test binary: `start` runs once, on first use, on a thread that lives as
/// long as the binary, because the kernel kills a peer when the thread that spawned it exits (PR_SET_PDEATHSIG)
/// and each test runs on a thread of its own. A failed start panics every test that asks, with its cause.
pub fn shared_for_binary<T, F, Fut>(cell: &'static OnceLock<Result<T, String>>, name: &str, start: F) -> &'static T
where
    T: Send + Sync + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T>>,
{
    let result = cell.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
                let result = match runtime {
                    Ok(rt) => rt.block_on(start()).map_err(|e| format!("{e:#}")),
                    Err(e) => Err(format!("building a runtime: {e}")),
                };
                let _ = tx.send(result);
                loop {
                    std::thread::park();
                }
            })
            .expect("spawning a shared peer's thread");
        rx.recv().unwrap_or_else(|_| Err(format!("the {name} thread died")))
    });
    match result {
        Ok(peer) => peer,
        Err(e) => panic!("the shared {name} did not start: {e}"),
    }
}
