//! etcd-snapshotter: its own logic arrives with its issue; until then `run` serves the admin port, joins leader
//! election and checks the apiserver, so the binary, chart and probes work end to end.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kcp_keeper_runtime::agent::{self, AgentInfo};
use kcp_keeper_runtime::args::RunArgs;
use kcp_keeper_runtime::config::{AgentConfig, FieldError};
use kcp_keeper_runtime::duration::ConfigDuration;

const INFO: AgentInfo = AgentInfo { name: "etcd-snapshotter", metrics_prefix: "etcd_snapshotter" };

#[derive(Parser)]
#[command(name = "etcd-snapshotter", version = kcp_keeper_runtime::VERSION)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent.
    Run(RunArgs),
}

#[derive(Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Config {
    /// How often to re-check everything even without a change notification.
    resync_interval: ConfigDuration,
}

impl AgentConfig for Config {
    fn validate(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if self.resync_interval.0.as_secs() < 10 {
            errors.push(FieldError::new("resyncInterval", "must be at least 10s"));
        }
        errors
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    kcp_keeper_runtime::init_crypto();
    let result = match Cli::parse().command {
        Command::Run(args) => {
            agent::run(
                INFO,
                args,
                |_registry| (),
                |ctx: agent::Context<Config>, ()| async move {
                    let every = ctx.config.borrow().resync_interval.0;
                    agent::idle(ctx, every).await
                },
            )
            .await
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

    #[test]
    fn example_configuration_is_valid() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("example.yaml");
        kcp_keeper_runtime::config::load::<Config>(&path).unwrap();
    }
}
