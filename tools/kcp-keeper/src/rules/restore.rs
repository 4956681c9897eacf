//! "Prove one restore before relying on it": every shard's last snapshot and last passing restore drill
//! against their schedules, read from etcd-snapshotter's own metrics (the freshness gauges it exports).

use std::collections::BTreeMap;

use crate::verdict::Verdict;

pub const SNAPSHOT: &str = "snapshot-recent";
pub const DRILL: &str = "restore-proven";

/// Per shard: the four gauges the checks read (0 when absent).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShardTimes {
    pub last_snapshot: f64,
    pub snapshot_interval: f64,
    pub last_drill: f64,
    pub drill_interval: f64,
}

/// The shards' times from the text expositions of every replica; other families are skipped. Each time is the
/// newest any replica reports: the one that snapshotted or drilled (the Lease holder, or the one that held it
/// before a failover) has it, the others export 0.
pub fn parse<'a>(texts: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, ShardTimes> {
    let mut out: BTreeMap<String, ShardTimes> = BTreeMap::new();
    for s in texts.into_iter().flat_map(super::samples) {
        let Some(shard) = s.label("shard") else { continue };
        let times = out.entry(shard.to_string()).or_default();
        let field = match s.name {
            "etcd_snapshotter_last_success_timestamp_seconds" => &mut times.last_snapshot,
            "etcd_snapshotter_schedule_interval_seconds" => &mut times.snapshot_interval,
            "etcd_snapshotter_drill_last_success_timestamp_seconds" => &mut times.last_drill,
            "etcd_snapshotter_drill_schedule_interval_seconds" => &mut times.drill_interval,
            _ => continue,
        };
        *field = field.max(s.value);
    }
    out
}

fn ago(secs: f64) -> String {
    if secs >= 86400.0 { format!("{:.1} days", secs / 86400.0) } else { format!("{:.0} s", secs) }
}

/// Per shard: the last snapshot within twice its schedule's interval, and a drill that passed within twice the
/// drill schedule's (a shard without a drill schedule has no proof that stays fresh: warn).
pub fn judge(shards: &BTreeMap<String, ShardTimes>, now: f64) -> Vec<Verdict> {
    let mut out = Vec::new();
    if shards.is_empty() {
        out.push(Verdict::fail(
            DRILL,
            "etcd-snapshotter",
            "its metrics name no shard",
            "configure etcd-snapshotter for every shard",
        ));
        return out;
    }
    for (shard, t) in shards {
        let subject = format!("shard {shard}");
        out.push(if t.last_snapshot <= 0.0 {
            Verdict::fail(
                SNAPSHOT,
                &subject,
                "no snapshot published yet",
                "see why snapshots fail (etcd_snapshotter_failures_total)",
            )
        } else if t.snapshot_interval > 0.0 && now - t.last_snapshot > 2.0 * t.snapshot_interval {
            Verdict::fail(
                SNAPSHOT,
                &subject,
                format!(
                    "last snapshot {} ago, schedule every {}",
                    ago(now - t.last_snapshot),
                    ago(t.snapshot_interval)
                ),
                "see why snapshots fail (etcd_snapshotter_failures_total)",
            )
        } else {
            Verdict::ok(SNAPSHOT, &subject, format!("last snapshot {} ago", ago(now - t.last_snapshot)))
        });
        out.push(if t.last_drill <= 0.0 {
            Verdict::fail(
                DRILL,
                &subject,
                "no restore drill has passed: no restore proven",
                "give the shard a drill schedule and see it pass",
            )
        } else if t.drill_interval <= 0.0 {
            Verdict::warn(
                DRILL,
                &subject,
                format!("last drill passed {} ago, no drill schedule", ago(now - t.last_drill)),
                "give the shard a drill schedule",
            )
        } else if now - t.last_drill > 2.0 * t.drill_interval {
            Verdict::fail(
                DRILL,
                &subject,
                format!("last passing drill {} ago, schedule every {}", ago(now - t.last_drill), ago(t.drill_interval)),
                "see why drills fail (etcd_snapshotter_drill_failures_total)",
            )
        } else {
            Verdict::ok(DRILL, &subject, format!("a restore drill passed {} ago", ago(now - t.last_drill)))
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Level;

    const TEXT: &str = "# TYPE etcd_snapshotter_last_success_timestamp_seconds gauge\n\
etcd_snapshotter_last_success_timestamp_seconds{shard=\"root\"} 1000.0\n\
etcd_snapshotter_schedule_interval_seconds{shard=\"root\"} 3600.0\n\
etcd_snapshotter_drill_last_success_timestamp_seconds{shard=\"root\"} 500.5\n\
etcd_snapshotter_drill_schedule_interval_seconds{shard=\"root\"} 86400\n\
etcd_snapshotter_last_success_timestamp_seconds{shard=\"alpha\"} 0\n\
etcd_snapshotter_failures_total{shard=\"alpha\",reason=\"etcd\"} 3\n";

    #[test]
    fn the_shards_gauges_are_read_and_other_families_skipped() {
        let shards = parse([TEXT]);
        assert_eq!(
            shards["root"],
            ShardTimes { last_snapshot: 1000.0, snapshot_interval: 3600.0, last_drill: 500.5, drill_interval: 86400.0 }
        );
        assert_eq!(shards["alpha"], ShardTimes::default());
    }

    #[test]
    fn a_recent_snapshot_and_drill_are_ok_a_missing_or_stale_one_fails() {
        let shards = parse([TEXT]);
        let v = judge(&shards, 2000.0);
        let get = |c: &str, s: &str| v.iter().find(|x| x.check == c && x.subject == s).unwrap().result;
        assert_eq!(get(SNAPSHOT, "shard root"), Level::Ok);
        assert_eq!(get(DRILL, "shard root"), Level::Ok);
        assert_eq!(get(SNAPSHOT, "shard alpha"), Level::Fail);
        assert_eq!(get(DRILL, "shard alpha"), Level::Fail);
        let late = judge(&shards, 1000.0 + 3.0 * 86400.0);
        assert!(late.iter().all(|x| x.result == Level::Fail), "{late:?}");
        assert_eq!(judge(&BTreeMap::new(), 0.0)[0].result, Level::Fail);
    }

    #[test]
    fn every_replica_is_read_and_the_newest_time_wins_so_a_follower_exporting_0_hides_nothing() {
        let follower = "etcd_snapshotter_last_success_timestamp_seconds{shard=\"root\"} 0\n\
etcd_snapshotter_drill_last_success_timestamp_seconds{shard=\"root\"} 0\n\
etcd_snapshotter_schedule_interval_seconds{shard=\"root\"} 3600\n";
        let alone = parse([follower]);
        assert!(judge(&alone, 2000.0).iter().all(|v| v.result == Level::Fail), "the follower alone proves nothing");
        let both = parse([follower, TEXT]);
        assert_eq!(both["root"].last_snapshot, 1000.0);
        assert_eq!(both["root"].last_drill, 500.5);
        assert_eq!(parse([TEXT, follower]), both, "in either order");
    }
}
