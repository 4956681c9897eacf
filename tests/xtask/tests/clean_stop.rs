//! `cargo xtask demo` stopped the way scripts, `timeout` and CI runners stop a process: the whole chain
//! xtask -> demo -> peers and agents unwinds, whichever link is killed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The demo builds the agents and starts the whole control plane before it reports it is running.
const START_TIMEOUT: Duration = Duration::from_secs(900);
/// "Within seconds": the peers are killed and waited for, then the temp dir is removed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

struct RunningDemo {
    xtask: Child,
    /// The bed's temp dir, from the demo's "data and logs:" line.
    work_dir: PathBuf,
    /// Every process below the xtask once the demo said it runs: pid -> command name.
    tree: BTreeMap<i32, String>,
}

/// One demo at a time: each starts a whole control plane, and this machine has 2 cores.
static ONE_DEMO: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Starts `xtask demo` and waits until the demo says the control plane and the agents run.
fn start_demo() -> RunningDemo {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut xtask = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("demo")
        .current_dir(&root)
        .env("CARGO", std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting xtask demo");
    let stdout = xtask.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("demo> {line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + START_TIMEOUT;
    let mut work_dir = None;
    loop {
        let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) else {
            // Stop it the way a user would, so a late start does not run on into the next test's demo.
            stop(&mut xtask);
            panic!("the demo did not report it was running within {START_TIMEOUT:?}");
        };
        if let Some(dir) = line.trim().strip_prefix("data and logs: ") {
            work_dir = Some(PathBuf::from(dir));
        }
        if line.starts_with("running;") {
            break;
        }
    }
    // Keep draining stdout so the demo never blocks on a full pipe.
    std::thread::spawn(move || while rx.recv().is_ok() {});
    let work_dir = work_dir.expect("the demo printed no data dir");
    assert!(work_dir.is_dir(), "the demo's data dir {} does not exist", work_dir.display());
    let tree = descendants(xtask.id() as i32);
    let names: BTreeSet<&str> = tree.values().map(String::as_str).collect();
    for expected in ["demo", "etcd", "kube-apiserver", "kcp", "kcp-front-proxy", "versitygw", "coredns", "ca-syncer"] {
        assert!(names.contains(expected), "no {expected} process below the xtask; found {names:?}");
    }
    RunningDemo { xtask, work_dir, tree }
}

/// SIGTERM to a still running xtask (it stops the demo and the peers), then waits for it.
fn stop(xtask: &mut Child) {
    if matches!(xtask.try_wait(), Ok(None)) {
        let _ = kill(Pid::from_raw(xtask.id() as i32), Signal::SIGTERM);
        let _ = wait_exit(xtask, STOP_TIMEOUT);
    }
}

/// A failed assertion must not leave a demo running beside the next test's.
impl Drop for RunningDemo {
    fn drop(&mut self) {
        stop(&mut self.xtask);
    }
}

/// Every process below `root` (children, grandchildren, ...), read from /proc.
fn descendants(root: i32) -> BTreeMap<i32, String> {
    let mut parent_of = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        if let Some((ppid, comm)) = stat(pid) {
            parent_of.insert(pid, (ppid, comm));
        }
    }
    let mut found = BTreeMap::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for (pid, (ppid, comm)) in &parent_of {
            if *ppid == parent && found.insert(*pid, comm.clone()).is_none() {
                frontier.push(*pid);
            }
        }
    }
    found
}

/// (parent pid, command name) of a live process; None when it is gone or a zombie (it runs nothing).
fn stat(pid: i32) -> Option<(i32, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; comm may hold spaces and parentheses, so split at the last ')'.
    let (head, rest) = text.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    (state != "Z").then_some((ppid, comm))
}

/// Waits until none of `pids` runs any more; returns those still running at the deadline.
fn wait_gone(pids: &BTreeMap<i32, String>, timeout: Duration) -> BTreeMap<i32, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let alive: BTreeMap<i32, String> =
            pids.iter().filter(|(pid, _)| stat(**pid).is_some()).map(|(p, n)| (*p, n.clone())).collect();
        if alive.is_empty() || Instant::now() > deadline {
            return alive;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_exit(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

#[test]
fn sigterm_to_the_started_xtask_stops_demo_peers_and_agents_and_removes_the_temp_dir() {
    let _one = ONE_DEMO.lock().unwrap_or_else(|e| e.into_inner());
    let mut demo = start_demo();
    kill(Pid::from_raw(demo.xtask.id() as i32), Signal::SIGTERM).unwrap();
    let status = wait_exit(&mut demo.xtask, STOP_TIMEOUT);
    let alive = wait_gone(&demo.tree, STOP_TIMEOUT);
    assert!(alive.is_empty(), "still running {STOP_TIMEOUT:?} after SIGTERM: {alive:?}");
    let status = status.expect("the xtask did not exit after SIGTERM");
    assert!(status.success(), "a demo stopped by SIGTERM should exit 0, got {status}");
    assert!(!demo.work_dir.exists(), "the demo's temp dir {} is still there", demo.work_dir.display());
}

#[test]
fn sigkill_of_the_demo_binary_leaves_no_peer_running() {
    let _one = ONE_DEMO.lock().unwrap_or_else(|e| e.into_inner());
    let mut demo = start_demo();
    let demo_pid = *demo.tree.iter().find(|(_, name)| *name == "demo").expect("the demo process").0;
    kill(Pid::from_raw(demo_pid), Signal::SIGKILL).unwrap();
    let alive = wait_gone(&demo.tree, STOP_TIMEOUT);
    let status = wait_exit(&mut demo.xtask, STOP_TIMEOUT);
    // A SIGKILLed demo cannot remove its temp dir; the test does.
    let _ = std::fs::remove_dir_all(&demo.work_dir);
    assert!(alive.is_empty(), "still running {STOP_TIMEOUT:?} after the demo was killed: {alive:?}");
    let status = status.expect("the xtask did not exit after its demo died");
    assert_eq!(status.code(), Some(128 + 9), "the xtask should report the demo's SIGKILL, got {status}");
}

/// Starts `xtask kcp-bed` on `dir` and waits until it prints the bed's variable; returns the xtask and every
/// process below it then.
fn start_shared_kcp_bed(dir: &Path) -> (Child, BTreeMap<i32, String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut xtask = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("kcp-bed")
        .arg("--dir")
        .arg(dir)
        .current_dir(&root)
        .env("CARGO", std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting xtask kcp-bed");
    let stdout = xtask.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("kcp-bed> {line}");
            let _ = tx.send(line);
        }
    });
    let expected = format!("export KCP_KEEPER_TEST_KCP={}", dir.join("bed.json").display());
    match rx.recv_timeout(START_TIMEOUT) {
        Ok(line) if line == expected => {}
        other => {
            stop(&mut xtask);
            panic!("xtask kcp-bed did not print {expected:?} within {START_TIMEOUT:?}: {other:?}");
        }
    }
    let tree = descendants(xtask.id() as i32);
    let names: BTreeSet<&str> = tree.values().map(String::as_str).collect();
    for expected in ["kcp-bed", "etcd", "kcp", "kcp-front-proxy"] {
        assert!(names.contains(expected), "no {expected} process below the xtask; found {names:?}");
    }
    (xtask, tree)
}

#[test]
fn sigkill_of_the_xtask_holding_the_shared_kcp_bed_leaves_no_kcp_or_etcd_running() {
    let _one = ONE_DEMO.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let bed_dir = dir.path().join("bed");
    let (mut xtask, tree) = start_shared_kcp_bed(&bed_dir);
    // The file test binaries attach with names the bed's front proxy and CAs.
    let file: serde_json::Value = serde_json::from_slice(&std::fs::read(bed_dir.join("bed.json")).unwrap()).unwrap();
    assert!(file["ready"]["frontProxyUrl"].as_str().unwrap().starts_with("https://127.0.0.1:"), "{file}");
    kill(Pid::from_raw(xtask.id() as i32), Signal::SIGKILL).unwrap();
    let _ = xtask.wait();
    let alive = wait_gone(&tree, STOP_TIMEOUT);
    assert!(alive.is_empty(), "still running {STOP_TIMEOUT:?} after the xtask was killed: {alive:?}");
}
