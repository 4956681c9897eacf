//! `snapshot-curve`: etcd-snapshotter in one replica (`etcd-snapshotter run`, the daemon) against 1, 5 and 20
//! shards, each shard a real etcd filled with kcp-shaped objects (as `snapshot`) to a small database, every shard on
//! the same cron tick. Measured per size: the time per tick (from the tick to the last shard's `last_success`,
//! i.e. every shard snapshotted and published), the agent's peak memory (`VmHWM`) and the S3 requests of a tick
//! (counted by a fault proxy in front of versitygw). Then one shard is made slow: every S3 request under its
//! directory is held by the proxy for [`SLOW_REQUEST`] before it is forwarded, and the next tick shows how much
//! the other shards' snapshots are delayed (the agent takes one snapshot at a time per process).
//!
//! The baseline beside it at each size: Gardener's etcd-backup-restore as Gardener deploys it, one `etcdbrctl
//! snapshot` process per shard (a sidecar per etcd), all started together, each timed from their common start to
//! its log line saying the full snapshot is in the store (see `etcdbr.rs`); its memory is the sum of the peaks,
//! its requests those its processes sent through their own fault proxy, and the same slow shard.

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde_json::json;
use testbed::agent_process::{AgentProcess, AgentUnderTest};
use testbed::fault_proxy::{Fault, FaultProxy};

use crate::common::{self, MIB, PeakWatch, Report, Row};
use crate::curve;

/// The sizes of `snapshot-curve` (shards in one replica) unless `--sizes` says otherwise.
pub const CURVE_SIZES: &[usize] = &[1, 5, 20];
/// Each shard's database: small, so that 20 etcds and their snapshots fit on the bench machine.
const SHARD_MIB: u64 = 32;
/// What the fault proxy holds each S3 request of the slow shard for (a store far away, or struggling).
const SLOW_REQUEST: Duration = Duration::from_secs(1);
/// The slow shard: the first of the configuration.
const SLOW_SHARD: &str = "shard-00";
const NAMESPACE: &str = "kcp-keeper";
const USER: &str = "bench-etcd-snapshotter";
/// What etcdbrctl logs once a full snapshot is in the store (as `etcdbr.rs` waits for it).
const ETCDBR_SAVED: &str = "Total time to save Full snapshot";

fn shard_name(i: usize) -> String {
    format!("shard-{i:02}")
}

/// One tick (or one start of the etcdbrctl processes): each shard's completion in seconds from the tick, in
/// shard order, and the S3 requests sent meanwhile.
#[derive(Clone, Debug)]
struct Tick {
    done: Vec<f64>,
    requests: usize,
}

impl Tick {
    fn seconds(&self) -> f64 {
        common::max(&self.done)
    }

    fn json(&self) -> serde_json::Value {
        json!({"seconds": self.seconds(), "per_shard_seconds": self.done, "s3_requests": self.requests})
    }
}

/// How much later than in `normal` the shards other than the slow one (index 0) were done in `slow`: median
/// and max over the other shards (medians of the rounds), None with one shard. The order of a tick is not fixed,
/// so this mixes the wait behind the slow shard with a changed order; [`behind_slow`] tells them apart.
fn others_delay(normal: &[Tick], slow: &[Tick]) -> Option<(f64, f64)> {
    let shards = normal.first()?.done.len();
    if shards < 2 {
        return None;
    }
    let at = |ticks: &[Tick], i: usize| common::median(&ticks.iter().map(|t| t.done[i]).collect::<Vec<_>>());
    let delays: Vec<f64> = (1..shards).map(|i| at(slow, i) - at(normal, i)).collect();
    Some((common::median(&delays), common::max(&delays)))
}

/// For each slowed round: the other shards done after the slow one (index 0), and how much later each was done
/// than in the same round without the slow shard.
fn behind_slow(normal: &[Tick], slow: &[Tick]) -> Vec<Vec<f64>> {
    normal
        .iter()
        .zip(slow)
        .map(|(normal, slow)| {
            (1..slow.done.len())
                .filter(|&i| slow.done[i] > slow.done[0])
                .map(|i| slow.done[i] - normal.done[i])
                .collect()
        })
        .collect()
}

/// `13 of 19, 21.60 s to 30.00 s later` per round.
fn behind_text(normal: &[Tick], slow: &[Tick]) -> String {
    let others = normal.first().map_or(0, |t| t.done.len().saturating_sub(1));
    if others == 0 {
        return "-".into();
    }
    behind_slow(normal, slow)
        .iter()
        .map(|later| match later.iter().copied().reduce(f64::min) {
            None => format!("0 of {others}"),
            Some(least) => format!(
                "{} of {others}, {} to {} later",
                later.len(),
                common::secs(least),
                common::secs(common::max(later))
            ),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Every figure of one size.
struct Measured {
    shards: usize,
    agent: Vec<Tick>,
    agent_slow: Vec<Tick>,
    /// Each shard's own run in the slow ticks (`etcd_snapshotter_duration_seconds`), the slow shard first.
    agent_slow_runs: Vec<Vec<f64>>,
    /// Shards finished before the slow one in each slow tick (the order the agent took them in).
    slow_position: Vec<usize>,
    agent_hwm: u64,
    agent_hwm_after_slow: u64,
    etcdbr: Vec<Tick>,
    etcdbr_slow: Vec<Tick>,
    /// The sum of the etcdbrctl processes' peaks, the highest over the rounds.
    etcdbr_peak_sum: u64,
    etcdbr_peak_max: u64,
}

pub async fn curve(rounds: usize, sizes: &[usize]) -> Result<Report> {
    let most = sizes.iter().copied().max().context("no sizes")?;
    let peers = peers::locate()?;
    let etcdbrctl = peers::ensure_bench(&["etcdbrctl"])?;
    let etcdbrctl = etcdbrctl.path("etcdbrctl").to_path_buf();
    // Under target/, not /tmp: the databases, spill, etcdbrctl's temp files and the objects need the room.
    let work = tempfile::Builder::new().prefix("snapshot-curve-").tempdir_in(crate::bench_dir())?;
    eprintln!("snapshot-curve: starting etcd, kube-apiserver (the agent's Lease), versitygw and {most} shard etcds");
    let bed = testbed::ControlPlane::start().await?;
    bed.create_namespace(NAMESPACE).await?;
    let s3 = crate::etcdbr::s3_with_versioning(peers.path("versitygw"), &work.path().join("s3")).await?;
    let mut etcds = Vec::new();
    let mut filled = Vec::new();
    for i in 0..most {
        let dir = work.path().join(format!("etcd-{i:02}"));
        std::fs::create_dir_all(&dir)?;
        let etcd = testbed::Etcd::start(peers.path("etcd"), &dir, &shard_name(i), 1).await?;
        let mut filler = crate::snapshot::Filler::new(&etcd.client_urls()).await?;
        filled.push(filler.fill_to(SHARD_MIB * 1024 * 1024).await?);
        etcds.push(etcd);
    }
    let fill_seconds: f64 = filled.iter().map(|f| f.seconds).sum();
    eprintln!(
        "snapshot-curve: {most} shards filled to {:.0} MiB each ({} keys each) in {fill_seconds:.1}s",
        filled.iter().map(|f| f.db_bytes as f64).sum::<f64>() / most as f64 / MIB,
        filled[0].keys,
    );
    let urls: Vec<String> = etcds.iter().map(|e| e.client_urls()).collect();
    let agent_proxy = FaultProxy::start(&s3.endpoint).await?;
    let etcdbr_proxy = FaultProxy::start(&s3.endpoint).await?;
    let kubeconfig = bed.apiserver.user_kubeconfig(USER, &["system:masters"], Duration::from_secs(24 * 3600))?;
    let credentials = crate::etcdbr::credentials(work.path(), &s3)?;

    let mut points = Vec::new();
    for &n in sizes {
        eprintln!("snapshot-curve: {n} shard(s)");
        let agent = Agent { bed: &bed, kubeconfig: &kubeconfig, proxy: &agent_proxy, s3: &s3, dir: work.path() };
        let (ticks, slow, slow_runs, slow_position, hwm, hwm_slow) = agent.measure(rounds, &urls[..n]).await?;
        let etcdbr = Etcdbr {
            binary: &etcdbrctl,
            proxy: &etcdbr_proxy,
            s3: &s3,
            credentials: &credentials,
            dir: &work.path().join("etcdbr"),
        };
        let (mut normal, mut slowed, mut peak_sum, mut peak_max) = (Vec::new(), Vec::new(), 0, 0);
        for round in 0..rounds {
            for (slow, into) in [(false, &mut normal), (true, &mut slowed)] {
                eprintln!(
                    "snapshot-curve: {n} etcdbrctl process(es), round {}/{rounds}, slow shard: {slow}",
                    round + 1
                );
                let prefix = format!("gardener/{n}/r{round}-{}", if slow { "slow" } else { "normal" });
                let (tick, sum, max) = etcdbr.tick(&urls[..n], &prefix, slow).await?;
                let objects = crate::etcdbr::delete_prefix(&s3, &prefix).await?;
                anyhow::ensure!(objects >= n, "{n} etcdbrctl said they saved, but {prefix} holds {objects} objects");
                if !slow {
                    peak_sum = peak_sum.max(sum);
                    peak_max = peak_max.max(max);
                }
                into.push(tick);
            }
        }
        points.push(Measured {
            shards: n,
            agent: ticks,
            agent_slow: slow,
            agent_slow_runs: slow_runs,
            slow_position,
            agent_hwm: hwm,
            agent_hwm_after_slow: hwm_slow,
            etcdbr: normal,
            etcdbr_slow: slowed,
            etcdbr_peak_sum: peak_sum,
            etcdbr_peak_max: peak_max,
        });
    }
    drop(agent_proxy);
    drop(etcdbr_proxy);
    drop(etcds);
    drop(s3);
    drop(bed);
    work.close()?;
    report(rounds, &points, &filled)
}

fn report(rounds: usize, points: &[Measured], filled: &[crate::snapshot::Fill]) -> Result<Report> {
    let m = |ticks: &[Tick]| common::median(&ticks.iter().map(Tick::seconds).collect::<Vec<_>>());
    let reqs = |ticks: &[Tick]| common::median(&ticks.iter().map(|t| t.requests as f64).collect::<Vec<_>>());
    let series =
        |f: &dyn Fn(&Measured) -> f64| -> Vec<(f64, f64)> { points.iter().map(|p| (p.shards as f64, f(p))).collect() };
    let time = vec![
        curve::Series::new("etcd-snapshotter (one replica)", series(&|p| m(&p.agent))),
        curve::Series::new("etcdbrctl, one per shard", series(&|p| m(&p.etcdbr))),
        curve::Series::new("etcd-snapshotter, one shard slow", series(&|p| m(&p.agent_slow))),
        curve::Series::new("etcdbrctl, one shard slow", series(&|p| m(&p.etcdbr_slow))),
    ];
    let requests = vec![
        curve::Series::new("etcd-snapshotter", series(&|p| reqs(&p.agent))),
        curve::Series::new("etcdbrctl, all processes", series(&|p| reqs(&p.etcdbr))),
    ];
    let memory = vec![
        curve::Series::new("etcd-snapshotter", series(&|p| p.agent_hwm as f64 / MIB)),
        curve::Series::new("etcdbrctl, sum of the processes", series(&|p| p.etcdbr_peak_sum as f64 / MIB)),
    ];
    let mut rows = Vec::new();
    for p in points {
        let n = p.shards;
        let (ta, tb) = (m(&p.agent), m(&p.etcdbr));
        rows.push(
            Row::new(format!("{n} shard(s): tick, every shard snapshotted and published"), common::secs(ta))
                .baseline(common::secs(tb), ta / tb),
        );
        rows.push(
            Row::new(format!("{n} shard(s): S3 requests per tick (fault proxy)"), format!("{:.0}", reqs(&p.agent)))
                .baseline(format!("{:.0}", reqs(&p.etcdbr)), reqs(&p.agent) / reqs(&p.etcdbr)),
        );
        rows.push(
            Row::new(format!("{n} shard(s): peak RSS (agent; etcdbrctl: sum of processes)"), common::mib(p.agent_hwm))
                .baseline(
                    format!("{} (largest {})", common::mib(p.etcdbr_peak_sum), common::mib(p.etcdbr_peak_max)),
                    p.agent_hwm as f64 / p.etcdbr_peak_sum as f64,
                ),
        );
        let (sa, sb) = (m(&p.agent_slow), m(&p.etcdbr_slow));
        rows.push(
            Row::new(
                format!(
                    "{n} shard(s): tick with {SLOW_SHARD} slow ({} per S3 request)",
                    common::secs(SLOW_REQUEST.as_secs_f64())
                ),
                common::secs(sa),
            )
            .baseline(common::secs(sb), sa / sb),
        );
        let slow_run = common::median(&p.agent_slow_runs.iter().map(|r| r[0]).collect::<Vec<_>>());
        rows.push(Row::new(
            format!("{n} shard(s):   the slow shard's own run (agent's duration metric); shards before it"),
            format!(
                "{}; {}",
                common::secs(slow_run),
                p.slow_position.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            ),
        ));
        let mut behind = Row::new(
            format!("{n} shard(s):   other shards done after the slow one, later than without it"),
            behind_text(&p.agent, &p.agent_slow),
        );
        behind.baseline = behind_text(&p.etcdbr, &p.etcdbr_slow);
        rows.push(behind);
    }
    let (json_exponents, _svg) = curve::finish(
        &mut rows,
        (
            "snapshot-curve",
            &format!(
                "snapshot: N shards of {SHARD_MIB} MiB in one replica vs one etcdbrctl per shard ({rounds} round(s) per size)"
            ),
            "shards",
        ),
        ("time per tick (every shard published)", "S3 requests per tick"),
        curve::Measures { time, requests, memory },
    )?;
    let ticks = |t: &[Tick]| t.iter().map(Tick::json).collect::<Vec<_>>();
    Ok(Report {
        rows,
        json: json!({
            "rounds": rounds, "shard_target_mib": SHARD_MIB,
            "slow_shard": SLOW_SHARD, "slow_request_seconds": SLOW_REQUEST.as_secs_f64(),
            "shard_db_bytes": filled.iter().map(|f| f.db_bytes).collect::<Vec<_>>(),
            "shard_keys": filled.iter().map(|f| f.keys).collect::<Vec<_>>(),
            "sizes": points.iter().map(|p| json!({
                "shards": p.shards,
                "agent_ticks": ticks(&p.agent), "agent_slow_ticks": ticks(&p.agent_slow),
                "agent_slow_tick_runs_seconds": p.agent_slow_runs, "shards_before_the_slow_one": p.slow_position,
                "agent_peak_rss_bytes": p.agent_hwm, "agent_peak_rss_bytes_after_slow_ticks": p.agent_hwm_after_slow,
                "etcdbr_runs": ticks(&p.etcdbr), "etcdbr_slow_runs": ticks(&p.etcdbr_slow),
                "etcdbr_peak_rss_sum_bytes": p.etcdbr_peak_sum, "etcdbr_peak_rss_largest_bytes": p.etcdbr_peak_max,
                "behind_the_slow_shard_seconds": {
                    "agent": behind_slow(&p.agent, &p.agent_slow), "etcdbr": behind_slow(&p.etcdbr, &p.etcdbr_slow),
                },
                "others_delay_seconds": {
                    "agent": others_delay(&p.agent, &p.agent_slow).map(|(a, b)| json!({"median": a, "max": b})),
                    "etcdbr": others_delay(&p.etcdbr, &p.etcdbr_slow).map(|(a, b)| json!({"median": a, "max": b})),
                },
            })).collect::<Vec<_>>(),
            "exponents": json_exponents,
        }),
    })
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

/// Holds every S3 request of the slow shard (its objects, and listings of its directory) for [`SLOW_REQUEST`]:
/// every request whose path or query names it (no other shard's name contains `shard-00`).
fn slow_down(proxy: &FaultProxy) {
    proxy.inject("", SLOW_SHARD, Fault::Delay(SLOW_REQUEST), usize::MAX);
}

fn requests_between(proxy: &FaultProxy, from: f64, to: f64) -> usize {
    proxy.requests().iter().filter(|(at, _, _)| *at >= from && *at <= to).count()
}

struct Agent<'a> {
    bed: &'a testbed::ControlPlane,
    kubeconfig: &'a Path,
    proxy: &'a FaultProxy,
    s3: &'a testbed::S3Server,
    dir: &'a Path,
}

type AgentFigures = (Vec<Tick>, Vec<Tick>, Vec<Vec<f64>>, Vec<usize>, u64, u64);

impl Agent<'_> {
    /// One replica for `urls.len()` shards, every shard on the same cron tick (a minute apart; two minutes from 20
    /// shards on, so a slowed tick ends before the next): a first tick, then `rounds` ticks measured, then the
    /// slow shard and `rounds` ticks more.
    async fn measure(&self, rounds: usize, urls: &[String]) -> Result<AgentFigures> {
        let n = urls.len();
        let period: u64 = if n <= 5 { 60 } else { 120 };
        let cron = if period == 60 { "0 * * * * *" } else { "0 */2 * * * *" };
        let shards: String = urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                format!("- name: {}\n  endpoints: [{url}]\n  schedule:\n    cron: \"{cron}\"\n", shard_name(i))
            })
            .collect();
        let dir = self.dir.join(format!("agent-{n}"));
        let secrets = dir.join("s3-credentials");
        std::fs::create_dir_all(&secrets)?;
        std::fs::write(secrets.join("AWS_ACCESS_KEY_ID"), &self.s3.access_key)?;
        std::fs::write(secrets.join("AWS_SECRET_ACCESS_KEY"), &self.s3.secret_key)?;
        // The spill settings of `snapshot` (the agent's example): 64 MiB of parts in memory, 8 MiB parts, two in
        // flight; retention keeps the newest, as there.
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "shards:\n{shards}storage:\n  bucket: {}\n  prefix: agent/{n}\n  endpoint: {}\n  region: {}\n  pathStyle: \
                 true\n  credentials:\n    secretDirectory: {}\ncompression: zstd\nretention:\n  keepLast: 1\nspill:\n  \
                 directory: {}\n  memoryBudget: 64Mi\n  partSize: 8Mi\n  partsInFlight: 2\n",
                self.s3.bucket,
                self.proxy.url,
                testbed::s3::REGION,
                secrets.display(),
                dir.join("spill").display(),
            ),
        )?;
        let binary = common::agent_binary("etcd-snapshotter")?;
        let env = [("KCP_KEEPER_LOG_FORMAT", "plain"), ("AWS_EC2_METADATA_DISABLED", "true")];
        let agent = AgentUnderTest::new(self.bed, &binary, &config).kubeconfig(self.kubeconfig).namespace(NAMESPACE);
        let identity = format!("etcd-snapshotter-{n}");
        let mut agent = agent.identity(&identity).envs(&env).ready_within(Duration::from_secs(90)).start().await?;
        let pid = agent.process.pid().context("the agent exited")?;
        let first = self.tick(&agent, n, period, "the first tick").await?;
        eprintln!("snapshot-curve: {n} shard(s), first tick {}", common::secs(first.seconds()));
        let mut ticks = Vec::new();
        for round in 0..rounds {
            let tick = self.tick(&agent, n, period, "a tick").await?;
            eprintln!(
                "snapshot-curve: {n} shard(s), round {}/{rounds}: tick {}",
                round + 1,
                common::secs(tick.seconds())
            );
            ticks.push(tick);
        }
        let hwm = common::status_bytes(pid, "VmHWM").context("VmHWM")?;
        slow_down(self.proxy);
        let (mut slow, mut runs, mut position) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let tick = self.tick(&agent, n, period, "a tick with a slow shard").await?;
            eprintln!(
                "snapshot-curve: {n} shard(s), round {}/{rounds}, {SLOW_SHARD} slow: tick {}",
                round + 1,
                common::secs(tick.seconds())
            );
            let text = agent.metrics().await;
            runs.push(
                (0..n)
                    .map(|i| {
                        let series = format!("etcd_snapshotter_duration_seconds{{shard=\"{}\"}}", shard_name(i));
                        testbed::metrics::value(&text, &series)
                    })
                    .collect::<Result<Vec<f64>>>()?,
            );
            position.push(tick.done.iter().filter(|d| **d < tick.done[0]).count());
            slow.push(tick);
        }
        self.proxy.clear();
        let hwm_slow = common::status_bytes(pid, "VmHWM").context("VmHWM")?;
        agent.terminate(Duration::from_secs(20));
        Ok((ticks, slow, runs, position, hwm, hwm_slow))
    }

    /// Waits for the next tick (the next multiple of `period` in Unix time, the cron's instant, at least a second
    /// away) and until every shard's `last_success` is at or past it.
    async fn tick(&self, agent: &AgentProcess, n: usize, period: u64, what: &str) -> Result<Tick> {
        let now = unix_now();
        let at = ((now + 1.0) / period as f64).ceil() * period as f64;
        let series: Vec<String> = (0..n)
            .map(|i| format!("etcd_snapshotter_last_success_timestamp_seconds{{shard=\"{}\"}}", shard_name(i)))
            .collect();
        let deadline = Instant::now() + Duration::from_secs_f64(at - now) + Duration::from_secs(period + 120);
        loop {
            let text = agent.metrics().await;
            let values: Vec<f64> = series.iter().map(|s| testbed::metrics::value(&text, s).unwrap_or(0.0)).collect();
            if values.iter().all(|v| *v >= at) {
                let done: Vec<f64> = values.iter().map(|v| v - at).collect();
                let last = values.iter().copied().fold(at, f64::max);
                anyhow::ensure!(
                    last < at + period as f64,
                    "{what} at {at} ended {:.1}s later, past the next tick: the ticks overlap",
                    last - at
                );
                return Ok(Tick { done, requests: requests_between(self.proxy, at, last) });
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{what} at {at}: {} of {n} shards published within {}s",
                values.iter().filter(|v| **v >= at).count(),
                period + 120
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

struct Etcdbr<'a> {
    binary: &'a Path,
    proxy: &'a FaultProxy,
    s3: &'a testbed::S3Server,
    credentials: &'a Path,
    dir: &'a Path,
}

impl Etcdbr<'_> {
    /// One etcdbrctl per shard, started together, each until it says its full snapshot is in the store: each
    /// shard's completion from the first start, the S3 requests meanwhile, the sum of the processes' peaks and
    /// the largest.
    async fn tick(&self, urls: &[String], prefix: &str, slow: bool) -> Result<(Tick, u64, u64)> {
        if slow {
            slow_down(self.proxy);
        }
        let from = unix_now();
        let started = Instant::now();
        let outcome = tokio::task::block_in_place(|| {
            std::thread::scope(|scope| {
                let handles: Vec<_> = urls
                    .iter()
                    .enumerate()
                    .map(|(i, url)| {
                        let shard = shard_name(i);
                        scope.spawn(move || self.one(url, &shard, &format!("{prefix}/{shard}"), started))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("an etcdbrctl thread panicked"))))
                    .collect::<Result<Vec<(f64, u64)>>>()
            })
        });
        let to = unix_now();
        self.proxy.clear();
        let runs = outcome?;
        let done = runs.iter().map(|r| r.0).collect();
        let peaks: Vec<u64> = runs.iter().map(|r| r.1).collect();
        let tick = Tick { done, requests: requests_between(self.proxy, from, to) };
        Ok((tick, peaks.iter().sum(), peaks.iter().copied().max().unwrap_or(0)))
    }

    /// One etcdbrctl for one shard, with the flags of `etcdbr.rs` (a full snapshot at start, nothing else due):
    /// seconds from `started` to its line saying the snapshot is saved, and its peak memory.
    fn one(&self, url: &str, shard: &str, prefix: &str, started: Instant) -> Result<(f64, u64)> {
        let temp = self.dir.join(format!("temp-{shard}"));
        std::fs::create_dir_all(&temp)?;
        let mut child = Command::new(self.binary)
            .arg("snapshot")
            .arg("--storage-provider=S3")
            .arg(format!("--store-container={}", self.s3.bucket))
            .arg(format!("--store-prefix={prefix}"))
            .arg(format!("--store-endpoint-override={}", self.proxy.url))
            .arg(format!("--endpoints={url}"))
            .arg("--schedule=0 0 1 1 *")
            .arg("--delta-snapshot-period=0s")
            .arg("--garbage-collection-period=0s")
            .arg(format!("--snapstore-temp-directory={}", temp.display()))
            .env("AWS_APPLICATION_CREDENTIALS", self.credentials)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("AWS_CA_BUNDLE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting etcdbrctl snapshot")?;
        let watch = PeakWatch::start(child.id());
        let stderr = child.stderr.take().context("etcdbrctl's stderr")?;
        let mut saved = None;
        let mut tail: Vec<String> = Vec::new();
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains(ETCDBR_SAVED) {
                saved = Some(started.elapsed().as_secs_f64());
                break;
            }
            tail.push(line);
            if tail.len() > 40 {
                tail.remove(0);
            }
            if started.elapsed() > Duration::from_secs(900) {
                break;
            }
        }
        let peak = watch.finish();
        let _ = child.kill();
        let status = child.wait()?;
        let _ = std::fs::remove_dir_all(&temp);
        let seconds = saved.with_context(|| {
            format!("etcdbrctl for {shard} ended ({status}) without saving a full snapshot:\n{}", tail.join("\n"))
        })?;
        Ok((seconds, peak))
    }
}

#[cfg(test)]
mod tests {
    use super::{Tick, behind_slow, behind_text};

    #[test]
    fn only_the_shards_done_after_the_slow_one_count_as_waiting_for_it() {
        let tick = |done: &[f64]| Tick { done: done.to_vec(), requests: 0 };
        // Shard 0 slow; shard 1 ran before it (earlier than before: another order), shards 2 and 3 after it.
        let normal = [tick(&[0.4, 0.8, 1.2, 1.6])];
        let slow = [tick(&[26.0, 0.4, 26.4, 26.8])];
        let later = behind_slow(&normal, &slow);
        assert_eq!(later.len(), 1);
        assert_eq!(later[0].len(), 2);
        assert!((later[0][0] - 25.2).abs() < 1e-9 && (later[0][1] - 25.2).abs() < 1e-9, "{later:?}");
        assert_eq!(behind_text(&normal, &slow), "2 of 3, 25.20 s to 25.20 s later");
        assert_eq!(behind_text(&[tick(&[0.4])], &[tick(&[26.0])]), "-");
    }
}
