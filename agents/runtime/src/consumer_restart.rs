//! Restarts of read-once consumers: Deployments, StatefulSets and DaemonSets that load a Secret or ConfigMap
//! once at start, so a new content reaches them only through a new pod. Shared by kubeconfig-rotator (a
//! published kubeconfig) and ca-syncer (a CA bundle), so both restart the same way:
//!
//! - **The hash annotation.** A restart is one pod-template annotation, [`Keys::restarted_for`] = the content
//!   hash the consumer was restarted for, as `kubectl rollout restart` does (every kind rolls its pods when its
//!   template changes; the same value again is a no-op). The object's own metadata (no roll) records
//!   [`Keys::held_until`] = until when that content is good, which is what a restart window's deadline is
//!   computed from.
//! - **Decided from state, every pass.** Whether a restart is due is [`decide`]d from the hash the consumer's
//!   template carries against the hash its source holds now, never from whether this pass wrote: a consumer
//!   created later, or whose restart failed, is restarted on the next pass.
//! - **Retried with backoff.** A failed or impossible restart is an `Err` ([`RestartError`]): the agent returns
//!   it from its reconcile, and the runtime's driver retries with its backoff; [`ConsumerMetrics`] keeps
//!   `consumer_restart_pending` at 1 meanwhile (the agent's alert fires on it).
//! - **Restart windows with a deadline.** With a [`RestartWindow`] (cron-style, like cert-manager's renewal
//!   windows) a restart waits for the window to open, but never past the deadline: the `held_until` the
//!   consumer's last restart recorded, minus the window's margin ([`plan`]). What `held_until` means is the
//!   agent's: for kubeconfig-rotator the notAfter of the credential the consumer was restarted for; for
//!   ca-syncer the time the bundle the consumer holds stops being good (when the CA it retains expires). A
//!   consumer without a recorded `held_until` (never restarted by the agent) is restarted at once: waiting
//!   cannot be shown to be safe. [`Wanted::deadline`] can bring the deadline earlier still.
//! - **Missing consumers are reported**, with an Event on the object the caller names (its target) and
//!   [`RestartError::Missing`], and stay pending until they exist.
//!
//! Pure logic ([`decide`], [`plan`], [`restart_patch`], the annotation readers) is apart from the one I/O
//! function, [`Restarter::converge`] (a GET and at most one server-side apply of two annotations, with field
//! manager `kcp-keeper` and never forced, so a field someone else owns is a conflict, not an overwrite).
//!
//! How an agent uses it (ca-syncer, for a bundle `b` whose targets name consumers):
//!
//! ```ignore
//! // Once, at registration: the agent's registry already carries its prefix (`ca_syncer_`), and the owner label
//! // names what the consumer belongs to (`bundle`), so the series are ca_syncer_consumer_restart_pending{bundle,..}.
//! let consumers = ConsumerMetrics::register(registry, "bundle");
//! // Per bundle: its own annotation keys (`ca-syncer.kcp-keeper.io/restarted-for-b`, `...-not-after-b`).
//! let keys = Keys::for_owner("ca-syncer.kcp-keeper.io/", "b");
//! let restarter = Restarter { client: &client, events: &recorder, keys: &keys, owner: "bundle b" };
//! // Per consumer, on every pass, whatever the pass wrote:
//! let wanted = Wanted { hash: &content_hash, held_until: retained_ca_not_after, deadline: None };
//! let result = restarter.converge(namespace, &consumer, &wanted, window.as_ref(), &target_ref, now).await;
//! consumers.record("b", namespace, &consumer, &result);
//! // Err(_): return an error from the reconcile (retried with backoff); Ok(Done::Deferred { until }): requeue
//! // no later than `until`.
//! ```
//!
//! Configuration: [`RawRestartWindow`] is the file's shape (its doc comments are the chart schema's text) and
//! [`RawRestartWindow::validate`] turns it into a [`RestartWindow`], every mistake with its field path.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ObjectReference, PodTemplateSpec};
use kube::ResourceExt;
use kube::api::Api;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use serde_json::json;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::apply::{self, ApplyError, Ownership};
use crate::config::FieldError;
use crate::duration::ConfigDuration;
use crate::events::{EventType, Recorder, reference};
use crate::metrics::GaugeF64;
use crate::schedule::{Schedule, ScheduleSpec};
use crate::watch::Namespaced;

// ---- what a consumer is ---------------------------------------------------------------------------------------

/// The workload kinds a consumer can be: each rolls its pods when its pod template changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, strum::IntoStaticStr)]
pub enum Kind {
    Deployment,
    StatefulSet,
    DaemonSet,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Deployment, Kind::StatefulSet, Kind::DaemonSet];

    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The resource name, as RBAC grants it (group `apps`).
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Deployment => "deployments",
            Kind::StatefulSet => "statefulsets",
            Kind::DaemonSet => "daemonsets",
        }
    }
}

/// A read-once consumer, by kind and name (its namespace is the caller's: where the content it reads lives).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Consumer {
    pub kind: Kind,
    pub name: String,
}

/// A workload kind whose pod template rolls its pods.
pub trait Workload: Namespaced + Serialize {
    fn template(&self) -> &PodTemplateSpec;
}

macro_rules! workloads {
    ($($kind:ty),*) => {$(
        impl Workload for $kind {
            fn template(&self) -> &PodTemplateSpec {
                &self.spec.template
            }
        }
    )*};
}

workloads!(Deployment, StatefulSet, DaemonSet);

// ---- the annotations ------------------------------------------------------------------------------------------

/// The two annotation keys one owner (a kubeconfig, a bundle) writes on its consumers: one per owner, so two
/// owners restarting the same workload never overwrite each other's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// On the pod template: the content hash the consumer was last restarted for (a new value rolls it).
    pub restarted_for: String,
    /// On the object's metadata: until when that content is good (RFC 3339), the restart window's deadline.
    pub held_until: String,
}

impl Keys {
    /// `<prefix>restarted-for-<owner>` and `<prefix>restarted-not-after-<owner>`; `prefix` ends with `/`
    /// (`kcp-keeper.io/`). Keep `owner` short: a key's name part is at most 63 characters.
    pub fn for_owner(prefix: &str, owner: &str) -> Self {
        Self {
            restarted_for: format!("{prefix}restarted-for-{owner}"),
            held_until: format!("{prefix}restarted-not-after-{owner}"),
        }
    }
}

/// The content hash `live` was last restarted for.
pub fn restarted_for<K: Workload>(live: &K, keys: &Keys) -> Option<String> {
    live.template().metadata.as_ref()?.annotations.as_ref()?.get(&keys.restarted_for).cloned()
}

/// Until when the content `live` was last restarted for is good. Anyone who can edit the workload can write it:
/// anything but an RFC 3339 time is unknown (and unknown means "restart at once").
pub fn held_until<K: Workload>(live: &K, keys: &Keys) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(live.annotations().get(&keys.held_until)?, &Rfc3339).ok()
}

/// The fields a restart for content `hash` (good until `held_until`) applies to consumer `namespace/name`.
pub fn restart_patch(
    kind: Kind,
    namespace: &str,
    name: &str,
    keys: &Keys,
    hash: &str,
    held_until: OffsetDateTime,
) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": kind.as_str(),
        "metadata": {
            "name": name, "namespace": namespace,
            "annotations": {keys.held_until.clone(): rfc3339(held_until)},
        },
        "spec": {"template": {"metadata": {"annotations": {keys.restarted_for.clone(): hash}}}},
    })
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.unix_timestamp().to_string())
}

// ---- restart windows ------------------------------------------------------------------------------------------

/// When restarts may happen: from each tick of `schedule` for `duration`, but never later than the deadline of
/// what a consumer holds minus `margin` ([`plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartWindow {
    pub schedule: Schedule,
    pub duration: Duration,
    pub margin: Duration,
}

/// The default `restartWindow.margin`.
pub const DEFAULT_MARGIN: Duration = Duration::from_secs(24 * 3600);

/// A cron-style restart window, like cert-manager's renewal windows.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawRestartWindow {
    /// When the window opens: 5-field cron (0 2 * * 1-5), 6 or 7 fields with seconds and years, or @daily.
    pub cron: String,
    /// IANA zone the cron is read in (Europe/Berlin); UTC when absent.
    #[serde(default)]
    pub time_zone: Option<String>,
    /// How long the window stays open after each tick (a duration such as 2h; more than 0).
    #[schemars(with = "String")]
    pub duration: ConfigDuration,
    /// A consumer is restarted outside the window once what it holds (what it was last restarted for) has
    /// less than this left before it stops being good (default 24h).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub margin: Option<ConfigDuration>,
}

impl RawRestartWindow {
    /// The validated window; each mistake is recorded under `path` (`...restartWindow`) and gives `None`.
    pub fn validate(self, path: &str, errors: &mut Vec<FieldError>) -> Option<RestartWindow> {
        let spec = ScheduleSpec {
            cron: self.cron,
            time_zone: self.time_zone,
            jitter: None,
            missed: Default::default(),
            starting_deadline: None,
        };
        let mut ok = true;
        if self.duration.0.is_zero() {
            errors.push(FieldError::new(format!("{path}.duration"), "must be more than 0"));
            ok = false;
        }
        match Schedule::new("restart-window", &spec) {
            Ok(schedule) => ok.then(|| RestartWindow {
                schedule,
                duration: self.duration.0,
                margin: self.margin.map_or(DEFAULT_MARGIN, |m| m.0),
            }),
            Err(e) => {
                errors.push(FieldError::new(path, e.to_string()));
                None
            }
        }
    }
}

/// When a due restart may happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Restart it now.
    Now,
    /// Not yet: at `until` at the latest (the window's next opening, or the deadline if sooner).
    Wait { until: OffsetDateTime },
}

/// The plan at `now` for a consumer whose content is good until `held_until` (`None`: unknown, as for a consumer
/// never restarted by the agent, so waiting cannot be shown to be safe): at once without a window; inside the
/// window otherwise, but never later than `held_until` minus the window's margin.
pub fn plan(window: Option<&RestartWindow>, now: OffsetDateTime, held_until: Option<OffsetDateTime>) -> Plan {
    let Some(window) = window else { return Plan::Now };
    let Some(held_until) = held_until else { return Plan::Now };
    let margin = time::Duration::try_from(window.margin).unwrap_or(time::Duration::MAX);
    let deadline = held_until.checked_sub(margin).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    if now >= deadline {
        return Plan::Now;
    }
    let duration = time::Duration::try_from(window.duration).unwrap_or(time::Duration::MAX);
    // The first opening after (now - duration): at or before now, the window is open; later, it is the next one.
    let from = now.checked_sub(duration).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let Some(opening) = window.schedule.next_tick(to_chrono(from)).and_then(from_chrono) else {
        // A schedule that never fires again: the deadline decides.
        return Plan::Wait { until: deadline };
    };
    if opening <= now { Plan::Now } else { Plan::Wait { until: opening.min(deadline) } }
}

fn to_chrono(t: OffsetDateTime) -> DateTime<Utc> {
    DateTime::from_timestamp(t.unix_timestamp(), t.nanosecond()).unwrap_or_default()
}

fn from_chrono(t: DateTime<Utc>) -> Option<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp(t.timestamp()).ok()
}

// ---- the decision ---------------------------------------------------------------------------------------------

/// What the consumer's content must be, this pass.
#[derive(Debug, Clone, Copy)]
pub struct Wanted<'a> {
    /// The hash of the content the consumer's source holds now.
    pub hash: &'a str,
    /// Until when that content is good: recorded on the consumer at its restart, it is the next restart's
    /// deadline (minus the window's margin). kubeconfig-rotator: the credential's notAfter; ca-syncer: when the
    /// CA the bundle retains expires.
    pub held_until: OffsetDateTime,
    /// An earlier deadline the agent knows for the content the consumer holds now (`None`: the one recorded on
    /// it): the restart never waits past it minus the margin.
    pub deadline: Option<OffsetDateTime>,
}

/// What to do with one consumer, from its state alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Already restarted for the wanted content.
    UpToDate,
    /// Restart it now.
    Restart,
    /// Due, but its window is closed: at `until` at the latest.
    Wait { until: OffsetDateTime },
}

/// Decides from the consumer's annotations (`restarted_for`, `held_until`) and the wanted content, at `now`.
pub fn decide(
    restarted_for: Option<&str>,
    held_until: Option<OffsetDateTime>,
    wanted: &Wanted<'_>,
    window: Option<&RestartWindow>,
    now: OffsetDateTime,
) -> Decision {
    if restarted_for == Some(wanted.hash) {
        return Decision::UpToDate;
    }
    let held_until = match (held_until, wanted.deadline) {
        (Some(h), Some(d)) => Some(h.min(d)),
        (h, d) => h.or(d),
    };
    match plan(window, now, held_until) {
        Plan::Now => Decision::Restart,
        Plan::Wait { until } => Decision::Wait { until },
    }
}

// ---- the I/O --------------------------------------------------------------------------------------------------

/// A consumer's state after a pass that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    /// It was already restarted for the wanted content.
    UpToDate,
    /// Restarted now.
    Restarted,
    /// Waiting for its window, at `until` at the latest: look again then.
    Deferred { until: OffsetDateTime },
}

/// Why a consumer could not be brought to the wanted content: retried (the caller's reconcile fails).
#[derive(Debug, thiserror::Error)]
pub enum RestartError {
    /// It does not exist (`Kind namespace/name`): restarted once it does.
    #[error("consumer {0} not found; its restart is pending")]
    Missing(String),
    /// Reading or annotating it failed.
    #[error("restarting a consumer: {0}")]
    Failed(ApplyError),
}

/// Restarts one owner's consumers: the client and Event recorder to use, the owner's annotation keys, and how
/// Events and logs name the owner (`kubeconfig hub-admin`, `bundle kcp-ca`).
pub struct Restarter<'a> {
    pub client: &'a kube::Client,
    pub events: &'a Recorder,
    pub keys: &'a Keys,
    pub owner: &'a str,
}

impl Restarter<'_> {
    /// Brings consumer `namespace`/`consumer` to the wanted content: reads it, [`decide`]s, and restarts it when
    /// due and its window allows. Events: `Restarted`, `RestartDeferred`, `RestartFailed` on the consumer;
    /// `ConsumerMissing` on `missing_regarding` (the object the consumer reads, which does exist).
    pub async fn converge(
        &self,
        namespace: &str,
        consumer: &Consumer,
        wanted: &Wanted<'_>,
        window: Option<&RestartWindow>,
        missing_regarding: &ObjectReference,
        now: OffsetDateTime,
    ) -> Result<Done, RestartError> {
        match consumer.kind {
            Kind::Deployment => {
                self.converge_kind::<Deployment>(namespace, consumer, wanted, window, missing_regarding, now).await
            }
            Kind::StatefulSet => {
                self.converge_kind::<StatefulSet>(namespace, consumer, wanted, window, missing_regarding, now).await
            }
            Kind::DaemonSet => {
                self.converge_kind::<DaemonSet>(namespace, consumer, wanted, window, missing_regarding, now).await
            }
        }
    }

    async fn converge_kind<K: Workload>(
        &self,
        namespace: &str,
        consumer: &Consumer,
        wanted: &Wanted<'_>,
        window: Option<&RestartWindow>,
        missing_regarding: &ObjectReference,
        now: OffsetDateTime,
    ) -> Result<Done, RestartError> {
        let (kind, name, owner, hash) = (consumer.kind.as_str(), consumer.name.as_str(), self.owner, wanted.hash);
        let api = Api::<K>::namespaced(self.client.clone(), namespace);
        let regarding = reference("apps/v1", kind, namespace, name, None);
        let live = match api.get_opt(name).await {
            Ok(live) => live,
            Err(source) => {
                let e = ApplyError::Kube { kind: kind.into(), object: format!("{namespace}/{name}"), source };
                return Err(self.failed(&regarding, e).await);
            }
        };
        let Some(live) = live else {
            let note = format!(
                "{owner}: consumer {kind} {namespace}/{name} not found; it is restarted for content {hash} once it exists"
            );
            tracing::warn!(owner, namespace, kind, consumer = name, "consumer missing; restart pending");
            self.events.publish(missing_regarding, EventType::Warning, "ConsumerMissing", "Restart", &note).await;
            return Err(RestartError::Missing(format!("{kind} {namespace}/{name}")));
        };
        let held = held_until(&live, self.keys);
        match decide(restarted_for(&live, self.keys).as_deref(), held, wanted, window, now) {
            Decision::UpToDate => Ok(Done::UpToDate),
            Decision::Wait { until } => {
                let note = format!(
                    "{owner}: restart for content {hash} waits for the restart window, until {} at the latest",
                    rfc3339(until)
                );
                tracing::info!(owner, namespace, kind, consumer = name, until = %rfc3339(until), "restart deferred to its window");
                self.events.publish(&regarding, EventType::Normal, "RestartDeferred", "Restart", &note).await;
                Ok(Done::Deferred { until })
            }
            Decision::Restart => {
                let desired = restart_patch(consumer.kind, namespace, name, self.keys, hash, wanted.held_until);
                if let Err(e) = apply::apply_over(&api, desired, Ownership::Fields, Some(&live)).await {
                    return Err(self.failed(&regarding, e).await);
                }
                let note = format!("{owner}: restarted to pick up content {hash}");
                tracing::info!(owner, namespace, kind, consumer = name, "restarted a consumer");
                self.events.publish(&regarding, EventType::Normal, "Restarted", "Restart", &note).await;
                Ok(Done::Restarted)
            }
        }
    }

    /// A restart that could not be made: logged, an Event on the consumer; retried with the reconcile's backoff.
    async fn failed(&self, regarding: &ObjectReference, e: ApplyError) -> RestartError {
        tracing::warn!(owner = self.owner, error = %e, "consumer not restarted; restart pending");
        let note = format!("{}: restart pending, retried: {e}", self.owner);
        self.events.publish(regarding, EventType::Warning, "RestartFailed", "Restart", &note).await;
        RestartError::Failed(e)
    }
}

// ---- metrics --------------------------------------------------------------------------------------------------

/// The labels of a consumer's series: `{<owner label>, namespace, kind, name}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ConsumerLabels {
    /// The label naming the owner (`kubeconfig`, `bundle`), fixed per agent at registration.
    pub owner_label: &'static str,
    pub owner: String,
    pub namespace: String,
    /// Deployment, StatefulSet or DaemonSet.
    pub kind: &'static str,
    pub name: String,
}

impl EncodeLabelSet for ConsumerLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [
            (self.owner_label, self.owner.as_str()),
            ("namespace", self.namespace.as_str()),
            ("kind", self.kind),
            ("name", self.name.as_str()),
        ]
        .encode(encoder)
    }
}

crate::metrics! {
    /// The series of [`ConsumerMetrics`], under the prefix of the registry they are registered in (the agent's).
    pub struct ConsumerSeries {
        pub pending: Family<ConsumerLabels, Gauge> => "consumer_restart_pending",
            "1 while a consumer has not been restarted for the content its source holds (missing, or the restart failed)";
        pub deferred_until: Family<ConsumerLabels, GaugeF64> => "consumer_restart_deferred_until_timestamp" [Seconds],
            "While a consumer's restart waits for its restart window: when it happens at the latest (0 otherwise)";
    }
}

/// `<prefix>consumer_restart_pending` and `<prefix>consumer_restart_deferred_until_timestamp_seconds` (the
/// [`ConsumerSeries`]), with the agent's owner label.
#[derive(Clone, Debug)]
pub struct ConsumerMetrics {
    owner_label: &'static str,
    pub series: ConsumerSeries,
}

impl ConsumerMetrics {
    pub fn register(registry: &mut Registry, owner_label: &'static str) -> Self {
        Self { owner_label, series: ConsumerSeries::register(registry) }
    }

    pub fn labels(&self, owner: &str, namespace: &str, consumer: &Consumer) -> ConsumerLabels {
        ConsumerLabels {
            owner_label: self.owner_label,
            owner: owner.into(),
            namespace: namespace.into(),
            kind: consumer.kind.as_str(),
            name: consumer.name.clone(),
        }
    }

    /// Creates a consumer's series at 0, so it shows before its first restart.
    pub fn touch(&self, owner: &str, namespace: &str, consumer: &Consumer) {
        let labels = self.labels(owner, namespace, consumer);
        let _ = self.series.pending.get_or_create(&labels);
        let _ = self.series.deferred_until.get_or_create(&labels);
    }

    /// Records what [`Restarter::converge`] returned: pending on an error, deferred until when.
    pub fn record(&self, owner: &str, namespace: &str, consumer: &Consumer, result: &Result<Done, RestartError>) {
        let labels = self.labels(owner, namespace, consumer);
        self.series.pending.get_or_create(&labels).set(i64::from(result.is_err()));
        let until = match result {
            Ok(Done::Deferred { until }) => until.unix_timestamp() as f64,
            _ => 0.0,
        };
        self.series.deferred_until.get_or_create(&labels).set(until);
    }

    /// Drops the series of a consumer no longer configured (or of a target namespace no longer selected).
    pub fn forget(&self, owner: &str, namespace: &str, consumer: &Consumer) {
        let labels = self.labels(owner, namespace, consumer);
        self.series.pending.remove(&labels);
        self.series.deferred_until.remove(&labels);
    }
}

#[cfg(test)]
mod tests {
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
            duration: Duration::from_secs(duration_h * 3600),
            margin: Duration::from_secs(margin_h * 3600),
        }
    }

    const FAR: Option<OffsetDateTime> = Some(datetime!(2027-06-01 00:00 UTC));

    fn keys() -> Keys {
        Keys::for_owner("kcp-keeper.io/", "hub")
    }

    #[test]
    fn without_a_window_a_restart_is_at_once() {
        assert_eq!(plan(None, datetime!(2026-12-01 12:00 UTC), FAR), Plan::Now);
    }

    #[test]
    fn inside_the_window_a_restart_is_at_once() {
        let w = window("0 2 * * *", 2, 24);
        assert_eq!(plan(Some(&w), datetime!(2026-12-01 02:00 UTC), FAR), Plan::Now);
        assert_eq!(plan(Some(&w), datetime!(2026-12-01 03:59 UTC), FAR), Plan::Now);
    }

    #[test]
    fn outside_the_window_a_restart_waits_for_the_next_opening() {
        let w = window("0 2 * * *", 2, 24);
        let until = datetime!(2026-12-02 02:00 UTC);
        assert_eq!(plan(Some(&w), datetime!(2026-12-01 04:00 UTC), FAR), Plan::Wait { until });
        assert_eq!(plan(Some(&w), datetime!(2026-12-01 12:00 UTC), FAR), Plan::Wait { until });
    }

    #[test]
    fn a_restart_never_waits_past_the_held_deadline_minus_the_margin() {
        // Opens on 1 January only; what the consumer holds is good until 10 December, margin a day.
        let w = window("0 0 1 1 *", 1, 24);
        let held = Some(datetime!(2026-12-10 00:00 UTC));
        let deadline = datetime!(2026-12-09 00:00 UTC);
        assert_eq!(plan(Some(&w), datetime!(2026-12-01 12:00 UTC), held), Plan::Wait { until: deadline });
        assert_eq!(plan(Some(&w), deadline, held), Plan::Now);
        assert_eq!(plan(Some(&w), datetime!(2026-12-09 18:00 UTC), held), Plan::Now);
        // Already past its end: at once.
        assert_eq!(plan(Some(&w), datetime!(2026-12-11 00:00 UTC), held), Plan::Now);
    }

    #[test]
    fn a_consumer_whose_deadline_is_unknown_is_restarted_at_once() {
        let w = window("0 0 1 1 *", 1, 24);
        assert_eq!(plan(Some(&w), datetime!(2026-12-01 12:00 UTC), None), Plan::Now);
    }

    #[test]
    fn the_decision_comes_from_the_hashes_and_an_earlier_deadline_from_the_agent_wins() {
        let w = window("0 0 1 1 *", 1, 24);
        let now = datetime!(2026-12-01 12:00 UTC);
        let wanted = Wanted { hash: "new", held_until: datetime!(2027-03-01 00:00 UTC), deadline: None };
        assert_eq!(decide(Some("new"), None, &wanted, None, now), Decision::UpToDate);
        assert_eq!(decide(Some("old"), FAR, &wanted, None, now), Decision::Restart);
        assert_eq!(decide(None, FAR, &wanted, None, now), Decision::Restart, "never restarted: due");
        assert_eq!(
            decide(Some("old"), FAR, &wanted, Some(&w), now),
            Decision::Wait { until: datetime!(2027-01-01 00:00 UTC) }
        );
        // ca-syncer's case: the retained CA leaves the bundle on 5 December, sooner than the recorded deadline.
        let sooner = Wanted { deadline: Some(datetime!(2026-12-05 00:00 UTC)), ..wanted };
        assert_eq!(
            decide(Some("old"), FAR, &sooner, Some(&w), now),
            Decision::Wait { until: datetime!(2026-12-04 00:00 UTC) }
        );
        assert_eq!(decide(Some("old"), None, &sooner, Some(&w), datetime!(2026-12-04 00:00 UTC)), Decision::Restart);
    }

    #[test]
    fn a_garbled_held_until_is_unknown() {
        let mut d = Deployment::default();
        d.metadata.annotations = Some([(keys().held_until, "next tuesday".to_string())].into());
        assert_eq!(held_until(&d, &keys()), None);
        d.metadata.annotations = Some([(keys().held_until, "2027-01-01T00:00:00Z".to_string())].into());
        assert_eq!(held_until(&d, &keys()), Some(datetime!(2027-01-01 00:00 UTC)));
    }

    #[test]
    fn the_restart_patch_names_the_kind_and_both_annotations_of_the_owner() {
        let at = datetime!(2027-01-01 00:00 UTC);
        let p = restart_patch(Kind::StatefulSet, "ns", "db", &keys(), "abc", at);
        assert_eq!(p["kind"], "StatefulSet");
        assert_eq!(p["spec"]["template"]["metadata"]["annotations"]["kcp-keeper.io/restarted-for-hub"], "abc");
        assert_eq!(p["metadata"]["annotations"]["kcp-keeper.io/restarted-not-after-hub"], "2027-01-01T00:00:00Z");
        let other = Keys::for_owner("ca-syncer.kcp-keeper.io/", "bundle");
        let p = restart_patch(Kind::DaemonSet, "ns", "agent", &other, "abc", at);
        assert!(p["metadata"]["annotations"]["ca-syncer.kcp-keeper.io/restarted-not-after-bundle"].is_string());
    }

    #[test]
    fn a_window_with_mistakes_names_each_with_its_path() {
        let raw = |cron: &str, duration: u64| RawRestartWindow {
            cron: cron.into(),
            time_zone: None,
            duration: ConfigDuration(Duration::from_secs(duration)),
            margin: None,
        };
        let mut errors = Vec::new();
        let ok = raw("0 2 * * *", 3600).validate("t.restartWindow", &mut errors).expect("valid");
        assert_eq!((ok.margin, errors.len()), (DEFAULT_MARGIN, 0));
        assert!(raw("not cron", 0).validate("t.restartWindow", &mut errors).is_none());
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(text.iter().any(|e| e.starts_with("t.restartWindow.duration: must be more than 0")), "{text:?}");
        assert!(text.iter().any(|e| e.starts_with("t.restartWindow: cron:")), "{text:?}");
    }

    #[test]
    fn the_series_carry_the_agents_owner_label() {
        let mut registry = Registry::with_prefix("ca_syncer");
        let m = ConsumerMetrics::register(&mut registry, "bundle");
        let c = Consumer { kind: Kind::StatefulSet, name: "hub".into() };
        m.record("kcp-ca", "ns", &c, &Err(RestartError::Missing("StatefulSet ns/hub".into())));
        let text = crate::metrics::encode(&registry);
        assert!(
            text.contains("ca_syncer_consumer_restart_pending{bundle=\"kcp-ca\",namespace=\"ns\",kind=\"StatefulSet\",name=\"hub\"} 1"),
            "{text}"
        );
        m.forget("kcp-ca", "ns", &c);
        assert!(!crate::metrics::encode(&registry).contains("bundle=\"kcp-ca\""));
    }
}
