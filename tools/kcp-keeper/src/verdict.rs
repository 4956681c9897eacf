//! One line per check: its result, what it saw, what to do, and the runbook entry; as text or JSON.

use kcp_keeper_runtime::redact;
use serde::Serialize;

/// Where the runbook entries live (`docs/runbooks.md`, one `## doctor: <check>` section per check).
pub const RUNBOOKS: &str = "https://github.com/kcp-keeper/kcp-keeper/blob/main/docs/runbooks.md";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Ok,
    /// The check was not made, and the line says why (e.g. it needs a Secret the in-cluster doctor does not
    /// read). Worse than ok, so a report of such lines does not read as all well; never a failure.
    NotChecked,
    Warn,
    Fail,
}

impl Level {
    /// As printed: `ok`, `skip`, `warn`, `FAIL` (capitals so a failure stands out in a terminal).
    pub fn word(self) -> &'static str {
        match self {
            Level::Fail => "FAIL",
            Level::NotChecked => "skip",
            _ => self.label(),
        }
    }

    /// The `result` label of `kcp_keeper_doctor_check`.
    pub fn label(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::NotChecked => "not_checked",
            Level::Warn => "warn",
            Level::Fail => "fail",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// A stable id (`pinned-images`, `split-horizon`, ...): the runbook anchor and the metric's `check` label.
    pub check: &'static str,
    /// What was looked at (`rootshard/root`, `deployment/alpha-shard-kcp`, ...).
    pub subject: String,
    pub result: Level,
    pub saw: String,
    /// What to do; empty when the result is ok.
    pub todo: String,
    pub runbook: String,
}

impl Verdict {
    /// Every text of a line has the userinfo of any URL in it redacted ([`redact::urls_in`]): the rules redact
    /// the URLs they show, and this catches those inside other libraries' error messages.
    fn new(check: &'static str, subject: impl Into<String>, result: Level, saw: impl Into<String>) -> Self {
        Self {
            check,
            subject: redact::urls_in(&subject.into()),
            result,
            saw: redact::urls_in(&saw.into()),
            todo: String::new(),
            runbook: format!("{RUNBOOKS}#doctor-{check}"),
        }
    }

    pub fn ok(check: &'static str, subject: impl Into<String>, saw: impl Into<String>) -> Self {
        Self::new(check, subject, Level::Ok, saw)
    }

    pub fn warn(check: &'static str, subject: impl Into<String>, saw: impl Into<String>, todo: &str) -> Self {
        Self { todo: redact::urls_in(todo), ..Self::new(check, subject, Level::Warn, saw) }
    }

    pub fn fail(check: &'static str, subject: impl Into<String>, saw: impl Into<String>, todo: &str) -> Self {
        Self { todo: redact::urls_in(todo), ..Self::new(check, subject, Level::Fail, saw) }
    }

    /// A check not made: `saw` is "not checked: <why>", `todo` what would let it be made.
    pub fn not_checked(check: &'static str, subject: impl Into<String>, why: &str, todo: &str) -> Self {
        Self {
            todo: redact::urls_in(todo),
            ..Self::new(check, subject, Level::NotChecked, format!("not checked: {why}"))
        }
    }

    /// `FAIL  pinned-images  rootshard/root: saw ... -> todo (runbook)`.
    pub fn line(&self) -> String {
        let mut line = format!("{:<4}  {:<22} {}: {}", self.result.word(), self.check, self.subject, self.saw);
        if !self.todo.is_empty() {
            line.push_str(&format!(" -> {} ({})", self.todo, self.runbook));
        }
        line
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub checks: Vec<Verdict>,
}

impl Report {
    pub fn worst(&self) -> Level {
        self.checks.iter().map(|v| v.result).max().unwrap_or(Level::Ok)
    }

    pub fn text(&self) -> String {
        let mut out: String = self.checks.iter().map(|v| v.line() + "\n").collect();
        let count = |l: Level| self.checks.iter().filter(|v| v.result == l).count();
        out.push_str(&format!(
            "{} checks: {} ok, {} warn, {} FAIL, {} not checked\n",
            self.checks.len(),
            count(Level::Ok),
            count(Level::Warn),
            count(Level::Fail),
            count(Level::NotChecked)
        ));
        out
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serializes")
    }

    /// The verdicts of one check.
    pub fn of(&self, check: &str) -> Vec<&Verdict> {
        self.checks.iter().filter(|v| v.check == check).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_line_says_what_to_do_and_links_its_runbook_entry() {
        let v = Verdict::fail("pinned-images", "rootshard/root", "no image tag", "pin spec.image.tag");
        let line = v.line();
        assert!(line.starts_with("FAIL"), "{line}");
        assert!(line.contains("pin spec.image.tag"), "{line}");
        assert!(line.ends_with(&format!("({RUNBOOKS}#doctor-pinned-images)")), "{line}");
        assert!(!Verdict::ok("pinned-images", "x", "pinned").line().contains("->"));
    }

    #[test]
    fn the_worst_result_of_a_report_decides_and_json_carries_every_field() {
        let mut r = Report { checks: vec![Verdict::ok("a", "x", "fine")] };
        assert_eq!(r.worst(), Level::Ok);
        r.checks.push(Verdict::warn("b", "y", "meh", "look"));
        assert_eq!(r.worst(), Level::Warn);
        r.checks.push(Verdict::fail("c", "z", "bad", "fix"));
        assert_eq!(r.worst(), Level::Fail);
        let json: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(json["checks"][2]["result"], "fail");
        assert_eq!(json["checks"][2]["todo"], "fix");
        assert_eq!(json["checks"][1]["check"], "b");
    }

    #[test]
    fn a_url_with_userinfo_in_any_text_of_a_line_is_shown_redacted_in_text_and_json() {
        let url = "https://admin:hunter2@kcp.example.com:6443";
        let r = Report {
            checks: vec![
                Verdict::fail(
                    "x",
                    format!("endpoint {url}"),
                    format!("error sending request for url ({url}/healthz)"),
                    &format!("fix {url}"),
                ),
                Verdict::warn("y", "s", format!("saw {url}"), "look"),
                Verdict::ok("z", "s", format!("fine: {url}")),
            ],
        };
        for shown in [r.text(), r.json()] {
            assert!(!shown.contains("hunter2") && !shown.contains("admin:"), "{shown}");
            assert_eq!(shown.matches("https://REDACTED@kcp.example.com:6443").count(), 5, "{shown}");
        }
    }
}
