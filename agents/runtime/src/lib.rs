//! What every kcp-keeper agent shares: CLI plumbing, strict configuration with live reload, logging, a
//! secret-hiding type, the admin server (`/livez`, `/readyz`, `/metrics`), leader election, scoped watches and
//! the reconcile driver, server-side-apply writes that never clobber, rate-limited Events, URLs shown without
//! their credentials and graceful shutdown. An agent is its own logic plus one implementation of [`agent::Agent`]; its `main.rs` calls
//! [`cli::main`].

#![warn(clippy::too_many_lines)]

pub mod admin;
pub mod agent;
pub mod apply;
pub mod args;
pub mod cli;
pub mod config;
pub mod consumer_restart;
pub mod context;
pub mod dirwatch;
pub mod driver;
pub mod duration;
pub mod events;
pub mod field;
pub mod foreign;
pub mod label_selector;
pub mod lease;
pub mod logging;
pub mod marked_block;
pub mod metrics;
pub mod names;
pub mod rbac;
pub mod redact;
pub mod release_resident;
pub mod schedule;
pub mod sensitive;
pub mod shutdown;
pub mod watch;

pub use sensitive::Sensitive;

/// `<version> (commit <sha>)`, printed by `--version` and exported as build info.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("KCP_KEEPER_COMMIT"), ")");
pub const COMMIT: &str = env!("KCP_KEEPER_COMMIT");

/// Installs rustls's ring provider explicitly: with more than one provider linked, rustls will not guess.
pub fn init_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Prints an error with its causes (never a secret: error types wrap secret material in [`Sensitive`]) and
/// turns it into the process's exit code.
pub fn exit_code(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The field manager of every write, and the label value marking objects kcp-keeper created.
pub const FIELD_MANAGER: &str = "kcp-keeper";
