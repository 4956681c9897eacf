//! dns-rewriter: CoreDNS split-horizon rules for kcp's public hostnames.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dns_rewriter::cli::{CheckArgs, RenderArgs};
use dns_rewriter::config::{Config, RawConfig};
use kcp_keeper_runtime::agent::{self, AgentInfo};
use kcp_keeper_runtime::args::RunArgs;

const INFO: AgentInfo = AgentInfo { name: "dns-rewriter", metrics_prefix: "dns_rewriter" };

#[derive(Parser)]
#[command(name = "dns-rewriter", version = kcp_keeper_runtime::VERSION, about = "CoreDNS split-horizon rules for kcp")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent. Not built yet: loads and watches the configuration, serves the admin port and joins
    /// leader election, but writes nothing (the daemon arrives with the runtime's reconcile driver).
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
        Command::Run(args) => run(args).await.map(|()| true),
        Command::Render(args) => dns_rewriter::cli::render(&args).await,
        Command::Check(args) => dns_rewriter::cli::check(&args).await,
    };
    match outcome {
        Ok(false) => ExitCode::FAILURE,
        other => kcp_keeper_runtime::exit_code(other.map(|_| ())),
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    agent::run(
        INFO,
        args,
        |_registry| (),
        |ctx: agent::Context<RawConfig>, ()| async move {
            let raw = RawConfig::clone(&ctx.config.borrow());
            let every = Config::from_raw(raw).map(|c| c.resync_interval).unwrap_or(std::time::Duration::from_secs(300));
            agent::idle(ctx, every).await
        },
    )
    .await
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
