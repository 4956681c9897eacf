//! Running a child so that stopping the xtask stops it too.
//!
//! `cargo xtask ...` execs into this binary, so the process that scripts, `timeout` and CI runners signal is
//! the xtask, not the demo or the test run it starts. Two links keep the chain unwinding: SIGINT and SIGTERM
//! sent to the xtask are passed on to the child (the xtask then waits for it and exits with its status), and
//! the child gets a parent-death signal, so even a SIGKILLed xtask leaves no child behind.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus};

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether SIGINT or SIGTERM reached the xtask while it ran a child: then nothing new is started (the test lanes
/// stop taking binaries).
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Runs `cmd` to completion, forwarding SIGINT and SIGTERM to it. Calls may run at once from several threads
/// (the test lanes): each forwards to its own child.
pub fn run(cmd: Command, what: &str) -> Result<ExitStatus> {
    run_with(cmd, what, false)
}

/// As [`run`], with the child leading a process group of its own: once it has exited, whatever is left in the
/// group is killed. Its descendants inherit the group, so a child that could not stop its own (it was
/// SIGKILLed, and so were the agents it started, whose restore drills' etcd and kcp then had no parent to stop
/// them) leaves nothing running.
pub fn run_as_group(cmd: Command, what: &str) -> Result<ExitStatus> {
    run_with(cmd, what, true)
}

fn run_with(mut cmd: Command, what: &str, group: bool) -> Result<ExitStatus> {
    if group {
        cmd.process_group(0);
    }
    // Registered before the spawn so a signal that arrives in between is queued, not fatal. The handlers are
    // reset to the default in the child by exec.
    let mut signals = Signals::new([SIGINT, SIGTERM]).context("installing the signal handlers")?;
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().with_context(|| format!("starting {what}"))?;
    let pid = Pid::from_raw(child.id() as i32);
    let handle = signals.handle();
    let forwarder = std::thread::spawn(move || {
        for number in signals.forever() {
            if let Ok(signal) = Signal::try_from(number) {
                INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
                eprintln!("xtask: {signal} received; passing it on to {pid} and waiting for it to exit");
                let _ = kill(pid, signal);
            }
        }
    });
    let status = child.wait().with_context(|| format!("waiting for {what}"));
    if group {
        // ESRCH when the child left nothing behind, the usual case.
        let _ = nix::sys::signal::killpg(pid, Signal::SIGKILL);
    }
    handle.close();
    let _ = forwarder.join();
    status
}

/// Makes the kernel send the child SIGTERM when the thread that spawns it exits (PR_SET_PDEATHSIG): so a
/// SIGKILLed xtask leaves no child behind. The thread must live as long as the child: the main thread, or a
/// thread that waits for the child (a test lane).
pub fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of the parent. The setting
    // survives exec (cargo execs into the demo).
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from));
    }
}

/// The exit code that reports `status` to our own caller: the child's code, or 128 + the signal that ended it.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1)
}
