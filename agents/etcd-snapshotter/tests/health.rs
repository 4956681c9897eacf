//! etcd health against a real 3-member etcd with a real (small) `--quota-backend-bytes`, the daemon reading
//! it: each member's database size against its quota, a leader change, and a real NOSPACE alarm once the
//! database is full.

mod common;

use common::*;
use testbed::metrics::{scrape, value};

/// 4 MiB: filled by a few dozen writes.
const QUOTA: u64 = 4 << 20;

#[tokio::test(flavor = "multi_thread")]
async fn a_full_3_member_etcd_shows_each_members_size_against_its_quota_a_leader_change_and_the_nospace_alarm() {
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let quota = format!("--quota-backend-bytes={QUOTA}");
    let etcd =
        testbed::Etcd::start_with(bed.peers.path("etcd"), &bed.path("root"), "root", 3, &[&quota]).await.unwrap();
    let endpoints: Vec<String> = etcd.members.iter().map(|m| m.client_url.clone()).collect();
    let config = write_config(&bed, &Options::new(&bed, "root", endpoints.clone())).unwrap();
    let agent = agent(cluster, &config, &ns).start().await.unwrap();
    let series = |name: &str, member: &str| format!("etcd_snapshotter_{name}{{shard=\"root\",member=\"{member}\"}}");

    // Every member reports its quota and size, and is up.
    testbed::eventually(WAIT, "every member's quota and size exported", || async {
        let text = scrape(&agent.admin_url).await;
        endpoints
            .iter()
            .all(|e| {
                value(&text, &series("member_db_quota_bytes", e)).ok() == Some(QUOTA as f64)
                    && value(&text, &series("member_db_size_bytes", e)).is_ok_and(|v| v > 0.0)
                    && value(&text, &series("member_up", e)).ok() == Some(1.0)
            })
            .then_some(())
    })
    .await;

    // A leader change: leadership moved to a follower.
    let mut client = etcd.client().await.unwrap();
    let status = client.status().await.unwrap();
    let leader = status.leader();
    let members = client.member_list().await.unwrap();
    let follower = members.members().iter().map(|m| m.id()).find(|id| *id != leader).unwrap();
    let mut on_leader = None;
    for i in 0..3 {
        let mut c = etcd.member_client(i).await.unwrap();
        if c.status().await.unwrap().header().unwrap().member_id() == leader {
            on_leader = Some(c);
        }
    }
    on_leader.unwrap().move_leader(follower).await.unwrap();
    testbed::eventually(WAIT, "the leader change counted", || async {
        let text = scrape(&agent.admin_url).await;
        (value(&text, "etcd_snapshotter_leader_changes_total{shard=\"root\"}").ok() == Some(1.0)).then_some(())
    })
    .await;

    // Filled until etcd refuses: the NOSPACE alarm is real.
    let mut refused = None;
    for i in 0..400 {
        match client.put(format!("/registry/fill/{i:04}"), vec![b'f'; 100 << 10], None).await {
            Ok(_) => {}
            Err(e) => {
                refused = Some(e.to_string());
                break;
            }
        }
    }
    let refused = refused.expect("etcd refused a write at its quota");
    assert!(refused.contains("database space exceeded"), "{refused}");
    let text = testbed::eventually(WAIT, "the nospace alarm exported", || async {
        let text = scrape(&agent.admin_url).await;
        value(&text, "etcd_snapshotter_alarms{shard=\"root\",alarm=\"nospace\"}")
            .is_ok_and(|v| v >= 1.0)
            .then_some(text)
    })
    .await;
    assert_eq!(value(&text, "etcd_snapshotter_alarms{shard=\"root\",alarm=\"corrupt\"}").unwrap(), 0.0);
    // The alert's ratio: past 80% of the quota on the member that raised it, at least.
    let ratios: Vec<f64> = endpoints
        .iter()
        .map(|e| {
            value(&text, &series("member_db_size_bytes", e)).unwrap()
                / value(&text, &series("member_db_quota_bytes", e)).unwrap()
        })
        .collect();
    assert!(ratios.iter().any(|r| *r > 0.8), "{ratios:?}");
    for e in &endpoints {
        assert!(value(&text, &series("member_db_size_in_use_bytes", e)).unwrap() > 0.0, "{e}");
    }
}
