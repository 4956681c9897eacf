//! A peer process: output captured to a log file, killed on drop (and by the kernel if the test process dies),
//! its log printed when the test that owns it fails.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

/// How much of each log is printed when a test fails.
const LOG_TAIL_BYTES: u64 = 16 * 1024;

pub struct Process {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Process {
    /// Starts `program` with `args`, appending stdout and stderr to `log`.
    pub fn start(name: &str, program: &Path, args: Vec<String>, log: PathBuf) -> Result<Self> {
        Self::start_with_env(name, program, args, &[], log)
    }

    /// Like [`Process::start`], with extra environment variables (for credentials: argv is world-readable).
    pub fn start_with_env(
        name: &str,
        program: &Path,
        args: Vec<String>,
        env: &[(&str, &str)],
        log: PathBuf,
    ) -> Result<Self> {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut p = Self { name: name.into(), program: program.into(), args, env, log, child: None };
        p.spawn()?;
        Ok(p)
    }

    /// A process another one started and owns (a shared kcp bed's peer, `kcp::shared`): its log is read from
    /// `log`, and it is neither signalled nor killed from here (`pid` is None).
    pub fn elsewhere(name: &str, log: PathBuf) -> Self {
        Self { name: name.into(), program: PathBuf::new(), args: Vec::new(), env: Vec::new(), log, child: None }
    }

    fn spawn(&mut self) -> Result<()> {
        anyhow::ensure!(
            !self.program.as_os_str().is_empty(),
            "{} runs in another process: it cannot be restarted here",
            self.name
        );
        let out = File::options().create(true).append(true).open(&self.log)?;
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of the parent. It makes
        // the kernel kill the peer if the test process dies without running destructors (timeout, SIGKILL).
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().with_context(|| format!("starting {} ({})", self.name, self.program.display()))?;
        self.child = Some(child);
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops it with SIGTERM, waiting up to `grace` before SIGKILL.
    pub fn stop(&mut self, grace: Duration) {
        if self.signal_and_wait(nix::sys::signal::Signal::SIGTERM, grace).is_none() {
            self.kill();
        }
    }

    /// Sends `signal` (SIGSTOP freezes a peer so requests to it hang instead of failing fast).
    pub fn signal(&self, signal: nix::sys::signal::Signal) -> Result<()> {
        let pid = self.pid().context("the process is not running")?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal)?;
        Ok(())
    }

    /// Sends `signal` and waits up to `timeout` for the process to exit; returns its status if it did.
    pub fn signal_and_wait(
        &mut self,
        signal: nix::sys::signal::Signal,
        timeout: Duration,
    ) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal);
        self.wait_exit(timeout)
    }

    /// Waits up to `timeout` for the process to exit on its own; returns its status if it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Starts it again with the same arguments (after `kill` or `stop`).
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }

    /// Sets (`Some`) or removes (`None`) one environment variable for the next [`Process::restart`].
    pub fn set_env(&mut self, name: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != name);
        if let Some(value) = value {
            self.env.push((name.into(), value.into()));
        }
    }

    /// Fails when the process has exited (with the tail of its log in the error).
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(child) = self.child.as_mut()
            && let Some(status) = child.try_wait()?
        {
            anyhow::bail!("{} exited ({status}); its log ends:\n{}", self.name, self.log_tail());
        }
        Ok(())
    }

    /// The last part of the captured output.
    pub fn log_tail(&self) -> String {
        tail(&self.log, LOG_TAIL_BYTES)
    }

    /// All captured output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("===== {} log ({}) =====\n{}", self.name, self.log.display(), self.log_tail());
        }
    }
}

fn tail(path: &Path, bytes: u64) -> String {
    let Ok(mut file) = File::open(path) else { return String::new() };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(bytes)));
    let mut buf = Vec::new();
    let _ = file.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Every process on the host and its command line, its arguments joined by spaces (processes that end while
/// `/proc` is read are left out).
pub fn command_lines() -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&cmdline).trim_end_matches('\0').replace('\0', " ")))
        })
        .collect()
}

/// A loopback port nothing listens on now, for a peer to listen on. Chosen at random below the kernel's
/// ephemeral range (and below 20000) rather than by binding port 0: the kernel hands ports of that range to
/// outgoing connections too, so a port from it can be taken by the time the peer binds it ("address already in
/// use"). Never the same port twice in one process (a peer told two ports binds them only later).
pub fn free_port() -> Result<u16> {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    // Below 20000: the agents' own throwaway processes (a drill's etcd and kcp) take theirs from 20000 up, so a
    // test's peer and a drill running beside it never pick the same port.
    let below = ephemeral_start.min(20_000);
    if below > 12_000 {
        for _ in 0..1000 {
            let port = rand::random_range(10_000..below);
            if !handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                handed_out.insert(port);
                return Ok(port);
            }
        }
    }
    // No room below the ephemeral range: let the kernel choose.
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    handed_out.insert(port);
    Ok(port)
}

/// Polls `check` until it succeeds, the process dies, or `timeout` passes.
pub async fn wait_until<F, Fut>(process: &mut Process, timeout: Duration, what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        process.check_running()?;
        let err = match check().await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!(
                "{} did not become {what} within {timeout:?}: {err:#}\n{} log ends:\n{}",
                process.name(),
                process.name(),
                process.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
