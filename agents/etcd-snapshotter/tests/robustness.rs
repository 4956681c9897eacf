//! The robustness suite: the agent's daemon in two replicas (deltas on and signed, drills, a full snapshot every
//! minute, retention keeping 3, a second store) against a real 3-member etcd with fsync on and two real versitygw
//! servers, each behind a fault proxy, while a traffic generator writes and records every put and delete with
//! its outcome, and a seeded schedule injects faults: a member killed and restarted, a member cut off from its
//! peers, the leader moved, an aggressive compaction, a defragmentation, NOSPACE raised and disarmed, a replica
//! SIGKILLed and restarted (the leader's loss hands over to the other), both replicas SIGKILLed mid-upload,
//! mid-delta or mid-lock-write, a one-shot snapshot beside the daemon,
//! two one-shots at the same revision, a replica leading with its clock 30 s ahead (libfaketime), S3 answering
//! 503, resetting, stalling, losing its answer to a request it carried out, or being down, on each kind of
//! request, and the second store down. The truth is etcd's own history, read by a watch of the test's own.
//!
//! Validators, after every scenario:
//! - the recovery-point metric, sampled through the run, never claims a time before which a write was
//!   acknowledged that the bucket does not hold;
//! - `restore --at latest`, once the faults stop, serves exactly the history's last state from either store: no
//!   acknowledged write lost;
//! - `restore --at REV` for sampled revisions serves exactly the history's state at REV, or exits 2 naming the
//!   gap;
//! - `restore --at TIME` for sampled times serves exactly the history's state at some revision r, no write of
//!   it sent after TIME, and nothing acknowledged more than the recovery point before TIME missing;
//! - every full snapshot listed restores to exactly the history's state at its revision;
//! - never two runs uploading a full snapshot at once (the store's proxy saw every request), and no live run (a
//!   replica, a one-shot) lost its shard lock to a takeover;
//! - in either store, once the daemons stopped: no multipart upload left, no object that no listed snapshot
//!   accounts for, and the object the agent did not write still there.
//!
//! Seeds: `ROBUSTNESS_SEEDS` (comma-separated; the fixed CI set by default) and `ROBUSTNESS_SECONDS` (the fault
//! phase per scenario). A scenario prints its seed and schedule first; its history, schedule, bucket listing and
//! the replicas' logs are kept under `$TMPDIR/kcp-keeper-robustness/seed-<n>/`. `cargo xtask robustness` runs
//! longer and more seeds.

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use etcd_client::{AlarmAction, ConnectOptions, EventType, WatchOptions};
use kcp_keeper_runtime::metrics::unix_now;
use testbed::fault_proxy::{Fault, FaultProxy};

/// Every scenario of CI applies every fault kind at least once: these seeds run in `cargo xtask test`.
const CI_SEEDS: &[u64] = &[1, 2];
const CI_SECONDS: u64 = 75;
const KEYS: u64 = 64;
/// The deltas' interval; the recovery point allowed for a time point is a few of it.
const INTERVAL: Duration = Duration::from_secs(1);
const RPO: f64 = 4.0;
/// The shard lock's expiry (`storage.lockExpiry`), short so that a one-shot contends for longer than it.
const LOCK_EXPIRY: &str = "12s";
const LOCK_EXPIRY_SECS: u64 = 12;
/// The environment that runs a replica with its clock 30 s ahead: libfaketime preloaded (wall clock only; the
/// monotonic clock, which times leases and locks, stays true).
static CLOCK_AHEAD: std::sync::LazyLock<[(&str, String); 3]> = std::sync::LazyLock::new(|| {
    [
        ("LD_PRELOAD", libfaketime().display().to_string()),
        ("FAKETIME", "+30s".to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ]
});

/// Debian's libfaketime (`cargo xtask test` installs it; the same places as the xtask's `LIBFAKETIME`).
fn libfaketime() -> PathBuf {
    let places = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ];
    let found = places.iter().map(PathBuf::from).find(|p| p.is_file());
    found.unwrap_or_else(|| panic!("libfaketime is not installed (none of {places:?}): `cargo xtask test` installs it"))
}

/// Fault kinds the schedule draws from (the last one stands for every S3 request kind).
const KINDS: u64 = 14;
/// Full snapshots each store keeps: retention prunes while deltas accrue.
const KEEP_LAST: usize = 3;
/// Objects the agent did not write, one in each store under the shard's own folder: never deleted.
const FOREIGN: &str = "root/operator-notes.txt";

/// A small deterministic generator (splitmix64): a seed replays the same schedule.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn secs(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from * 1000 + self.below((to - from) * 1000 + 1))
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone)]
enum FaultKind {
    KillMember(usize),
    CutMember(usize),
    MoveLeader,
    Compact,
    Defragment(usize),
    /// One of the two replicas SIGKILLed and restarted (the leader's loss hands over to the other).
    KillAgent(usize),
    /// Both replicas SIGKILLed while one of them is inside a request of this kind (held by the proxy), and
    /// restarted: mid-upload (`part`), mid-delta (`delta`) or mid-lock-write (`lock`).
    KillMidRequest(&'static str),
    OneShot,
    /// etcd's NOSPACE alarm raised on one member (the cluster takes no writes), then disarmed.
    Nospace(usize),
    /// The traffic paused and two one-shot snapshots taken at the same revision.
    SameRevision,
    /// The second store refuses every connection.
    SecondDown,
    /// Replica `i` restarted with its clock 30 s ahead (libfaketime) and made the leader for the hold, then
    /// restarted with the right time.
    ClockAhead(usize),
    /// A fault on one kind of S3 request, `times` times.
    S3 {
        request: &'static str,
        fault: S3Fault,
        times: usize,
    },
    S3Down,
}

#[derive(Debug, Clone, Copy)]
enum S3Fault {
    SlowDown,
    Reset,
    Stall,
    /// Carried out by the store, its answer lost.
    LoseAnswer,
}

/// The kinds of S3 request, as the fault proxy matches them: (name, method, part of the path and query).
const S3_REQUESTS: &[(&str, &str, &str)] = &[
    ("part", "PUT", "partNumber="),
    ("complete", "POST", "uploadId="),
    ("put", "PUT", ""),
    ("list", "GET", "list-type="),
    ("get", "GET", ""),
    ("delete", "DELETE", ""),
];

#[derive(Debug, Clone)]
struct Step {
    /// Pause before it.
    gap: Duration,
    kind: FaultKind,
    /// How long it lasts before it is healed (a restart, a heal, a clear).
    hold: Duration,
}

/// The schedule a seed draws: every kind once in a seeded order, then random ones until `seconds` are used.
fn schedule(seed: u64, seconds: u64) -> Vec<Step> {
    let mut rng = Rng(seed);
    let kind = |rng: &mut Rng, i: u64| match i {
        0 => FaultKind::KillMember(rng.below(3) as usize),
        1 => FaultKind::CutMember(rng.below(3) as usize),
        2 => FaultKind::MoveLeader,
        3 => FaultKind::Compact,
        4 => FaultKind::Defragment(rng.below(3) as usize),
        5 => FaultKind::KillAgent(rng.below(2) as usize),
        6 => FaultKind::OneShot,
        7 => FaultKind::S3Down,
        8 => FaultKind::Nospace(rng.below(3) as usize),
        9 => FaultKind::SameRevision,
        10 => FaultKind::SecondDown,
        11 => FaultKind::ClockAhead(rng.below(2) as usize),
        12 => FaultKind::KillMidRequest(["part", "delta", "lock"][rng.below(3) as usize]),
        _ => {
            let (request, _, _) = S3_REQUESTS[rng.below(S3_REQUESTS.len() as u64) as usize];
            let fault = [S3Fault::SlowDown, S3Fault::Reset, S3Fault::Stall, S3Fault::LoseAnswer][rng.below(4) as usize];
            FaultKind::S3 { request, fault, times: 1 + rng.below(3) as usize }
        }
    };
    let mut order: Vec<u64> = (0..KINDS).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut steps = Vec::new();
    let mut used = Duration::ZERO;
    let mut draws = order.into_iter();
    // Every kind once, however short the run; then random kinds until the seconds are used.
    while used < Duration::from_secs(seconds) || draws.len() > 0 {
        let i = draws.next().unwrap_or_else(|| rng.below(KINDS));
        let mut step = Step { gap: rng.secs(1, 4), kind: kind(&mut rng, i), hold: rng.secs(2, 8) };
        if matches!(step.kind, FaultKind::S3Down) {
            // Down for a minute: a scheduled full snapshot fails, and deltas wait it out.
            step.hold += Duration::from_secs(60);
        }
        used += step.gap + step.hold;
        steps.push(step);
    }
    steps
}

/// One operation of the traffic and what came of it.
#[derive(Debug, Clone)]
struct Op {
    key: String,
    /// `None`: a delete.
    value: Option<String>,
    sent: f64,
    /// `(revision, when the answer came)` when acknowledged; `None` when it failed or its answer was lost (it
    /// may still have committed: the history says).
    acked: Option<(i64, f64)>,
}

/// etcd's history as a watch of the test's own reads it: every event in revision order.
#[derive(Debug, Clone)]
struct Event {
    revision: i64,
    key: String,
    value: Option<String>,
}

type Keyspace = BTreeMap<String, (String, i64)>;

fn state_at(history: &[Event], revision: i64) -> Keyspace {
    let mut state = Keyspace::new();
    for event in history.iter().take_while(|e| e.revision <= revision) {
        match &event.value {
            Some(value) => state.insert(event.key.clone(), (value.clone(), event.revision)),
            None => state.remove(&event.key),
        };
    }
    state
}

async fn connect_all(etcd: &testbed::Etcd) -> etcd_client::Client {
    let urls: Vec<String> = etcd.members.iter().map(|m| m.client_url.clone()).collect();
    let options = ConnectOptions::new().with_require_leader(true).with_timeout(Duration::from_secs(5));
    etcd_client::Client::connect(urls, Some(options)).await.unwrap()
}

/// The traffic: a put or a delete of one of [`KEYS`] keys every 20 ms (none while `paused`), each recorded with
/// its outcome. `idle` is set once it finds itself paused between operations (none in flight), cleared when it
/// goes on.
fn traffic(
    seed: u64,
    client: etcd_client::Client,
    paused: Arc<AtomicBool>,
    idle: Arc<AtomicBool>,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<Vec<Op>> {
    tokio::spawn(async move {
        let mut ops = Vec::new();
        let mut rng = Rng(seed ^ 0x5eed);
        let mut kv = client.kv_client();
        let mut every = tokio::time::interval(Duration::from_millis(20));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for i in 0u64.. {
            if stop.is_cancelled() {
                return ops;
            }
            every.tick().await;
            if paused.load(Ordering::SeqCst) {
                idle.store(true, Ordering::SeqCst);
                continue;
            }
            idle.store(false, Ordering::SeqCst);
            let key = format!("/registry/r/{:03}", rng.below(KEYS));
            let delete = rng.below(10) == 0;
            let value = (!delete).then(|| format!("v{i}"));
            let sent = unix_now();
            let answer = match &value {
                Some(v) => tokio::time::timeout(Duration::from_secs(10), kv.put(key.clone(), v.clone(), None))
                    .await
                    .ok()
                    .and_then(|r| r.ok())
                    .and_then(|r| r.header().map(|h| h.revision())),
                None => tokio::time::timeout(Duration::from_secs(10), kv.delete(key.clone(), None))
                    .await
                    .ok()
                    .and_then(|r| r.ok())
                    .and_then(|r| r.header().map(|h| h.revision())),
            };
            ops.push(Op { key, value, sent, acked: answer.map(|r| (r, unix_now())) });
        }
        ops
    })
}

/// The test's own watch of every key from revision 1, resumed after every failure from the next revision.
fn watch_history(
    etcd: &testbed::Etcd,
    stop: tokio_util::sync::CancellationToken,
) -> (Arc<Mutex<Vec<Event>>>, tokio::task::JoinHandle<()>) {
    let history = Arc::new(Mutex::new(Vec::<Event>::new()));
    let urls: Vec<String> = etcd.members.iter().map(|m| m.client_url.clone()).collect();
    let out = history.clone();
    let task = tokio::spawn(async move {
        let mut next = 1i64;
        while !stop.is_cancelled() {
            let options = ConnectOptions::new().with_require_leader(true);
            let Ok(mut client) = etcd_client::Client::connect(urls.clone(), Some(options)).await else {
                // Backoff before reconnecting; the loop waits for the watch, not for time.
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let watch_options = WatchOptions::new().with_prefix().with_start_revision(next);
            let Ok(mut stream) = client.watch("/registry/r/", Some(watch_options)).await else {
                // Backoff before reconnecting, as above.
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            loop {
                let message = tokio::select! {
                    () = stop.cancelled() => return,
                    m = stream.message() => m,
                };
                let Ok(Some(response)) = message else { break };
                assert!(response.compact_revision() == 0, "the history's watch fell behind a compaction");
                for event in response.events() {
                    let kv = event.kv().unwrap();
                    let value = (event.event_type() == EventType::Put).then(|| kv.value_str().unwrap().to_string());
                    let revision = kv.mod_revision();
                    out.lock().unwrap().push(Event { revision, key: kv.key_str().unwrap().to_string(), value });
                    next = revision + 1;
                }
            }
        }
    });
    (history, task)
}

/// Samples the recovery-point metric with the bucket right after it, until stopped: every violation found.
fn sample_recovery_point(
    admin_urls: Vec<String>,
    s3: aws_sdk_s3::Client,
    bucket: String,
    acks: Arc<Mutex<Vec<(i64, f64)>>>,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<(usize, Vec<String>)> {
    tokio::spawn(async move {
        let series = "etcd_snapshotter_delta_stored_through_timestamp_seconds{shard=\"root\"}";
        let (mut samples, mut violations) = (0, Vec::new());
        let mut every = tokio::time::interval(Duration::from_millis(300));
        while !stop.is_cancelled() {
            every.tick().await;
            // Each replica's claim (the one that leads sets it; an old leader's stays as it last proved it).
            let mut claims = Vec::new();
            for url in &admin_urls {
                if let Ok(claimed) = testbed::metrics::value(&testbed::metrics::scrape(url).await, series) {
                    claims.push(claimed);
                }
            }
            let Some(claimed) = claims.into_iter().reduce(f64::max) else { continue };
            let stored = stored_through(&s3, &bucket, PREFIX).await;
            let acked = acks.lock().unwrap().clone();
            if let Some((revision, at)) = claimed_but_unstored(acked, claimed, stored).next() {
                violations.push(format!(
                    "the metric claimed {claimed:.3}, but revision {revision} acknowledged at {at:.3} is not stored (stored through {stored})"
                ));
            }
            samples += 1;
        }
        (samples, violations)
    })
}

/// Where a scenario keeps what it leaves for a reader.
fn artefacts(seed: u64) -> PathBuf {
    let dir = std::env::temp_dir().join("kcp-keeper-robustness").join(format!("seed-{seed}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[derive(Default, Debug)]
struct Figures {
    faults: BTreeMap<String, usize>,
    restores: usize,
    gaps: usize,
    writes_checked: usize,
    samples: usize,
}

#[tokio::test(flavor = "multi_thread")]
async fn every_restore_under_random_faults_matches_etcds_history_and_the_recovery_point_never_claims_unstored_writes() {
    let seeds: Vec<u64> = match std::env::var("ROBUSTNESS_SEEDS") {
        Ok(list) => list.split(',').map(|s| s.trim().parse().expect("ROBUSTNESS_SEEDS: numbers")).collect(),
        Err(_) => CI_SEEDS.to_vec(),
    };
    let seconds = std::env::var("ROBUSTNESS_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(CI_SECONDS);
    let mut total = Figures::default();
    for seed in seeds {
        let figures = scenario(seed, seconds).await;
        for (kind, n) in figures.faults {
            *total.faults.entry(kind).or_default() += n;
        }
        total.restores += figures.restores;
        total.gaps += figures.gaps;
        total.writes_checked += figures.writes_checked;
        total.samples += figures.samples;
    }
    println!("robustness: {total:?}");
}

async fn scenario(seed: u64, seconds: u64) -> Figures {
    let steps = schedule(seed, seconds);
    let kept = artefacts(seed);
    let plan = steps.iter().fold(String::new(), |mut text, s| {
        let _ = writeln!(text, "after {:?}: {:?} for {:?}", s.gap, s.kind, s.hold);
        text
    });
    println!(
        "robustness seed {seed} ({seconds} s), replay with ROBUSTNESS_SEEDS={seed}; artefacts in {}\n{plan}",
        kept.display()
    );
    std::fs::write(kept.join("schedule.txt"), &plan).unwrap();

    let bed = Bed::with_cluster().await.unwrap();
    let cluster = bed.cluster();
    let ns = cluster.namespace().await.unwrap();
    let mut etcd = bed.partitionable_etcd("root").await.unwrap();
    let proxy = FaultProxy::start(&bed.s3.endpoint).await.unwrap();
    let endpoints = etcd.members.iter().map(|m| m.client_url.clone()).collect();
    let interval = format!("{}s", INTERVAL.as_secs());
    let mut options = Options::new(&bed, "root", endpoints).with_drills(&bed).with_deltas(&interval, Some("64Ki"));
    // Drills at :10 and :40, never on the snapshots' minute: a drill runs in the snapshots' turn, and one due with
    // the tick could hold the daemon's run until the lock contention (`contend_for_the_lock`) is over.
    options.shard_extra.push_str("drill:\n  schedule:\n    cron: \"10,40 * * * * *\"\n");
    options.s3_endpoint = proxy.url.clone();
    options.cron = "* * * * *";
    options.keep_last = KEEP_LAST;
    options.attempt_timeout = "3s";
    options.lock_expiry = LOCK_EXPIRY;
    // Deltas signed: every restore below also proves each delta is the agent's.
    let key = bed.path("delta-key");
    std::fs::write(&key, format!("robustness-seed-{seed}-{}", "k".repeat(32))).unwrap();
    options.delta_signing_key = Some(key);
    let config = write_config(&bed, &options).unwrap();
    // The second store, behind its own fault proxy, with its own retention.
    let second = SecondStore::start(&bed).await;
    let second_proxy = FaultProxy::start(&second.s3.endpoint).await.unwrap();
    second.configure(&config, &second_proxy.url, KEEP_LAST);
    // A one-shot whose every request a proxy before the store's holds back (see `contend_for_the_lock`).
    let slow_proxy = FaultProxy::start(&proxy.url).await.unwrap();
    let slow_config = bed.path("slow-one-shot.yaml");
    let text = std::fs::read_to_string(&config).unwrap();
    let slowed = text.replacen(&format!("endpoint: {}", proxy.url), &format!("endpoint: {}", slow_proxy.url), 1);
    assert_ne!(text, slowed, "the one-shot's store is the proxy's");
    std::fs::write(&slow_config, slowed).unwrap();
    let s3 = bed.s3.client();
    let s3_second = second.s3.client();
    let stores = [(&s3, &bed.s3.bucket, PREFIX), (&s3_second, &second.s3.bucket, SECOND_PREFIX)];
    for (client, bucket, prefix) in stores {
        let key = format!("{prefix}/{FOREIGN}");
        client.put_object().bucket(bucket).key(key).body(b"the operator's".to_vec().into()).send().await.unwrap();
    }

    let stop = tokio_util::sync::CancellationToken::new();
    let watching = tokio_util::sync::CancellationToken::new();
    let (history, watcher) = watch_history(&etcd, watching.clone());
    let client = connect_all(&etcd).await;
    let (paused, idle) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let writes = traffic(seed, client.clone(), paused.clone(), idle.clone(), stop.clone());
    // The first full snapshot once the traffic runs and the history's watch sees it.
    testbed::eventually(Duration::from_secs(60), "the traffic in the history", || async {
        (history.lock().unwrap().len() >= 50).then_some(())
    })
    .await;
    snapshot_ok(&config);
    // Two replicas, as the chart can run them: one leads (the Lease), the other takes over when it goes.
    let mut agents = vec![
        agent(cluster, &config, &ns).identity("replica-a").start().await.unwrap(),
        agent(cluster, &config, &ns).identity("replica-b").start().await.unwrap(),
    ];
    let acks = Arc::new(Mutex::new(Vec::new()));
    let sampling = tokio_util::sync::CancellationToken::new();
    let sampler = sample_recovery_point(
        agents.iter().map(|a| a.admin_url.clone()).collect(),
        s3.clone(),
        bed.s3.bucket.clone(),
        acks.clone(),
        sampling.clone(),
    );
    // The sampler learns the acknowledged writes from the history as it grows (the traffic's own record is
    // read once it stops): an acknowledged write is in etcd's history at its revision, with the time its
    // answer came no earlier than its commit.
    let acks_feed = {
        let (history, acks, stop) = (history.clone(), acks.clone(), sampling.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(100));
            while !stop.is_cancelled() {
                every.tick().await;
                let now = unix_now();
                let mut acks = acks.lock().unwrap();
                let known = acks.len();
                // Every event seen by the test's watch was committed by now: acknowledged at the latest now.
                for event in history.lock().unwrap().iter().skip(known) {
                    acks.push((event.revision, now));
                }
            }
        })
    };

    let mut figures = Figures::default();
    let mut rig = Rig {
        etcd: &mut etcd,
        admin: client.clone(),
        proxy: &proxy,
        second_proxy: &second_proxy,
        slow: (&slow_proxy, &slow_config, (&s3, &bed.s3.bucket)),
        paused,
        idle,
        agents: &mut agents,
        config: &config,
        history: history.clone(),
        outages: Vec::new(),
    };
    // The schedule's pauses (each step's gap here, its hold in `apply`) are the faults' timing, drawn from the seed.
    for step in &steps {
        tokio::time::sleep(step.gap).await;
        let name = format!("{:?}", step.kind).split(['(', ' ']).next().unwrap().to_string();
        *figures.faults.entry(name).or_default() += 1;
        apply(step, &mut rig).await;
    }
    let outages = rig.outages;
    proxy.clear();
    second_proxy.clear();

    // Quiet: the traffic stops, the bucket catches up with the history, and the sampler stops.
    stop.cancel();
    let ops = writes.await.unwrap();
    // The cluster's last revision, once it has a leader again (the last fault may have just moved or cut it).
    let reader = connect_all(&etcd).await;
    let last = testbed::eventually(Duration::from_secs(60), "the cluster's revision through its leader", || {
        let mut reader = reader.clone();
        async move { Some(reader.get("/registry/r/", None).await.ok()?.header()?.revision()) }
    })
    .await;
    testbed::eventually(Duration::from_secs(60), "the history's watch to reach the end", || async {
        (history.lock().unwrap().last().map_or(0, |e| e.revision) >= last).then_some(())
    })
    .await;
    watching.cancel();
    watcher.await.unwrap();
    let history = history.lock().unwrap().clone();
    testbed::eventually(Duration::from_secs(180), &format!("the bucket to hold revision {last}"), || async {
        (stored_through(&s3, &bed.s3.bucket, PREFIX).await >= last).then_some(())
    })
    .await;
    testbed::eventually(Duration::from_secs(180), &format!("the second store to hold revision {last}"), || async {
        (stored_through(&s3_second, &second.s3.bucket, SECOND_PREFIX).await >= last).then_some(())
    })
    .await;
    sampling.cancel();
    acks_feed.await.unwrap();
    let (samples, violations) = sampler.await.unwrap();
    figures.samples = samples;
    keep(&kept, &ops, &history, &stores, &agents).await;
    assert!(
        violations.is_empty(),
        "seed {seed}: the recovery point claimed writes not stored:\n{}",
        violations.join("\n")
    );
    assert_history_true(seed, &ops, &history);
    figures.writes_checked = ops.iter().filter(|o| o.acked.is_some()).count();

    // Never two runs uploading a full snapshot of the shard at once: each upload's requests, as the store's
    // proxy saw them, end before the next upload's begin.
    let overlaps = overlapping_uploads(&proxy.requests());
    assert!(overlaps.is_empty(), "seed {seed}: two runs uploaded at once: {overlaps:?}");
    // No live run lost its shard lock to a takeover (a killed replica cannot say so; a live one would).
    for (i, agent) in agents.iter().enumerate() {
        let log = agent.process.log();
        let lost: Vec<&str> = log.lines().filter(|l| l.contains("lock was taken over")).collect();
        assert!(lost.is_empty(), "seed {seed}: replica {i} lost its lock while it ran: {lost:?}");
    }

    // The daemons stop cleanly before the restores (their retention would otherwise delete the bases being
    // restored from under the validators).
    for agent in &mut agents {
        agent.terminate(Duration::from_secs(60)).expect("the daemon stops on SIGTERM");
    }

    // The restores, each compared key by key with the history.
    let mut rng = Rng(seed ^ 0xa11);
    let mut restores =
        Restores { bed: &bed, config: &config, history: &history, seed, n: 0, gaps: 0, store: "primary" };
    restores.at("latest", Some(last)).await;
    // The second store alone restores the same point.
    restores.store = "secondary";
    restores.at("latest", Some(last)).await;
    restores.store = "primary";
    // Points from the oldest full snapshot retention kept to the end, revisions the history holds.
    let listed = manifests(&s3, &bed.s3.bucket).await;
    let oldest = listed.iter().filter_map(|m| m["revision"].as_i64()).min().unwrap();
    let revisions: Vec<i64> = history.iter().map(|e| e.revision).filter(|r| *r >= oldest).collect();
    for _ in 0..3 {
        let revision = revisions[rng.below(revisions.len() as u64) as usize];
        restores.at(&revision.to_string(), Some(revision)).await;
    }
    let acked: Vec<&Op> = ops.iter().filter(|o| o.acked.is_some()).collect();
    // Time points from the oldest kept snapshot's end (before it, exit 1 "no full snapshot at or before" is the
    // right answer): two at random, one just after a newer full snapshot started, one late in each agent outage.
    let unix = |m: &serde_json::Value, field: &str| {
        chrono::DateTime::parse_from_rfc3339(m[field].as_str()?).ok().map(|t| t.timestamp_millis() as f64 / 1000.0)
    };
    let oldest_end = listed.iter().filter_map(|m| unix(m, "finishedAt")).fold(f64::MAX, f64::min);
    let later: Vec<&&Op> = acked.iter().filter(|o| o.sent > oldest_end + 1.0).collect();
    let mut times: Vec<f64> = (0..2).map(|_| later[rng.below(later.len() as u64) as usize].sent).collect();
    times.extend(
        listed.iter().filter_map(|m| unix(m, "startedAt")).filter(|t| *t > oldest_end).map(|t| t + 0.01).take(1),
    );
    times.extend(outages.iter().map(|(_, restarted)| restarted - 0.5).filter(|t| *t > oldest_end));
    for time in times {
        let reached = restores.at(&rfc3339(time), None).await;
        if let Some(r) = reached {
            let at_r = ops.iter().find(|o| o.acked.is_some_and(|(rev, _)| rev == r));
            assert!(
                at_r.is_none_or(|o| o.sent <= time),
                "seed {seed}: --at {} includes revision {r}, sent after it",
                rfc3339(time)
            );
            let owed = acked.iter().filter(|o| o.acked.unwrap().1 <= time - RPO).map(|o| o.acked.unwrap().0).max();
            assert!(
                owed.is_none_or(|o| o <= r),
                "seed {seed}: --at {} stops at {r}, before {owed:?}, acknowledged more than {RPO} s before it",
                rfc3339(time)
            );
        }
    }
    for manifest in listed.iter().take(3) {
        let id = manifest["id"].as_str().unwrap();
        // `revision` is a lower bound when the shard was written to as the stream opened; the snapshot holds
        // exactly one revision up to `revisionUpperBound`.
        let revision = manifest["revision"].as_i64().unwrap();
        let upper = manifest["revisionUpperBound"].as_i64().unwrap_or(revision);
        restores.snapshot(id, revision..=upper).await;
    }
    figures.restores = restores.n;
    figures.gaps = restores.gaps;

    // In either store: nothing half-uploaded is left once the daemons stopped, every object is one the agent
    // accounts for (a listed snapshot's, or the shard's lock), and the operator's own object is still there.
    for (client, bucket, prefix) in stores {
        let left = uploads(client, bucket).await;
        assert!(left.is_empty(), "seed {seed}: {prefix}: multipart uploads left: {left:?}");
        let listed = keys(client, bucket).await;
        let foreign = format!("{prefix}/{FOREIGN}");
        assert!(listed.contains(&foreign), "seed {seed}: {foreign}, not the agent's, is gone");
        let unaccounted = unaccounted(&listed, prefix, &foreign);
        assert!(
            unaccounted.is_empty(),
            "seed {seed}: {prefix}: objects no listed snapshot accounts for: {unaccounted:?}"
        );
    }
    println!("robustness seed {seed}: {figures:?}");
    figures
}

/// What the faults act on.
struct Rig<'a> {
    etcd: &'a mut testbed::Etcd,
    admin: etcd_client::Client,
    proxy: &'a FaultProxy,
    second_proxy: &'a FaultProxy,
    /// A proxy before `proxy`, the configuration of a one-shot that goes through it, and the primary store (to
    /// read the shard's lock).
    slow: (&'a FaultProxy, &'a Path, (&'a aws_sdk_s3::Client, &'a str)),
    /// Holds the traffic back while set.
    paused: Arc<AtomicBool>,
    /// Set by the traffic once it is held back with no operation in flight.
    idle: Arc<AtomicBool>,
    agents: &'a mut [testbed::agent_process::AgentProcess],
    config: &'a Path,
    history: Arc<Mutex<Vec<Event>>>,
    /// The agent's outages so far: when it was killed and when it was started again.
    outages: Vec<(f64, f64)>,
}

/// Applies one fault and heals it after its hold.
async fn apply(step: &Step, rig: &mut Rig<'_>) {
    let Rig { etcd, admin, proxy, second_proxy, slow, paused, idle, agents, config, history, outages } = rig;
    match &step.kind {
        FaultKind::KillMember(i) => {
            etcd.kill_member(*i);
            tokio::time::sleep(step.hold).await;
            etcd.members[*i].process.restart().unwrap();
        }
        FaultKind::CutMember(i) => {
            etcd.cut(*i);
            tokio::time::sleep(step.hold).await;
            etcd.heal(*i);
        }
        FaultKind::MoveLeader => {
            // MoveLeader is the leader's to do: asked of the member that leads now.
            if let Ok(status) = admin.status().await {
                let leader = status.leader();
                let members = admin.member_list().await.map(|l| l.members().to_vec()).unwrap_or_default();
                let leader_url =
                    members.iter().find(|m| m.id() == leader).and_then(|m| m.client_urls().first().cloned());
                if let (Some(url), Some(target)) = (leader_url, members.iter().find(|m| m.id() != leader))
                    && let Ok(mut client) = etcd_client::Client::connect([url], None).await
                {
                    let moved = client.move_leader(target.id()).await;
                    println!("leader moved to {}: {:?}", target.name(), moved.map(|_| ()));
                }
            }
            tokio::time::sleep(step.hold).await;
        }
        FaultKind::Compact => {
            // Aggressive, but never past the history's own watch (the truth must stay whole).
            let seen = history.lock().unwrap().last().map_or(0, |e| e.revision);
            if seen > 20 {
                let _ = admin.compact(seen - 10, None).await;
            }
            tokio::time::sleep(step.hold).await;
        }
        FaultKind::Defragment(i) => {
            if let Ok(mut member) = etcd.member_client(*i).await {
                let _ = member.defragment().await;
            }
            tokio::time::sleep(step.hold).await;
        }
        FaultKind::KillAgent(i) => {
            let agent = &mut agents[*i];
            agent.process.kill();
            let killed = unix_now();
            tokio::time::sleep(step.hold).await;
            outages.push((killed, unix_now()));
            agent.process.restart().unwrap();
            agent.wait_ready(Duration::from_secs(60)).await.unwrap();
        }
        FaultKind::OneShot => {
            contend_for_the_lock(*slow, config, agents).await;
            tokio::time::sleep(step.hold).await;
        }
        FaultKind::Nospace(i) => {
            let members = admin.member_list().await.map(|l| l.members().to_vec()).unwrap_or_default();
            let id = members.iter().find(|m| m.name().ends_with(&format!("-{i}"))).or(members.first()).map(|m| m.id());
            let raised = nospace(admin, id.unwrap_or(0), AlarmAction::Activate).await;
            println!("NOSPACE raised on member {i}: {:?}", raised.map(|_| ()));
            tokio::time::sleep(step.hold).await;
            // Disarmed, as an operator does once space is freed.
            let _ = nospace(admin, id.unwrap_or(0), AlarmAction::Deactivate).await;
        }
        FaultKind::SameRevision => {
            paused.store(true, Ordering::SeqCst);
            // Writes in flight land; then two one-shots find the same revision.
            testbed::eventually(Duration::from_secs(15), "the traffic idle", || async {
                idle.load(Ordering::SeqCst).then_some(())
            })
            .await;
            one_shot(config).await;
            one_shot(config).await;
            paused.store(false, Ordering::SeqCst);
            tokio::time::sleep(step.hold).await;
        }
        FaultKind::KillMidRequest(request) => {
            let (method, path) = match *request {
                "part" => ("PUT", "partNumber="),
                // A delta object (its name starts with its revision), not a session's proof beside them.
                "delta" => ("PUT", "/deltas/0"),
                _ => ("PUT", "run.lock"),
            };
            // The next such request is held (a full snapshot's part or lock write comes with the minutely
            // schedule; a delta every second), and both replicas die while it is.
            let before = proxy.injected().len();
            proxy.inject(method, path, Fault::Stall(Duration::from_secs(30)), 1);
            testbed::eventually(Duration::from_secs(90), &format!("a {request} request in flight"), || async {
                (proxy.injected().len() > before).then_some(())
            })
            .await;
            let killed = unix_now();
            for agent in agents.iter_mut() {
                agent.process.kill();
            }
            proxy.clear();
            tokio::time::sleep(step.hold).await;
            outages.push((killed, unix_now()));
            for agent in agents.iter_mut() {
                agent.process.restart().unwrap();
                agent.wait_ready(Duration::from_secs(60)).await.unwrap();
            }
        }
        FaultKind::ClockAhead(i) => {
            // Both stop (each releases the Lease on SIGTERM); the skewed one starts first and takes the Lease,
            // the other follows. The time both were down is an outage, as a kill's is.
            let stopped = unix_now();
            for agent in agents.iter_mut() {
                agent.terminate(Duration::from_secs(60)).expect("the daemon stops on SIGTERM");
            }
            let skewed = &mut agents[*i];
            for (name, value) in CLOCK_AHEAD.iter() {
                skewed.process.set_env(name, Some(value));
            }
            skewed.process.restart().unwrap();
            skewed.wait_ready(Duration::from_secs(60)).await.unwrap();
            outages.push((stopped, unix_now()));
            // The skew took effect, and the agent measured it against the store's clock.
            let offset = "etcd_snapshotter_clock_offset_seconds";
            let measured =
                skewed.wait_for_metric(offset, Duration::from_secs(40), |v| (-31.0..=-27.0).contains(&v)).await;
            println!("replica {i} runs 30 s ahead; it corrects its recorded times by {measured:.3} s");
            let other = &mut agents[1 - *i];
            other.process.restart().unwrap();
            other.wait_ready(Duration::from_secs(60)).await.unwrap();
            tokio::time::sleep(step.hold).await;
            // Back to the right time: handed over to the other (a release), then restarted.
            let skewed = &mut agents[*i];
            skewed.terminate(Duration::from_secs(60)).expect("the daemon stops on SIGTERM");
            for (name, _) in CLOCK_AHEAD.iter() {
                skewed.process.set_env(name, None);
            }
            skewed.process.restart().unwrap();
            skewed.wait_ready(Duration::from_secs(60)).await.unwrap();
        }
        FaultKind::SecondDown => {
            for method in ["GET", "PUT", "POST", "DELETE", "HEAD"] {
                second_proxy.inject(method, "", Fault::Reset, 100_000);
            }
            tokio::time::sleep(step.hold).await;
            second_proxy.clear();
        }
        FaultKind::S3 { request, fault, times } => {
            let (_, method, path) = S3_REQUESTS.iter().find(|(name, _, _)| name == request).unwrap();
            let fault = match fault {
                S3Fault::SlowDown => Fault::SlowDown,
                S3Fault::Reset => Fault::Reset,
                S3Fault::Stall => Fault::Stall(Duration::from_secs(5)),
                S3Fault::LoseAnswer => Fault::LoseAnswer,
            };
            proxy.inject(method, path, fault, *times);
            tokio::time::sleep(step.hold).await;
            proxy.clear();
        }
        FaultKind::S3Down => {
            for method in ["GET", "PUT", "POST", "DELETE", "HEAD"] {
                proxy.inject(method, "", Fault::Reset, 100_000);
            }
            tokio::time::sleep(step.hold).await;
            proxy.clear();
        }
    }
}

/// A one-shot slowed down (its requests held 2.5 s, within the attempt timeout, its lock's half a second,
/// its deletes not at all) takes the shard's lock a few seconds before the daemon's minutely tick and holds it
/// for several expiries while renewing it: the tick's run and a second one-shot wait for it longer than the
/// expiry, and neither takes it over (both one-shots exit 0; the never-two-uploads validator sees the rest).
async fn contend_for_the_lock(
    (slow_proxy, slow_config, (s3, bucket)): (&FaultProxy, &Path, (&aws_sdk_s3::Client, &str)),
    config: &Path,
    agents: &[testbed::agent_process::AgentProcess],
) {
    const WAITING: &str = "another run holds the shard's lock; waiting";
    let waits = || agents.iter().map(|a| a.process.log().matches(WAITING).count()).sum::<usize>();
    let before = waits();
    // Eight seconds before a minute (the daemon's tick), at least five from now.
    let now = unix_now();
    let to_minute = 60.0 - now.rem_euclid(60.0);
    let lead = if to_minute >= 13.0 { to_minute - 8.0 } else { to_minute + 52.0 };
    tokio::time::sleep(Duration::from_secs_f64(lead)).await;
    // Its lock's reads and writes are answered in half a second, so it renews in time; its other writes, reads
    // and lists take 2.5 s (retention's deletes go through at once, or it would hold the lock for minutes).
    for (method, path, ms) in
        [("PUT", "run.lock", 500), ("GET", "run.lock", 500), ("PUT", "", 2500), ("POST", "", 2500), ("GET", "", 2500)]
    {
        slow_proxy.inject(method, path, Fault::Delay(Duration::from_millis(ms)), usize::MAX);
    }
    let slow = {
        let slow_config = slow_config.to_path_buf();
        tokio::spawn(async move { one_shot(&slow_config).await })
    };
    // The contender starts once the slow one-shot holds the shard's lock (the lock object names it, unreleased).
    let key = etcd_snapshotter::shard_lock::key(PREFIX, "root");
    testbed::eventually(Duration::from_secs(60), "the slow one-shot holding the shard's lock", || async {
        let object = s3.get_object().bucket(bucket).key(&key).send().await.ok()?;
        let body = object.body.collect().await.ok()?.into_bytes();
        let holder: etcd_snapshotter::shard_lock::Holder = serde_json::from_slice(&body).ok()?;
        (holder.command == "snapshot" && !holder.released).then_some(())
    })
    .await;
    let contending = std::time::Instant::now();
    let contender = one_shot(config).await;
    let waited = contending.elapsed();
    let slow = slow.await.unwrap();
    slow_proxy.clear();
    println!("one-shot contending with a slow one: waited {waited:?}; the daemon waited {} time(s)", waits() - before);
    assert!(slow.success() && contender.success(), "both one-shots publish (exits {slow:?}, {contender:?})");
    assert!(waited > Duration::from_secs(LOCK_EXPIRY_SECS), "the contention outlasts the lock's expiry: {waited:?}");
    assert!(waits() > before, "the daemon's tick found the lock held and waited");
}

/// `etcd-snapshotter snapshot` beside the daemons, contending for the shard's lock: it may wait and fail, but a
/// live one never loses the lock.
async fn one_shot(config: &Path) -> std::process::ExitStatus {
    let config = config.to_path_buf();
    let out =
        tokio::task::spawn_blocking(move || cli(&["snapshot", "--config", config.to_str().unwrap()])).await.unwrap();
    match out.status.success() {
        true => println!("one-shot beside the daemon: exit 0"),
        false => println!("one-shot beside the daemon: {}", text(&out)),
    }
    assert!(!text(&out).contains("lock was taken over"), "a live one-shot lost its lock: {}", text(&out));
    out.status
}

/// Pairs of full-snapshot uploads (by upload id) whose requests overlap in time: two runs uploading at once.
fn overlapping_uploads(requests: &[(f64, String, String)]) -> Vec<(String, String)> {
    let mut spans: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for (at, _, path) in requests.iter().filter(|(_, _, p)| p.contains("/snapshot.db")) {
        let Some(id) = path.split("uploadId=").nth(1).map(|r| r.split('&').next().unwrap_or(r).to_string()) else {
            continue;
        };
        let span = spans.entry(id).or_insert((*at, *at));
        span.1 = span.1.max(*at);
    }
    let mut ordered: Vec<(&String, &(f64, f64))> = spans.iter().collect();
    ordered.sort_by(|a, b| a.1.0.total_cmp(&b.1.0));
    ordered.windows(2).filter(|w| w[1].1.0 < w[0].1.1).map(|w| (w[0].0.clone(), w[1].0.clone())).collect()
}

/// Keys under the shard's folder that no listed snapshot accounts for: anything but the shard's lock, its stored
/// recovery point, `foreign` and the objects of a snapshot whose manifest is there (its data object, drill report
/// and deltas).
fn unaccounted(listed: &[String], prefix: &str, foreign: &str) -> Vec<String> {
    let shard = format!("{prefix}/root/");
    let snapshots: std::collections::BTreeSet<&str> = listed
        .iter()
        .filter_map(|k| etcd_snapshotter::manifest::id_of_manifest_key(prefix, k)?.strip_prefix("root/"))
        .collect();
    listed
        .iter()
        .filter(|k| k.as_str() != foreign)
        .filter(|k| {
            let Some(rest) = k.strip_prefix(&shard) else { return true };
            let Some((id, object)) = rest.split_once('/') else {
                return rest != "run.lock" && rest != "recovery-point.json";
            };
            let known = object == "manifest.json"
                || object == "drill.json"
                || object.starts_with("snapshot.db")
                || object.starts_with("deltas/");
            !(known && snapshots.contains(id))
        })
        .cloned()
        .collect()
}

/// Every acknowledged write is in etcd's history at its revision with its value; the history has no
/// revision twice.
fn assert_history_true(seed: u64, ops: &[Op], history: &[Event]) {
    let by_revision: BTreeMap<i64, &Event> = history.iter().map(|e| (e.revision, e)).collect();
    assert_eq!(by_revision.len(), history.len(), "seed {seed}: the history's watch saw a revision twice");
    for op in ops {
        if let Some((revision, _)) = op.acked {
            let event = by_revision.get(&revision);
            // A delete of an absent key is acknowledged at the current revision without an event.
            if op.value.is_some() {
                let event = event.unwrap_or_else(|| panic!("seed {seed}: acknowledged {op:?} is not in the history"));
                assert_eq!((&event.key, &event.value), (&op.key, &op.value), "seed {seed}: revision {revision}");
            }
        }
    }
}

fn rfc3339(unix: f64) -> String {
    let t = chrono::DateTime::from_timestamp_millis((unix * 1000.0) as i64).unwrap();
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The restores of one scenario, each into a fresh data directory, compared with the history.
struct Restores<'a> {
    bed: &'a Bed,
    config: &'a Path,
    history: &'a [Event],
    seed: u64,
    n: usize,
    gaps: usize,
    /// `primary` or `secondary`: the store `restore --at` reads.
    store: &'static str,
}

impl Restores<'_> {
    /// `restore --at point`: exactly the history's state at the revision reached (`expect` when known). Exit 2
    /// is a gap the agent names; the revision reached is returned when it exits 0.
    async fn at(&mut self, point: &str, expect: Option<i64>) -> Option<i64> {
        self.n += 1;
        let name = format!("restored-{}", self.n);
        let (etcdutl, etcd) = (self.bed.etcdutl().to_str().unwrap().to_string(), self.bed.peers.path("etcd"));
        let args = ["--at", point, "--store", self.store, "--etcdutl", &etcdutl, "--etcd", etcd.to_str().unwrap()];
        let (out, mut restored, process) = self.restore(&name, &args).await;
        let log = text(&out);
        let gap = match out.status.code() {
            Some(0) => false,
            Some(2) => {
                assert!(
                    log.contains("STOPPED AT THE LAST GOOD POINT"),
                    "seed {}: exit 2 without naming the gap: {log}",
                    self.seed
                );
                println!("seed {}: --at {point}: a gap, as the agent says: {log}", self.seed);
                self.gaps += 1;
                true
            }
            code => panic!("seed {}: restore --at {point} exited {code:?}: {log}", self.seed),
        };
        let reached = log
            .split("the source's revision ")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<i64>().ok())
            .unwrap_or_else(|| panic!("seed {}: no revision in: {log}", self.seed));
        if let Some(expect) = expect
            && !gap
        {
            assert_eq!(reached, expect, "seed {}: restore --at {point} reached {reached}: {log}", self.seed);
        }
        // Even short of the point, what is restored is exactly the history at the revision it says.
        self.compare(&mut restored, reached, &format!("--at {point}")).await;
        self.discard(&name, process);
        (!gap).then_some(reached)
    }

    /// A full snapshot restored on its own: exactly the history's state at its revision.
    async fn snapshot(&mut self, id: &str, bounds: std::ops::RangeInclusive<i64>) {
        self.n += 1;
        let name = format!("restored-{}", self.n);
        let etcdutl = self.bed.etcdutl().to_str().unwrap().to_string();
        let (out, mut restored, process) = self.restore(&name, &["--id", id, "--etcdutl", &etcdutl]).await;
        assert_eq!(out.status.code(), Some(0), "seed {}: restore of {id}: {}", self.seed, text(&out));
        let served = served(&mut restored).await;
        let exact = bounds.clone().find(|r| served == state_at(self.history, *r));
        assert!(
            exact.is_some(),
            "seed {}: {id}: the restored keyspace is the history's at no revision in {bounds:?}; first keys that differ from its lower bound: {:?}",
            self.seed,
            differing(&served, &state_at(self.history, *bounds.start()))
        );
        self.discard(&name, process);
    }

    async fn restore(
        &self,
        name: &str,
        args: &[&str],
    ) -> (std::process::Output, etcd_client::Client, testbed::process::Process) {
        let (out, process, client) = restore_and_serve(self.bed, self.config, args, name, |out| {
            if !matches!(out.status.code(), Some(0 | 2)) {
                panic!("seed {}: restore {args:?} exited {:?}: {}", self.seed, out.status.code(), text(out));
            }
        })
        .await;
        (out, client, process)
    }

    /// A restored member compared: stopped and its data directory removed (a scenario restores a dozen).
    fn discard(&self, name: &str, process: testbed::process::Process) {
        drop(process);
        let _ = std::fs::remove_dir_all(self.bed.path(name));
    }

    async fn compare(&self, restored: &mut etcd_client::Client, revision: i64, what: &str) {
        let (served, expected) = (served(restored).await, state_at(self.history, revision));
        assert!(
            served == expected,
            "seed {}: {what}: the restored keyspace is not the history's at revision {revision}; first keys that differ: {:?}",
            self.seed,
            differing(&served, &expected)
        );
    }
}

/// The traffic's keys as a restored member serves them.
async fn served(restored: &mut etcd_client::Client) -> Keyspace {
    let options = etcd_client::GetOptions::new().with_prefix();
    let response = restored.get("/registry/r/", Some(options)).await.unwrap();
    response
        .kvs()
        .iter()
        .map(|kv| (kv.key_str().unwrap().to_string(), (kv.value_str().unwrap().to_string(), kv.mod_revision())))
        .collect()
}

fn differing<'a>(served: &'a Keyspace, expected: &'a Keyspace) -> Vec<&'a String> {
    expected.keys().chain(served.keys()).filter(|k| expected.get(*k) != served.get(*k)).take(5).collect()
}

/// Keeps the history, the traffic, the bucket's listing and the agent's log for a reader.
async fn keep(
    dir: &Path,
    ops: &[Op],
    history: &[Event],
    stores: &[(&aws_sdk_s3::Client, &String, &str)],
    agents: &[testbed::agent_process::AgentProcess],
) {
    let ops_text = ops.iter().fold(String::new(), |mut t, o| {
        let _ = writeln!(t, "{:.3} {} {:?} {:?}", o.sent, o.key, o.value, o.acked);
        t
    });
    std::fs::write(dir.join("traffic.txt"), ops_text).unwrap();
    let history_text = history.iter().fold(String::new(), |mut t, e| {
        let _ = writeln!(t, "{} {} {:?}", e.revision, e.key, e.value);
        t
    });
    std::fs::write(dir.join("history.txt"), history_text).unwrap();
    let mut listing = String::new();
    for (s3, bucket, _) in stores {
        listing.push_str(&keys(s3, bucket).await.join("\n"));
        listing.push('\n');
    }
    std::fs::write(dir.join("bucket.txt"), listing).unwrap();
    for (i, agent) in agents.iter().enumerate() {
        std::fs::write(dir.join(format!("agent-{i}.log")), agent.process.log()).unwrap();
    }
}

#[test]
fn a_seed_draws_every_fault_kind_and_replays_the_same_schedule() {
    for seed in CI_SEEDS {
        let steps = schedule(*seed, CI_SECONDS);
        let kinds: std::collections::BTreeSet<String> =
            steps.iter().map(|s| format!("{:?}", s.kind).split(['(', ' ']).next().unwrap().to_string()).collect();
        assert_eq!(kinds.len() as u64, KINDS, "seed {seed}: {kinds:?}");
        assert_eq!(format!("{steps:?}"), format!("{:?}", schedule(*seed, CI_SECONDS)));
    }
}
