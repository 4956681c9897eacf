//! The etcd calls of one defragmentation run: read the cluster, [`decide`], defragment the member through a
//! client connected to it alone (etcd's Defragment acts on the member that receives it), bounded by the
//! timeout, and read its size after. The snapshot before the run is the daemon's (`schedule`).

use std::time::{Duration, Instant};

use etcd_client::Client;

use super::{Cluster, Decision, Done, Outcome, Report, Stopped, decide};
use crate::config::Shard;
use crate::member::{READ_TIMEOUT, read_within, status, statuses};

/// How one run is bounded.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// One member's defragmentation at most.
    pub timeout: Duration,
    pub single_member: bool,
}

impl From<&crate::config::Defrag> for Settings {
    fn from(d: &crate::config::Defrag) -> Self {
        Self { timeout: d.timeout, single_member: d.single_member }
    }
}

/// Defragments the shard's members one at a time in configuration order; `done` hears of each member as it
/// is finished with (logs, metrics, and tests that look at the cluster between members).
pub async fn run(shard: &Shard, settings: Settings, done: &mut (dyn FnMut(&Done) + Send)) -> Report {
    let mut report = Report::default();
    for endpoint in &shard.endpoints {
        let cluster = read(shard).await;
        let before = match decide(&cluster, endpoint, settings.single_member) {
            Decision::Stop(why) => {
                report.stopped = Some(Stopped::MemberUnhealthy { member: endpoint.clone(), why });
                return report;
            }
            Decision::SkipLeader => {
                tracing::info!(
                    shard = shard.name,
                    member = endpoint,
                    "defrag: the leader is not defragmented while it has followers"
                );
                let skipped = Done { member: endpoint.clone(), result: Outcome::SkippedLeader, seconds: 0.0 };
                done(&skipped);
                report.members.push(skipped);
                continue;
            }
            Decision::Defragment => own_size(&cluster, endpoint),
        };
        tracing::info!(shard = shard.name, member = endpoint, db_size = before, "defragmenting");
        let started = Instant::now();
        let (outcome, stopped) = match defragment(shard, endpoint, settings.timeout).await {
            Ok(()) => match size_after(shard, endpoint, settings.timeout).await {
                Ok(after) => (Outcome::Defragmented { before, after }, None),
                Err(why) => (
                    Outcome::Defragmented { before, after: before },
                    Some(Stopped::MemberUnhealthy { member: endpoint.clone(), why }),
                ),
            },
            Err(Failure::Timeout) => (
                Outcome::Timeout,
                Some(Stopped::Timeout { member: endpoint.clone(), seconds: settings.timeout.as_secs_f64() }),
            ),
            Err(Failure::Error(error)) => (Outcome::Failed, Some(Stopped::Failed { member: endpoint.clone(), error })),
        };
        let finished = Done { member: endpoint.clone(), result: outcome, seconds: started.elapsed().as_secs_f64() };
        done(&finished);
        report.members.push(finished);
        if stopped.is_some() {
            report.stopped = stopped;
            return report;
        }
    }
    report
}

fn own_size(cluster: &Cluster, endpoint: &str) -> i64 {
    cluster.members.iter().find(|(e, _)| e == endpoint).and_then(|(_, s)| s.as_ref().ok()).map_or(0, |s| s.db_size)
}

enum Failure {
    Timeout,
    Error(String),
}

async fn defragment(shard: &Shard, endpoint: &str, timeout: Duration) -> Result<(), Failure> {
    let mut client = crate::member::connect(endpoint, shard.tls.as_ref())
        .await
        .map_err(|e| Failure::Error(format!("connecting: {e:#}")))?;
    match tokio::time::timeout(timeout, client.defragment()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Failure::Error(e.to_string())),
        // Dropping the call does not stop etcd: the member finishes on its own, and the run goes no further.
        Err(_) => Err(Failure::Timeout),
    }
}

/// The member's database size once it answers again after defragmenting (it may be catching up).
async fn size_after(shard: &Shard, endpoint: &str, timeout: Duration) -> Result<i64, String> {
    let deadline = Instant::now() + timeout.max(READ_TIMEOUT);
    loop {
        match status(shard, endpoint).await {
            Ok((_, seen)) => return Ok(seen.db_size),
            Err(error) if Instant::now() >= deadline => {
                return Err(format!("it did not answer after defragmenting: {error}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Every configured member's status, and the alarms and voting members as the first that answers lists
/// them (a member that answers Status but not those is counted as not answering).
pub async fn read(shard: &Shard) -> Cluster {
    let (members, listed) = statuses(shard, lists).await;
    let (alarms, voting_members) = listed.unwrap_or_default();
    Cluster { members, alarms, voting_members }
}

async fn lists(client: &mut Client) -> Result<(crate::member::Alarms, usize), String> {
    let alarms = crate::member::alarms(client).await.map_err(|e| format!("{e:#}"))?;
    let members = read_within("member list", client.member_list()).await?;
    Ok((alarms, members.members().iter().filter(|m| !m.is_learner()).count()))
}
