//! `drill`: etcd-snapshotter's restore drill of a 1 GiB snapshot against doing the same by hand, in alternate
//! rounds: download the file with the AWS CLI, `etcdutl snapshot restore`, start etcd on it and wait until it
//! answers healthy. Ours is `etcd-snapshotter drill --config F ID` (exit 0 = the drill passed) on the snapshot
//! the agent published of the same database (it also proves both hashes and compares the restored revision, key
//! count and HashKV with the manifest, and reads sample keys: more than the by-hand steps do); the by-hand
//! baseline restores `etcdctl snapshot save`'s file of it, uploaded once beforehand. Every restored data directory and downloaded file is deleted after its round.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;

use crate::common::{self, MIB, Report, Row, Run};
use crate::snapshot::{Configs, Filler, SIZES_MIB};

pub async fn run(rounds: usize, quick: bool) -> Result<Report> {
    let size = if quick { SIZES_MIB[0] } else { SIZES_MIB[SIZES_MIB.len() - 1] };
    let peers = peers::locate()?;
    let aws = crate::awscli::ensure()?;
    let work = tempfile::Builder::new().prefix("drill-").tempdir_in(crate::bench_dir())?;
    let etcd = testbed::Etcd::start(peers.path("etcd"), &work.path().join("etcd"), "shard", 1).await?;
    let s3 = testbed::S3Server::start(peers.path("versitygw"), &work.path().join("s3")).await?;
    let url = etcd.client_urls();
    let fill = Filler::new(&url).await?.fill_to(size * 1024 * 1024).await?;
    eprintln!("drill: etcd at {:.0} MiB ({} keys) after {:.1}s", fill.db_bytes as f64 / MIB, fill.keys, fill.seconds);
    let snapshotter = common::agent_binary("etcd-snapshotter")?;
    let configs = Configs::write(work.path(), &url, &s3)?;

    // What both restore: the agent's published snapshot, and etcdctl's file of the same database in the bucket.
    let out = Command::new(&snapshotter)
        .args(["snapshot", "--config"])
        .arg(&configs.zstd)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()?;
    anyhow::ensure!(out.status.success(), "etcd-snapshotter snapshot: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let id = stdout.split('\t').next().context("the snapshot's id")?.trim().to_string();
    let file = work.path().join("etcdctl.db");
    common::run(
        Command::new(peers.path("etcdctl")).args(["--endpoints", &url, "snapshot", "save"]).arg(&file),
        "etcdctl snapshot save",
    )?;
    let key = "by-hand/etcdctl.db";
    aws_cp(&aws, &s3, &file.display().to_string(), &format!("s3://{}/{key}", s3.bucket))?;
    std::fs::remove_file(&file)?;
    // The source etcd is not needed by either restore; stopping it frees a core for both.
    drop(etcd);

    let (mut ours, mut by_hand) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        eprintln!("drill: {size} MiB round {}/{rounds}", round + 1);
        ours.push(common::run(
            Command::new(&snapshotter)
                .args(["drill", "--config"])
                .arg(&configs.zstd)
                .arg(&id)
                .arg("--etcdutl")
                .arg(peers.path("etcdutl"))
                .arg("--etcd")
                .arg(peers.path("etcd"))
                .env("AWS_EC2_METADATA_DISABLED", "true")
                .env("KCP_KEEPER_LOG_FORMAT", "plain"),
            "etcd-snapshotter drill",
        )?);
        by_hand.push(manual(&peers, &aws, &s3, key, work.path()).await?);
    }
    drop(s3);
    work.close()?;

    let o = common::median(&ours.iter().map(|r| r.seconds).collect::<Vec<_>>());
    let m = common::median(&by_hand.iter().map(|r| r.seconds).collect::<Vec<_>>());
    let peak = common::max(&ours.iter().map(|r| r.peak_bytes as f64).collect::<Vec<_>>());
    let rows = vec![
        Row::new(format!("{size} MiB: drill (download, verify, restore, start, healthy)"), common::secs(o))
            .baseline(common::secs(m), o / m)
            .target(if o / m <= 1.2 {
                "<= 1.2".into()
            } else {
                format!("<= 1.2: missed by {:.0}%", (o / m / 1.2 - 1.0) * 100.0)
            }),
        Row::new(format!("{size} MiB: etcd-snapshotter drill peak RSS"), format!("{:.1} MiB", peak / MIB)),
    ];
    Ok(Report {
        rows,
        json: json!({
            "target_mib": size, "db_size_bytes": fill.db_bytes, "fill_seconds": fill.seconds, "rounds": rounds,
            "drill": Run::json(&ours), "by_hand": Run::json(&by_hand), "ratio": o / m,
        }),
    })
}

fn aws_cp(aws: &Path, s3: &testbed::S3Server, from: &str, to: &str) -> Result<Run> {
    common::run(
        Command::new(aws)
            .args(["s3", "cp", "--only-show-errors", "--endpoint-url", &s3.endpoint, "--region", testbed::s3::REGION])
            .args([from, to])
            .env("AWS_ACCESS_KEY_ID", &s3.access_key)
            .env("AWS_SECRET_ACCESS_KEY", &s3.secret_key)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
        "aws s3 cp",
    )
}

/// By hand: download, `etcdutl snapshot restore`, start etcd on the restored directory, wait until healthy.
async fn manual(peers: &peers::Peers, aws: &Path, s3: &testbed::S3Server, key: &str, dir: &Path) -> Result<Run> {
    let file = dir.join("download.db");
    let data = dir.join("restored");
    let started = Instant::now();
    let download = aws_cp(aws, s3, &format!("s3://{}/{key}", s3.bucket), &file.display().to_string())?;
    let restore = common::run(
        Command::new(peers.path("etcdutl"))
            .args(["snapshot", "restore"])
            .arg(&file)
            .arg("--data-dir")
            .arg(&data)
            .args(["--name", "drill", "--initial-cluster", "drill=http://127.0.0.1:2380"])
            .args(["--initial-advertise-peer-urls", "http://127.0.0.1:2380"]),
        "etcdutl snapshot restore",
    )?;
    let port = testbed::process::free_port()?;
    let peer = testbed::process::free_port()?;
    let client_url = format!("http://127.0.0.1:{port}");
    let mut etcd = testbed::process::Process::start(
        "restored-etcd",
        peers.path("etcd"),
        vec![
            "--name=drill".into(),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            "--log-level=warn".into(),
        ],
        dir.join("restored-etcd.log"),
    )?;
    // Healthy: etcdctl's own check answers, as an operator would run it.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ok = Command::new(peers.path("etcdctl"))
            .args(["--endpoints", &client_url, "--command-timeout=2s", "endpoint", "health"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            break;
        }
        etcd.check_running()?;
        anyhow::ensure!(Instant::now() < deadline, "the restored etcd was not healthy within 120s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    etcd.kill();
    std::fs::remove_file(&file)?;
    std::fs::remove_dir_all(&data)?;
    // The restored etcd is killed, not waited for as a command: its CPU time is not in the figure.
    Ok(Run {
        seconds,
        peak_bytes: download.peak_bytes.max(restore.peak_bytes),
        cpu_seconds: download.cpu_seconds + restore.cpu_seconds,
    })
}
