//! `plan --at <time|latest-consistent>`: what restoring every shard to one point in time would take, read from
//! the bucket alone (no etcd is asked, nothing is written). A kcp installation is several shards on independent
//! etcds: restored to different times they hold a state that never existed, so they are restored to one.
//!
//! Per shard, what it can reach: from its oldest snapshot's start to its newest recovery point, the time its
//! delta writer proved and stored (`delta::recovery`), or its newest snapshot's start when that is later (a
//! shard without deltas reaches only that). `latest-consistent` is the newest time every shard reaches: the
//! minimum of those recovery points, lowered out of any shard's gap between two writer sessions (after one
//! session's last proof, before the next session's watch opened: a time no restore can place) to the last proof
//! before that gap, until no shard has the point in a gap ([`latest_consistent`]; each session's span is read
//! from its proofs in the chains, `recovery::proofs`). For the point, each shard's base is chosen and its chain walked exactly as
//! `restore --at` does (`replay::base`, then `replay::replay` without a member: every delta read and proven,
//! nothing applied), so the plan names the snapshot, the deltas and the revision that restore would use. A
//! point a shard cannot reach (before its oldest snapshot, after its recovery point, behind a broken chain) is
//! an error naming the shard and what it reaches.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::clock::stamp;
use crate::delta::SigningKey;
use crate::delta::recovery::{self, RecoveryPoint};
use crate::delta::replay::{self, Outcome, Point};
use crate::encode::Identity;
use crate::generation::{self, Own};
use crate::manifest::Manifest;
use crate::storage::Store;

/// The point a plan restores every shard to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    Time(DateTime<Utc>),
    /// The newest time every shard reaches.
    LatestConsistent,
}

impl FromStr for At {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text == "latest-consistent" {
            return Ok(At::LatestConsistent);
        }
        DateTime::parse_from_rfc3339(text)
            .map(|t| At::Time(t.with_timezone(&Utc)))
            .map_err(|_| "an RFC 3339 time (2026-12-01T12:00:00Z) or latest-consistent".into())
    }
}

/// What one shard can reach, from the bucket.
#[derive(Debug, Clone)]
pub struct Reach {
    pub shard: String,
    /// The shard's cluster: the recovery point's, else the one cluster of its snapshots.
    own: Option<Own>,
    /// The oldest snapshot of that cluster (by start).
    pub oldest: Manifest,
    /// Its newest recovery point: the stored one, or the newest snapshot's start when that is later.
    pub newest: DateTime<Utc>,
    pub stored: Option<RecoveryPoint>,
    /// What the shard's writer sessions proved, each from when its watch opened to its newest proof, and the
    /// stored recovery point (its session unknown to it: from that point to itself).
    pub spans: Vec<(DateTime<Utc>, DateTime<Utc>)>,
}

impl Reach {
    fn describe(&self) -> String {
        let from = stamp(self.oldest.started_at);
        let how = match &self.stored {
            Some(point) if point.time() >= self.newest => "its stored recovery point",
            Some(_) => "its newest snapshot's start, past its stored recovery point",
            None => "its newest snapshot's start: no recovery point is stored (no deltas)",
        };
        format!("it reaches from {from} (snapshot {}) to {} ({how})", self.oldest.id, stamp(self.newest))
    }
}

/// Reads what `shard` can reach, one [`Reach`] per etcd cluster its snapshots come from, its own first: the
/// cluster of its stored recovery point (refused when it is not signed by `key`, if one is configured), else
/// the only cluster of its snapshots. An etcd re-created from empty volumes is a new cluster; the one before it
/// still reaches what its sessions proved, from its oldest snapshot to its last proof, and a restore to a time
/// of it takes that cluster's snapshot and deltas.
pub async fn reaches(store: &Store, shard: &str, key: Option<&SigningKey>) -> anyhow::Result<Vec<Reach>> {
    let all = crate::catalog::list(store, Some(shard)).await?;
    let stored = recovery::read(store, shard, key).await?;
    let own = match &stored {
        Some(point) => Some(point.cluster_id.clone()),
        None => generation::only_cluster(&all).map_err(|e| anyhow::anyhow!("shard {shard}: {e}"))?,
    };
    let mut clusters: Vec<String> = own.iter().cloned().collect();
    for manifest in &all {
        let cluster = generation::cluster_of(manifest);
        if !clusters.iter().any(|c| c == cluster) {
            clusters.push(cluster.to_string());
        }
    }
    let mut out = Vec::new();
    for cluster in clusters {
        let of_cluster: Vec<Manifest> = all.iter().filter(|m| generation::cluster_of(m) == cluster).cloned().collect();
        let stored = stored.clone().filter(|point| point.cluster_id == cluster);
        out.extend(reach_of(store, shard, key, of_cluster, stored).await?);
    }
    anyhow::ensure!(!out.is_empty(), "shard {shard}: no published snapshot of its etcd cluster in the bucket");
    Ok(out)
}

/// What one cluster of `shard` reaches: its snapshots `own` (newest first), its stored recovery point if it is
/// this cluster's, and its sessions' proofs. `None` without a snapshot.
async fn reach_of(
    store: &Store,
    shard: &str,
    key: Option<&SigningKey>,
    own: Vec<Manifest>,
    stored: Option<RecoveryPoint>,
) -> anyhow::Result<Option<Reach>> {
    let (Some(oldest), Some(newest)) =
        (own.iter().min_by_key(|m| m.started_at), own.iter().map(|m| m.started_at).max())
    else {
        return Ok(None);
    };
    let mut spans = sessions(store, &own, key).await?;
    let proven = spans.iter().map(|(_, to)| *to).max();
    let newest = match &stored {
        Some(point) => point.time().max(newest),
        None => proven.map_or(newest, |p| p.max(newest)),
    };
    spans.extend(stored.as_ref().map(|point| (point.time(), point.time())));
    let cluster = oldest.cluster_id.clone();
    let own_cluster =
        cluster.map(|cluster_id| Own { cluster_id, member_ids: own.iter().map(|m| m.member.id.clone()).collect() });
    Ok(Some(Reach { shard: shard.into(), own: own_cluster, oldest: oldest.clone(), newest, stored, spans }))
}

/// The reach a point `t` is planned from: the shard's own cluster when it reaches `t`, else the newest other
/// cluster that does (an etcd re-created since), else its own (which then says why it cannot).
fn covering(reaches: Vec<Reach>, t: DateTime<Utc>) -> Reach {
    let covers = |r: &Reach| r.oldest.started_at <= t && t <= r.newest;
    let mut reaches = reaches;
    if covers(&reaches[0]) {
        return reaches.swap_remove(0);
    }
    let other = reaches
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, r)| covers(r))
        .max_by_key(|(_, r)| r.oldest.started_at)
        .map(|(i, _)| i);
    reaches.swap_remove(other.unwrap_or(0))
}

/// The spans of the writer sessions whose proofs the chains of `manifests` hold (of each one's cluster): from
/// when its watch opened to its newest proof.
async fn sessions(
    store: &Store,
    manifests: &[Manifest],
    key: Option<&SigningKey>,
) -> anyhow::Result<Vec<(DateTime<Utc>, DateTime<Utc>)>> {
    let snapshots: Vec<&Manifest> = manifests.iter().collect();
    let proofs = recovery::proofs(store, &snapshots, key).await?;
    Ok(proofs
        .iter()
        .filter_map(|p| Some((p.watching_since_ms.and_then(DateTime::from_timestamp_millis)?, p.time())))
        .collect())
}

/// The newest time every shard can place: from the minimum of the shards' newest points (`newest`), lowered
/// while it lies in some shard's gap ([`gap_before`]) to that shard's last proof before the gap, until no shard
/// has it in a gap. `None` without shards.
pub fn latest_consistent<T: Ord + Copy>(shards: &[(T, Vec<(T, T)>)]) -> Option<T> {
    let mut t = shards.iter().map(|(newest, _)| *newest).min()?;
    while let Some(lower) = shards.iter().filter_map(|(_, spans)| gap_before(spans, t)).min() {
        t = lower;
    }
    Some(t)
}

/// When `t` lies in a gap of a shard's sessions (`spans`, each from when its watch opened to its newest proof):
/// after every session before it had proven its last point and before the next one's watch opened; then the
/// last proof before the gap.
pub fn gap_before<T: Ord + Copy>(spans: &[(T, T)], t: T) -> Option<T> {
    let mut sorted = spans.to_vec();
    sorted.sort();
    let mut covered: Option<T> = None;
    for (since, proven) in sorted {
        if let Some(last) = covered
            && last < t
            && t < since
        {
            return Some(last);
        }
        covered = Some(covered.map_or(proven, |last| last.max(proven)));
    }
    None
}

/// A delta, as the plan names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeltaRange {
    pub from: u64,
    pub to: u64,
}

/// What restoring one shard to the point takes.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardPlan {
    pub shard: String,
    /// The full snapshot restored first.
    pub snapshot: String,
    /// Its revision (a lower bound when `snapshotRevisionUpperBound` differs).
    pub snapshot_revision: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_revision_upper_bound: Option<u64>,
    pub snapshot_started_at: DateTime<Utc>,
    /// How many deltas are read, the first and the last (the last perhaps replayed only in part).
    pub deltas: usize,
    pub first_delta: Option<DeltaRange>,
    pub last_delta: Option<DeltaRange>,
    /// The last source revision replayed (the snapshot's when no delta is).
    pub revision: u64,
    /// When the agent received that revision's events (absent when none is replayed).
    pub last_change_received_at: Option<DateTime<Utc>>,
    /// The time this shard is restored to: the plan's point.
    pub reaches: DateTime<Utc>,
    /// The shard's newest recovery point, and the span after the point up to it: the data the restore loses.
    pub recovery_point: DateTime<Utc>,
    pub lost_seconds: f64,
}

/// The whole plan.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub at: DateTime<Utc>,
    /// Whether `at` was chosen as the newest time every shard reaches.
    pub latest_consistent: bool,
    pub shards: Vec<ShardPlan>,
}

/// The keys a walk needs: age identities for encrypted deltas, the installation's delta key.
pub type Keys<'a> = (Option<&'a [Identity]>, Option<&'a SigningKey>);

/// The plan for `shards` at `at`: every shard's reach, the point, then each shard's base and chain. Fails when
/// any shard cannot reach the point, naming each such shard and what it reaches.
pub async fn plan(store: &Store, shards: &[String], at: At, keys: Keys<'_>) -> anyhow::Result<Plan> {
    anyhow::ensure!(!shards.is_empty(), "no shard to plan");
    let mut all = Vec::new();
    for shard in shards {
        all.push(reaches(store, shard, keys.1).await?);
    }
    let (t, reaches): (DateTime<Utc>, Vec<Reach>) = match at {
        At::Time(t) => (t, all.into_iter().map(|r| covering(r, t)).collect()),
        At::LatestConsistent => {
            // Each shard's own cluster: the newest point is of the etcds as they run now. A point lowered out of
            // one shard's gap may lie before another's re-created etcd was first snapshotted: that shard is then
            // planned from the cluster before, as for a given time.
            let shards: Vec<_> = all.iter().map(|r| (r[0].newest, r[0].spans.clone())).collect();
            let t = latest_consistent(&shards).expect("at least one shard");
            (t, all.into_iter().map(|r| covering(r, t)).collect())
        }
    };
    let mut planned = Vec::new();
    let mut unreachable = Vec::new();
    for reach in &reaches {
        match shard_plan(store, reach, t, keys).await? {
            Ok(plan) => planned.push(plan),
            Err(why) => unreachable.push(format!("shard {}: {why}; {}", reach.shard, reach.describe())),
        }
    }
    anyhow::ensure!(
        unreachable.is_empty(),
        "{} shard(s) cannot be restored to {}:\n  {}",
        unreachable.len(),
        stamp(t),
        unreachable.join("\n  ")
    );
    Ok(Plan { at: t, latest_consistent: at == At::LatestConsistent, shards: planned })
}

/// One shard's base and chain at `t`, or why it cannot reach `t`.
async fn shard_plan(
    store: &Store,
    reach: &Reach,
    t: DateTime<Utc>,
    keys: Keys<'_>,
) -> anyhow::Result<Result<ShardPlan, String>> {
    if t < reach.oldest.started_at {
        return Ok(Err(format!("{} is before its oldest snapshot", stamp(t))));
    }
    if t > reach.newest {
        return Ok(Err(format!("{} is past its newest recovery point", stamp(t))));
    }
    let point = Point::Time(t);
    let base = match replay::base(store, &reach.shard, reach.own.as_ref(), point).await {
        Ok(base) => base,
        Err(e) => return Ok(Err(format!("{e:#}"))),
    };
    // The walk a restore makes, from the manifest's revision (the restore starts at the snapshot's exact one,
    // at or past it: only the count of transactions can differ).
    let mut outcome = Outcome::new(&base, base.revision);
    replay::replay(store, &base, point, keys, None, &mut outcome).await?;
    if let Some(broken) = outcome.broken {
        return Ok(Err(broken));
    }
    let range = |(from, to)| DeltaRange { from, to };
    Ok(Ok(ShardPlan {
        shard: reach.shard.clone(),
        snapshot: base.id.clone(),
        snapshot_revision: base.revision,
        snapshot_revision_upper_bound: base.revision_upper_bound.filter(|upper| *upper != base.revision),
        snapshot_started_at: base.started_at,
        deltas: outcome.deltas,
        first_delta: outcome.first_delta.map(range),
        last_delta: outcome.last_delta.map(range),
        revision: outcome.revision,
        last_change_received_at: outcome.received_at,
        reaches: t,
        recovery_point: reach.newest,
        lost_seconds: (reach.newest - t).num_milliseconds() as f64 / 1000.0,
    }))
}

/// The plan for people: one block per shard.
pub fn text(plan: &Plan) -> String {
    let how = if plan.latest_consistent { " (latest-consistent: the newest time every shard reaches)" } else { "" };
    let mut out = format!("restore every shard as it was at {}{how}\n", stamp(plan.at));
    for s in &plan.shards {
        let bounds = s.snapshot_revision_upper_bound.map_or(String::new(), |upper| format!("..{upper}"));
        out.push_str(&format!(
            "shard {}\n  snapshot        {} (revision {}{bounds}, started {})\n",
            s.shard,
            s.snapshot,
            s.snapshot_revision,
            stamp(s.snapshot_started_at)
        ));
        let deltas = match (s.first_delta, s.last_delta) {
            (Some(first), Some(last)) => format!(
                "{} to read, from the delta of revisions {}-{} to the one of {}-{}; replayed up to revision {}",
                s.deltas, first.from, first.to, last.from, last.to, s.revision
            ),
            _ => "none: the snapshot alone".into(),
        };
        out.push_str(&format!("  deltas          {deltas}\n"));
        let change =
            s.last_change_received_at.map_or(String::new(), |at| format!(", last change received {}", stamp(at)));
        out.push_str(&format!("  reaches         {} (revision {}{change})\n", stamp(s.reaches), s.revision));
        out.push_str(&format!(
            "  recovery point  {}\n  data lost       {:.3} s (what the shard stored after the point)\n",
            stamp(s.recovery_point),
            s.lost_seconds
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_point_is_an_rfc3339_time_or_latest_consistent_and_nothing_else() {
        assert_eq!("latest-consistent".parse(), Ok(At::LatestConsistent));
        let t = DateTime::parse_from_rfc3339("2026-12-01T12:00:00+01:00").unwrap().with_timezone(&Utc);
        assert_eq!("2026-12-01T12:00:00+01:00".parse(), Ok(At::Time(t)));
        for bad in ["latest", "1042", "yesterday"] {
            assert!(bad.parse::<At>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_gap_is_after_a_sessions_last_proof_and_before_the_next_watch_opened() {
        let spans = [(200, 260), (0, 100), (50, 60)];
        assert_eq!(gap_before(&spans, 150), Some(100), "the session from 0 covers the one from 50");
        assert_eq!(gap_before(&spans, 80), None, "covered by the session from 0");
        for t in [100, 200, 230, 300, -5] {
            assert_eq!(gap_before(&spans, t), None, "{t}: a proof, a watch's start, inside or outside");
        }
    }

    #[test]
    fn latest_consistent_is_the_oldest_newest_point_unless_a_shard_has_it_in_a_gap() {
        // No gap: the minimum of the newest points.
        assert_eq!(latest_consistent(&[(500, vec![(0, 500)]), (450, vec![(0, 450)])]), Some(450));
        // The one agent of both shards restarted: root's gap is (300, 320), alpha's (310, 330); alpha's newest
        // point, 400, lies in neither.
        let root = (480, vec![(0, 300), (320, 480)]);
        let alpha = (400, vec![(0, 310), (330, 400)]);
        assert_eq!(latest_consistent(&[root.clone(), alpha.clone()]), Some(400));
        // A gap in one shard only: alpha's newest, 315, is in root's gap, lowered to root's last proof before it.
        let alpha_short = (315, vec![(0, 310), (312, 315)]);
        assert_eq!(latest_consistent(&[root.clone(), alpha_short]), Some(300));
        // Gaps in both: lowered into root's, then lowered again out of alpha's (290, 305).
        let alpha_gaps = (318, vec![(0, 290), (305, 318)]);
        assert_eq!(latest_consistent(&[root, alpha_gaps]), Some(290));
        assert_eq!(latest_consistent::<i64>(&[]), None);
    }
}
