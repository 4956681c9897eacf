//! Cron schedules for leader-only jobs (etcd-snapshotter's snapshots and drills): a cron expression in a time
//! zone, a deterministic jitter, a policy for ticks nobody ran, and a record of the last tick fired so that a
//! new leader never runs a tick again.
//!
//! Why each piece:
//! - Time zone: operators write "03:00 in Europe/Berlin" and mean it across daylight saving changes; the cron
//!   expression is evaluated in that zone (`chrono-tz`), a time skipped by the clock change does not fire.
//! - Jitter: many shards on one schedule must not all stream to S3 in the same second. The offset of each tick
//!   is derived from the schedule's name and the tick (SHA-256), so every replica computes the same fire time
//!   and a takeover changes nothing.
//! - Missed ticks (the leader was down, or a job ran past the next tick): [`Missed::RunOnce`] catches up with
//!   one run for all of them (a late snapshot beats none); [`Missed::Skip`] drops ticks that are later than
//!   `startingDeadline` and waits for the next one.
//! - Only the leader fires, and each tick at most once across leaders: before running tick T the leader writes
//!   T into an annotation on its own Lease (`schedule.kcp-keeper.io/<name>`), in a write conditional on the
//!   resourceVersion of a read that showed it as holder. The elector's own writes are conditional the same way,
//!   so a takeover and a claim are ordered by the apiserver: a new leader reads T and does not run it again, and
//!   a claim that races a takeover fails with 409 and is re-read. The record is written before the run, so a
//!   leader that dies mid-run does not hand the tick on (a job that must finish uses the shutdown grace).
//! - Clocks: a leader records a tick only once its own clock passed it, so a record later than now plus the
//!   jitter plus [`CLOCK_SLACK`] was written by a clock that ran ahead. It is ignored with a warning (and
//!   overwritten by the next claim): a wrong clock must not stop a successor until that time comes.
//!
//! The Lease annotation is written by JSON merge patch (field manager `kcp-keeper`) rather than server-side
//! apply: an apply of one annotation would drop the sibling schedules' annotations applied by the same manager.

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::FIELD_MANAGER;
use crate::duration::parse_go_duration;
use crate::lease::Leadership;

/// Prefix of the annotation that records a schedule's last fired tick on the agent's Lease.
pub const RECORD_PREFIX: &str = "schedule.kcp-keeper.io/";

/// How far ahead of our clock (beyond the jitter) another replica's clock may be before its record is ignored.
pub const CLOCK_SLACK: Duration = Duration::from_secs(120);

/// At most this many ticks are looked at when catching up (a per-second schedule after a long outage).
const MAX_TICKS_SCANNED: usize = 100_000;

/// What to do with ticks that passed without a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Missed {
    /// Run once for all of them, as soon as possible.
    #[default]
    RunOnce,
    /// Drop the ones later than the starting deadline; wait for the next tick.
    Skip,
}

/// A cron schedule, as written in configuration.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScheduleSpec {
    /// Standard 5-field cron (`0 3 * * *`), 6 or 7 fields with seconds and years, or `@daily` and friends.
    pub cron: String,
    /// IANA zone name (`Europe/Berlin`); UTC when absent.
    #[serde(default)]
    pub time_zone: Option<String>,
    /// Go-style duration (`5m`): each tick fires up to this much later.
    #[serde(default)]
    pub jitter: Option<String>,
    /// What to do with ticks that passed without a run: `runOnce` (the default) runs once for all of them, as
    /// soon as possible; `skip` drops the ones later than the starting deadline.
    #[serde(default)]
    pub missed: Missed,
    /// Go-style duration: how late a tick may still start (beyond its jitter); 5m when absent.
    #[serde(default)]
    pub starting_deadline: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("cron: {0}")]
    Cron(String),
    #[error("timeZone: unknown zone {0:?}")]
    TimeZone(String),
    #[error("{0}: {1}")]
    Duration(&'static str, String),
    #[error(
        "name {0:?}: must be 1-63 characters of letters, digits, '-', '_' or '.', starting and ending alphanumeric"
    )]
    Name(String),
}

/// A validated schedule; equal when name, cron expression, time zone, jitter, missed-tick policy and starting
/// deadline are.
#[derive(Clone, PartialEq, Eq)]
pub struct Schedule {
    name: String,
    cron: cron::Schedule,
    tz: Tz,
    jitter: Duration,
    missed: Missed,
    starting_deadline: Duration,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("name", &self.name)
            .field("cron", &self.cron.source())
            .field("tz", &self.tz.name())
            .field("jitter", &self.jitter)
            .field("missed", &self.missed)
            .field("starting_deadline", &self.starting_deadline)
            .finish()
    }
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Nothing is due: plan again at `until`.
    Wait { until: DateTime<Utc> },
    /// Run `tick` now; `missed` earlier ticks are covered by this run.
    Fire { tick: DateTime<Utc>, missed: usize },
    /// `tick` and the `missed` before it are too late to run: move past them.
    Skip { tick: DateTime<Utc>, missed: usize },
}

impl Schedule {
    /// `name` identifies the schedule (in the Lease annotation, the jitter, logs); e.g. `snapshot-root`.
    pub fn new(name: &str, spec: &ScheduleSpec) -> Result<Self, ScheduleError> {
        check_name(name)?;
        let expression = match spec.cron.split_whitespace().count() {
            // The cron crate wants seconds first; standard cron has none.
            5 => format!("0 {}", spec.cron.trim()),
            _ => spec.cron.trim().to_string(),
        };
        let cron = cron::Schedule::from_str(&expression).map_err(|e| ScheduleError::Cron(e.to_string()))?;
        let tz = match &spec.time_zone {
            None => Tz::UTC,
            Some(zone) => zone.parse::<Tz>().map_err(|_| ScheduleError::TimeZone(zone.clone()))?,
        };
        let duration = |field: &'static str, text: &Option<String>, default: Duration| match text {
            None => Ok(default),
            Some(text) => parse_go_duration(text).map_err(|e| ScheduleError::Duration(field, e.to_string())),
        };
        Ok(Self {
            name: name.into(),
            cron,
            tz,
            jitter: duration("jitter", &spec.jitter, Duration::ZERO)?,
            missed: spec.missed,
            starting_deadline: duration("startingDeadline", &spec.starting_deadline, Duration::from_secs(300))?,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The annotation on the Lease that records this schedule's last fired tick.
    pub fn record_key(&self) -> String {
        format!("{RECORD_PREFIX}{}", self.name)
    }

    /// The first tick strictly after `after`.
    pub fn next_tick(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron.after(&after.with_timezone(&self.tz)).next().map(|t| t.with_timezone(&Utc))
    }

    /// When `tick` fires: the tick plus its jitter, the same on every replica.
    pub fn fire_time(&self, tick: DateTime<Utc>) -> DateTime<Utc> {
        let jitter_ms = u64::try_from(self.jitter.as_millis()).unwrap_or(u64::MAX);
        if jitter_ms == 0 {
            return tick;
        }
        let digest =
            Sha256::new().chain_update(self.name.as_bytes()).chain_update(tick.timestamp().to_be_bytes()).finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        let offset = u64::from_be_bytes(first) % jitter_ms;
        let offset = chrono::Duration::milliseconds(i64::try_from(offset).unwrap_or(i64::MAX));
        tick.checked_add_signed(offset).unwrap_or(DateTime::<Utc>::MAX_UTC)
    }

    /// Whether a recorded tick can have been written by a clock in step with ours: not later than `now`
    /// plus the jitter plus [`CLOCK_SLACK`].
    pub fn record_is_plausible(&self, recorded: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        let ahead = chrono::Duration::from_std(self.jitter + CLOCK_SLACK).unwrap_or(chrono::Duration::MAX);
        now.checked_add_signed(ahead).is_none_or(|latest| recorded <= latest)
    }

    /// `recorded` unless it is implausible ([`Schedule::record_is_plausible`]), with a warning then.
    fn trusted(&self, recorded: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
        let now = Utc::now();
        let recorded = recorded?;
        if self.record_is_plausible(recorded, now) {
            return Some(recorded);
        }
        tracing::warn!(
            schedule = self.name(),
            %recorded,
            %now,
            "the recorded tick is later than this clock allows (a clock ahead wrote it); ignored"
        );
        None
    }

    /// Decides at `now` what to do about the ticks after `after` (the last tick handled).
    pub fn plan(&self, now: DateTime<Utc>, after: DateTime<Utc>) -> Plan {
        let mut latest_due = None;
        let mut due = 0usize;
        let mut cursor = after;
        while due < MAX_TICKS_SCANNED {
            let Some(tick) = self.next_tick(cursor) else { break };
            if self.fire_time(tick) > now {
                if latest_due.is_none() {
                    return Plan::Wait { until: self.fire_time(tick) };
                }
                break;
            }
            latest_due = Some(tick);
            due += 1;
            cursor = tick;
        }
        let Some(tick) = latest_due else {
            // A schedule with no future tick (a past year): never again.
            return Plan::Wait { until: DateTime::<Utc>::MAX_UTC };
        };
        let missed = due - 1;
        let deadline = chrono::Duration::from_std(self.starting_deadline)
            .ok()
            .and_then(|d| self.fire_time(tick).checked_add_signed(d))
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        match self.missed {
            Missed::Skip if now > deadline => Plan::Skip { tick, missed },
            Missed::RunOnce | Missed::Skip => Plan::Fire { tick, missed },
        }
    }
}

fn check_name(name: &str) -> Result<(), ScheduleError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    if ok { Ok(()) } else { Err(ScheduleError::Name(name.into())) }
}

/// One run handed to the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    /// The scheduled instant this run is for.
    pub at: DateTime<Utc>,
    /// Earlier ticks nobody ran that this run stands in for.
    pub missed: usize,
}

/// Where the record lives and who we are: the agent's own Lease and its identity in it.
#[derive(Clone)]
pub struct LeaseRecord {
    pub api: Api<Lease>,
    pub lease_name: String,
    pub identity: String,
}

/// Whether we may run a tick: the claim's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Claim {
    /// Recorded: run it.
    Won,
    /// Someone already ran this tick or a later one (the record says so).
    AlreadyRun(DateTime<Utc>),
    /// The Lease does not name us: we are not the leader.
    NotHolder,
    /// The Lease kept changing between our read and our write.
    Contended,
}

/// Reads and conditional writes per claim before it counts as contended (the elector writes every retry
/// period, so two in a row are already unlikely).
const CLAIM_ATTEMPTS: usize = 5;

impl LeaseRecord {
    /// The last tick recorded for `schedule`, and the Lease's resourceVersion and holder.
    async fn read(&self, key: &str) -> Result<(Option<DateTime<Utc>>, Option<String>, Option<String>), kube::Error> {
        let lease = self.api.get(&self.lease_name).await?;
        let record = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .and_then(|v| DateTime::parse_from_rfc3339(v).ok())
            .map(|t| t.with_timezone(&Utc));
        let holder = lease.spec.and_then(|s| s.holder_identity);
        Ok((record, lease.metadata.resource_version, holder))
    }

    /// Records `tick` as fired, only while the Lease names us and no later tick is recorded.
    async fn claim(&self, schedule: &Schedule, tick: DateTime<Utc>) -> Result<Claim, kube::Error> {
        let key = schedule.record_key();
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        for _ in 0..CLAIM_ATTEMPTS {
            let (record, resource_version, holder) = self.read(&key).await?;
            let record = schedule.trusted(record);
            if holder.as_deref() != Some(self.identity.as_str()) {
                return Ok(Claim::NotHolder);
            }
            if let Some(record) = record.filter(|r| *r >= tick) {
                return Ok(Claim::AlreadyRun(record));
            }
            let patch = json!({"metadata": {
                "resourceVersion": resource_version,
                "annotations": {key.as_str(): tick.to_rfc3339_opts(SecondsFormat::Secs, true)},
            }});
            match self.api.patch(&self.lease_name, &params, &Patch::Merge(&patch)).await {
                Ok(_) => return Ok(Claim::Won),
                // The elector renewed (or someone took over) since our read: read again.
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(Claim::Contended)
    }
}

/// Runs `job` for every tick of `schedule` while this replica leads, until `shutdown`. Jobs run one at a
/// time; ticks that pass during a long job are handled by the missed-tick policy.
///
/// `record` is the agent's Lease; `None` only when leader election is off (one replica by configuration):
/// then nothing is recorded and a restart does not catch up ticks it missed while down.
pub async fn run<F, Fut>(
    schedule: Schedule,
    record: Option<LeaseRecord>,
    mut leadership: Leadership,
    shutdown: CancellationToken,
    mut job: F,
) where
    F: FnMut(Tick) -> Fut,
    Fut: Future<Output = ()>,
{
    let key = schedule.record_key();
    // Without a record, ticks before we started are not ours to catch up.
    let started = Utc::now();
    let mut handled: Option<DateTime<Utc>> = None;
    let mut leading = leadership.subscribe();
    tracing::info!(schedule = schedule.name(), ?schedule, "schedule started");
    loop {
        // Biased: after shutdown a leader must not start (or record) another tick, even though it still leads
        // until its Lease is released.
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            () = leadership.wait_until_leader() => {}
        }
        let read = match &record {
            Some(record) => record.read(&key).await.map(|(recorded, _, _)| recorded),
            None => Ok(None),
        };
        let recorded = match read {
            Ok(recorded) => schedule.trusted(recorded),
            Err(error) => {
                tracing::warn!(schedule = schedule.name(), %error, "cannot read the schedule record; retrying");
                if pause(&shutdown, Duration::from_secs(2)).await {
                    return;
                }
                continue;
            }
        };
        let after = recorded.unwrap_or(started).max(handled.unwrap_or(DateTime::<Utc>::MIN_UTC));
        match schedule.plan(Utc::now(), after) {
            Plan::Wait { until } => {
                let wait = (until - Utc::now()).to_std().unwrap_or(Duration::ZERO);
                leading.borrow_and_update();
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                    // Lost (or regained) leadership: plan again from the top.
                    _ = leading.changed() => {}
                }
            }
            Plan::Skip { tick, missed } => {
                tracing::warn!(schedule = schedule.name(), %tick, missed, "ticks past their starting deadline skipped");
                handled = Some(tick);
            }
            Plan::Fire { .. } if shutdown.is_cancelled() => return,
            Plan::Fire { tick, missed } => match claim(record.as_ref(), &schedule, tick).await {
                Ok(Claim::Won) => {
                    if missed > 0 {
                        tracing::warn!(schedule = schedule.name(), %tick, missed, "running once for missed ticks");
                    }
                    tracing::info!(schedule = schedule.name(), %tick, "tick fired");
                    handled = Some(tick);
                    job(Tick { at: tick, missed }).await;
                }
                Ok(Claim::AlreadyRun(recorded)) => {
                    tracing::info!(schedule = schedule.name(), %tick, %recorded, "tick already run by another leader");
                    handled = Some(recorded);
                }
                Ok(Claim::NotHolder | Claim::Contended) => {
                    tracing::debug!(schedule = schedule.name(), %tick, "the lease does not name us or kept changing; not firing yet");
                    if pause(&shutdown, Duration::from_millis(500)).await {
                        return;
                    }
                }
                Err(error) => {
                    tracing::warn!(schedule = schedule.name(), %tick, %error, "cannot record the tick; retrying");
                    if pause(&shutdown, Duration::from_secs(2)).await {
                        return;
                    }
                }
            },
        }
    }
}

/// Claims `tick` on the Lease; without one (no leader election) every tick is ours.
async fn claim(record: Option<&LeaseRecord>, schedule: &Schedule, tick: DateTime<Utc>) -> Result<Claim, kube::Error> {
    match record {
        Some(record) => record.claim(schedule, tick).await,
        None => Ok(Claim::Won),
    }
}

/// Sleeps for `d`; returns true if shutdown came first.
async fn pause(shutdown: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => true,
        () = tokio::time::sleep(d) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(cron: &str) -> ScheduleSpec {
        ScheduleSpec {
            cron: cron.into(),
            time_zone: None,
            jitter: None,
            missed: Missed::RunOnce,
            starting_deadline: None,
        }
    }

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn five_field_cron_is_evaluated_in_its_time_zone_across_daylight_saving() {
        let berlin = ScheduleSpec { time_zone: Some("Europe/Berlin".into()), ..spec("0 3 * * *") };
        let s = Schedule::new("snapshot-root", &berlin).unwrap();
        // Winter: 03:00 CET is 02:00 UTC; summer: 03:00 CEST is 01:00 UTC.
        assert_eq!(s.next_tick(at("2026-01-10T00:00:00Z")), Some(at("2026-01-10T02:00:00Z")));
        assert_eq!(s.next_tick(at("2026-07-10T00:00:00Z")), Some(at("2026-07-10T01:00:00Z")));
        // 02:30 does not exist in Berlin on 2026-03-29 (clocks jump from 02:00 to 03:00): no tick that day.
        let gap = Schedule::new("gap", &ScheduleSpec { cron: "30 2 * * *".into(), ..berlin.clone() }).unwrap();
        assert_eq!(gap.next_tick(at("2026-03-28T12:00:00Z")), Some(at("2026-03-30T00:30:00Z")));
    }

    #[test]
    fn jitter_is_bounded_differs_by_name_and_is_the_same_on_every_replica() {
        let jittered = ScheduleSpec { jitter: Some("10m".into()), ..spec("0 * * * *") };
        let a = Schedule::new("snapshot-root", &jittered).unwrap();
        let b = Schedule::new("snapshot-alpha", &jittered).unwrap();
        let tick = at("2026-11-30T14:00:00Z");
        let offset = a.fire_time(tick) - tick;
        assert!(offset >= chrono::Duration::zero() && offset < chrono::Duration::minutes(10), "{offset}");
        assert_eq!(a.fire_time(tick), Schedule::new("snapshot-root", &jittered).unwrap().fire_time(tick));
        assert_ne!(a.fire_time(tick), b.fire_time(tick), "two shards on one schedule spread apart");
    }

    #[test]
    fn nothing_due_waits_for_the_next_fire_time() {
        let s = Schedule::new("s", &spec("0 * * * *")).unwrap();
        assert_eq!(
            s.plan(at("2026-11-30T14:10:00Z"), at("2026-11-30T14:00:00Z")),
            Plan::Wait { until: at("2026-11-30T15:00:00Z") }
        );
    }

    #[test]
    fn missed_ticks_run_once_for_all_or_are_skipped_past_the_deadline() {
        let run_once = Schedule::new("s", &spec("0 * * * *")).unwrap();
        let skip = Schedule::new("s", &ScheduleSpec { missed: Missed::Skip, ..spec("0 * * * *") }).unwrap();
        let after = at("2026-11-30T10:00:00Z");
        // Down from 10:00 to 14:20: 11, 12, 13 and 14 o'clock passed.
        let now = at("2026-11-30T14:20:00Z");
        assert_eq!(run_once.plan(now, after), Plan::Fire { tick: at("2026-11-30T14:00:00Z"), missed: 3 });
        assert_eq!(skip.plan(now, after), Plan::Skip { tick: at("2026-11-30T14:00:00Z"), missed: 3 });
        // Within the starting deadline (5m), even Skip runs the latest tick.
        let now = at("2026-11-30T14:03:00Z");
        assert_eq!(skip.plan(now, after), Plan::Fire { tick: at("2026-11-30T14:00:00Z"), missed: 3 });
        // A tick already handled is not due again.
        assert_eq!(run_once.plan(now, at("2026-11-30T14:00:00Z")), Plan::Wait { until: at("2026-11-30T15:00:00Z") });
    }

    #[test]
    fn a_record_later_than_now_plus_jitter_plus_slack_is_implausible_and_one_within_is_trusted() {
        let jittered = Schedule::new("s", &ScheduleSpec { jitter: Some("10m".into()), ..spec("0 * * * *") }).unwrap();
        let now = at("2026-11-30T14:00:00Z");
        let slack = chrono::Duration::from_std(CLOCK_SLACK).unwrap();
        let edge = now + chrono::Duration::minutes(10) + slack;
        assert!(jittered.record_is_plausible(now, now));
        assert!(jittered.record_is_plausible(edge, now), "up to the jitter and the slack ahead");
        assert!(!jittered.record_is_plausible(edge + chrono::Duration::seconds(1), now));
        let plain = Schedule::new("s", &spec("0 * * * *")).unwrap();
        assert!(!plain.record_is_plausible(now + slack + chrono::Duration::seconds(1), now), "no jitter, no room");
        assert!(!plain.record_is_plausible(at("2027-11-30T14:00:00Z"), now), "a year ahead");
    }

    #[test]
    fn invalid_specs_name_the_field() {
        assert!(matches!(Schedule::new("s", &spec("61 * * * *")), Err(ScheduleError::Cron(_))));
        let zone = ScheduleSpec { time_zone: Some("Mars/Olympus".into()), ..spec("@daily") };
        assert_eq!(Schedule::new("s", &zone).unwrap_err(), ScheduleError::TimeZone("Mars/Olympus".into()));
        let jitter = ScheduleSpec { jitter: Some("5 minutes".into()), ..spec("@daily") };
        assert!(matches!(Schedule::new("s", &jitter), Err(ScheduleError::Duration("jitter", _))));
        assert!(matches!(Schedule::new("-bad", &spec("@daily")), Err(ScheduleError::Name(_))));
        assert!(Schedule::new("snapshot-root", &spec("@daily")).is_ok());
    }
}
