//! A real etcd cluster (1 or 3 members) on loopback, plain HTTP as kcp's shard etcds run in-cluster.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};

use crate::peer_net::PeerNet;
use crate::process::{Process, free_port, wait_until};

pub struct EtcdMember {
    pub name: String,
    pub client_url: String,
    pub peer_url: String,
    pub process: Process,
}

pub struct Etcd {
    pub members: Vec<EtcdMember>,
    /// The peer network, when the members' peer traffic goes through proxies ([`Etcd::start_partitionable`]).
    pub peers: Option<PeerNet>,
}

/// How a cluster is started: its size, extra flags, fsync, and whether its peers talk through [`PeerNet`].
#[derive(Default, Clone)]
struct Layout<'a> {
    size: usize,
    extra: &'a [&'a str],
    /// fsync on every commit, as in production. Off by default (`--unsafe-no-fsync`): most tests claim what is
    /// stored, not how fast, and a full run's hundreds of etcds would otherwise queue on the one disk six engineers
    /// share. On for the clusters whose test claims a time that etcd's commit latency is part of
    /// ([`Etcd::start_fsync`], [`Etcd::start_partitionable`]; docs/architecture.md, The test bed).
    fsync: bool,
    peer_proxies: bool,
}

impl Etcd {
    /// Starts `size` members (1 or 3) under `dir` and waits until every member answers.
    pub async fn start(etcd: &Path, dir: &Path, name: &str, size: usize) -> Result<Self> {
        Self::start_with(etcd, dir, name, size, &[]).await
    }

    /// As [`Etcd::start`], each member with `extra` flags too (a small `--quota-backend-bytes`, say).
    pub async fn start_with(etcd: &Path, dir: &Path, name: &str, size: usize, extra: &[&str]) -> Result<Self> {
        Self::start_laid_out(etcd, dir, name, Layout { size, extra, ..Default::default() }).await
    }

    /// As [`Etcd::start`], with fsync on every commit as production runs it: for a test whose claim is a time
    /// that etcd's commit latency is part of (a busy shard, the deltas' recovery point). `dir` must be on the real
    /// disk: on tmpfs the fsync costs nothing and the claim is measured without it (a warning says so).
    pub async fn start_fsync(etcd: &Path, dir: &Path, name: &str, size: usize) -> Result<Self> {
        Self::start_laid_out(etcd, dir, name, Layout { size, fsync: true, ..Default::default() }).await
    }

    /// Three members with fsync on, whose peer traffic goes through [`PeerNet`]: any member can be cut off
    /// from its peers ([`Etcd::cut`]) while its clients still reach it.
    pub async fn start_partitionable(etcd: &Path, dir: &Path, name: &str) -> Result<Self> {
        let layout = Layout { size: 3, fsync: true, peer_proxies: true, ..Default::default() };
        let cluster = Self::start_laid_out(etcd, dir, name, layout).await?;
        let listed = cluster.member_client(0).await?.member_list().await?;
        let ids = cluster
            .members
            .iter()
            .map(|m| {
                let listed = listed.members().iter().find(|l| l.name() == m.name);
                listed.map(|l| format!("{:x}", l.id())).with_context(|| format!("{} is not in the member list", m.name))
            })
            .collect::<Result<Vec<_>>>()?;
        cluster.peers.as_ref().expect("started with peer proxies").learn_ids(ids);
        Ok(cluster)
    }

    /// Cuts member `i` off from its peers (both directions); its clients still reach it.
    pub fn cut(&self, i: usize) {
        self.peers.as_ref().expect("a partitionable cluster").cut(i);
    }

    /// Lets member `i` reach its peers again.
    pub fn heal(&self, i: usize) {
        self.peers.as_ref().expect("a partitionable cluster").heal(i);
    }

    /// Starts the cluster `layout` describes and waits until every member answers.
    async fn start_laid_out(etcd: &Path, dir: &Path, name: &str, layout: Layout<'_>) -> Result<Self> {
        let Layout { size, extra, fsync, peer_proxies } = layout;
        ensure!(size == 1 || size == 3, "an etcd cluster here has 1 or 3 members, not {size}");
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        if fsync && let Some(mount) = on_tmpfs(dir) {
            eprintln!(
                "testbed: etcd {name} runs with fsync on, but {} is on tmpfs ({mount}): its disk latency is not measured",
                dir.display()
            );
        }
        // (client, peer as advertised, peer as listened): the two peer ports differ only behind proxies.
        let ports: Vec<(u16, u16, u16)> = (0..size)
            .map(|_| {
                let (client, peer) = (free_port()?, free_port()?);
                Ok((client, peer, if peer_proxies { free_port()? } else { peer }))
            })
            .collect::<Result<_>>()?;
        let net = if peer_proxies {
            Some(
                PeerNet::start(
                    &ports.iter().map(|&(_, advertised, listened)| (advertised, listened)).collect::<Vec<_>>(),
                )
                .await?,
            )
        } else {
            None
        };
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer, _))| format!("{name}-{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("{name}-{}", rand::random::<u32>());
        let mut members = Vec::new();
        for (i, (client, peer, listened)) in ports.into_iter().enumerate() {
            let member = format!("{name}-{i}");
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let data_dir = dir.join(&member);
            let mut args = vec![
                format!("--name={member}"),
                format!("--data-dir={}", data_dir.display()),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls=http://127.0.0.1:{listened}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster={initial_cluster}"),
                "--initial-cluster-state=new".into(),
                format!("--initial-cluster-token={token}"),
                "--log-level=warn".into(),
            ];
            if !fsync {
                args.push("--unsafe-no-fsync".into());
            }
            args.extend(extra.iter().map(|f| f.to_string()));
            let process = Process::start(&member, etcd, args, dir.join(format!("{member}.log")))?;
            members.push(EtcdMember { name: member, client_url, peer_url, process });
        }
        let mut cluster = Self { members, peers: net };
        for i in 0..cluster.members.len() {
            cluster.wait_healthy(i).await?;
        }
        Ok(cluster)
    }

    /// Client URLs of every member, comma-separated (the `--etcd-servers` form).
    pub fn client_urls(&self) -> String {
        self.members.iter().map(|m| m.client_url.as_str()).collect::<Vec<_>>().join(",")
    }

    /// A client connected to one member only (etcd-client balances when given several).
    pub async fn member_client(&self, i: usize) -> Result<etcd_client::Client> {
        let url = &self.members[i].client_url;
        etcd_client::Client::connect([url], None).await.with_context(|| format!("connecting to etcd member {url}"))
    }

    /// A client balanced across all members that are still running.
    pub async fn client(&self) -> Result<etcd_client::Client> {
        let urls: Vec<&str> =
            self.members.iter().filter(|m| m.process.pid().is_some()).map(|m| m.client_url.as_str()).collect();
        Ok(etcd_client::Client::connect(urls, None).await?)
    }

    /// Kills a member with SIGKILL, as a crashed node.
    pub fn kill_member(&mut self, i: usize) {
        self.members[i].process.kill();
    }

    async fn wait_healthy(&mut self, i: usize) -> Result<()> {
        let url = self.members[i].client_url.clone();
        let member = &mut self.members[i];
        wait_until(&mut member.process, Duration::from_secs(30), "healthy", || {
            let url = url.clone();
            async move {
                let mut client = tokio::time::timeout(
                    Duration::from_secs(2),
                    etcd_client::Client::connect(
                        [url],
                        Some(etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(2))),
                    ),
                )
                .await??;
                client.status().await?;
                Ok(())
            }
        })
        .await
    }
}

/// The mount point holding `dir` when that file system is tmpfs (from `/proc/self/mounts`, the longest match).
fn on_tmpfs(dir: &Path) -> Option<String> {
    let dir = dir.canonicalize().ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let (mount, fs_type) = mounts
        .lines()
        .filter_map(|l| {
            let mut fields = l.split(' ');
            let (mount, fs_type) = (fields.nth(1)?, fields.next()?);
            dir.starts_with(mount).then_some((mount, fs_type))
        })
        .max_by_key(|(mount, _)| mount.len())?;
    (fs_type == "tmpfs").then(|| mount.to_string())
}
