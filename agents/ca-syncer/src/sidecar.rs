//! `ca-syncer watch`: the sidecar that turns a mounted Secret or ConfigMap into one CA bundle file on a shared
//! volume and tells the process that reads it.
//!
//! kubelet updates a mounted volume by writing a fresh timestamped directory and swapping the `..data` symlink,
//! so the *directory* is watched (the runtime's `dirwatch`, shared with the configuration reload): a watch on a
//! file would stay on the old inode. Every file event (after a short debounce, because one update is a burst of
//! events) and every poll re-reads every key, parses it with the strict parser (only CERTIFICATE blocks; a key
//! with anything else rejects the whole update), builds one deduplicated, byte-stable bundle and compares its
//! bytes with the output file. Only then:
//!
//! - a changed, valid bundle is written atomically (temp file in the output's directory, fsync, rename), and
//!   the process is told once (a signal to a pid or to processes found by name, or an HTTP call);
//! - an invalid update leaves the last good file byte for byte and tells nobody; the error names the key and
//!   the kind of problem, never the content;
//! - a notification that could not be delivered is retried on the next event or poll, never fatal.
//!
//! On start, the process is told only if an output file already existed with other content: a restart with
//! identical inputs is silent, and a process that starts beside us reads the file itself (signalling it before it
//! installed its handler could kill it: SIGHUP's default action is to terminate).

mod inputs;
mod metrics;
mod notifier;
mod output;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use kcp_keeper_runtime::admin::{self, Health};
use kcp_keeper_runtime::dirwatch::{DirWatch, WatchSettings};
use kcp_keeper_runtime::duration::parse_go_duration;
use kcp_keeper_runtime::logging::LogFormat;
use nix::sys::signal::Signal;
use tokio_util::sync::CancellationToken;

pub use notifier::NotifyMethod;

use inputs::{InputError, Keys};
use metrics::{Reason, SidecarMetrics};
use notifier::{Notifier, Target};

/// Prefix of every sidecar metric (`ca_syncer_sidecar_certificates`, ...): the sidecar is scraped apart from
/// the agent, so its series must not mix with the agent's `ca_syncer_*`.
pub const METRICS_PREFIX: &str = "ca_syncer_sidecar";

/// Arguments of `ca-syncer watch`. Every flag can also be set from a `CA_SYNCER_WATCH_*` environment variable.
#[derive(clap::Args, Debug, Clone)]
#[command(group(
    clap::ArgGroup::new("reload").args(["signal_pid", "signal_process", "notify_url"]).multiple(false)
))]
pub struct WatchArgs {
    /// The mounted Secret or ConfigMap volume to watch (not a `subPath` mount: those never update).
    #[arg(long, env = "CA_SYNCER_WATCH_DIR")]
    pub dir: PathBuf,

    /// Keys (file names in --dir) to combine; repeat or separate with commas. Default: every file in the
    /// directory except hidden ones, so a Secret that also holds a private key must name its certificate keys.
    #[arg(long = "key", value_name = "KEY", env = "CA_SYNCER_WATCH_KEY", value_delimiter = ',')]
    pub keys: Vec<String>,

    /// The bundle file to write, on a volume the process mounts; must not lie inside --dir.
    #[arg(long, env = "CA_SYNCER_WATCH_OUTPUT")]
    pub output: PathBuf,

    /// Signal this process (a shared process namespace or the same pod) after each change.
    #[arg(long, value_name = "PID", env = "CA_SYNCER_WATCH_SIGNAL_PID", value_parser = parse_pid)]
    pub signal_pid: Option<i32>,

    /// Signal the processes with this name (`/proc/<pid>/comm` or the file name of argv[0]) after each change;
    /// looked up anew each time, so a restarted process is found. Needs `shareProcessNamespace: true`.
    #[arg(long, value_name = "NAME", env = "CA_SYNCER_WATCH_SIGNAL_PROCESS", value_parser = parse_process_name)]
    pub signal_process: Option<String>,

    /// Call this plain-HTTP URL after each change (e.g. a reload endpoint on localhost); 2xx is success. Its
    /// query may carry a token: it is never logged or echoed.
    #[arg(long, value_name = "URL", env = "CA_SYNCER_WATCH_NOTIFY_URL", hide_env_values = true)]
    pub notify_url: Option<String>,

    /// HTTP method of the --notify-url call.
    #[arg(long, env = "CA_SYNCER_WATCH_NOTIFY_METHOD", value_enum, default_value_t = NotifyMethod::Post)]
    pub notify_method: NotifyMethod,

    /// How long the --notify-url call may take.
    #[arg(long, env = "CA_SYNCER_WATCH_NOTIFY_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    pub notify_timeout: Duration,

    /// The signal sent with --signal-pid or --signal-process: HUP, USR1, USR2, TERM, ... (with or without SIG).
    #[arg(long, env = "CA_SYNCER_WATCH_SIGNAL", default_value = "HUP", value_parser = parse_signal)]
    pub signal: Signal,

    /// Re-read everything this often even without a file event: the backstop for a missed event.
    #[arg(long, env = "CA_SYNCER_WATCH_POLL_INTERVAL", default_value = "30s", value_parser = parse_positive_duration)]
    pub poll_interval: Duration,

    /// Quiet time after a file event before re-reading: one kubelet update is a burst of events.
    #[arg(long, env = "CA_SYNCER_WATCH_DEBOUNCE", default_value = "200ms", value_parser = parse_go_duration)]
    pub debounce: Duration,

    /// Accept keys without certificates and write an empty bundle (for consumers where empty means "use the
    /// public roots"). Without it, an empty key or an empty bundle is an error and the last good file stays.
    #[arg(long, env = "CA_SYNCER_WATCH_ALLOW_EMPTY", value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_empty: bool,

    /// Keep certificates past their notAfter in the bundle (by default they are dropped).
    #[arg(long, env = "CA_SYNCER_WATCH_KEEP_EXPIRED", value_parser = clap::builder::BoolishValueParser::new())]
    pub keep_expired: bool,

    /// Log filter, e.g. `info` or `ca_syncer=debug,info`.
    #[arg(long, env = "CA_SYNCER_WATCH_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Log format: JSON in the cluster, plain on a terminal.
    #[arg(long, env = "CA_SYNCER_WATCH_LOG_FORMAT", value_enum, default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,

    /// Serve `/livez`, `/readyz` (ready once a valid bundle is in place) and `/metrics` on this address.
    #[arg(long, env = "CA_SYNCER_WATCH_ADMIN_ADDR")]
    pub admin_addr: Option<SocketAddr>,
}

/// `ca-syncer watch`: logging, SIGTERM/SIGINT handling, then [`run`] until the first signal.
pub async fn main(args: WatchArgs) -> anyhow::Result<()> {
    kcp_keeper_runtime::logging::init(&args.log_level, args.log_format)?;
    let shutdown = kcp_keeper_runtime::shutdown::on_signals().context("installing the signal handlers")?;
    run(args, shutdown).await
}

/// Runs the sidecar until `shutdown` is cancelled. Fails only at start (invalid arguments, a directory that
/// does not exist, an admin address that cannot be bound); once running, every error is logged, counted and
/// retried on the next event or poll.
pub async fn run(args: WatchArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let settings = Arc::new(Settings::from_args(&args)?);
    let mut registry = kcp_keeper_runtime::metrics::registry(METRICS_PREFIX);
    let metrics = SidecarMetrics::start(registry.sub_registry_with_prefix(METRICS_PREFIX));
    let health = Arc::new(Health::default());
    let _admin = match args.admin_addr {
        Some(addr) => Some(
            admin::serve(addr, health.clone(), Arc::new(registry))
                .await
                .with_context(|| format!("binding the admin server to {addr}"))?,
        ),
        None => None,
    };

    // Kept for the whole loop: dropping it ends the notifications.
    let mut dirwatch =
        DirWatch::new(&settings.dir, WatchSettings { debounce: settings.debounce, poll: settings.poll_interval });
    if dirwatch.is_polling_only() {
        // Typically the inotify watch limit of the node. Polling still converges, only slower.
        metrics.error(Reason::Watch.into());
    }

    output::remove_stale_temp_files(&settings.output);
    // What the process may have loaded already: an output file left by our previous run. Without one, the
    // process reads our first file itself when it starts, so that first write is not announced.
    let announced = output::read_current(&settings.output).unwrap_or_else(|e| {
        tracing::warn!(error = %e, output = %settings.output.display(), "cannot read the existing output");
        None
    });
    tracing::info!(
        dir = %settings.dir.display(),
        output = %settings.output.display(),
        keys = %settings.keys,
        notify = %settings.target,
        poll_interval = ?settings.poll_interval,
        "watching"
    );
    let mut sidecar = Sidecar {
        notifier: Notifier::new(settings.target.clone()),
        settings: settings.clone(),
        metrics,
        health: health.clone(),
        announced,
        pending_notification: false,
        last_input_error: None,
    };
    loop {
        sidecar.sync(&shutdown).await;
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            wake = dirwatch.next() => tracing::debug!(?wake, "re-reading"),
        }
    }
    health.start_draining();
    tracing::info!("shutting down");
    Ok(())
}

/// The validated configuration.
#[derive(Debug)]
struct Settings {
    dir: PathBuf,
    keys: Keys,
    output: PathBuf,
    target: Target,
    poll_interval: Duration,
    debounce: Duration,
    allow_empty: bool,
    drop_expired: bool,
}

impl Settings {
    fn from_args(args: &WatchArgs) -> anyhow::Result<Self> {
        let dir_meta = std::fs::metadata(&args.dir).with_context(|| format!("--dir {}", args.dir.display()))?;
        ensure!(dir_meta.is_dir(), "--dir {} is not a directory", args.dir.display());
        let keys = Keys::from_args(&args.keys)?;
        let output = &args.output;
        let Some(file_name) = output.file_name() else {
            bail!("--output {} does not name a file", output.display());
        };
        let output_dir = output.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let output_dir = output_dir
            .canonicalize()
            .with_context(|| format!("the directory of --output {} must exist", output.display()))?;
        let watched = args.dir.canonicalize().with_context(|| format!("--dir {}", args.dir.display()))?;
        // Our own writes would wake the watcher, and with default keys the bundle would read itself back.
        ensure!(output_dir != watched, "--output must not be inside --dir");
        let target = match (args.signal_pid, &args.signal_process, &args.notify_url) {
            (Some(pid), None, None) => {
                ensure!(
                    u32::try_from(pid).ok() != Some(std::process::id()),
                    "--signal-pid {pid} is this sidecar itself"
                );
                Target::Pid { pid, signal: args.signal }
            }
            (None, Some(name), None) => Target::Process { name: name.clone(), signal: args.signal },
            (None, None, Some(url)) => {
                let uri = notifier::parse_notify_url(url).map_err(|e| anyhow::anyhow!("--notify-url {e}"))?;
                Target::Http { uri, method: args.notify_method, timeout: args.notify_timeout }
            }
            (None, None, None) => Target::None,
            _ => bail!("use at most one of --signal-pid, --signal-process and --notify-url"),
        };
        Ok(Self {
            dir: args.dir.clone(),
            keys,
            output: output_dir.join(file_name),
            target,
            poll_interval: args.poll_interval,
            debounce: args.debounce,
            allow_empty: args.allow_empty,
            drop_expired: !args.keep_expired,
        })
    }
}

/// The loop's state between cycles.
struct Sidecar {
    settings: Arc<Settings>,
    notifier: Notifier,
    metrics: SidecarMetrics,
    health: Arc<Health>,
    /// The bundle the process is assumed to have loaded (told about, or read itself at start). A new bundle
    /// that differs from it is announced.
    announced: Option<Vec<u8>>,
    /// A change the process has not been told about yet because delivery failed.
    pending_notification: bool,
    /// The last rejected update's error, so an unchanged bad input is logged and counted once, not every poll.
    last_input_error: Option<String>,
}

/// What one cycle's file work found.
struct Synced {
    rendered: Vec<u8>,
    certificates: usize,
    earliest_not_after: Option<time::OffsetDateTime>,
    dropped_expired: usize,
    written: bool,
}

#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("the file work did not finish: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl SyncError {
    fn reason(&self) -> &'static str {
        match self {
            Self::Input(e) => e.reason(),
            Self::Write { .. } | Self::Task(_) => Reason::Write.into(),
        }
    }
}

impl Sidecar {
    /// One cycle: read and validate every key, write the bundle if it changed, tell the process if needed.
    async fn sync(&mut self, shutdown: &CancellationToken) {
        let settings = self.settings.clone();
        // File I/O (including an fsync) off the async threads.
        let result =
            tokio::task::spawn_blocking(move || sync_files(&settings)).await.map_err(SyncError::from).and_then(|r| r);
        match result {
            Ok(synced) => self.accept(synced),
            Err(e) => self.reject(&e),
        }
        if self.pending_notification {
            tokio::select! {
                // An HTTP call can take up to its timeout; shutdown does not wait for it.
                () = shutdown.cancelled() => {}
                () = self.notify() => {}
            }
        }
    }

    fn accept(&mut self, synced: Synced) {
        let m = &self.metrics;
        if synced.written {
            m.mark_written();
            tracing::info!(
                output = %self.settings.output.display(),
                certificates = synced.certificates,
                dropped_expired = synced.dropped_expired,
                "bundle written"
            );
        } else {
            tracing::debug!(certificates = synced.certificates, "bundle unchanged");
        }
        if self.last_input_error.take().is_some() {
            tracing::info!("inputs are valid again");
        }
        m.set_bundle(synced.certificates, synced.earliest_not_after);
        m.mark_synced();
        self.health.mark_synced();
        if self.announced.as_ref().is_some_and(|old| *old != synced.rendered) {
            self.pending_notification = true;
        }
        self.announced = Some(synced.rendered);
    }

    fn reject(&mut self, error: &SyncError) {
        let message = error.to_string();
        if matches!(error, SyncError::Input(_)) && self.last_input_error.as_deref() == Some(message.as_str()) {
            tracing::debug!(error = %message, "inputs still invalid");
            return;
        }
        tracing::error!(
            error = %message,
            reason = error.reason(),
            "update not applied: the last good bundle stays in place and nobody is notified"
        );
        self.metrics.error(error.reason());
        if matches!(error, SyncError::Input(_)) {
            self.last_input_error = Some(message);
        }
    }

    async fn notify(&mut self) {
        match self.notifier.notify().await {
            Ok(delivered) => {
                self.pending_notification = false;
                if let Some(delivered) = delivered {
                    self.metrics.mark_reloaded();
                    tracing::info!(notified = %delivered, "process told to reload");
                }
            }
            Err(e) => {
                self.metrics.error(e.reason());
                tracing::warn!(error = %e, reason = e.reason(), "could not notify the process; retrying on the next change or poll");
            }
        }
    }
}

/// Reads and validates the inputs, and writes the bundle if the output's bytes differ. Blocking.
fn sync_files(settings: &Settings) -> Result<Synced, SyncError> {
    let now = time::OffsetDateTime::now_utc();
    let bundle = inputs::load(&settings.dir, &settings.keys, settings.allow_empty, settings.drop_expired, now)?;
    let rendered = bundle.render().into_bytes();
    let current = output::read_current(&settings.output).unwrap_or_else(|e| {
        // Unreadable is as good as different: the write below replaces it or says why it cannot.
        tracing::warn!(error = %e, "cannot read the current output; rewriting it");
        None
    });
    let written = current.as_deref() != Some(rendered.as_slice());
    if written {
        output::write_atomic(&settings.output, &rendered)
            .map_err(|source| SyncError::Write { path: settings.output.clone(), source })?;
    }
    Ok(Synced {
        certificates: bundle.len(),
        earliest_not_after: bundle.earliest_not_after(),
        dropped_expired: bundle.dropped_expired().len(),
        rendered,
        written,
    })
}

/// Signals by name (`HUP`, `SIGHUP`, `hup`) or number.
fn parse_signal(text: &str) -> Result<Signal, String> {
    let trimmed = text.trim();
    if let Ok(number) = trimmed.parse::<i32>() {
        return Signal::try_from(number).map_err(|_| format!("{number} is not a signal number"));
    }
    let upper = trimmed.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
    name.parse::<Signal>().map_err(|_| format!("unknown signal {trimmed:?} (use HUP, USR1, USR2, TERM, ...)"))
}

/// A pid to signal. 0 and negative numbers are refused: `kill` would take them as a process group or as every
/// process we may signal.
fn parse_pid(text: &str) -> Result<i32, String> {
    match text.trim().parse::<i32>() {
        Ok(pid) if pid > 0 => Ok(pid),
        _ => Err("must be a positive process id".to_owned()),
    }
}

fn parse_process_name(text: &str) -> Result<String, String> {
    let name = text.trim();
    if name.is_empty() || name.contains('/') || name.contains('\0') {
        return Err("must be a process name (no path)".to_owned());
    }
    Ok(name.to_owned())
}

/// A Go-style duration above zero (a zero poll interval would spin).
fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match parse_go_duration(text) {
        Ok(d) if d.is_zero() => Err("must be above zero".to_owned()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        watch: WatchArgs,
    }

    fn parse(args: &[&str]) -> Result<WatchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("watch").chain(args.iter().copied())).map(|c| c.watch)
    }

    #[test]
    fn watch_args_pass_clap_debug_assert() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let args = parse(&["--dir", "/in", "--output", "/out/ca.crt"]).expect("parses");
        assert_eq!(args.poll_interval, Duration::from_secs(30));
        assert_eq!(args.signal, Signal::SIGHUP);
        assert_eq!(args.notify_method, NotifyMethod::Post);
        assert!(args.keys.is_empty());
        assert!(!args.allow_empty);
        assert!(!args.keep_expired);
        assert!(args.admin_addr.is_none());
    }

    #[test]
    fn keys_repeat_or_split_on_commas_and_durations_are_go_style() {
        let args = parse(&[
            "--dir=/in",
            "--output=/out/ca.crt",
            "--key=ca.crt,tls.crt",
            "--key",
            "extra.pem",
            "--poll-interval=1m30s",
            "--signal=usr1",
            "--signal-pid=42",
        ])
        .expect("parses");
        assert_eq!(args.keys, ["ca.crt", "tls.crt", "extra.pem"]);
        assert_eq!(args.poll_interval, Duration::from_secs(90));
        assert_eq!(args.signal, Signal::SIGUSR1);
        assert_eq!(args.signal_pid, Some(42));
    }

    #[test]
    fn at_most_one_way_to_notify() {
        let base = ["--dir=/in", "--output=/out/ca.crt"];
        for extra in [
            ["--signal-pid=5", "--signal-process=nginx"],
            ["--signal-pid=5", "--notify-url=http://127.0.0.1:1/reload"],
            ["--signal-process=nginx", "--notify-url=http://127.0.0.1:1/reload"],
        ] {
            let args: Vec<&str> = base.iter().chain(extra.iter()).copied().collect();
            assert!(parse(&args).is_err(), "{extra:?}");
        }
    }

    #[test]
    fn signals_parse_with_or_without_sig_prefix_and_by_number() {
        assert_eq!(parse_signal("HUP"), Ok(Signal::SIGHUP));
        assert_eq!(parse_signal("SIGUSR2"), Ok(Signal::SIGUSR2));
        assert_eq!(parse_signal("term"), Ok(Signal::SIGTERM));
        assert_eq!(parse_signal("10"), Ok(Signal::SIGUSR1));
        assert!(parse_signal("RELOAD").is_err());
        assert!(parse_signal("999").is_err());
    }

    #[test]
    fn pids_that_mean_groups_or_everyone_are_refused() {
        assert_eq!(parse_pid("17"), Ok(17));
        for bad in ["0", "-1", "-17", "x", ""] {
            assert!(parse_pid(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_must_be_positive_and_go_style() {
        assert_eq!(parse_positive_duration("300ms"), Ok(Duration::from_millis(300)));
        assert!(parse_positive_duration("0s").is_err());
        assert!(parse_positive_duration("30").is_err());
        assert!(parse_positive_duration("1day").is_err());
    }

    #[test]
    fn settings_refuse_an_output_inside_the_watched_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dir_arg = format!("--dir={}", dir.path().display());
        let inside = format!("--output={}", dir.path().join("bundle.pem").display());
        let args = parse(&[dir_arg.as_str(), inside.as_str()]).expect("parses");
        let err = Settings::from_args(&args).expect_err("refused");
        assert!(err.to_string().contains("inside --dir"), "{err}");
    }

    #[test]
    fn settings_refuse_a_missing_directory_and_output_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing");
        let out = dir.path().join("out.pem");
        let args =
            parse(&[&format!("--dir={}", missing.display()), &format!("--output={}", out.display())]).expect("parses");
        assert!(Settings::from_args(&args).is_err());
        let watched = tempfile::tempdir().expect("tempdir");
        let nowhere = dir.path().join("no-such-dir").join("out.pem");
        let args = parse(&[&format!("--dir={}", watched.path().display()), &format!("--output={}", nowhere.display())])
            .expect("parses");
        assert!(Settings::from_args(&args).is_err());
    }
}
