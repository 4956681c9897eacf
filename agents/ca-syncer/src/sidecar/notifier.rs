//! Telling the process that its bundle changed: a signal to a pid, a signal to the processes found by name in a
//! shared process namespace, or an HTTP call. A failure is returned, never fatal: the sidecar retries on its
//! next event or poll.

use std::collections::HashSet;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use http::{StatusCode, Uri};
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::metrics::Reason;

/// HTTP method of `--notify-url`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NotifyMethod {
    Post,
    Get,
    Put,
}

impl NotifyMethod {
    fn as_http(self) -> http::Method {
        match self {
            Self::Post => http::Method::POST,
            Self::Get => http::Method::GET,
            Self::Put => http::Method::PUT,
        }
    }
}

/// Whom to tell.
#[derive(Debug, Clone)]
pub(super) enum Target {
    None,
    Pid { pid: i32, signal: Signal },
    Process { name: String, signal: Signal },
    Http { uri: Uri, method: NotifyMethod, timeout: Duration },
}

impl fmt::Display for Target {
    /// Safe for logs: the URL is shown without its query, which may carry a token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("nobody"),
            Self::Pid { pid, signal } => write!(f, "{signal} to pid {pid}"),
            Self::Process { name, signal } => write!(f, "{signal} to processes named {name:?}"),
            Self::Http { uri, method, .. } => write!(f, "{} {}", method.as_http(), redacted(uri)),
        }
    }
}

/// Why the process could not be told. Messages name the target, never a URL's query.
#[derive(Debug, thiserror::Error)]
pub(super) enum NotifyError {
    #[error("sending {signal} to pid {pid}: {errno}")]
    Signal { pid: i32, signal: Signal, errno: Errno },
    #[error("no running process named {name:?}")]
    ProcessNotFound { name: String },
    #[error("sending {signal} to the processes named {name:?} failed: {failures}")]
    SignalAll { name: String, signal: Signal, failures: String },
    #[error("{target}: {message}")]
    Http { target: String, message: String },
    #[error("{target}: answered {status}")]
    HttpStatus { target: String, status: StatusCode },
    #[error("{target}: no answer within {timeout:?}")]
    HttpTimeout { target: String, timeout: Duration },
}

impl NotifyError {
    /// A bounded label for `errors_total{reason}`.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            Self::Signal { .. } | Self::SignalAll { .. } => Reason::Signal.into(),
            Self::ProcessNotFound { .. } => Reason::ProcessNotFound.into(),
            Self::Http { .. } | Self::HttpStatus { .. } | Self::HttpTimeout { .. } => Reason::Http.into(),
        }
    }
}

pub(super) struct Notifier {
    target: Target,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Notifier {
    pub(super) fn new(target: Target) -> Self {
        // Calls are minutes apart: a pooled connection would mostly be one the server has closed meanwhile.
        let client = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build_http();
        Self { target, client }
    }

    /// Tells the process once. `Ok(None)` when there is nobody to tell; `Ok(Some(what))` describes the delivery.
    pub(super) async fn notify(&self) -> Result<Option<String>, NotifyError> {
        match &self.target {
            Target::None => Ok(None),
            Target::Pid { pid, signal } => {
                kill(Pid::from_raw(*pid), *signal).map_err(|errno| NotifyError::Signal {
                    pid: *pid,
                    signal: *signal,
                    errno,
                })?;
                Ok(Some(self.target.to_string()))
            }
            Target::Process { name, signal } => signal_by_name(Path::new("/proc"), name, *signal).map(Some),
            Target::Http { uri, method, timeout } => self.call(uri, *method, *timeout).await.map(Some),
        }
    }

    async fn call(&self, uri: &Uri, method: NotifyMethod, timeout: Duration) -> Result<String, NotifyError> {
        let target = format!("{} {}", method.as_http(), redacted(uri));
        let request = http::Request::builder()
            .method(method.as_http())
            .uri(uri.clone())
            .header(http::header::USER_AGENT, concat!("ca-syncer/", env!("CARGO_PKG_VERSION")))
            .body(Empty::new())
            .map_err(|e| NotifyError::Http { target: target.clone(), message: e.to_string() })?;
        let response = match tokio::time::timeout(timeout, self.client.request(request)).await {
            Err(_) => return Err(NotifyError::HttpTimeout { target, timeout }),
            Ok(Err(e)) => return Err(NotifyError::Http { message: error_chain(&e), target }),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if !status.is_success() {
            return Err(NotifyError::HttpStatus { target, status });
        }
        Ok(format!("{target} ({status})"))
    }
}

/// An error and its causes on one line (hyper's top-level message alone says only "client error").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `scheme://host:port/path`, without user info and query.
fn redacted(uri: &Uri) -> String {
    let port = uri.port_u16().map(|p| format!(":{p}")).unwrap_or_default();
    format!("{}://{}{port}{}", uri.scheme_str().unwrap_or("http"), uri.host().unwrap_or_default(), uri.path())
}

/// Validates `--notify-url`: plain `http://` with a host (the call goes to a process in the same pod), no user
/// info. The error does not repeat the URL, which may carry a token.
pub(super) fn parse_notify_url(text: &str) -> Result<Uri, String> {
    let uri: Uri = text.trim().parse().map_err(|_| "not a valid URL".to_owned())?;
    if uri.scheme_str() != Some("http") {
        return Err("must be an http:// URL (the call stays inside the pod)".to_owned());
    }
    let Some(authority) = uri.authority() else {
        return Err("must name a host".to_owned());
    };
    if authority.as_str().contains('@') {
        return Err("must not carry credentials".to_owned());
    }
    Ok(uri)
}

/// Signals every process named `name` except those whose parent has the same name: a server's workers are its
/// master's business (nginx reloads its workers itself on SIGHUP to the master).
fn signal_by_name(proc: &Path, name: &str, signal: Signal) -> Result<String, NotifyError> {
    let own = i32::try_from(std::process::id()).unwrap_or(0);
    let pids = find_by_name(proc, name, own);
    if pids.is_empty() {
        return Err(NotifyError::ProcessNotFound { name: name.to_owned() });
    }
    let mut delivered = Vec::new();
    let mut failures = Vec::new();
    for pid in pids {
        match kill(Pid::from_raw(pid), signal) {
            Ok(()) => delivered.push(pid.to_string()),
            Err(errno) => failures.push(format!("pid {pid}: {errno}")),
        }
    }
    if delivered.is_empty() {
        return Err(NotifyError::SignalAll { name: name.to_owned(), signal, failures: failures.join(", ") });
    }
    if !failures.is_empty() {
        // One of several exited meanwhile, most likely; the others got it.
        tracing::warn!(name, failures = %failures.join(", "), "some processes could not be signalled");
    }
    Ok(format!("{signal} to processes named {name:?} (pid {})", delivered.join(", ")))
}

/// Pids of live processes in `proc` (a procfs) whose comm or argv[0] file name is `name`, topmost only,
/// sorted. `own` (the sidecar) is never included.
fn find_by_name(proc: &Path, name: &str, own: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir(proc) else { return Vec::new() };
    let mut found: Vec<(i32, i32)> = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if pid == own {
            continue;
        }
        // Any read may fail because the process just exited; it is then simply not a candidate.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        let Some(stat) = parse_stat(&stat) else { continue };
        if matches!(stat.state, 'Z' | 'X') {
            continue; // a zombie cannot reload anything
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if names_match(name, stat.comm, &cmdline) {
            found.push((pid, stat.ppid));
        }
    }
    let matching: HashSet<i32> = found.iter().map(|(pid, _)| *pid).collect();
    let mut pids: Vec<i32> =
        found.into_iter().filter(|(_, ppid)| !matching.contains(ppid)).map(|(pid, _)| pid).collect();
    pids.sort_unstable();
    pids
}

struct Stat<'a> {
    comm: &'a str,
    state: char,
    ppid: i32,
}

/// `/proc/<pid>/stat`: `pid (comm) state ppid ...`; comm may itself contain spaces and parentheses.
fn parse_stat(stat: &str) -> Option<Stat<'_>> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    let mut rest = stat.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some(Stat { comm, state, ppid })
}

/// The kernel's comm (the executable's file name, cut to 15 bytes), or the file name of argv[0] (which holds
/// long names whole and the name a launcher gave the process).
fn names_match(name: &str, comm: &str, cmdline: &[u8]) -> bool {
    if comm == name {
        return true;
    }
    let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
    let base = argv0.rsplit(|&b| b == b'/').next().unwrap_or_default();
    !base.is_empty() && base == name.as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_even_with_parentheses_and_spaces_in_comm() {
        let stat = parse_stat("4242 (my (odd) name) S 17 4242 4242 0 -1").expect("parses");
        assert_eq!(stat.comm, "my (odd) name");
        assert_eq!(stat.state, 'S');
        assert_eq!(stat.ppid, 17);
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn names_match_comm_or_argv0_file_name_only() {
        assert!(names_match("nginx", "nginx", b"nginx: master process /usr/sbin/nginx\0"));
        assert!(names_match("envoy", "wrapper", b"/usr/local/bin/envoy\0-c\0/etc/envoy.yaml\0"));
        assert!(names_match("a-very-long-process-name", "a-very-long-pro", b"/bin/a-very-long-process-name\0"));
        assert!(!names_match("nginx", "bash", b"bash\0-c\0nginx\0"));
        assert!(!names_match("ngin", "nginx", b"/usr/sbin/nginx\0"));
        assert!(!names_match("x", "bash", b""));
    }

    /// A procfs layout written to a temp dir, for states a test cannot produce on demand (a zombie with a given
    /// name); the lookup only reads `stat` and `cmdline`. The same lookup runs on the real /proc below and in
    /// tests/sidecar.rs.
    fn fake_proc(processes: &[(i32, &str, char, i32, &[u8])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for (pid, comm, state, ppid, cmdline) in processes {
            let p = dir.path().join(pid.to_string());
            std::fs::create_dir(&p).expect("mkdir");
            std::fs::write(p.join("stat"), format!("{pid} ({comm}) {state} {ppid} 1 1 0")).expect("stat");
            std::fs::write(p.join("cmdline"), cmdline).expect("cmdline");
        }
        std::fs::create_dir(dir.path().join("self")).expect("mkdir");
        dir
    }

    #[test]
    fn lookup_finds_topmost_live_processes_and_never_itself() {
        let proc = fake_proc(&[
            (1, "pause", 'S', 0, b"/pause\0"),
            (10, "nginx", 'S', 1, b"nginx: master process\0"),
            (11, "nginx", 'S', 10, b"nginx: worker process\0"),
            (12, "nginx", 'S', 10, b"nginx: worker process\0"),
            (20, "nginx", 'Z', 1, b""),
            (30, "ca-syncer", 'S', 1, b"/ca-syncer\0watch\0"),
            (40, "nginx", 'R', 1, b"nginx\0"),
        ]);
        assert_eq!(find_by_name(proc.path(), "nginx", 30), [10, 40]);
        assert_eq!(find_by_name(proc.path(), "ca-syncer", 30), Vec::<i32>::new());
        assert_eq!(find_by_name(proc.path(), "envoy", 30), Vec::<i32>::new());
    }

    #[test]
    fn lookup_on_the_real_proc_finds_the_topmost_process_of_a_real_tree() {
        use std::os::unix::process::CommandExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let name = format!("tree{}", std::process::id() % 100_000);
        let launcher = dir.path().join(&name);
        std::os::unix::fs::symlink("/bin/bash", &launcher).expect("symlink");
        // A parent named `name` with two children that carry the same name in argv[0], like nginx's workers.
        let script = format!("(exec -a {name} sleep 30) & (exec -a {name} sleep 30) & wait");
        // Its own process group, so the whole tree is killed at the end.
        let mut parent =
            std::process::Command::new(&launcher).args(["-c", &script]).process_group(0).spawn().expect("spawn");
        let parent_pid = i32::try_from(parent.id()).expect("pid");
        let own = i32::try_from(std::process::id()).expect("pid");
        let mut found = Vec::new();
        for _ in 0..100 {
            // Wait until both children have exec'd (each shows up under the name once it has).
            let all = std::fs::read_dir("/proc").expect("proc").flatten().filter(|e| {
                let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                cmdline.starts_with(format!("{name}\0").as_bytes())
            });
            if all.count() == 2 {
                found = find_by_name(Path::new("/proc"), &name, own);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(parent_pid), Signal::SIGKILL);
        let _ = parent.wait();
        assert_eq!(found, [parent_pid], "only the top of the tree is signalled");
    }

    #[test]
    fn notify_urls_must_be_plain_http_with_a_host_and_no_credentials() {
        assert!(parse_notify_url("http://127.0.0.1:9090/-/reload").is_ok());
        assert!(parse_notify_url("http://localhost/reload?token=abc").is_ok());
        for bad in ["https://127.0.0.1/reload", "/reload", "http://user:pw@127.0.0.1/reload", "not a url"] {
            let err = parse_notify_url(bad).expect_err(bad);
            assert!(!err.contains("pw") && !err.contains("127.0.0.1"), "{err}");
        }
    }

    #[test]
    fn targets_display_without_query_or_credentials() {
        let uri: Uri = "http://127.0.0.1:9090/-/reload?token=s3cret".parse().expect("uri");
        let target = Target::Http { uri, method: NotifyMethod::Post, timeout: Duration::from_secs(1) };
        assert_eq!(target.to_string(), "POST http://127.0.0.1:9090/-/reload");
        let signal = Target::Process { name: "nginx".into(), signal: Signal::SIGHUP };
        assert_eq!(signal.to_string(), "SIGHUP to processes named \"nginx\"");
    }
}
