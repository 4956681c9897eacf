//! The agent loop: read each bundle's sources, check them, build the bundle per target (keeping rotated-out CAs
//! until they expire), verify it against the live endpoint, and write only what changed.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kcp_keeper_runtime::agent::{self, AgentInfo, Context};
use kcp_keeper_runtime::apply::{self, ApplyError, Outcome, Ownership};
use kcp_keeper_runtime::args::{KubeArgs, RunArgs};
use kcp_keeper_runtime::events::{EventType, reference};
use kcp_keeper_runtime::metrics::unix_now;
use kcp_keeper_runtime::watch::changes;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use serde_json::json;
use time::OffsetDateTime;

use crate::bundle::{Bundle, BundleOptions};
use crate::certs::{Certificate, EmptyPolicy, parse_certificates};
use crate::config::{BundleSpec, Config, Placement, TargetKind};
use crate::metrics::{BundleLabel, CertLabels, Metrics, ReasonLabels, TargetLabels};
use crate::rotation::{RotationState, STATE_ANNOTATION, plan_retention};
use crate::{live_check, sources};

pub const INFO: AgentInfo = AgentInfo { name: "ca-syncer", metrics_prefix: "ca_syncer" };

/// Re-check everything at least this often: file sources have no watch, and clocks move certificates out.
const RESYNC: Duration = Duration::from_secs(60);
/// Changes arrive in bursts (a Secret and its namespace, a rotation touching two keys); sync once after.
const DEBOUNCE: Duration = Duration::from_millis(300);

/// `ca-syncer run`.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    agent::run(INFO, args, Metrics::register, |ctx: Context<Config>, metrics| async move {
        Syncer { ctx, metrics }.run().await
    })
    .await
}

/// `ca-syncer render`: each bundle as it would be written now (sources only; retention needs the live target).
pub async fn render(config_path: &Path, kube: &KubeArgs) -> anyhow::Result<()> {
    let config: Config = kcp_keeper_runtime::config::load(config_path)?;
    let needs_client =
        config.bundles.iter().flat_map(|b| &b.sources).any(|s| s.secret.is_some() || s.config_map.is_some());
    let client = if needs_client { Some(kube.client().await?) } else { None };
    let now = OffsetDateTime::now_utc();
    let mut failed = false;
    for spec in &config.bundles {
        match read_sources(client.as_ref(), spec).await {
            Ok(certs) => {
                let bundle = Bundle::build(certs, &BundleOptions { drop_expired: spec.drop_expired, now });
                println!("# bundle {}: {} certificates", spec.name, bundle.len());
                for summary in bundle.summaries() {
                    println!("#   {summary}");
                }
                print!("{}", bundle.render());
            }
            Err((i, e)) => {
                println!("# bundle {}: not rendered: sources[{i}]: {e}", spec.name);
                failed = true;
            }
        }
    }
    anyhow::ensure!(!failed, "some bundles could not be rendered");
    Ok(())
}

/// Reads every source of a bundle; the first failure (with its index) stops it.
async fn read_sources(
    client: Option<&kube::Client>,
    spec: &BundleSpec,
) -> Result<Vec<Certificate>, (usize, sources::SourceFailure)> {
    let empty = if spec.empty_means_public_roots { EmptyPolicy::Allow } else { EmptyPolicy::Reject };
    let mut certs = Vec::new();
    for (i, source) in spec.sources.iter().enumerate() {
        // Validation guarantees exactly one kind per source.
        let Some(kind) = source.kind() else { continue };
        certs.extend(sources::read(client, &kind, empty).await.map_err(|e| (i, e))?);
    }
    Ok(certs)
}

struct Syncer {
    ctx: Context<Config>,
    metrics: Metrics,
}

/// One object a target resolves to.
struct Target {
    kind: TargetKind,
    namespace: String,
    name: String,
    key: String,
    adopt: bool,
}

impl Syncer {
    async fn run(mut self) -> anyhow::Result<()> {
        let client = self.ctx.client.clone();
        let mut changes = futures::stream::select_all([
            changes(Api::<PartialObjectMeta<Secret>>::all(client.clone()), Default::default()).boxed(),
            changes(Api::<PartialObjectMeta<ConfigMap>>::all(client.clone()), Default::default()).boxed(),
            changes(Api::<PartialObjectMeta<Namespace>>::all(client), Default::default()).boxed(),
        ]);
        let mut leader = self.ctx.leadership.subscribe();
        // A fresh single replica wins the election within moments: give it that chance, so its first cycle
        // (the one readiness waits for) is a real sync and not a follower's pass.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.ctx.leadership.clone().wait_until_leader()).await;
        let mut next = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = self.ctx.shutdown.cancelled() => return Ok(()),
                Some(()) = changes.next() => tokio::time::sleep(DEBOUNCE).await,
                Ok(()) = self.ctx.config.changed() => {}
                Ok(()) = leader.changed() => {}
                _ = tokio::time::sleep_until(next) => {}
            }
            // Drain what arrived while sleeping: one sync covers it.
            while let Some(Some(())) = changes.next().now_or_never() {}
            if !self.ctx.leadership.is_leader() {
                // Followers watch so they can take over warm; they are ready once the watches answer.
                self.ctx.health.mark_synced();
                next = tokio::time::Instant::now() + RESYNC;
                continue;
            }
            let config = self.ctx.config.borrow_and_update().clone();
            // A cycle in flight is abandoned on shutdown or a lost lease: every write is an idempotent apply,
            // and a leader must not keep writing once it may no longer hold the lease.
            let review = tokio::select! {
                _ = self.ctx.shutdown.cancelled() => return Ok(()),
                review = self.sync_all(&config) => review,
            };
            let wait = review.unwrap_or(RESYNC).min(RESYNC);
            next = tokio::time::Instant::now() + wait;
        }
    }

    /// Syncs every bundle; returns how soon something changes on its own (a retained CA due to leave).
    async fn sync_all(&self, config: &Config) -> Option<Duration> {
        let now = OffsetDateTime::now_utc();
        // Rebuilt each cycle so certificates and targets that are gone leave the metrics too.
        self.metrics.not_after.clear();
        self.metrics.target_in_sync.clear();
        let mut review: Option<OffsetDateTime> = None;
        let mut all_ok = true;
        for spec in &config.bundles {
            match self.sync_bundle(spec, now).await {
                Ok(at) => review = min_time(review, at),
                Err(()) => all_ok = false,
            }
        }
        if all_ok {
            self.ctx.health.mark_synced();
        }
        review.map(|at| Duration::try_from(at - now).unwrap_or(Duration::ZERO) + Duration::from_secs(1))
    }

    async fn sync_bundle(&self, spec: &BundleSpec, now: OffsetDateTime) -> Result<Option<OffsetDateTime>, ()> {
        let bundle_label = || BundleLabel { bundle: spec.name.clone() };
        let current = match read_sources(Some(&self.ctx.client), spec).await {
            Ok(certs) => certs,
            Err((i, e)) => {
                // Targets keep their last good content: nothing is written for this bundle.
                let reason = e.metric_label();
                self.metrics
                    .source_errors
                    .get_or_create(&ReasonLabels { bundle: spec.name.clone(), reason: reason.into() })
                    .inc();
                tracing::warn!(bundle = %spec.name, source = i, error = %e, "source rejected; targets keep their last good bundle");
                if let Some(kind) = spec.sources[i].kind()
                    && let Some((object_kind, r)) = sources::SourceFailure::object(&kind)
                {
                    let regarding = reference("v1", object_kind, &r.namespace, &r.name, None);
                    let note = format!("bundle {}: sources[{i}] ({}) not used: {e}", spec.name, r.key);
                    self.ctx.events.publish(&regarding, EventType::Warning, "SourceRejected", "Sync", &note).await;
                }
                return Err(());
            }
        };
        let targets = match self.resolve_targets(spec).await {
            Ok(targets) => targets,
            Err(e) => {
                tracing::warn!(bundle = %spec.name, error = %e, "could not list target namespaces");
                return Err(());
            }
        };
        if let Some(check) = &spec.live_check {
            // An empty bundle means "public roots" to its consumers: then the public roots must verify.
            let roots = if current.is_empty() { sources::public_roots() } else { current.clone() };
            if let Err(e) = live_check::verify(check, &roots).await {
                let reason = e.metric_label();
                self.metrics
                    .live_check_failures
                    .get_or_create(&ReasonLabels { bundle: spec.name.clone(), reason: reason.into() })
                    .inc();
                tracing::warn!(bundle = %spec.name, error = %e, "live check failed; bundle not published");
                for t in &targets {
                    let note = format!("bundle {} not published: live check failed: {e}", spec.name);
                    self.event(t, EventType::Warning, "LiveCheckFailed", &note).await;
                }
                return Err(());
            }
        }
        self.metrics.certificates.get_or_create(&bundle_label()).set(current.len() as i64);
        let mut review = None;
        let mut ok = true;
        for target in &targets {
            match self.sync_target(spec, &current, target, now).await {
                Ok(at) => review = min_time(review, at),
                Err(()) => ok = false,
            }
        }
        if ok {
            self.metrics.last_sync.get_or_create(&bundle_label()).set(unix_now());
            Ok(review)
        } else {
            Err(())
        }
    }

    async fn resolve_targets(&self, spec: &BundleSpec) -> Result<Vec<Target>, kube::Error> {
        let mut out = Vec::new();
        for target in &spec.targets {
            let Some((kind, object)) = target.kind() else { continue };
            let namespaces = match object.placement() {
                Some(Placement::Namespace(ns)) => vec![ns.to_string()],
                Some(Placement::Selector(selector)) => {
                    let labels =
                        selector.match_labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
                    let list = Api::<Namespace>::all(self.ctx.client.clone())
                        .list(&ListParams::default().labels(&labels))
                        .await?;
                    list.items
                        .into_iter()
                        // A terminating namespace refuses new objects; skip it rather than fail the bundle.
                        .filter(|ns| ns.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Terminating"))
                        .filter_map(|ns| ns.metadata.name)
                        .collect()
                }
                None => continue,
            };
            for namespace in namespaces {
                out.push(Target {
                    kind,
                    namespace,
                    name: object.name.clone(),
                    key: object.key.clone(),
                    adopt: target.adopt,
                });
            }
        }
        Ok(out)
    }

    async fn sync_target(
        &self,
        spec: &BundleSpec,
        current: &[Certificate],
        target: &Target,
        now: OffsetDateTime,
    ) -> Result<Option<OffsetDateTime>, ()> {
        let labels = TargetLabels {
            bundle: spec.name.clone(),
            kind: kind_name(target.kind).into(),
            namespace: target.namespace.clone(),
            name: target.name.clone(),
        };
        let in_sync = self.metrics.target_in_sync.get_or_create(&labels).clone();
        in_sync.set(0);
        let live = match self.read_target(target).await {
            Ok(live) => live,
            Err(e) => {
                tracing::warn!(bundle = %spec.name, namespace = %target.namespace, name = %target.name, error = %e, "reading target");
                return Err(());
            }
        };
        let (pem, state, bundle) = if current.is_empty() {
            // Empty-means-public mode, verified above: the key is written empty, with nothing retained, because
            // a consumer holding any CA would stop trusting the public roots.
            (String::new(), String::new(), None)
        } else {
            let previous_text = live.as_ref().and_then(|l| l.data.clone()).unwrap_or_default();
            // A target we cannot parse is simply replaced; nothing from it is retained.
            let previous = parse_certificates(&previous_text, EmptyPolicy::Allow).unwrap_or_default();
            let decoded = RotationState::decode(live.as_ref().and_then(|l| l.state.as_deref()).unwrap_or_default());
            let grace = spec.rotation_grace().ok().flatten();
            let plan = plan_retention(current, &previous, &decoded.state, now, grace);
            let bundle =
                Bundle::build(plan.certificates.clone(), &BundleOptions { drop_expired: spec.drop_expired, now });
            let state = match plan.state_for(&bundle).encode() {
                Ok(state) => state,
                Err(e) => {
                    tracing::warn!(bundle = %spec.name, error = %e, "rotation state too large; not written");
                    return Err(());
                }
            };
            let review = min_time(plan.next_review_at(), bundle.earliest_not_after().filter(|_| spec.drop_expired));
            (bundle.render(), state, Some((bundle, review)))
        };
        let desired = desired_object(target, &pem, &state, live.is_none());
        let outcome = match target.kind {
            TargetKind::Secret => {
                let api = Api::<Secret>::namespaced(self.ctx.client.clone(), &target.namespace);
                apply::apply(&api, desired, Ownership::Owned { adopt: target.adopt }).await
            }
            TargetKind::ConfigMap => {
                let api = Api::<ConfigMap>::namespaced(self.ctx.client.clone(), &target.namespace);
                apply::apply(&api, desired, Ownership::Owned { adopt: target.adopt }).await
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
                self.event(target, EventType::Warning, reason, &format!("bundle {}: {e}", spec.name)).await;
                return Err(());
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
        }
        Ok(review)
    }

    /// The target's current key content and rotation state, if it exists.
    async fn read_target(&self, target: &Target) -> Result<Option<LiveTarget>, kube::Error> {
        let client = self.ctx.client.clone();
        Ok(match target.kind {
            TargetKind::Secret => {
                Api::<Secret>::namespaced(client, &target.namespace).get_opt(&target.name).await?.map(|s| LiveTarget {
                    data: s.data.and_then(|mut d| d.remove(&target.key)).map(|v| v.0),
                    state: s.metadata.annotations.and_then(|mut a| a.remove(STATE_ANNOTATION)),
                })
            }
            TargetKind::ConfigMap => Api::<ConfigMap>::namespaced(client, &target.namespace)
                .get_opt(&target.name)
                .await?
                .map(|c| LiveTarget {
                    data: c.data.and_then(|mut d| d.remove(&target.key)).map(String::into_bytes),
                    state: c.metadata.annotations.and_then(|mut a| a.remove(STATE_ANNOTATION)),
                }),
        })
    }

    async fn event(&self, target: &Target, kind: EventType, reason: &str, note: &str) {
        let regarding = reference("v1", kind_name(target.kind), &target.namespace, &target.name, None);
        self.ctx.events.publish(&regarding, kind, reason, "Sync", note).await;
    }
}

struct LiveTarget {
    data: Option<Vec<u8>>,
    state: Option<String>,
}

fn kind_name(kind: TargetKind) -> &'static str {
    match kind {
        TargetKind::Secret => "Secret",
        TargetKind::ConfigMap => "ConfigMap",
    }
}

/// The fields ca-syncer owns in a target: the key and the rotation state. The Secret type is set only on
/// creation: it is immutable, and an adopted Secret keeps its own.
fn desired_object(target: &Target, pem: &str, state: &str, creating: bool) -> serde_json::Value {
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
