//! The kcp bed `cargo xtask test` shares across test binaries: testbed's `kcp-bed` binary, started once, its
//! description file named to every test binary with [`ENV`] (`testbed::kcp::shared_bed`).
//!
//! The bed dies with the xtask, however the xtask ends: it leads a process group of its own, gets a
//! parent-death signal, and reads its standard input from a pipe the xtask holds. Stopping it closes that pipe
//! (the bed stops kcp and exits), then kills whatever is left in its group.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::child::die_with_parent;

/// The variable test binaries read the bed's file from (`testbed::kcp::shared_bed::ENV`).
pub const ENV: &str = "KCP_KEEPER_TEST_KCP";
/// Set to `0` (or `false`, `no`, `off`) to give every test binary a kcp of its own, as a plain `cargo test` does.
pub const SWITCH: &str = "KCP_KEEPER_TEST_SHARED_KCP";
/// How long the bed may take to stop kcp once asked.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether the bed is shared (the default) or each test binary starts its own.
pub fn enabled() -> bool {
    std::env::var(SWITCH).map_or(true, |v| !turns_off(&v))
}

/// Whether a boolean variable's value turns it off: the forms the agents' variables take
/// (`kcp_keeper_runtime::args::boolean_env`), `0`, `false`, `no`, `off`, `n`, `f`, in any case.
fn turns_off(value: &str) -> bool {
    matches!(value.trim().to_ascii_lowercase().as_str(), "0" | "false" | "no" | "off" | "n" | "f")
}

pub struct SharedBed {
    child: Child,
    stdin: Option<ChildStdin>,
    /// The description file, the value of [`ENV`].
    pub file: PathBuf,
    /// The bed's own output (kcp's logs are in the bed's directory).
    pub log: PathBuf,
    stopped: bool,
}

impl SharedBed {
    /// Starts `binary` (testbed's `kcp-bed`) on `dir`, which it clears; returns at once: the bed writes its file
    /// when kcp is ready, and test binaries wait for it.
    pub fn start(binary: &Path, dir: &Path) -> Result<Self> {
        // Test binaries run in their packages' directories.
        let dir = &std::path::absolute(dir)?;
        // A file left by an earlier bed must not be read as this one's.
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        let log = dir.with_extension("log");
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(binary);
        cmd.arg(dir).stdin(Stdio::piped()).stdout(out.try_clone()?).stderr(out).process_group(0);
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().with_context(|| format!("starting the shared kcp bed ({})", binary.display()))?;
        let stdin = child.stdin.take();
        eprintln!("xtask: shared kcp bed starting in {} (its log {})", dir.display(), log.display());
        Ok(Self { child, stdin, file: dir.join("bed.json"), log, stopped: false })
    }

    /// Waits until the bed has written its file; fails with the bed's reason (or its log) if it could not start,
    /// or when `give_up` says so (a signal).
    pub fn wait_ready(&mut self, timeout: Duration, mut give_up: impl FnMut() -> bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if give_up() {
                bail!("stopped before the shared kcp bed was ready");
            }
            if let Ok(text) = std::fs::read(&self.file) {
                let file: serde_json::Value = serde_json::from_slice(&text).context("the shared kcp bed's file")?;
                if let Some(why) = file.get("failed") {
                    bail!("the shared kcp bed did not start: {}", why.as_str().unwrap_or_default());
                }
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("the shared kcp bed exited ({status}) before it was ready; its log:\n{}", self.log_text());
            }
            if Instant::now() > deadline {
                bail!("the shared kcp bed was not ready within {timeout:?}; its log:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether it still runs; an exit status if it ended before it was asked to.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Asks the bed to stop (its stdin closes), waits, and kills whatever is left in its process group.
    pub fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        drop(self.stdin.take());
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // ESRCH when the bed left nothing behind, the usual case.
        let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
    }
}

impl Drop for SharedBed {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_shared_bed_switch_is_turned_off_by_each_false_form_only() {
        for off in ["0", "false", "no", "off", "FALSE", "No"] {
            assert!(super::turns_off(off), "{off}");
        }
        for on in ["1", "true", "yes", "on", ""] {
            assert!(!super::turns_off(on), "{on}");
        }
    }
}
