//! etcd-snapshotter in the demo: both kcp shards' etcds snapshotted on a 15-second schedule into the demo's
//! S3 bucket (zstd, static credentials from a Secret-like directory, no metadata endpoint), and restore drills
//! every 30 seconds: each shard's newest snapshot restored into a throwaway etcd and compared with its manifest,
//! the root shard's also at the kcp level (a real kcp on the restored etcd serving the root workspace). The
//! summary is read from the manifests and drill reports the agent published.

use std::time::Duration;

use anyhow::{Context, Result};
use testbed::agent_process::{AgentProcess, AgentUnderTest};

use super::agent_binary;

const PREFIX: &str = "kcp/etcd";

fn config(
    bed: &testbed::ControlPlane,
    kcp: &testbed::kcp::Kcp,
    s3: &testbed::S3Server,
    secret_dir: &std::path::Path,
    spill: &std::path::Path,
) -> String {
    let shards: String = kcp
        .shards
        .iter()
        .map(|shard| {
            // The kcp level for the root shard: a kcp started on its restored etcd alone is a root shard.
            let kcp_level = if shard.name == "root" { "      kcp:\n        workspaces: [root]\n" } else { "" };
            format!(
                "  - name: {}\n    endpoints: [{}]\n    schedule:\n      cron: \"*/15 * * * * *\"\n    drill:\n      schedule:\n        cron: \"*/30 * * * * *\"\n{kcp_level}",
                shard.name,
                shard.etcd.client_urls()
            )
        })
        .collect();
    let drills = format!(
        "drills:\n  etcd: {}\n  etcdutl: {}\n  kcp: {}\n  directory: {}\n",
        bed.peers.path("etcd").display(),
        bed.peers.path("etcdutl").display(),
        bed.peers.path("kcp").display(),
        spill.join("drills").display()
    );
    format!(
        "shards:\n{shards}storage:\n  bucket: {}\n  prefix: {PREFIX}\n  endpoint: {}\n  region: {}\n  pathStyle: true\n  credentials:\n    secretDirectory: {}\ncompression: zstd\nretention:\n  keepLast: 4\n  hourly: 24\nspill:\n  directory: {}\n  memoryBudget: 32Mi\n  partSize: 8Mi\n  partsInFlight: 2\n{drills}",
        s3.bucket,
        s3.endpoint,
        testbed::s3::REGION,
        secret_dir.display(),
        spill.display()
    )
}

/// Starts the agent with a leader-elected Lease in `namespace`.
pub fn start(
    bed: &testbed::ControlPlane,
    kcp: &testbed::kcp::Kcp,
    s3: &testbed::S3Server,
    namespace: &str,
) -> Result<AgentProcess> {
    let dir = bed.subdir("etcd-snapshotter")?;
    let secret_dir = dir.join("s3-credentials");
    std::fs::create_dir_all(&secret_dir)?;
    std::fs::write(secret_dir.join("AWS_ACCESS_KEY_ID"), &s3.access_key)?;
    std::fs::write(secret_dir.join("AWS_SECRET_ACCESS_KEY"), &s3.secret_key)?;
    let path = dir.join("config.yaml");
    std::fs::write(&path, config(bed, kcp, s3, &secret_dir, &dir.join("spill")))?;
    let env = [("KCP_KEEPER_LOG_FORMAT", "plain"), ("AWS_EC2_METADATA_DISABLED", "true")];
    AgentUnderTest::new(bed, agent_binary("etcd-snapshotter")?, &path)
        .namespace(namespace)
        .identity("etcd-snapshotter")
        .envs(&env)
        .spawn()
}

/// Waits until every shard has a published snapshot and summarizes them from their manifests.
pub async fn cycle(kcp: &testbed::kcp::Kcp, s3: &testbed::S3Server, agent: &mut AgentProcess) -> Result<String> {
    agent.wait_ready(Duration::from_secs(60)).await?;
    let client = s3.client();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let mut summaries = Vec::new();
        for shard in &kcp.shards {
            if let Some(m) = newest_manifest(&client, &s3.bucket, shard.name).await? {
                summaries.push(format!(
                    "{} revision {} with {} keys, {} bytes zstd ({} in etcd) in {:.1}s",
                    shard.name,
                    m["revision"],
                    m["keyCount"],
                    m["objectSizeBytes"],
                    m["dbSizeBytes"],
                    m["totalSeconds"].as_f64().unwrap_or_default()
                ));
            }
        }
        if summaries.len() == kcp.shards.len() {
            let drills = drills(kcp, s3, agent).await?;
            return Ok(format!(
                "snapshotted every kcp shard's etcd to S3, each checked against etcd's sha256 before publishing: {}; {drills}",
                summaries.join("; ")
            ));
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no snapshot of every shard within 90s:\n{}",
            agent.process.log_tail()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits until every shard has a drill report (the drill runs every 30 seconds; the root shard's includes a
/// kcp start) and summarizes them; a failed drill fails the demo with its reason.
async fn drills(kcp: &testbed::kcp::Kcp, s3: &testbed::S3Server, agent: &AgentProcess) -> Result<String> {
    let client = s3.client();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        let mut summaries = Vec::new();
        for shard in &kcp.shards {
            let Some(report) = newest_report(&client, &s3.bucket, shard.name).await? else { continue };
            anyhow::ensure!(
                report["passed"] == true,
                "the restore drill of {} failed: {} {}",
                report["id"],
                report["failure"]["reason"],
                report["failure"]["message"]
            );
            let kcp_level = match report["kcp"]["readySeconds"].as_f64() {
                Some(ready) => {
                    format!(", a real kcp on it ready in {ready:.1}s serving {}", report["kcp"]["workspaces"])
                }
                None => String::new(),
            };
            summaries.push(format!(
                "{} revision {} with {} keys restored in {:.1}s, HashKV {}{kcp_level}",
                shard.name,
                report["revision"],
                report["keyCount"],
                report["restoreSeconds"].as_f64().unwrap_or_default(),
                report["hashKv"].as_str().unwrap_or("?"),
            ));
        }
        if summaries.len() == kcp.shards.len() {
            return Ok(format!("restore drills passed: {}", summaries.join("; ")));
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no drill report of every shard within 300s:\n{}",
            agent.process.log_tail()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The most recently finished drill report of `shard`.
async fn newest_report(client: &aws_sdk_s3::Client, bucket: &str, shard: &str) -> Result<Option<serde_json::Value>> {
    let listed = client.list_objects_v2().bucket(bucket).prefix(format!("{PREFIX}/{shard}/")).send().await?;
    let mut newest: Option<serde_json::Value> = None;
    for key in listed.contents().iter().filter_map(|o| o.key()).filter(|k| k.ends_with("/drill.json")) {
        let body = client.get_object().bucket(bucket).key(key).send().await?.body.collect().await?.into_bytes();
        let report: serde_json::Value = serde_json::from_slice(&body).context("a drill report")?;
        if newest.as_ref().is_none_or(|n| n["finishedAt"].as_str() < report["finishedAt"].as_str()) {
            newest = Some(report);
        }
    }
    Ok(newest)
}

async fn newest_manifest(client: &aws_sdk_s3::Client, bucket: &str, shard: &str) -> Result<Option<serde_json::Value>> {
    let listed = client.list_objects_v2().bucket(bucket).prefix(format!("{PREFIX}/{shard}/")).send().await?;
    let mut newest: Option<serde_json::Value> = None;
    for key in listed.contents().iter().filter_map(|o| o.key()).filter(|k| k.ends_with("/manifest.json")) {
        let body = client.get_object().bucket(bucket).key(key).send().await?.body.collect().await?.into_bytes();
        let manifest: serde_json::Value = serde_json::from_slice(&body).context("a manifest")?;
        if newest.as_ref().is_none_or(|n| n["revision"].as_u64() < manifest["revision"].as_u64()) {
            newest = Some(manifest);
        }
    }
    Ok(newest)
}
