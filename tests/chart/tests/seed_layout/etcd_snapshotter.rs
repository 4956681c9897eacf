//! etcd-snapshotter, in its pod, snapshotting both shards' etcds as the layout runs them (the root shard's three
//! StatefulSet members, through a follower; alpha's one member), and a restore drill that starts a real kcp (the
//! binary of the image the operator runs) on the restored root etcd.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use chart::on_node::exec_in_agent;
use testbed::node::{self, Node};
use testbed::seed::layout;

/// The newest listed snapshot id of `shard`'s own etcd cluster (`etcd-snapshotter list` in the agent's pod; the
/// snapshots of a cluster the shard ran before are marked `(other)`).
pub(crate) fn newest(node: &Node, shard: &str) -> Option<String> {
    let listed = exec_in_agent(node, "etcd-snapshotter", &["/etcd-snapshotter", "list", "--shard", shard]).ok()?;
    listed
        .lines()
        .find(|l| l.starts_with(&format!("{shard}/")) && !l.contains("(other)"))
        .and_then(|l| l.split_whitespace().next())
        .map(String::from)
}

/// The root etcd's leader's member id (hex, as the manifest writes it), as its members report it.
fn root_leader(node: &Node) -> Result<String> {
    let statuses = crate::etcd_status(node, layout::ROOT_SHARD, 3)?;
    let leaders: Vec<u64> = statuses
        .as_array()
        .context("etcdctl printed no list")?
        .iter()
        .filter_map(|s| s["Status"]["leader"].as_u64())
        .collect();
    ensure!(leaders.len() == 3 && leaders.iter().all(|l| *l == leaders[0]), "the members name leaders {leaders:?}");
    Ok(format!("{:x}", leaders[0]))
}

#[tokio::test]
async fn etcd_snapshotter_snapshots_both_shards_etcds_the_three_member_one_through_a_follower_and_a_drill_starts_kcp_on_the_restored_root_etcd()
-> Result<()> {
    // The layout as installed: not while upgrade.rs rolls alpha to another tag.
    let _layout = crate::LAYOUT_CHANGES.read().await;
    crate::keeper();
    let node = node::shared();
    let mut ids = Vec::new();
    for (shard, members) in layout::ETCD_MEMBERS {
        let id = testbed::eventually(Duration::from_secs(240), "a scheduled snapshot of the shard", || async {
            newest(node, shard)
        })
        .await;
        let manifest = chart::on_seed::manifest(node, &id)?;
        let member = &manifest["member"];
        let endpoint = member["endpoint"].as_str().context("no member endpoint")?;
        ensure!(
            layout::etcd_endpoints(shard, members).iter().any(|e| e == endpoint),
            "{id} came from {endpoint}, not one of etcd-{shard}'s members"
        );
        ensure!(manifest["keyCount"].as_u64().unwrap_or(0) > 0, "{id}: {manifest}");
        eprintln!("{id}: from {} ({endpoint}), revision {}", member["name"], manifest["revision"]);
        if members == 3 {
            let leader = root_leader(node)?;
            let id_hex = member["id"].as_str().context("no member id")?;
            ensure!(id_hex != leader, "{id} was streamed from the leader {leader}");
        }
        ids.push(id);
    }

    // The drill of the root shard's snapshot: restore, a throwaway etcd, then kcp on it must serve the root
    // workspace's default namespace.
    let root = &ids[0];
    let drilled = exec_in_agent(node, "etcd-snapshotter", &["/etcd-snapshotter", "drill", root])?;
    eprintln!("drill in the pod:\n{drilled}");
    let listed = exec_in_agent(node, "etcd-snapshotter", &["/etcd-snapshotter", "list", "--shard", "root"])?;
    let row = listed
        .lines()
        .find(|l| l.starts_with(&format!("{root} ")))
        .with_context(|| format!("{root} gone:\n{listed}"))?;
    ensure!(!row.trim_end().ends_with(" no") && !row.contains("no ("), "the drill does not prove {root}:\n{listed}");
    let report = chart::on_seed::object(node, &format!("{root}/drill.json"))?;
    ensure!(report["kcp"].is_object(), "the drill report has no kcp level: {report}");
    Ok(())
}
