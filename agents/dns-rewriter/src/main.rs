//! dns-rewriter: CoreDNS split-horizon rules for kcp's public hostnames.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dns_rewriter::cli::{CheckArgs, RenderArgs};
use kcp_keeper_runtime::args::RunArgs;

#[derive(Parser)]
#[command(name = "dns-rewriter", version = kcp_keeper_runtime::VERSION, about = "CoreDNS split-horizon rules for kcp")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: keep the rules written, checked and answering.
    Run(RunArgs),
    /// Print what would be written: the k3s snippet, or the marked Corefile block.
    Render(RenderArgs),
    /// Ask the resolver for every public name and print expected against answered.
    Check(CheckArgs),
    /// Print the Roles and bindings this configuration needs (the one ConfigMap only by name).
    Rbac {
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
        /// The agent's namespace: its ServiceAccount and Lease live there.
        #[arg(long, env = "POD_NAMESPACE", default_value = "kcp-keeper")]
        namespace: String,
        #[arg(long, default_value = "dns-rewriter")]
        service_account: String,
        #[arg(long, env = "KCP_KEEPER_LEASE_NAME", default_value = "kcp-keeper-dns-rewriter")]
        lease_name: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    kcp_keeper_runtime::init_crypto();
    let outcome = match Cli::parse().command {
        Command::Run(args) => dns_rewriter::daemon::run(args).await.map(|()| true),
        Command::Render(args) => dns_rewriter::cli::render(&args).await,
        Command::Check(args) => dns_rewriter::cli::check(&args).await,
        Command::Rbac { config, namespace, service_account, lease_name } => {
            let who = dns_rewriter::rbac::Subjects { namespace, service_account, lease_name };
            dns_rewriter::cli::print_rbac(&config, &who).map(|()| true)
        }
    };
    match outcome {
        Ok(false) => ExitCode::FAILURE,
        other => kcp_keeper_runtime::exit_code(other.map(|_| ())),
    }
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
