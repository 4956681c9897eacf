//! Which snapshots to keep: keep-last, then grandfather-father-son buckets (hourly, daily, weekly, monthly),
//! then the newest `minVerified` drill-verified ones. Pure: the caller lists, this decides, the caller deletes.
//!
//! The two failures this field reports most are guarded here by construction:
//! - order is by revision as a number (never by object name, where `r999` sorts after `r1000`);
//! - a run that did not just produce a proven snapshot deletes nothing ([`Trigger`]), so a string of failed
//!   snapshots never eats into what is left.

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Datelike, Timelike, Utc};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    pub keep_last: usize,
    pub hourly: usize,
    pub daily: usize,
    pub weekly: usize,
    pub monthly: usize,
    pub min_verified: usize,
}

/// One snapshot as its manifest describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: String,
    pub revision: u64,
    pub taken_at: DateTime<Utc>,
    pub verified: bool,
}

/// Why retention runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// A snapshot was just proven and published with this id.
    AfterSuccess(String),
    /// Anything else (a failed run, a manual look): nothing may be deleted.
    Other,
}

/// Why a snapshot is kept (every reason that applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    Last,
    Hourly,
    Daily,
    Weekly,
    Monthly,
    Verified,
    /// Nothing is deleted in this run (see [`Trigger`]).
    NoSuccess,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Newest first, with the reasons each one is kept.
    pub keep: Vec<(String, Vec<Reason>)>,
    /// Newest first.
    pub delete: Vec<String>,
}

/// Orders newest first: by revision as a number, then by time (two snapshots at one revision: an idle shard).
pub fn newest_first(entries: &mut [Entry]) {
    entries.sort_by(|a, b| b.revision.cmp(&a.revision).then(b.taken_at.cmp(&a.taken_at)).then(b.id.cmp(&a.id)));
}

/// The GFS bucket a time falls in (year and period within it).
type BucketOf = fn(&DateTime<Utc>) -> (i32, u32, u32);

pub fn plan(entries: &[Entry], policy: &Policy, trigger: &Trigger) -> Decision {
    let mut sorted = entries.to_vec();
    newest_first(&mut sorted);
    let mut reasons: BTreeMap<usize, Vec<Reason>> = BTreeMap::new();
    let mut add = |i: usize, reason: Reason| reasons.entry(i).or_default().push(reason);

    // Only a run that just published the newest snapshot may delete anything.
    let may_delete =
        matches!(trigger, Trigger::AfterSuccess(id) if sorted.first().is_some_and(|newest| &newest.id == id));
    if !may_delete {
        for i in 0..sorted.len() {
            add(i, Reason::NoSuccess);
        }
    }
    // keepLast is at least 1 by configuration; the newest is kept even if it were 0.
    for i in 0..policy.keep_last.max(1).min(sorted.len()) {
        add(i, Reason::Last);
    }
    let buckets: [(usize, Reason, BucketOf); 4] = [
        (policy.hourly, Reason::Hourly, |t| (t.year(), t.ordinal(), t.hour())),
        (policy.daily, Reason::Daily, |t| (t.year(), t.ordinal(), 0)),
        (policy.weekly, Reason::Weekly, |t| (t.iso_week().year(), t.iso_week().week(), 0)),
        (policy.monthly, Reason::Monthly, |t| (t.year(), t.month(), 0)),
    ];
    for (count, reason, bucket) in buckets {
        // Newest first: the first snapshot seen in a bucket is that bucket's representative.
        let mut seen = HashSet::new();
        for (i, entry) in sorted.iter().enumerate() {
            if seen.len() == count {
                break;
            }
            if seen.insert(bucket(&entry.taken_at)) {
                add(i, reason);
            }
        }
    }
    for (i, _) in sorted.iter().enumerate().filter(|(_, e)| e.verified).take(policy.min_verified) {
        add(i, Reason::Verified);
    }

    let mut decision = Decision::default();
    for (i, entry) in sorted.into_iter().enumerate() {
        match reasons.remove(&i) {
            Some(mut why) => {
                why.sort();
                why.dedup();
                decision.keep.push((entry.id, why));
            }
            None => decision.delete.push(entry.id),
        }
    }
    decision
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    fn entry(id: &str, revision: u64, time: &str) -> Entry {
        Entry { id: id.into(), revision, taken_at: at(time), verified: false }
    }

    fn ids(decision: &Decision) -> Vec<&str> {
        decision.keep.iter().map(|(id, _)| id.as_str()).collect()
    }

    const LAST_TWO: Policy = Policy { keep_last: 2, hourly: 0, daily: 0, weekly: 0, monthly: 0, min_verified: 0 };

    #[test]
    fn order_is_by_revision_as_a_number_across_a_change_in_digit_count() {
        // By name, "r999" sorts after "r1000" and "r10000"; the clock of the host that took r999 was ahead.
        let entries = vec![
            entry("root/20261130T120000Z-r999", 999, "2026-11-30T12:00:00Z"),
            entry("root/20261130T110000Z-r1000", 1000, "2026-11-30T11:00:00Z"),
            entry("root/20261130T100000Z-r10000", 10000, "2026-11-30T10:00:00Z"),
        ];
        let d = plan(&entries, &LAST_TWO, &Trigger::AfterSuccess("root/20261130T100000Z-r10000".into()));
        assert_eq!(ids(&d), ["root/20261130T100000Z-r10000", "root/20261130T110000Z-r1000"]);
        assert_eq!(d.delete, ["root/20261130T120000Z-r999"]);
    }

    #[test]
    fn gfs_keeps_the_newest_of_each_bucket() {
        let entries = vec![
            entry("a", 10, "2026-11-30T10:50:00Z"),
            entry("b", 9, "2026-11-30T10:10:00Z"),
            entry("c", 8, "2026-11-30T09:10:00Z"),
            entry("d", 7, "2026-11-29T23:00:00Z"),
            entry("e", 6, "2026-11-29T08:00:00Z"),
            entry("f", 5, "2026-10-15T08:00:00Z"),
            entry("g", 4, "2026-10-01T08:00:00Z"),
        ];
        let policy = Policy { keep_last: 1, hourly: 2, daily: 2, weekly: 0, monthly: 3, min_verified: 0 };
        let d = plan(&entries, &policy, &Trigger::AfterSuccess("a".into()));
        let kept: BTreeMap<_, _> = d.keep.iter().cloned().collect();
        assert_eq!(kept["a"], [Reason::Last, Reason::Hourly, Reason::Daily, Reason::Monthly]);
        assert_eq!(kept["c"], [Reason::Hourly]);
        assert_eq!(kept["d"], [Reason::Daily]);
        assert_eq!(kept["f"], [Reason::Monthly], "the newest of October");
        assert_eq!(d.delete, ["b", "e", "g"]);
    }

    #[test]
    fn the_newest_verified_snapshots_are_never_deleted() {
        let mut entries: Vec<Entry> =
            (1..=6).map(|r| entry(&format!("s{r}"), r, &format!("2026-11-30T0{r}:00:00Z"))).collect();
        entries[0].verified = true; // s1
        entries[2].verified = true; // s3
        let policy = Policy { min_verified: 1, ..LAST_TWO };
        let d = plan(&entries, &policy, &Trigger::AfterSuccess("s6".into()));
        assert_eq!(ids(&d), ["s6", "s5", "s3"]);
        let policy = Policy { min_verified: 5, ..LAST_TWO };
        let d = plan(&entries, &policy, &Trigger::AfterSuccess("s6".into()));
        assert_eq!(ids(&d), ["s6", "s5", "s3", "s1"]);
    }

    #[test]
    fn nothing_is_deleted_unless_the_run_just_published_the_newest_snapshot() {
        let entries: Vec<Entry> =
            (1..=5).map(|r| entry(&format!("s{r}"), r, &format!("2026-11-30T0{r}:00:00Z"))).collect();
        for trigger in [Trigger::Other, Trigger::AfterSuccess("s3".into()), Trigger::AfterSuccess("gone".into())] {
            let d = plan(&entries, &LAST_TWO, &trigger);
            assert!(d.delete.is_empty(), "{trigger:?}: {d:?}");
            assert_eq!(d.keep.len(), 5);
        }
        let d = plan(&entries, &LAST_TWO, &Trigger::AfterSuccess("s5".into()));
        assert_eq!(d.delete, ["s3", "s2", "s1"]);
    }
}
