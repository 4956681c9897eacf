//! Every retry counted, by what was retried and why (`etcd_snapshotter_retries_total{op,reason}`), and logged.
//!
//! The SDK's standard retry strategy does the retrying (it classifies 503 SlowDown and other throttling, 5xx,
//! reset or closed connections and timeouts as worth another attempt, with exponential jittered backoff); an
//! interceptor on the client notes why each attempt failed and counts it when the next attempt starts, so the
//! count is of retries that happened, not of failures. A whole snapshot run that failed and is run again
//! within its tick (`schedule`) is counted under `op="snapshot_run"` with the run's failure reason.

use std::sync::{Arc, OnceLock};

use aws_sdk_s3::config::interceptors::{BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef};
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_types::config_bag::{Storable, StoreReplace};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::labels::RetryLabels;

/// Why an S3 attempt failed: the `reason` of `etcd_snapshotter_retries_total` for the S3 ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum Reason {
    /// 503 (SlowDown) or 429.
    Throttled,
    /// Any other 5xx.
    ServerError,
    /// Refused, reset or closed before a whole response came.
    Connection,
    /// The attempt's timeout.
    Timeout,
    /// Anything else the SDK retried (a throttling or timeout code sent with a 4xx status).
    Other,
}

/// `op`: a multipart part, any other S3 request, a whole snapshot run.
pub const OP_UPLOAD_PART: &str = "upload_part";
pub const OP_REQUEST: &str = "s3_request";
pub const OP_RUN: &str = "snapshot_run";

/// Why an attempt failed, from what the SDK saw: its error kind and the response's status.
fn reason(timeout: bool, connector: Option<(bool, bool)>, response: bool, status: Option<u16>) -> Reason {
    match (timeout, connector, response, status) {
        (true, ..) | (_, Some((true, _)), ..) => Reason::Timeout,
        (_, Some(_), ..) | (_, _, true, _) => Reason::Connection,
        (.., Some(429 | 503)) => Reason::Throttled,
        (.., Some(500..=599)) => Reason::ServerError,
        _ => Reason::Other,
    }
}

/// The last failed attempt of one operation (in the operation's own ConfigBag, so per request).
#[derive(Debug, Clone)]
struct LastFailure(Option<Reason>);

impl Storable for LastFailure {
    type Storer = StoreReplace<Self>;
}

/// The interceptor: on the client from the start, counting once [`RetryCounter::count_into`] gave it the
/// daemon's counter (one-shots only log).
#[derive(Debug, Clone, Default)]
pub struct RetryCounter {
    counter: Arc<OnceLock<Family<RetryLabels, Counter>>>,
}

impl RetryCounter {
    pub fn count_into(&self, family: Family<RetryLabels, Counter>) {
        let _ = self.counter.set(family);
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Intercept for RetryCounter {
    fn name(&self) -> &'static str {
        "RetryCounter"
    }

    fn read_before_attempt(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(reason) = cfg.load::<LastFailure>().and_then(|last| last.0) else { return Ok(()) };
        cfg.interceptor_state().store_put(LastFailure(None));
        let request = context.request();
        let op = if request.uri().contains("partNumber=") { OP_UPLOAD_PART } else { OP_REQUEST };
        let reason: &'static str = reason.into();
        if let Some(family) = self.counter.get() {
            family.get_or_create(&RetryLabels { op: op.into(), reason: reason.into() }).inc();
        }
        // The path names the bucket and key, never a credential (those travel in headers).
        let path = request.uri().split('?').next().unwrap_or_default().to_string();
        tracing::warn!(op, reason, method = request.method(), path, "S3 attempt failed; retrying");
        Ok(())
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let failed = match context.output_or_error() {
            Some(Err(e)) => Some(reason(
                e.is_timeout_error(),
                e.as_connector_error().map(|c| (c.is_timeout(), c.is_io())),
                e.is_response_error(),
                context.response().map(|r| r.status().as_u16()),
            )),
            _ => None,
        };
        cfg.interceptor_state().store_put(LastFailure(failed));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_failure_is_named_by_its_kind_before_its_status() {
        assert_eq!(reason(true, None, false, None), Reason::Timeout);
        assert_eq!(reason(false, Some((true, false)), false, None), Reason::Timeout);
        assert_eq!(reason(false, Some((false, true)), false, None), Reason::Connection);
        assert_eq!(reason(false, None, true, Some(200)), Reason::Connection);
        assert_eq!(reason(false, None, false, Some(503)), Reason::Throttled);
        assert_eq!(reason(false, None, false, Some(429)), Reason::Throttled);
        assert_eq!(reason(false, None, false, Some(502)), Reason::ServerError);
        assert_eq!(reason(false, None, false, Some(400)), Reason::Other);
    }
}
