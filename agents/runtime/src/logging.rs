//! Logs through tracing: JSON for the cluster, human-readable on a terminal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// JSON unless stderr is a terminal.
    Auto,
    Json,
    Plain,
}

/// Installs the global subscriber. `level` is an env-filter directive (`info`, `kcp_keeper_runtime=debug,info`).
/// A second call (tests start several agents in one process) keeps the first subscriber.
pub fn init(level: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(level).map_err(|e| anyhow::anyhow!("--log-level {level:?}: {e}"))?;
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Plain => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if json {
        builder.json().flatten_event(true).with_current_span(false).with_span_list(false).try_init()
    } else {
        builder.try_init()
    };
    Ok(())
}
