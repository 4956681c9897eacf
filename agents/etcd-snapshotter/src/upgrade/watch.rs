//! The leader's watch of one shard's kcp-operator object (`beforeUpgrade`): every reading of the object is
//! compared with the state recorded in the bucket ([`super::step`]); a changed image takes a full snapshot
//! (in the snapshots' turn, under the shard's lock, like any other) labelled with the image before the change
//! and the one rolled to, then a drill of it, then records the new image. Only the leader reads and writes the
//! state; a replica that stops leading stops its session.

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kcp_keeper_runtime::events::{EventType, Recorder, reference};
use kcp_keeper_runtime::lease::Leadership;
use kcp_keeper_runtime::metrics::unix_now;
use kcp_keeper_runtime::shutdown::Grace;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::metrics::UpgradeLabels;
use super::roll;
use super::{KcpVersion, STATE, State, Step, Watched, image_of, records_change, step};
use crate::catalog;
use crate::config::{Config, Shard};
use crate::drill::run::{self as drill_run, Outcome};
use crate::error::SnapshotError;
use crate::manifest::{self, Manifest};
use crate::metrics::Metrics;
use crate::snapshot;
use crate::storage::Store;

/// Attempts at the snapshot of one change; after the last failure the change is recorded as seen (and counted
/// and reported as failed), so a broken store does not snapshot in a loop.
const ATTEMPTS: u32 = 3;
/// The pause after a failed attempt, times the attempt number.
const RETRY_PAUSE: Duration = Duration::from_secs(20);
/// How long the snapshot waits while another run holds the shard's lock (as a scheduled one does).
const LOCK_WAIT: Duration = Duration::from_secs(30 * 60);

/// Everything one shard's watch works with.
pub struct Watch {
    pub config: Arc<Config>,
    pub shard: Shard,
    pub watched: Watched,
    pub metrics: Metrics,
    pub events: Arc<Recorder>,
    pub client: kube::Client,
    /// The snapshots' turn (one snapshot at a time in the process) and the drills' (the same one unless
    /// `drills.alongsideSnapshots`).
    pub snapshots_turn: Arc<Mutex<()>>,
    pub drills_turn: Arc<Mutex<()>>,
    /// The process's shutdown: a snapshot in flight is finished or aborted, a drill dropped and cleaned up.
    pub shutdown: CancellationToken,
}

impl Watch {
    /// Sessions while this replica leads, until `token` is cancelled.
    pub async fn while_leading(self, mut leadership: Leadership, token: CancellationToken) {
        let shard = self.shard.name.clone();
        loop {
            tokio::select! {
                () = token.cancelled() => return,
                () = leadership.wait_until_leader() => {}
            }
            // Ends when this replica stops leading or the schedules stop.
            let session = leadership.session(&token);
            let result = self.session(&session).await;
            session.cancel();
            if let Err(error) = result {
                tracing::warn!(shard, object = self.watched.describe(), error = %format!("{error:#}"),
                    "the watch for kcp upgrades failed; starting again");
            }
            tokio::select! {
                () = token.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
        }
    }

    fn api(&self) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("operator.kcp.io", "v1alpha1", self.watched.kind.as_str());
        let resource = ApiResource::from_gvk_with_plural(&gvk, self.watched.kind.plural());
        Api::namespaced_with(self.client.clone(), &self.watched.namespace, &resource)
    }

    /// One session: the recorded state read once, then every reading of the object until `session` ends.
    async fn session(&self, session: &CancellationToken) -> anyhow::Result<()> {
        let store = Store::new(&self.config.storage)?.counting_retries(self.metrics.retries.clone());
        let mut recorded = self.read_state(&store).await?;
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.watched.name));
        let stream = watcher::watcher(self.api(), config).default_backoff();
        let mut stream = std::pin::pin!(stream);
        // False until the session's first complete listing: a change found by a listing was made while this
        // replica was not watching.
        let mut live = false;
        loop {
            let event = tokio::select! {
                () = session.cancelled() => return Ok(()),
                event = stream.try_next() => event,
            };
            match event {
                Ok(Some(Event::Init)) => live = false,
                Ok(Some(Event::InitDone)) => live = true,
                Ok(Some(Event::InitApply(object) | Event::Apply(object))) => {
                    self.observe(&store, &mut recorded, &object, live).await;
                }
                // A deleted object rolls nothing; the state stays for when it is back.
                Ok(Some(Event::Delete(_))) => {}
                Ok(None) => anyhow::bail!("the watch ended"),
                Err(error) => {
                    self.metrics.upgrade.watch_errors.get_or_create(&self.metrics.shard(&self.shard.name)).inc();
                    tracing::warn!(shard = self.shard.name, object = self.watched.describe(), %error,
                        "watching the operator's object failed; retrying");
                }
            }
        }
    }

    fn state_key(&self, store: &Store) -> String {
        format!("{}{STATE}", manifest::shard_dir(&store.prefix, &self.shard.name))
    }

    /// The state in the bucket; an unreadable one counts as none (a new baseline), and says so.
    async fn read_state(&self, store: &Store) -> anyhow::Result<Option<State>> {
        let Some(stored) = store.get_versioned(&self.state_key(store)).await? else { return Ok(None) };
        match State::from_json(&stored.body) {
            Ok(state) => Ok(Some(state)),
            Err(reason) => {
                tracing::error!(
                    shard = self.shard.name,
                    key = self.state_key(store),
                    reason,
                    "the recorded kcp image is unreadable: taking the object's image as a new baseline"
                );
                Ok(None)
            }
        }
    }

    /// Records `state` in the bucket and in memory (also when the write fails: the snapshot is what counts,
    /// and a restart finds a published one by its manifest, [`records_change`]).
    async fn record(&self, store: &Store, recorded: &mut Option<State>, state: State) {
        if let Err(error) = store.put(&self.state_key(store), state.to_json()).await {
            tracing::warn!(shard = self.shard.name, %error, "recording the kcp image in the bucket failed");
        }
        *recorded = Some(state);
    }

    fn regarding(&self, object: &DynamicObject) -> ObjectReference {
        let w = &self.watched;
        reference("operator.kcp.io/v1alpha1", w.kind.as_str(), &w.namespace, &w.name, object.metadata.uid.clone())
    }

    /// An Event of the `PreUpgradeSnapshot` action on the operator's object.
    async fn tell(&self, regarding: &ObjectReference, kind: EventType, reason: &str, note: &str) {
        self.events.publish(regarding, kind, reason, "PreUpgradeSnapshot", note).await;
    }

    async fn observe(&self, store: &Store, recorded: &mut Option<State>, object: &DynamicObject, live: bool) {
        let shard = &self.shard.name;
        let label = self.metrics.shard(shard);
        let described = self.watched.describe();
        let spec = object.data.get("spec").cloned().unwrap_or_default();
        let now = match image_of(&described, &spec) {
            Ok(image) => image,
            Err(error) => {
                self.metrics.upgrade.malformed.get_or_create(&label).inc();
                tracing::error!(shard, %error, "the operator's object names no valid kcp image");
                self.tell(&self.regarding(object), EventType::Warning, "KcpImageInvalid", &error.to_string()).await;
                return;
            }
        };
        let (from, late) = match step(recorded.as_ref(), &described, &now, live) {
            Step::Unchanged => return,
            Step::Baseline => {
                tracing::info!(shard, object = described, image = now, "recording the kcp image the shard runs");
                self.record(store, recorded, State::new(&described, &now, None)).await;
                return;
            }
            Step::Snapshot { from, late } => (from, late),
        };
        // A change found on a session's first reading may have its snapshot published already (a process died
        // after publishing it, before recording it). A change seen live came after that reading, so no earlier
        // process saw it: it skips the catalog's list and reads, time the operator's roll would have.
        if late
            && let Ok(listed) = catalog::list(store, Some(shard)).await
            && let Some(since) = recorded.as_ref().map(|r| r.recorded_at)
            && let Some(taken) =
                listed.iter().find(|m| records_change(m.kcp.as_ref(), m.started_at, since, (&described, &from, &now)))
        {
            tracing::info!(shard, id = taken.id, "the snapshot before this kcp upgrade is already published");
            self.record(store, recorded, State::new(&described, &now, Some(taken.id.clone()))).await;
            return;
        }
        if late {
            self.metrics.upgrade.late.get_or_create(&label).inc();
        }
        tracing::info!(
            shard,
            object = described,
            from,
            to = now,
            late,
            "the kcp image changed: snapshot before the upgrade"
        );
        let regarding = self.regarding(object);
        for attempt in 1..=ATTEMPTS {
            let kcp = KcpVersion {
                image: from.clone(),
                object: described.clone(),
                upgrade_to: Some(now.clone()),
                after_roll_may_have_begun: late || attempt > 1,
            };
            match self.snapshot(store, kcp, &regarding).await {
                Ok(manifest) => {
                    self.drill_and_record(store, recorded, &regarding, (&described, &now), &manifest).await;
                    return;
                }
                Err(error) => {
                    let reason: &'static str = (&error).into();
                    self.metrics.failed(shard, &error);
                    tracing::error!(shard, attempt, reason, %error, "the snapshot before the kcp upgrade failed");
                    let last = attempt == ATTEMPTS || self.shutdown.is_cancelled();
                    let then = if last { "giving up on this change" } else { "trying again" };
                    let note = format!(
                        "snapshot of shard {shard} before the upgrade to {now} failed ({reason}), attempt {attempt} of {ATTEMPTS}: {error}; {then}"
                    );
                    self.tell(&regarding, EventType::Warning, "PreUpgradeSnapshotFailed", &note).await;
                    if last {
                        self.count("snapshot_failed");
                        self.record(store, recorded, State::new(&described, &now, None)).await;
                        return;
                    }
                    tokio::select! {
                        () = self.shutdown.cancelled() => return,
                        () = tokio::time::sleep(RETRY_PAUSE * attempt) => {}
                    }
                }
            }
        }
    }

    /// After the snapshot before an upgrade was published: its drill, the result counted, the Event on the
    /// operator's object, and the change recorded with the snapshot's id.
    async fn drill_and_record(
        &self,
        store: &Store,
        recorded: &mut Option<State>,
        regarding: &ObjectReference,
        (described, now): (&str, &str),
        manifest: &Manifest,
    ) {
        let label = self.metrics.shard(&self.shard.name);
        self.metrics.upgrade.last.get_or_create(&label).set(unix_now());
        let drilled = self.drill(store, manifest).await;
        let result = if drilled.as_ref().is_some_and(|o| o.result.is_ok()) { "passed" } else { "drill_failed" };
        self.count(result);
        let drill = match &drilled {
            Some(outcome) => drill_run::summary(outcome),
            None => "drill stopped by shutdown".into(),
        };
        let kcp = manifest.kcp.as_ref().map(KcpVersion::describe).unwrap_or_default();
        let note = format!("snapshot {} (revision {}) under {kcp}; {drill}", manifest.id, manifest.revision_bounds());
        let (kind, reason) = match result {
            "passed" => (EventType::Normal, "PreUpgradeSnapshotTaken"),
            _ => (EventType::Warning, "PreUpgradeDrillFailed"),
        };
        self.tell(regarding, kind, reason, &note).await;
        self.record(store, recorded, State::new(described, now, Some(manifest.id.clone()))).await;
    }

    fn count(&self, result: &str) {
        let labels = UpgradeLabels { shard: self.shard.name.clone(), result: result.into() };
        self.metrics.upgrade.snapshots.get_or_create(&labels).inc();
    }

    /// One full snapshot labelled `kcp`, in the snapshots' turn, aborted cleanly by a shutdown. Waiting for the
    /// shard's lock is told on the operator's object (`PreUpgradeSnapshotWaiting`).
    async fn snapshot(
        &self,
        store: &Store,
        mut kcp: KcpVersion,
        regarding: &ObjectReference,
    ) -> Result<Manifest, SnapshotError> {
        // Waiting for another run (the snapshots' turn here, the shard's lock in `take`) may let the roll begin.
        let _turn = match self.snapshots_turn.try_lock() {
            Ok(turn) => turn,
            Err(_) => {
                kcp.after_roll_may_have_begun = true;
                self.snapshots_turn.lock().await
            }
        };
        let shard = &self.shard.name;
        let waiting = |holder: &str| {
            tracing::warn!(shard, holder, "another run holds the shard's lock; waiting");
            let note = format!(
                "the snapshot of shard {shard} before the kcp upgrade waits for another run ({holder}): it may come \
                 after the roll began, and its manifest says so"
            );
            let (kind, reason) = (EventType::Warning, "PreUpgradeSnapshotWaiting");
            self.events.publish_detached(regarding.clone(), kind, reason, "PreUpgradeSnapshot", note);
        };
        let roll = roll::Pods { client: self.client.clone(), watched: self.watched.clone(), from: kcp.image.clone() };
        let run = snapshot::Run {
            tick: None,
            progress: None,
            command: "run",
            lock_wait: LOCK_WAIT,
            waiting: &waiting,
            kcp: Some(kcp),
            roll: Some(&roll),
        };
        let taken = snapshot::take_until(
            &self.config,
            &self.shard,
            store,
            &self.metrics,
            run,
            &self.shutdown,
            Grace::default(),
        )
        .await?;
        let m = &taken.manifest;
        tracing::info!(
            shard,
            id = m.id,
            revision = m.revision,
            upper = m.revision_upper_bound,
            "snapshot before the kcp upgrade published"
        );
        Ok(taken.manifest)
    }

    /// The drill of the snapshot just taken, in the drills' turn; `None` when a shutdown stopped it.
    async fn drill(&self, store: &Store, manifest: &Manifest) -> Option<Outcome> {
        let _turn = self.drills_turn.lock().await;
        let kcp = self.shard.drill.as_ref().and_then(|d| d.kcp.as_ref());
        let outcome = tokio::select! {
            outcome = drill_run::drill_and_record(&self.config.drills, kcp, store, &manifest.id) => outcome,
            () = self.shutdown.cancelled() => return None,
        };
        self.metrics.drill_outcome(&self.shard.name, &outcome);
        if let Err(error) = &outcome.result {
            tracing::error!(shard = self.shard.name, id = manifest.id, %error, "the drill of the snapshot before the kcp upgrade failed");
        }
        Some(outcome)
    }
}
