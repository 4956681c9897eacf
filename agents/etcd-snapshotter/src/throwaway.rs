//! The throwaway etcd and its scratch: the temporary directory and the processes started there (a restored
//! etcd, kcp), cleaned up whatever happens, the small helpers that start processes on loopback, and the one
//! wrapper of `etcdutl snapshot restore`. Drills, chain drills, `restore` and `restore --at` all restore
//! through [`etcdutl_restore`]; drills and point-in-time replays start their member with [`throwaway_etcd`].

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::error::DrillError;

/// How long a throwaway etcd may take to answer after its start.
const ETCD_START_TIMEOUT: Duration = Duration::from_secs(120);

/// How often a throwaway etcd is started before a port lost to another process fails the drill.
const START_ATTEMPTS: u32 = 3;

/// Prefix of every drill's temporary directory (so leftovers of a killed agent are recognised).
pub const SCRATCH_PREFIX: &str = "drill-";

/// A drill's local I/O failed: the error's kind only (a path or its contents could name what is secret).
pub(crate) fn setup(what: &str, e: &std::io::Error) -> DrillError {
    DrillError::Setup(format!("{what}: {}", e.kind()))
}

/// A free port on 127.0.0.1, as an http URL (see [`free_port`]).
pub(crate) fn loopback_url() -> Result<String, DrillError> {
    Ok(format!("http://127.0.0.1:{}", free_port()?))
}

/// The lowest port handed to a throwaway process (the test bed's own processes take theirs below it).
const LOWEST_PORT: u16 = 20_000;

/// The first port never handed out: Kubernetes' default NodePort range starts here, and kube-proxy may redirect a
/// connection to such a port on 127.0.0.1 when the agent runs in the host's network.
const NODE_PORTS: u16 = 30_000;

/// The kernel's ephemeral range, `net.ipv4.ip_local_port_range`.
const EPHEMERAL_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";

/// Where the next [`free_port`] looks, modulo the range: a random start per process.
static NEXT_PORT: std::sync::LazyLock<AtomicU32> = std::sync::LazyLock::new(|| AtomicU32::new(rand::random()));

/// A port on 127.0.0.1 nothing listens on, for a process started next (a throwaway etcd, kcp), taken from below
/// the kernel's ephemeral range and the NodePort range. A port from inside the ephemeral range (what binding port 0
/// gives) can be handed to any outgoing connection of this pod between the check and the process's own bind, and
/// the process then fails with "address already in use": seen when a drill ran beside the agent's snapshots. Below
/// it only explicit binds compete. Successive calls in one process walk the range from a random start, so two
/// drills of one agent never get the same port; a drill of another process (a `drill` run by hand in the agent's
/// pod) starts elsewhere, and [`restore_and_start`] retries a start that lost the port anyway.
pub(crate) fn free_port() -> Result<u16, DrillError> {
    let Some(below) = ephemeral_low().map(|low| low.min(NODE_PORTS)).filter(|low| *low > LOWEST_PORT + 1000) else {
        return kernel_port();
    };
    let span = u32::from(below - LOWEST_PORT);
    for _ in 0..span.min(1000) {
        let offset = NEXT_PORT.fetch_add(1, Ordering::Relaxed) % span;
        let port = LOWEST_PORT + offset as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    kernel_port()
}

/// The low end of the ephemeral range, when the kernel says.
fn ephemeral_low() -> Option<u16> {
    std::fs::read_to_string(EPHEMERAL_RANGE).ok()?.split_whitespace().next()?.parse().ok()
}

/// A port the kernel picks (inside the ephemeral range): the fallback when the range leaves no room below it.
fn kernel_port() -> Result<u16, DrillError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| setup("finding a free port", &e))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| setup("finding a free port", &e))
}

/// Whether a process's log says it could not bind its port (another process took it after [`free_port`]).
fn lost_its_port(log: &str) -> bool {
    log.contains("address already in use")
}

pub(crate) fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim().lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// A drill's temporary directory and the processes it started. Dropping it (a finished drill, an error, a
/// timeout, or a shutdown dropping the drill's future) kills every process, waits for each to exit, then
/// removes the directory: nothing outlives the drill. `kill_on_drop` on each child is the second line.
pub struct Scratch {
    dir: Option<tempfile::TempDir>,
    children: Vec<(String, Child)>,
}

impl Scratch {
    pub fn new(root: &Path, shard: &str) -> Result<Self, DrillError> {
        std::fs::create_dir_all(root).map_err(|e| setup("creating the drills directory", &e))?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{SCRATCH_PREFIX}{shard}-"))
            .tempdir_in(root)
            .map_err(|e| setup("creating the drill's directory", &e))?;
        Ok(Self { dir: Some(dir), children: Vec::new() })
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("present until drop").path()
    }

    /// Starts `command` with its output in `log`; returns its index.
    pub fn spawn(&mut self, command: &mut Command, log: &Path, name: &str) -> Result<usize, DrillError> {
        let out = std::fs::File::create(log).map_err(|e| setup("creating a log file", &e))?;
        let err = out.try_clone().map_err(|e| setup("creating a log file", &e))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| DrillError::Setup(format!("starting {name}: {}", e.kind())))?;
        self.children.push((name.into(), child));
        Ok(self.children.len() - 1)
    }

    /// The exit status if the process has exited.
    pub fn exited(&mut self, index: usize) -> Option<std::process::ExitStatus> {
        self.children[index].1.try_wait().ok().flatten()
    }

    /// Stops every process and waits for each: SIGKILL, since a throwaway copy has nothing worth flushing.
    pub async fn finish(&mut self) {
        for (name, child) in &mut self.children {
            let _ = child.start_kill();
            if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
                tracing::warn!(process = name.as_str(), "a drill process did not exit within 10s of SIGKILL");
            }
        }
        self.children.clear();
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Synchronous on purpose: drop cannot await, and the directory must not be removed while a process
        // still writes into it. SIGKILL takes effect within milliseconds; the bound only guards a stuck kernel.
        for (name, child) in &mut self.children {
            let _ = child.start_kill();
            let deadline = Instant::now() + Duration::from_secs(5);
            while !matches!(child.try_wait(), Ok(Some(_)) | Err(_)) {
                if Instant::now() > deadline {
                    tracing::warn!(process = name.as_str(), "a drill process outlived SIGKILL by 5s");
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if let Some(dir) = self.dir.take() {
            let path = dir.path().to_path_buf();
            if let Err(error) = dir.close() {
                tracing::warn!(path = %path.display(), %error, "removing the drill's directory failed");
            }
        }
    }
}

/// One member as `etcdutl snapshot restore` lays it out.
#[derive(Debug, Clone)]
pub struct RestoredMember<'a> {
    pub name: &'a str,
    /// `name=peerURL,...`: the new cluster's members.
    pub initial_cluster: String,
    pub peer_url: &'a str,
    pub token: &'a str,
    pub data_dir: &'a Path,
    /// `--bump-revision` with `--mark-compacted`, for a member that serves watchers again (a real restore);
    /// `None` for a throwaway member, whose revision must stay the snapshot's exact one.
    pub bump_revision: Option<u64>,
}

/// The throwaway member of a drill or a replay: one member named `drill`, its revision untouched.
pub fn drill_member<'a>(data_dir: &'a Path, peer_url: &'a str) -> RestoredMember<'a> {
    RestoredMember {
        name: "drill",
        initial_cluster: format!("drill={peer_url}"),
        peer_url,
        token: "etcd-snapshotter-drill",
        data_dir,
        bump_revision: None,
    }
}

/// Why `etcdutl snapshot restore` failed.
#[derive(Debug)]
pub enum RestoreFailed {
    /// It could not be started: the binary and the I/O error's kind.
    Start(PathBuf, std::io::ErrorKind),
    /// It exited non-zero: its stderr, trimmed.
    Exit(String),
}

impl RestoreFailed {
    /// A drill's reason: `setup` when etcdutl did not start, `restore` with the end of its output when it failed.
    pub fn into_drill_error(self) -> DrillError {
        match self {
            Self::Start(_, kind) => DrillError::Setup(format!("running etcdutl: {kind}")),
            Self::Exit(stderr) => DrillError::Restore(last_lines(&stderr, 5)),
        }
    }
}

impl std::fmt::Display for RestoreFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Start(etcdutl, kind) => write!(f, "running {}: {kind}", etcdutl.display()),
            Self::Exit(stderr) => write!(f, "etcdutl snapshot restore failed: {stderr}"),
        }
    }
}

impl std::error::Error for RestoreFailed {}

/// Runs `etcdutl snapshot restore` of `db` for one member: the only place this agent restores a database.
pub async fn etcdutl_restore(etcdutl: &Path, db: &Path, member: &RestoredMember<'_>) -> Result<(), RestoreFailed> {
    let mut command = Command::new(etcdutl);
    command
        .args(["snapshot", "restore"])
        .arg(db)
        .arg(format!("--name={}", member.name))
        .arg(format!("--initial-cluster={}", member.initial_cluster))
        .arg(format!("--initial-advertise-peer-urls={}", member.peer_url))
        .arg(format!("--initial-cluster-token={}", member.token))
        .arg(format!("--data-dir={}", member.data_dir.display()));
    if let Some(bump) = member.bump_revision {
        command.arg(format!("--bump-revision={bump}")).arg("--mark-compacted");
    }
    let out =
        command.kill_on_drop(true).output().await.map_err(|e| RestoreFailed::Start(etcdutl.to_path_buf(), e.kind()))?;
    if !out.status.success() {
        return Err(RestoreFailed::Exit(String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    Ok(())
}

/// A single-member etcd on a restored data directory, on loopback URLs only, its metrics off: the drill's and
/// the point-in-time replay's throwaway member.
fn throwaway_etcd(etcd: &Path, data_dir: &Path, client_url: &str, peer_url: &str, quota: u64) -> Command {
    let mut command = Command::new(etcd);
    command
        .arg("--name=drill")
        .arg(format!("--data-dir={}", data_dir.display()))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster=drill={peer_url}"))
        .arg(format!("--quota-backend-bytes={quota}"))
        .arg("--listen-metrics-urls=")
        .arg("--log-level=warn");
    command
}

/// Connects once the member answers; fails early if it exits (with the end of its log).
async fn wait_for_etcd(
    scratch: &mut Scratch,
    etcd: usize,
    url: &str,
    log: &Path,
) -> Result<etcd_client::Client, DrillError> {
    let deadline = Instant::now() + ETCD_START_TIMEOUT;
    loop {
        if let Some(status) = scratch.exited(etcd) {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            return Err(DrillError::EtcdStart(format!("etcd exited ({status}): {}", last_lines(&log, 5))));
        }
        if let Ok(mut client) = crate::member::connect(url, None).await
            && client.status().await.is_ok()
        {
            return Ok(client);
        }
        if Instant::now() > deadline {
            return Err(DrillError::EtcdStart(format!("etcd did not answer within {ETCD_START_TIMEOUT:?}")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Restores `db` as a one-member throwaway etcd in `scratch` (`<scratch>/member`, the database file removed
/// once restored) and starts it on loopback with `quota`, accepting any source transaction whole (a replay or a
/// chain applies each as the source committed it): its client and client URL once it answers, and the number
/// of NOSPACE alarms disarmed in it (a snapshot taken while NOSPACE was raised carries the alarm in its
/// database, and the member would refuse every write a replay or a kcp shard makes).
pub async fn restore_and_start(
    scratch: &mut Scratch,
    (etcdutl, etcd): (&Path, &Path),
    db: &Path,
    quota: u64,
) -> Result<(etcd_client::Client, String, usize), DrillError> {
    let data_dir = scratch.path().join("member");
    let log = scratch.path().join("etcd.log");
    let mut attempts = 0;
    let (mut client, client_url) = loop {
        attempts += 1;
        let (client_url, peer_url) = (loopback_url()?, loopback_url()?);
        etcdutl_restore(etcdutl, db, &drill_member(&data_dir, &peer_url))
            .await
            .map_err(RestoreFailed::into_drill_error)?;
        let mut command = throwaway_etcd(etcd, &data_dir, &client_url, &peer_url, quota);
        command.arg("--max-txn-ops=1000000").arg("--max-request-bytes=268435456");
        let index = scratch.spawn(&mut command, &log, "etcd")?;
        match wait_for_etcd(scratch, index, &client_url, &log).await {
            Ok(client) => break (client, client_url),
            Err(DrillError::EtcdStart(reason)) if lost_its_port(&reason) && attempts < START_ATTEMPTS => {
                tracing::warn!(attempts, "the throwaway etcd lost its port to another process; starting it on others");
                std::fs::remove_dir_all(&data_dir).map_err(|e| setup("removing the restored member", &e))?;
            }
            Err(error) => return Err(error),
        }
    };
    // The download is no longer needed; free its space before the member grows.
    let _ = std::fs::remove_file(db);
    let disarmed = crate::member::disarm_nospace(&mut client)
        .await
        .map_err(|e| DrillError::EtcdStart(format!("disarming NOSPACE in the restored member: {e:#}")))?;
    Ok((client, client_url, disarmed))
}

/// Removes what drills of a killed agent left in `root` (a process that was SIGKILLed cannot clean up).
pub fn remove_leftovers(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(SCRATCH_PREFIX) {
            tracing::warn!(path = %entry.path().display(), "removing a drill directory an earlier run left");
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_below_the_ephemeral_range_distinct_and_skip_a_port_something_listens_on() {
        let low = ephemeral_low().expect("this kernel says its ephemeral range").min(NODE_PORTS);
        let first = free_port().unwrap();
        let held = std::net::TcpListener::bind(("127.0.0.1", first + 1)).ok();
        let second = free_port().unwrap();
        assert!(first >= LOWEST_PORT && first < low, "{first} is outside {LOWEST_PORT}..{low}");
        assert!(second >= LOWEST_PORT && second < low, "{second} is outside {LOWEST_PORT}..{low}");
        assert_ne!(first, second);
        if held.is_some() {
            assert_ne!(second, first + 1, "a port something listens on was handed out");
        }
        let mut seen = std::collections::BTreeSet::from([first, second]);
        for _ in 0..200 {
            assert!(seen.insert(free_port().unwrap()), "a port was handed out twice");
        }
    }

    #[test]
    fn only_a_lost_port_restarts_the_throwaway_etcd() {
        let lost = r#"{"level":"fatal","msg":"discovery failed","error":"listen tcp 127.0.0.1:45457: bind: address already in use"}"#;
        assert!(lost_its_port(lost));
        assert!(!lost_its_port(
            r#"{"level":"fatal","msg":"failed to open backend","error":"database file corrupted"}"#
        ));
    }
}
