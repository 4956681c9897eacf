//! The agent: one reconcile per bundle, driven by the runtime's driver over watches scoped by the
//! configuration ([`crate::scope`]). A reconcile reads the bundle's sources from the stores, checks them,
//! builds the bundle per target (keeping rotated-out CAs until they expire), verifies it against the live
//! endpoint, and writes only what changed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kcp_keeper_runtime::agent::{self, AgentInfo, Context};
use kcp_keeper_runtime::apply::{self, ApplyError, Outcome, Ownership};
use kcp_keeper_runtime::args::{KubeArgs, RunArgs};
use kcp_keeper_runtime::driver::{self, Reconciler, Settings};
use kcp_keeper_runtime::events::{EventType, Recorder, reference};
use kcp_keeper_runtime::metrics::unix_now;
use kube::api::Api;
use serde_json::json;
use time::OffsetDateTime;

use crate::bundle::{Bundle as Built, BundleOptions};
use crate::certs::{Certificate, EmptyPolicy, parse_certificates};
use crate::config::{Bundle, Config, Placement, TargetKind};
use crate::live_check::LiveCheckError;
use crate::metrics::{BundleLabel, CertLabels, Metrics, ReasonLabels, TargetLabels};
use crate::rotation::{RotationState, STATE_ANNOTATION, plan_retention};
use crate::scope::Scope;
use crate::sources::{self, Reader, SourceFailure};
use crate::{live_check, rbac};

pub const INFO: AgentInfo = AgentInfo { name: "ca-syncer", metrics_prefix: "ca_syncer" };

/// Why a bundle's reconcile failed; `ca_syncer_reconcile_errors_total{reason}` is the variant's name.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum SyncError {
    /// A source is missing or was rejected: nothing is written, targets keep their last good bundle.
    #[error("sources[{index}] not used: {failure}")]
    SourceUnusable { index: usize, failure: SourceFailure },
    #[error("live check failed: {0}")]
    LiveCheckFailed(LiveCheckError),
    #[error("{failed} of {total} targets not written; first: {first}")]
    TargetNotOwned { failed: usize, total: usize, first: ApplyError },
    #[error("{failed} of {total} targets not written; first: {first}")]
    TargetWriteFailed { failed: usize, total: usize, first: ApplyError },
    #[error("rotation state too large to record; not written")]
    RotationStateTooLarge,
}

/// `ca-syncer run`.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    agent::run(INFO, args, Metrics::register, |ctx: Context<Config>, metrics: Metrics| async move {
        // The configured resyncInterval comes back as each reconcile's requeue time, so a reloaded value
        // applies at once; the driver's own resync is only a backstop.
        let settings = Settings { resync: Duration::from_secs(3600), ..Settings::default() };
        let reconcile = metrics.reconcile.clone();
        let (client, events) = (ctx.client.clone(), ctx.events.clone());
        let published = Arc::new(Mutex::new(BTreeMap::new()));
        driver::run(&ctx, &reconcile, settings, |config: Arc<Config>| {
            let (scope, watches) = Scope::build(&client, &config);
            let syncer = Syncer {
                client: client.clone(),
                events: events.clone(),
                metrics: metrics.clone(),
                config,
                scope,
                published: published.clone(),
            };
            (syncer, watches)
        })
        .await;
        Ok(())
    })
    .await
}

/// `ca-syncer render`: each bundle as it would be written now (sources only; retention needs the live target).
pub async fn render(config_path: &Path, kube: &KubeArgs) -> anyhow::Result<()> {
    let config: Config = kcp_keeper_runtime::config::load(config_path)?;
    let needs_client = config
        .bundles
        .iter()
        .flat_map(|b| &b.sources)
        .any(|s| matches!(s, crate::config::Source::Secret(_) | crate::config::Source::ConfigMap(_)));
    let client = if needs_client { Some(kube.client().await?) } else { None };
    let reader = Reader::Client(client.as_ref());
    let now = OffsetDateTime::now_utc();
    let mut failed = false;
    for bundle in &config.bundles {
        match read_sources(&reader, bundle).await {
            Ok(certs) => {
                let built = Built::build(certs, &BundleOptions { drop_expired: bundle.drop_expired, now });
                println!("# bundle {}: {} certificates", bundle.name, built.len());
                for summary in built.summaries() {
                    println!("#   {summary}");
                }
                print!("{}", built.render());
            }
            Err((i, e)) => {
                println!("# bundle {}: not rendered: sources[{i}]: {e}", bundle.name);
                failed = true;
            }
        }
    }
    anyhow::ensure!(!failed, "some bundles could not be rendered");
    Ok(())
}

/// `ca-syncer rbac`: the Roles the configuration needs, as YAML.
pub fn print_rbac(config_path: &Path, who: &rbac::Subjects) -> anyhow::Result<()> {
    let config: Config = kcp_keeper_runtime::config::load(config_path)?;
    print!("{}", rbac::render(&config, who).to_yaml()?);
    Ok(())
}

/// Reads every source of a bundle; the first failure (with its index) stops it.
async fn read_sources(reader: &Reader<'_>, bundle: &Bundle) -> Result<Vec<Certificate>, (usize, SourceFailure)> {
    let empty = if bundle.empty_means_public_roots { EmptyPolicy::Allow } else { EmptyPolicy::Reject };
    let mut certs = Vec::new();
    for (i, source) in bundle.sources.iter().enumerate() {
        certs.extend(sources::read(reader, source, empty).await.map_err(|e| (i, e))?);
    }
    Ok(certs)
}

/// A bundle, as the driver names it in spans and logs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct BundleName(String);

impl fmt::Display for BundleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bundle/{}", self.0)
    }
}

/// The series a bundle set last time it synced, so those that no longer apply (a target gone from the
/// configuration, a certificate dropped) are removed rather than left stale.
#[derive(Default)]
struct Published {
    certs: BTreeSet<CertLabels>,
    targets: BTreeSet<TargetLabels>,
}

struct Syncer {
    client: kube::Client,
    events: Arc<Recorder>,
    metrics: Metrics,
    config: Arc<Config>,
    scope: Scope,
    published: Arc<Mutex<BTreeMap<String, Published>>>,
}

/// One object a target resolves to.
struct Resolved {
    kind: TargetKind,
    namespace: String,
    name: String,
    key: String,
    adopt: bool,
}

impl Reconciler for Syncer {
    type Item = BundleName;
    type Error = SyncError;

    fn items(&self) -> Vec<BundleName> {
        self.config.bundles.iter().map(|b| BundleName(b.name.clone())).collect()
    }

    async fn reconcile(&self, item: &BundleName) -> Result<Option<Duration>, SyncError> {
        let Some(bundle) = self.config.bundles.iter().find(|b| b.name == item.0) else { return Ok(None) };
        let now = OffsetDateTime::now_utc();
        let review = self.sync_bundle(bundle, now).await?;
        let resync = self.config.resync_interval;
        let due = review.map(|at| Duration::try_from(at - now).unwrap_or(Duration::ZERO) + Duration::from_secs(1));
        Ok(Some(due.map_or(resync, |due| due.min(resync))))
    }
}

impl Syncer {
    async fn sync_bundle(&self, spec: &Bundle, now: OffsetDateTime) -> Result<Option<OffsetDateTime>, SyncError> {
        let bundle_label = || BundleLabel { bundle: spec.name.clone() };
        let current = match read_sources(&Reader::Stores(&self.scope), spec).await {
            Ok(certs) => certs,
            Err((index, failure)) => {
                // Targets keep their last good content: nothing is written for this bundle.
                self.metrics
                    .source_errors
                    .get_or_create(&ReasonLabels { bundle: spec.name.clone(), reason: failure.metric_label().into() })
                    .inc();
                if let Some((object_kind, r)) = SourceFailure::object(&spec.sources[index]) {
                    let regarding = reference("v1", object_kind, &r.namespace, &r.name, None);
                    let note = format!("bundle {}: sources[{index}] ({}) not used: {failure}", spec.name, r.key);
                    self.events.publish(&regarding, EventType::Warning, "SourceRejected", "Sync", &note).await;
                }
                return Err(SyncError::SourceUnusable { index, failure });
            }
        };
        let targets = self.resolve_targets(spec);
        if let Some(check) = &spec.live_check {
            // An empty bundle means "public roots" to its consumers: then the public roots must verify.
            let roots = if current.is_empty() { sources::public_roots() } else { current.clone() };
            if let Err(e) = live_check::verify(check, &roots).await {
                use kcp_keeper_runtime::driver::ErrorReason;
                self.metrics
                    .live_check_failures
                    .get_or_create(&ReasonLabels { bundle: spec.name.clone(), reason: e.reason().into() })
                    .inc();
                for t in &targets {
                    let note = format!("bundle {} not published: live check failed: {e}", spec.name);
                    self.event(t, EventType::Warning, "LiveCheckFailed", &note).await;
                }
                return Err(SyncError::LiveCheckFailed(e));
            }
        }
        self.metrics.certificates.get_or_create(&bundle_label()).set(current.len() as i64);
        let mut review = None;
        let mut published = Published::default();
        let mut failures: Vec<ApplyError> = Vec::new();
        for target in &targets {
            match self.sync_target(spec, &current, target, now, &mut published).await {
                Ok(at) => review = min_time(review, at),
                Err(TargetError::StateTooLarge) => return Err(SyncError::RotationStateTooLarge),
                Err(TargetError::Apply(e)) => failures.push(e),
            }
        }
        self.forget_stale(&spec.name, published);
        let total = targets.len();
        let failed = failures.len();
        let mut failures = failures.into_iter();
        match failures.next() {
            None => {
                self.metrics.last_sync.get_or_create(&bundle_label()).set(unix_now());
                Ok(review)
            }
            Some(first @ (ApplyError::Foreign { .. } | ApplyError::ForeignKey { .. })) => {
                Err(SyncError::TargetNotOwned { failed, total, first })
            }
            Some(first) => Err(SyncError::TargetWriteFailed { failed, total, first }),
        }
    }

    /// Removes the series this bundle set last time and not this time.
    fn forget_stale(&self, bundle: &str, now: Published) {
        let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(before) = published.get(bundle) {
            for gone in before.certs.difference(&now.certs) {
                self.metrics.not_after.remove(gone);
            }
            for gone in before.targets.difference(&now.targets) {
                self.metrics.target_in_sync.remove(gone);
            }
        }
        published.insert(bundle.to_string(), now);
    }

    fn resolve_targets(&self, spec: &Bundle) -> Vec<Resolved> {
        let mut out = Vec::new();
        for target in &spec.targets {
            let namespaces = match &target.placement {
                Placement::Namespace(ns) => vec![ns.clone()],
                Placement::Selector(labels) => self.scope.namespaces(labels),
            };
            for namespace in namespaces {
                out.push(Resolved {
                    kind: target.kind,
                    namespace,
                    name: target.name.clone(),
                    key: target.key.clone(),
                    adopt: target.adopt,
                });
            }
        }
        out
    }

    async fn sync_target(
        &self,
        spec: &Bundle,
        current: &[Certificate],
        target: &Resolved,
        now: OffsetDateTime,
        published: &mut Published,
    ) -> Result<Option<OffsetDateTime>, TargetError> {
        let labels = TargetLabels {
            bundle: spec.name.clone(),
            kind: target.kind.as_str().into(),
            namespace: target.namespace.clone(),
            name: target.name.clone(),
        };
        published.targets.insert(labels.clone());
        // A new series starts at 0; an existing one keeps its value until this pass knows better, so a target
        // that stays in sync never reads 0 mid-pass (an alert or a reader would see a flap).
        let in_sync = self.metrics.target_in_sync.get_or_create(&labels).clone();
        let live = self.read_target(target);
        let (pem, state, bundle) = if current.is_empty() {
            // Empty-means-public mode, verified above: the key is written empty, with nothing retained, because
            // a consumer holding any CA would stop trusting the public roots.
            (String::new(), String::new(), None)
        } else {
            let previous_text = live.as_ref().and_then(|l| l.data.clone()).unwrap_or_default();
            // A target we cannot parse is simply replaced; nothing from it is retained.
            let previous = parse_certificates(&previous_text, EmptyPolicy::Allow).unwrap_or_default();
            let decoded = RotationState::decode(live.as_ref().and_then(|l| l.state.as_deref()).unwrap_or_default());
            let plan = plan_retention(current, &previous, &decoded.state, now, spec.rotation_grace);
            let bundle =
                Built::build(plan.certificates.clone(), &BundleOptions { drop_expired: spec.drop_expired, now });
            let state = match plan.state_for(&bundle).encode() {
                Ok(state) => state,
                Err(e) => {
                    tracing::warn!(bundle = %spec.name, error = %e, "rotation state too large; not written");
                    in_sync.set(0);
                    return Err(TargetError::StateTooLarge);
                }
            };
            let review = min_time(plan.next_review_at(), bundle.earliest_not_after().filter(|_| spec.drop_expired));
            (bundle.render(), state, Some((bundle, review)))
        };
        let desired = desired_object(target, &pem, &state, live.is_none());
        let ownership = Ownership::Owned { adopt: target.adopt };
        let outcome = match target.kind {
            TargetKind::Secret => {
                let api = Api::<Secret>::namespaced(self.client.clone(), &target.namespace);
                let live = self.scope.secret(&target.namespace, &target.name);
                apply::apply_over(&api, desired, ownership, live.as_deref()).await
            }
            TargetKind::ConfigMap => {
                let api = Api::<ConfigMap>::namespaced(self.client.clone(), &target.namespace);
                let live = self.scope.config_map(&target.namespace, &target.name);
                apply::apply_over(&api, desired, ownership, live.as_deref()).await
            }
        };
        let count = bundle.as_ref().map_or(0, |(b, _)| b.len());
        match outcome {
            Ok(Outcome::Unchanged) => {}
            Ok(outcome) => {
                self.metrics.writes.get_or_create(&BundleLabel { bundle: spec.name.clone() }).inc();
                let verb = if outcome == Outcome::Created { "created" } else { "updated" };
                let note = format!("bundle {}: {verb} key {} with {count} certificates", spec.name, target.key);
                tracing::info!(bundle = %spec.name, namespace = %target.namespace, name = %target.name, certificates = count, "{verb}");
                self.event(target, EventType::Normal, "Published", &note).await;
            }
            Err(e) => {
                let reason = if matches!(e, ApplyError::Foreign { .. } | ApplyError::ForeignKey { .. }) {
                    "NotOwned"
                } else {
                    "WriteFailed"
                };
                tracing::warn!(bundle = %spec.name, namespace = %target.namespace, name = %target.name, error = %e, "target not written");
                in_sync.set(0);
                self.event(target, EventType::Warning, reason, &format!("bundle {}: {e}", spec.name)).await;
                return Err(TargetError::Apply(e));
            }
        }
        in_sync.set(1);
        let Some((bundle, review)) = bundle else { return Ok(None) };
        for cert in bundle.certificates() {
            let labels = CertLabels {
                bundle: spec.name.clone(),
                subject: cert.subject().to_string(),
                sha256: cert.fingerprint().to_string()[..16].to_string(),
            };
            self.metrics.not_after.get_or_create(&labels).set(cert.not_after().unix_timestamp() as f64);
            published.certs.insert(labels);
        }
        Ok(review)
    }

    /// The target's current key content and rotation state, from the store, if it exists.
    fn read_target(&self, target: &Resolved) -> Option<LiveTarget> {
        match target.kind {
            TargetKind::Secret => self.scope.secret(&target.namespace, &target.name).map(|s| LiveTarget {
                data: s.data.as_ref().and_then(|d| d.get(&target.key)).map(|v| v.0.clone()),
                state: s.metadata.annotations.as_ref().and_then(|a| a.get(STATE_ANNOTATION)).cloned(),
            }),
            TargetKind::ConfigMap => self.scope.config_map(&target.namespace, &target.name).map(|c| LiveTarget {
                data: c.data.as_ref().and_then(|d| d.get(&target.key)).map(|v| v.clone().into_bytes()),
                state: c.metadata.annotations.as_ref().and_then(|a| a.get(STATE_ANNOTATION)).cloned(),
            }),
        }
    }

    async fn event(&self, target: &Resolved, kind: EventType, reason: &str, note: &str) {
        let regarding = reference("v1", target.kind.as_str(), &target.namespace, &target.name, None);
        self.events.publish(&regarding, kind, reason, "Sync", note).await;
    }
}

enum TargetError {
    Apply(ApplyError),
    StateTooLarge,
}

struct LiveTarget {
    data: Option<Vec<u8>>,
    state: Option<String>,
}

/// The fields ca-syncer owns in a target: the key and the rotation state. The Secret type is set only on
/// creation: it is immutable, and an adopted Secret keeps its own.
fn desired_object(target: &Resolved, pem: &str, state: &str, creating: bool) -> serde_json::Value {
    let annotations: BTreeMap<&str, &str> =
        if state.is_empty() { BTreeMap::new() } else { BTreeMap::from([(STATE_ANNOTATION, state)]) };
    let metadata = json!({"name": target.name, "namespace": target.namespace, "annotations": annotations});
    match target.kind {
        TargetKind::Secret => {
            let mut secret = json!({
                "apiVersion": "v1", "kind": "Secret", "metadata": metadata,
                "data": {target.key.as_str(): B64.encode(pem)},
            });
            if creating {
                secret["type"] = json!("Opaque");
            }
            secret
        }
        TargetKind::ConfigMap => json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
            "data": {target.key.as_str(): pem},
        }),
    }
}

fn min_time(a: Option<OffsetDateTime>, b: Option<OffsetDateTime>) -> Option<OffsetDateTime> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
