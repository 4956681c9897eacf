//! A real etcd cluster (1 or 3 members) on loopback, plain HTTP as kcp's shard etcds run in-cluster.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};

use crate::process::{Process, free_port, wait_until};

pub struct EtcdMember {
    pub name: String,
    pub client_url: String,
    pub peer_url: String,
    pub process: Process,
}

pub struct Etcd {
    pub members: Vec<EtcdMember>,
}

impl Etcd {
    /// Starts `size` members (1 or 3) under `dir` and waits until every member answers.
    pub async fn start(etcd: &Path, dir: &Path, name: &str, size: usize) -> Result<Self> {
        Self::start_with(etcd, dir, name, size, &[]).await
    }

    /// As [`Etcd::start`], each member with `extra` flags too (a small `--quota-backend-bytes`, say).
    pub async fn start_with(etcd: &Path, dir: &Path, name: &str, size: usize, extra: &[&str]) -> Result<Self> {
        ensure!(size == 1 || size == 3, "an etcd cluster here has 1 or 3 members, not {size}");
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let ports: Vec<(u16, u16)> = (0..size).map(|_| Ok((free_port()?, free_port()?))).collect::<Result<_>>()?;
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("{name}-{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("{name}-{}", rand::random::<u32>());
        let mut members = Vec::new();
        for (i, (client, peer)) in ports.into_iter().enumerate() {
            let member = format!("{name}-{i}");
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let data_dir = dir.join(&member);
            let mut args = vec![
                format!("--name={member}"),
                format!("--data-dir={}", data_dir.display()),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster={initial_cluster}"),
                "--initial-cluster-state=new".into(),
                format!("--initial-cluster-token={token}"),
                // Tests need no fsync durability; this keeps a shared 2-core machine responsive.
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ];
            args.extend(extra.iter().map(|f| f.to_string()));
            let process = Process::start(&member, etcd, args, dir.join(format!("{member}.log")))?;
            members.push(EtcdMember { name: member, client_url, peer_url, process });
        }
        let mut cluster = Self { members };
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
