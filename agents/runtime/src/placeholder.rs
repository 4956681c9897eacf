//! The whole binary of an agent whose own logic is not built yet: `run --config` loads its (minimal)
//! configuration, serves the admin port, joins leader election and checks the apiserver, so the binary, chart
//! and probes work end to end. Each agent's issue replaces this with its own `main`.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::agent::{self, AgentInfo};
use crate::args::RunArgs;
use crate::config::{AgentConfig, FieldError};
use crate::duration::ConfigDuration;

#[derive(Parser)]
#[command(version = crate::VERSION)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent.
    Run(RunArgs),
}

/// The configuration every agent has before its own settings arrive.
#[derive(Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// How often to re-check everything even without a change notification.
    pub resync_interval: ConfigDuration,
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

/// The CLI under the agent's binary name.
pub fn command(info: AgentInfo) -> clap::Command {
    Cli::command().name(info.name)
}

/// `main` of a placeholder agent.
pub async fn main(info: AgentInfo) -> ExitCode {
    crate::init_crypto();
    let cli = match Cli::from_arg_matches(&command(info).get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        Command::Run(args) => {
            agent::run(
                info,
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
    crate::exit_code(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholder_cli_passes_clap_debug_assert() {
        command(AgentInfo { name: "some-agent", metrics_prefix: "some_agent" }).debug_assert();
    }

    #[test]
    fn resync_interval_below_ten_seconds_is_refused() {
        let err = crate::config::parse::<Config>(std::path::Path::new("c.yaml"), "resyncInterval: 5s\n").unwrap_err();
        assert!(err.to_string().contains("resyncInterval: must be at least 10s"), "{err}");
    }
}
