//! The one-shots beside the runtime's `run` and `rbac`: `render` (each bundle as it would be written now) and
//! `watch` (the sidecar, [`crate::sidecar`]).

use std::path::PathBuf;
use std::process::ExitCode;

use kcp_keeper_runtime::args::KubeArgs;
use time::OffsetDateTime;

use crate::bundle::{Bundle as Built, BundleOptions};
use crate::config::{Config, Source};
use crate::sidecar::{self, WatchArgs};
use crate::sources::{self, Reader};

#[derive(clap::Subcommand)]
pub enum Command {
    /// Print each bundle as it would be written, with each certificate's subject, issuer and notAfter.
    Render {
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Sidecar: watch a mounted directory, write the combined bundle atomically, tell the process.
    Watch(WatchArgs),
}

/// Runs one of [`Command`]; an error is the process's failure.
pub async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Render { config, kube } => render(&config, &kube).await?,
        Command::Watch(args) => sidecar::main(args).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `ca-syncer render`: each bundle as it would be written now (sources only; retention needs the live target).
pub async fn render(config_path: &std::path::Path, kube: &KubeArgs) -> anyhow::Result<()> {
    let config: Config = kcp_keeper_runtime::config::load(config_path)?;
    let needs_client = config
        .bundles
        .iter()
        .flat_map(|b| &b.sources)
        .any(|s| matches!(s, Source::Secret(_) | Source::ConfigMap(_) | Source::Selected(_)));
    // Only a source in the cluster needs a client: rendering file and inline sources works anywhere.
    let client = if needs_client { Some(kube.client().await?) } else { None };
    let reader = Reader::Client(client.as_ref());
    let now = OffsetDateTime::now_utc();
    let mut failed = false;
    // Which public roots a `publicRoots` source would add, so a reader can tell one release from another.
    println!("# public roots: {} (compiled in)", sources::public_roots_summary());
    for bundle in &config.bundles {
        match sources::read_bundle(&reader, bundle).await {
            Ok(certs) => {
                let built = Built::build(certs, &BundleOptions { drop_expired: bundle.drop_expired, now });
                println!("# bundle {}: {} certificates", bundle.name, built.len());
                for summary in built.summaries() {
                    println!("#   {summary}");
                }
                print!("{}", built.render());
            }
            Err((i, e)) => {
                println!("# bundle {}: not rendered: sources[{i}]: {e}", bundle.name);
                failed = true;
            }
        }
    }
    anyhow::ensure!(!failed, "some bundles could not be rendered");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_boolean_environment_variable_takes_1_0_true_false_yes_no() {
        let command = kcp_keeper_runtime::cli::command::<crate::CaSyncer>();
        let checked = kcp_keeper_runtime::args::boolean_env::check(&command).unwrap();
        for variable in ["KCP_KEEPER_LEADER_ELECTION", "CA_SYNCER_WATCH_ALLOW_EMPTY", "CA_SYNCER_WATCH_KEEP_EXPIRED"] {
            assert!(checked.iter().any(|c| c == variable), "{variable} is not among {checked:?}");
        }
    }
}
