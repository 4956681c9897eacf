//! `drill --installation --at`: a real two-shard kcp (root and alpha, each on its own etcd), both shards
//! snapshotted with the daemon's deltas running while workspaces are created on each shard before and after a
//! point; the drill restores both shards to the point and starts a real kcp root shard and a real alpha shard
//! wired to it on the restored etcds; SIGTERM mid-drill leaves no process and no directory of any shard. The
//! daemon runs the same drill on `drills.installation`'s schedule and reports it by metric and Event.

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

/// What both tests start from: both shards configured (deltas every second, the drill tools with kcp) and
/// snapshotted, the daemon running their deltas, and a workspace on each shard written and stored.
struct Written {
    bed: Bed,
    config: PathBuf,
    agent: testbed::agent_process::AgentProcess,
    early: [testbed::kcp::Workspace; 2],
    /// When every early write had been acknowledged (ms since the epoch).
    written_ms: i64,
}

async fn written(kcp: &testbed::kcp::Kcp) -> Written {
    let bed = Bed::with_cluster().await.unwrap();
    let ns = bed.cluster().namespace().await.unwrap();
    let endpoint = |shard: &str| kcp.shard(shard).etcd.members[0].client_url.clone();
    let mut options = Options::new(&bed, "root", vec![endpoint("root")]).with_deltas("1s", None).with_drills(&bed);
    options.shards.push(("alpha", vec![endpoint("alpha")]));
    let drills = options.drills.take().unwrap();
    options.drills = Some(format!("{drills}  kcp: {}\n  timeout: 20m\n", bed.peers.path("kcp").display()));
    let config = write_config(&bed, &options).unwrap();
    snapshot_ok(&config);
    let agent = agent(bed.cluster(), &config, &ns).start().await.unwrap();
    let early = [kcp.workspace("root").await.unwrap(), kcp.workspace("alpha").await.unwrap()];
    let written_ms = Utc::now().timestamp_millis();
    stored_everything(kcp, &bed.s3.client(), &bed.s3.bucket, 0).await;
    Written { bed, config, agent, early, written_ms }
}

/// Each shard's `drill:` expectations for the workspaces `ws` (the first on root, the second on alpha): root serves
/// both Workspace objects and the root workspace's content, alpha the content of the workspace placed on it.
fn expect(ws: &[testbed::kcp::Workspace; 2]) -> Vec<(&'static str, String)> {
    vec![
        ("root", drill_block(&[&ws[0].path, &ws[1].path], &[&ws[0].cluster])),
        ("alpha", drill_block(&[], &[&ws[1].cluster])),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn an_installation_drill_at_a_point_starts_real_root_and_alpha_kcp_shards_on_their_restored_etcds_with_the_workspaces_of_both_shards_before_the_point_and_none_after()
 {
    let kcp = testbed::kcp::shared();
    let _logs = kcp.logs_on_failure();
    // T1: a workspace on each shard; the point once both are stored; T2: one more on each.
    let Written { bed, config, agent, early, .. } = written(kcp).await;
    let (s3, bucket) = (bed.s3.client(), bed.s3.bucket.clone());
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

    // Before the point: what each shard holds of the early workspaces.
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

/// `config` with `drills.installation` on a schedule firing every 5 seconds, at `latest-consistent`.
fn with_scheduled_installation(bed: &Bed, config: &Path) -> PathBuf {
    let text = std::fs::read_to_string(config).unwrap();
    let schedule = "  installation:\n    schedule:\n      cron: \"*/5 * * * * *\"\n    at: latest-consistent\n";
    assert!(text.contains("  timeout: 20m\n"), "{text}");
    let path = bed.path(&format!("config-installation-{:08x}.yaml", rand_u32()));
    std::fs::write(&path, text.replacen("  timeout: 20m\n", &format!("  timeout: 20m\n{schedule}"), 1)).unwrap();
    path
}

async fn events(client: &kube::Client, namespace: &str, reason: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
    let all = kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), namespace);
    let all = all.list(&Default::default()).await.unwrap();
    all.items.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_runs_the_installation_drill_on_its_schedule_and_reports_a_pass_at_a_point_after_the_data_by_metric_and_event_and_sigterm_mid_drill_leaves_nothing()
 {
    let kcp = testbed::kcp::shared();
    let _logs = kcp.logs_on_failure();
    let Written { bed, config, agent: deltas, early, written_ms } = written(kcp).await;
    // Every shard's stored point past the writes: latest-consistent, the point the drill takes, is after them.
    stored_everything(kcp, &bed.s3.client(), &bed.s3.bucket, written_ms).await;
    drop(deltas);
    let scheduled = with_scheduled_installation(&bed, &with_drills(&bed, &config, &expect(&early)));
    // A namespace of its own: the stopped agent's Lease is not waited out.
    let ns = bed.cluster().namespace().await.unwrap();
    let mut agent = agent(bed.cluster(), &scheduled, &ns).start().await.unwrap();

    let passed = "etcd_snapshotter_installation_drills_total{result=\"passed\"}";
    assert_eq!(agent.metric(passed).await.unwrap(), 0.0, "exported at 0 before the first drill");
    agent.wait_for_metric(passed, Duration::from_secs(600), |v| v >= 1.0).await;
    let point = agent.metric("etcd_snapshotter_installation_drill_point_timestamp_seconds").await.unwrap();
    assert!(point * 1000.0 >= written_ms as f64, "the point {point} proves the data written at {written_ms} ms");
    let last = agent.metric("etcd_snapshotter_installation_drill_last_success_timestamp_seconds").await.unwrap();
    assert!(last >= point, "passed at {last}, after its point {point}");
    let failed = agent.metric("etcd_snapshotter_installation_drills_total{result=\"failed\"}").await.unwrap();
    assert_eq!(failed, 0.0);
    let found = testbed::eventually(WAIT, "an InstallationDrillPassed Event", || async {
        let found = events(&bed.cluster().client(), &ns, "InstallationDrillPassed").await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    let note = found[0].note.clone().unwrap_or_default();
    assert!(note.contains("ok root at ") && note.contains("2 workspace(s) and 1 object(s) read"), "{note}");
    assert!(note.contains("ok alpha at ") && note.contains("0 workspace(s) and 1 object(s) read"), "{note}");
    let leases = kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(bed.cluster().client(), &ns);
    let lease = leases.get("kcp-keeper-etcd-snapshotter").await.unwrap();
    let annotations = lease.metadata.annotations.unwrap_or_default();
    assert!(annotations.contains_key("schedule.kcp-keeper.io/installation-drill"), "{annotations:?}");

    // The next tick's drill: SIGTERM once both shards' kcp run stops the agent and leaves nothing behind.
    let running = both_kcp_shards_running(&bed).await;
    let status = agent.terminate(Duration::from_secs(60)).expect("the agent exits after SIGTERM");
    assert!(status.success(), "{status:?}");
    nothing_left(&bed, running);
}

/// Starts the drill, sends SIGTERM once the alpha shard's kcp runs beside the root shard's, and checks that the
/// drill stops naming the signal and leaves no process and no directory behind.
async fn sigterm_once_both_kcp_shards_run(bed: &Bed, config: &Path, at: &str) {
    let child = std::process::Command::new(BINARY)
        .args(["drill", "--config", config.to_str().unwrap(), "--installation", "--at", at])
        .env(NO_METADATA.0, NO_METADATA.1)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let running = both_kcp_shards_running(bed).await;
    sigterm_interrupts(child).await;
    nothing_left(bed, running);
}

/// Waits until a drill runs the alpha shard's kcp beside the root shard's, each on its throwaway etcd: the
/// drill's processes.
async fn both_kcp_shards_running(bed: &Bed) -> Vec<(u32, String)> {
    let drills_dir = bed.drills_dir().display().to_string();
    let running = testbed::eventually(Duration::from_secs(300), "the alpha shard's kcp running", || async {
        let found = processes_mentioning(&drills_dir);
        found.iter().any(|(_, cmd)| cmd.contains("--shard-name=alpha")).then_some(found)
    })
    .await;
    assert!(running.iter().any(|(_, cmd)| cmd.contains("--shard-name=root")), "{running:?}");
    assert!(running.iter().filter(|(_, cmd)| cmd.contains("--name=drill")).count() == 2, "{running:?}");
    running
}

/// Every process of `running` is gone and no drill directory is left.
fn nothing_left(bed: &Bed, running: Vec<(u32, String)>) {
    for (pid, cmd) in running {
        // Gone, or at most a zombie waiting for init to reap it (the drill exited right after killing it).
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = state.rsplit_once(") ").map(|(_, rest)| rest.chars().next().unwrap_or('?')).unwrap_or('-');
        assert!(matches!(state, '-' | 'Z'), "{cmd} (pid {pid}) is still running: state {state}");
    }
    let left: Vec<_> = std::fs::read_dir(bed.drills_dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "drill directories left behind: {left:?}");
}
