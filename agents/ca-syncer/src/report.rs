//! What one pass over a bundle's targets did, told in one Event rather than one per target: a CA change to a
//! bundle of 200 targets sends 200 writes and one Event, not 200 of each. [`PassReport`] gathers each target's
//! outcome while the pass writes; [`PassReport::event`] words the Event (its type, reason and note), or none for a
//! pass that changed nothing and in which nothing failed. The reconciler sends it on the bundle's first source
//! object, or the agent's Lease (docs/ca-syncer.md, "What an operator sees").
//!
//! The note counts every target (written, unchanged, skipped, failed) and names them up to the runtime's bound
//! ([`kcp_keeper_runtime::events::Note`]), failures first and each with its reason in a few words; each failing
//! target also reads `ca_syncer_target_in_sync 0` and has a `target not written` log line with the whole error.
//! Never anything of a certificate or a key: names, counts and error texts only.

use kcp_keeper_runtime::apply::ApplyError;
use kcp_keeper_runtime::events::{EventType, Note};

/// The reason of a pass in which a target was not written.
pub const PUBLISH_FAILED: &str = "PublishFailed";
/// The reason of a pass that removed certificates someone added by hand to a target (and failed nothing).
pub const FOREIGN_REMOVED: &str = "ForeignCertificateRemoved";
/// The reason of a pass that left a target's configured label or annotation to another manager (and failed
/// nothing, removed nothing).
pub const METADATA_NOT_OWNED: &str = "MetadataNotOwned";
/// The reason of a pass that wrote targets, and nothing else to tell.
pub const PUBLISHED: &str = "Published";

/// Each target's outcome in one pass of a bundle, by its name (`namespace/name`, or `ClusterTrustBundle/name`).
#[derive(Debug, Default)]
pub struct PassReport {
    written: Vec<String>,
    unchanged: usize,
    skipped: Vec<String>,
    /// Targets not written, with why in a few words (`not owned`, `refused 403 Forbidden`).
    failed: Vec<(String, String)>,
    /// The first failure's whole error, as the log has it.
    first_error: Option<String>,
    /// Conflicts: the object changed since it was read (often the watch lagging behind our own last write);
    /// retried at once with a fresh read, so not a failure worth a Warning.
    retried: Vec<String>,
    /// Written targets that held certificates the sources never did: `namespace/name (2)`.
    foreign_removed: Vec<String>,
    /// Targets whose configured metadata keys another manager holds: `namespace/name (label team)`.
    metadata_not_owned: Vec<String>,
}

impl PassReport {
    pub fn written(&mut self, target: String) {
        self.written.push(target);
    }

    pub fn unchanged(&mut self) {
        self.unchanged += 1;
    }

    /// Not attempted: its namespace is being deleted.
    pub fn skipped(&mut self, target: String) {
        self.skipped.push(target);
    }

    pub fn failed(&mut self, target: String, error: &ApplyError) {
        if matches!(error, ApplyError::Conflict { .. }) {
            self.retried.push(target);
            return;
        }
        self.first_error.get_or_insert_with(|| error.to_string());
        self.failed.push((target, error.short_reason()));
    }

    pub fn foreign_removed(&mut self, target: &str, removed: usize) {
        self.foreign_removed.push(format!("{target} ({removed})"));
    }

    /// `keys`: which, as `label team, annotation example.com/owner` (never their values).
    pub fn metadata_not_owned(&mut self, target: &str, keys: &str) {
        self.metadata_not_owned.push(format!("{target} ({keys})"));
    }

    /// The pass's Event: type, reason and note; `None` when it wrote nothing and nothing failed or needs a
    /// look. The reason is the weightiest outcome ([`PUBLISH_FAILED`], then [`FOREIGN_REMOVED`], then
    /// [`METADATA_NOT_OWNED`], all Warnings; else [`PUBLISHED`]); the note tells all of them.
    pub fn event(&self, bundle: &str, certificates: usize) -> Option<(EventType, &'static str, String)> {
        let (kind, reason) = if !self.failed.is_empty() {
            (EventType::Warning, PUBLISH_FAILED)
        } else if !self.foreign_removed.is_empty() {
            (EventType::Warning, FOREIGN_REMOVED)
        } else if !self.metadata_not_owned.is_empty() {
            (EventType::Warning, METADATA_NOT_OWNED)
        } else if !self.written.is_empty() {
            (EventType::Normal, PUBLISHED)
        } else {
            return None;
        };
        let plural = if certificates == 1 { "" } else { "s" };
        let mut head = format!(
            "bundle {bundle} ({certificates} certificate{plural}): {} written, {} unchanged, {} skipped, {} failed",
            self.written.len(),
            self.unchanged,
            self.skipped.len(),
            self.failed.len()
        );
        if !self.retried.is_empty() {
            head.push_str(&format!(", {} retried", self.retried.len()));
        }
        head.push('.');
        let mut note = Note::new(&head);
        note.failures(&self.failed, self.first_error.as_deref());
        note.list("Certificates the sources never held removed from", &self.foreign_removed)
            .list("Metadata left to another manager in", &self.metadata_not_owned)
            .list("Changed since read, retried", &self.retried)
            .list("Skipped, namespace being deleted", &self.skipped)
            .list("Written", &self.written);
        Some((kind, reason, note.finish()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn foreign(target: &str) -> ApplyError {
        ApplyError::Foreign { kind: "Secret".into(), object: target.into() }
    }

    fn refused(target: &str) -> ApplyError {
        let status = kube::core::Status::failure("denied by policy", "Forbidden").with_code(403);
        ApplyError::Kube { kind: "Secret".into(), object: target.into(), source: kube::Error::Api(Box::new(status)) }
    }

    #[test]
    fn a_pass_that_changed_nothing_and_failed_nothing_has_no_event() {
        let mut report = PassReport::default();
        report.unchanged();
        report.skipped("gone/kcp-ca".into());
        assert!(report.event("b", 2).is_none());
        let conflict = ApplyError::Conflict { kind: "Secret".into(), object: "a/kcp-ca".into(), message: "m".into() };
        report.failed("a/kcp-ca".into(), &conflict);
        assert!(report.event("b", 2).is_none(), "a conflict is retried at once, not told");
    }

    #[test]
    fn thirty_failures_make_one_warning_counting_all_naming_twenty_grouped_by_reason() {
        let mut report = PassReport::default();
        for i in 0..25 {
            let target = format!("t-{i:02}/kcp-ca");
            report.failed(target.clone(), &foreign(&target));
        }
        for i in 25..30 {
            let target = format!("t-{i:02}/kcp-ca");
            report.failed(target.clone(), &refused(&target));
        }
        report.written("ok/kcp-ca".into());
        let (kind, reason, note) = report.event("fleet", 3).expect("an Event");
        assert_eq!((kind, reason), (EventType::Warning, PUBLISH_FAILED));
        assert!(
            note.starts_with("bundle fleet (3 certificates): 1 written, 0 unchanged, 0 skipped, 30 failed."),
            "{note}"
        );
        assert!(note.contains(" Failed, not owned (adopt: false) (25): t-00/kcp-ca, "), "{note}");
        assert!(note.contains("t-19/kcp-ca and 5 more."), "twenty named, the rest counted: {note}");
        assert!(note.contains(" Failed, refused 403 Forbidden (5): t-25/kcp-ca, "), "{note}");
        assert!(note.contains("First error: Secret t-00/kcp-ca exists and was not created by kcp-keeper"), "{note}");
        assert!(note.contains(" Written (1): ok/kcp-ca."), "{note}");
        assert!(note.len() <= kcp_keeper_runtime::events::NOTE_LIMIT);
    }

    #[test]
    fn the_reason_is_the_weightiest_outcome_and_the_note_tells_them_all() {
        let mut report = PassReport::default();
        report.written("a/kcp-ca".into());
        assert_eq!(report.event("b", 1).map(|e| (e.0, e.1)), Some((EventType::Normal, PUBLISHED)));
        report.metadata_not_owned("a/kcp-ca", "label team");
        assert_eq!(report.event("b", 1).map(|e| (e.0, e.1)), Some((EventType::Warning, METADATA_NOT_OWNED)));
        report.foreign_removed("a/kcp-ca", 2);
        let (kind, reason, note) = report.event("b", 1).expect("an Event");
        assert_eq!((kind, reason), (EventType::Warning, FOREIGN_REMOVED));
        assert!(note.contains("removed from (1): a/kcp-ca (2).") && note.contains("(1): a/kcp-ca (label team)."));
        report.failed("c/kcp-ca".into(), &foreign("c/kcp-ca"));
        assert_eq!(report.event("b", 1).map(|e| (e.0, e.1)), Some((EventType::Warning, PUBLISH_FAILED)));
    }
}
