//! dns-rewriter: CoreDNS split-horizon rules for kcp's public hostnames.
//!
//! The one-shots `render` and `check` are built. The daemon (`run`) is not: it refuses to start, because a
//! binary that served `/readyz` 200 while writing nothing would let a deployment look healthy with none of
//! the agent's work done.
#![forbid(unsafe_code)]

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
    /// Run the agent. Not built yet: refuses to start.
    Run(RunArgs),
    /// Print what would be written: the k3s snippet, or the marked Corefile block.
    Render(RenderArgs),
    /// Ask the resolver for every public name and print expected against answered.
    Check(CheckArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    kcp_keeper_runtime::init_crypto();
    let outcome = match Cli::parse().command {
        Command::Run(_) => Err(anyhow::anyhow!(
            "dns-rewriter run is not built yet (the daemon that writes CoreDNS rules arrives with its issue); \
             this binary refuses to run it. `dns-rewriter render` and `dns-rewriter check` work."
        )),
        Command::Render(args) => dns_rewriter::cli::render(&args).await,
        Command::Check(args) => dns_rewriter::cli::check(&args).await,
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
