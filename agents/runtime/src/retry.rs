//! Retries for calls to peers (the apiserver, etcd, S3, a resolver): exponential backoff with jitter through
//! `backon`, bounded in attempts and in time spent waiting, retrying only what the error says is worth
//! retrying, and stopping at once when shutdown starts.
//!
//! Why each rule:
//! - Jitter: replicas and shards that failed together must not retry in lockstep against a recovering peer.
//! - Bounds: a call that cannot succeed must end with a clear error the reconcile reports and requeues, not
//!   hold its caller for ever.
//! - Classification ([`Retryable`]): a 404, a 403 or a conflict answers the same on every attempt; retrying it
//!   only delays the error and adds load. Connection failures, timeouts, 429 and 5xx are worth another go.
//! - Shutdown: a drain must not wait out a backoff. The attempt in flight is dropped too, so use this for
//!   calls that are safe to drop (reads, or writes the next reconcile re-checks); long jobs that must finish
//!   or clean up run under [`crate::shutdown::finish_or_abort`].

use std::cell::Cell;
use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable as _};
use tokio_util::sync::CancellationToken;

/// Whether an error is worth another attempt.
pub trait Retryable {
    fn is_retryable(&self) -> bool;
}

impl Retryable for kube::Error {
    fn is_retryable(&self) -> bool {
        match self {
            // Throttled, timed out on the server, or the server (or a proxy in front of it) failed.
            kube::Error::Api(status) => matches!(status.code, 408 | 429 | 500 | 502 | 503 | 504),
            // The connection failed or broke (refused, reset, timed out, TLS handshake interrupted).
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => true,
            _ => false,
        }
    }
}

impl Retryable for std::io::Error {
    fn is_retryable(&self) -> bool {
        use std::io::ErrorKind::*;
        matches!(
            self.kind(),
            ConnectionRefused
                | ConnectionReset
                | ConnectionAborted
                | NotConnected
                | BrokenPipe
                | TimedOut
                | Interrupted
        )
    }
}

/// How hard to try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first backoff; each later one doubles, with jitter.
    pub min_delay: Duration,
    /// No single backoff is longer.
    pub max_delay: Duration,
    /// Attempts in all, the first included (at least 1).
    pub max_attempts: usize,
    /// Time spent waiting between attempts, in all (the attempts' own time is bounded by their timeouts).
    pub max_waiting: Duration,
}

impl Default for RetryPolicy {
    /// 200 ms doubling to 5 s, at most 6 attempts and 30 s of waiting: enough for an apiserver restart or a
    /// leader change in etcd, short enough that the reconcile's own backoff takes over after that.
    fn default() -> Self {
        Self {
            min_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            max_attempts: 6,
            max_waiting: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RetryError<E> {
    /// The error is not worth retrying (it came at attempt `attempts`).
    #[error("{what}: {error}")]
    Permanent { what: String, attempts: usize, error: E },
    /// Retryable errors until the attempts or the waiting time ran out; `error` is the last.
    #[error("{what}: gave up after {attempts} attempts: {error}")]
    Exhausted { what: String, attempts: usize, error: E },
    /// Shutdown started; the call was abandoned.
    #[error("{what}: abandoned at shutdown")]
    ShutDown { what: String },
}

impl<E> RetryError<E> {
    /// A low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Permanent { .. } => "permanent",
            Self::Exhausted { .. } => "exhausted",
            Self::ShutDown { .. } => "shutdown",
        }
    }

    /// The last error from the call, if one was seen.
    pub fn into_error(self) -> Option<E> {
        match self {
            Self::Permanent { error, .. } | Self::Exhausted { error, .. } => Some(error),
            Self::ShutDown { .. } => None,
        }
    }
}

/// Calls `op` until it succeeds, fails with an error that is not [`Retryable`], runs out of attempts or
/// waiting time, or `shutdown` is cancelled. `what` names the call in logs and errors (never secrets).
pub async fn retry<T, E, F, Fut>(
    policy: &RetryPolicy,
    shutdown: &CancellationToken,
    what: &str,
    op: F,
) -> Result<T, RetryError<E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Retryable + Display,
{
    let backoff = ExponentialBuilder::default()
        .with_min_delay(policy.min_delay)
        .with_max_delay(policy.max_delay)
        .with_max_times(policy.max_attempts.saturating_sub(1))
        .with_total_delay(Some(policy.max_waiting))
        .with_jitter();
    let retries = Cell::new(0usize);
    let attempts = op.retry(backoff).sleep(tokio::time::sleep).when(|e: &E| e.is_retryable()).notify(
        |error: &E, delay: Duration| {
            retries.set(retries.get() + 1);
            tracing::warn!(call = what, attempt = retries.get(), %error, ?delay, "call failed; retrying");
        },
    );
    let result = tokio::select! {
        biased;
        () = shutdown.cancelled() => return Err(RetryError::ShutDown { what: what.into() }),
        result = attempts => result,
    };
    let attempts = retries.get() + 1;
    result.map_err(|error| {
        let what = what.to_string();
        if error.is_retryable() {
            RetryError::Exhausted { what, attempts, error }
        } else {
            RetryError::Permanent { what, attempts, error }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[derive(Debug)]
    struct Failure(bool);

    impl Display for Failure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "failure (retryable: {})", self.0)
        }
    }

    impl Retryable for Failure {
        fn is_retryable(&self) -> bool {
            self.0
        }
    }

    fn fast(max_attempts: usize) -> RetryPolicy {
        RetryPolicy {
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            max_attempts,
            max_waiting: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn attempts_are_bounded_and_counted() {
        let calls = AtomicUsize::new(0);
        let result: Result<(), _> = retry(&fast(4), &CancellationToken::new(), "call", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(Failure(true))
        })
        .await;
        assert!(matches!(result, Err(RetryError::Exhausted { attempts: 4, .. })), "{result:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn an_error_that_is_not_retryable_ends_at_once() {
        let calls = AtomicUsize::new(0);
        let result: Result<(), _> = retry(&fast(4), &CancellationToken::new(), "call", || async {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            Err(Failure(n == 0))
        })
        .await;
        assert!(matches!(result, Err(RetryError::Permanent { attempts: 2, .. })), "{result:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn kube_errors_are_classified_by_status() {
        let status = |code: u16| kube::Error::Api(Box::new(kube::core::Status::failure("x", "y").with_code(code)));
        for code in [429, 500, 503, 504] {
            assert!(status(code).is_retryable(), "{code}");
        }
        for code in [400, 401, 403, 404, 409, 422] {
            assert!(!status(code).is_retryable(), "{code}");
        }
    }
}
