//! kubeconfig-rotator: keeps kcp admin kubeconfigs fresh, proven against the real server before publishing.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kcp_keeper_runtime::args::{KubeArgs, RunArgs};

#[derive(Parser)]
#[command(name = "kubeconfig-rotator", version = kcp_keeper_runtime::VERSION, about = "Hands-off rotation of kcp admin kubeconfigs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: keep every configured kubeconfig's targets fresh.
    Run(RunArgs),
    /// Print every kubeconfig: subject, notAfter, time left, and whether each target is in sync.
    Status {
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Force a new certificate for kubeconfig NAME now (Issuing=True on its Certificate, as `cmctl renew`).
    Rotate {
        name: String,
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Print the Roles and bindings this configuration needs (every object by name).
    Rbac {
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
        /// The agent's namespace: its ServiceAccount and Lease live there.
        #[arg(long, env = "POD_NAMESPACE", default_value = "kcp-keeper")]
        namespace: String,
        #[arg(long, default_value = "kubeconfig-rotator")]
        service_account: String,
        #[arg(long, env = "KCP_KEEPER_LEASE_NAME", default_value = "kcp-keeper-kubeconfig-rotator")]
        lease_name: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    kcp_keeper_runtime::init_crypto();
    use kubeconfig_rotator::{controller, oneshot};
    let result = match Cli::parse().command {
        Command::Run(args) => controller::run(args).await,
        Command::Status { config, kube } => oneshot::status(&config, &kube).await,
        Command::Rotate { name, config, kube } => oneshot::rotate(&config, &kube, &name).await,
        Command::Rbac { config, namespace, service_account, lease_name } => {
            let who = kcp_keeper_runtime::rbac::Subjects { namespace, service_account, lease_name };
            oneshot::print_rbac(&config, &who)
        }
    };
    kcp_keeper_runtime::exit_code(result)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_passes_clap_debug_assert() {
        Cli::command().debug_assert();
    }
}
