//! The daemon: one reconcile per configured kubeconfig, run by the runtime's driver over watches scoped by the
//! configuration ([`crate::scope`]). A reconcile follows the source (for a kcp-operator `Kubeconfig`: its
//! Certificate, the certificate Secret, the rendered Secret; [`crate::source`]), nudges a stale render, forces a
//! renewal that is overdue ([`crate::renew`]), checks and proves the candidate ([`crate::prove`]), and publishes
//! it to every target that holds nothing better ([`crate::target`]). What the pass did to its targets is told in
//! one Event on the source ([`crate::report`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kcp_keeper_runtime::agent::Context;
use kcp_keeper_runtime::apply::{self, ApplyError, Outcome, Ownership};
use kcp_keeper_runtime::driver::{self, ErrorReason, Named, ReconcileMetrics, Reconciler, Settings};
use kcp_keeper_runtime::events::{EventType, Recorder, reference};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};
use time::OffsetDateTime;

use kcp_keeper_runtime::consumer_restart::{Done, RestartError, Restarter, Wanted};

use crate::config::{Config, Kubeconfig, Source, Target};
use crate::credential::{self, Credential, rfc3339};
use crate::error::SyncError;
use crate::metrics::Metrics;
use crate::objects::{Certificate, RENDER_REQUESTED};
use crate::overlap;
use crate::policy::{self, Expected, Live, TargetAction};
use crate::prove;
use crate::renew::{self, nudge_due};
use crate::report::PassReport;
use crate::scope::{Reader, Snapshot, Stores, secret_key};
use crate::source::{self as source_object, Resolved, candidate, resolve};
use crate::target::{desired_secret, live_state, published_ca, restart_keys, split_keys_current};

/// How soon to look again after a nudge or a forced renewal: the operator or cert-manager answers in seconds.
const FOLLOW_UP: Duration = Duration::from_secs(2);

/// `kubeconfig-rotator run`, inside the runtime's `run`: the driver over a [`Rotator`] per configuration.
pub async fn daemon(ctx: Context<Config>, metrics: Metrics, reconcile: ReconcileMetrics) -> anyhow::Result<()> {
    // The configured resyncInterval comes back as each reconcile's requeue, so a reload applies at once.
    let settings = Settings { resync: Duration::from_secs(3600), ..Settings::default() };
    let (client, events) = (ctx.client.clone(), ctx.events.clone());
    let kept_told = KeptTold::default();
    driver::run(&ctx, &reconcile, settings, |config: Arc<Config>| {
        let (stores, watches) = Stores::build(&client, &config);
        let rotator = Rotator {
            client: client.clone(),
            events: events.clone(),
            metrics: metrics.clone(),
            config,
            stores,
            kept_told: kept_told.clone(),
            written: Written::default(),
        };
        (rotator, watches)
    })
    .await;
    Ok(())
}

/// The reconciler for one configuration: rebuilt, with its watches and stores, whenever the configuration changes.
pub struct Rotator {
    pub client: kube::Client,
    pub events: Arc<Recorder>,
    pub metrics: Metrics,
    pub config: Arc<Config>,
    pub stores: Stores,
    /// Per kubeconfig, the targets kept longer as its last pass found them: keeping them again is no news.
    pub kept_told: KeptTold,
    /// Each target as our own last write left it, while the store does not hold it yet.
    pub written: Written,
}

/// Each target as the apiserver returned it from our own last write, kept until the target's store holds it.
///
/// Every target is watched on its own, and right after a pass wrote its targets some of those watches may not have
/// delivered the writes yet (a loaded apiserver; the passes their first events wake, or a renewal seconds after a
/// start). A target the store does not hold is otherwise read before anything is decided, since creating carries
/// no `resourceVersion` precondition. Instead, a pass decides on our own last write:
/// - to write over it, with its `resourceVersion` as the precondition: if anyone changed, deleted or replaced the
///   target since, the write fails, and the pass reads the target and decides again;
/// - that it is unchanged, for [`OWN_TRUSTED`] after the write: the store cannot tell "not delivered yet" from
///   "delivered, then deleted by someone", so the pass asks to look again when that time ends, and from then on
///   such a target is read;
/// - anything else (a longer-lived credential to keep or replace) is decided on a read, as before.
#[derive(Default)]
pub struct Written(Mutex<BTreeMap<(String, String), (Secret, Instant)>>);

/// How long our own last write of a target its store does not hold yet is taken as what the target holds.
const OWN_TRUSTED: Duration = Duration::from_secs(20);

impl Written {
    /// Our last write of `target` and when it was made, when the store does not hold the target; forgotten once
    /// it does.
    fn recall(&self, target: &Target, snap: &Snapshot) -> Option<(Secret, Instant)> {
        let mut written = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = (target.namespace.clone(), target.name.clone());
        match snap.secret(&target.namespace, &target.name) {
            Some(_) => {
                written.remove(&key);
                None
            }
            None => written.get(&key).cloned(),
        }
    }

    /// What the write returned (`None`: nothing written, or a failure: forget it).
    fn set(&self, target: &Target, object: Option<Secret>) {
        let mut written = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = (target.namespace.clone(), target.name.clone());
        match object {
            Some(object) => written.insert(key, (object, Instant::now())),
            None => written.remove(&key),
        };
    }
}

/// What each kubeconfig's last pass kept longer ([`PassReport::kept`]); it outlives a configuration reload.
pub type KeptTold = Arc<Mutex<BTreeMap<String, Vec<String>>>>;

impl Reconciler for Rotator {
    type Item = Named;
    type Error = SyncError;

    fn items(&self) -> Vec<Named> {
        self.config.kubeconfigs.iter().map(|k| Named::new("kubeconfig", k.name.clone())).collect()
    }

    async fn reconcile(&self, item: &Named) -> Result<Option<Duration>, SyncError> {
        let Some(kc) = self.config.find(&item.name) else { return Ok(None) };
        self.metrics.touch(kc);
        let snap = Reader::Stores(&self.stores).snapshot(kc).await.map_err(SyncError::ReadFailed)?;
        let targets = snap.targets(kc);
        self.metrics.targets(kc, &targets);
        // Withdrawn first and whatever the source's state: a copy where it no longer belongs goes even while
        // no candidate can be published.
        let mut report = PassReport::default();
        let withdrawn = self.withdraw(kc, &snap, &mut report).await;
        let next = self.sync(kc, &targets, &snap, OffsetDateTime::now_utc(), &mut report).await;
        self.tell(kc, &snap, &report).await;
        let next = next?;
        withdrawn.map(|()| Some(next))
    }
}

impl Rotator {
    /// Deletes every copy of a selector target in a namespace no longer both selected and allowed
    /// ([`Snapshot::withdrawals`]), as the agent last saw it (uid and resourceVersion preconditions: a copy
    /// rewritten since is looked at again next pass), each noted in `report`.
    async fn withdraw(&self, kc: &Kubeconfig, snap: &Snapshot, report: &mut PassReport) -> Result<(), SyncError> {
        let mut first = None;
        for copy in snap.withdrawals(kc) {
            let (ns, name) = (copy.namespace().unwrap_or_default(), copy.name_any());
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: copy.metadata.uid.clone(),
                    resource_version: copy.metadata.resource_version.clone(),
                }),
                ..DeleteParams::default()
            };
            match Api::<Secret>::namespaced(self.client.clone(), &ns).delete(&name, &params).await {
                Ok(_) => {
                    tracing::info!(kubeconfig = %kc.name, namespace = %ns, name = %name, "withdrew a copy from a namespace no longer selected or allowed");
                    report.withdrawn(format!("{ns}/{name}"));
                }
                // Gone already (the store has not seen our own delete yet, or someone else's).
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(source) => {
                    tracing::warn!(kubeconfig = %kc.name, namespace = %ns, name = %name, error = %source, "a copy not withdrawn");
                    report.withdraw_failed(format!("{ns}/{name}"), &source);
                    first.get_or_insert(SyncError::WithdrawFailed { object: format!("{ns}/{name}"), source });
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The pass's one Event ([`PassReport::event`]), if it has one, on the source: after every target is written
    /// and every copy withdrawn. Rate limited per kubeconfig as well, as kubeconfigs may share a source Secret.
    async fn tell(&self, kc: &Kubeconfig, snap: &Snapshot, report: &PassReport) {
        // Only a pass that reached the targets says what is kept (a rejected candidate keeps every target as is).
        let kept_is_news = report.reached_targets() && {
            let mut told = self.kept_told.lock().unwrap_or_else(|e| e.into_inner());
            told.insert(kc.name.clone(), report.kept().to_vec()).as_deref() != Some(report.kept())
        };
        let Some((kind, reason, note)) = report.event(&kc.name, kept_is_news) else { return };
        let regarding = source_object::regarding(kc, snap);
        self.events.publish_about(&regarding, &kc.name, kind, reason, "Publish", &note).await;
    }

    async fn sync(
        &self,
        kc: &Kubeconfig,
        targets: &[Target],
        snap: &Snapshot,
        now: OffsetDateTime,
        report: &mut PassReport,
    ) -> Result<Duration, SyncError> {
        let source = resolve(kc, snap)?;
        let mut follow_up = false;
        if let Source::Operator { namespace, name, server_ca, .. } = &kc.source {
            let current_ca = server_ca.as_ref().and_then(|r| snap.key(&r.namespace, &r.name, &r.key));
            follow_up |= self.nudge_if_stale(kc, namespace, name, snap, &source, current_ca, now).await?;
            follow_up |= self.renew_if_due(kc, &source, now).await?;
        }
        if let Some(missing) = &source.missing {
            return Err(SyncError::SourceMissing(missing.clone()));
        }
        let candidate = match candidate(kc, &source, now) {
            Ok(c) => c,
            Err(e) => {
                self.reject(kc, &source, e.reason(), &e.to_string()).await;
                return Err(SyncError::CandidateRejected(e));
            }
        };
        if let Err(e) = prove_offered(kc, &candidate, &source.expected, targets, snap, now).await {
            self.reject(kc, &source, e.reason(), &e.to_string()).await;
            return Err(SyncError::ProofFailed(e));
        }
        self.metrics.proven(&kc.name, candidate.cert.not_after, now);
        report.candidate(&candidate.cert.serial, &rfc3339(candidate.cert.not_after));

        let (mut failures, mut wake) = (Vec::new(), None);
        for target in targets {
            match self.sync_target(kc, target, &candidate, &source.expected, snap, now, report).await {
                Err(e) => failures.push(e),
                Ok(Some(until)) => wake = Some(wake.map_or(until, |w: OffsetDateTime| w.min(until))),
                Ok(None) => {}
            }
        }
        let (total, failed) = (targets.len(), failures.len());
        if let Some(first) = failures.into_iter().next() {
            return Err(match first {
                TargetFailure::Restart(RestartError::Failed(e)) => SyncError::RestartFailed(Box::new(e)),
                TargetFailure::Restart(RestartError::Missing(object)) => SyncError::ConsumerMissing(object),
                TargetFailure::Write(first @ (ApplyError::Foreign { .. } | ApplyError::ForeignKey { .. })) => {
                    SyncError::TargetNotOwned { failed, total, first: Box::new(first) }
                }
                TargetFailure::Write(first) => SyncError::TargetWriteFailed { failed, total, first: Box::new(first) },
            });
        }
        self.metrics.synced(&kc.name);
        let renew_before = kc.renew_before.or_else(|| source.certificate.as_ref().and_then(Certificate::renew_before));
        let review = policy::next_review(
            source.issued.as_ref().unwrap_or(&candidate.cert),
            now,
            renew_before,
            self.config.resync_interval,
        );
        // A restart deferred to its window is looked at again when the window opens (or its deadline comes).
        let review = match wake {
            Some(until) => {
                review.min(Duration::try_from(until - now).unwrap_or(Duration::ZERO) + Duration::from_secs(1))
            }
            None => review,
        };
        Ok(if follow_up { review.min(FOLLOW_UP) } else { review })
    }

    /// A candidate failed a check or its proof: counted, reported on the source, never published.
    async fn reject(&self, kc: &Kubeconfig, source: &Resolved, reason: &str, message: &str) {
        self.metrics.verification_failed(&kc.name, reason);
        tracing::warn!(kubeconfig = %kc.name, reason, "candidate not published: {message}");
        let note = format!("kubeconfig {}: candidate not published, targets keep what they hold: {message}", kc.name);
        self.events.publish(&source.regarding, EventType::Warning, "CandidateRejected", "Verify", &note).await;
    }

    /// cert-manager renewed, or the server CA rotated, but the operator has not re-rendered (neither wakes it):
    /// annotate the Kubeconfig, which makes it re-render at once. Returns whether it nudged.
    #[allow(clippy::too_many_arguments)]
    async fn nudge_if_stale(
        &self,
        kc: &Kubeconfig,
        namespace: &str,
        name: &str,
        snap: &Snapshot,
        source: &Resolved,
        current_ca: Option<&[u8]>,
        now: OffsetDateTime,
    ) -> Result<bool, SyncError> {
        let Some(issued) = &source.issued else { return Ok(false) };
        let rendered = credential::peek(&source.bytes);
        let ca_stale = current_ca.is_some_and(|ca| {
            !credential::peek_ca(&source.bytes).is_some_and(|rendered_ca| credential::ca_contains(&rendered_ca, ca))
        });
        if !policy::render_is_stale(issued, rendered.as_ref()) && !ca_stale {
            return Ok(false);
        }
        let previous =
            snap.kubeconfig.as_ref().and_then(|k| k.metadata.annotations.as_ref()?.get(RENDER_REQUESTED).cloned());
        if !nudge_due(previous.as_deref(), &issued.serial, now) {
            return Ok(true);
        }
        renew::nudge(&self.client, namespace, name, &issued.serial, now).await?;
        self.metrics.nudged(&kc.name);
        let why = if ca_stale {
            "the rendered CA data lacks the current server CA".to_string()
        } else {
            format!(
                "cert-manager issued serial {} but the rendered Secret holds {}",
                issued.serial,
                rendered.map_or_else(|| "nothing usable".to_string(), |r| format!("serial {}", r.serial))
            )
        };
        let note = format!("kubeconfig {}: {why}; asked the operator to re-render", kc.name);
        tracing::info!(kubeconfig = %kc.name, serial = %issued.serial, "nudged the Kubeconfig to re-render");
        self.events.publish(&source.regarding, EventType::Normal, "RenderRequested", "Nudge", &note).await;
        Ok(true)
    }

    /// Less than renewBefore left and no issuance under way: set `Issuing=True` on the Certificate's status, as
    /// `cmctl renew` does (never its spec, which the operator owns). Returns whether it forced one.
    async fn renew_if_due(&self, kc: &Kubeconfig, source: &Resolved, now: OffsetDateTime) -> Result<bool, SyncError> {
        let (Some(issued), Some(certificate)) = (&source.issued, &source.certificate) else { return Ok(false) };
        let renew_before = kc.renew_before.or_else(|| certificate.renew_before());
        if !policy::renewal_due(issued, now, renew_before, certificate.issuing()) {
            return Ok(false);
        }
        renew::force_renewal(&self.client, certificate).await?;
        self.metrics.renewal_forced(&kc.name);
        let note = format!(
            "kubeconfig {}: certificate serial {} expires at {} and no renewal is under way; forced one (Issuing=True)",
            kc.name,
            issued.serial,
            rfc3339(issued.not_after)
        );
        tracing::info!(kubeconfig = %kc.name, serial = %issued.serial, "forced a renewal");
        self.events.publish(&source.regarding, EventType::Normal, "RenewalForced", "Renew", &note).await;
        Ok(true)
    }

    /// One target: read it, decide what it holds after this pass (what it holds, proven, when that lasts longer;
    /// otherwise the candidate, written), then restart its consumers for that. Returns when a deferred restart
    /// wants another look.
    #[allow(clippy::too_many_arguments)]
    async fn sync_target(
        &self,
        kc: &Kubeconfig,
        target: &Target,
        candidate: &Credential,
        expected: &Expected,
        snap: &Snapshot,
        now: OffsetDateTime,
        report: &mut PassReport,
    ) -> Result<Option<OffsetDateTime>, TargetFailure> {
        let api = Api::<Secret>::namespaced(self.client.clone(), &target.namespace);
        // Our own last write stands in for a target the store does not hold yet ([`Written`]).
        let mut held = None;
        if let Some((own, at)) = self.written.recall(target, snap) {
            held = self.hold(&api, kc, target, candidate, expected, (Some(&own), Some(at)), now, report).await?;
        }
        let (held_hash, held_not_after, look_again) = match held {
            Some(held) => held,
            None => {
                let fetched = read_unstored(&api, target, snap).await.map_err(|e| {
                    self.metrics.target(kc, target).not_in_sync();
                    self.write_failed(kc, target, &e, report);
                    TargetFailure::Write(e)
                })?;
                let live_secret = snap.secret(&target.namespace, &target.name).or(fetched.as_ref());
                let held = self.hold(&api, kc, target, candidate, expected, (live_secret, None), now, report).await?;
                held.expect("a view the apiserver gave decides")
            }
        };
        let regarding = reference("v1", "Secret", &target.namespace, &target.name, None);
        let restart = self.restart_consumers(kc, target, &held_hash, held_not_after, &regarding, now).await?;
        Ok([restart, look_again].into_iter().flatten().min())
    }

    /// Decides on `live_secret` what the target holds after this pass and writes it if needed; returns the hash and
    /// end of what it holds, and when to look again. `own`: the view is our own last write ([`Written`]), made
    /// then; `None` when it cannot decide (see there), or when the write over it failed (the target changed
    /// since): the caller reads the target and decides again.
    #[allow(clippy::too_many_arguments)]
    async fn hold(
        &self,
        api: &Api<Secret>,
        kc: &Kubeconfig,
        target: &Target,
        candidate: &Credential,
        expected: &Expected,
        (live_secret, own): (Option<&Secret>, Option<Instant>),
        now: OffsetDateTime,
        report: &mut PassReport,
    ) -> Result<Option<(String, OffsetDateTime, Option<OffsetDateTime>)>, TargetFailure> {
        let series = self.metrics.target(kc, target);
        let live = live_state(live_secret, target, now);
        let overlapped = with_held_cas(kc, candidate, live_secret, target, now);
        let candidate = overlapped.as_ref().unwrap_or(candidate);
        let complete = split_keys_current(live_secret, target, candidate);
        let name = format!("{}/{}", target.namespace, target.name);
        // What the target holds after this pass.
        let mut action = policy::target_action(&live, candidate, complete);
        let trusted_for = own.and_then(|at| OWN_TRUSTED.checked_sub(at.elapsed()));
        let mut look_again = None;
        match (own, action) {
            (None, _) | (Some(_), TargetAction::Write) => {}
            (Some(_), TargetAction::Unchanged) if trusted_for.is_some() => look_again = trusted_for.map(|d| now + d),
            (Some(_), _) => {
                self.written.set(target, None);
                return Ok(None);
            }
        }
        let own = own.is_some();
        match (action, &live) {
            (TargetAction::KeepLonger, _) => {
                action = self.prove_held(kc, live_secret, target, expected, now, report).await;
            }
            (TargetAction::Repoint, Live::Valid { cert, .. }) => {
                // Neither server is named: a URL may carry what does not belong in an Event.
                tracing::info!(kubeconfig = %kc.name, namespace = %target.namespace, name = %target.name, "a longer-lived target points at another server: replaced");
                report.replaced_other_server(name.clone(), &cert.serial);
            }
            _ => {}
        }
        let held = match (action, &live) {
            (TargetAction::Unchanged, _) => {
                series.holds(candidate.cert.not_after, true);
                report.unchanged();
                (candidate.hash(), candidate.cert.not_after)
            }
            (TargetAction::KeepLonger, Live::Valid { cert, hash, .. }) => {
                series.holds(cert.not_after, false);
                tracing::info!(kubeconfig = %kc.name, namespace = %target.namespace, name = %target.name, serial = %cert.serial, candidate = %candidate.cert.serial, "kept a longer-lived credential");
                report.kept_longer(name, &cert.serial, &rfc3339(cert.not_after));
                (hash.clone(), cert.not_after)
            }
            _ => {
                let rv = live_secret.and_then(|s| s.metadata.resource_version.as_deref());
                let desired = desired_secret(kc, target, candidate, rv, live_secret.is_none());
                let ownership = Ownership::Owned { adopt: target.adopt };
                match apply::apply_over_returning(api, desired, ownership, live_secret).await {
                    Ok((outcome, written)) => {
                        self.written.set(target, written);
                        match outcome {
                            Outcome::Unchanged => report.unchanged(),
                            _ => self.published(kc, target, candidate, &live, report),
                        }
                    }
                    Err(e) if own => {
                        tracing::info!(kubeconfig = %kc.name, namespace = %target.namespace, name = %target.name, reason = e.metric_label(), "the target changed since our last write of it: read again");
                        self.written.set(target, None);
                        return Ok(None);
                    }
                    Err(e) => {
                        self.written.set(target, None);
                        series.not_in_sync();
                        self.write_failed(kc, target, &e, report);
                        return Err(TargetFailure::Write(e));
                    }
                }
                series.holds(candidate.cert.not_after, true);
                (candidate.hash(), candidate.cert.not_after)
            }
        };
        Ok(Some((held.0, held.1, look_again)))
    }

    /// A target not written: logged with the whole error, and noted in the pass's report.
    fn write_failed(&self, kc: &Kubeconfig, target: &Target, e: &ApplyError, report: &mut PassReport) {
        tracing::warn!(kubeconfig = %kc.name, namespace = %target.namespace, name = %target.name, reason = e.metric_label(), error = %e, "target not written");
        report.write_failed(format!("{}/{}", target.namespace, target.name), e);
    }

    /// Every pass, whether it wrote or not: a consumer not yet restarted for what the target holds (`held_hash`,
    /// valid until `held_until`; created later, or its restart failed) is restarted now; until then it is pending,
    /// and the error retries it. Returns when a restart deferred to its window wants another look.
    async fn restart_consumers(
        &self,
        kc: &Kubeconfig,
        target: &Target,
        held_hash: &str,
        held_until: OffsetDateTime,
        regarding: &ObjectReference,
        now: OffsetDateTime,
    ) -> Result<Option<OffsetDateTime>, TargetFailure> {
        let keys = restart_keys(&kc.name);
        let owner = format!("kubeconfig {}", kc.name);
        let restarter = Restarter { client: &self.client, events: &self.events, keys: &keys, owner: &owner };
        // The deadline of a deferred restart is the notAfter of the credential the consumer was restarted for.
        let wanted = Wanted { hash: held_hash, held_until, deadline: None };
        let (mut first, mut wake) = (None, None);
        for consumer in &target.consumers {
            let window = target.restart_window.as_ref();
            let result = restarter.converge(&target.namespace, consumer, &wanted, window, regarding, now).await;
            self.metrics.consumers.record(&kc.name, &target.namespace, consumer, &result);
            match result {
                Err(e) => {
                    first.get_or_insert(TargetFailure::Restart(e));
                }
                Ok(Done::Deferred { until }) => wake = Some(wake.map_or(until, |w: OffsetDateTime| w.min(until))),
                Ok(Done::UpToDate | Done::Restarted) => {}
            }
        }
        first.map_or(Ok(wake), Err)
    }

    /// A target is kept because it lasts longer only if it is proven too (one SelfSubjectReview, at the server it
    /// holds, which is the candidate's: [`TargetAction::Repoint`] replaces one pointing elsewhere): a credential kcp
    /// no longer accepts (an old client CA, another user) is replaced by the candidate.
    async fn prove_held(
        &self,
        kc: &Kubeconfig,
        secret: Option<&Secret>,
        target: &Target,
        expected: &Expected,
        now: OffsetDateTime,
        report: &mut PassReport,
    ) -> TargetAction {
        let held = secret_key(secret, &target.key).map(|bytes| credential::parse(bytes, now));
        let Some(Ok(held)) = held else { return TargetAction::Write };
        match prove::prove(&held, expected).await {
            Ok(()) => TargetAction::KeepLonger,
            Err(e) => {
                tracing::warn!(kubeconfig = %kc.name, namespace = %target.namespace, name = %target.name, reason = <&str>::from(&e), "a longer-lived target failed its proof");
                let name = format!("{}/{}", target.namespace, target.name);
                // The proof's message names the kind of failure, never a value of the credential.
                report.replaced_unproven(name, &held.cert.serial, &e.to_string());
                TargetAction::Write
            }
        }
    }

    /// After a write: metrics, log and the pass's report, saying whether the certificate changed.
    fn published(
        &self,
        kc: &Kubeconfig,
        target: &Target,
        candidate: &Credential,
        live: &Live,
        report: &mut PassReport,
    ) {
        let name = format!("{}/{}", target.namespace, target.name);
        let what = match live {
            Live::Missing => {
                report.published(name);
                "published"
            }
            Live::Valid { cert, .. } if cert.serial == candidate.cert.serial => {
                report.updated(name);
                "updated"
            }
            Live::Valid { cert, .. } => {
                self.metrics.rotated(&kc.name);
                report.rotated(name, Some(&cert.serial));
                "rotated"
            }
            Live::Unusable => {
                self.metrics.rotated(&kc.name);
                report.rotated(name, None);
                "rotated"
            }
        };
        tracing::info!(kubeconfig = %kc.name, namespace = %target.namespace, name = %target.name, serial = %candidate.cert.serial, not_after = %rfc3339(candidate.cert.not_after), "{what}");
    }
}

/// A target the store does not hold yet is read once more: creating it carries no resourceVersion precondition,
/// so a store that lags (our own write, or someone else's) must not decide a blind write. `None` when the store
/// holds it (or it does not exist).
async fn read_unstored(api: &Api<Secret>, target: &Target, snap: &Snapshot) -> Result<Option<Secret>, ApplyError> {
    match snap.secret(&target.namespace, &target.name) {
        Some(_) => Ok(None),
        None => api.get_opt(&target.name).await.map_err(|source| {
            let object = format!("{}/{}", target.namespace, target.name);
            ApplyError::Kube { kind: "Secret".into(), object, source }
        }),
    }
}

/// What this target is offered (with CA overlap on): the candidate, with the previous server CAs the target holds
/// that are still valid. `None` when there is nothing to carry: the candidate as it is.
fn with_held_cas(
    kc: &Kubeconfig,
    candidate: &Credential,
    live_secret: Option<&Secret>,
    target: &Target,
    now: OffsetDateTime,
) -> Option<Credential> {
    kc.ca_overlap
        .then(|| published_ca(live_secret, target))
        .flatten()
        .and_then(|held| overlap::overlap(&candidate.ca_pem, &held, now))
        .map(|ca| candidate.with_ca(ca))
}

/// Proves the candidate. With CA overlap, a candidate whose own CA data does not verify the server is proven once
/// more as the targets will be offered it, with the previous server CAs they hold beside its own: after a
/// server-CA rotation the servers serve from the previous CA until their certificates are re-issued, and a
/// kubeconfig carrying both works against them now and after. Without it every candidate would be refused until
/// the serving certificates change, and a read-once consumer would hold only the previous CA when they do.
async fn prove_offered(
    kc: &Kubeconfig,
    candidate: &Credential,
    expected: &Expected,
    targets: &[Target],
    snap: &Snapshot,
    now: OffsetDateTime,
) -> Result<(), prove::ProofError> {
    match prove::prove(candidate, expected).await {
        Err(prove::ProofError::Unreachable) if kc.ca_overlap => {
            let held: Vec<u8> = targets
                .iter()
                .filter_map(|t| published_ca(snap.secret(&t.namespace, &t.name), t))
                .flat_map(|mut ca| {
                    ca.push(b'\n');
                    ca
                })
                .collect();
            match overlap::overlap(&candidate.ca_pem, &held, now) {
                Some(ca) => prove::prove(&candidate.with_ca(ca), expected).await,
                None => Err(prove::ProofError::Unreachable),
            }
        }
        other => other,
    }
}

enum TargetFailure {
    Write(ApplyError),
    Restart(RestartError),
}
