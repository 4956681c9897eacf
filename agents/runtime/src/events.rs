//! Kubernetes Events (events.k8s.io/v1) on the objects an agent acts on, rate limited twice over:
//! - within a process, a token bucket per (object, reason) absorbs bursts ([`Recorder::publish_about`] adds a
//!   subject to that key, for an agent reporting many distinct things under one reason on one object);
//! - across restarts, an Event's name is derived from (object, reason, note, time window), so a crash-looping
//!   agent re-creating the same Event gets `AlreadyExists` instead of adding one per restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use sha2::{Digest, Sha256};

/// Identical Events inside one window share a name and are created once.
const DEDUPE_WINDOW: Duration = Duration::from_secs(10 * 60);
/// Per (object, reason, subject): a burst of this many, then one per refill interval.
const BURST: f64 = 5.0;
const REFILL_EVERY: Duration = Duration::from_secs(60);

/// (object, reason, subject): what one token bucket limits.
type BucketKey = (String, String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
pub enum EventType {
    Normal,
    Warning,
}

/// Emits Events as `kcp-keeper.io/<agent>`, instance `<identity>`.
pub struct Recorder {
    client: kube::Client,
    controller: String,
    instance: String,
    buckets: Mutex<HashMap<BucketKey, (f64, Instant)>>,
}

impl Recorder {
    pub fn new(client: kube::Client, agent: &str, identity: &str) -> Self {
        Self {
            client,
            controller: format!("kcp-keeper.io/{agent}"),
            instance: identity.to_string(),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Emits an Event about `regarding`. `note` must not carry secret material: callers pass descriptions, and
    /// a note that looks like PEM is withheld here as a last line of defence. Failures are logged, not returned:
    /// an Event is never worth failing a reconcile over.
    pub async fn publish(&self, regarding: &ObjectReference, kind: EventType, reason: &str, action: &str, note: &str) {
        self.publish_about(regarding, "", kind, reason, action, note).await
    }

    /// [`Recorder::publish`] rate limited per `subject` as well as per object and reason: for an agent that
    /// reports many distinct things under one reason on one object (dns-rewriter's rule errors, one Event per
    /// rule), so the sixth is not lost to the first five's burst. `subject` is only a key, never shown.
    /// `publish` is this with an empty subject.
    pub async fn publish_about(
        &self,
        regarding: &ObjectReference,
        subject: &str,
        kind: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let object = format!(
            "{}/{}/{}",
            regarding.kind.as_deref().unwrap_or_default(),
            regarding.namespace.as_deref().unwrap_or_default(),
            regarding.name.as_deref().unwrap_or_default()
        );
        if !self.take_token(&object, reason, subject) {
            tracing::debug!(%object, reason, "event suppressed by rate limit");
            return;
        }
        let note = sanitize(note);
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let now = Timestamp::now();
        let window = now.as_second() as u64 / DEDUPE_WINDOW.as_secs();
        let name = format!(
            "{}.{:016x}",
            regarding.name.as_deref().unwrap_or("object"),
            stable_hash(&[&object, reason, &note, &window.to_string()])
        );
        let event = Event {
            metadata: ObjectMeta { name: Some(name), namespace: Some(namespace.clone()), ..Default::default() },
            event_time: Some(MicroTime(now)),
            type_: Some(<&str>::from(kind).into()),
            reason: Some(reason.into()),
            action: Some(action.into()),
            note: Some(note),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        match Api::<Event>::namespaced(self.client.clone(), &namespace).create(&PostParams::default(), &event).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => tracing::debug!(%object, reason, "event already recorded"),
            Err(e) => tracing::warn!(%object, reason, error = %e, "could not record event"),
        }
    }

    /// [`Recorder::publish`] without waiting for the apiserver: the Event is created by a task of its own, so
    /// work that reports many objects one after another (a bundle written to 200 targets) is not held up by a
    /// round trip per Event, just as client-go's broadcaster never holds up its callers. Like client-go's, an
    /// Event still in flight when the process exits is lost.
    pub fn publish_detached(
        self: &Arc<Self>,
        regarding: ObjectReference,
        kind: EventType,
        reason: &'static str,
        action: &'static str,
        note: String,
    ) {
        let recorder = self.clone();
        tokio::spawn(async move { recorder.publish(&regarding, kind, reason, action, &note).await });
    }

    fn take_token(&self, object: &str, reason: &str, subject: &str) -> bool {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let key = (object.into(), reason.into(), subject.into());
        let (tokens, last) = buckets.entry(key).or_insert((BURST, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() / REFILL_EVERY.as_secs_f64()).min(BURST);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Event notes are limited to 1 KiB by the API, and must never carry PEM.
fn sanitize(note: &str) -> String {
    if note.contains("-----BEGIN") {
        return "(message withheld: it contained PEM data)".into();
    }
    note[..note.floor_char_boundary(1000)].to_string()
}

/// The first 8 bytes of a SHA-256 over the parts (NUL-separated): stable across processes and versions, unlike
/// std's randomly seeded hasher.
fn stable_hash(parts: &[&str]) -> u64 {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    let digest = hasher.finalize();
    u64::from_be_bytes(digest[..8].try_into().unwrap_or_default())
}

/// A reference to a namespaced object for [`Recorder::publish`].
pub fn reference(api_version: &str, kind: &str, namespace: &str, name: &str, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some(api_version.into()),
        kind: Some(kind.into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_burst_is_per_subject_as_well_as_per_object_and_reason() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let recorder = Recorder::new(kube::Client::try_from(config).unwrap(), "test", "test-0");
        for _ in 0..5 {
            assert!(recorder.take_token("o", "r", ""));
        }
        assert!(!recorder.take_token("o", "r", ""), "the sixth of one key waits for the refill");
        for subject in ["a", "b", "c", "d", "e", "f", "g"] {
            assert!(recorder.take_token("o", "r", subject), "{subject} has a bucket of its own");
        }
        assert!(recorder.take_token("o", "other", ""), "and so has another reason");
    }

    #[test]
    fn pem_in_a_note_is_withheld_and_long_notes_are_cut() {
        assert!(!sanitize("bad: -----BEGIN PRIVATE KEY----- abc").contains("PRIVATE"));
        assert_eq!(sanitize(&"é".repeat(800)).len(), 1000);
    }

    #[test]
    fn hash_is_stable_and_separates_fields() {
        assert_eq!(stable_hash(&["a", "b"]), stable_hash(&["a", "b"]));
        assert_ne!(stable_hash(&["ab", ""]), stable_hash(&["a", "b"]));
    }
}
