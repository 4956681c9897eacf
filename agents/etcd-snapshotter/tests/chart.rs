//! etcd-snapshotter as the Helm chart (charts/kcp-keeper) deploys it: `helm install` into the test bed's
//! apiserver, then the agent binary runs locally with a token minted for the ServiceAccount the chart created and
//! the configuration file the chart rendered into its ConfigMap (the bed has no kubelet, so the chart's pod never
//! runs; the values point etcd and S3 at the bed's loopback addresses). The test plays the kubelet's part for the
//! two volumes the chart mounts: the S3 Secret the values name is projected into a directory and the spill
//! emptyDir is a directory, and the file's two paths are pointed at them. With only the chart's Role the agent
//! publishes a snapshot to versitygw on its schedule, recording the tick on its Lease, and that snapshot passes a
//! restore drill run with the same file; the apiserver refuses it
//! nothing, and the same token cannot read a Secret (not even its own S3 keys: those are mounted). Every
//! etcd_snapshotter_ metric the chart's alerts read is in its `/metrics`.

mod common;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta, PostParams};

const ACCOUNT: &str = "kcp-keeper-etcd-snapshotter";
const S3_SECRET: &str = "etcd-backup-s3";

/// The kubelet's part: each key of Secret `namespace/name` as a file in `dir`, as the chart's secret volume
/// mounts it.
async fn project_secret(client: &kube::Client, namespace: &str, name: &str, dir: &Path) -> Result<()> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace).get(name).await?;
    std::fs::create_dir_all(dir)?;
    for (key, value) in secret.data.context("the Secret has data")? {
        std::fs::write(dir.join(key), value.0)?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn installed_by_the_chart_it_publishes_scheduled_snapshots_with_the_chart_role_and_reads_no_secret() -> Result<()>
{
    let bed = Bed::with_cluster().await?;
    let cluster = bed.cluster();
    let release_ns = cluster.namespace().await?;
    let client = cluster.client();
    let etcd = bed.etcd("root", 1).await?;
    load(&mut etcd.member_client(0).await?, "/registry/things", 20, 1000).await?;
    let keys = Secret {
        metadata: ObjectMeta { name: Some(S3_SECRET.into()), ..Default::default() },
        string_data: Some(
            [
                ("AWS_ACCESS_KEY_ID".to_string(), bed.s3.access_key.clone()),
                ("AWS_SECRET_ACCESS_KEY".to_string(), bed.s3.secret_key.clone()),
            ]
            .into(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), &release_ns).create(&PostParams::default(), &keys).await?;

    let values = format!(
        "replicas: 1\ndnsRewriter: {{enabled: false}}\netcdSnapshotter:\n  enabled: true\n  s3Credentials: {{existingSecret: {S3_SECRET}}}\n  config:\n    shards:\n    - name: root\n      endpoints: [{etcd}]\n      schedule: {{cron: '*/5 * * * * *'}}\n      drill: {{schedule: {{cron: '0 4 * * *'}}}}\n    storage:\n      bucket: {bucket}\n      prefix: {PREFIX}\n      endpoint: {s3}\n      region: {region}\n      pathStyle: true\n      maxAttempts: 2\n      attemptTimeout: 30s\n      credentials: {{secretDirectory: /var/run/secrets/etcd-snapshotter/s3}}\n    retention: {{keepLast: 10}}\n    spill: {{directory: /var/lib/etcd-snapshotter, memoryBudget: 64Mi, partSize: 5Mi, partsInFlight: 2}}\n",
        etcd = etcd.members[0].client_url,
        bucket = bed.s3.bucket,
        s3 = bed.s3.endpoint,
        region = testbed::s3::REGION,
    );
    testbed::helm::install(cluster, &release_ns, &values)?;
    let rendered = Api::<ConfigMap>::namespaced(client.clone(), &release_ns).get(ACCOUNT).await?;
    let rendered = rendered.data.context("ConfigMap data")?.remove("config.yaml").context("config.yaml")?;
    assert!(!rendered.contains(&bed.s3.secret_key), "the rendered configuration holds no S3 key");
    // The two mounts, where this process can have them.
    let (secret_dir, spill_dir) = (bed.path("mounted-s3"), bed.path("mounted-spill"));
    project_secret(&client, &release_ns, S3_SECRET, &secret_dir).await?;
    std::fs::create_dir_all(&spill_dir)?;
    let local = rendered
        .replace("/var/run/secrets/etcd-snapshotter/s3", &secret_dir.display().to_string())
        .replace("/var/lib/etcd-snapshotter", &spill_dir.display().to_string());
    assert_ne!(local, rendered, "the chart's mount paths are in the file");
    let config = bed.path("chart-config.yaml");
    std::fs::write(&config, local)?;

    let (kubeconfig, user) = testbed::helm::chart_account_kubeconfig(cluster, &release_ns, ACCOUNT).await?;
    let mut agent = agent(cluster, &config, &release_ns)
        .identity("kcp-keeper-etcd-snapshotter-0")
        .kubeconfig(&kubeconfig)
        .spawn()?;
    agent.wait_ready(WAIT).await?;

    let s3 = bed.s3.client();
    let published = testbed::eventually(WAIT, "a scheduled snapshot in the bucket", || {
        let (s3, bucket) = (s3.clone(), bed.s3.bucket.clone());
        async move {
            let found = manifests(&s3, &bucket).await;
            (!found.is_empty()).then_some(found)
        }
    })
    .await;
    assert_eq!(published[0]["shard"], "root", "{:?}", published[0]);
    assert!(published[0]["tick"].is_string(), "a scheduled snapshot names its tick: {:?}", published[0]);
    let lease = Api::<Lease>::namespaced(client.clone(), &release_ns).get(ACCOUNT).await?;
    let tick = lease.metadata.annotations.as_ref().and_then(|a| a.get("schedule.kcp-keeper.io/snapshot-root"));
    assert!(tick.is_some(), "the tick is recorded on the chart's Lease: {:?}", lease.metadata.annotations);
    testbed::scrape::wait_for_metric(
        &agent,
        "etcd_snapshotter_last_success_timestamp_seconds{shard=\"root\"}",
        "the snapshot counted",
        |v| v > 0.0,
    )
    .await;

    // The alerts' yardsticks: the longest gap of each schedule, from the rendered configuration.
    let scraped = testbed::scrape::metrics(&agent).await;
    let interval =
        |name: &str| testbed::scrape::metric(&scraped, &format!("etcd_snapshotter_{name}{{shard=\"root\"}}"));
    assert_eq!(interval("schedule_interval_seconds")?, 5.0, "every 5 s");
    assert_eq!(interval("drill_schedule_interval_seconds")?, 86400.0, "daily");

    // A restore drill of what the agent published, with the file the chart rendered (its drills default to the
    // spill directory the chart mounts); the image carries etcd and etcdutl on PATH, here they are the peers'.
    let out = std::process::Command::new(BINARY)
        .args(["drill", "--config", config.to_str().context("path")?, "--shard", "root", "--etcd"])
        .arg(bed.peers.path("etcd"))
        .arg("--etcdutl")
        .arg(bed.etcdutl())
        .env(NO_METADATA.0, NO_METADATA.1)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.starts_with("ok root/"), "drill: {}", text(&out));

    // Every etcd_snapshotter_ metric the chart's alerts read is in this agent's real /metrics.
    let alerting =
        testbed::alert_rules::metric_names(&["common.rules.yaml", "etcd-snapshotter.rules.yaml"], "etcd_snapshotter_")?;
    assert!(alerting.len() >= 7, "{alerting:?}");
    let missing = testbed::alert_rules::missing_from(&alerting, &testbed::scrape::metrics(&agent).await);
    assert!(missing.is_empty(), "alerts read metrics this agent does not export: {missing:?}");

    let requests = testbed::audit::by_user(&cluster.apiserver.audit_log, &user)?;
    assert!(
        requests.iter().any(|r| r.resource == "leases" && r.verb == "patch"),
        "the tick record on its Lease is logged"
    );
    let refused: Vec<_> = requests.iter().filter(|r| r.code == Some(403)).collect();
    assert!(refused.is_empty(), "the chart's Role refused the agent: {refused:?}");
    assert!(!requests.iter().any(|r| r.resource == "secrets"), "no Secret is ever read through the apiserver");

    let token = testbed::apiserver::client_from_file(&kubeconfig).await?;
    let got = Api::<Secret>::namespaced(token, &release_ns).get(S3_SECRET).await;
    assert!(matches!(got, Err(kube::Error::Api(ref s)) if s.code == 403), "its own S3 Secret: {got:?}");

    let status = agent.terminate(Duration::from_secs(20));
    assert!(status.is_some_and(|s| s.success()), "SIGTERM: {status:?}\n{}", agent.process.log_tail());
    testbed::assert_no_secret_material(&agent.process.log(), &[&bed.s3.secret_key, &bed.s3.access_key]);
    Ok(())
}
