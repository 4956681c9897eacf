//! NetworkPolicy enforcement on the node, for the tests that ask for it (nothing else runs it): kube-router's
//! firewall alone (`--run-firewall`, no routing, no service proxy), an iptables and ipset implementation, as a
//! process inside the node's namespaces beside kube-proxy. kube-network-policies (nftables and NFQUEUE) was the
//! first choice and cannot run here: this kernel has no nftables `queue` expression (see `peers::pins`).
//! kube-router filters a pod's traffic to other pods (bridged, through br_netfilter) and to the node itself
//! (INPUT), so the apiserver, CoreDNS and the bed's peers on the node address are behind the policy too.
//!
//! Also here: a pod's own network namespace, found through its cgroup, so a test can open a connection or ask a
//! DNS server as the pod does (same address, same veth, same policy) or listen where only pods are, without any
//! tool in its image; and an address on the node's loopback, where NodeLocal DNSCache's listen address lives.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use hickory_resolver::TokioResolver;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RData;

use super::{NODE_NAME, Node, hierarchies, network::spawn_joined, progress};
use crate::apiserver::{SERVICE_CIDR, kubeconfig_yaml};
use crate::process::Process;

/// kube-router's health port inside the node (its own network namespace: nothing else binds it).
const HEALTH_PORT: u16 = 20244;

/// kube-router enforcing NetworkPolicy on the node until dropped; then it is stopped and its iptables chains and
/// ipsets are removed ([`super::scripts::NETPOL_CLEANUP`]), so the node's later tests run without enforcement.
pub struct NetworkPolicyEnforcement<'a> {
    node: &'a Node,
    process: Option<Process>,
}

impl Node {
    /// Starts kube-router's NetworkPolicy firewall inside the node and waits until it answers on its health port.
    /// The bed's own client certificate in `system:masters`, as the bed's CoreDNS has: this is the bed's
    /// infrastructure, not what a test checks.
    pub async fn enforce_network_policies(&self) -> Result<NetworkPolicyEnforcement<'_>> {
        let peers = peers::locate_only(&["kube-router"])?;
        let binary = peers.path("kube-router").to_path_buf();
        let ca = self.client_ca.as_ref().context("the node has not started")?;
        let user = "testbed-kube-router";
        let cred = ca.issue_client(user, &["system:masters"], Duration::from_secs(24 * 3600))?;
        let kubeconfig = self.dir.join("kube-router.inner.kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml("https://127.0.0.1:6443", &self.server_ca_pem, &cred, user))?;
        let args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--run-firewall=true".into(),
            "--run-router=false".into(),
            "--run-service-proxy=false".into(),
            format!("--hostname-override={NODE_NAME}"),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            format!("--health-port={HEALTH_PORT}"),
            "--metrics-port=0".into(),
            "--v=1".into(),
        ];
        let process = self.spawn_inside("kube-router", &binary, args)?;
        let mut enforcement = NetworkPolicyEnforcement { node: self, process: Some(process) };
        enforcement.wait_healthy().await?;
        progress("kube-router enforces NetworkPolicy");
        Ok(enforcement)
    }

    /// A pod's network namespace: the one of a process in its cgroup (kubelet's cgroupfs layout,
    /// `<cgroupRoot>/kubepods/[<qos>/]pod<uid>/<container>`), opened.
    pub fn pod_network(&self, pod_uid: &str) -> Result<std::fs::File> {
        let wanted = format!("pod{pod_uid}");
        for h in hierarchies()? {
            let root = h.join(self.cgroup_root.trim_start_matches('/')).join("pods");
            if let Some(dir) = find_dir(&root, &wanted, 4) {
                for entry in std::fs::read_dir(&dir)? {
                    let procs = entry?.path().join("cgroup.procs");
                    let text = std::fs::read_to_string(&procs).unwrap_or_default();
                    if let Some(pid) = text.lines().next() {
                        return std::fs::File::open(format!("/proc/{pid}/ns/net"))
                            .with_context(|| format!("opening the network namespace of pid {pid}"));
                    }
                }
            }
        }
        anyhow::bail!("no process of pod {pod_uid} under {}/pods", self.cgroup_root)
    }

    /// Runs `work` inside a pod's network namespace (its connections leave from the pod's address, through its
    /// veth and whatever filters the node applies to it). Its output once done.
    pub async fn in_pod_network<F, Fut, T>(&self, pod_uid: &str, work: F) -> Result<T>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
        T: Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        spawn_joined(self.pod_network(pod_uid)?, move || async move {
            let _ = tx.send(work().await);
        })?;
        rx.await.context("the thread in the pod's network ended without an answer")
    }

    /// What `server` answers for `name`'s IPv4 addresses, asked from a pod's network namespace (its address, its
    /// veth, its policy) once over UDP within `timeout`: see [`ask_dns`].
    pub async fn dns_from_pod(
        &self,
        pod_uid: &str,
        server: SocketAddr,
        name: &str,
        timeout: Duration,
    ) -> Result<std::result::Result<Vec<Ipv4Addr>, String>> {
        let name = name.to_string();
        self.in_pod_network(pod_uid, move || async move { ask_dns(server, &name, timeout).await }).await
    }

    /// [`Node::dns_from_pod`] from the node's own network, which no NetworkPolicy governs: what the server
    /// answers to anyone allowed to ask.
    pub async fn dns_from_node(
        &self,
        server: SocketAddr,
        name: &str,
        timeout: Duration,
    ) -> Result<std::result::Result<Vec<Ipv4Addr>, String>> {
        let name = name.to_string();
        self.in_network(move || async move { ask_dns(server, &name, timeout).await }).await
    }

    /// `ip` on the node's loopback until the guard is dropped: where node-cache's dummy interface
    /// (`-setupinterface`, which this kernel cannot create: no `dummy` link type) puts NodeLocal DNSCache's
    /// listen address. A host-network listener can then bind it, and a pod's packets to it reach the node as on a
    /// cluster (INPUT, behind the pod's policy).
    pub fn add_local_address(&self, ip: Ipv4Addr) -> Result<LocalAddress<'_>> {
        self.run_inside("ip addr add", &[Path::new("ip")], &ip_addr_args("add", ip))?;
        progress(&format!("{ip} on the node's loopback"));
        Ok(LocalAddress { node: self, ip })
    }

    /// TCP listeners on every address of a pod's network namespace, on `ports`, accepting (and closing) every
    /// connection until dropped: a server where only pods are, at an address no agent's policy names.
    pub async fn listen_in_pod(&self, pod_uid: &str, ports: &[u16]) -> Result<PodListener> {
        let accepted = Arc::new(AtomicUsize::new(0));
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ports, count) = (ports.to_vec(), accepted.clone());
        spawn_joined(self.pod_network(pod_uid)?, move || async move {
            let mut listeners = Vec::new();
            for port in ports {
                match tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))).await {
                    Ok(l) => listeners.push(l),
                    Err(e) => {
                        let _ = ready_tx.send(Err(anyhow::anyhow!("binding port {port} in the pod: {e}")));
                        return;
                    }
                }
            }
            let _ = ready_tx.send(Ok(()));
            let tasks: Vec<_> = listeners
                .into_iter()
                .map(|l| {
                    let count = count.clone();
                    tokio::spawn(async move {
                        while let Ok((stream, _)) = l.accept().await {
                            count.fetch_add(1, Ordering::SeqCst);
                            drop(stream);
                        }
                    })
                })
                .collect();
            let _ = stopped.await;
            tasks.iter().for_each(|t| t.abort());
        })?;
        ready_rx.await.context("the listener's thread ended")??;
        Ok(PodListener { accepted, _stop: stop })
    }
}

/// Listeners inside a pod's network (see [`Node::listen_in_pod`]).
pub struct PodListener {
    accepted: Arc<AtomicUsize>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl PodListener {
    /// Connections accepted so far, on any of its ports.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// Whether a TCP connection to `addr` is established within `timeout` (refused, reset, unreachable or silent all
/// count as not), from wherever the calling thread's network namespace is.
pub async fn tcp_connects(addr: SocketAddr, timeout: Duration) -> bool {
    matches!(tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await, Ok(Ok(_)))
}

/// What `server` answers for `name`'s IPv4 addresses (a fully qualified name; the trailing dot is added), asked
/// once over UDP within `timeout`, without cache or search domains, from wherever the calling thread's network
/// namespace is: `Ok` with the addresses when it answered (none for a name that does not exist or has no
/// address), `Err` with why when it did not (a timeout, refused, unreachable).
pub async fn ask_dns(server: SocketAddr, name: &str, timeout: Duration) -> std::result::Result<Vec<Ipv4Addr>, String> {
    let mut udp = ConnectionConfig::udp();
    udp.port = server.port();
    let ns = NameServerConfig::new(server.ip(), true, vec![udp]);
    let mut builder = TokioResolver::builder_with_config(
        ResolverConfig::from_name_servers(vec![ns]),
        TokioRuntimeProvider::default(),
    );
    let options = builder.options_mut();
    options.cache_size = 0;
    options.attempts = 1;
    options.timeout = timeout;
    options.ndots = 0;
    let resolver = builder.build().map_err(|e| format!("building a resolver: {e}"))?;
    let fqdn = if name.ends_with('.') { name.to_string() } else { format!("{name}.") };
    match resolver.ipv4_lookup(fqdn.as_str()).await {
        Ok(lookup) => Ok(lookup
            .answers()
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(a.0),
                _ => None,
            })
            .collect()),
        Err(e) if e.is_no_records_found() || e.is_nx_domain() => Ok(Vec::new()),
        Err(e) => Err(e.to_string()),
    }
}

/// An address on the node's loopback ([`Node::add_local_address`]), removed when dropped.
pub struct LocalAddress<'a> {
    node: &'a Node,
    ip: Ipv4Addr,
}

impl Drop for LocalAddress<'_> {
    fn drop(&mut self) {
        match self.node.run_inside("ip addr del", &[Path::new("ip")], &ip_addr_args("del", self.ip)) {
            Ok(_) => progress(&format!("{} off the node's loopback", self.ip)),
            Err(e) => eprintln!("testbed: node: removing {}: {e:#}", self.ip),
        }
    }
}

fn ip_addr_args(verb: &str, ip: Ipv4Addr) -> Vec<String> {
    vec!["addr".into(), verb.into(), format!("{ip}/32"), "dev".into(), "lo".into()]
}

impl NetworkPolicyEnforcement<'_> {
    async fn wait_healthy(&mut self) -> Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(p) = self.process.as_mut() {
                p.check_running()?;
            }
            let ok = self
                .node
                .in_network(|| async {
                    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, HEALTH_PORT));
                    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else { return false };
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let request = "GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n";
                    if stream.write_all(request.as_bytes()).await.is_err() {
                        return false;
                    }
                    let mut answer = String::new();
                    let _ = stream.read_to_string(&mut answer).await;
                    answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200")
                })
                .await?;
            if ok {
                return Ok(());
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "kube-router did not report healthy within 60s (see {})",
                self.node.dir.join("logs/kube-router.log").display()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Drop for NetworkPolicyEnforcement<'_> {
    fn drop(&mut self) {
        drop(self.process.take());
        let script = self.node.dir.join("scripts/netpol-cleanup.sh");
        let cleaned = std::fs::write(&script, super::scripts::NETPOL_CLEANUP)
            .map_err(anyhow::Error::from)
            .and_then(|()| self.node.run_inside("kube-router's cleanup", &[Path::new("/bin/sh"), &script], &[]));
        match cleaned {
            Ok(_) => progress("kube-router stopped, its chains and ipsets removed"),
            Err(e) => eprintln!("testbed: node: after kube-router: {e:#}"),
        }
    }
}

/// The first directory named `name` under `dir`, at most `depth` levels down.
fn find_dir(dir: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        if entry.file_name() == name {
            return Some(path);
        }
        if depth > 0
            && let Some(found) = find_dir(&path, name, depth - 1)
        {
            return Some(found);
        }
    }
    None
}
