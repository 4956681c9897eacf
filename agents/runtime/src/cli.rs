//! Every agent's command line, from its [`Agent`] implementation: `run` (the daemon), `rbac` (the Roles its
//! configuration needs), `--version`, and the agent's own one-shots. An agent's `main.rs` is one call to
//! [`main`].

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::agent::{self, Agent};
use crate::args::{RbacArgs, RunArgs};

#[derive(Parser)]
struct Cli<A: Agent> {
    #[command(subcommand)]
    command: Command<A>,
}

#[derive(Subcommand)]
enum Command<A: Agent> {
    /// Run the agent: the daemon (leader-elected; only the leader writes).
    Run {
        #[command(flatten)]
        args: RunArgs,
        #[command(flatten)]
        flags: A::RunFlags,
    },
    /// Print the Roles and bindings this configuration needs (every object it names, by name).
    Rbac(RbacArgs),
    #[command(flatten)]
    OneShot(A::Command),
}

/// The agent's whole command line, named and described after it (for `--help` and clap's debug checks).
pub fn command<A: Agent>() -> clap::Command {
    Cli::<A>::command().name(A::NAME).bin_name(A::NAME).about(A::ABOUT).version(crate::VERSION)
}

/// An agent binary's `main`: parses the command line and runs the daemon, `rbac` or a one-shot.
pub fn main<A: Agent>() -> ExitCode {
    // Before any thread starts: with glibc, two heap arenas rather than one per thread (`release_resident`).
    crate::release_resident::limit_heap_arenas();
    crate::init_crypto();
    let matches = command::<A>().get_matches();
    let cli = match Cli::<A>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return crate::exit_code(Err(anyhow::Error::new(e).context("starting the async runtime"))),
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Run { args, flags } => agent::run::<A>(args, flags).await.map(|()| ExitCode::SUCCESS),
            Command::Rbac(args) => print_rbac::<A>(&args).map(|()| ExitCode::SUCCESS),
            Command::OneShot(command) => A::oneshot(command).await,
        }
    });
    match outcome {
        Ok(code) => code,
        Err(e) => crate::exit_code(Err(e)),
    }
}

/// `<agent> rbac`: loads `--config` when given (strictly, as `run` would), renders through [`crate::rbac::Rbac`].
fn print_rbac<A: Agent>(args: &RbacArgs) -> anyhow::Result<()> {
    let config: Option<A::Config> = args.config.as_deref().map(crate::config::load).transpose()?;
    let rbac = A::rbac(config.as_ref(), &args.subjects(A::NAME))?;
    print!("{}", rbac.to_yaml()?);
    Ok(())
}
