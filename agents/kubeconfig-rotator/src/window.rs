//! When a consumer restart may happen: at once without a window; inside a configured window otherwise, but never
//! later than the notAfter of the credential the consumer holds (the one it was last restarted for) minus the
//! margin, so a window that does not open in time never leaves a consumer on an expired credential. Pure.

use chrono::{DateTime, Utc};
use time::OffsetDateTime;

use crate::config::RestartWindow;

/// What to do with a consumer that is due a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPlan {
    /// Restart it now.
    Now,
    /// Not yet: at `until` at the latest (the window's next opening, or the deadline if sooner).
    Wait { until: OffsetDateTime },
}

/// The plan at `now` for a consumer holding a credential valid until `held_not_after` (`None`: unknown, as for a
/// consumer never restarted by the agent, so waiting cannot be shown to be safe).
pub fn plan(
    window: Option<&RestartWindow>,
    now: OffsetDateTime,
    held_not_after: Option<OffsetDateTime>,
) -> RestartPlan {
    let Some(window) = window else { return RestartPlan::Now };
    let Some(held_not_after) = held_not_after else { return RestartPlan::Now };
    let margin = time::Duration::try_from(window.margin).unwrap_or(time::Duration::MAX);
    let deadline = held_not_after.checked_sub(margin).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    if now >= deadline {
        return RestartPlan::Now;
    }
    let duration = time::Duration::try_from(window.duration).unwrap_or(time::Duration::MAX);
    // The first opening after (now - duration): at or before now, the window is open; later, it is the next one.
    let from = now.checked_sub(duration).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let Some(opening) = window.schedule.next_tick(to_chrono(from)).and_then(from_chrono) else {
        // A schedule that never fires again: the deadline decides.
        return RestartPlan::Wait { until: deadline };
    };
    if opening <= now { RestartPlan::Now } else { RestartPlan::Wait { until: opening.min(deadline) } }
}

fn to_chrono(t: OffsetDateTime) -> DateTime<Utc> {
    DateTime::from_timestamp(t.unix_timestamp(), t.nanosecond()).unwrap_or_default()
}

fn from_chrono(t: DateTime<Utc>) -> Option<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp(t.timestamp()).ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kcp_keeper_runtime::schedule::{Schedule, ScheduleSpec};
    use time::macros::datetime;

    use super::*;

    fn window(cron: &str, duration_h: u64, margin_h: u64) -> RestartWindow {
        let spec = ScheduleSpec {
            cron: cron.into(),
            time_zone: None,
            jitter: None,
            missed: Default::default(),
            starting_deadline: None,
        };
        RestartWindow {
            schedule: Schedule::new("restart-window", &spec).unwrap(),
            spec,
            duration: Duration::from_secs(duration_h * 3600),
            margin: Duration::from_secs(margin_h * 3600),
        }
    }

    const FAR: Option<OffsetDateTime> = Some(datetime!(2027-06-01 00:00 UTC));

    #[test]
    fn without_a_window_a_restart_is_at_once() {
        assert_eq!(plan(None, datetime!(2026-12-01 12:00 UTC), FAR), RestartPlan::Now);
    }

    #[test]
    fn inside_the_window_a_restart_is_at_once() {
        let w = window("0 2 * * *", 2, 24);
        assert_eq!(plan(Some(&w), datetime!(2026-12-01 02:00 UTC), FAR), RestartPlan::Now);
        assert_eq!(plan(Some(&w), datetime!(2026-12-01 03:59 UTC), FAR), RestartPlan::Now);
    }

    #[test]
    fn outside_the_window_a_restart_waits_for_the_next_opening() {
        let w = window("0 2 * * *", 2, 24);
        let until = datetime!(2026-12-02 02:00 UTC);
        assert_eq!(plan(Some(&w), datetime!(2026-12-01 04:00 UTC), FAR), RestartPlan::Wait { until });
        assert_eq!(plan(Some(&w), datetime!(2026-12-01 12:00 UTC), FAR), RestartPlan::Wait { until });
    }

    #[test]
    fn a_restart_never_waits_past_the_held_not_after_minus_the_margin() {
        // Opens on 1 January only; the held credential expires on 10 December, margin a day.
        let w = window("0 0 1 1 *", 1, 24);
        let held = Some(datetime!(2026-12-10 00:00 UTC));
        let deadline = datetime!(2026-12-09 00:00 UTC);
        assert_eq!(plan(Some(&w), datetime!(2026-12-01 12:00 UTC), held), RestartPlan::Wait { until: deadline });
        assert_eq!(plan(Some(&w), deadline, held), RestartPlan::Now);
        assert_eq!(plan(Some(&w), datetime!(2026-12-09 18:00 UTC), held), RestartPlan::Now);
        // Already past its end: at once.
        assert_eq!(plan(Some(&w), datetime!(2026-12-11 00:00 UTC), held), RestartPlan::Now);
    }

    #[test]
    fn a_consumer_whose_credential_is_unknown_is_restarted_at_once() {
        let w = window("0 0 1 1 *", 1, 24);
        assert_eq!(plan(Some(&w), datetime!(2026-12-01 12:00 UTC), None), RestartPlan::Now);
    }
}
