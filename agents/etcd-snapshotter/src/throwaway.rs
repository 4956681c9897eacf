//! A drill's scratch: its temporary directory and the processes it starts there (the throwaway etcd, kcp),
//! cleaned up whatever happens to the drill, and the small helpers both drill levels use to start processes on
//! loopback. Its own module because both levels, the etcd one and the kcp one, start processes in it.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::error::DrillError;

/// Prefix of every drill's temporary directory (so leftovers of a killed agent are recognised).
pub const SCRATCH_PREFIX: &str = "drill-";

/// A drill's local I/O failed: the error's kind only (a path or its contents could name what is secret).
pub(crate) fn setup(what: &str, e: &std::io::Error) -> DrillError {
    DrillError::Setup(format!("{what}: {}", e.kind()))
}

/// A free port on 127.0.0.1, as an http URL. (Bound and released: a process started right after takes it.)
pub(crate) fn loopback_url() -> Result<String, DrillError> {
    Ok(format!("http://127.0.0.1:{}", free_port()?))
}

pub(crate) fn free_port() -> Result<u16, DrillError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| setup("finding a free port", &e))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| setup("finding a free port", &e))
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
