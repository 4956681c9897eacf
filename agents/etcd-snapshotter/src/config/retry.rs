//! `retry`: a scheduled snapshot run that failed is run again within its tick, so one S3 blip (or an etcd
//! leader election) costs minutes, not a whole interval: a daily schedule with one failed run would otherwise
//! leave a 48-hour gap.

use std::time::Duration;

use chrono::{DateTime, Utc};
use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::field::{Checked, GoDuration, duration_within};
use schemars::JsonSchema;
use serde::Deserialize;

use super::POSITIVE;

/// How a failed scheduled snapshot run is run again within its tick.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawRetry {
    /// Runs are tried again while less than this fraction of the time from the tick to the next one has
    /// passed (0.25 when absent; 0 never runs again).
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 0.9))]
    pub window_fraction: Option<f64>,
    /// Go-style duration: the wait after the first failed run, doubled after each one, at most 10m (30s when
    /// absent).
    #[serde(default)]
    pub initial_backoff: Option<Checked<GoDuration>>,
    /// Runs per tick at most, the first included (5 when absent).
    #[serde(default)]
    #[schemars(range(min = 1, max = 20))]
    pub max_runs: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Retry {
    pub window_fraction: f64,
    pub initial_backoff: Duration,
    pub max_runs: u32,
}

impl Default for Retry {
    fn default() -> Self {
        Self { window_fraction: 0.25, initial_backoff: Duration::from_secs(30), max_runs: 5 }
    }
}

const MAX_BACKOFF: Duration = Duration::from_secs(600);

impl Retry {
    /// After `runs` failed runs of the tick at `tick`, how long to wait before the next, or `None` when the
    /// next would start past the window (`window_fraction` of the way to `next_tick`) or past `max_runs`.
    /// Without a next tick (a schedule that ends) there is no interval to take a fraction of: no retry.
    pub fn wait_before_next(
        &self,
        tick: DateTime<Utc>,
        next_tick: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
        runs: u32,
    ) -> Option<Duration> {
        if runs >= self.max_runs {
            return None;
        }
        let interval = (next_tick? - tick).to_std().ok()?;
        let deadline = tick + chrono::Duration::from_std(interval.mul_f64(self.window_fraction)).ok()?;
        let wait = self.initial_backoff.saturating_mul(1 << runs.saturating_sub(1).min(16)).min(MAX_BACKOFF);
        (now + chrono::Duration::from_std(wait).ok()? < deadline).then_some(wait)
    }
}

pub(super) fn retry(raw: Option<RawRetry>, errors: &mut Vec<FieldError>) -> Retry {
    let raw = raw.unwrap_or_default();
    let default = Retry::default();
    let window_fraction = raw.window_fraction.unwrap_or(default.window_fraction);
    if !(0.0..=0.9).contains(&window_fraction) {
        errors.push(FieldError::new("retry.windowFraction", "must be 0 to 0.9 (of the time to the next tick)"));
    }
    let initial_backoff = duration_within(
        raw.initial_backoff,
        POSITIVE,
        default.initial_backoff,
        "retry.initialBackoff",
        "must be a positive Go duration like 30s",
        errors,
    );
    let max_runs = raw.max_runs.unwrap_or(default.max_runs);
    if !(1..=20).contains(&max_runs) {
        errors.push(FieldError::new("retry.maxRuns", "must be 1 to 20"));
    }
    Retry { window_fraction, initial_backoff, max_runs }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    #[test]
    fn a_failed_run_is_run_again_with_doubling_waits_until_the_window_or_the_run_limit_ends() {
        let retry = Retry { window_fraction: 0.25, initial_backoff: Duration::from_secs(30), max_runs: 5 };
        let daily = Some(at(86_400));
        assert_eq!(retry.wait_before_next(at(0), daily, at(60), 1), Some(Duration::from_secs(30)));
        assert_eq!(retry.wait_before_next(at(0), daily, at(120), 2), Some(Duration::from_secs(60)));
        assert_eq!(retry.wait_before_next(at(0), daily, at(300), 4), Some(Duration::from_secs(240)));
        assert_eq!(retry.wait_before_next(at(0), daily, at(600), 5), None, "five runs at most");
        // A quarter of a day: a run that would start after 6 hours does not.
        assert_eq!(retry.wait_before_next(at(0), daily, at(21_590), 1), None);
        // Every five minutes: a quarter is 75 s; one retry after 30 s fits, the next (60 s later) does not.
        let five_minutes = Some(at(300));
        assert_eq!(retry.wait_before_next(at(0), five_minutes, at(10), 1), Some(Duration::from_secs(30)));
        assert_eq!(retry.wait_before_next(at(0), five_minutes, at(45), 2), None);
        assert_eq!(retry.wait_before_next(at(0), None, at(10), 1), None, "no next tick, no interval");
        let never = Retry { window_fraction: 0.0, ..retry };
        assert_eq!(never.wait_before_next(at(0), daily, at(1), 1), None);
    }

    #[test]
    fn bad_values_are_named() {
        let mut errors = Vec::new();
        let raw: RawRetry =
            serde_yaml::from_str("windowFraction: 1.5\ninitialBackoff: soon\nmaxRuns: 0\n").expect("the fields parse");
        retry(Some(raw), &mut errors);
        let text = format!("{errors:?}");
        for field in ["retry.windowFraction", "retry.initialBackoff", "retry.maxRuns"] {
            assert!(text.contains(field), "{field} in {text}");
        }
        assert!(!text.contains("soon"), "{text}");
    }
}
