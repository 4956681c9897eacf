//! A real one-node Kubernetes cluster for the chart's tests: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, kube-proxy (iptables), containerd with runc, kubelet and CoreDNS (the node's resolver; the
//! cluster DNS is CoreDNS in a pod, [`cluster_dns`]), every one of them inside a network namespace (and mount namespace) the bed creates, which has no route out. The host
//! reaches the apiserver only through a loopback relay ([`Node::kubeconfig`]); pod and Service addresses exist
//! only inside the namespace. The facts and workarounds this follows are in `../shared/real-node.md`.
//!
//! Every node process runs under a cgroup of the node's own (`<memory cgroup of this process>/kcp-keeper-node-*`,
//! in every v1 hierarchy; kubelet's `cgroupRoot` is its `pods` child). A reaper (`sh`, in its own session)
//! waits for the bed to let go of it — the node dropped, or the test binary dead, even by SIGKILL — and then
//! kills everything in those cgroups and removes them; the namespaces, their mounts, interfaces and iptables
//! rules go with their last process. Nothing is left on the host.

pub mod cluster_dns;
pub mod image;
mod netpol;
mod network;
mod scripts;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Node as KubeNode, ServiceAccount};
use kube::Api;

use crate::apiserver::{SERVICE_CIDR, client_from_file, kubeconfig_yaml};
use crate::certs::{Ca, Credential};
use crate::process::{Process, free_port};

pub use netpol::{NetworkPolicyEnforcement, PodListener, tcp_connects};
pub use network::NodeFaultProxy;

/// The node's address: on a veth inside its namespace (a /32, as nothing is routed there).
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
pub const NODE_NAME: &str = "kcp-keeper-node";
/// Pod addresses (the bridge CNI's host-local range).
pub const POD_CIDR: &str = "10.88.0.0/16";
/// The `kubernetes` Service's ClusterIP: the first address of [`SERVICE_CIDR`].
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// The apiserver's port inside the namespace (its own network, so a fixed port cannot collide).
const API_PORT: u16 = 6443;

/// What the node runs from the peer cache.
pub const PEERS: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
    "kubelet",
    "kubectl",
    "coredns",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "runc",
    "pause.tar",
    "helm",
    "registry",
];

/// The bed registry's address inside the node (its own network namespace: a fixed port cannot collide).
pub const REGISTRY_INSIDE: &str = "127.0.0.1:5000";

/// Where Debian's `containernetworking-plugins` installs the CNI plugins (the xtask installs them).
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

fn progress(msg: &str) {
    eprintln!("testbed: node: {msg}");
}

pub struct Node {
    pub peers: peers::Peers,
    pub dir: PathBuf,
    /// An admin (`system:masters`) kubeconfig for the host, through the relay.
    pub kubeconfig: PathBuf,
    /// The host end of the relay: `https://127.0.0.1:<port>`.
    pub url: String,
    /// The cgroup path of the node, the same in every hierarchy.
    pub cgroup_root: String,
    /// From the holder's start until the node was Ready and `default/default` existed.
    pub ready_in: Duration,
    /// PIDs of the node's processes as started (holder first).
    pub pids: Vec<u32>,
    client: kube::Client,
    /// Issues the node's client certificates (the apiserver's `--client-ca-file`).
    client_ca: Option<Ca>,
    server_ca_pem: String,
    processes: Vec<Process>,
    holder: Option<Process>,
    relay: Option<Relay>,
    reaper: Option<(Child, ChildStdin)>,
    containerd_socket: PathBuf,
    /// The node's registry as the host reaches it (`127.0.0.1:<port>`, relayed to [`REGISTRY_INSIDE`]).
    registry_host: Option<String>,
    registry_relay: Option<Relay>,
}

impl Node {
    /// Starts a node under `dir` (created; should be empty).
    pub async fn start(peers: &peers::Peers, dir: &Path) -> Result<Self> {
        crate::init_crypto();
        let started = Instant::now();
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let id = format!("{}-{:08x}", std::process::id(), rand::random::<u32>());
        let cgroup_root = format!("{}/kcp-keeper-node-{id}", own_memory_cgroup()?);
        let created = create_cgroups(&cgroup_root)?;
        let created_list = dir.join("cgroups-created");
        std::fs::write(&created_list, created.iter().map(|p| format!("{}\n", p.display())).collect::<String>())?;
        let scripts = dir.join("scripts");
        std::fs::create_dir_all(&scripts)?;
        for (name, text) in [
            ("enter.sh", scripts::ENTER),
            ("holder.sh", scripts::HOLDER),
            ("setup.sh", scripts::SETUP),
            ("reaper.sh", scripts::REAPER),
        ] {
            std::fs::write(scripts.join(name), text)?;
        }
        // The reaper first: from here on, whatever happens to this process, the node is torn down.
        let reaper = spawn_reaper(&scripts.join("reaper.sh"), &cgroup_root, &created_list, &dir)?;
        let mut node = Self {
            peers: peers.clone(),
            kubeconfig: dir.join("admin.kubeconfig"),
            dir: dir.clone(),
            url: String::new(),
            cgroup_root: cgroup_root.clone(),
            ready_in: Duration::ZERO,
            pids: Vec::new(),
            client: kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse()?))?,
            client_ca: None,
            server_ca_pem: String::new(),
            processes: Vec::new(),
            holder: None,
            relay: None,
            reaper: Some(reaper),
            containerd_socket: dir.join("containerd/containerd.sock"),
            registry_host: None,
            registry_relay: None,
        };
        node.boot(started).await?;
        Ok(node)
    }

    async fn boot(&mut self, started: Instant) -> Result<()> {
        let dir = self.dir.clone();
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs)?;
        progress(&format!("starting in {} (cgroup {})", dir.display(), self.cgroup_root));
        let holder = Process::start(
            "holder",
            Path::new("/bin/sh"),
            vec![dir.join("scripts/holder.sh").display().to_string(), self.cgroup_root.clone()],
            logs.join("holder.log"),
        )?;
        let holder_pid = holder.pid().context("the holder has no pid")?;
        self.pids.push(holder_pid);
        self.holder = Some(holder);
        wait_for_namespaces(holder_pid).await?;
        self.run_inside(
            "setup",
            &[Path::new("/bin/sh"), &dir.join("scripts/setup.sh")],
            &[dir.display().to_string(), NODE_IP.to_string()],
        )?;
        progress("namespaces ready (network, mount; veth with the node address, no route out)");

        let pki = NodePki::new()?;
        let files = pki.write(&dir.join("pki"))?;
        let inner_url = format!("https://127.0.0.1:{API_PORT}");
        for (name, user, groups) in [
            ("admin", "testbed-admin", &["system:masters"][..]),
            ("controller-manager", "system:kube-controller-manager", &[][..]),
            ("scheduler", "system:kube-scheduler", &[][..]),
            ("proxy", "system:kube-proxy", &[][..]),
            ("kubelet", &format!("system:node:{NODE_NAME}"), &["system:nodes"][..]),
            ("coredns", "testbed-coredns", &["system:masters"][..]),
        ] {
            let cred = pki.client_ca.issue_client(user, groups, Duration::from_secs(365 * 24 * 3600))?;
            std::fs::write(
                dir.join(format!("{name}.inner.kubeconfig")),
                kubeconfig_yaml(&inner_url, &pki.server_ca.cert_pem(), &cred, user),
            )?;
            if name == "admin" {
                let port = free_port()?;
                self.url = format!("https://127.0.0.1:{port}");
                std::fs::write(&self.kubeconfig, kubeconfig_yaml(&self.url, &pki.server_ca.cert_pem(), &cred, user))?;
            }
        }
        self.server_ca_pem = pki.server_ca.cert_pem();
        let port: u16 = self.url.rsplit(':').next().unwrap_or_default().parse()?;
        self.relay = Some(Relay::start(holder_pid, port, SocketAddr::from((Ipv4Addr::LOCALHOST, API_PORT)))?);

        let all_peers = self.peers.clone();
        let peer = |name: &str| all_peers.path(name).display().to_string();
        let kc = |name: &str| dir.join(format!("{name}.inner.kubeconfig")).display().to_string();

        // etcd
        let etcd_args = vec![
            "--name=node".into(),
            format!("--data-dir={}", dir.join("etcd").display()),
            "--listen-client-urls=http://127.0.0.1:2379".into(),
            "--advertise-client-urls=http://127.0.0.1:2379".into(),
            "--listen-peer-urls=http://127.0.0.1:2380".into(),
            "--initial-advertise-peer-urls=http://127.0.0.1:2380".into(),
            "--initial-cluster=node=http://127.0.0.1:2380".into(),
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ];
        self.start_inside("etcd", &peer("etcd"), etcd_args, &[])?;

        let apiserver_args = vec![
            "--etcd-servers=http://127.0.0.1:2379".into(),
            format!("--secure-port={API_PORT}"),
            "--bind-address=0.0.0.0".into(),
            format!("--advertise-address={NODE_IP}"),
            format!("--cert-dir={}", dir.join("apiserver").display()),
            format!("--tls-cert-file={}", files.serving_cert),
            format!("--tls-private-key-file={}", files.serving_key),
            format!("--client-ca-file={}", files.client_ca),
            format!("--service-account-key-file={}", files.sa_pub),
            format!("--service-account-signing-key-file={}", files.sa_key),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            format!("--kubelet-client-certificate={}", files.kubelet_client_cert),
            format!("--kubelet-client-key={}", files.kubelet_client_key),
            "--kubelet-preferred-address-types=InternalIP".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        std::fs::create_dir_all(dir.join("apiserver"))?;
        self.start_inside("kube-apiserver", &peer("kube-apiserver"), apiserver_args, &[])?;
        self.client = client_from_file(&self.kubeconfig).await?;
        self.wait("kube-apiserver /readyz through the relay", Duration::from_secs(90), |client| async move {
            client.request_text(http::Request::get("/readyz").body(Vec::new())?).await?;
            Ok(())
        })
        .await?;

        // CoreDNS on the node's address: the node's own resolver, the upstream of the cluster DNS (which runs as a
        // pod, `cluster_dns`), answering the public names at their edge as public DNS would. It knows the cluster
        // domain too, for the tools that run in the node's own network (which has no route to ClusterIPs); pods
        // never ask it for cluster names.
        let corefile = format!(
            ".:53 {{\n    bind {NODE_IP}\n    errors\n    ready 127.0.0.1:8181\n    hosts {{\n        {}\n        fallthrough\n    }}\n    kubernetes cluster.local in-addr.arpa ip6.arpa {{\n        kubeconfig {} testbed\n        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n    }}\n    cache 5\n}}\n",
            cluster_dns::upstream_hosts(),
            kc("coredns")
        );
        std::fs::write(dir.join("Corefile"), corefile)?;
        self.start_inside(
            "coredns",
            &peer("coredns"),
            vec!["-conf".into(), dir.join("Corefile").display().to_string()],
            &[],
        )?;

        let cm_args = vec![
            format!("--kubeconfig={}", kc("controller-manager")),
            format!("--authentication-kubeconfig={}", kc("controller-manager")),
            format!("--authorization-kubeconfig={}", kc("controller-manager")),
            format!("--service-account-private-key-file={}", files.sa_key),
            format!("--root-ca-file={}", files.server_ca),
            format!("--cluster-signing-cert-file={}", files.client_ca),
            format!("--cluster-signing-key-file={}", files.client_ca_key),
            "--use-service-account-credentials".into(),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--v=1".into(),
        ];
        self.start_inside("kube-controller-manager", &peer("kube-controller-manager"), cm_args, &[])?;
        let scheduler_args = vec![
            format!("--kubeconfig={}", kc("scheduler")),
            format!("--authentication-kubeconfig={}", kc("scheduler")),
            format!("--authorization-kubeconfig={}", kc("scheduler")),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            "--v=1".into(),
        ];
        self.start_inside("kube-scheduler", &peer("kube-scheduler"), scheduler_args, &[])?;
        let proxy_args = vec![
            format!("--kubeconfig={}", kc("proxy")),
            "--proxy-mode=iptables".into(),
            format!("--cluster-cidr={POD_CIDR}"),
            format!("--hostname-override={NODE_NAME}"),
            // Its conntrack sysctls are global: left alone.
            "--conntrack-max-per-core=0".into(),
            "--conntrack-tcp-timeout-established=0".into(),
            "--conntrack-tcp-timeout-close-wait=0".into(),
            "--metrics-bind-address=127.0.0.1:10249".into(),
            "--healthz-bind-address=127.0.0.1:10256".into(),
            "--v=1".into(),
        ];
        self.start_inside("kube-proxy", &peer("kube-proxy"), proxy_args, &[])?;
        let holder_pid = self.holder.as_ref().and_then(Process::pid).context("no holder")?;

        // containerd, with runc and the CNI plugins.
        let cd = dir.join("containerd");
        std::fs::create_dir_all(cd.join("opt"))?;
        let cni_conf = dir.join("cni/net.d");
        std::fs::create_dir_all(&cni_conf)?;
        std::fs::write(cni_conf.join("10-bridge.conflist"), cni_conflist(&dir.join("cni/ipam")))?;
        self.start_registry(holder_pid, &cd.join("certs.d"))?;
        std::fs::write(cd.join("config.toml"), containerd_config(&cd, &cni_conf, self.peers.path("runc")))?;
        let shim_dir = self.peers.path("containerd-shim-runc-v2").parent().context("no shim dir")?.to_path_buf();
        let path_env = format!("{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", shim_dir.display());
        self.start_inside(
            "containerd",
            &peer("containerd"),
            vec!["--config".into(), cd.join("config.toml").display().to_string()],
            &[("PATH", &path_env)],
        )?;
        self.wait_containerd().await?;
        self.import_image(self.peers.path("pause.tar"))?;

        // kubelet
        let kubelet_dir = dir.join("kubelet");
        for sub in ["", "manifests", "volume-plugins"] {
            std::fs::create_dir_all(kubelet_dir.join(sub))?;
        }
        std::fs::create_dir_all(dir.join("pod-logs"))?;
        let config = kubelet_config(
            &format!("{}/pods", self.cgroup_root),
            &self.containerd_socket,
            &dir.join("pod-logs"),
            &kubelet_dir,
            &files.client_ca,
        );
        std::fs::write(kubelet_dir.join("config.yaml"), config)?;
        let kubelet_args = vec![
            format!("--config={}", kubelet_dir.join("config.yaml").display()),
            format!("--kubeconfig={}", kc("kubelet")),
            format!("--root-dir={}", kubelet_dir.join("root").display()),
            format!("--hostname-override={NODE_NAME}"),
            format!("--node-ip={NODE_IP}"),
            "--v=1".into(),
        ];
        self.start_inside("kubelet", &peer("kubelet"), kubelet_args, &[("PATH", &path_env)])?;
        self.wait("the node Ready", Duration::from_secs(120), |client| async move {
            let node = Api::<KubeNode>::all(client).get(NODE_NAME).await?;
            let ready = node
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ensure!(ready, "not Ready yet");
            Ok(())
        })
        .await?;
        self.wait("the default ServiceAccount", Duration::from_secs(60), |client| async move {
            Api::<ServiceAccount>::namespaced(client, "default").get("default").await?;
            Ok(())
        })
        .await?;
        let client = self.client.clone();
        cluster_dns::start(self, &client).await?;
        progress(&format!("the cluster DNS (CoreDNS in a pod) Ready at {}", cluster_dns::CLUSTER_DNS_IP));
        self.client_ca = Some(pki.client_ca);
        self.ready_in = started.elapsed();
        progress(&format!("Ready in {:.1?}; KUBECONFIG={}", self.ready_in, self.kubeconfig.display()));
        Ok(())
    }

    /// A new admin client, through the relay (a client belongs to the runtime it was made on, so each test makes
    /// its own).
    pub async fn client(&self) -> Result<kube::Client> {
        client_from_file(&self.kubeconfig).await
    }

    /// Starts a long-running program inside the node (its cgroup and namespaces), logging to `logs/<name>.log`.
    fn start_inside(&mut self, name: &str, program: &str, args: Vec<String>, env: &[(&str, &str)]) -> Result<()> {
        let holder = self.holder.as_ref().and_then(Process::pid).context("no holder")?;
        let mut full = vec![
            self.dir.join("scripts/enter.sh").display().to_string(),
            self.cgroup_root.clone(),
            holder.to_string(),
            program.to_string(),
        ];
        full.extend(args);
        let log = self.dir.join("logs").join(format!("{name}.log"));
        let process = Process::start_with_env(name, Path::new("/bin/sh"), full, env, log)?;
        let pid = process.pid().unwrap_or_default();
        progress(&format!("started {name} (pid {pid})"));
        self.pids.push(pid);
        self.processes.push(process);
        Ok(())
    }

    /// The bed's registry inside the node, serving read-only what `cargo xtask images` published
    /// (`peers::registry`), and containerd's trust in it: as the server of the chart's default registry host (so
    /// the chart's default image references are pulled from it, as a cluster with a registry mirror pulls them)
    /// and under its own address. Without the bed's
    /// TLS files (no `cargo xtask images` yet) the node starts without it and says so.
    fn start_registry(&mut self, holder_pid: u32, certs_d: &Path) -> Result<()> {
        let Ok(ca) = crate::registry::bed_ca() else {
            progress("no bed registry (run `cargo xtask images`): pods cannot pull the agents' images");
            return Ok(());
        };
        let (_, cert, key) = peers::registry::bed_tls();
        let config = self.dir.join("registry.yml");
        let storage = peers::registry::bed_storage();
        std::fs::write(&config, peers::registry::config(&storage, REGISTRY_INSIDE, &cert, &key, true))?;
        let program = self.peers.path("registry").display().to_string();
        self.start_inside(
            "registry",
            &program,
            vec!["serve".into(), config.display().to_string()],
            peers::registry::ENV,
        )?;
        // The chart's default host is served by the bed's registry alone (`server`): a pull never falls back to
        // the public host, which the node cannot reach, so a registry's answer (a missing tag) is what kubelet
        // reports.
        let mirrored = peers::registry::PUBLIC.split('/').next().unwrap_or_default();
        for host in [mirrored, REGISTRY_INSIDE] {
            std::fs::create_dir_all(certs_d.join(host))?;
            std::fs::write(
                certs_d.join(host).join("hosts.toml"),
                format!(
                    "server = \"https://{REGISTRY_INSIDE}\"\n\n[host.\"https://{REGISTRY_INSIDE}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"{}\"\n",
                    ca.display()
                ),
            )?;
        }
        let port = free_port()?;
        let inner: SocketAddr = REGISTRY_INSIDE.parse()?;
        self.registry_relay = Some(Relay::start(holder_pid, port, inner)?);
        self.registry_host = Some(format!("127.0.0.1:{port}"));
        progress(&format!("registry inside on {REGISTRY_INSIDE} (host: 127.0.0.1:{port}), mirror of {mirrored}"));
        Ok(())
    }

    /// The node's registry as the host reaches it (`127.0.0.1:<port>`): what `helm` on the host pulls the chart
    /// from (`oci://<host>/kcp-keeper/charts/kcp-keeper`); its CA is `testbed::registry::bed_ca()`.
    pub fn registry(&self) -> Result<&str> {
        self.registry_host
            .as_deref()
            .context("the node has no registry: run `cargo xtask images` (cargo xtask test does)")
    }

    /// The node registry's log (its access log: every pull's requests).
    pub fn registry_log(&self) -> Result<String> {
        std::fs::read_to_string(self.dir.join("logs/registry.log")).context("reading the node registry's log")
    }

    /// A kubeconfig for a client-certificate user of this node's apiserver as pods reach it: the `kubernetes`
    /// Service's DNS name, which its serving certificate names.
    pub fn in_cluster_kubeconfig(&self, user: &str, groups: &[&str], validity: Duration) -> Result<String> {
        let ca = self.client_ca.as_ref().context("the node has not started")?;
        let cred = ca.issue_client(user, groups, validity)?;
        Ok(kubeconfig_yaml("https://kubernetes.default.svc.cluster.local:443", &self.server_ca_pem, &cred, user))
    }

    /// A file as the node's mount namespace shows it (where kubelet's volume mounts live), e.g. a file of a pod's
    /// volume under [`Node::kubelet_root`].
    pub fn read_inside(&self, path: &Path) -> Result<String> {
        self.run_inside(&format!("cat {}", path.display()), &[Path::new("/bin/cat"), path], &[])
    }

    /// kubelet's `--root-dir` (pods' volumes are under `pods/<uid>/volumes/`).
    pub fn kubelet_root(&self) -> PathBuf {
        self.dir.join("kubelet/root")
    }

    /// `kubectl --kubeconfig <admin, through the relay> <args>` from the host (e.g. `exec` into a pod: the
    /// apiserver, inside the node, streams from the kubelet); its output, whether it succeeded or not.
    pub fn kubectl(&self, args: &[&str]) -> Result<std::process::Output> {
        Command::new(self.peers.path("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("starting kubectl {}", args.join(" ")))
    }

    /// Starts a peer inside the node (its namespaces and cgroup) for the caller to own: it dies with the caller's
    /// thread, as every [`Process`] does. Its log goes to `logs/<name>.log`.
    pub fn spawn_inside(&self, name: &str, program: &Path, args: Vec<String>) -> Result<Process> {
        self.spawn_inside_with_env(name, program, args, &[])
    }

    /// [`Node::spawn_inside`] with environment variables (credentials: argv is world-readable).
    pub fn spawn_inside_with_env(
        &self,
        name: &str,
        program: &Path,
        args: Vec<String>,
        env: &[(&str, &str)],
    ) -> Result<Process> {
        let holder = self.holder.as_ref().and_then(Process::pid).context("no holder")?;
        let mut full = vec![
            self.dir.join("scripts/enter.sh").display().to_string(),
            self.cgroup_root.clone(),
            holder.to_string(),
            program.display().to_string(),
        ];
        full.extend(args);
        let log = self.dir.join("logs").join(format!("{name}.log"));
        progress(&format!("starting {name} inside the node"));
        Process::start_with_env(name, Path::new("/bin/sh"), full, env, log)
    }

    /// Runs a one-shot command inside the node and fails with its output when it fails.
    pub fn run_inside(&self, what: &str, program: &[&Path], args: &[String]) -> Result<String> {
        let holder = self.holder.as_ref().and_then(Process::pid).context("no holder")?;
        let output = Command::new("/bin/sh")
            .arg(self.dir.join("scripts/enter.sh"))
            .arg(&self.cgroup_root)
            .arg(holder.to_string())
            .args(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("starting {what}"))?;
        if !output.status.success() {
            bail!(
                "{what} failed ({}): {}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// `ctr images import` of a docker-archive (or OCI) tar into the node's containerd, in the CRI's namespace
    /// (`k8s.io`), so kubelet finds the image and `imagePullPolicy: IfNotPresent` never pulls.
    pub fn import_image(&self, archive: &Path) -> Result<()> {
        let started = Instant::now();
        let path = archive.display().to_string();
        self.ctr(&format!("ctr images import {path}"), &["images", "import", &path])?;
        progress(&format!("imported {} in {:.1?}", archive.display(), started.elapsed()));
        Ok(())
    }

    /// Runs `ctr` against the node's containerd in the CRI's namespace (`k8s.io`); its output.
    pub fn ctr(&self, what: &str, args: &[&str]) -> Result<String> {
        let ctr = self.peers.path("ctr").to_path_buf();
        let mut full = vec!["--address".to_string(), self.containerd_socket.display().to_string()];
        full.extend(["--namespace", "k8s.io"].iter().chain(args).map(|a| a.to_string()));
        self.run_inside(what, &[&ctr], &full)
    }

    /// The image references containerd holds in the CRI's namespace.
    pub fn images(&self) -> Result<Vec<String>> {
        let out = self.ctr("ctr images ls", &["images", "ls", "--quiet"])?;
        Ok(out.lines().map(str::to_string).collect())
    }

    async fn wait_containerd(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.check_running()?;
            let ctr = self.peers.path("ctr").to_path_buf();
            let ok = self.run_inside(
                "ctr version",
                &[&ctr],
                &["--address".into(), self.containerd_socket.display().to_string(), "version".into()],
            );
            match ok {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(e.context("containerd did not answer within 60s")),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Fails, with the log's end, when a node process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(holder) = self.holder.as_mut() {
            holder.check_running()?;
        }
        for p in &mut self.processes {
            p.check_running()?;
        }
        Ok(())
    }

    async fn wait<F, Fut>(&mut self, what: &str, timeout: Duration, mut check: F) -> Result<()>
    where
        F: FnMut(kube::Client) -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let started = Instant::now();
        loop {
            self.check_running()?;
            let err = match check(self.client.clone()).await {
                Ok(()) => {
                    progress(&format!("{what} after {:.1?}", started.elapsed()));
                    return Ok(());
                }
                Err(e) => e,
            };
            if started.elapsed() > timeout {
                bail!("{what}: not within {timeout:?}: {err:#}; logs in {}", self.dir.join("logs").display());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Stops the node: the processes in reverse order, then the reaper removes what is left (shims, containers,
    /// cgroups) and the namespaces go with their last process. Waits until the reaper is done.
    pub fn stop(&mut self) -> Result<()> {
        let started = Instant::now();
        while let Some(mut p) = self.processes.pop() {
            p.kill();
        }
        if let Some(mut holder) = self.holder.take() {
            holder.kill();
        }
        self.relay.take();
        if let Some((mut child, stdin)) = self.reaper.take() {
            drop(stdin);
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Some(status) = child.try_wait()? {
                    ensure!(
                        status.success(),
                        "the reaper failed ({status}); see {}",
                        self.dir.join("reaper.log").display()
                    );
                    break;
                }
                ensure!(Instant::now() < deadline, "the reaper did not finish within 30s");
                std::thread::sleep(Duration::from_millis(20));
            }
            progress(&format!("stopped in {:.1?}", started.elapsed()));
        }
        Ok(())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("testbed: node: logs kept in {}", self.dir.display());
        }
        if let Err(e) = self.stop() {
            eprintln!("testbed: node: stopping: {e:#}");
        }
    }
}

/// The memory cgroup this process is in (the session's, here): the node's cgroups are made under the same path in
/// every hierarchy, so its memory stays accounted where this process's is.
fn own_memory_cgroup() -> Result<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup")?;
    let path = text
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers.split(',').any(|c| c == "memory").then(|| path.to_string())
        })
        .context("this process is in no v1 memory cgroup: the node needs cgroup v1 controllers")?;
    Ok(path.trim_end_matches('/').to_string())
}

/// The v1 hierarchies (every directory under /sys/fs/cgroup but the controller-less cgroup2).
fn hierarchies() -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/sys/fs/cgroup")? {
        let entry = entry?;
        if entry.file_type()?.is_dir() && entry.file_name() != "unified" {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// Creates `<root>`, `<root>/daemons` and `<root>/pods` in every v1 hierarchy (cpuset ones get their parent's
/// cpus and mems, which a new cpuset lacks), and returns every directory it had to create, in creation order.
fn create_cgroups(root: &str) -> Result<Vec<PathBuf>> {
    let mut created = Vec::new();
    for h in hierarchies()? {
        for leaf in ["daemons", "pods"] {
            let mut path = h.clone();
            for component in root.trim_start_matches('/').split('/').chain([leaf]) {
                let parent = path.clone();
                path.push(component);
                if path.exists() {
                    continue;
                }
                std::fs::create_dir(&path).with_context(|| format!("creating cgroup {}", path.display()))?;
                created.push(path.clone());
                if path.join("cpuset.cpus").exists() {
                    for file in ["cpuset.cpus", "cpuset.mems"] {
                        let value = std::fs::read_to_string(parent.join(file))?;
                        std::fs::write(path.join(file), value.trim())
                            .with_context(|| format!("writing {}", path.join(file).display()))?;
                    }
                }
            }
        }
    }
    // runc also makes the containers' cgroups in the controller-less cgroup2 (hybrid mode), creating the path
    // down to them: the parts missing now are removed at teardown like the ones made here.
    let unified = Path::new("/sys/fs/cgroup/unified");
    if unified.is_dir() {
        let mut path = unified.to_path_buf();
        for component in root.trim_start_matches('/').split('/') {
            path.push(component);
            if !path.exists() {
                created.push(path.clone());
            }
        }
    }
    Ok(created)
}

fn spawn_reaper(script: &Path, root: &str, created: &Path, dir: &Path) -> Result<(Child, ChildStdin)> {
    let out = std::fs::File::create(dir.join("reaper.log"))?;
    let mut child = Command::new("setsid")
        .arg("/bin/sh")
        .arg(script)
        .arg(root)
        .arg(created)
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("starting the node's reaper")?;
    let stdin = child.stdin.take().context("the reaper has no stdin")?;
    Ok((child, stdin))
}

/// The holder has unshared once its namespaces differ from ours.
async fn wait_for_namespaces(holder: u32) -> Result<()> {
    let ours = std::fs::read_link("/proc/self/ns/net")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(theirs) = std::fs::read_link(format!("/proc/{holder}/ns/net"))
            && theirs != ours
            && std::fs::read_link(format!("/proc/{holder}/exe")).is_ok_and(|e| e.ends_with("sleep"))
        {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "the holder did not create its namespaces within 10s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The node's certificates: the apiserver's serving certificate names every way it is reached (loopback inside
/// and through the relay, the node address, the `kubernetes` Service).
struct NodePki {
    server_ca: Ca,
    client_ca: Ca,
    serving: Credential,
    kubelet_client: Credential,
    sa_key_pem: String,
    sa_pub_pem: String,
}

struct PkiFiles {
    server_ca: String,
    client_ca: String,
    client_ca_key: String,
    serving_cert: String,
    serving_key: String,
    kubelet_client_cert: String,
    kubelet_client_key: String,
    sa_key: String,
    sa_pub: String,
}

impl NodePki {
    fn new() -> Result<Self> {
        let year = Duration::from_secs(365 * 24 * 3600);
        let server_ca = Ca::new("kcp-keeper-node-server-ca", year)?;
        let client_ca = Ca::new("kcp-keeper-node-client-ca", year)?;
        let serving = server_ca.issue_server(
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            &[IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(NODE_IP), IpAddr::V4(KUBERNETES_SERVICE_IP)],
            year,
        )?;
        let kubelet_client = client_ca.issue_client("kube-apiserver-kubelet-client", &["system:masters"], year)?;
        let sa = rcgen::KeyPair::generate()?;
        Ok(Self {
            server_ca,
            client_ca,
            serving,
            kubelet_client,
            sa_key_pem: sa.serialize_pem(),
            sa_pub_pem: sa.public_key_pem(),
        })
    }

    fn write(&self, dir: &Path) -> Result<PkiFiles> {
        std::fs::create_dir_all(dir)?;
        let write = |name: &str, content: &str| -> Result<String> {
            let path = dir.join(name);
            std::fs::write(&path, content)?;
            Ok(path.display().to_string())
        };
        Ok(PkiFiles {
            server_ca: write("server-ca.crt", &self.server_ca.cert_pem())?,
            client_ca: write("client-ca.crt", &self.client_ca.cert_pem())?,
            client_ca_key: write("client-ca.key", &self.client_ca.key_pem())?,
            serving_cert: write("serving.crt", &self.serving.cert_pem)?,
            serving_key: write("serving.key", &self.serving.key_pem)?,
            kubelet_client_cert: write("kubelet-client.crt", &self.kubelet_client.cert_pem)?,
            kubelet_client_key: write("kubelet-client.key", &self.kubelet_client.key_pem)?,
            sa_key: write("sa.key", &self.sa_key_pem)?,
            sa_pub: write("sa.pub", &self.sa_pub_pem)?,
        })
    }
}

fn cni_conflist(ipam_dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "kcp-keeper-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": ipam_dir,
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
    .to_string()
}

fn containerd_config(dir: &Path, cni_conf: &Path, runc: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 3
root = "{d}/root"
state = "{d}/state"

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[debug]
  level = "warn"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{d}/certs.d"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{cni}"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
"#,
        pause = peers::PAUSE_IMAGE,
        runc = runc.display(),
        cni = cni_conf.display(),
    )
}

fn kubelet_config(cgroup_root: &str, socket: &Path, pod_logs: &Path, dir: &Path, client_ca: &str) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
containerRuntimeEndpoint: unix://{socket}
podLogsDir: {pod_logs}
staticPodPath: {manifests}
volumePluginDir: {plugins}
failSwapOn: false
clusterDomain: cluster.local
clusterDNS: ["{cluster_dns}"]
resolvConf: ""
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
address: {NODE_IP}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {client_ca}
authorization:
  mode: Webhook
# Absolute, not percentages: the disk is shared, and 1% of a large, busy one is gigabytes (a DiskPressure taint
# left every pod Pending with 2 GiB of 252 free).
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "100Mi"
  nodefs.inodesFree: "1%"
  imagefs.available: "100Mi"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
syncFrequency: 10s
fileCheckFrequency: 10s
"#,
        socket = socket.display(),
        cluster_dns = cluster_dns::CLUSTER_DNS_IP,
        pod_logs = pod_logs.display(),
        manifests = dir.join("manifests").display(),
        plugins = dir.join("volume-plugins").display(),
    )
}

/// The host half of the way in: a loopback port on the host whose connections are made, by a thread that joined
/// the node's network namespace, to an address inside it. A socket belongs to the namespace it was created in,
/// so the bytes are then copied on the host side without any route into the namespace.
struct Relay {
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

type Dial = (SocketAddr, tokio::sync::oneshot::Sender<std::io::Result<std::net::TcpStream>>);

impl Relay {
    fn start(holder: u32, host_port: u16, inner: SocketAddr) -> Result<Self> {
        let ns = std::fs::File::open(format!("/proc/{holder}/ns/net"))?;
        let (dial_tx, dial_rx) = std::sync::mpsc::channel::<Dial>();
        std::thread::Builder::new().name("node-dialer".into()).spawn(move || {
            if let Err(e) = nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET) {
                eprintln!("testbed: node: relay: joining the node's network namespace: {e}");
                return;
            }
            drop(ns);
            while let Ok((addr, reply)) = dial_rx.recv() {
                let _ = reply.send(std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)));
            }
        })?;
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, host_port))?;
        listener.set_nonblocking(true)?;
        let (shutdown, mut stop) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new().name("node-relay".into()).spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                loop {
                    tokio::select! {
                        _ = &mut stop => return,
                        accepted = listener.accept() => {
                            let Ok((mut outer, _)) = accepted else { continue };
                            let dial_tx = dial_tx.clone();
                            tokio::spawn(async move {
                                let (tx, rx) = tokio::sync::oneshot::channel();
                                if dial_tx.send((inner, tx)).is_err() { return; }
                                let Ok(Ok(stream)) = rx.await else { return };
                                if stream.set_nonblocking(true).is_err() { return; }
                                let Ok(mut stream) = tokio::net::TcpStream::from_std(stream) else { return };
                                let _ = tokio::io::copy_bidirectional(&mut outer, &mut stream).await;
                            });
                        }
                    }
                }
            });
        })?;
        Ok(Self { shutdown: Some(shutdown) })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Fails unless `cargo xtask images` published the agent's image at `version` to the bed's registry, where the
/// node's containerd pulls it from when a pod names it.
pub fn agent_image_published(agent: &str, version: &str) -> Result<()> {
    ensure!(
        peers::registry::bed_has(agent, version),
        "{agent}:{version} is not in the test bed's registry ({}): run `cargo xtask images` (cargo xtask test does)",
        peers::registry::bed_storage().display()
    );
    Ok(())
}

static SHARED: OnceLock<Result<Node, String>> = OnceLock::new();

/// The node of this test binary, started on first use and shared by every test in it. Its processes are started
/// from a thread that lives as long as the binary (the kernel kills a peer when the thread that spawned it exits),
/// and the reaper tears it down when the binary exits. Files go under the target directory
/// (`node-bed-<binary>`), cleared at the next run, so logs outlive a failed run without piling up.
pub fn shared() -> &'static Node {
    crate::shared_for_binary(&SHARED, "node bed", start_shared)
}

/// The directory a binary's shared node uses: `target/<profile>/node-bed-<binary>`.
pub fn shared_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let stem = exe.file_stem().and_then(|s| s.to_str()).unwrap_or("tests").to_string();
    let base = exe.parent().and_then(Path::parent).context("the test binary has no target directory")?;
    Ok(base.join(format!("node-bed-{stem}")))
}

async fn start_shared() -> Result<Node> {
    let peers = peers::locate_only(PEERS)?;
    let dir = shared_dir()?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    Node::start(&peers, &dir).await
}
