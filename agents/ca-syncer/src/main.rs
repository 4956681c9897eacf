//! ca-syncer: copies CA certificates into the Secrets and ConfigMaps consumers mount and hot-reload.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kcp_keeper_runtime::args::RunArgs;

#[derive(Parser)]
#[command(name = "ca-syncer", version = kcp_keeper_runtime::VERSION, about = "CA bundles into hot-reloaded Secrets")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: keep every configured bundle in sync.
    Run {
        #[command(flatten)]
        args: RunArgs,
        /// For tests only: the roots "empty means public roots" is verified with, instead of the compiled-in
        /// public roots (a loopback test bed has no publicly trusted endpoint).
        #[arg(long, env = "CA_SYNCER_PUBLIC_ROOTS_FILE", hide = true)]
        public_roots_file: Option<PathBuf>,
    },
    /// Print each bundle as it would be written, with each certificate's subject, issuer and notAfter.
    Render {
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
        #[command(flatten)]
        kube: kcp_keeper_runtime::args::KubeArgs,
    },
    /// Print the Roles and bindings this configuration needs (exact: Secrets only by name).
    Rbac {
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
        /// The agent's namespace: its ServiceAccount and Lease live there.
        #[arg(long, env = "POD_NAMESPACE", default_value = "kcp-keeper")]
        namespace: String,
        #[arg(long, default_value = "ca-syncer")]
        service_account: String,
        #[arg(long, env = "KCP_KEEPER_LEASE_NAME", default_value = "kcp-keeper-ca-syncer")]
        lease_name: String,
    },
    /// Sidecar: watch a mounted directory, write the combined bundle atomically, tell the process.
    Watch(ca_syncer::sidecar::WatchArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    kcp_keeper_runtime::init_crypto();
    let result = match Cli::parse().command {
        Command::Run { args, public_roots_file } => ca_syncer::controller::run(args, public_roots_file).await,
        Command::Render { config, kube } => ca_syncer::controller::render(&config, &kube).await,
        Command::Rbac { config, namespace, service_account, lease_name } => {
            let who = ca_syncer::rbac::Subjects { namespace, service_account, lease_name };
            ca_syncer::controller::print_rbac(&config, &who)
        }
        Command::Watch(args) => ca_syncer::sidecar::main(args).await,
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
