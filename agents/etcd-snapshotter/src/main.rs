//! etcd-snapshotter: verified streaming snapshots of every kcp shard's etcd to S3, retention and restore.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use etcd_snapshotter::commands;
use kcp_keeper_runtime::args::RunArgs;

#[derive(Parser)]
#[command(name = "etcd-snapshotter", version = kcp_keeper_runtime::VERSION, about = "Verified etcd snapshots to S3")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: snapshot every shard on its schedule (leader only), apply retention.
    Run(RunArgs),
    /// Take a snapshot of every shard (or those named) now; prints one line per snapshot.
    Snapshot {
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
        /// Only these shards (repeatable).
        #[arg(long)]
        shard: Vec<String>,
    },
    /// List published snapshots, newest revision first.
    List {
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
        #[arg(long)]
        shard: Option<String>,
    },
    /// Download a snapshot and check both hashes and its structure (etcdutl snapshot status).
    Verify {
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
        /// `<shard>/<time>-r<revision>`, as `list` prints it.
        id: String,
        #[arg(long)]
        identity_file: Option<PathBuf>,
        #[arg(long, env = "ETCDUTL", default_value = "etcdutl")]
        etcdutl: PathBuf,
    },
    /// Restore drill: prove a snapshot restores (hashes, etcdutl restore, a throwaway etcd compared with the
    /// manifest, optionally a real kcp on it) and record the report beside its manifest. Exit 0 when it passed.
    Drill(commands::DrillArgs),
    /// Download, verify and `etcdutl snapshot restore` a snapshot into a new member data directory.
    Restore(commands::RestoreArgs),
    /// Print the Role and RoleBinding the daemon needs (its Lease and Events, nothing else).
    Rbac {
        /// The agent's namespace: its ServiceAccount and Lease live there.
        #[arg(long, env = "POD_NAMESPACE", default_value = "kcp-keeper")]
        namespace: String,
        #[arg(long, default_value = "etcd-snapshotter")]
        service_account: String,
        #[arg(long, env = "KCP_KEEPER_LEASE_NAME", default_value = "kcp-keeper-etcd-snapshotter")]
        lease_name: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    kcp_keeper_runtime::init_crypto();
    let command = Cli::parse().command;
    if !matches!(command, Command::Run(_)) {
        // One-shots say what they skipped or cleaned (a member down, an abandoned upload) in plain text.
        let level = std::env::var("KCP_KEEPER_LOG_LEVEL").unwrap_or_else(|_| "warn".into());
        if let Err(e) = kcp_keeper_runtime::logging::init(&level, kcp_keeper_runtime::logging::LogFormat::Plain) {
            return kcp_keeper_runtime::exit_code(Err(e));
        }
    }
    let result = match command {
        Command::Run(args) => etcd_snapshotter::daemon::run(args).await,
        Command::Snapshot { config, shard } => commands::snapshot(&config, &shard).await,
        Command::List { config, shard } => commands::list(&config, shard.as_deref()).await,
        Command::Verify { config, id, identity_file, etcdutl } => {
            commands::verify(&config, &id, identity_file.as_deref(), &etcdutl).await
        }
        Command::Drill(args) => commands::drill(args).await,
        Command::Restore(args) => commands::restore(args).await,
        Command::Rbac { namespace, service_account, lease_name } => {
            print!("{}", etcd_snapshotter::rbac::render(&namespace, &service_account, &lease_name));
            Ok(())
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
