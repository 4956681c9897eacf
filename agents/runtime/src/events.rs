//! Kubernetes Events (events.k8s.io/v1) on the objects an agent acts on, rate limited twice over:
//! - within a process, a token bucket per (object, reason) absorbs bursts ([`Recorder::publish_about`] adds a
//!   subject to that key, for an agent reporting many distinct things under one reason on one object);
//! - across restarts, an Event's name is derived from (object, reason, note, time window), so a crash-looping
//!   agent re-creating the same Event gets `AlreadyExists` instead of adding one per restart; within a process,
//!   an Event already recorded in the current window is not sent again at all (no request, no token: a pass
//!   that fails the same way every few seconds does not use up the burst a new outcome needs).
//!
//! An agent that acts on many objects in one pass tells it in one Event, not one per object: [`Note`] words
//! such an Event's note (counts first, then lists of names cut with "and N more") within the API's limit.

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

/// The longest note sent: the API refuses an Event whose note is over 1 KiB, so a longer one is cut.
pub const NOTE_LIMIT: usize = 1000;
/// How many names one list of a [`Note`] shows before "and N more".
pub const NAMES_SHOWN: usize = 20;

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
    /// The names of the Events this process recorded (or found recorded), with their window: the same Event in
    /// the same window is not sent again.
    recorded: Mutex<HashMap<String, u64>>,
}

impl Recorder {
    pub fn new(client: kube::Client, agent: &str, identity: &str) -> Self {
        Self {
            client,
            controller: format!("kcp-keeper.io/{agent}"),
            instance: identity.to_string(),
            buckets: Mutex::new(HashMap::new()),
            recorded: Mutex::new(HashMap::new()),
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
        let note = sanitize(note);
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let now = Timestamp::now();
        let window = now.as_second() as u64 / DEDUPE_WINDOW.as_secs();
        let name = event_name(&object, regarding.name.as_deref(), reason, &note, window);
        if self.recorded.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&name) {
            tracing::debug!(%object, reason, "event already recorded in this window");
            return;
        }
        if !self.take_token(&object, reason, subject) {
            tracing::debug!(%object, reason, "event suppressed by rate limit");
            return;
        }
        let event = Event {
            metadata: ObjectMeta { name: Some(name.clone()), namespace: Some(namespace.clone()), ..Default::default() },
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
            Ok(_) => self.recorded(name, window),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::debug!(%object, reason, "event already recorded");
                self.recorded(name, window);
            }
            Err(e) => tracing::warn!(%object, reason, error = %e, "could not record event"),
        }
    }

    /// Remembers an Event recorded in `window`, and forgets those of earlier windows (their names cannot come
    /// again).
    fn recorded(&self, name: String, window: u64) {
        let mut recorded = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
        recorded.retain(|_, w| *w >= window);
        recorded.insert(name, window);
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

/// An Event's name: the object's name and a hash of (object, reason, note, window), the same in every process.
fn event_name(object: &str, name: Option<&str>, reason: &str, note: &str, window: u64) -> String {
    format!("{}.{:016x}", name.unwrap_or("object"), stable_hash(&[object, reason, note, &window.to_string()]))
}

/// Event notes are limited to 1 KiB by the API, and must never carry PEM.
fn sanitize(note: &str) -> String {
    if note.contains("-----BEGIN") {
        return "(message withheld: it contained PEM data)".into();
    }
    note[..note.floor_char_boundary(NOTE_LIMIT)].to_string()
}

/// The note of an Event that reports many objects at once (a pass over a bundle's targets): a head saying how
/// many of each there were, then lists of their names, added in the order of importance. A list shows at most
/// [`NAMES_SHOWN`] names, and only as many as fit in [`NOTE_LIMIT`] after the head and the lists before it; the
/// rest are counted (`and 10 more`). The head's counts always show (a list with no room left is dropped, not
/// cut), and a name is never cut in half.
#[derive(Debug, Clone)]
pub struct Note(String);

impl Note {
    /// A note starting with `head` (the counts); cut to the limit if it alone is longer.
    pub fn new(head: &str) -> Self {
        Self(head[..head.floor_char_boundary(NOTE_LIMIT)].to_string())
    }

    /// Appends ` <label> (<count>): a, b and N more.` for `names`; nothing when it is empty. When not even one
    /// name fits, ` <label> (<count>).`; when not even that fits, nothing (the head has the count).
    pub fn list(&mut self, label: &str, names: &[String]) -> &mut Self {
        if names.is_empty() {
            return self;
        }
        let total = names.len();
        let bare = format!(" {label} ({total}).");
        if self.0.len() + bare.len() > NOTE_LIMIT {
            return self;
        }
        let mut text = format!(" {label} ({total}): ");
        let mut shown = 0;
        for name in names.iter().take(NAMES_SHOWN) {
            let separator = if shown == 0 { "" } else { ", " };
            let left = total - shown - 1;
            let more = if left > 0 { format!(" and {left} more") } else { String::new() };
            if self.0.len() + text.len() + separator.len() + name.len() + more.len() + 1 > NOTE_LIMIT {
                break;
            }
            text.push_str(separator);
            text.push_str(name);
            shown += 1;
        }
        if shown == 0 {
            self.0.push_str(&bare);
            return self;
        }
        if shown < total {
            text.push_str(&format!(" and {} more", total - shown));
        }
        text.push('.');
        self.0.push_str(&text);
        self
    }

    /// Appends the failures (`(target, why in a few words)`) grouped by why, in the order each reason first came
    /// up (` Failed, <why> (<count>): a, b.`), then ` First error: <error>.` when there is one.
    pub fn failures(&mut self, failed: &[(String, String)], first_error: Option<&str>) -> &mut Self {
        let mut groups: Vec<(&str, Vec<String>)> = Vec::new();
        for (target, why) in failed {
            match groups.iter_mut().find(|(w, _)| w == why) {
                Some((_, names)) => names.push(target.clone()),
                None => groups.push((why, vec![target.clone()])),
            }
        }
        for (why, names) in &groups {
            self.list(&format!("Failed, {why}"), names);
        }
        if let Some(error) = first_error {
            self.sentence(&format!("First error: {error}."));
        }
        self
    }

    /// Appends ` <text>`, cut (with `...`) to what room is left.
    pub fn sentence(&mut self, text: &str) -> &mut Self {
        let room = NOTE_LIMIT.saturating_sub(self.0.len() + 1);
        if text.is_empty() || room < 4 {
            return self;
        }
        self.0.push(' ');
        if text.len() <= room {
            self.0.push_str(text);
        } else {
            self.0.push_str(&text[..text.floor_char_boundary(room - 3)]);
            self.0.push_str("...");
        }
        self
    }

    pub fn finish(self) -> String {
        self.0
    }
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

    #[tokio::test]
    async fn an_event_recorded_in_this_window_is_not_sent_again_nor_uses_a_token() {
        // Nothing listens there: an Event that were sent would fail, and use a token all the same.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let recorder = Recorder::new(kube::Client::try_from(config).unwrap(), "test", "test-0");
        let regarding = reference("v1", "Secret", "ns", "source", None);
        let window = Timestamp::now().as_second() as u64 / DEDUPE_WINDOW.as_secs();
        recorder.recorded(event_name("Secret/ns/source", Some("source"), "PublishFailed", "same", window), window);
        for _ in 0..10 {
            recorder.publish(&regarding, EventType::Warning, "PublishFailed", "Sync", "same").await;
        }
        for _ in 0..5 {
            assert!(recorder.take_token("Secret/ns/source", "PublishFailed", ""), "the burst is untouched");
        }
        // Names of an earlier window go once a later one is recorded.
        recorder.recorded("later".into(), window + 1);
        assert_eq!(recorder.recorded.lock().unwrap().len(), 1);
    }

    #[test]
    fn pem_in_a_note_is_withheld_and_long_notes_are_cut() {
        assert!(!sanitize("bad: -----BEGIN PRIVATE KEY----- abc").contains("PRIVATE"));
        assert_eq!(sanitize(&"é".repeat(800)).len(), 1000);
    }

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}-{i:04}/kcp-ca")).collect()
    }

    #[test]
    fn a_note_lists_up_to_twenty_names_then_counts_the_rest() {
        let mut note = Note::new("bundle b: 0 written, 30 failed.");
        note.list("Not owned", &names("ns", 30));
        let text = note.finish();
        assert!(text.starts_with("bundle b: 0 written, 30 failed. Not owned (30): ns-0000/kcp-ca, "), "{text}");
        assert!(text.ends_with("ns-0019/kcp-ca and 10 more."), "{text}");
        assert!(!text.contains("ns-0020"), "{text}");
        let mut note = Note::new("head.");
        note.list("Written", &names("ns", 2)).list("Empty", &[]);
        assert_eq!(note.finish(), "head. Written (2): ns-0000/kcp-ca, ns-0001/kcp-ca.");
    }

    #[test]
    fn a_note_never_passes_the_limit_nor_cuts_a_name() {
        let long = |i: usize| vec![format!("{}-{i}/x", "n".repeat(200)); 40];
        let mut note = Note::new("head.");
        note.list("First", &long(1)).sentence(&"e".repeat(2000)).list("Second", &long(2)).list("Third", &long(3));
        let text = note.finish();
        assert!(text.len() <= NOTE_LIMIT, "{}", text.len());
        assert!(text.contains(" First (40): "), "{text}");
        assert!(text.contains(" more."), "{text}");
        // No name is cut: each shown one is whole.
        for part in text.split(": ").nth(1).unwrap_or_default().split(" and ").next().unwrap_or_default().split(", ") {
            assert!(part.ends_with("-1/x"), "{part}");
        }
        // Too little room for any name: the count alone; no room at all: nothing.
        let mut note = Note::new(&"h".repeat(NOTE_LIMIT - 30));
        note.list("Failed", &names("ns", 3));
        assert!(note.clone().finish().ends_with(" Failed (3)."), "{}", note.clone().finish());
        note.list("Written", &names("ns", 3)).list("Skipped", &names("ns", 3));
        assert!(note.clone().finish().len() <= NOTE_LIMIT);
        let full = Note::new(&"h".repeat(NOTE_LIMIT + 10)).finish();
        assert_eq!(full.len(), NOTE_LIMIT);
    }

    #[test]
    fn hash_is_stable_and_separates_fields() {
        assert_eq!(stable_hash(&["a", "b"]), stable_hash(&["a", "b"]));
        assert_ne!(stable_hash(&["ab", ""]), stable_hash(&["a", "b"]));
    }
}
