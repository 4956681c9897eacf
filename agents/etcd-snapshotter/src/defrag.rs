//! Scheduled defragmentation of a shard's etcd members (opt-in, `shards[].defrag`). etcd's defragmentation
//! rewrites a member's database file to give back the pages compaction freed; while it runs the member
//! serves nothing, which is why Gardener's users report stalls with it on. So, on the agent's leader only:
//!
//! - a full snapshot first, and no defragmentation at all when that snapshot fails;
//! - members one at a time, in configuration order, each bounded by `defrag.timeout`: a timeout or an error
//!   stops the run (the member may still be defragmenting; the next one must not join it);
//! - right before each member, the whole cluster is read again: every member must answer, one leader must be
//!   agreed and no CORRUPT alarm be active, else the run stops with the reason; a member that is the leader
//!   (leadership may have moved since the last one) is skipped while the cluster has other members, and a
//!   single-member cluster is defragmented only with `defrag.singleMember`.
//!
//! This module is the pure part: what to do with a member given what the cluster said ([`decide`]), and what
//! a run did ([`Report`]). `defrag::run` makes the etcd calls.

pub mod metrics;
pub mod run;

use crate::member::MemberStatus;
use crate::member::{Alarm, Alarms};

/// The cluster as read right before defragmenting a member: every configured endpoint's answer (an error
/// text when it did not answer), the cluster's alarms, and how many voting members its member list has.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    pub members: Vec<(String, Result<MemberStatus, String>)>,
    pub alarms: Alarms,
    pub voting_members: usize,
}

/// What to do with the next member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Defragment,
    /// The member leads a cluster with followers, or is a single member without `singleMember`.
    SkipLeader,
    /// The cluster is not healthy: the run stops here, with why.
    Stop(String),
}

/// Decides for the member at `endpoint` from a fresh read of the whole cluster.
pub fn decide(cluster: &Cluster, endpoint: &str, single_member: bool) -> Decision {
    for (other, answer) in &cluster.members {
        if let Err(error) = answer {
            return Decision::Stop(format!("member {other} does not answer: {error}"));
        }
    }
    if let Some((id, _)) = cluster.alarms.iter().find(|(_, alarm)| *alarm == Alarm::Corrupt) {
        return Decision::Stop(format!("member {id:x} has a CORRUPT alarm"));
    }
    let seen: Vec<&MemberStatus> = cluster.members.iter().filter_map(|(_, a)| a.as_ref().ok()).collect();
    let leaders: Vec<u64> = seen.iter().map(|s| s.leader).collect();
    let Some(&leader) = leaders.first().filter(|l| **l != 0 && leaders.iter().all(|x| x == *l)) else {
        return Decision::Stop(format!("the members do not agree on a leader ({leaders:x?}): no stable quorum"));
    };
    let Some(target) = seen.iter().find(|s| s.endpoint == endpoint) else {
        return Decision::Stop(format!("member {endpoint} was not read"));
    };
    if target.id != leader {
        return Decision::Defragment;
    }
    // A leader whose cluster has no other voting member is the whole shard: only when the config says so.
    if cluster.voting_members.max(cluster.members.len()) <= 1 && single_member {
        Decision::Defragment
    } else {
        Decision::SkipLeader
    }
}

/// Why a run stopped before its end: the `reason` label of `defrag_failures_total`.
#[derive(Debug, Clone, PartialEq, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum Stopped {
    /// The snapshot before it failed (its own reason): nothing was defragmented.
    #[error("the snapshot before defragmenting failed ({0}); nothing was defragmented")]
    SnapshotFailed(&'static str),
    #[error("stopped before {member}: {why}")]
    MemberUnhealthy { member: String, why: String },
    #[error(
        "defragmenting {member} did not finish within {seconds:.0}s; it may still be running, no further member was touched"
    )]
    Timeout { member: String, seconds: f64 },
    #[error("defragmenting {member} failed: {error}; no further member was touched")]
    Failed { member: String, error: String },
}

/// What happened to one member; its name is the `result` label of `member_defrag_last_result`, each of
/// [`Outcome::VARIANTS`] exported at 0 from the start.
#[derive(Debug, Clone, PartialEq, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum Outcome {
    /// Its database file went from `before` to `after` bytes.
    Defragmented {
        before: i64,
        after: i64,
    },
    SkippedLeader,
    Timeout,
    Failed,
}

impl Outcome {
    /// The `result` label of `member_defrag_last_result`.
    pub fn as_str(&self) -> &'static str {
        self.into()
    }

    /// Bytes given back: the file's size before less after (0 when writes grew it meanwhile).
    pub fn reclaimed(&self) -> i64 {
        match self {
            Outcome::Defragmented { before, after } => (before - after).max(0),
            _ => 0,
        }
    }
}

/// One member's outcome, in the order the run reached it.
#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    pub member: String,
    pub result: Outcome,
    pub seconds: f64,
}

/// What a run did: each member reached, and why it stopped early if it did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub members: Vec<Done>,
    pub stopped: Option<Stopped>,
}

impl Report {
    /// One line for logs and Events.
    pub fn summary(&self) -> String {
        let members: Vec<String> = self
            .members
            .iter()
            .map(|d| match &d.result {
                Outcome::Defragmented { before, after } => {
                    format!("{} defragmented {before} -> {after} bytes in {:.1}s", d.member, d.seconds)
                }
                other => format!("{} {}", d.member, other.as_str()),
            })
            .collect();
        let members = if members.is_empty() { "no member defragmented".to_string() } else { members.join(", ") };
        match &self.stopped {
            None => members,
            Some(stopped) => format!("{members}; {stopped}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(endpoint: &str, id: u64, leader: u64) -> (String, Result<MemberStatus, String>) {
        let status = MemberStatus { endpoint: endpoint.into(), id, leader, db_size: 1, db_size_in_use: 1, quota: 0 };
        (endpoint.into(), Ok(status))
    }

    fn three(leader: u64) -> Cluster {
        Cluster {
            members: vec![seen("a", 1, leader), seen("b", 2, leader), seen("c", 3, leader)],
            alarms: vec![],
            voting_members: 3,
        }
    }

    #[test]
    fn followers_are_defragmented_and_the_leader_of_a_cluster_with_followers_never() {
        let cluster = three(2);
        assert_eq!(decide(&cluster, "a", false), Decision::Defragment);
        assert_eq!(decide(&cluster, "b", false), Decision::SkipLeader);
        assert_eq!(decide(&cluster, "b", true), Decision::SkipLeader, "singleMember says nothing about 3 members");
        assert_eq!(decide(&cluster, "c", false), Decision::Defragment);
        // Leadership moved to a: b is now a follower, a the leader.
        let moved = three(1);
        assert_eq!(decide(&moved, "a", false), Decision::SkipLeader);
        assert_eq!(decide(&moved, "b", false), Decision::Defragment);
    }

    #[test]
    fn a_single_member_is_its_leader_and_defragmented_only_with_single_member() {
        let mut one = Cluster { members: vec![seen("a", 1, 1)], alarms: vec![], voting_members: 1 };
        assert_eq!(decide(&one, "a", false), Decision::SkipLeader);
        assert_eq!(decide(&one, "a", true), Decision::Defragment);
        // One endpoint configured of a cluster with three voting members: the leader has followers.
        one.voting_members = 3;
        assert_eq!(decide(&one, "a", true), Decision::SkipLeader);
    }

    #[test]
    fn a_member_that_does_not_answer_a_corrupt_alarm_or_no_agreed_leader_stops_the_run() {
        let mut down = three(2);
        down.members[2].1 = Err("connecting timed out".into());
        let Decision::Stop(why) = decide(&down, "a", false) else { panic!("a member down must stop the run") };
        assert!(why.contains("member c does not answer: connecting timed out"), "{why}");

        let mut corrupt = three(2);
        corrupt.alarms = vec![(3, Alarm::Corrupt)];
        assert!(matches!(decide(&corrupt, "a", false), Decision::Stop(w) if w.contains("CORRUPT")));
        let mut nospace = three(2);
        nospace.alarms = vec![(3, Alarm::Nospace)];
        assert_eq!(decide(&nospace, "a", false), Decision::Defragment, "defragmenting is how NOSPACE is cleared");

        let mut split = three(2);
        split.members[0] = seen("a", 1, 1);
        assert!(matches!(decide(&split, "c", false), Decision::Stop(w) if w.contains("do not agree on a leader")));
        let none = three(0);
        assert!(matches!(decide(&none, "a", false), Decision::Stop(_)), "no leader at all");
    }

    #[test]
    fn the_summary_names_every_member_reached_and_why_the_run_stopped() {
        let report = Report {
            members: vec![
                Done { member: "a".into(), result: Outcome::Defragmented { before: 100, after: 40 }, seconds: 1.0 },
                Done { member: "b".into(), result: Outcome::Timeout, seconds: 5.0 },
            ],
            stopped: Some(Stopped::Timeout { member: "b".into(), seconds: 5.0 }),
        };
        let text = report.summary();
        assert!(text.contains("a defragmented 100 -> 40 bytes"), "{text}");
        assert!(text.contains("b timeout; defragmenting b did not finish within 5s"), "{text}");
        assert_eq!(report.members[0].result.reclaimed(), 60);
        assert_eq!(Outcome::Defragmented { before: 10, after: 20 }.reclaimed(), 0, "writes grew it");
        let reason: &'static str = report.stopped.as_ref().unwrap().into();
        assert_eq!(reason, "timeout");
    }
}
