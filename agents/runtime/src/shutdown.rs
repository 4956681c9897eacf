//! Graceful shutdown: the first SIGTERM or SIGINT starts a drain (one token every task watches), a second one
//! exits at once.
//!
//! Long jobs (a snapshot streaming into a multipart upload) run under [`finish_or_abort`]: after the first
//! signal they get a bounded time to finish, then an abort hook cleans up what they started in a peer, so a
//! drain never leaves half-done work behind and never outlasts the pod's termination grace period.

use std::future::Future;
use std::time::Duration;

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

/// SIGTERM or SIGINT, whichever comes first: for a one-shot command that stops what it is doing on either (its
/// future dropped, its clean-up in `Drop`) and says which stopped it.
pub async fn stop_signal() -> &'static str {
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// How long a job may go on after shutdown started, and how long its abort hook may take after that.
///
/// Both together must fit in the pod's `terminationGracePeriodSeconds` (30 s by default) with room for the
/// lease release, or kubelet's SIGKILL cuts the abort short and leaves the half-done work behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grace {
    /// Time the job gets to finish once shutdown started.
    pub finish: Duration,
    /// Time the abort hook gets once the job was given up.
    pub abort: Duration,
}

impl Default for Grace {
    fn default() -> Self {
        Self { finish: Duration::from_secs(15), abort: Duration::from_secs(8) }
    }
}

/// How a job guarded by [`finish_or_abort`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd<T> {
    /// The job ran to its end (before shutdown, or within the grace after it).
    Finished(T),
    /// The job overran its grace and was dropped; its abort hook ran to completion.
    Aborted,
    /// The job was dropped and its abort hook did not finish within its own bound either.
    AbortTimedOut,
}

/// Runs `job`, which should watch `shutdown` itself and wind down at a safe point (not start the next part).
/// Once `shutdown` is cancelled it gets `grace.finish` more; if it is still running then, it is dropped (its
/// in-flight requests with it) and `abort` runs, bounded by `grace.abort`, to clean up what the job leaves
/// behind elsewhere (e.g. abort a multipart upload, which dropping alone would leave half-done in the bucket).
///
/// Why drop then abort, not just drop: dropping a future stops our side only; state the job created in a peer
/// survives it. Why a bound on the abort too: a peer that hangs must not hold the pod past its grace period.
pub async fn finish_or_abort<T, J, A, AF>(shutdown: &CancellationToken, grace: Grace, job: J, abort: A) -> JobEnd<T>
where
    J: Future<Output = T>,
    A: FnOnce() -> AF,
    AF: Future<Output = ()>,
{
    // Boxed so that giving up really drops it (and its connections) before the abort hook runs.
    let mut job = Box::pin(job);
    tokio::select! {
        biased;
        value = &mut job => return JobEnd::Finished(value),
        () = shutdown.cancelled() => {}
    }
    tracing::info!(grace = ?grace.finish, "shutdown: letting the job in flight finish");
    if let Ok(value) = tokio::time::timeout(grace.finish, &mut job).await {
        return JobEnd::Finished(value);
    }
    drop(job);
    tracing::warn!(grace = ?grace.finish, "the job did not finish within its grace; aborting it");
    match tokio::time::timeout(grace.abort, abort()).await {
        Ok(()) => JobEnd::Aborted,
        Err(_) => {
            tracing::error!(bound = ?grace.abort, "the abort hook did not finish in time; what it guards is left behind");
            JobEnd::AbortTimedOut
        }
    }
}
