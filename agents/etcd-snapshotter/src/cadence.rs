//! The longest gap between consecutive firings of a schedule, for the `*_schedule_interval_seconds` gauges:
//! an alert "no success within 2x the schedule" needs the schedule's worst gap, not its usual one (`0 3 * * 1-5`
//! fires daily but leaves a three-day gap over the weekend).

use std::time::Duration;

use chrono::{DateTime, Utc};
use kcp_keeper_runtime::schedule::Schedule;

/// Firings looked at: enough for every calendar pattern of a sub-hourly schedule to repeat within a week, and
/// bounded for a per-second one.
const MAX_FIRINGS: usize = 20_000;
/// A year and a bit: a yearly or monthly schedule shows its longest gap within this span.
const HORIZON_DAYS: i64 = 400;

/// The longest gap between two consecutive fire times (jitter included) from `from` on; zero when the
/// schedule fires fewer than twice within the horizon.
pub fn longest_gap(schedule: &Schedule, from: DateTime<Utc>) -> Duration {
    let horizon = from + chrono::Duration::days(HORIZON_DAYS);
    let mut longest = chrono::Duration::zero();
    let Some(mut tick) = schedule.next_tick(from) else { return Duration::ZERO };
    let mut previous_fire = schedule.fire_time(tick);
    for _ in 0..MAX_FIRINGS {
        let Some(next) = schedule.next_tick(tick) else { break };
        if next > horizon {
            break;
        }
        let fire = schedule.fire_time(next);
        longest = longest.max(fire - previous_fire);
        previous_fire = fire;
        tick = next;
    }
    longest.to_std().unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use kcp_keeper_runtime::schedule::{Missed, ScheduleSpec};

    use super::*;

    fn schedule(cron: &str, jitter: Option<&str>) -> Schedule {
        let spec = ScheduleSpec {
            cron: cron.into(),
            time_zone: None,
            jitter: jitter.map(Into::into),
            missed: Missed::RunOnce,
            starting_deadline: None,
        };
        Schedule::new("s", &spec).unwrap()
    }

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn weekdays_only_has_the_weekend_as_its_longest_gap() {
        let gap = longest_gap(&schedule("0 3 * * 1-5", None), at("2026-11-30T00:00:00Z"));
        assert_eq!(gap, Duration::from_secs(3 * 86400));
    }

    #[test]
    fn a_regular_schedule_has_its_period_and_jitter_can_only_widen_it() {
        let from = at("2026-11-30T00:00:00Z");
        assert_eq!(longest_gap(&schedule("*/15 * * * *", None), from), Duration::from_secs(900));
        let jittered = longest_gap(&schedule("0 * * * *", Some("10m")), from);
        assert!(jittered > Duration::from_secs(3600) && jittered < Duration::from_secs(3600 + 600), "{jittered:?}");
    }

    #[test]
    fn a_schedule_that_fires_once_has_no_gap() {
        assert_eq!(longest_gap(&schedule("0 0 0 1 1 * 2027", None), at("2026-11-30T00:00:00Z")), Duration::ZERO);
    }
}
