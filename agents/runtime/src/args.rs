//! Command-line arguments shared by every agent. Every flag can also be set from an environment variable, so
//! the chart can configure agents without templating command lines.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::logging::LogFormat;

/// `<agent> run`: the daemon.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// The agent's YAML configuration file (re-read when it changes).
    #[arg(long, env = "KCP_KEEPER_CONFIG")]
    pub config: PathBuf,

    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

#[derive(clap::Args, Debug, Clone)]
pub struct RuntimeArgs {
    /// Log filter, e.g. `info` or `kcp_keeper_runtime=debug,info`.
    #[arg(long, env = "KCP_KEEPER_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Log format: JSON in the cluster, plain on a terminal.
    #[arg(long, env = "KCP_KEEPER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,

    /// Address of the admin server (`/livez`, `/readyz`, `/metrics`).
    #[arg(long, env = "KCP_KEEPER_ADMIN_ADDR", default_value = "0.0.0.0:9090")]
    pub admin_addr: SocketAddr,

    #[command(flatten)]
    pub kube: KubeArgs,

    #[command(flatten)]
    pub lease: LeaseArgs,
}

#[derive(clap::Args, Debug, Clone)]
pub struct KubeArgs {
    /// Kubeconfig file; without it, the in-cluster service account (or `KUBECONFIG`) is used.
    #[arg(long, env = "KCP_KEEPER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(clap::Args, Debug, Clone)]
pub struct LeaseArgs {
    /// Elect a leader among replicas; only the leader writes. Disable only for a single replica.
    #[arg(long = "leader-election", env = "KCP_KEEPER_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub enabled: bool,

    /// Namespace of the Lease (defaults to the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,

    /// Name of the Lease (defaults to `kcp-keeper-<agent>`).
    #[arg(long, env = "KCP_KEEPER_LEASE_NAME")]
    pub lease_name: Option<String>,

    /// This replica's identity in the Lease (defaults to the pod name, else the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// How long a Lease is valid without renewal.
    #[arg(long, env = "KCP_KEEPER_LEASE_DURATION", default_value = "15s", value_parser = crate::duration::parse_go_duration)]
    pub lease_duration: Duration,

    /// A leader that has not renewed for this long stops writing; must be shorter than the lease duration.
    #[arg(long, env = "KCP_KEEPER_LEASE_RENEW_DEADLINE", default_value = "10s", value_parser = crate::duration::parse_go_duration)]
    pub renew_deadline: Duration,
}

/// `<agent> rbac`: the same flags for every agent.
#[derive(clap::Args, Debug, Clone)]
pub struct RbacArgs {
    /// The agent's configuration: the Roles name what it names (not needed by an agent whose grants do not
    /// depend on it).
    #[arg(long, env = "KCP_KEEPER_CONFIG")]
    pub config: Option<PathBuf>,
    /// The agent's namespace: its ServiceAccount and Lease live there.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kcp-keeper")]
    pub namespace: String,
    /// The agent's ServiceAccount (defaults to the agent's name).
    #[arg(long)]
    pub service_account: Option<String>,
    /// The agent's Lease (defaults to `kcp-keeper-<agent>`).
    #[arg(long, env = "KCP_KEEPER_LEASE_NAME")]
    pub lease_name: Option<String>,
}

impl RbacArgs {
    /// Who the Roles are for, with the agent's defaults filled in.
    pub fn subjects(&self, agent: &str) -> crate::rbac::Subjects {
        let defaults = crate::rbac::Subjects::defaults(&self.namespace, agent);
        crate::rbac::Subjects {
            service_account: self.service_account.clone().unwrap_or(defaults.service_account),
            lease_name: self.lease_name.clone().unwrap_or(defaults.lease_name),
            namespace: defaults.namespace,
        }
    }
}

impl KubeArgs {
    /// A client from `--kubeconfig`, else the usual inference (in-cluster, then `KUBECONFIG`).
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
            }
            None => kube::Config::infer().await?,
        };
        Ok(kube::Client::try_from(config)?)
    }
}

impl LeaseArgs {
    /// `--lease-name`, else [`crate::lease::default_name`].
    pub fn lease_name(&self, agent: &str) -> String {
        self.lease_name.clone().unwrap_or_else(|| crate::lease::default_name(agent))
    }

    pub fn identity(&self) -> String {
        self.identity.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| format!("pid-{}", std::process::id()))
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Parser)]
    #[command(version = crate::VERSION)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand)]
    enum Command {
        Run(RunArgs),
    }

    #[test]
    fn shared_arguments_pass_clap_debug_assert() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let Command::Run(args) = Cli::parse_from(["agent", "run", "--config", "/etc/agent.yaml"]).command;
        assert_eq!(args.runtime.admin_addr.port(), 9090);
        assert!(args.runtime.lease.enabled);
        assert_eq!(args.runtime.lease.lease_duration, Duration::from_secs(15));
        assert!(args.runtime.lease.renew_deadline < args.runtime.lease.lease_duration);
    }
}
