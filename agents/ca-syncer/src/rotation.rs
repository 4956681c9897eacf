//! Rotation-safe retention: a CA that leaves the sources stays published for a while.
//!
//! cert-manager (≥ 1.18) rotates a CA's key on every renewal. Servers keep presenting certificates from the old
//! CA until they are re-issued, so a consumer that trusts only the new CA rejects them. Hence a certificate that
//! this agent published and that has since left the sources is retained:
//!
//! - without a grace: while it has not expired (`now <= notAfter`; X.509 validity includes that second);
//! - with a grace: while it has not expired **and** `now < leftSourcesAt + grace`, i.e. until
//!   `min(notAfter, leftSourcesAt + grace)`. A grace of zero drops it at once (trust-manager's behaviour).
//! - An expired certificate is never retained, whatever the configuration says about expired source
//!   certificates.
//! - Only certificates this agent saw in the bundle's sources are retained: one found in a target but not in
//!   the bundle's record (hand-edited in, or there before the target was adopted) is dropped, so a hand edit is
//!   put back rather than kept until its notAfter.
//!
//! "Which certificates were in the sources" and "when did each leave them" are state. That record is kept
//! where only the agent writes: one object per bundle in the agent's own namespace ([`crate::state`]). The
//! target's own annotation ([`STATE_ANNOTATION`]) is written as a cache for people reading the target, and is
//! never read back: whoever can edit a target could otherwise add a CA to its data and its fingerprint to the
//! annotation, and have it kept. The certificate bytes of a retained CA come from the target (a target
//! created during a rotation starts from the current sources); the record decides which of them are kept, by
//! SHA-256 of the DER, which an editor cannot forge for a certificate of their own.
//!
//! A certificate that comes back into the sources loses its "left" time; if it leaves again, its grace starts
//! again.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::bundle::{Bundle, rfc3339};
use crate::certs::{Certificate, Fingerprint};

/// The annotation on a target that holds its [`RotationState`].
pub const STATE_ANNOTATION: &str = "ca-syncer.kcp-keeper.io/rotation-state";

/// At most this many certificates are recorded. A bundle with the Mozilla public roots has about 150.
pub const MAX_STATE_ENTRIES: usize = 512;

/// The encoded state never exceeds this (Kubernetes allows 256 KiB for all annotations of an object).
pub const MAX_STATE_BYTES: usize = 96 * 1024;

const STATE_VERSION: u32 = 1;

/// The certificates seen in a bundle's sources (those there now and those retained since they left), and when
/// each retained one left. Also the shape of the cache annotation on targets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RotationState {
    published: BTreeSet<Fingerprint>,
    left_sources: BTreeMap<Fingerprint, OffsetDateTime>,
}

/// The JSON shape of the annotation. Unknown fields are ignored so that a newer agent may add some without
/// breaking an older one during a rollout; a breaking change bumps `version`.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    version: u32,
    #[serde(default)]
    published: Vec<String>,
    #[serde(default)]
    left_sources: BTreeMap<String, String>,
}

/// Why (part of) an annotation value was ignored. Never quotes the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateProblem {
    #[error("rotation state is {size} bytes, over the {limit}-byte limit; ignored")]
    TooLarge { size: usize, limit: usize },
    #[error("rotation state is not the expected JSON; ignored")]
    Unreadable,
    #[error("rotation state has unsupported version {version}; ignored")]
    UnsupportedVersion { version: u32 },
    #[error("rotation state has {count} entries that are not SHA-256 fingerprints; those entries ignored")]
    BadFingerprints { count: usize },
    #[error("rotation state has {count} times that are not RFC 3339; those entries ignored")]
    BadTimes { count: usize },
    #[error("rotation state lists {count} certificates, over the limit of {limit}; the rest ignored")]
    TooManyEntries { count: usize, limit: usize },
}

/// The state to write would not fit in an annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("rotation state for {count} certificates would exceed the annotation limit ({limit} certificates, {max_bytes} bytes)", limit = MAX_STATE_ENTRIES, max_bytes = MAX_STATE_BYTES)]
pub struct StateTooLarge {
    pub count: usize,
}

/// A decoded annotation: whatever could be read, and what could not.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DecodedState {
    pub state: RotationState,
    pub problems: Vec<StateProblem>,
}

impl RotationState {
    /// Times are kept to the second, so that encoding is stable and decoding gives back the same state.
    pub fn new(
        published: impl IntoIterator<Item = Fingerprint>,
        left_sources: impl IntoIterator<Item = (Fingerprint, OffsetDateTime)>,
    ) -> Self {
        Self {
            published: published.into_iter().collect(),
            left_sources: left_sources.into_iter().map(|(fp, t)| (fp, whole_seconds(t))).collect(),
        }
    }

    /// The annotation value: compact JSON, keys sorted, so the same state always gives the same bytes and a
    /// no-op sync writes nothing.
    pub fn encode(&self) -> Result<String, StateTooLarge> {
        let count = self.published.len().max(self.left_sources.len());
        if count > MAX_STATE_ENTRIES {
            return Err(StateTooLarge { count });
        }
        let wire = Wire {
            version: STATE_VERSION,
            published: self.published.iter().map(ToString::to_string).collect(),
            left_sources: self.left_sources.iter().map(|(fp, t)| (fp.to_string(), rfc3339(*t))).collect(),
        };
        // Serialising strings and maps of strings cannot fail; should it ever, refusing to write is safe.
        let text = serde_json::to_string(&wire).map_err(|_| StateTooLarge { count })?;
        if text.len() > MAX_STATE_BYTES {
            return Err(StateTooLarge { count });
        }
        Ok(text)
    }

    /// Reads an annotation value. Never fails and never panics: what cannot be read is left out and reported,
    /// and garbage gives the empty state (so nothing is retained on its account).
    pub fn decode(text: &str) -> DecodedState {
        if text.len() > MAX_STATE_BYTES {
            return DecodedState::ignored(StateProblem::TooLarge { size: text.len(), limit: MAX_STATE_BYTES });
        }
        let Ok(wire) = serde_json::from_str::<Wire>(text) else {
            return DecodedState::ignored(StateProblem::Unreadable);
        };
        if wire.version != STATE_VERSION {
            return DecodedState::ignored(StateProblem::UnsupportedVersion { version: wire.version });
        }
        let mut problems = Vec::new();
        let mut bad_fingerprints = 0;
        let mut bad_times = 0;
        let entries = wire.published.len().max(wire.left_sources.len());
        if entries > MAX_STATE_ENTRIES {
            problems.push(StateProblem::TooManyEntries { count: entries, limit: MAX_STATE_ENTRIES });
        }
        let mut published = BTreeSet::new();
        for text in wire.published.iter().take(MAX_STATE_ENTRIES) {
            match text.parse::<Fingerprint>() {
                Ok(fp) => {
                    published.insert(fp);
                }
                Err(_) => bad_fingerprints += 1,
            }
        }
        let mut left_sources = BTreeMap::new();
        for (fp, at) in wire.left_sources.iter().take(MAX_STATE_ENTRIES) {
            let Ok(fp) = fp.parse::<Fingerprint>() else {
                bad_fingerprints += 1;
                continue;
            };
            match OffsetDateTime::parse(at, &Rfc3339) {
                Ok(at) => {
                    left_sources.insert(fp, whole_seconds(at));
                }
                Err(_) => bad_times += 1,
            }
        }
        if bad_fingerprints > 0 {
            problems.push(StateProblem::BadFingerprints { count: bad_fingerprints });
        }
        if bad_times > 0 {
            problems.push(StateProblem::BadTimes { count: bad_times });
        }
        DecodedState { state: RotationState { published, left_sources }, problems }
    }
}

impl DecodedState {
    fn ignored(problem: StateProblem) -> Self {
        Self { state: RotationState::default(), problems: vec![problem] }
    }
}

/// Why a previously published certificate is not carried over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Past its notAfter.
    Expired,
    /// Left the sources longer than the grace ago.
    GraceElapsed,
    /// In the target but not in the bundle's record of what its sources held (hand-edited in, or there before
    /// adoption).
    NotPublishedByUs,
}

/// A certificate kept although it left the sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retained {
    pub certificate: Certificate,
    pub left_sources_at: OffsetDateTime,
    /// The first second at which it will no longer be retained: `min(notAfter + 1s, leftSourcesAt + grace)`.
    /// The caller re-syncs then.
    pub drop_at: OffsetDateTime,
}

/// A previously published certificate that is not carried over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub certificate: Certificate,
    pub reason: DropReason,
}

/// The outcome of [`plan_retention`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionPlan {
    /// Current source certificates plus retained ones, deduplicated. Order is the bundle's job.
    pub certificates: Vec<Certificate>,
    pub retained: Vec<Retained>,
    pub dropped: Vec<Dropped>,
}

impl RetentionPlan {
    /// The state to write with `bundle` (built from [`RetentionPlan::certificates`]): exactly the certificates
    /// in the bundle as published, with the "left" time of those retained.
    pub fn state_for(&self, bundle: &Bundle) -> RotationState {
        let published: BTreeSet<Fingerprint> = bundle.fingerprints().collect();
        let left = self
            .retained
            .iter()
            .filter(|r| published.contains(&r.certificate.fingerprint()))
            .map(|r| (r.certificate.fingerprint(), r.left_sources_at));
        RotationState::new(published.iter().copied(), left)
    }

    /// When the plan next changes on its own (a retained certificate is due to be dropped).
    pub fn next_review_at(&self) -> Option<OffsetDateTime> {
        self.retained.iter().map(|r| r.drop_at).min()
    }
}

/// Decides which certificates to publish: all of `current` (the sources now), plus each certificate of
/// `previous` (what the target holds, as published before) that left the sources and is still within its
/// retention, as described in the module docs. `state` is the bundle's record ([`crate::state`]), never the
/// target's annotation.
pub fn plan_retention(
    current: &[Certificate],
    previous: &[Certificate],
    state: &RotationState,
    now: OffsetDateTime,
    grace: Option<Duration>,
) -> RetentionPlan {
    let now_s = whole_seconds(now);
    let mut certificates: BTreeMap<Fingerprint, Certificate> =
        current.iter().map(|c| (c.fingerprint(), c.clone())).collect();
    let mut retained = Vec::new();
    let mut dropped = Vec::new();
    let mut seen = BTreeSet::new();
    for cert in previous {
        let fp = cert.fingerprint();
        if certificates.contains_key(&fp) || !seen.insert(fp) {
            continue;
        }
        if !state.published.contains(&fp) {
            dropped.push(Dropped { certificate: cert.clone(), reason: DropReason::NotPublishedByUs });
            continue;
        }
        // A recorded time in the future (a skewed clock, a hand-edit) must not extend the grace.
        let left_sources_at = state.left_sources.get(&fp).map_or(now_s, |&t| t.min(now_s));
        if cert.is_expired_at(now) {
            dropped.push(Dropped { certificate: cert.clone(), reason: DropReason::Expired });
            continue;
        }
        // A grace too large to add to a date is no limit at all.
        let deadline =
            grace.and_then(|g| time::Duration::try_from(g).ok()).and_then(|g| left_sources_at.checked_add(g));
        if deadline.is_some_and(|d| now >= d) {
            dropped.push(Dropped { certificate: cert.clone(), reason: DropReason::GraceElapsed });
            continue;
        }
        let expires = cert.not_after().checked_add(time::Duration::SECOND).unwrap_or(cert.not_after());
        let drop_at = deadline.map_or(expires, |d| d.min(expires));
        retained.push(Retained { certificate: cert.clone(), left_sources_at, drop_at });
        certificates.insert(fp, cert.clone());
    }
    RetentionPlan { certificates: certificates.into_values().collect(), retained, dropped }
}

/// The bundle's record after a cycle: every certificate in the sources now, plus each certificate retained in at
/// least one target (`plans`), with the time it left. A certificate no target retains any more is forgotten.
pub fn next_state<'a>(current: &[Certificate], plans: impl IntoIterator<Item = &'a RetentionPlan>) -> RotationState {
    let mut seen: BTreeSet<Fingerprint> = current.iter().map(Certificate::fingerprint).collect();
    let mut left = BTreeMap::new();
    for retained in plans.into_iter().flat_map(|p| &p.retained) {
        let fp = retained.certificate.fingerprint();
        seen.insert(fp);
        left.insert(fp, retained.left_sources_at);
    }
    RotationState::new(seen, left)
}

fn whole_seconds(t: OffsetDateTime) -> OffsetDateTime {
    t.checked_sub(time::Duration::nanoseconds(i64::from(t.nanosecond()))).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::BundleOptions;
    use crate::testcerts::{DAY, T2025, TestCa, at};

    const HOUR: u64 = 3600;

    /// A published state: everything in `published`, nothing has left yet.
    fn published(certs: &[&TestCa]) -> RotationState {
        RotationState::new(certs.iter().map(|c| c.cert().fingerprint()), [])
    }

    /// Runs one sync the way the agent does: plan, build the bundle, compute the state to write.
    fn sync(
        current: &[&TestCa],
        previous: &[Certificate],
        state: &RotationState,
        now: OffsetDateTime,
        grace: Option<Duration>,
    ) -> (RetentionPlan, Bundle, RotationState) {
        let current: Vec<Certificate> = current.iter().map(|c| c.cert()).collect();
        let plan = plan_retention(&current, previous, state, now, grace);
        let bundle = Bundle::build(plan.certificates.clone(), &BundleOptions { drop_expired: true, now });
        let next = plan.state_for(&bundle);
        (plan, bundle, next)
    }

    #[test]
    fn rotated_out_ca_is_kept_until_its_not_after() {
        let old = TestCa::root_valid("kcp-root", at(T2025), at(T2025 + 90 * DAY));
        let new = TestCa::root_valid("kcp-root", at(T2025 + 60 * DAY), at(T2025 + 150 * DAY));
        let rotated_at = at(T2025 + 60 * DAY);

        // The source now holds only the new CA; the target still holds the old one.
        let (plan, bundle, state) = sync(&[&new], &[old.cert()], &published(&[&old]), rotated_at, None);
        assert_eq!(bundle.len(), 2, "old and new both published");
        assert_eq!(plan.retained.len(), 1);
        assert_eq!(plan.retained[0].left_sources_at, rotated_at);
        assert_eq!(plan.retained[0].drop_at, old.not_after + time::Duration::SECOND);
        assert_eq!(state.left_sources.get(&old.cert().fingerprint()), Some(&rotated_at));

        // A day before the old CA expires: still there, with the recorded "left" time unchanged.
        let previous = bundle.certificates().to_vec();
        let (_, bundle, state) = sync(&[&new], &previous, &state, old.not_after - time::Duration::DAY, None);
        assert_eq!(bundle.len(), 2);
        assert_eq!(state.left_sources.get(&old.cert().fingerprint()), Some(&rotated_at));

        // Its last valid second: still there.
        let (_, bundle, _) = sync(&[&new], &previous, &state, old.not_after, None);
        assert_eq!(bundle.len(), 2);

        // One second later: gone, and the state forgets it.
        let (plan, bundle, state) = sync(&[&new], &previous, &state, old.not_after + time::Duration::SECOND, None);
        assert_eq!(bundle.certificates(), [new.cert()]);
        assert_eq!(plan.dropped, [Dropped { certificate: old.cert(), reason: DropReason::Expired }]);
        assert!(state.left_sources.is_empty());
        assert_eq!(state.published.len(), 1);
    }

    #[test]
    fn grace_shorter_than_not_after_drops_rotated_ca_after_grace() {
        let old = TestCa::root_valid("kcp-root", at(T2025), at(T2025 + 90 * DAY));
        let new = TestCa::root("kcp-root");
        let rotated_at = at(T2025 + 10 * DAY);
        let grace = Some(Duration::from_secs(24 * HOUR));

        let (plan, bundle, state) = sync(&[&new], &[old.cert()], &published(&[&old]), rotated_at, grace);
        assert_eq!(bundle.len(), 2);
        assert_eq!(plan.retained[0].drop_at, rotated_at + time::Duration::DAY);
        assert_eq!(plan.next_review_at(), Some(rotated_at + time::Duration::DAY));

        let previous = bundle.certificates().to_vec();
        let almost = rotated_at + time::Duration::DAY - time::Duration::SECOND;
        let (_, bundle, state) = sync(&[&new], &previous, &state, almost, grace);
        assert_eq!(bundle.len(), 2, "still within the grace");

        let (plan, bundle, _) = sync(&[&new], &previous, &state, rotated_at + time::Duration::DAY, grace);
        assert_eq!(bundle.certificates(), [new.cert()]);
        assert_eq!(plan.dropped[0].reason, DropReason::GraceElapsed);
    }

    #[test]
    fn grace_longer_than_not_after_still_drops_at_not_after() {
        let old = TestCa::root_valid("kcp-root", at(T2025), at(T2025 + 20 * DAY));
        let new = TestCa::root("kcp-root");
        let grace = Some(Duration::from_secs(720 * HOUR));
        let (plan, bundle, state) = sync(&[&new], &[old.cert()], &published(&[&old]), at(T2025 + 10 * DAY), grace);
        assert_eq!(plan.retained[0].drop_at, old.not_after + time::Duration::SECOND);
        let after = old.not_after + time::Duration::SECOND;
        let (plan, _, _) = sync(&[&new], bundle.certificates(), &state, after, grace);
        assert_eq!(plan.dropped[0].reason, DropReason::Expired);
    }

    #[test]
    fn zero_grace_drops_a_rotated_ca_at_once() {
        let old = TestCa::root("old");
        let new = TestCa::root("new");
        let (plan, bundle, _) =
            sync(&[&new], &[old.cert()], &published(&[&old]), at(T2025 + DAY), Some(Duration::ZERO));
        assert_eq!(bundle.certificates(), [new.cert()]);
        assert_eq!(plan.dropped[0].reason, DropReason::GraceElapsed);
    }

    #[test]
    fn expired_cert_is_never_retained() {
        let expired = TestCa::root_valid("old", at(T2025), at(T2025 + DAY));
        let new = TestCa::root("new");
        let now = at(T2025 + 2 * DAY);
        // Even with a huge grace and a recorded "left" time within it.
        let state = RotationState::new([expired.cert().fingerprint()], [(expired.cert().fingerprint(), now)]);
        let plan = plan_retention(&[new.cert()], &[expired.cert()], &state, now, Some(Duration::from_secs(u64::MAX)));
        assert!(plan.retained.is_empty());
        assert_eq!(plan.certificates, [new.cert()]);
        assert_eq!(plan.dropped[0].reason, DropReason::Expired);
    }

    #[test]
    fn cert_never_published_by_us_is_not_retained_so_a_hand_edit_is_put_back() {
        let ours = TestCa::root("ours");
        let injected = TestCa::root("injected");
        let plan = plan_retention(
            &[ours.cert()],
            &[ours.cert(), injected.cert()],
            &published(&[&ours]),
            at(T2025 + DAY),
            None,
        );
        assert_eq!(plan.certificates, [ours.cert()]);
        assert_eq!(plan.dropped, [Dropped { certificate: injected.cert(), reason: DropReason::NotPublishedByUs }]);
    }

    #[test]
    fn without_state_nothing_from_the_target_is_retained() {
        let foreign = TestCa::root("foreign");
        let ours = TestCa::root("ours");
        let plan = plan_retention(&[ours.cert()], &[foreign.cert()], &RotationState::default(), at(T2025), None);
        assert_eq!(plan.certificates, [ours.cert()]);
        assert_eq!(plan.dropped[0].reason, DropReason::NotPublishedByUs);
    }

    #[test]
    fn certificate_back_in_the_sources_loses_its_left_time_and_restarts_its_grace_if_it_leaves_again() {
        let old = TestCa::root("old");
        let new = TestCa::root("new");
        let grace = Some(Duration::from_secs(10 * HOUR));
        let t0 = at(T2025 + DAY);
        let (_, bundle, state) = sync(&[&new], &[old.cert(), new.cert()], &published(&[&old, &new]), t0, grace);
        assert!(state.left_sources.contains_key(&old.cert().fingerprint()));

        // It comes back: no longer "left".
        let t1 = t0 + time::Duration::hours(5);
        let (_, bundle, state) = sync(&[&old, &new], bundle.certificates(), &state, t1, grace);
        assert!(state.left_sources.is_empty());

        // It leaves again: the grace counts from now, not from t0.
        let t2 = t0 + time::Duration::hours(9);
        let (plan, bundle, state) = sync(&[&new], bundle.certificates(), &state, t2, grace);
        assert_eq!(plan.retained[0].left_sources_at, t2);
        let (_, bundle, _) = sync(&[&new], bundle.certificates(), &state, t0 + time::Duration::hours(12), grace);
        assert_eq!(bundle.len(), 2, "grace restarted at t2, ends at t2 + 10h");
    }

    #[test]
    fn recorded_left_time_in_the_future_does_not_extend_the_grace() {
        let old = TestCa::root("old");
        let new = TestCa::root("new");
        let now = at(T2025 + DAY);
        let fp = old.cert().fingerprint();
        let state = RotationState::new([fp], [(fp, now + time::Duration::days(365))]);
        let plan = plan_retention(&[new.cert()], &[old.cert()], &state, now, Some(Duration::from_secs(HOUR)));
        assert_eq!(plan.retained[0].left_sources_at, now);
        assert_eq!(plan.retained[0].drop_at, now + time::Duration::HOUR);
    }

    #[test]
    fn current_certs_are_always_included_and_duplicates_collapse() {
        let a = TestCa::root("a");
        let b = TestCa::root("b");
        let plan = plan_retention(
            &[a.cert(), a.cert(), b.cert()],
            &[a.cert(), b.cert(), b.cert()],
            &RotationState::default(),
            at(T2025),
            None,
        );
        assert_eq!(plan.certificates.len(), 2);
        assert!(plan.retained.is_empty() && plan.dropped.is_empty());
    }

    #[test]
    fn left_time_is_recorded_to_the_second() {
        let old = TestCa::root("old");
        let new = TestCa::root("new");
        let now = at(T2025 + DAY) + time::Duration::milliseconds(1234);
        let plan = plan_retention(&[new.cert()], &[old.cert()], &published(&[&old]), now, None);
        assert_eq!(plan.retained[0].left_sources_at, at(T2025 + DAY + 1));
    }

    #[test]
    fn state_round_trips_through_its_annotation_value_byte_stably() {
        let a = TestCa::root("a").cert().fingerprint();
        let b = TestCa::root("b").cert().fingerprint();
        let state = RotationState::new([b, a], [(a, at(T2025 + 7))]);
        let text = state.encode().expect("fits");
        let again = RotationState::new([a, b], [(a, at(T2025 + 7))]).encode().expect("fits");
        assert_eq!(text, again);
        assert!(text.starts_with(r#"{"version":1,"published":["#), "{text}");
        assert!(text.contains(r#""leftSources":{""#), "{text}");
        assert!(text.contains("2025-01-01T00:00:07Z"), "{text}");
        let decoded = RotationState::decode(&text);
        assert_eq!(decoded, DecodedState { state, problems: vec![] });
    }

    #[test]
    fn garbage_annotation_decodes_to_empty_state_and_is_reported() {
        let cases = [
            "",
            "not json",
            "{",
            "[]",
            "null",
            r#"{"published":[]}"#,
            r#"{"version":"1"}"#,
            "{\"version\":1,\"published\":{}}",
        ];
        for text in cases {
            let decoded = RotationState::decode(text);
            assert_eq!(decoded.state, RotationState::default(), "{text}");
            assert_eq!(decoded.problems, [StateProblem::Unreadable], "{text}");
        }
        let decoded = RotationState::decode(r#"{"version":2,"published":[]}"#);
        assert_eq!(decoded.problems, [StateProblem::UnsupportedVersion { version: 2 }]);
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert_eq!(RotationState::decode(&deep).problems, [StateProblem::Unreadable]);
        let huge = " ".repeat(MAX_STATE_BYTES + 1);
        assert_eq!(
            RotationState::decode(&huge).problems,
            [StateProblem::TooLarge { size: MAX_STATE_BYTES + 1, limit: MAX_STATE_BYTES }]
        );
    }

    #[test]
    fn bad_entries_are_skipped_and_counted_without_quoting_them() {
        let good = TestCa::root("good").cert().fingerprint();
        let text = format!(
            r#"{{"version":1,"published":["{good}","secret-looking-garbage"],"leftSources":{{"{good}":"yesterday","zz":"2025-01-01T00:00:00Z"}},"futureField":true}}"#
        );
        let decoded = RotationState::decode(&text);
        assert_eq!(decoded.state, RotationState::new([good], []));
        assert_eq!(decoded.problems, [StateProblem::BadFingerprints { count: 2 }, StateProblem::BadTimes { count: 1 }]);
        for problem in &decoded.problems {
            let shown = format!("{problem} {problem:?}");
            assert!(!shown.contains("garbage") && !shown.contains("yesterday"), "{shown}");
        }
    }

    #[test]
    fn too_many_entries_are_truncated_on_decode_and_refused_on_encode() {
        let fps: Vec<Fingerprint> = (0..=MAX_STATE_ENTRIES).map(|i| Fingerprint::of(&i.to_be_bytes())).collect();
        let state = RotationState::new(fps.iter().copied(), []);
        assert_eq!(state.encode(), Err(StateTooLarge { count: MAX_STATE_ENTRIES + 1 }));
        let wire = Wire {
            version: 1,
            published: fps.iter().map(ToString::to_string).collect(),
            left_sources: BTreeMap::new(),
        };
        let text = serde_json::to_string(&wire).expect("json");
        let decoded = RotationState::decode(&text);
        assert_eq!(decoded.state.published.len(), MAX_STATE_ENTRIES);
        assert_eq!(
            decoded.problems,
            [StateProblem::TooManyEntries { count: MAX_STATE_ENTRIES + 1, limit: MAX_STATE_ENTRIES }]
        );
        // The largest state that encodes also decodes.
        let full = RotationState::new(
            fps[..MAX_STATE_ENTRIES].iter().copied(),
            fps[..MAX_STATE_ENTRIES].iter().map(|&fp| (fp, at(T2025))),
        );
        let text = full.encode().expect("fits");
        assert!(text.len() <= MAX_STATE_BYTES);
        assert_eq!(RotationState::decode(&text).state, full);
    }

    #[test]
    fn state_for_records_exactly_the_published_bundle() {
        let old = TestCa::root_valid("old", at(T2025), at(T2025 + 30 * DAY));
        let new = TestCa::root("new");
        let now = at(T2025 + DAY);
        let (_, bundle, state) = sync(&[&new], &[old.cert()], &published(&[&old]), now, None);
        let expected: BTreeSet<Fingerprint> = bundle.fingerprints().collect();
        assert_eq!(state.published, expected);
        assert_eq!(state.left_sources.keys().copied().collect::<Vec<_>>(), [old.cert().fingerprint()]);
    }

    #[test]
    fn next_state_records_the_sources_and_what_a_target_retains_and_forgets_what_none_does() {
        let old = TestCa::root_valid("old", at(T2025), at(T2025 + 30 * DAY));
        let gone = TestCa::root_valid("gone", at(T2025), at(T2025 + 30 * DAY));
        let new = TestCa::root("new");
        let now = at(T2025 + DAY);
        let record = RotationState::new([old.cert().fingerprint(), new.cert().fingerprint()], []);
        // One target still holds the old CA, another never did; `gone` was hand-edited into the first.
        let holding = plan_retention(&[new.cert()], &[old.cert(), gone.cert()], &record, now, None);
        let fresh = plan_retention(&[new.cert()], &[], &record, now, None);
        let next = next_state(&[new.cert()], [&holding, &fresh]);
        assert_eq!(
            next,
            RotationState::new([old.cert().fingerprint(), new.cert().fingerprint()], [(old.cert().fingerprint(), now)])
        );
        // Once no target retains it (expired), it is forgotten, and a target editor cannot bring it back.
        let later = old.not_after + time::Duration::SECOND;
        let expired = plan_retention(&[new.cert()], &[old.cert()], &next, later, None);
        assert_eq!(next_state(&[new.cert()], [&expired]), RotationState::new([new.cert().fingerprint()], []));
    }
}
