//! What one pass over a kubeconfig's targets did, told in one Event rather than one per target: a renewal
//! published to 50 selected namespaces sends 50 writes and one Event, not 50 of each. [`PassReport`] gathers each
//! target's outcome (and each withdrawn copy) while the pass runs; [`PassReport::event`] words the Event, or none
//! for a pass that changed nothing and in which nothing failed. The reconciler sends it on the kubeconfig's source
//! object, where its other Events (`CandidateRejected`, `RenderRequested`, `RenewalForced`) go.
//!
//! The note counts every target and names them up to the runtime's bound
//! ([`kcp_keeper_runtime::events::Note`]), failures first, each with its reason in a few words; each failing
//! target also reads `kubeconfig_rotator_target_in_sync 0` and has a log line with the whole error. Names,
//! serials, times and error texts only: never a key, a certificate or a server URL.

use kcp_keeper_runtime::apply::ApplyError;
use kcp_keeper_runtime::events::{EventType, Note};

/// The reason of a pass in which a target was not written or a copy not withdrawn.
pub const PUBLISH_FAILED: &str = "PublishFailed";

/// Each target's outcome in one pass of a kubeconfig, by `namespace/name`.
#[derive(Debug, Default)]
pub struct PassReport {
    /// The published credential: `serial S (notAfter T)`, once the candidate was proven.
    candidate: Option<String>,
    /// Written, replacing another certificate: `namespace/name (from serial S)`.
    rotated: Vec<String>,
    /// Written where there was nothing.
    published: Vec<String>,
    /// Written again with the same certificate (another server, CA data or split keys).
    updated: Vec<String>,
    unchanged: usize,
    /// Holding a proven credential that outlasts the candidate: `namespace/name (serial S until T)`.
    kept_longer: Vec<String>,
    /// Replaced although it lasted longer, because it points at another server: `namespace/name (serial S)`.
    replaced_other_server: Vec<String>,
    /// Replaced although it lasted longer, because it failed its proof: `namespace/name (serial S: why)`.
    replaced_unproven: Vec<String>,
    /// Copies deleted where the selector or the allow list no longer puts them.
    withdrawn: Vec<String>,
    /// Not written or not withdrawn, with why in a few words.
    failed: Vec<(String, String)>,
    /// The first failure's whole error, as the log has it.
    first_error: Option<String>,
}

impl PassReport {
    pub fn candidate(&mut self, serial: &str, not_after: &str) {
        self.candidate = Some(format!("serial {serial} (notAfter {not_after})"));
    }

    /// `from`: the serial it held, or `None` for an unusable credential.
    pub fn rotated(&mut self, target: String, from: Option<&str>) {
        self.rotated.push(match from {
            Some(serial) => format!("{target} (from serial {serial})"),
            None => format!("{target} (from an unusable credential)"),
        });
    }

    pub fn published(&mut self, target: String) {
        self.published.push(target);
    }

    pub fn updated(&mut self, target: String) {
        self.updated.push(target);
    }

    pub fn unchanged(&mut self) {
        self.unchanged += 1;
    }

    pub fn kept_longer(&mut self, target: String, serial: &str, until: &str) {
        self.kept_longer.push(format!("{target} (serial {serial} until {until})"));
    }

    /// What is kept longer, to tell whether that is news ([`PassReport::event`]).
    pub fn kept(&self) -> &[String] {
        &self.kept_longer
    }

    /// Whether the pass had a proven candidate and so looked at every target.
    pub fn reached_targets(&self) -> bool {
        self.candidate.is_some()
    }

    pub fn replaced_other_server(&mut self, target: String, serial: &str) {
        self.replaced_other_server.push(format!("{target} (serial {serial})"));
    }

    pub fn replaced_unproven(&mut self, target: String, serial: &str, why: &str) {
        self.replaced_unproven.push(format!("{target} (serial {serial}: {why})"));
    }

    pub fn withdrawn(&mut self, target: String) {
        self.withdrawn.push(target);
    }

    pub fn write_failed(&mut self, target: String, error: &ApplyError) {
        self.first_error.get_or_insert_with(|| error.to_string());
        self.failed.push((target, error.short_reason()));
    }

    pub fn withdraw_failed(&mut self, target: String, error: &kube::Error) {
        self.first_error.get_or_insert_with(|| format!("deleting {target}: {error}"));
        self.failed.push((target, format!("not withdrawn, {}", kcp_keeper_runtime::apply::refused(error))));
    }

    /// The pass's Event: type, reason and note; `None` when it changed nothing and nothing failed. A target
    /// kept because it lasts longer changes nothing, so a pass that only keeps targets has an Event only when
    /// `kept_is_news` (what is kept is not what the last Event told). The reason is the weightiest outcome:
    /// `PublishFailed`, `ReplacedUnproven` (Warnings), then `ReplacedOtherServer`, `Rotated`, `Published`,
    /// `Updated`, `Withdrawn`, `KeptLonger`; the note tells all of them.
    pub fn event(&self, kubeconfig: &str, kept_is_news: bool) -> Option<(EventType, &'static str, String)> {
        let (kind, reason) = if !self.failed.is_empty() {
            (EventType::Warning, PUBLISH_FAILED)
        } else if !self.replaced_unproven.is_empty() {
            (EventType::Warning, "ReplacedUnproven")
        } else if !self.replaced_other_server.is_empty() {
            (EventType::Normal, "ReplacedOtherServer")
        } else if !self.rotated.is_empty() {
            (EventType::Normal, "Rotated")
        } else if !self.published.is_empty() {
            (EventType::Normal, "Published")
        } else if !self.updated.is_empty() {
            (EventType::Normal, "Updated")
        } else if !self.withdrawn.is_empty() {
            (EventType::Normal, "Withdrawn")
        } else if !self.kept_longer.is_empty() && kept_is_news {
            (EventType::Normal, "KeptLonger")
        } else {
            return None;
        };
        let what = self.candidate.as_ref().map_or_else(String::new, |c| format!(", {c}"));
        let head = format!(
            "kubeconfig {kubeconfig}{what}: {} rotated, {} published, {} updated, {} unchanged, {} kept longer, {} withdrawn, {} failed.",
            self.rotated.len(),
            self.published.len(),
            self.updated.len(),
            self.unchanged,
            self.kept_longer.len(),
            self.withdrawn.len(),
            self.failed.len()
        );
        let mut note = Note::new(&head);
        note.failures(&self.failed, self.first_error.as_deref());
        note.list("Replaced, lasting longer but failing its proof", &self.replaced_unproven)
            .list("Replaced, lasting longer but pointing at another server", &self.replaced_other_server)
            .list("Rotated", &self.rotated)
            .list("Published", &self.published)
            .list("Updated", &self.updated)
            .list("Withdrawn, no longer selected or allowed", &self.withdrawn)
            .list("Kept, lasting longer than the candidate", &self.kept_longer);
        Some((kind, reason, note.finish()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn foreign(target: &str) -> ApplyError {
        ApplyError::Foreign { kind: "Secret".into(), object: target.into() }
    }

    #[test]
    fn a_pass_that_changed_nothing_has_no_event_and_keeping_a_target_is_told_once() {
        let mut report = PassReport::default();
        report.candidate("0A", "2027-01-01T00:00:00Z");
        report.unchanged();
        assert!(report.event("admin", true).is_none());
        report.kept_longer("app/kcp-admin".into(), "0B", "2028-01-01T00:00:00Z");
        assert!(report.event("admin", false).is_none(), "kept as the last Event told: nothing new");
        let (kind, reason, note) = report.event("admin", true).expect("news");
        assert_eq!((kind, reason), (EventType::Normal, "KeptLonger"));
        assert!(note.contains("Kept, lasting longer than the candidate (1): app/kcp-admin (serial 0B until 2028"));
    }

    #[test]
    fn thirty_failures_make_one_warning_counting_all_and_naming_twenty() {
        let mut report = PassReport::default();
        report.candidate("0A", "2027-01-01T00:00:00Z");
        for i in 0..30 {
            let target = format!("t-{i:02}/kcp-admin");
            report.write_failed(target.clone(), &foreign(&target));
        }
        report.rotated("ok/kcp-admin".into(), Some("09"));
        let status = kube::core::Status::failure("denied", "Forbidden").with_code(403);
        report.withdraw_failed("old/kcp-admin".into(), &kube::Error::Api(Box::new(status)));
        let (kind, reason, note) = report.event("admin", false).expect("an Event");
        assert_eq!((kind, reason), (EventType::Warning, PUBLISH_FAILED));
        assert!(note.starts_with("kubeconfig admin, serial 0A (notAfter 2027-01-01T00:00:00Z): 1 rotated, "), "{note}");
        assert!(note.contains(" 31 failed."), "{note}");
        assert!(note.contains(" Failed, not owned (adopt: false) (30): t-00/kcp-admin, "), "{note}");
        assert!(note.contains("t-19/kcp-admin and 10 more."), "{note}");
        assert!(note.contains(" Failed, not withdrawn, refused 403 Forbidden (1): old/kcp-admin."), "{note}");
        assert!(note.contains("Rotated (1): ok/kcp-admin (from serial 09)."), "{note}");
    }

    #[test]
    fn the_reason_is_the_weightiest_outcome() {
        let mut report = PassReport::default();
        report.withdrawn("gone/kcp-admin".into());
        assert_eq!(report.event("a", false).map(|e| e.1), Some("Withdrawn"));
        report.updated("a/kcp-admin".into());
        assert_eq!(report.event("a", false).map(|e| e.1), Some("Updated"));
        report.published("b/kcp-admin".into());
        assert_eq!(report.event("a", false).map(|e| e.1), Some("Published"));
        report.rotated("c/kcp-admin".into(), None);
        assert_eq!(report.event("a", false).map(|e| e.1), Some("Rotated"));
        report.replaced_other_server("c/kcp-admin".into(), "0C");
        assert_eq!(report.event("a", false).map(|e| e.1), Some("ReplacedOtherServer"));
        report.replaced_unproven("d/kcp-admin".into(), "0D", "refused");
        assert_eq!(report.event("a", false).map(|e| (e.0, e.1)), Some((EventType::Warning, "ReplacedUnproven")));
    }
}
