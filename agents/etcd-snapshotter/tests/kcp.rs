//! A snapshot of real kcp's root shard etcd, holding what kcp itself wrote, restores into an etcd that a real
//! kcp root shard starts on.

mod common;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_of_the_kcp_root_shard_restores_into_an_etcd_that_a_real_kcp_root_shard_starts_on() {
    let kcp = testbed::kcp::shared();
    let _logs = kcp.logs_on_failure();
    let bed = Bed::start().await.unwrap();
    let marker = format!("restore-marker-{:08x}", rand_u32());
    let root = kcp.admin_client("root").await.unwrap();
    let config_map = ConfigMap {
        metadata: ObjectMeta { name: Some(marker.clone()), ..Default::default() },
        data: Some([("written-by".to_string(), "kcp before the snapshot".to_string())].into()),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(root, "default").create(&PostParams::default(), &config_map).await.unwrap();

    let shard_etcd = kcp.shard("root").etcd.members[0].client_url.clone();
    let config = write_config(&bed, &Options::new(&bed, "root", vec![shard_etcd])).unwrap();
    snapshot_ok(&config);
    let manifest = manifests(&bed.s3.client(), &bed.s3.bucket).await.remove(0);
    assert!(manifest["keyCount"].as_u64().unwrap() > 100, "kcp's own objects are in it: {manifest}");

    let data_dir = bed.path("restored");
    let (client_port, peer_port) = (testbed::process::free_port().unwrap(), testbed::process::free_port().unwrap());
    let (client_url, peer_url) = (format!("http://127.0.0.1:{client_port}"), format!("http://127.0.0.1:{peer_port}"));
    let out = restore_root(&config, &["--etcdutl", bed.etcdutl().to_str().unwrap()], &data_dir, &peer_url);
    assert!(out.status.success(), "{}", text(&out));
    let _etcd = start_restored(&bed, "restored-etcd", &data_dir, client_port, &peer_url, &["--unsafe-no-fsync"]);

    let kcp_dir = bed.path("restored-kcp");
    std::fs::create_dir_all(&kcp_dir).unwrap();
    let (_shard, url) = kcp.start_root_shard_on(&bed.peers, &client_url, &kcp_dir).await.unwrap();
    let yaml = kcp.pki.kubeconfig(&format!("{url}/clusters/root"), "shard-admin", &["system:masters"]).unwrap();
    let restored = testbed::kcp::client_from_yaml(&yaml).await.unwrap();
    let back = Api::<ConfigMap>::namespaced(restored, "default").get(&marker).await.unwrap();
    assert_eq!(back.data.unwrap()["written-by"], "kcp before the snapshot");
}

/// A configuration drilling `root` at the kcp level, expecting `workspaces` and the marker ConfigMap in root.
fn kcp_drill_config(bed: &Bed, etcd: &str, workspaces: &[&str], marker: &str) -> std::path::PathBuf {
    let mut options = Options::new(bed, "root", vec![etcd.to_string()]).with_drills(bed);
    let drills = options.drills.take().unwrap();
    options.drills = Some(format!("{drills}  kcp: {}\n", bed.peers.path("kcp").display()));
    let list = workspaces.iter().map(|w| format!("\"{w}\"")).collect::<Vec<_>>().join(", ");
    options.shard_extra = format!(
        "drill:\n  schedule:\n    cron: \"0 0 1 1 *\"\n  kcp:\n    workspaces: [{list}]\n    objects:\n      - workspace: root\n        path: /api/v1/namespaces/default/configmaps/{marker}\n"
    );
    write_config(bed, &options).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kcp_level_passes_on_a_snapshot_of_the_real_root_shard_and_fails_naming_kcp_for_a_workspace_never_created()
{
    let kcp = testbed::kcp::shared();
    let _logs = kcp.logs_on_failure();
    let bed = Bed::start().await.unwrap();
    let workspace = kcp.workspace("root").await.unwrap();
    let marker = format!("drill-marker-{:08x}", rand_u32());
    let root = kcp.admin_client("root").await.unwrap();
    let config_map =
        ConfigMap { metadata: ObjectMeta { name: Some(marker.clone()), ..Default::default() }, ..Default::default() };
    Api::<ConfigMap>::namespaced(root, "default").create(&PostParams::default(), &config_map).await.unwrap();

    let shard_etcd = kcp.shard("root").etcd.members[0].client_url.clone();
    let config = kcp_drill_config(&bed, &shard_etcd, &[&workspace.path], &marker);
    snapshot_ok(&config);
    let out = cli(&["drill", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("; kcp ready in ") && stdout.contains("1 workspace(s) and 1 object(s) read"), "{stdout}");

    let never = format!("root:never-created-{:08x}", rand_u32());
    let config = kcp_drill_config(&bed, &shard_etcd, &[&workspace.path, &never], &marker);
    let out = cli(&["drill", "--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(": kcp: kcp level: workspace ") && stderr.contains(&never) && stderr.contains("404"),
        "{}",
        text(&out)
    );

    // --kcp on the command line: the kcp level for a shard whose configuration names nothing (/readyz alone).
    let plain = write_config(&bed, &Options::new(&bed, "root", vec![shard_etcd.clone()]).with_drills(&bed)).unwrap();
    let kcp_binary = bed.peers.path("kcp").to_str().unwrap().to_string();
    let out = cli(&["drill", "--config", plain.to_str().unwrap(), "--kcp", &kcp_binary]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 workspace(s) and 0 object(s) read"), "{}", text(&out));
    let left: Vec<_> = std::fs::read_dir(bed.drills_dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "drill directories left behind: {left:?}");
}
