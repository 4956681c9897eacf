//! The tests step of `cargo xtask test`: every test binary the workspace builds, run by the xtask itself rather
//! than by `cargo test`, so that
//! - the slow kcp bed is started once and shared ([`crate::bed`]),
//! - two binaries run at a time ("lanes"), the longest first, never two that start a node beside each other
//!   (`KCP_KEEPER_TEST_LANES=1` runs them one after another, as `cargo test` does), and a third starts while the
//!   CPU has been idle (most long binaries wait on kcp, a node or an agent's timers),
//! - each binary's output goes to a log file and the xtask prints one line per binary with its wall time, and a
//!   failing binary's whole output.
//!
//! The binaries come from `cargo test --no-run --message-format=json` (the artifacts cargo reports), and run as
//! cargo runs them: in their package's directory with `CARGO_MANIFEST_DIR` and `CARGO` set.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::child;

/// How many test binaries run at once; `1` runs them serially.
pub const LANES_ENV: &str = "KCP_KEEPER_TEST_LANES";
const DEFAULT_LANES: usize = 2;
/// Lanes beyond [`DEFAULT_LANES`] that start a binary only while the CPU has been idle. A full run here (2 cores,
/// two lanes) left the CPU 30-60% idle for minutes at a time: the longest binaries mostly wait on kcp, a node or
/// an agent's timers.
const EXTRA_LANES: usize = 1;
/// The idle share of CPU time over [`IDLE_WINDOW`] that lets an extra lane start a binary.
const EXTRA_LANE_IDLE: f64 = 0.4;
/// How long the CPU must have been that idle, counted from the last start of any binary (a binary just started
/// has not loaded the CPU yet).
const IDLE_WINDOW: Duration = Duration::from_secs(20);
/// How often an extra lane looks at the CPU while it waits.
const IDLE_POLL: Duration = Duration::from_secs(5);

/// Binaries that use `testbed::kcp::shared()`: the shared bed is started when one of them runs.
pub const SHARED_KCP_USERS: &[&str] = &[
    "etcd-snapshotter:kcp",
    "etcd-snapshotter:installation_drill",
    "kubeconfig-rotator:kcp",
    "kubeconfig-rotator:chart",
    "testbed:kcp",
];
/// Binaries that must keep a kcp of their own: they change the bed itself. ca-syncer's live check replaces the
/// alpha shard's serving certificate with one from another CA for most of its test, which would fail every
/// other binary's request to alpha meanwhile (it also asks for `testbed::kcp::private()`; this keeps the
/// variable from it, so it never waits for the shared bed).
pub const PRIVATE_KCP: &[&str] = &["ca-syncer:live_check"];
/// Binaries that start the test bed's node (a kubelet, containerd, kube-proxy, iptables rules): never two at
/// once.
pub const NODE: &[&str] = &["chart:node", "chart:seed_layout", "chart:quick_start", "chart:upgrade", "testbed:node"];

/// Wall times of a full run on this machine kind (seconds; a fresh machine's run at 762bdec, two lanes), for the
/// order when no run has been recorded in the target directory yet, as on a fresh clone in CI: the longest first,
/// so the last binary to start is a short one. A long binary missing here starts last and becomes the run's tail
/// (chart:seed_layout did: CI's tests step took 1722 s for 3093 s of binaries in two lanes).
const EXPECTED: &[(&str, f64)] = &[
    ("chart:seed_layout", 415.0),
    ("xtask:clean_stop", 311.0),
    ("kubeconfig-rotator:kcp", 306.0),
    ("chart:node", 306.0),
    ("etcd-snapshotter:snapshot", 138.0),
    ("chart:upgrade", 240.0),
    ("chart:quick_start", 90.0),
    ("etcd-snapshotter:daemon", 112.0),
    // Measured with a kcp bed of its own (cargo test): 150 s, of which about 50 s start that bed (two tests: the
    // one-shot drill and the daemon's scheduled one).
    ("etcd-snapshotter:installation_drill", 150.0),
    ("dns-rewriter:daemon", 97.0),
    ("ca-syncer:controller", 68.0),
    ("ca-syncer:live_check", 56.0),
    ("etcd-snapshotter:deltas", 47.0),
    ("ca-syncer:consumers", 46.0),
    ("etcd-snapshotter:defrag", 44.0),
    ("kubeconfig-rotator:chart", 40.0),
    ("etcd-snapshotter:kcp", 35.0),
    ("ca-syncer:writes", 34.0),
    ("etcd-snapshotter:s3_faults", 33.0),
    ("testbed:real_peers", 26.0),
    ("ca-syncer:readiness", 25.0),
    ("testbed:node", 11.0),
    // Short on the shared bed (about 49 s with a kcp of its own, `KCP_KEEPER_TEST_SHARED_KCP=0`).
    ("testbed:kcp", 2.0),
];

/// One test binary (or the doc tests).
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// `<package>:<target>`, the name `--only` matches and the times are recorded under.
    pub name: String,
    /// `lib`, `bin`, `test`, ... (cargo's target kind), shown when it is not `test`.
    pub kind: String,
    pub package: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    /// The package's directory: the working directory and `CARGO_MANIFEST_DIR`.
    pub dir: PathBuf,
}

impl Job {
    pub fn label(&self) -> String {
        if self.kind == "test" { self.name.clone() } else { format!("{} ({})", self.name, self.kind) }
    }
}

/// A package name from a cargo package id: `path+file:///w/agents/ca-syncer#0.1.0` names its directory's
/// package, `path+file:///w/agents/runtime#kcp-keeper-runtime@0.1.0` names another.
pub fn package_name(id: &str) -> Option<String> {
    let (url, fragment) = id.rsplit_once('#')?;
    match fragment.split_once('@') {
        Some((name, _)) => Some(name.to_string()),
        None => url.rsplit('/').next().filter(|s| !s.is_empty()).map(String::from),
    }
}

/// The test binaries in cargo's JSON messages (`compiler-artifact`s of test profile with an executable).
pub fn test_binaries(messages: &str) -> Result<Vec<Job>> {
    let mut jobs: Vec<Job> = Vec::new();
    for line in messages.lines().filter(|l| l.starts_with('{')) {
        let m: serde_json::Value = serde_json::from_str(line).context("a cargo message")?;
        if m["reason"] != "compiler-artifact" || m["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = m["executable"].as_str() else { continue };
        let package = m["package_id"].as_str().and_then(package_name).context("an artifact without a package")?;
        let target = m["target"]["name"].as_str().context("an artifact without a target name")?;
        let kind = m["target"]["kind"][0].as_str().unwrap_or("test").to_string();
        let manifest = m["manifest_path"].as_str().context("an artifact without a manifest")?;
        let dir = Path::new(manifest).parent().context("a manifest path without a directory")?.to_path_buf();
        let job =
            Job { name: format!("{package}:{target}"), kind, package, program: exe.into(), args: Vec::new(), dir };
        if !jobs.iter().any(|j| j.program == job.program) {
            jobs.push(job);
        }
    }
    Ok(jobs)
}

/// `--only` values: `<package>` or `<package>:<target>`.
pub fn selected(job: &Job, only: &[String]) -> bool {
    only.is_empty()
        || only.iter().any(|o| match o.split_once(':') {
            Some(_) => *o == job.name,
            None => *o == job.package,
        })
}

/// Longest first: the recorded time of the binary, else [`EXPECTED`], else 0 (short ones keep cargo's order).
pub fn order(jobs: &mut [Job], recorded: &BTreeMap<String, f64>) {
    let expected =
        |name: &str| recorded.get(name).copied().or_else(|| EXPECTED.iter().find(|(n, _)| *n == name).map(|(_, s)| *s));
    jobs.sort_by(|a, b| expected(&b.name).unwrap_or(0.0).total_cmp(&expected(&a.name).unwrap_or(0.0)));
}

fn starts_a_node(name: &str) -> bool {
    NODE.contains(&name)
}

/// Processes running a node's reaper (`reaper.sh`, in a session of its own, so the binary's group kill spares it).
fn reapers() -> Vec<u32> {
    // The xtask does not build the test bed (a test-only crate): its own scan of `/proc`.
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg.ends_with(b"/reaper.sh")))
        })
        .collect()
}

/// A node binary's reaper tears its node down after the binary exits (iptables rules, interfaces, cgroups): the
/// next node binary waits for it, or it starts on a host still changing under it (testbed:node compares the
/// host's state before and after its own node, and failed on the previous node's teardown finishing meanwhile).
/// Bounded: the reaper gives up within 30 s of its own.
fn wait_for_node_teardown(label: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !reapers().is_empty() {
        if Instant::now() > deadline {
            eprintln!("xtask: {label}: a node's reaper is still running 90 s after the binary ended: {:?}", reapers());
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The next job a free lane may start: the first in `queue` that does not start a node while `running` does.
pub fn next(queue: &mut Vec<Job>, running: &[String]) -> Option<Job> {
    let node_running = running.iter().any(|r| starts_a_node(r));
    let i = queue.iter().position(|j| !(node_running && starts_a_node(&j.name)))?;
    Some(queue.remove(i))
}

/// `N passed; M failed` from the `test result:` lines of a binary's output (summed: the doc tests print one per
/// crate).
pub fn summary(output: &str) -> String {
    let (mut passed, mut failed, mut ignored) = (0u64, 0u64, 0u64);
    for line in output.lines().filter_map(|l| l.trim().strip_prefix("test result: ")) {
        for part in line.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else { continue };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => passed += n,
                "failed" => failed += n,
                "ignored" => ignored += n,
                _ => {}
            }
        }
    }
    let mut text = format!("{passed} passed");
    if failed > 0 {
        text.push_str(&format!(", {failed} failed"));
    }
    if ignored > 0 {
        text.push_str(&format!(", {ignored} ignored"));
    }
    text
}

/// `times.tsv`: `<name>\t<seconds>` per line.
pub fn read_times(path: &Path) -> BTreeMap<String, f64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (name, secs) = l.split_once('\t')?;
            Some((name.to_string(), secs.parse().ok()?))
        })
        .collect()
}

fn write_times(path: &Path, times: &BTreeMap<String, f64>) -> Result<()> {
    let text: String = times.iter().map(|(n, s)| format!("{n}\t{s:.1}\n")).collect();
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// How many lanes always run binaries, and how many more run one only while the CPU is idle.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lanes {
    pub fixed: usize,
    pub extra: usize,
}

impl std::fmt::Display for Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.extra {
            0 => write!(f, "{} at a time", self.fixed),
            n => write!(f, "{} at a time ({} more while the CPU is idle)", self.fixed, n),
        }
    }
}

/// [`LANES_ENV`] fixes the number of lanes; by default two, and one more while the CPU is idle.
pub fn lanes() -> Result<Lanes> {
    match std::env::var(LANES_ENV) {
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(Lanes { fixed: n, extra: 0 }),
            _ => bail!("{LANES_ENV} must be a number of lanes, 1 or more (1 runs the test binaries serially): {v:?}"),
        },
        Err(_) => Ok(Lanes { fixed: DEFAULT_LANES, extra: EXTRA_LANES }),
    }
}

/// The CPU time counters of `/proc/stat`'s first line, in clock ticks: all of it, and the idle part (idle and
/// iowait).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuTimes {
    pub total: u64,
    pub idle: u64,
}

/// Reads the `cpu ` line of `/proc/stat` (`cpu user nice system idle iowait irq softirq steal ...`; guest time
/// is already inside user).
pub fn parse_cpu_times(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line.split_whitespace().skip(1).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    let total = fields.iter().take(8).sum();
    Some(CpuTimes { total, idle: fields.get(3)? + fields.get(4).copied().unwrap_or(0) })
}

fn cpu_times() -> Option<CpuTimes> {
    parse_cpu_times(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// The idle share of CPU time between two readings, if any time passed.
pub fn idle_share(from: CpuTimes, to: CpuTimes) -> Option<f64> {
    let total = to.total.checked_sub(from.total).filter(|t| *t > 0)?;
    Some(to.idle.saturating_sub(from.idle) as f64 / total as f64)
}

/// Whether an extra lane may start a binary: the CPU was at least [`EXTRA_LANE_IDLE`] idle over the last
/// [`IDLE_WINDOW`], all of it after the last start of a binary. `samples` are oldest first.
pub fn extra_lane_may_start(samples: &[(Instant, CpuTimes)], last_start: Instant, now: Instant) -> bool {
    if now.saturating_duration_since(last_start) < IDLE_WINDOW {
        return false;
    }
    let window_start = now - IDLE_WINDOW;
    let Some(&(_, newest)) = samples.last() else { return false };
    // The newest reading at least a window old, and not from before the last start.
    let Some(&(_, oldest)) = samples.iter().rev().find(|(t, _)| *t <= window_start && *t >= last_start) else {
        return false;
    };
    idle_share(oldest, newest).is_some_and(|idle| idle >= EXTRA_LANE_IDLE)
}

pub struct Outcome {
    pub job: Job,
    pub ok: bool,
    pub took: Duration,
}

struct State {
    queue: Vec<Job>,
    running: Vec<(String, Instant)>,
    outcomes: Vec<Outcome>,
    /// Set when an outcome was printed, so the progress line only speaks up during a long silence.
    printed_at: Instant,
    /// When any lane last started a binary: an extra lane measures idle time only after it.
    last_start: Instant,
}

impl State {
    fn new(queue: Vec<Job>) -> Self {
        let now = Instant::now();
        Self { queue, running: Vec::new(), outcomes: Vec::new(), printed_at: now, last_start: now }
    }
}

/// Runs `jobs` in `lanes` lanes, in their order; `env` is added to every job's environment except for the jobs
/// `env_for` refuses. Output goes to `<log_dir>/<name>.log`. Returns every outcome; the caller reports the total.
pub fn run(
    jobs: Vec<Job>,
    lanes: Lanes,
    env: Vec<(String, String)>,
    env_for: fn(&Job) -> bool,
    log_dir: &Path,
) -> Result<Vec<Outcome>> {
    std::fs::create_dir_all(log_dir)?;
    let shared = Arc::new((Mutex::new(State::new(jobs)), Condvar::new()));
    let env = Arc::new(env);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut threads = Vec::new();
    for lane in 0..lanes.fixed + lanes.extra {
        let (shared, env, cargo, log_dir) = (shared.clone(), env.clone(), cargo.clone(), log_dir.to_path_buf());
        let extra = lane >= lanes.fixed;
        threads.push(
            std::thread::Builder::new()
                .name(format!("lane {lane}"))
                .spawn(move || lane_loop(&shared, &env, env_for, &cargo, &log_dir, extra))?,
        );
    }
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let progress = {
        let (shared, done) = (shared.clone(), done.clone());
        std::thread::spawn(move || progress_loop(&shared, &done))
    };
    for t in threads {
        t.join().map_err(|_| anyhow::anyhow!("a test lane panicked"))??;
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    shared.1.notify_all();
    let _ = progress.join();
    let state = std::mem::replace(&mut *shared.0.lock().unwrap(), State::new(Vec::new()));
    Ok(state.outcomes)
}

fn lane_loop(
    shared: &(Mutex<State>, Condvar),
    env: &[(String, String)],
    env_for: fn(&Job) -> bool,
    cargo: &str,
    log_dir: &Path,
    extra: bool,
) -> Result<()> {
    let (lock, wake) = shared;
    // An extra lane's CPU readings, oldest first, kept for a little more than a window.
    let mut samples: std::collections::VecDeque<(Instant, CpuTimes)> = std::collections::VecDeque::new();
    loop {
        let job = {
            let mut state = lock.lock().unwrap();
            loop {
                if state.queue.is_empty() || child::interrupted() {
                    return Ok(());
                }
                let now = Instant::now();
                if extra {
                    if let Some(times) = cpu_times() {
                        samples.push_back((now, times));
                    }
                    while samples.front().is_some_and(|(t, _)| now.duration_since(*t) > IDLE_WINDOW * 2) {
                        samples.pop_front();
                    }
                }
                let may_start = !extra || extra_lane_may_start(samples.make_contiguous(), state.last_start, now);
                let running: Vec<String> = state.running.iter().map(|(n, _)| n.clone()).collect();
                if may_start && let Some(job) = next(&mut state.queue, &running) {
                    state.running.push((job.name.clone(), now));
                    state.last_start = now;
                    break job;
                }
                state = if extra { wake.wait_timeout(state, IDLE_POLL).unwrap().0 } else { wake.wait(state).unwrap() };
            }
        };
        let log = log_dir.join(format!("{}.log", job.name.replace([':', '/'], "-")));
        let started = Instant::now();
        let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = command(&job, cargo);
        cmd.stdin(std::process::Stdio::null()).stdout(out.try_clone()?).stderr(out);
        if env_for(&job) {
            cmd.envs(env.iter().map(|(k, v)| (k, v)));
        }
        // A temp directory of its own, removed when the binary ends however it ends: a failing or killed test
        // leaves its etcd data and logs in there, not in /tmp for the rest of the run (a full run writes
        // gigabytes of test data, and a disk that fills up fails every binary after it). Short, so the unix
        // sockets the peers put under it stay within the 108-byte limit.
        let tmp = tempfile::Builder::new().prefix("kcp-keeper-lane-").tempdir().context("a temp dir for the binary")?;
        cmd.env("TMPDIR", tmp.path());
        // A group of its own: whatever the binary leaves running (an agent's drill kcp) is killed once it exits.
        let status = child::run_as_group(cmd, &job.label());
        if starts_a_node(&job.name) {
            wait_for_node_teardown(&job.label());
        }
        drop(tmp);
        let took = started.elapsed();
        let ok = matches!(&status, Ok(s) if s.success());
        let output = std::fs::read_to_string(&log).unwrap_or_default();
        let mut state = lock.lock().unwrap();
        state.running.retain(|(n, _)| *n != job.name);
        if ok {
            eprintln!("xtask: ok     {:>6.1}s  {}  {}", took.as_secs_f64(), job.label(), summary(&output));
        } else {
            let why = match &status {
                Ok(s) => s.to_string(),
                Err(e) => format!("{e:#}"),
            };
            eprintln!(
                "xtask: FAILED {:>6.1}s  {}  {} ({why}); its whole output ({}):\n{output}\nxtask: ---- end of {}'s output",
                took.as_secs_f64(),
                job.label(),
                summary(&output),
                log.display(),
                job.label()
            );
        }
        state.printed_at = Instant::now();
        state.outcomes.push(Outcome { job, ok, took });
        wake.notify_all();
    }
}

/// Every minute without a finished binary, what is still running: a newcomer can tell a slow run from a hung one.
fn progress_loop(shared: &(Mutex<State>, Condvar), done: &std::sync::atomic::AtomicBool) {
    const QUIET: Duration = Duration::from_secs(60);
    let (lock, wake) = shared;
    let mut state = lock.lock().unwrap();
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        state = wake.wait_timeout(state, Duration::from_secs(5)).unwrap().0;
        if state.printed_at.elapsed() >= QUIET && !state.running.is_empty() {
            let running: Vec<String> =
                state.running.iter().map(|(n, t)| format!("{n} ({:.0}s)", t.elapsed().as_secs_f64())).collect();
            eprintln!("xtask: ..  still running: {}; {} to go", running.join(", "), state.queue.len());
            state.printed_at = Instant::now();
        }
    }
}

/// Records the wall times of this run's passing binaries over the earlier ones (for the next run's order; a
/// failed or interrupted binary's time says little about its next run).
pub fn record_times(path: &Path, outcomes: &[Outcome]) -> Result<()> {
    let mut times = read_times(path);
    for o in outcomes.iter().filter(|o| o.ok) {
        times.insert(o.job.name.clone(), o.took.as_secs_f64());
    }
    write_times(path, &times)
}

/// A job's command, run as cargo runs a test binary: in its package's directory with that package's
/// `CARGO_MANIFEST_DIR` and `CARGO_PKG_NAME`. The doc tests are cargo itself, which sets those for what it runs:
/// given the xtask's own (`cargo xtask` is `cargo run`) or a package's, ring's build script (it declares it reads
/// `CARGO_MANIFEST_DIR`) re-ran and cargo rebuilt ring and the 23 crates above it, rustls, kube and the agents
/// among them: 77 s of every full run's tests step, and again at the next build without them.
fn command(job: &Job, cargo: &str) -> Command {
    if job.kind == "doc" {
        let mut cmd = crate::cargo(&job.args.iter().map(String::as_str).collect::<Vec<_>>());
        cmd.current_dir(&job.dir);
        return cmd;
    }
    let mut cmd = Command::new(&job.program);
    cmd.args(&job.args)
        .current_dir(&job.dir)
        .env("CARGO_MANIFEST_DIR", &job.dir)
        .env("CARGO_PKG_NAME", &job.package)
        .env("CARGO", cargo);
    cmd
}

/// The doc tests, as one job run by cargo (rustdoc builds and runs them).
pub fn doc_tests(cargo: &str, root: &Path) -> Job {
    Job {
        name: "workspace:doc-tests".into(),
        kind: "doc".into(),
        package: "workspace".into(),
        program: PathBuf::from(cargo),
        args: ["test", "--workspace", "--locked", "--doc"].map(String::from).to_vec(),
        dir: root.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_binary_that_starts_a_node_or_a_kcp_bed_has_an_expected_time_so_a_fresh_clone_starts_it_early() {
        for name in NODE.iter().chain(SHARED_KCP_USERS).chain(PRIVATE_KCP) {
            assert!(EXPECTED.iter().any(|(n, _)| n == name), "{name} has no EXPECTED time: it would start last");
        }
        let mut jobs = vec![job("ca-syncer:sidecar"), job("chart:node"), job("chart:seed_layout")];
        order(&mut jobs, &BTreeMap::new());
        assert_eq!(jobs[0].name, "chart:seed_layout", "{jobs:?}");
    }

    #[test]
    fn a_test_binary_gets_its_package_variables_and_cargo_running_the_doc_tests_gets_none_of_the_xtasks() {
        let envs = |cmd: &Command| -> BTreeMap<String, Option<String>> {
            cmd.get_envs()
                .map(|(k, v)| (k.to_string_lossy().into_owned(), v.map(|v| v.to_string_lossy().into_owned())))
                .collect()
        };
        let binary = envs(&command(&job("ca-syncer:sidecar"), "cargo"));
        assert_eq!(binary["CARGO_MANIFEST_DIR"], Some("/w".into()));
        assert_eq!(binary["CARGO_PKG_NAME"], Some("ca-syncer".into()));
        let doc = command(&doc_tests("cargo", Path::new("/w")), "cargo");
        assert!(doc.get_args().any(|a| a == "--doc"));
        for (name, value) in envs(&doc).into_iter().filter(|(name, _)| name != "CARGO_INCREMENTAL") {
            assert_eq!(value, None, "{name} is set for cargo running the doc tests, not removed");
        }
        // Built as the test binaries were: without incremental caches, unless the caller's environment asks.
        if std::env::var_os("CARGO_INCREMENTAL").is_none() {
            assert_eq!(envs(&doc)["CARGO_INCREMENTAL"], Some("0".into()));
        }
        // Whatever of cargo's package variables this process has (cargo test sets them) is removed.
        for (name, _) in std::env::vars().filter(|(n, _)| n == "CARGO_MANIFEST_DIR" || n.starts_with("CARGO_PKG_")) {
            assert_eq!(envs(&doc).get(&name), Some(&None), "{name} would reach cargo running the doc tests");
        }
    }

    fn job(name: &str) -> Job {
        let (package, _) = name.split_once(':').unwrap();
        Job {
            name: name.into(),
            kind: "test".into(),
            package: package.into(),
            program: format!("/t/{name}").into(),
            args: Vec::new(),
            dir: "/w".into(),
        }
    }

    #[test]
    fn package_names_come_from_the_id_fragment_or_the_directory() {
        assert_eq!(package_name("path+file:///w/agents/ca-syncer#0.1.0").as_deref(), Some("ca-syncer"));
        assert_eq!(
            package_name("path+file:///w/agents/runtime#kcp-keeper-runtime@0.1.0").as_deref(),
            Some("kcp-keeper-runtime")
        );
        assert_eq!(package_name("no fragment"), None);
    }

    #[test]
    fn only_test_profile_artifacts_with_an_executable_are_test_binaries() {
        let messages = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/agents/ca-syncer#0.1.0","manifest_path":"/w/agents/ca-syncer/Cargo.toml","target":{"kind":["test"],"name":"live_check"},"profile":{"test":true},"executable":"/t/live_check-1"}
{"reason":"compiler-artifact","package_id":"path+file:///w/agents/ca-syncer#0.1.0","manifest_path":"/w/agents/ca-syncer/Cargo.toml","target":{"kind":["bin"],"name":"ca-syncer"},"profile":{"test":false},"executable":"/t/ca-syncer"}
{"reason":"compiler-artifact","package_id":"path+file:///w/agents/ca-syncer#0.1.0","manifest_path":"/w/agents/ca-syncer/Cargo.toml","target":{"kind":["lib"],"name":"ca_syncer"},"profile":{"test":false},"executable":null}
{"reason":"compiler-artifact","package_id":"path+file:///w/agents/runtime#kcp-keeper-runtime@0.1.0","manifest_path":"/w/agents/runtime/Cargo.toml","target":{"kind":["lib"],"name":"kcp_keeper_runtime"},"profile":{"test":true},"executable":"/t/kcp_keeper_runtime-2"}
{"reason":"build-finished","success":true}
"#;
        let jobs = test_binaries(messages).unwrap();
        let names: Vec<String> = jobs.iter().map(Job::label).collect();
        assert_eq!(names, ["ca-syncer:live_check", "kcp-keeper-runtime:kcp_keeper_runtime (lib)"]);
        assert_eq!(jobs[0].dir, Path::new("/w/agents/ca-syncer"));
        assert_eq!(jobs[0].program, Path::new("/t/live_check-1"));
    }

    #[test]
    fn only_selects_a_whole_package_or_one_binary_of_it() {
        let only = |o: &[&str]| o.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(selected(&job("testbed:kcp"), &[]));
        assert!(selected(&job("testbed:kcp"), &only(&["testbed"])));
        assert!(selected(&job("testbed:kcp"), &only(&["ca-syncer", "testbed:kcp"])));
        assert!(!selected(&job("testbed:node"), &only(&["testbed:kcp"])));
        assert!(!selected(&job("testbed-x:kcp"), &only(&["testbed"])));
    }

    #[test]
    fn the_longest_known_binary_goes_first_a_recorded_time_over_the_expected_one() {
        let mut jobs = vec![job("a:short"), job("testbed:kcp"), job("kubeconfig-rotator:kcp"), job("b:new")];
        let recorded = BTreeMap::from([("a:short".to_string(), 2.0), ("testbed:kcp".to_string(), 400.0)]);
        order(&mut jobs, &recorded);
        let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
        assert_eq!(names, ["testbed:kcp", "kubeconfig-rotator:kcp", "a:short", "b:new"]);
    }

    #[test]
    fn a_lane_never_starts_a_node_binary_beside_another_and_takes_the_next_job_instead() {
        let mut queue = vec![job("testbed:node"), job("a:x")];
        let next_one = next(&mut queue, &["chart:node".to_string()]).unwrap();
        assert_eq!(next_one.name, "a:x");
        assert_eq!(next(&mut queue, &["chart:node".to_string()]), None, "only the node binary is left");
        assert_eq!(next(&mut queue, &["a:y".to_string()]).unwrap().name, "testbed:node");
    }

    #[test]
    fn cpu_times_are_the_first_cpu_line_with_iowait_counted_idle() {
        let stat = "cpu  100 5 50 800 40 3 2 0 7 0\ncpu0 50 2 25 400 20 1 1 0 0 0\nintr 1 2\n";
        assert_eq!(parse_cpu_times(stat), Some(CpuTimes { total: 1000, idle: 840 }));
        assert_eq!(parse_cpu_times("intr 1 2\n"), None);
        assert_eq!(parse_cpu_times("cpu  1 x 3 4\n"), None);
        let later = CpuTimes { total: 1200, idle: 940 };
        assert_eq!(idle_share(CpuTimes { total: 1000, idle: 840 }, later), Some(0.5));
        assert_eq!(idle_share(later, later), None, "no time passed");
    }

    /// Readings every 5 s from `from`, each adding 100 ticks of which `idle` were idle.
    fn readings(from: Instant, count: u32, idle: u64) -> Vec<(Instant, CpuTimes)> {
        (0..count)
            .map(|i| {
                (
                    from + Duration::from_secs(5 * u64::from(i)),
                    CpuTimes { total: 100 * u64::from(i), idle: idle * u64::from(i) },
                )
            })
            .collect()
    }

    #[test]
    fn an_extra_lane_starts_a_binary_only_after_a_whole_idle_window_since_the_last_start() {
        let start = Instant::now();
        let idle = readings(start, 6, 60);
        let at = |secs: u64| start + Duration::from_secs(secs);
        assert!(extra_lane_may_start(&idle, start, at(25)), "60% idle for 25 s");
        assert!(!extra_lane_may_start(&idle[..4], start, at(15)), "not a whole window since the last start");
        assert!(!extra_lane_may_start(&readings(start, 6, 30), start, at(25)), "30% idle is busy");
        // A binary started at 10 s: only readings after it count, and 15 s of them are not a window.
        assert!(!extra_lane_may_start(&idle, at(10), at(25)));
        assert!(!extra_lane_may_start(&[], start, at(25)), "no readings, no start");
    }

    #[test]
    fn by_default_two_lanes_and_one_more_while_idle() {
        assert_eq!(
            Lanes { fixed: DEFAULT_LANES, extra: EXTRA_LANES }.to_string(),
            "2 at a time (1 more while the CPU is idle)"
        );
        assert_eq!(Lanes { fixed: 1, extra: 0 }.to_string(), "1 at a time");
    }

    #[test]
    fn the_summary_adds_up_every_test_result_line() {
        let out = "running 3 tests\ntest result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 1.2s\n   Doc-tests x\ntest result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s\n";
        assert_eq!(summary(out), "4 passed, 2 failed, 1 ignored");
        assert_eq!(summary("no tests ran"), "0 passed");
    }

    #[test]
    fn recorded_times_round_trip_keep_only_passing_binaries_and_skip_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("times.tsv");
        std::fs::write(&path, "a:x\t12.5\nbroken line\nb:y\tnot-a-number\n").unwrap();
        assert_eq!(read_times(&path), BTreeMap::from([("a:x".to_string(), 12.5)]));
        let passed = Outcome { job: job("c:z"), ok: true, took: Duration::from_millis(3_300) };
        let failed = Outcome { job: job("a:x"), ok: false, took: Duration::from_millis(100) };
        record_times(&path, &[passed, failed]).unwrap();
        assert_eq!(read_times(&path), BTreeMap::from([("a:x".to_string(), 12.5), ("c:z".to_string(), 3.3)]));
    }
}
