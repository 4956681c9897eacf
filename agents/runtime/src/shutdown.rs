//! Graceful shutdown: the first SIGTERM or SIGINT starts a drain (one token every task watches), a second one
//! exits at once.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Exit code after a second signal: the conventional 128 + SIGTERM.
const FORCED_EXIT: i32 = 143;

/// Returns the token cancelled on the first signal. Spawns the watcher task.
pub fn on_signals() -> std::io::Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let cancel = token.clone();
    tokio::spawn(async move {
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::info!("shutdown signal received: draining (send another to exit at once)");
        cancel.cancel();
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::warn!("second shutdown signal: exiting now");
        std::process::exit(FORCED_EXIT);
    });
    Ok(token)
}
