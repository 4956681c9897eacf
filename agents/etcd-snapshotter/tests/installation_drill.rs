//! `drill --installation --at`: a real two-shard kcp (root and alpha, each on its own etcd), both shards
//! snapshotted with the daemon's deltas running while workspaces are created on each shard before and after a
//! point; the drill restores both shards to the point and starts a real kcp root shard and a real alpha shard
//! wired to it on the restored etcds; SIGTERM mid-drill leaves no process and no directory of any shard.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::*;
use etcd_snapshotter::delta::recovery::RecoveryPoint;

const SHARDS: [&str; 2] = ["root", "alpha"];

/// The stored recovery point of `shard`, if any.
async fn stored_point(s3: &aws_sdk_s3::Client, bucket: &str, shard: &str) -> Option<RecoveryPoint> {
    let key = format!("{PREFIX}/{shard}/recovery-point.json");
    let body = s3.get_object().bucket(bucket).key(&key).send().await.ok()?.body.collect().await.unwrap();
    Some(RecoveryPoint::from_json(&body.into_bytes(), shard, None).unwrap())
}

/// Waits until every shard's stored point holds what its etcd held when called, and is proven past `after_ms`.
async fn stored_everything(kcp: &testbed::kcp::Kcp, s3: &aws_sdk_s3::Client, bucket: &str, after_ms: i64) {
    for shard in SHARDS {
        let mut client = kcp.shard(shard).etcd.member_client(0).await.unwrap();
        let revision = client.get("/", None).await.unwrap().header().unwrap().revision() as u64;
        testbed::eventually(WAIT, &format!("{shard}'s writes up to revision {revision} stored"), || async {
            stored_point(s3, bucket, shard).await.filter(|p| p.stored_revision >= revision && p.proven_ms > after_ms)
        })
        .await;
    }
}

/// A shard's `drill:` block: the Workspace objects it serves and the LogicalCluster objects of workspaces whose
/// content it holds (named by logical cluster, which the shard holding it serves by name).
fn drill_block(workspaces: &[&str], clusters: &[&str]) -> String {
    let list = workspaces.iter().map(|w| format!("\"{w}\"")).collect::<Vec<_>>().join(", ");
    let mut block =
        format!("drill:\n  schedule:\n    cron: \"0 0 1 1 *\"\n  kcp:\n    workspaces: [{list}]\n    objects:\n");
    for cluster in clusters {
        block.push_str(&format!(
            "      - workspace: \"{cluster}\"\n        path: /apis/core.kcp.io/v1alpha1/logicalclusters/cluster\n"
        ));
    }
    if clusters.is_empty() {
        block = block.replace("    objects:\n", "");
    }
    block
}

/// `base` with a `drill:` block added to each shard's entry: `(shard, block)`.
fn with_drills(bed: &Bed, base: &Path, blocks: &[(&str, String)]) -> PathBuf {
    let mut text = std::fs::read_to_string(base).unwrap();
    for (shard, block) in blocks {
        let entry = format!("  - name: {shard}\n");
        let indented: String = block.lines().map(|l| format!("    {l}\n")).collect();
        text = text.replacen(&entry, &format!("{entry}{indented}"), 1);
    }
    let path = bed.path(&format!("config-drill-{:08x}.yaml", rand_u32()));
    std::fs::write(&path, text).unwrap();
    path
}

fn drill_installation(config: &Path, at: &str) -> std::process::Output {
    cli(&["drill", "--config", config.to_str().unwrap(), "--installation", "--at", at])
}

#[tokio::test(flavor = "multi_thread")]
async fn an_installation_drill_at_a_point_starts_real_root_and_alpha_kcp_shards_on_their_restored_etcds_with_the_workspaces_of_both_shards_before_the_point_and_none_after()
 {
    let kcp = testbed::kcp::shared();
    let _logs = kcp.logs_on_failure();
    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let (s3, bucket) = (bed.s3.client(), bed.s3.bucket.clone());

    let endpoint = |shard: &str| kcp.shard(shard).etcd.members[0].client_url.clone();
    let mut options = Options::new(&bed, "root", vec![endpoint("root")]).with_deltas("1s", None).with_drills(&bed);
    options.shards.push(("alpha", vec![endpoint("alpha")]));
    let drills = options.drills.take().unwrap();
    options.drills = Some(format!("{drills}  kcp: {}\n  timeout: 20m\n", bed.peers.path("kcp").display()));
    let config = write_config(&bed, &options).unwrap();
    snapshot_ok(&config);
    let agent = agent(cluster, &config, &ns).start().await.unwrap();

    // T1: a workspace on each shard; the point once both are stored; T2: one more on each.
    let early = [kcp.workspace("root").await.unwrap(), kcp.workspace("alpha").await.unwrap()];
    stored_everything(kcp, &s3, &bucket, 0).await;
    let at = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let t = DateTime::parse_from_rfc3339(&at).unwrap().with_timezone(&Utc);
    testbed::eventually(WAIT, "the clock past the point", || async {
        (Utc::now().timestamp_millis() > t.timestamp_millis()).then_some(())
    })
    .await;
    let late = [kcp.workspace("root").await.unwrap(), kcp.workspace("alpha").await.unwrap()];
    stored_everything(kcp, &s3, &bucket, Utc::now().timestamp_millis()).await;
    drop(agent);
    // The alpha workspaces' content is in alpha's etcd: what makes the alpha shard's part of the drill a real one.
    for ws in [&early[1], &late[1]] {
        assert!(!kcp.etcd_keys_containing("alpha", &ws.cluster).unwrap().is_empty(), "{} on alpha", ws.cluster);
    }

    // Before the point: root serves both Workspace objects and the root workspace's content, alpha the content of
    // the workspace placed on it.
    let expect = |ws: &[testbed::kcp::Workspace; 2]| {
        vec![
            ("root", drill_block(&[&ws[0].path, &ws[1].path], &[&ws[0].cluster])),
            ("alpha", drill_block(&[], &[&ws[1].cluster])),
        ]
    };
    let passing = with_drills(&bed, &config, &expect(&early));
    let out = drill_installation(&passing, &at);
    let said = text(&out);
    eprintln!("the drill before the point: {said}");
    assert!(out.status.success(), "{said}");
    for shard in SHARDS {
        assert!(said.contains(&format!("ok {shard} at {at}: snapshot ")), "{said}");
    }
    assert!(
        said.contains("2 workspace(s) and 1 object(s) read") && said.contains("0 workspace(s) and 1 object(s) read")
    );

    // After the point: absent on both shards, each named with the reason.
    let failing = with_drills(&bed, &config, &expect(&late));
    let out = drill_installation(&failing, &at);
    let said = text(&out);
    eprintln!("the drill expecting what came after the point: {said}");
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains(&format!("FAILED root at {at}: kcp: kcp level: workspace {}: 404", late[0].path)), "{said}");
    assert!(
        said.contains(&format!(
            "FAILED alpha at {at}: kcp: kcp level: object /clusters/{}/apis/core.kcp.io/v1alpha1/logicalclusters/cluster: 404",
            late[1].cluster
        )),
        "{said}"
    );
    assert!(said.contains("failed on 2 shard(s): root (kcp), alpha (kcp)"), "{said}");
    let left: Vec<_> = std::fs::read_dir(bed.drills_dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "drill directories left behind: {left:?}");

    // SIGTERM once both shards' kcp run: every process of every shard is gone, and every directory.
    sigterm_once_both_kcp_shards_run(&bed, &passing, &at).await;
}

/// Starts the drill, sends SIGTERM once the alpha shard's kcp runs beside the root shard's, and checks that the
/// drill stops naming the signal and leaves no process and no directory behind.
async fn sigterm_once_both_kcp_shards_run(bed: &Bed, config: &Path, at: &str) {
    let drills_dir = bed.drills_dir().display().to_string();
    let child = std::process::Command::new(BINARY)
        .args(["drill", "--config", config.to_str().unwrap(), "--installation", "--at", at])
        .env(NO_METADATA.0, NO_METADATA.1)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let running = testbed::eventually(Duration::from_secs(300), "the alpha shard's kcp running", || async {
        let found = processes_mentioning(&drills_dir);
        found.iter().any(|(_, cmd)| cmd.contains("--shard-name=alpha")).then_some(found)
    })
    .await;
    assert!(running.iter().any(|(_, cmd)| cmd.contains("--shard-name=root")), "{running:?}");
    assert!(running.iter().filter(|(_, cmd)| cmd.contains("--name=drill")).count() == 2, "{running:?}");
    sigterm_interrupts(child).await;
    for (pid, cmd) in running {
        // Gone, or at most a zombie waiting for init to reap it (the drill exited right after killing it).
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = state.rsplit_once(") ").map(|(_, rest)| rest.chars().next().unwrap_or('?')).unwrap_or('-');
        assert!(matches!(state, '-' | 'Z'), "{cmd} (pid {pid}) is still running: state {state}");
    }
    let left: Vec<_> = std::fs::read_dir(bed.drills_dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "drill directories left behind: {left:?}");
}
