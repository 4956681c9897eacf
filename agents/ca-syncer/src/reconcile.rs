//! The daemon's work: one reconcile per bundle, driven by the runtime's driver over watches scoped by the
//! configuration ([`crate::scope`]). A reconcile reads the bundle's sources from the stores, checks them,
//! builds the bundle per target (keeping rotated-out CAs until they expire), verifies it against the live
//! endpoint, and writes only what changed. The series it sets are kept true by [`crate::metrics`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret};
use kcp_keeper_runtime::agent::Context;
use kcp_keeper_runtime::apply::{self, ApplyError, Outcome, Ownership};
use kcp_keeper_runtime::consumer_restart::{Done, RestartError, Restarter, Wanted};
use kcp_keeper_runtime::driver::{self, ErrorReason, Named, ReconcileMetrics, Reconciler, Settings};
use kcp_keeper_runtime::events::{EventType, Recorder, reference};
use kcp_keeper_runtime::metrics::unix_now;
use kube::api::Api;
use serde_json::json;
use time::OffsetDateTime;

use crate::bundle::{Bundle as Built, BundleOptions};
use crate::certs::{Certificate, EmptyPolicy, Fingerprint, parse_certificates};
use crate::config::{Bundle, Config, LiveCheck, PasswordFrom, Pick, Placement, Source, Target, TargetKind};
use crate::consumers;
use crate::error::{PasswordError, SyncError};
use crate::keystore::Memo;
use crate::live_check::{self, EndpointFailure, Failures};
use crate::metrics::{BundleLabel, EndpointLabels, Metrics, Published, ReasonLabels, SkipReason, TargetLabels};
use crate::observed::{ObjectKey, Observed, View, Written, digest};
use crate::report::PassReport;
use crate::rotation::{self, DropReason, RetentionPlan, RotationState, STATE_ANNOTATION, plan_retention};
use crate::scope::Scope;
use crate::sources::{self, Reader};
use crate::state::{StateStore, Stored};
use crate::target_metadata::{self, Decided};

/// `ca-syncer run`'s own flag.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RunFlags {
    /// For tests only: the roots "empty means public roots" is verified with, instead of the compiled-in
    /// public roots (a loopback test bed has no publicly trusted endpoint).
    #[arg(long, env = "CA_SYNCER_PUBLIC_ROOTS_FILE", hide = true)]
    pub public_roots_file: Option<PathBuf>,
}

/// The agent's own namespace and Lease (from `run`'s arguments): the namespace holds the bundles' rotation
/// records, the Lease gets the Events of bundles (and sources) that have no source object of their own.
pub struct Own {
    pub namespace: String,
    pub lease_name: String,
}

/// `ca-syncer run`: the driver over one `Syncer` per configuration. `flags.public_roots_file` replaces the
/// compiled-in public roots for the empty-means-public check (tests only).
pub async fn daemon(
    ctx: Context<Config>,
    metrics: Metrics,
    reconcile: ReconcileMetrics,
    flags: RunFlags,
    own: Own,
) -> anyhow::Result<()> {
    let public_roots = match flags.public_roots_file {
        None => sources::public_roots(),
        Some(path) => {
            let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            parse_certificates(&bytes, EmptyPolicy::Reject).with_context(|| format!("{}", path.display()))?
        }
    };
    let public_roots = Arc::new(public_roots);
    // The configured resyncInterval comes back as each reconcile's requeue time, so a reloaded value
    // applies at once; the driver's own resync is only a backstop. A CA change is published at once, not after
    // the debounce: every bundle built mid-burst still holds each CA that left the sources (retention), so an
    // intermediate state drops nothing, and the rest of the burst follows in one pass after the quiet.
    let settings = Settings { resync: Duration::from_secs(3600), leading_edge: true, ..Settings::default() };
    let (client, events) = (ctx.client.clone(), ctx.events.clone());
    let terminating = Terminating::default();
    let state = StateStore::new(client.clone(), &own.namespace);
    let own_object = reference("coordination.k8s.io/v1", "Lease", &own.namespace, &own.lease_name, None);
    driver::run(&ctx, &reconcile, settings, |config: Arc<Config>| {
        metrics.consumers_configured(&config);
        let (scope, watches) = Scope::build(&client, &config);
        let syncer = Syncer {
            client: client.clone(),
            events: events.clone(),
            metrics: metrics.clone(),
            config,
            scope,
            terminating: terminating.clone(),
            state: state.clone(),
            own_object: own_object.clone(),
            public_roots: public_roots.clone(),
            written: Written::default(),
            keystores: Memo::default(),
        };
        (syncer, watches)
    })
    .await;
    Ok(())
}

/// One configuration's reconciler.
struct Syncer {
    client: kube::Client,
    events: Arc<Recorder>,
    metrics: Metrics,
    config: Arc<Config>,
    scope: Scope,
    terminating: Terminating,
    state: StateStore,
    /// The agent's Lease: where Events about sources without an object of their own go, and a bundle's
    /// Events when none of its sources is one object.
    own_object: ObjectReference,
    public_roots: Arc<Vec<Certificate>>,
    /// Our writes the stores have not shown yet ([`crate::observed`]).
    written: Written,
    /// Trust stores (`additionalFormats`) encoded by recent passes.
    keystores: Memo,
}

/// How many targets are read fresh at once when the stores lag behind our writes.
const FRESH_READS: usize = 16;

/// One object a target resolves to: the target as configured, in one namespace.
struct Resolved {
    namespace: String,
    /// Shared by every namespace the target resolves to.
    config: Arc<Target>,
    /// Its bundle writes both Secrets and ConfigMaps: Events name the kind too.
    qualified: bool,
}

impl Resolved {
    fn key(&self) -> ObjectKey {
        (self.config.kind, self.namespace.clone(), self.config.name.clone())
    }

    /// How Events name it: `namespace/name` (`Secret namespace/name` where its bundle writes both kinds), or
    /// `ClusterTrustBundle/name` (no namespace).
    fn display(&self) -> String {
        match self.config.kind {
            TargetKind::ClusterTrustBundle => format!("ClusterTrustBundle/{}", self.config.name),
            kind if self.qualified => format!("{} {}/{}", kind.as_str(), self.namespace, self.config.name),
            TargetKind::Secret | TargetKind::ConfigMap => format!("{}/{}", self.namespace, self.config.name),
        }
    }

    fn labels(&self, bundle: &str) -> TargetLabels {
        TargetLabels {
            bundle: bundle.to_string(),
            kind: self.config.kind.as_str().into(),
            namespace: self.namespace.clone(),
            name: self.config.name.clone(),
        }
    }
}

impl Reconciler for Syncer {
    type Item = Named;
    type Error = SyncError;

    fn items(&self) -> Vec<Named> {
        self.config.bundles.iter().map(|b| Named::new("bundle", b.name.clone())).collect()
    }

    async fn reconcile(&self, item: &Named) -> Result<Option<Duration>, SyncError> {
        let Some(bundle) = self.config.bundles.iter().find(|b| b.name == item.name) else { return Ok(None) };
        let now = OffsetDateTime::now_utc();
        let review = self.sync_bundle(bundle, now).await?;
        let resync = self.config.resync_interval;
        let due = review.map(|at| Duration::try_from(at - now).unwrap_or(Duration::ZERO) + Duration::from_secs(1));
        Ok(Some(due.map_or(resync, |due| due.min(resync))))
    }
}

impl Syncer {
    /// One pass over a bundle: read and check its sources, record and password, plan every target, verify the
    /// live check, write the record, then the targets and their consumers. Any step that fails before the
    /// writes leaves every target as it is. `Ok`: when to look again at the latest.
    async fn sync_bundle(&self, spec: &Bundle, now: OffsetDateTime) -> Result<Option<OffsetDateTime>, SyncError> {
        let (targets, skipped) = self.resolve_targets(spec);
        let mut report = PassReport::default();
        for (target, _) in &skipped {
            report.skipped(target.display());
        }
        let skipped: Vec<_> = skipped.iter().map(|(t, reason)| (t.labels(&spec.name), *reason)).collect();
        self.metrics.record_skipped(&spec.name, &skipped);
        let current = self.read_sources(spec, &targets).await?;
        let stored = match self.state.read(&spec.name).await {
            Ok(stored) => stored,
            Err(e) => {
                self.out_of_sync(spec, &targets);
                return Err(SyncError::StateUnavailable(e));
            }
        };
        let passwords = self.read_passwords(spec, &targets).await?;
        for problem in &stored.decoded.problems {
            tracing::warn!(bundle = %spec.name, problem = %problem, "rotation record partly ignored");
        }
        let plans = self.plan_targets(spec, &current, &stored.decoded.state, &targets, &passwords, now).await?;
        if let Some(check) = &spec.live_check
            && let Err(failures) = self.live_check(check, &current, &plans).await
        {
            return Err(self.live_check_failed(spec, &targets, failures).await);
        }
        self.write_record(spec, &current, &plans, &stored, &targets).await?;
        let certificates = self.count_certificates(spec, current, &plans, now);
        let result = self.publish(spec, plans, targets.len(), now, &mut report).await;
        self.tell(spec, &report, certificates).await;
        result
    }

    /// The bundle's certificates from its sources as the stores hold them. A source that cannot be used is
    /// counted, logged and told in an Event (on its object, else on the agent's Lease), and nothing is written.
    async fn read_sources(&self, spec: &Bundle, targets: &[Resolved]) -> Result<Vec<Certificate>, SyncError> {
        match sources::read_bundle(&Reader::Stores(&self.scope), spec).await {
            Ok(certs) => Ok(certs),
            Err((index, failure)) => {
                // Targets keep their last good content: nothing is written for this bundle.
                self.metrics
                    .series
                    .source_errors
                    .get_or_create(&ReasonLabels { bundle: spec.name.clone(), reason: failure.metric_label().into() })
                    .inc();
                // The driver's own line names neither the bundle nor the source in JSON logs (no spans there).
                tracing::warn!(bundle = %spec.name, source = index, reason = failure.metric_label(), error = %failure, "source rejected");
                let note = format!("bundle {}: sources[{index}] not used: {failure}", spec.name);
                let regarding = match failure.regarding(&spec.sources[index]) {
                    Some((object_kind, namespace, name)) => reference("v1", object_kind, &namespace, &name, None),
                    // A file (or inline) source has no object of its own: the Event goes on the agent's Lease.
                    None => self.own_object.clone(),
                };
                self.events.publish(&regarding, EventType::Warning, "SourceRejected", "Sync", &note).await;
                self.out_of_sync(spec, targets);
                Err(SyncError::SourceUnusable { index, failure })
            }
        }
    }

    /// The trust store passwords ([`Syncer::passwords`]). One that cannot be used is logged and told in an
    /// Event on the agent's Lease, and nothing is written.
    async fn read_passwords<'a>(
        &self,
        spec: &'a Bundle,
        targets: &[Resolved],
    ) -> Result<BTreeMap<&'a PasswordFrom, String>, SyncError> {
        match self.passwords(spec) {
            Ok(passwords) => Ok(passwords),
            Err(e) => {
                // Names the Secret and key, never what it holds.
                tracing::warn!(bundle = %spec.name, error = %e, "trust store password unusable");
                let note = format!("bundle {} not published: {e}", spec.name);
                self.events.publish(&self.own_object, EventType::Warning, "PasswordUnusable", "Sync", &note).await;
                self.out_of_sync(spec, targets);
                Err(SyncError::PasswordUnusable(e))
            }
        }
    }

    /// Every target's plan ([`Syncer::plan_target`]) with its trust stores, from the objects as they are now
    /// ([`crate::observed`]): a target whose store is behind our last write of it, planned to the object that
    /// write sent, is settled; one planned to anything else is read fresh and planned again.
    async fn plan_targets<'a>(
        &self,
        spec: &Bundle,
        current: &[Certificate],
        record: &RotationState,
        targets: &'a [Resolved],
        passwords: &BTreeMap<&PasswordFrom, String>,
        now: OffsetDateTime,
    ) -> Result<Vec<TargetPlan<'a>>, SyncError> {
        let (written, client, scope) = (&self.written, &self.client, &self.scope);
        let views: Vec<View> = futures::stream::iter(targets.iter().map(Resolved::key))
            .map(|key| async move { written.observe(client, scope, &key).await })
            .buffered(FRESH_READS)
            .collect()
            .await;
        // What each distinct content is planned to, shared by the targets that hold it.
        let memo = Mutex::new(HashMap::new());
        // `None`: the target's rotation state would be too large to write.
        let plan = |target: &'a Resolved, observed: Observed| {
            self.plan_target(spec, current, record, target, observed, now, &memo).map(|mut plan| {
                plan.stores = self.stores(&plan, passwords);
                plan
            })
        };
        let too_large = || {
            self.out_of_sync(spec, targets);
            SyncError::RotationStateTooLarge
        };
        let mut plans = Vec::with_capacity(targets.len());
        // Behind our last write, but planned to something else: read fresh.
        let mut unsettled = Vec::new();
        for (index, (target, view)) in targets.iter().zip(views).enumerate() {
            let mut planned = plan(target, view.observed).ok_or_else(too_large)?;
            match view.behind {
                Some(sent) if digest(&desired(&planned).0) == sent => {
                    planned.settled = true;
                    planned.recheck = view.recheck.map(|after| now + after);
                }
                Some(_) => unsettled.push(index),
                None => {}
            }
            plans.push(planned);
        }
        let reads: Vec<(ObjectKey, Observed)> =
            unsettled.iter().map(|&index| (targets[index].key(), plans[index].observed.clone())).collect();
        let fresh: Vec<Observed> = futures::stream::iter(reads)
            .map(|(key, cached)| async move { written.read(client, &key, cached).await })
            .buffered(FRESH_READS)
            .collect()
            .await;
        for (index, observed) in unsettled.into_iter().zip(fresh) {
            plans[index] = plan(&targets[index], observed).ok_or_else(too_large)?;
        }
        Ok(plans)
    }

    /// Counts and logs each endpoint that failed the live check and tells it in one Event on the bundle's object
    /// ([`Syncer::bundle_object`]): the bundle is not published.
    async fn live_check_failed(&self, spec: &Bundle, targets: &[Resolved], failures: Failures) -> SyncError {
        for failure in &failures.0 {
            let (url, error) = (failure.url(), &failure.error);
            let labels =
                EndpointLabels { bundle: spec.name.clone(), endpoint: url.to_string(), reason: error.reason().into() };
            self.metrics.series.live_check_failures.get_or_create(&labels).inc();
            tracing::warn!(bundle = %spec.name, endpoint = %url, reason = error.reason(), error = %error, "live check failed");
        }
        let note = format!(
            "bundle {} not published, its {} targets keep what they hold: live check failed: {failures}",
            spec.name,
            targets.len()
        );
        let regarding = self.bundle_object(spec);
        self.events.publish_about(&regarding, &spec.name, EventType::Warning, "LiveCheckFailed", "Sync", &note).await;
        self.out_of_sync(spec, targets);
        SyncError::LiveCheckFailed(failures)
    }

    /// Writes the bundle's rotation record when this pass changes it. The record is written before any target,
    /// so a target never holds a certificate the record does not know came from the sources (else it would be
    /// dropped the cycle after it leaves them).
    async fn write_record(
        &self,
        spec: &Bundle,
        current: &[Certificate],
        plans: &[TargetPlan<'_>],
        stored: &Stored,
        targets: &[Resolved],
    ) -> Result<(), SyncError> {
        let record = if current.is_empty() {
            RotationState::default()
        } else {
            rotation::next_state(current, plans.iter().filter_map(|p| p.planned.retention.as_ref()))
        };
        if record != stored.decoded.state
            && let Err(e) = self.state.write(&spec.name, stored, &record).await
        {
            self.out_of_sync(spec, targets);
            return Err(SyncError::StateUnavailable(e));
        }
        Ok(())
    }

    /// Sets (and returns) how many distinct certificates the bundle publishes across its targets (with no
    /// target, what its sources would give).
    fn count_certificates(
        &self,
        spec: &Bundle,
        current: Vec<Certificate>,
        plans: &[TargetPlan<'_>],
        now: OffsetDateTime,
    ) -> usize {
        let certificates = match plans.is_empty() {
            true => Built::build(current, &BundleOptions { drop_expired: spec.drop_expired, now }).len(),
            false => plans.iter().flat_map(|p| p.fingerprints()).collect::<BTreeSet<_>>().len(),
        };
        self.metrics
            .series
            .certificates
            .get_or_create(&BundleLabel { bundle: spec.name.clone() })
            .set(certificates as i64);
        certificates
    }

    /// Writes every planned target (of `total`) and brings its consumers to what it now holds, noting each
    /// target's outcome in `report`. `Ok`: when to look again at the latest.
    async fn publish(
        &self,
        spec: &Bundle,
        plans: Vec<TargetPlan<'_>>,
        total: usize,
        now: OffsetDateTime,
        report: &mut PassReport,
    ) -> Result<Option<OffsetDateTime>, SyncError> {
        let mut review = None;
        let mut published = Published::default();
        let mut failures: Vec<ApplyError> = Vec::new();
        let mut restart_failure: Option<RestartError> = None;
        for plan in plans {
            let (target, hash) = (plan.target, consumers::content_hash(&plan.planned.pem));
            let earliest = plan.planned.bundle.as_ref().and_then(|(b, _)| b.earliest_not_after());
            let held_until = consumers::held_until(earliest, now);
            // A consumer holding the previous bundle trusts the CA this one only retains: it is rolled before that
            // CA leaves the rotation overlap (its notAfter, or rotationGrace), window or not.
            let deadline = plan.planned.retention.as_ref().and_then(RetentionPlan::next_review_at);
            match self.write_target(spec, plan, &mut published, report).await {
                Ok(at) => {
                    review = min_time(review, at);
                    // Every pass, whatever it wrote: the target now holds `hash`, and a consumer not rolled for
                    // it (the content changed, it was created later, its roll failed) is rolled now or in its
                    // window; until then it is pending and the error retries the bundle.
                    let wanted = Wanted { hash: &hash, held_until, deadline };
                    match self.restart_consumers(spec, target, &wanted, now).await {
                        Ok(at) => review = min_time(review, at),
                        Err(e) => {
                            restart_failure.get_or_insert(e);
                        }
                    }
                }
                Err(e) => failures.push(e),
            }
        }
        self.keystores.end_pass();
        let failed = failures.len();
        self.metrics.forget_stale(&spec.name, published, failed > 0);
        // The first write that failed (with how many did), else the first consumer that could not be
        // restarted; a pass with no failed write records its time.
        let mut failures = failures.into_iter();
        match failures.next() {
            None => {
                self.metrics.series.last_sync.get_or_create(&BundleLabel { bundle: spec.name.clone() }).set(unix_now());
                match restart_failure {
                    None => Ok(review),
                    Some(RestartError::Missing(object)) => Err(SyncError::ConsumerMissing(object)),
                    Some(RestartError::Failed(e)) => Err(SyncError::ConsumerRestartFailed(Box::new(e))),
                }
            }
            Some(first @ (ApplyError::Foreign { .. } | ApplyError::ForeignKey { .. })) => {
                Err(SyncError::TargetNotOwned { failed, total, first })
            }
            Some(first) => Err(SyncError::TargetWriteFailed { failed, total, first }),
        }
    }

    /// Verifies every endpoint with each distinct bundle as it will be published (sources plus what each target
    /// retains); with no target, the sources alone. An empty bundle means "public roots" to its consumers: then
    /// the public roots must verify. The endpoints are checked at once; every one that fails is returned.
    async fn live_check(
        &self,
        check: &LiveCheck,
        current: &[Certificate],
        plans: &[TargetPlan<'_>],
    ) -> Result<(), Failures> {
        let mut bundles: BTreeMap<Vec<Fingerprint>, &[Certificate]> = BTreeMap::new();
        if current.is_empty() {
            bundles.insert(Vec::new(), &self.public_roots);
        } else {
            for plan in plans {
                if let Some((built, _)) = &plan.planned.bundle {
                    bundles.entry(built.fingerprints().collect()).or_insert_with(|| built.certificates());
                }
            }
            if bundles.is_empty() {
                bundles.insert(Vec::new(), current);
            }
        }
        let bundles = &bundles;
        let checks = check.endpoints.iter().map(|endpoint| async move {
            for roots in bundles.values() {
                if let Err(error) = live_check::verify(endpoint, roots).await {
                    return Some(EndpointFailure::new(&endpoint.url, error));
                }
            }
            None
        });
        let failures: Vec<EndpointFailure> = futures::future::join_all(checks).await.into_iter().flatten().collect();
        if failures.is_empty() { Ok(()) } else { Err(Failures(failures)) }
    }

    /// The password of every trust store the bundle's targets hold, by where it comes from: a Secret's key read
    /// from its watch, checked as a configured one is. The error never holds a password.
    fn passwords<'a>(&self, spec: &'a Bundle) -> Result<BTreeMap<&'a PasswordFrom, String>, PasswordError> {
        let mut out = BTreeMap::new();
        for format in spec.targets.iter().flat_map(|t| &t.formats) {
            let password = match &format.password {
                PasswordFrom::Inline(password) => password.clone(),
                PasswordFrom::Secret { namespace, name, key } => {
                    let at = || format!("{namespace}/{name}");
                    let secret = self.scope.secret(namespace, name).ok_or_else(|| PasswordError::NoSecret(at()))?;
                    let bytes = secret
                        .data
                        .as_ref()
                        .and_then(|d| d.get(key))
                        .ok_or_else(|| PasswordError::NoKey { secret: at(), key: key.clone() })?;
                    let password = String::from_utf8(bytes.0.clone()).map_err(|_| PasswordError::Invalid {
                        secret: at(),
                        key: key.clone(),
                        reason: "is not UTF-8".into(),
                    })?;
                    crate::config::check_password(format.format, &password)
                        .map_err(|reason| PasswordError::Invalid { secret: at(), key: key.clone(), reason })?;
                    password
                }
            };
            out.insert(&format.password, password);
        }
        Ok(out)
    }

    /// Every target of a bundle that cannot be published reads 0.
    fn out_of_sync(&self, spec: &Bundle, targets: &[Resolved]) {
        self.metrics.out_of_sync(&spec.name, targets.iter().map(|t| t.labels(&spec.name)));
    }

    /// The objects the bundle's targets resolve to now, and those skipped (with why).
    fn resolve_targets(&self, spec: &Bundle) -> (Vec<Resolved>, Vec<(Resolved, SkipReason)>) {
        let mut out = Vec::new();
        let mut skipped = Vec::new();
        let namespaced: BTreeSet<TargetKind> =
            spec.targets.iter().map(|t| t.kind).filter(|k| *k != TargetKind::ClusterTrustBundle).collect();
        let qualified = namespaced.len() > 1;
        for target in &spec.targets {
            let (namespaces, terminating) = match &target.placement {
                Placement::Namespace(ns) if self.terminating.is_skipped(ns) => (vec![], vec![ns.clone()]),
                Placement::Namespace(ns) => (vec![ns.clone()], vec![]),
                Placement::Selector(selector) => self.scope.namespaces(selector),
                // Cluster-scoped: no namespace.
                Placement::Cluster => (vec![String::new()], vec![]),
            };
            let config = Arc::new(target.clone());
            let resolved = |namespace: String| Resolved { namespace, config: config.clone(), qualified };
            out.extend(namespaces.into_iter().map(resolved));
            skipped.extend(terminating.into_iter().map(|ns| (resolved(ns), SkipReason::Terminating)));
        }
        (out, skipped)
    }

    /// What to write to one target: the sources plus what it retains, per the bundle's record.
    /// `None` when the cache annotation would be too large to write. Planned once per distinct content the
    /// targets hold (`memo`, for one pass): the plan depends on nothing else of the target.
    #[allow(clippy::too_many_arguments)]
    fn plan_target<'a>(
        &self,
        spec: &Bundle,
        current: &[Certificate],
        record: &RotationState,
        target: &'a Resolved,
        observed: Observed,
        now: OffsetDateTime,
        memo: &Mutex<HashMap<Vec<u8>, Arc<Planned>>>,
    ) -> Option<TargetPlan<'a>> {
        let live = observed.content(&target.config.key).unwrap_or_default();
        let known = memo.lock().unwrap_or_else(|e| e.into_inner()).get(&live).cloned();
        let planned = match known {
            Some(planned) => planned,
            None => {
                let planned = Arc::new(Self::planned(spec, current, record, &live, now)?);
                memo.lock().unwrap_or_else(|e| e.into_inner()).insert(live, planned.clone());
                planned
            }
        };
        Some(TargetPlan { target, observed, planned, stores: Vec::new(), settled: false, recheck: None })
    }

    /// What a target holding `live` is written ([`Syncer::plan_target`]).
    fn planned(
        spec: &Bundle,
        current: &[Certificate],
        record: &RotationState,
        live: &[u8],
        now: OffsetDateTime,
    ) -> Option<Planned> {
        if current.is_empty() {
            // Empty-means-public mode: the key is written empty, with nothing retained, because a consumer
            // holding any CA would stop trusting the public roots.
            return Some(Planned::default());
        }
        // A target we cannot parse is simply replaced; nothing from it is retained.
        let previous = parse_certificates(live, EmptyPolicy::Allow).unwrap_or_default();
        let retention = plan_retention(current, &previous, record, now, spec.rotation_grace);
        let bundle =
            Built::build(retention.certificates.clone(), &BundleOptions { drop_expired: spec.drop_expired, now });
        let cache = match retention.state_for(&bundle).encode() {
            Ok(cache) => cache,
            Err(e) => {
                tracing::warn!(bundle = %spec.name, error = %e, "rotation state too large; not written");
                return None;
            }
        };
        let review = min_time(retention.next_review_at(), bundle.earliest_not_after().filter(|_| spec.drop_expired));
        Some(Planned { pem: bundle.render(), cache, bundle: Some((bundle, review)), retention: Some(retention) })
    }

    /// The trust stores of a planned target: the same certificates as its PEM key, in the same order. None in
    /// empty-means-public mode (refused beside formats when the configuration loads).
    fn stores(
        &self,
        plan: &TargetPlan<'_>,
        passwords: &BTreeMap<&PasswordFrom, String>,
    ) -> Vec<(String, Arc<Vec<u8>>)> {
        let Some((bundle, _)) = &plan.planned.bundle else { return Vec::new() };
        let formats = &plan.target.config.formats;
        formats
            .iter()
            .map(|f| {
                let password = passwords.get(&f.password).map_or("", String::as_str);
                (f.key.clone(), self.keystores.encode(f.format, bundle.certificates(), password))
            })
            .collect()
    }

    async fn write_target(
        &self,
        spec: &Bundle,
        plan: TargetPlan<'_>,
        published: &mut Published,
        report: &mut PassReport,
    ) -> Result<Option<OffsetDateTime>, ApplyError> {
        let target = plan.target;
        let labels = target.labels(&spec.name);
        published.target(&labels);
        // A new series starts at 0; an existing one keeps its value until this pass knows better, so a target
        // that stays in sync never reads 0 mid-pass (an alert or a reader would see a flap).
        let in_sync = self.metrics.series.target_in_sync.get_or_create(&labels).clone();
        let (desired, metadata) = desired(&plan);
        if !metadata.foreign.is_empty() {
            let keys = metadata.foreign.join(", ");
            tracing::warn!(bundle = %spec.name, namespace = %target.namespace, name = %target.config.name, keys = %keys, "metadata keys held by another manager left alone");
            report.metadata_not_owned(&target.display(), &keys);
        }
        let ownership = Ownership::Owned { adopt: target.config.adopt };
        let (sent, over) = (digest(&desired), plan.observed.resource_version().map(str::to_string));
        let written = match &plan.observed {
            // Our last write sent this very object, and the apiserver holds it ([`crate::observed`]).
            _ if plan.settled => Ok((Outcome::Unchanged, None)),
            Observed::Secret(live) => {
                let api = Api::<Secret>::namespaced(self.client.clone(), &target.namespace);
                write_checked(&api, desired, ownership, live.as_deref()).await
            }
            Observed::ConfigMap(live) => {
                let api = Api::<ConfigMap>::namespaced(self.client.clone(), &target.namespace);
                write_checked(&api, desired, ownership, live.as_deref()).await
            }
            Observed::ClusterTrustBundle(live) => {
                let api = Api::<ClusterTrustBundle>::all(self.client.clone());
                write_checked(&api, desired, ownership, live.as_deref()).await
            }
        };
        let outcome = written.map(|(outcome, version)| {
            if let Some(version) = version {
                self.written.wrote(target.key(), over, version, sent);
            }
            outcome
        });
        let count = plan.planned.bundle.as_ref().map_or(0, |(b, _)| b.len());
        match outcome {
            Ok(Outcome::Unchanged) => report.unchanged(),
            Ok(outcome) => {
                self.metrics.series.writes.get_or_create(&BundleLabel { bundle: spec.name.clone() }).inc();
                let verb = if outcome == Outcome::Created { "created" } else { "updated" };
                tracing::info!(bundle = %spec.name, namespace = %target.namespace, name = %target.config.name, certificates = count, "{verb}");
                report.written(target.display());
                let removed = plan.foreign_removed();
                if removed > 0 {
                    tracing::warn!(bundle = %spec.name, namespace = %target.namespace, name = %target.config.name, removed, "foreign certificates removed");
                    report.foreign_removed(&target.display(), removed);
                }
            }
            Err(e) => {
                if terminating(&e) {
                    // Not retried every cycle: skipped (and counted as such) until it is probed again.
                    tracing::info!(bundle = %spec.name, namespace = %target.namespace, "target namespace is being deleted; skipped");
                    self.terminating.skip(&target.namespace);
                    self.metrics.skipped_now(&spec.name, &labels, SkipReason::Terminating, published);
                    report.skipped(target.display());
                    return Ok(None);
                }
                tracing::warn!(bundle = %spec.name, namespace = %target.namespace, name = %target.config.name, reason = e.metric_label(), error = %e, "target not written");
                in_sync.set(0);
                // A conflict (the object changed since it was read, often only the cache lagging behind our own
                // last write) is retried at once with a fresh read: the report counts it, not as a failure.
                report.failed(target.display(), &e);
                return Err(e);
            }
        }
        in_sync.set(1);
        let Some((bundle, review)) = &plan.planned.bundle else { return Ok(plan.recheck) };
        self.metrics.holds(&spec.name, bundle.certificates(), published);
        Ok(min_time(*review, plan.recheck))
    }

    /// Brings the target's consumers to `wanted` ([`Restarter::converge`]): the first error, or when to look
    /// again for a roll deferred to its window.
    async fn restart_consumers(
        &self,
        spec: &Bundle,
        target: &Resolved,
        wanted: &Wanted<'_>,
        now: OffsetDateTime,
    ) -> Result<Option<OffsetDateTime>, RestartError> {
        if target.config.consumers.is_empty() {
            return Ok(None);
        }
        let keys = consumers::keys(&spec.name);
        let owner = format!("bundle {}", spec.name);
        let restarter = Restarter { client: &self.client, events: &self.events, keys: &keys, owner: &owner };
        let regarding = reference("v1", target.config.kind.as_str(), &target.namespace, &target.config.name, None);
        let (mut first, mut review) = (None, None);
        for consumer in &target.config.consumers {
            let window = target.config.restart_window.as_ref();
            let result = restarter.converge(&target.namespace, consumer, wanted, window, &regarding, now).await;
            self.metrics.consumers.record(&spec.name, &target.namespace, consumer, &result);
            match result {
                Ok(Done::Deferred { until }) => review = min_time(review, Some(until)),
                Ok(Done::UpToDate | Done::Restarted) => {}
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(review), Err)
    }

    /// The pass's one Event ([`PassReport::event`]), if it has one, on the bundle's object. Sent after every
    /// target is written (one Event after the writes, so it does not compete with them for the apiserver), and
    /// awaited: the next pass's Event never overtakes it. Rate limited per bundle as well as per object and
    /// reason, as bundles may share a source object or the Lease.
    async fn tell(&self, spec: &Bundle, report: &PassReport, certificates: usize) {
        let Some((kind, reason, note)) = report.event(&spec.name, certificates) else { return };
        let regarding = self.bundle_object(spec);
        self.events.publish_about(&regarding, &spec.name, kind, reason, "Sync", &note).await;
    }

    /// Where a bundle's Events go: its first source that is one object (a Secret or ConfigMap by name), which an
    /// operator finds in the configuration and reads with `kubectl describe`; else (only selectors, files,
    /// inline certificates or the public roots) the agent's Lease. Both are in namespaces the agent may create
    /// Events in.
    fn bundle_object(&self, spec: &Bundle) -> ObjectReference {
        let named = spec.sources.iter().find_map(|source| match source {
            Source::Secret(r) => Some(("Secret", &r.namespace, &r.name)),
            Source::ConfigMap(r) => Some(("ConfigMap", &r.namespace, &r.name)),
            Source::Selected(selection) => match &selection.pick {
                Pick::Name(name) => Some((selection.kind.as_str(), &selection.namespace, name)),
                Pick::Labels(_) => None,
            },
            Source::Inline(_) | Source::File(_) | Source::PublicRoots => None,
        });
        match named {
            Some((kind, namespace, name)) => reference("v1", kind, namespace, name, None),
            None => self.own_object.clone(),
        }
    }
}

/// Applies `desired` over `live` (as the cache last saw it) with `live`'s `resourceVersion` as a precondition:
/// if someone changed the object after the ownership check read it, the apiserver refuses the write (409)
/// instead of letting a forced apply take over what may now be someone else's. The next cycle reads the change
/// and checks ownership again. An object that does not exist yet has no version to hold the write to; see
/// docs/ca-syncer.md.
pub async fn write_checked<K: apply::Object>(
    api: &Api<K>,
    mut desired: serde_json::Value,
    ownership: Ownership,
    live: Option<&K>,
) -> Result<(Outcome, Option<String>), ApplyError> {
    if let Some(version) = live.and_then(|l| l.meta().resource_version.clone()) {
        desired["metadata"]["resourceVersion"] = json!(version);
    }
    let (outcome, written) = apply::apply_over_returning(api, desired, ownership, live).await?;
    Ok((outcome, written.and_then(|w| w.meta().resource_version.clone())))
}

/// The apiserver refuses new objects in a namespace that is being deleted (NamespaceLifecycle admission).
fn terminating(error: &ApplyError) -> bool {
    let ApplyError::Kube { source: kube::Error::Api(status), .. } = error else { return false };
    status.code == 403
        && status.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
}

/// Named target namespaces found to be terminating (from a refused create), skipped until probed again.
/// Selector targets need no memory: the Namespace watch says which are being deleted.
#[derive(Default, Clone)]
struct Terminating(Arc<Mutex<BTreeMap<String, std::time::Instant>>>);

/// How long a namespace found terminating is skipped before one write is tried again (it may have been
/// deleted and created anew).
const TERMINATING_REPROBE: Duration = Duration::from_secs(600);

impl Terminating {
    fn skip(&self, namespace: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(namespace.to_string(), std::time::Instant::now());
    }

    fn is_skipped(&self, namespace: &str) -> bool {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(namespace) {
            Some(since) if since.elapsed() < TERMINATING_REPROBE => true,
            Some(_) => {
                map.remove(namespace);
                false
            }
            None => false,
        }
    }
}

/// One target's part of a cycle, planned before anything is written.
struct TargetPlan<'a> {
    target: &'a Resolved,
    /// The object as this pass saw it: what is compared with, and the version the write is held to.
    observed: Observed,
    /// What it is written, shared with every target of the pass that holds the same content.
    planned: Arc<Planned>,
    /// The trust stores (`additionalFormats`): data key and bytes.
    stores: Vec<(String, Arc<Vec<u8>>)>,
    /// The store is behind our last write of the target, and this plan arrives at the object that write sent:
    /// nothing to write ([`crate::observed`]).
    settled: bool,
    /// Settled on a create the store does not show yet: look again by then ([`crate::observed::View::recheck`]).
    recheck: Option<OffsetDateTime>,
}

/// What a target is written, decided from what it holds now ([`Syncer::planned`]): the same for every target
/// holding the same content, so a pass over thousands of targets holding one bundle plans (and keeps) it once.
#[derive(Default)]
struct Planned {
    pem: String,
    /// The cache annotation: what the target holds, for people reading it. Never read back.
    cache: String,
    bundle: Option<(Built, Option<OffsetDateTime>)>,
    retention: Option<RetentionPlan>,
}

impl TargetPlan<'_> {
    fn fingerprints(&self) -> impl Iterator<Item = Fingerprint> + '_ {
        self.planned.bundle.iter().flat_map(|(b, _)| b.fingerprints())
    }

    /// Certificates found in the target that the bundle's sources never held (hand-edited in).
    fn foreign_removed(&self) -> usize {
        self.planned
            .retention
            .iter()
            .flat_map(|r| &r.dropped)
            .filter(|d| d.reason == DropReason::NotPublishedByUs)
            .count()
    }
}

/// The object a write of `plan`'s target sends ([`desired_object`]), with its labels and annotations decided
/// against the object as the plan saw it.
fn desired<'a>(plan: &TargetPlan<'a>) -> (serde_json::Value, Decided<'a>) {
    let target = plan.target;
    let metadata = target_metadata::decide(&target.config.metadata, plan.observed.meta());
    let content = Content { pem: &plan.planned.pem, stores: &plan.stores };
    (desired_object(target, &content, &plan.planned.cache, !plan.observed.exists(), &metadata), metadata)
}

/// What a target's keys hold: the PEM bundle, and each trust store by its key.
struct Content<'a> {
    pem: &'a str,
    stores: &'a [(String, Arc<Vec<u8>>)],
}

/// The fields ca-syncer owns in a target: the key (and the trust stores' keys), the cache annotation of what it
/// holds, and the configured labels and annotations it may set ([`target_metadata`]). The Secret type is set only
/// on creation: it is immutable, and an adopted Secret keeps its own.
fn desired_object(
    target: &Resolved,
    content: &Content<'_>,
    state: &str,
    creating: bool,
    extra: &Decided<'_>,
) -> serde_json::Value {
    let pem = content.pem;
    let stores: serde_json::Map<String, serde_json::Value> =
        content.stores.iter().map(|(key, bytes)| (key.clone(), json!(B64.encode(bytes.as_slice())))).collect();
    let mut annotations = extra.annotations.clone();
    if !state.is_empty() {
        annotations.insert(STATE_ANNOTATION, state);
    }
    let mut metadata = json!({"name": target.config.name, "namespace": target.namespace, "annotations": annotations});
    if !extra.labels.is_empty() {
        metadata["labels"] = json!(extra.labels);
    }
    match target.config.kind {
        TargetKind::Secret => {
            let mut data = stores;
            data.insert(target.config.key.clone(), json!(B64.encode(pem)));
            let mut secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "data": data});
            if creating {
                secret["type"] = json!("Opaque");
            }
            secret
        }
        TargetKind::ConfigMap => {
            let mut config_map = json!({
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
                "data": {target.config.key.as_str(): pem},
            });
            // Binary keys go in binaryData, as trust-manager writes them.
            if !stores.is_empty() {
                config_map["binaryData"] = serde_json::Value::Object(stores);
            }
            config_map
        }
        TargetKind::ClusterTrustBundle => {
            if let Some(meta) = metadata.as_object_mut() {
                meta.remove("namespace");
            }
            let mut spec = json!({"trustBundle": pem});
            if let Some(signer) = &target.config.signer_name {
                spec["signerName"] = json!(signer);
            }
            json!({"apiVersion": "certificates.k8s.io/v1", "kind": "ClusterTrustBundle", "metadata": metadata, "spec": spec})
        }
    }
}

fn min_time(a: Option<OffsetDateTime>, b: Option<OffsetDateTime>) -> Option<OffsetDateTime> {
    a.into_iter().chain(b).min()
}
