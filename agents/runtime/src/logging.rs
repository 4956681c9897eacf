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
    let terminal = std::io::stderr().is_terminal();
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Plain => false,
        LogFormat::Auto => !terminal,
    };
    let ansi = colour(json, terminal, std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = if json {
        builder.json().flatten_event(true).with_current_span(false).with_span_list(false).try_init()
    } else {
        builder.try_init()
    };
    Ok(())
}

/// Colour codes only for a person at a terminal: a file, a pipe or a log shipper gets plain bytes, JSON never
/// carries them, and `NO_COLOR` (no-color.org) turns them off on a terminal too.
fn colour(json: bool, terminal: bool, no_color: bool) -> bool {
    !json && terminal && !no_color
}

#[cfg(test)]
mod tests {
    use super::colour;

    #[test]
    fn colour_only_in_plain_output_on_a_terminal_without_no_color() {
        assert!(colour(false, true, false));
        assert!(!colour(false, false, false), "plain output to a file or pipe");
        assert!(!colour(true, true, false), "JSON, even on a terminal");
        assert!(!colour(true, false, false));
        assert!(!colour(false, true, true), "NO_COLOR");
    }
}
