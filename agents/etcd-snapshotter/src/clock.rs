//! The time the agent records, corrected by the object stores' clocks.
//!
//! A restore to a time (`restore --at TIME`) places TIME among the times the agent recorded: when each delta's
//! events arrived, when its watch opened, when each full snapshot started and ended. A host whose clock runs
//! ahead (its time sync failed) would record every write later than it happened, and one behind would record
//! writes earlier, so a time point would restore a state after it. The stores prove how far off the host is:
//! each S3 response carries the store's `Date` (whole seconds, rounded down, and up to a second old from
//! servers that cache it, as versitygw's does), so a request sent at `sent` and answered at `received` (host
//! clock) with `Date: D` bounds the offset (store minus host) to `[D - received, D + 2 - sent]`. The bounds of
//! every answer are intersected (an empty intersection, a clock stepped, starts over; so does every ten
//! minutes, for drift).
//!
//! While the bounds come within a second of zero, the host's clock is used as it is (a `Date` renewed late by a
//! busy store would otherwise shift every time early by the delay). Once they prove the host off by more, each time is
//! corrected toward the side that keeps its promise: [`now`], for the times a restore places a point among,
//! by the upper bound (never earlier than the store's time, so a point never takes in a write made after it);
//! [`unix_now_proven`], for the recovery-point metric, by the lower bound (never later, so it never claims a
//! write it does not hold). The stores' clocks are the reference: object stores keep theirs synchronised, and
//! a restore is run against them.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use aws_sdk_s3::config::interceptors::{
    BeforeDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_types::config_bag::{Storable, StoreReplace};
use chrono::{DateTime, Utc};

/// How long the intersected bounds are kept before they start over from the next answer.
const REFRESH: Duration = Duration::from_secs(600);

/// The offset (store minus host, seconds) as the answers so far bound it.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    low: f64,
    high: f64,
    since: Instant,
}

static BOUNDS: Mutex<Option<Bounds>> = Mutex::new(None);

/// How old a `Date` may be beyond its rounding: servers that cache the header renew it once a second.
const DATE_SLACK: f64 = 1.0;

/// Takes one answer: sent at `sent`, received at `received` (host Unix seconds), stamped `date` (the store's
/// Unix seconds, rounded down, perhaps [`DATE_SLACK`] old).
pub fn observe(sent: f64, received: f64, date: i64) {
    let (low, high) = (date as f64 - received, date as f64 + 1.0 + DATE_SLACK - sent);
    let mut bounds = BOUNDS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let now = Instant::now();
    *bounds = Some(match *bounds {
        Some(b) if now.duration_since(b.since) < REFRESH && low.max(b.low) <= high.min(b.high) => {
            Bounds { low: low.max(b.low), high: high.min(b.high), since: b.since }
        }
        _ => {
            let started = Bounds { low, high, since: now };
            if low > 1.0 || high < -1.0 {
                tracing::warn!(
                    at_least_seconds = if low > 0.0 { low } else { high },
                    "this host's clock is off from the object store's; recorded times are corrected by it"
                );
            }
            started
        }
    });
}

/// How far the bounds must prove the host off before its clock is corrected. A `Date` staler than
/// [`DATE_SLACK`] (a store starved of CPU renews its cached header late) makes a bound wrong by the excess; a
/// correction by such a bound would record times earlier than they happened, and a time point would take in
/// writes made after it (a robustness run on a loaded machine did exactly that, by 15 ms). Within this margin
/// the host's clock, kept by its own time sync, is the better estimate.
const PROVEN_OFF: f64 = 1.0;

/// The corrections (seconds) added to the host's clock, `(lower, upper)` bounds of the offset: both 0 until the
/// answers prove the host off by more than [`PROVEN_OFF`].
pub fn corrections() -> (f64, f64) {
    let bounds = *BOUNDS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    match bounds {
        Some(Bounds { low, high, .. }) if low > PROVEN_OFF || high < -PROVEN_OFF => (low, high),
        _ => (0.0, 0.0),
    }
}

/// The correction [`now`] adds (the offset's upper bound once the host is proven off).
pub fn offset() -> f64 {
    corrections().1
}

/// A time to record for a restore to place points among: the host's clock corrected so that it is never
/// earlier than the stores' time.
pub fn now() -> DateTime<Utc> {
    shifted(corrections().1)
}

/// A time up to which something is proven (the recovery point), as Unix seconds: never later than the stores'
/// time.
pub fn unix_now_proven() -> f64 {
    shifted(corrections().0).timestamp_millis() as f64 / 1000.0
}

fn shifted(seconds: f64) -> DateTime<Utc> {
    Utc::now() + chrono::Duration::milliseconds((seconds * 1000.0) as i64)
}

/// When this attempt was sent (host Unix seconds), in the attempt's own ConfigBag.
#[derive(Debug, Clone, Copy)]
struct SentAt(f64);

impl Storable for SentAt {
    type Storer = StoreReplace<Self>;
}

/// The interceptor on every store's client that feeds [`observe`].
#[derive(Debug, Clone, Default)]
pub struct StoreClock;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn host_unix() -> f64 {
    Utc::now().timestamp_micros() as f64 / 1e6
}

impl Intercept for StoreClock {
    fn name(&self) -> &'static str {
        "StoreClock"
    }

    fn read_before_transmit(
        &self,
        _: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        cfg.interceptor_state().store_put(SentAt(host_unix()));
        Ok(())
    }

    fn read_before_deserialization(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let received = host_unix();
        let date = context.response().headers().get("date").and_then(|d| DateTime::parse_from_rfc2822(d).ok());
        if let (Some(SentAt(sent)), Some(date)) = (cfg.load::<SentAt>().copied(), date) {
            observe(sent, received, date.timestamp());
        }
        Ok(())
    }
}

/// A time as the agent prints and records it: RFC 3339, milliseconds, `Z`.
pub fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// [`stamp`] of a Unix time in milliseconds (the number itself when it is no time).
pub fn stamp_ms(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms).map_or_else(|| ms.to_string(), stamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_bound_the_offset_and_a_host_proven_off_is_corrected_by_each_bound() {
        // One process-wide estimate: the cases run in order in one test.
        let host = 1_000_000.0;
        // A store 30 s ahead of the host: Date 1_000_030 for a request sent at host + 0.2, answered at + 0.3.
        observe(host + 0.2, host + 0.3, 1_000_030);
        let (low, high) = corrections();
        assert!((29.69..=29.71).contains(&low) && (31.79..=31.81).contains(&high), "{low} {high}");
        // Another answer a little later in the store's second narrows the bounds; they always hold the true 30.
        observe(host + 0.75, host + 0.8, 1_000_030);
        let (low, high) = corrections();
        assert!((29.69..=30.0).contains(&low) && (30.0..=31.26).contains(&high), "{low} {high}");
        // The host stepped to agree with the store: the bounds no longer meet, and the estimate starts over.
        observe(host + 100.2, host + 100.3, 1_000_100);
        assert_eq!(corrections(), (0.0, 0.0), "a host agreeing with the store is not corrected");
        // A store whose Date is a second old (cached): still no correction for a host that agrees with it.
        observe(host + 100.9, host + 101.0, 1_000_099);
        assert_eq!(corrections(), (0.0, 0.0), "a cached Date proves nothing off");
        // A host 50 s ahead of the store: a negative correction, by no more than the host is off.
        observe(host + 200.0, host + 200.1, 1_000_150);
        let (low, high) = corrections();
        assert!((-50.11..=-50.0).contains(&low) && (-50.0..=-47.99).contains(&high), "{low} {high}");
        // A host that agrees with the store, answered with a Date renewed 1.8 s late (a store starved of CPU):
        // the bound it gives is below zero, wrongly, and within the margin: no correction, no time recorded early.
        observe(host + 299.8, host + 299.9, 1_000_297);
        assert_eq!(corrections(), (0.0, 0.0), "a stale Date does not shift recorded times early");
    }
}
