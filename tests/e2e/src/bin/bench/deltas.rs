//! `deltas`: the daemon with delta snapshots on (`deltas.interval` 10 s, the default) under a steady write load
//! against a real etcd for a fixed period: the RPO it achieves (the age of the newest stored point,
//! `time() - delta_stored_through_timestamp_seconds`, sampled every second), the bytes per second of deltas
//! stored and their objects, the agent's peak memory and CPU over the period; and against it what a full
//! snapshot every `interval` would cost for the same database, the other way to reach that RPO (the bytes and
//! CPU of one full snapshot, measured with the one-shot `snapshot` on the same database, per interval).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;
use testbed::agent_process::AgentUnderTest;

use crate::common::{self, MIB, Report, Row};

const INTERVAL_SECONDS: f64 = 10.0;
/// The database the load writes into, as a mid-sized kcp shard (the full snapshot's cost scales with it).
const DB_MIB: u64 = 128;
/// Puts per second of the load: kcp-shaped objects updated in place (2 KiB each).
const PUTS_PER_SECOND: u64 = 50;
const VALUE_BYTES: usize = 2048;
const KEYS: u64 = 2000;

pub async fn run(quick: bool) -> Result<Report> {
    let period = Duration::from_secs(if quick { 60 } else { 180 });
    let peers = peers::locate()?;
    eprintln!("deltas: starting kube-apiserver (the Lease), etcd and S3");
    let bed = testbed::ControlPlane::start().await?;
    let s3 = bed.s3().await?;
    let dir = bed.subdir("deltas")?;
    let etcd = testbed::Etcd::start(peers.path("etcd"), &dir.join("etcd"), "shard", 1).await?;
    let url = etcd.client_urls();
    let fill = crate::snapshot::Filler::new(&url).await?.fill_to(DB_MIB * 1024 * 1024).await?;
    eprintln!("deltas: etcd at {:.0} MiB ({} keys) after {:.1}s", fill.db_bytes as f64 / MIB, fill.keys, fill.seconds);

    let config = write_config(&dir, &url, &s3)?;
    let snapshotter = common::agent_binary("etcd-snapshotter")?;
    let kubeconfig = bed.apiserver.user_kubeconfig("bench-deltas", &["system:masters"], Duration::from_secs(86400))?;
    let namespace = bed.namespace().await?;
    let agent = AgentUnderTest::new(&bed, &snapshotter, &config)
        .kubeconfig(&kubeconfig)
        .namespace(&namespace)
        .identity("bench-deltas")
        .envs(&[("AWS_EC2_METADATA_DISABLED", "true"), ("KCP_KEEPER_LOG_FORMAT", "plain")])
        .ready_within(Duration::from_secs(90))
        .start()
        .await?;
    let pid = agent.process.pid().context("the agent exited")?;
    let stored_through = "etcd_snapshotter_delta_stored_through_timestamp_seconds{shard=\"bench\"}";
    // The load from the start: an idle shard's writer has no event to prove a point with (seen on this
    // bench: no stored-through time in 180 s without writes). The first full snapshot (the chain's base) and a
    // first caught-up session come before the clock starts.
    let load = tokio::spawn(steady_load(url.clone(), period + Duration::from_secs(200)));
    let started = Instant::now();
    while agent.metric(stored_through).await.unwrap_or(0.0) <= 0.0 {
        if started.elapsed() > Duration::from_secs(180) {
            let log = agent.process.log();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            anyhow::bail!(
                "the deltas never caught up; the agent's log ends:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let full_object_bytes = agent.metric("etcd_snapshotter_object_bytes{shard=\"bench\"}").await?;

    let bytes_before = agent.metric("etcd_snapshotter_delta_bytes_total{shard=\"bench\"}").await?;
    let objects_before = agent.metric("etcd_snapshotter_delta_objects_total{shard=\"bench\"}").await?;
    let cpu_before = cpu_seconds(pid)?;
    let watch = common::PeakWatch::start(pid);
    let mut rpo = Vec::new();
    let window = Instant::now();
    while window.elapsed() < period {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let through = agent.metric(stored_through).await?;
        rpo.push(unix_now() - through);
    }
    load.abort();
    let puts = (seconds_so_far(&window) * PUTS_PER_SECOND as f64) as u64;
    let seconds = window.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid)? - cpu_before;
    let bytes = agent.metric("etcd_snapshotter_delta_bytes_total{shard=\"bench\"}").await? - bytes_before;
    let objects = agent.metric("etcd_snapshotter_delta_objects_total{shard=\"bench\"}").await? - objects_before;
    let peak = watch.finish();
    drop(agent);

    // A full snapshot of the same database (now holding the load's writes too), by the one-shot.
    let mut full = Vec::new();
    for _ in 0..if quick { 1 } else { 3 } {
        full.push(common::run(
            Command::new(&snapshotter)
                .args(["snapshot", "--config"])
                .arg(&config)
                .env("AWS_EC2_METADATA_DISABLED", "true")
                .env("KCP_KEEPER_LOG_FORMAT", "plain"),
            "etcd-snapshotter snapshot",
        )?);
    }
    let full_cpu = common::median(&full.iter().map(|r| r.cpu_seconds).collect::<Vec<_>>());
    let delta_bytes_per_second = bytes / seconds;
    let full_bytes_per_second = full_object_bytes / INTERVAL_SECONDS;
    let delta_cpu_per_second = cpu / seconds;
    let full_cpu_per_second = full_cpu / INTERVAL_SECONDS;
    let rpo_median = common::median(&rpo);
    let rpo_max = common::max(&rpo);
    let rate = |v: f64| format!("{:.1} KiB/s", v / 1024.0);
    let cores = |v: f64| format!("{:.1}% of a core", v * 100.0);
    let rows = vec![
        Row::new(
            format!("RPO (newest stored point's age), median / max of {} samples", rpo.len()),
            format!("{} / {}", common::secs(rpo_median), common::secs(rpo_max)),
        )
        .target(format!("interval {INTERVAL_SECONDS:.0} s + flush")),
        Row::new(
            format!("delta bytes stored per second ({PUTS_PER_SECOND} puts/s of {VALUE_BYTES} B)"),
            rate(delta_bytes_per_second),
        )
        .baseline(
            format!("{} (full every {INTERVAL_SECONDS:.0} s)", rate(full_bytes_per_second)),
            delta_bytes_per_second / full_bytes_per_second,
        ),
        Row::new("agent CPU while writing deltas", cores(delta_cpu_per_second)).baseline(
            format!("{} (full every {INTERVAL_SECONDS:.0} s)", cores(full_cpu_per_second)),
            delta_cpu_per_second / full_cpu_per_second,
        ),
        Row::new(format!("delta objects in {seconds:.0} s"), format!("{objects:.0}")),
        Row::new("agent peak memory (VmHWM) with deltas", common::mib(peak)),
    ];
    Ok(Report {
        rows,
        json: json!({
            "interval_seconds": INTERVAL_SECONDS,
            "period_seconds": seconds,
            "db_bytes_at_start": fill.db_bytes,
            "puts": puts,
            "puts_per_second_target": PUTS_PER_SECOND,
            "value_bytes": VALUE_BYTES,
            "rpo_seconds_samples": rpo,
            "rpo_seconds_median": rpo_median,
            "rpo_seconds_max": rpo_max,
            "delta_bytes": bytes,
            "delta_objects": objects,
            "delta_bytes_per_second": delta_bytes_per_second,
            "agent_cpu_seconds": cpu,
            "agent_peak_rss_bytes": peak,
            "full_object_bytes": full_object_bytes,
            "full_snapshot_runs": common::Run::json(&full),
            "full_bytes_per_second_at_interval": full_bytes_per_second,
            "full_cpu_per_second_at_interval": full_cpu_per_second,
        }),
    })
}

fn write_config(dir: &Path, url: &str, s3: &testbed::S3Server) -> Result<std::path::PathBuf> {
    let secrets = dir.join("s3-credentials");
    std::fs::create_dir_all(&secrets)?;
    std::fs::write(secrets.join("AWS_ACCESS_KEY_ID"), &s3.access_key)?;
    std::fs::write(secrets.join("AWS_SECRET_ACCESS_KEY"), &s3.secret_key)?;
    let text = format!(
        "shards:\n- name: bench\n  endpoints: [{url}]\n  schedule:\n    cron: \"0 0 * * * *\"\n  deltas:\n    enabled: true\n\
         storage:\n  bucket: {}\n  prefix: bench\n  endpoint: {}\n  region: {}\n  pathStyle: true\n  credentials:\n    \
         secretDirectory: {}\ncompression: zstd\nretention:\n  keepLast: 3\nspill:\n  directory: {}\n  memoryBudget: 64Mi\n  \
         partSize: 8Mi\n  partsInFlight: 2\n",
        s3.bucket,
        s3.endpoint,
        testbed::s3::REGION,
        secrets.display(),
        dir.join("spill").display(),
    );
    let path = dir.join("deltas.yaml");
    std::fs::write(&path, text)?;
    Ok(path)
}

/// `PUTS_PER_SECOND` updates of `KEYS` kcp-shaped keys, paced, for `period`; returns the puts acknowledged.
async fn steady_load(url: String, period: Duration) -> Result<u64> {
    let mut client = etcd_client::Client::connect([url], None).await?;
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / PUTS_PER_SECOND));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut n = 0u64;
    while started.elapsed() < period {
        tick.tick().await;
        let key = format!("/registry/core/configmaps/{:016x}/default/load-{:05}", n % 64, n % KEYS);
        // Random bytes as hex: compressible about as much as base64 payloads in real objects.
        let value: String = (0..VALUE_BYTES / 16)
            .map(|_| {
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                format!("{:016x}", state.wrapping_mul(0x2545_f491_4f6c_dd1d))
            })
            .collect();
        client.put(key, value, None).await?;
        n += 1;
    }
    Ok(n)
}

/// The process's user and system CPU time (`/proc/<pid>/stat` fields 14 and 15, in USER_HZ = 100 ticks).
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let rest = stat.rsplit_once(')').context("/proc/<pid>/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // After ')': field 3 is index 0, so utime (14) is 11 and stime (15) is 12.
    Ok((ticks(11) + ticks(12)) / 100.0)
}

fn seconds_so_far(since: &Instant) -> f64 {
    since.elapsed().as_secs_f64()
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}
