//! etcd health, per member of every shard, read every [`INTERVAL`] by each replica (read-only Status and
//! Alarm calls, no leadership needed): the database's size on disk against its quota (etcd 3.6 reports
//! `--quota-backend-bytes` in Status; 0 when an older etcd does not), the size in use (what a
//! defragmentation would leave), the cluster's alarms (NOSPACE, CORRUPT) and leader changes. A member that
//! does not answer keeps its last values and is counted in `member_up` as 0.
//!
//! The pure part ([`Leader`]: when the leader changed) is apart from the reads ([`poll`]).

use std::time::Duration;

use crate::config::Shard;
use crate::labels::MemberLabels;
use crate::member::{Alarms, MemberStatus, statuses};
use crate::metrics::Metrics;

/// How often each shard's members are read.
pub const INTERVAL: Duration = Duration::from_secs(15);
/// One poll of a shard: each endpoint's status (`None`: it did not answer) and the cluster's alarms as the
/// first member that answered listed them.
#[derive(Debug, Default)]
pub struct Poll {
    pub members: Vec<(String, Option<MemberStatus>)>,
    pub alarms: Option<Alarms>,
}

impl Poll {
    /// The leader the answering members agree on most (a member cut off may still name an old one).
    pub fn leader(&self) -> Option<u64> {
        let mut votes: Vec<(u64, usize)> = Vec::new();
        for status in self.members.iter().filter_map(|(_, s)| s.as_ref()).filter(|s| s.leader != 0) {
            match votes.iter_mut().find(|(id, _)| *id == status.leader) {
                Some((_, n)) => *n += 1,
                None => votes.push((status.leader, 1)),
            }
        }
        votes.into_iter().max_by_key(|(_, n)| *n).map(|(id, _)| id)
    }
}

/// Leader changes of one shard, as polls see them: the first leader seen is not a change; a poll with no
/// leader (no quorum, nothing answered) is not one either, and the next leader is compared with the last
/// one known.
#[derive(Debug, Default)]
pub struct Leader {
    last: Option<u64>,
}

impl Leader {
    /// Whether `now` is a change from the last leader seen.
    pub fn changed(&mut self, now: Option<u64>) -> bool {
        let Some(now) = now else { return false };
        let changed = self.last.is_some_and(|last| last != now);
        self.last = Some(now);
        changed
    }
}

/// Reads the shard's members every [`INTERVAL`] into the metrics until `stop`.
pub async fn run(shard: &Shard, metrics: &Metrics, stop: &tokio_util::sync::CancellationToken) {
    let mut leader = Leader::default();
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let read = tokio::select! {
            () = stop.cancelled() => return,
            read = poll(shard) => read,
        };
        let changed = leader.changed(read.leader());
        if changed {
            tracing::info!(
                shard = shard.name,
                leader = format!("{:x}", read.leader().unwrap_or_default()),
                "etcd leader changed"
            );
        }
        record(metrics, &shard.name, &read, changed);
    }
}

/// Reads every member of `shard`.
pub async fn poll(shard: &Shard) -> Poll {
    // The alarms as the first member that answers lists them; one that does not is not answering.
    let alarms =
        async |client: &mut etcd_client::Client| crate::member::alarms(client).await.map_err(|e| format!("{e:#}"));
    let (members, alarms) = statuses(shard, alarms).await;
    let members = members
        .into_iter()
        .map(|(endpoint, answer)| {
            let answer = answer.inspect_err(|error| {
                tracing::debug!(shard = shard.name, endpoint, error, "health: member did not answer")
            });
            (endpoint, answer.ok())
        })
        .collect();
    Poll { members, alarms }
}

/// Sets the health series of one poll of `shard`; `changed` counts a leader change.
fn record(metrics: &Metrics, shard: &str, poll: &Poll, changed: bool) {
    metrics.clock_offset.set(crate::clock::offset());
    for (endpoint, status) in &poll.members {
        let labels = MemberLabels { shard: shard.into(), member: endpoint.clone() };
        metrics.health.up.get_or_create(&labels).set(status.is_some() as i64);
        if let Some(status) = status {
            metrics.health.db_size.get_or_create(&labels).set(status.db_size);
            metrics.health.db_size_in_use.get_or_create(&labels).set(status.db_size_in_use);
            metrics.health.quota.get_or_create(&labels).set(status.quota);
        }
    }
    let changes = metrics.health.leader_changes.get_or_create(&metrics.shard(shard));
    if changed {
        changes.inc();
    }
    if let Some(alarms) = &poll.alarms {
        metrics.alarms_seen(shard, alarms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(leader: u64) -> Option<MemberStatus> {
        Some(MemberStatus { endpoint: String::new(), id: 1, db_size: 0, db_size_in_use: 0, quota: 0, leader })
    }

    #[test]
    fn the_first_leader_is_not_a_change_a_new_one_is_and_a_poll_without_quorum_is_neither() {
        let mut leader = Leader::default();
        assert!(!leader.changed(Some(7)), "first seen");
        assert!(!leader.changed(Some(7)));
        assert!(!leader.changed(None), "no quorum");
        assert!(leader.changed(Some(9)), "a new leader after a poll without one");
        assert!(!leader.changed(Some(9)));
    }

    #[test]
    fn the_leader_is_the_one_most_answering_members_name() {
        let poll = Poll {
            members: vec![
                ("a".into(), member(9)),
                ("b".into(), member(9)),
                ("c".into(), member(7)),
                ("d".into(), None),
            ],
            alarms: None,
        };
        assert_eq!(poll.leader(), Some(9));
        let none = Poll { members: vec![("a".into(), member(0)), ("b".into(), None)], alarms: None };
        assert_eq!(none.leader(), None);
    }
}
