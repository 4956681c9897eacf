//! The agent: one reconcile per configured kubeconfig, run by the runtime's driver over watches scoped by the
//! configuration ([`crate::scope`]). A reconcile follows the source (for a kcp-operator `Kubeconfig`: its
//! Certificate, the certificate Secret, the rendered Secret), nudges a stale render, forces a renewal that is
//! overdue, checks and proves the candidate, and publishes it to every target that holds nothing better.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kcp_keeper_runtime::agent::{self, AgentInfo, Context};
use kcp_keeper_runtime::apply::{self, ApplyError, Outcome, Ownership};
use kcp_keeper_runtime::args::RunArgs;
use kcp_keeper_runtime::driver::{self, ErrorReason, Reconciler, Settings};
use kcp_keeper_runtime::events::{EventType, Recorder, reference};
use kcp_keeper_runtime::metrics::unix_now;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use time::OffsetDateTime;

use crate::config::{Config, KUBECONFIG_KEY, Kubeconfig, Source, Target, certificate_name};
use crate::credential::{self, CertInfo, Credential, CredentialError, rfc3339};
use crate::metrics::{KubeconfigLabel, Metrics, TargetLabels};
use crate::objects::{Certificate, KubeconfigObject, RENDER_REQUESTED};
use crate::policy::{self, Expected, Live, TargetAction};
use crate::prove::{self, ProofError};
use crate::scope::{Reader, Snapshot, Stores, secret_key};

pub const INFO: AgentInfo = AgentInfo { name: "kubeconfig-rotator", metrics_prefix: "kubeconfig_rotator" };

/// Annotations on a target Secret: what it holds, for people and for `status`.
pub const SERIAL_ANNOTATION: &str = "kcp-keeper.io/serial";
pub const NOT_AFTER_ANNOTATION: &str = "kcp-keeper.io/not-after";
pub const HASH_ANNOTATION: &str = "kcp-keeper.io/content-hash";
/// Pod-template annotation on a read-once consumer, `<prefix><kubeconfig>` = the content hash it was restarted
/// for: a new value rolls the Deployment, as `kubectl rollout restart` does; the same value is a no-op.
pub const RESTART_ANNOTATION_PREFIX: &str = "kcp-keeper.io/restarted-for-";
/// How soon to look again after a nudge or a forced renewal: the operator or cert-manager answers in seconds.
const FOLLOW_UP: Duration = Duration::from_secs(2);
/// A nudge not answered within this long is repeated.
const NUDGE_REPEAT: time::Duration = time::Duration::seconds(30);

/// Why a kubeconfig's reconcile failed; `kubeconfig_rotator_reconcile_errors_total{reason}` is the variant name.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum SyncError {
    #[error("{0} not found")]
    SourceMissing(String),
    #[error("Kubeconfig {0}: spec.secretRef.name is not the configured renderedSecret")]
    SecretRefMismatch(String),
    #[error("candidate rejected: {0}")]
    CandidateRejected(CredentialError),
    #[error("candidate not proven: {0}")]
    ProofFailed(ProofError),
    #[error("nudging Kubeconfig {object}: {source}")]
    NudgeFailed { object: String, source: kube::Error },
    #[error("forcing a renewal of Certificate {object}: {source}")]
    RenewalFailed { object: String, source: kube::Error },
    #[error("{failed} of {total} targets not written; first: {first}")]
    TargetNotOwned { failed: usize, total: usize, first: Box<ApplyError> },
    #[error("{failed} of {total} targets not written; first: {first}")]
    TargetWriteFailed { failed: usize, total: usize, first: Box<ApplyError> },
    #[error("restarting a consumer: {0}")]
    RestartFailed(Box<ApplyError>),
    #[error("reading the source: {0}")]
    ReadFailed(kube::Error),
}

/// Every `reason` of the verification-failure counter: the candidate checks' and the proof's.
pub fn verification_reasons() -> impl Iterator<Item = &'static &'static str> {
    CredentialError::reasons().iter().chain(ProofError::reasons())
}

/// `kubeconfig-rotator run`.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    agent::run(INFO, args, Metrics::register, |ctx: Context<Config>, metrics: Metrics| async move {
        // The configured resyncInterval comes back as each reconcile's requeue, so a reload applies at once.
        let settings = Settings { resync: Duration::from_secs(3600), ..Settings::default() };
        let reconcile = metrics.reconcile.clone();
        let (client, events) = (ctx.client.clone(), ctx.events.clone());
        driver::run(&ctx, &reconcile, settings, |config: Arc<Config>| {
            let (stores, watches) = Stores::build(&client, &config);
            let rotator =
                Rotator { client: client.clone(), events: events.clone(), metrics: metrics.clone(), config, stores };
            (rotator, watches)
        })
        .await;
        Ok(())
    })
    .await
}

/// A kubeconfig, as the driver names it in spans and logs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubeconfigName(String);

impl std::fmt::Display for KubeconfigName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kubeconfig/{}", self.0)
    }
}

pub struct Rotator {
    pub client: kube::Client,
    pub events: Arc<Recorder>,
    pub metrics: Metrics,
    pub config: Arc<Config>,
    pub stores: Stores,
}

impl Reconciler for Rotator {
    type Item = KubeconfigName;
    type Error = SyncError;

    fn items(&self) -> Vec<KubeconfigName> {
        self.config.kubeconfigs.iter().map(|k| KubeconfigName(k.name.clone())).collect()
    }

    async fn reconcile(&self, item: &KubeconfigName) -> Result<Option<Duration>, SyncError> {
        let Some(kc) = self.config.find(&item.0) else { return Ok(None) };
        self.metrics.touch(kc);
        let snap = Reader::Stores(&self.stores).snapshot(kc).await.map_err(SyncError::ReadFailed)?;
        self.sync(kc, &snap, OffsetDateTime::now_utc()).await.map(Some)
    }
}

/// The source, resolved into a candidate kubeconfig and what it must prove.
pub struct Resolved {
    pub bytes: Vec<u8>,
    pub expected: Expected,
    /// Where Events about the source go.
    pub regarding: ObjectReference,
    /// Operator source: the certificate cert-manager last issued, and its Certificate.
    pub issued: Option<CertInfo>,
    pub certificate: Option<Certificate>,
    /// The rendered Secret (or its key) does not exist yet.
    pub missing: Option<String>,
}

/// Reads the source out of `snap`; pure apart from building the candidate.
pub fn resolve(kc: &Kubeconfig, snap: &Snapshot) -> Result<Resolved, SyncError> {
    let secret_ref = |ns: &str, name: &str| reference("v1", "Secret", ns, name, None);
    match &kc.source {
        Source::Operator { namespace, name, rendered_secret, .. } => {
            let object = format!("{namespace}/{name}");
            let kubeconfig =
                snap.kubeconfig.as_ref().ok_or_else(|| SyncError::SourceMissing(format!("Kubeconfig {object}")))?;
            if kubeconfig.secret_ref() != Some(rendered_secret.as_str()) {
                return Err(SyncError::SecretRefMismatch(object));
            }
            let expected = match &kc.expect {
                Some(e) => Expected { username: e.username.clone(), groups: e.groups.clone() },
                None => {
                    policy::operator_identity(name, kubeconfig.username().unwrap_or_default(), &kubeconfig.groups())
                }
            };
            let cert_secret = certificate_name(name);
            let issued = snap.key(namespace, &cert_secret, "tls.crt").and_then(|pem| credential::cert_info(pem).ok());
            // Not rendered yet: still nudged and renewed below, then reported as missing, not as a bad candidate.
            let bytes = snap.key(namespace, rendered_secret, KUBECONFIG_KEY).map(<[u8]>::to_vec);
            let missing = bytes.is_none().then(|| format!("Secret {namespace}/{rendered_secret} key {KUBECONFIG_KEY}"));
            let bytes = bytes.unwrap_or_default();
            let regarding =
                reference("operator.kcp.io/v1alpha1", "Kubeconfig", namespace, name, kubeconfig.metadata.uid.clone());
            Ok(Resolved { bytes, expected, regarding, issued, certificate: snap.certificate.clone(), missing })
        }
        Source::Secret(r) => {
            let bytes = snap
                .key(&r.namespace, &r.name, &r.key)
                .ok_or_else(|| SyncError::SourceMissing(format!("Secret {}/{} key {}", r.namespace, r.name, r.key)))?;
            Ok(Resolved {
                bytes: bytes.to_vec(),
                expected: expected_of(kc),
                regarding: secret_ref(&r.namespace, &r.name),
                issued: None,
                certificate: None,
                missing: None,
            })
        }
        Source::CertificateSecret { namespace, name, server, ca } => {
            let missing = |what: String| SyncError::SourceMissing(what);
            let crt = snap
                .key(namespace, name, "tls.crt")
                .ok_or_else(|| missing(format!("Secret {namespace}/{name} key tls.crt")))?;
            let key = snap
                .key(namespace, name, "tls.key")
                .ok_or_else(|| missing(format!("Secret {namespace}/{name} key tls.key")))?;
            let ca_pem = snap
                .key(&ca.namespace, &ca.name, &ca.key)
                .ok_or_else(|| missing(format!("Secret {}/{} key {}", ca.namespace, ca.name, ca.key)))?;
            let expected = expected_of(kc);
            Ok(Resolved {
                bytes: credential::build(server, ca_pem, crt, key, &expected.username),
                expected,
                regarding: secret_ref(namespace, name),
                issued: None,
                certificate: None,
                missing: None,
            })
        }
    }
}

fn expected_of(kc: &Kubeconfig) -> Expected {
    // Validation guarantees `expect` for every source but the operator's.
    let e = kc.expect.clone().unwrap_or(crate::config::Identity { username: String::new(), groups: vec![] });
    Expected { username: e.username, groups: e.groups }
}

/// The candidate as it will be published: the source's kubeconfig, its server rewritten if configured.
pub fn candidate(kc: &Kubeconfig, source: &Resolved, now: OffsetDateTime) -> Result<Credential, CredentialError> {
    let bytes = match &kc.server {
        Some(base) => credential::rewrite_server(&source.bytes, base)?,
        None => source.bytes.clone(),
    };
    credential::parse(&bytes, now)
}

impl Rotator {
    async fn sync(&self, kc: &Kubeconfig, snap: &Snapshot, now: OffsetDateTime) -> Result<Duration, SyncError> {
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
        if let Err(e) = prove::prove(&candidate, &source.expected).await {
            self.reject(kc, &source, e.reason(), &e.to_string()).await;
            return Err(SyncError::ProofFailed(e));
        }
        let label = KubeconfigLabel { kubeconfig: kc.name.clone() };
        self.metrics.not_after.get_or_create(&label).set(candidate.cert.not_after.unix_timestamp() as f64);
        self.metrics.expiry.get_or_create(&label).set((candidate.cert.not_after - now).as_seconds_f64().max(0.0));

        let mut failures = Vec::new();
        for target in &kc.targets {
            if let Err(e) = self.sync_target(kc, target, &candidate, snap, now).await {
                failures.push(e);
            }
        }
        let (total, failed) = (kc.targets.len(), failures.len());
        if let Some(first) = failures.into_iter().next() {
            return Err(match first {
                TargetFailure::Restart(e) => SyncError::RestartFailed(Box::new(e)),
                TargetFailure::Write(first @ (ApplyError::Foreign { .. } | ApplyError::ForeignKey { .. })) => {
                    SyncError::TargetNotOwned { failed, total, first: Box::new(first) }
                }
                TargetFailure::Write(first) => SyncError::TargetWriteFailed { failed, total, first: Box::new(first) },
            });
        }
        self.metrics.last_sync.get_or_create(&label).set(unix_now());
        let renew_before = kc.renew_before.or_else(|| source.certificate.as_ref().and_then(Certificate::renew_before));
        let review = policy::next_review(
            source.issued.as_ref().unwrap_or(&candidate.cert),
            now,
            renew_before,
            self.config.resync_interval,
        );
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
        let value = format!("{} {}", issued.serial, rfc3339(now));
        let patch = json!({"metadata": {"annotations": {RENDER_REQUESTED: value}}});
        Api::<KubeconfigObject>::namespaced(self.client.clone(), namespace)
            .patch(name, &merge_params(), &Patch::Merge(&patch))
            .await
            .map_err(|source| SyncError::NudgeFailed { object: format!("{namespace}/{name}"), source })?;
        self.metrics.nudges.get_or_create(&KubeconfigLabel { kubeconfig: kc.name.clone() }).inc();
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
        force_renewal(&self.client, certificate).await?;
        self.metrics.forced_renewals.get_or_create(&KubeconfigLabel { kubeconfig: kc.name.clone() }).inc();
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

    async fn sync_target(
        &self,
        kc: &Kubeconfig,
        target: &Target,
        candidate: &Credential,
        snap: &Snapshot,
        now: OffsetDateTime,
    ) -> Result<(), TargetFailure> {
        let labels = TargetLabels {
            kubeconfig: kc.name.clone(),
            namespace: target.namespace.clone(),
            name: target.name.clone(),
        };
        let in_sync = self.metrics.target_in_sync.get_or_create(&labels).clone();
        let target_not_after = self.metrics.target_not_after.get_or_create(&labels).clone();
        let api = Api::<Secret>::namespaced(self.client.clone(), &target.namespace);
        // A target the store does not hold yet is read once more: creating it carries no resourceVersion
        // precondition, so a store that lags (our own write, or someone else's) must not decide a blind write.
        let fetched = match snap.secret(&target.namespace, &target.name) {
            Some(_) => None,
            None => api.get_opt(&target.name).await.map_err(|source| {
                let object = format!("{}/{}", target.namespace, target.name);
                TargetFailure::Write(ApplyError::Kube { kind: "Secret".into(), object, source })
            })?,
        };
        let live_secret = snap.secret(&target.namespace, &target.name).or(fetched.as_ref());
        let live = live_state(live_secret, target, now);
        let complete = split_keys_current(live_secret, target, candidate);
        let regarding = reference("v1", "Secret", &target.namespace, &target.name, None);
        // What the target holds after this pass, and whether this pass wrote it.
        let (held_hash, wrote) = match (policy::target_action(&live, candidate, complete), &live) {
            (TargetAction::Unchanged, _) => {
                in_sync.set(1);
                target_not_after.set(candidate.cert.not_after.unix_timestamp() as f64);
                (candidate.hash(), false)
            }
            (TargetAction::KeepLonger, Live::Valid { cert, hash }) => {
                in_sync.set(0);
                target_not_after.set(cert.not_after.unix_timestamp() as f64);
                let note = format!(
                    "kubeconfig {}: kept serial {} (valid until {}): the candidate, serial {}, expires sooner",
                    kc.name,
                    cert.serial,
                    rfc3339(cert.not_after),
                    candidate.cert.serial,
                );
                self.events.publish(&regarding, EventType::Normal, "KeptLonger", "Publish", &note).await;
                (hash.clone(), false)
            }
            _ => {
                let rv = live_secret.and_then(|s| s.metadata.resource_version.as_deref());
                let desired = desired_secret(kc, target, candidate, rv, live_secret.is_none());
                let ownership = Ownership::Owned { adopt: target.adopt };
                let wrote = match apply::apply_over(&api, desired, ownership, live_secret).await {
                    Ok(Outcome::Unchanged) => false,
                    Ok(_) => {
                        self.published(kc, target, candidate, &live, &regarding).await;
                        true
                    }
                    Err(e) => {
                        in_sync.set(0);
                        let reason = if e.metric_label() == "not_owned" { "NotOwned" } else { "WriteFailed" };
                        tracing::warn!(kubeconfig = %kc.name, namespace = %target.namespace, name = %target.name, error = %e, "target not written");
                        self.events
                            .publish(
                                &regarding,
                                EventType::Warning,
                                reason,
                                "Publish",
                                &format!("kubeconfig {}: {e}", kc.name),
                            )
                            .await;
                        return Err(TargetFailure::Write(e));
                    }
                };
                in_sync.set(1);
                target_not_after.set(candidate.cert.not_after.unix_timestamp() as f64);
                (candidate.hash(), wrote)
            }
        };
        for deployment in &target.restart_deployments {
            self.restart(kc, &target.namespace, deployment, &held_hash, wrote).await.map_err(TargetFailure::Restart)?;
        }
        Ok(())
    }

    /// After a write: metrics, log and Event, saying whether the certificate changed.
    async fn published(
        &self,
        kc: &Kubeconfig,
        target: &Target,
        candidate: &Credential,
        live: &Live,
        regarding: &ObjectReference,
    ) {
        let (reason, what) = match live {
            Live::Missing => ("Published", "published".to_string()),
            Live::Valid { cert, .. } if cert.serial == candidate.cert.serial => ("Updated", "rewrote".to_string()),
            Live::Valid { cert, .. } => {
                self.metrics.rotations.get_or_create(&KubeconfigLabel { kubeconfig: kc.name.clone() }).inc();
                ("Rotated", format!("rotated from serial {} (notAfter {}) to", cert.serial, rfc3339(cert.not_after)))
            }
            Live::Unusable => {
                self.metrics.rotations.get_or_create(&KubeconfigLabel { kubeconfig: kc.name.clone() }).inc();
                ("Rotated", "replaced an unusable credential with".to_string())
            }
        };
        let note = format!(
            "kubeconfig {}: {what} serial {} (notAfter {}) under key {}",
            kc.name,
            candidate.cert.serial,
            rfc3339(candidate.cert.not_after),
            target.key
        );
        tracing::info!(kubeconfig = %kc.name, namespace = %target.namespace, name = %target.name, serial = %candidate.cert.serial, not_after = %rfc3339(candidate.cert.not_after), "{}", reason.to_lowercase());
        self.events.publish(regarding, EventType::Normal, reason, "Publish", &note).await;
    }

    /// Rolls a read-once consumer for content `hash`: after a write, or to finish a restart an earlier pass
    /// could not make. A consumer never annotated is left alone unless the content changed now.
    async fn restart(
        &self,
        kc: &Kubeconfig,
        namespace: &str,
        name: &str,
        hash: &str,
        wrote: bool,
    ) -> Result<(), ApplyError> {
        let api = Api::<Deployment>::namespaced(self.client.clone(), namespace);
        let kube_err =
            |source| ApplyError::Kube { kind: "Deployment".into(), object: format!("{namespace}/{name}"), source };
        let live = api.get_opt(name).await.map_err(kube_err)?;
        let key = format!("{RESTART_ANNOTATION_PREFIX}{}", kc.name);
        let current =
            live.as_ref().and_then(|d| d.spec.template.metadata.as_ref()?.annotations.as_ref()?.get(&key).cloned());
        if live.is_none() || current.as_deref() == Some(hash) || (!wrote && current.is_none()) {
            return Ok(());
        }
        let desired = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": {"metadata": {"annotations": {key: hash}}}},
        });
        apply::apply_over(&api, desired, Ownership::Fields, live.as_ref()).await?;
        let regarding = reference("apps/v1", "Deployment", namespace, name, None);
        let note = format!("kubeconfig {}: restarted to pick up content {hash}", kc.name);
        tracing::info!(kubeconfig = %kc.name, namespace, deployment = name, "restarted a consumer");
        self.events.publish(&regarding, EventType::Normal, "Restarted", "Restart", &note).await;
        Ok(())
    }
}

enum TargetFailure {
    Write(ApplyError),
    Restart(ApplyError),
}

/// Whether to nudge again: not yet for this serial, or the last nudge went unanswered for a while.
fn nudge_due(previous: Option<&str>, serial: &str, now: OffsetDateTime) -> bool {
    let Some((prev_serial, at)) = previous.and_then(|p| p.split_once(' ')) else { return true };
    let at = OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok();
    prev_serial != serial || at.is_none_or(|at| now - at > NUDGE_REPEAT)
}

/// What the target's key holds now.
pub fn live_state(secret: Option<&Secret>, target: &Target, now: OffsetDateTime) -> Live {
    match secret_key(secret, &target.key) {
        None => Live::Missing,
        Some(bytes) => match credential::parse(bytes, now) {
            Ok(c) => Live::Valid { hash: c.hash(), cert: c.cert },
            Err(_) => Live::Unusable,
        },
    }
}

/// Split keys are wanted and hold exactly the candidate's parts (true when not wanted).
fn split_keys_current(secret: Option<&Secret>, target: &Target, c: &Credential) -> bool {
    let key = |k: &str| secret_key(secret, k);
    !target.split_keys
        || (key("tls.crt") == Some(&c.cert_pem[..])
            && key("tls.key") == Some(&c.key_pem.expose()[..])
            && key("ca.crt") == Some(&c.ca_pem[..]))
}

/// The fields the agent owns in a target, with the resourceVersion it compared against: a concurrent change
/// (another writer, a newer credential) fails the write instead of being overwritten by what may be worse.
fn desired_secret(kc: &Kubeconfig, t: &Target, c: &Credential, rv: Option<&str>, creating: bool) -> serde_json::Value {
    let mut data = serde_json::Map::new();
    data.insert(t.key.clone(), json!(B64.encode(c.kubeconfig.expose())));
    if t.split_keys {
        data.insert("tls.crt".into(), json!(B64.encode(&c.cert_pem)));
        data.insert("tls.key".into(), json!(B64.encode(c.key_pem.expose())));
        data.insert("ca.crt".into(), json!(B64.encode(&c.ca_pem)));
    }
    let mut secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {
            "name": t.name, "namespace": t.namespace,
            "annotations": {
                SERIAL_ANNOTATION: c.cert.serial,
                NOT_AFTER_ANNOTATION: rfc3339(c.cert.not_after),
                HASH_ANNOTATION: c.hash(),
                "kcp-keeper.io/kubeconfig": kc.name,
            },
        },
        "data": data,
    });
    if let Some(rv) = rv {
        secret["metadata"]["resourceVersion"] = json!(rv);
    }
    if creating {
        secret["type"] = json!("Opaque");
    }
    secret
}

/// Merge patches (the nudge, the renewal) carry kcp-keeper's field manager too, so managedFields say who wrote.
fn merge_params() -> PatchParams {
    PatchParams { field_manager: Some(kcp_keeper_runtime::FIELD_MANAGER.into()), ..PatchParams::default() }
}

/// `Issuing=True`, reason `ManuallyTriggered`, on the status subresource, guarded by the resourceVersion read.
pub async fn force_renewal(client: &kube::Client, certificate: &Certificate) -> Result<(), SyncError> {
    let namespace = certificate.metadata.namespace.clone().unwrap_or_default();
    let name = certificate.metadata.name.clone().unwrap_or_default();
    let mut conditions: Vec<serde_json::Value> =
        certificate.conditions().into_iter().filter(|c| c["type"] != "Issuing").collect();
    conditions.push(json!({
        "type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
        "message": "Certificate re-issuance manually triggered by kcp-keeper kubeconfig-rotator",
        "lastTransitionTime": rfc3339(OffsetDateTime::now_utc().replace_nanosecond(0).unwrap_or(OffsetDateTime::UNIX_EPOCH)),
        "observedGeneration": certificate.metadata.generation,
    }));
    let patch = json!({
        "metadata": {"resourceVersion": certificate.metadata.resource_version},
        "status": {"conditions": conditions},
    });
    Api::<Certificate>::namespaced(client.clone(), &namespace)
        .patch_status(&name, &merge_params(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| SyncError::RenewalFailed { object: format!("{namespace}/{name}"), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nudge_is_repeated_only_for_a_new_serial_or_after_going_unanswered() {
        let now = OffsetDateTime::now_utc();
        let at = |t: OffsetDateTime| format!("0a:01 {}", rfc3339(t));
        assert!(nudge_due(None, "0a:01", now));
        assert!(!nudge_due(Some(&at(now - time::Duration::seconds(5))), "0a:01", now));
        assert!(nudge_due(Some(&at(now - time::Duration::seconds(5))), "0b:02", now));
        assert!(nudge_due(Some(&at(now - time::Duration::seconds(60))), "0a:01", now));
        assert!(nudge_due(Some("garbage"), "0a:01", now));
    }
}
