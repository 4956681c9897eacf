//! `ca-syncer watch` against real files and real processes: the watched directory is updated the way kubelet
//! updates a mounted Secret (`testbed::projection`), the process told about changes is a real child process
//! that counts the SIGHUPs it receives, the HTTP target is a real local server, and the restart test runs the
//! real binary. Nothing is mocked.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ca_syncer::bundle::{Bundle, BundleOptions};
use ca_syncer::certs::{EmptyPolicy, parse_certificates};
use ca_syncer::sidecar::{self, WatchArgs};
use clap::Parser;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use testbed::process::{Process, free_port};
use testbed::projection::project;
use tokio_util::sync::CancellationToken;

/// How long to keep watching after a change was applied, to prove that no second notification follows
/// (longer than the debounce, and several polls where the poll interval is short).
const SETTLE: Duration = Duration::from_millis(1200);
/// An upper bound only (waits end as soon as the condition holds): generous, because a loaded 2-core CI machine
/// has been seen to need more than 15 s for a projection, a debounce and a signal.
const TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------------------
// Test material

/// A self-signed CA and its key, made for the test (rcgen's default validity: 1975 to 4096).
struct TestCa {
    cert: String,
    key: String,
}

fn ca(cn: &str) -> TestCa {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(DnType::CommonName, cn);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).expect("self-signed");
    TestCa { cert: cert.pem(), key: key.serialize_pem() }
}

/// The bundle the sidecar must write for these PEM texts: deduplicated, ordered, byte-stable.
fn bundle_of(pems: &[&str]) -> Vec<u8> {
    let certs = pems.iter().flat_map(|p| parse_certificates(p.as_bytes(), EmptyPolicy::Reject).expect("test PEM"));
    let options = BundleOptions { drop_expired: true, now: time::OffsetDateTime::now_utc() };
    Bundle::build(certs, &options).render().into_bytes()
}

/// Projects `files` into `dir` the way kubelet updates a Secret volume (`..data` swap).
fn kubelet_update(dir: &Path, files: &[(&str, &str)]) {
    let files: BTreeMap<String, Vec<u8>> = files.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect();
    project(dir, &files).expect("projection");
}

/// A test's directories: the watched volume and the shared output volume, apart as in a pod.
struct Volumes {
    root: tempfile::TempDir,
    watched: PathBuf,
    output: PathBuf,
}

impl Volumes {
    fn new() -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let watched = root.path().join("secret");
        std::fs::create_dir(&watched).expect("mkdir");
        std::fs::create_dir(root.path().join("shared")).expect("mkdir");
        let output = root.path().join("shared").join("ca-bundle.pem");
        Self { root, watched, output }
    }

    fn output_bytes(&self) -> Option<Vec<u8>> {
        std::fs::read(&self.output).ok()
    }

    /// Names in the output's directory: only the output, never a leftover temp file.
    fn shared_dir_names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.output.parent().expect("parent"))
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

// ---------------------------------------------------------------------------------------------------------
// A real child process that counts SIGHUPs

/// `bash` running a script that appends a line to a file for every SIGHUP. Started through a symlink with a
/// unique name, so it can also be found by name in /proc. Killed on drop.
struct HupCounter {
    process: Process,
    count_file: PathBuf,
    name: String,
}

impl HupCounter {
    fn start(dir: &Path) -> Self {
        // A child inherits an ignored SIGHUP, and bash cannot trap a signal that was ignored when it started: under
        // `nohup cargo xtask test` every count stayed 0. A server in a pod starts with SIGHUP at its default, so
        // the counter does too (the test process takes the default; nothing sends it SIGHUP).
        // SAFETY: setting a signal's disposition to the default installs no handler.
        unsafe { nix::sys::signal::signal(nix::sys::signal::Signal::SIGHUP, nix::sys::signal::SigHandler::SigDfl) }
            .expect("SIGHUP to its default");
        // Longer than the kernel's 15-byte comm: found through argv[0], as a real server with a long name is.
        let name = format!("ca-syncer-test-hup-counter-{:08x}", rand_u32());
        let program = dir.join(&name);
        std::os::unix::fs::symlink("/bin/bash", &program).expect("symlink to bash");
        let script = dir.join("count-hups.sh");
        // `wait` on a background sleep returns as soon as a trapped signal arrives, so the trap runs at once;
        // the sleep is short so that nothing outlives the test by more than a second.
        std::fs::write(
            &script,
            r#"count_file="$1"
trap 'echo hup >> "$count_file"' HUP
trap 'exit 0' TERM
: > "$count_file.ready"
while :; do sleep 1 & wait $!; done
"#,
        )
        .expect("script");
        let count_file = dir.join(format!("{name}.hups"));
        let args = vec![script.display().to_string(), count_file.display().to_string()];
        let process = Process::start(&name, &program, args, dir.join(format!("{name}.log"))).expect("start");
        let ready = PathBuf::from(format!("{}.ready", count_file.display()));
        let deadline = Instant::now() + TIMEOUT;
        while !ready.exists() {
            assert!(Instant::now() < deadline, "the HUP counter did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Self { process, count_file, name }
    }

    fn pid(&self) -> u32 {
        self.process.pid().expect("running")
    }

    fn hups(&self) -> usize {
        std::fs::read_to_string(&self.count_file).map(|t| t.lines().count()).unwrap_or(0)
    }
}

fn rand_u32() -> u32 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos());
    nanos.unwrap_or(0) ^ std::process::id().rotate_left(16) ^ (NEXT.fetch_add(1, Ordering::SeqCst) as u32)
}

// ---------------------------------------------------------------------------------------------------------
// The sidecar, in-process

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    watch: WatchArgs,
}

/// `ca-syncer watch` running in this process (the same `run` the binary calls), with an admin port for
/// metrics and readiness. Stopped through its shutdown token.
struct Sidecar {
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    admin: String,
}

impl Sidecar {
    fn start(volumes: &Volumes, extra: &[String]) -> Self {
        Self::start_on(&volumes.watched, &volumes.output, extra)
    }

    fn start_on(watched: &Path, output: &Path, extra: &[String]) -> Self {
        let admin_addr = format!("127.0.0.1:{}", free_port().expect("free port"));
        let mut argv = vec![
            "watch".to_owned(),
            format!("--dir={}", watched.display()),
            format!("--output={}", output.display()),
            format!("--admin-addr={admin_addr}"),
        ];
        argv.extend(extra.iter().cloned());
        let args = Cli::try_parse_from(argv).expect("valid arguments").watch;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(sidecar::run(args, shutdown.clone()));
        Self { shutdown, task: Some(task), admin: format!("http://{admin_addr}") }
    }

    async fn stop(mut self) {
        self.shutdown.cancel();
        let task = self.task.take().expect("running");
        let result = tokio::time::timeout(TIMEOUT, task).await.expect("stops promptly").expect("no panic");
        result.expect("a clean exit");
    }

    /// The value of one series (`name` with its labels, as in the exposition), if exported.
    async fn metric(&self, series: &str) -> Option<f64> {
        let (status, _, body) = testbed::http::get(&format!("{}/metrics", self.admin)).await.ok()?;
        assert_eq!(status, 200);
        body.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    async fn wait_metric(&self, series: &str, expected: f64) {
        self.wait_metric_until(series, &format!("== {expected}"), |v| v == expected).await;
    }

    async fn wait_metric_until(&self, series: &str, what: &str, check: impl Fn(f64) -> bool) {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let value = self.metric(series).await;
            if value.is_some_and(&check) {
                return;
            }
            assert!(Instant::now() < deadline, "{series} is {value:?}, expected {what}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Waits until `check` holds, failing the test with `what` after [`TIMEOUT`].
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !check() {
        assert!(Instant::now() < deadline, "not within {TIMEOUT:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts that the output holds exactly `expected`. Compares without printing: a failure message must not
/// carry certificate bodies.
fn assert_output(volumes: &Volumes, expected: Option<&[u8]>, what: &str) {
    assert!(volumes.output_bytes().as_deref() == expected, "the output is not {what}");
}

/// Waits for `output` to hold exactly `expected`.
async fn wait_for_output(volumes: &Volumes, expected: &[u8], what: &str) {
    eventually(what, || volumes.output_bytes().as_deref() == Some(expected)).await;
}

// ---------------------------------------------------------------------------------------------------------
// 1. The happy path

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_style_update_writes_the_combined_bundle_atomically_and_sends_exactly_one_sighup() {
    let volumes = Volumes::new();
    let counter = HupCounter::start(volumes.root.path());
    let (a, b, c, d) = (ca("root-a"), ca("root-b"), ca("root-c"), ca("root-d"));
    kubelet_update(&volumes.watched, &[("ca.crt", &a.cert), ("tls.crt", &b.cert)]);

    // A reader that hammers the output while it is replaced: every read must be a complete bundle.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let partial = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (stop, reads, partial, output) = (stop.clone(), reads.clone(), partial.clone(), volumes.output.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if let Ok(bytes) = std::fs::read(&output) {
                    reads.fetch_add(1, Ordering::SeqCst);
                    let whole = parse_certificates(&bytes, EmptyPolicy::Reject)
                        .is_ok_and(|certs| bytes == bundle_of_certs(certs));
                    if !whole {
                        partial.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        })
    };

    let sidecar = Sidecar::start(&volumes, &[format!("--signal-pid={}", counter.pid()), "--poll-interval=1h".into()]);
    wait_for_output(&volumes, &bundle_of(&[&a.cert, &b.cert]), "the first bundle").await;
    sidecar.wait_metric("ca_syncer_sidecar_certificates", 2.0).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(counter.hups(), 0, "the first file, with no earlier output, is not announced");

    // Each kubelet update: the new combined bundle, then exactly one SIGHUP.
    let updates = [
        vec![("ca.crt", a.cert.clone()), ("tls.crt", c.cert.clone())],
        vec![("ca.crt", format!("{}{}", a.cert, d.cert)), ("tls.crt", c.cert.clone()), ("extra.crt", b.cert.clone())],
        vec![("ca.crt", d.cert.clone())],
    ];
    for (i, files) in updates.iter().enumerate() {
        let files: Vec<(&str, &str)> = files.iter().map(|(k, v)| (*k, v.as_str())).collect();
        kubelet_update(&volumes.watched, &files);
        let expected = bundle_of(&files.iter().map(|(_, v)| *v).collect::<Vec<_>>());
        wait_for_output(&volumes, &expected, &format!("update {}", i + 1)).await;
        eventually(&format!("SIGHUP for update {}", i + 1), || counter.hups() == i + 1).await;
        tokio::time::sleep(SETTLE).await;
        assert_eq!(counter.hups(), i + 1, "exactly one SIGHUP for update {}", i + 1);
    }
    assert_output(&volumes, Some(&bundle_of(&[&d.cert])), "the last update's bundle");

    stop.store(true, Ordering::SeqCst);
    reader.join().expect("reader");
    assert!(reads.load(Ordering::SeqCst) > 100, "the reader really raced the writes");
    assert_eq!(partial.load(Ordering::SeqCst), 0, "a reader saw a partial or foreign output");
    assert_eq!(volumes.shared_dir_names(), ["ca-bundle.pem"], "no temp file is left next to the output");
    assert_eq!(sidecar.metric("ca_syncer_sidecar_reloads_total").await, Some(3.0));
    assert_eq!(sidecar.metric("ca_syncer_sidecar_certificates").await, Some(1.0));
    assert!(sidecar.metric("ca_syncer_sidecar_last_write_timestamp_seconds").await.is_some_and(|t| t > 0.0));
    sidecar.stop().await;
}

fn bundle_of_certs(certs: Vec<ca_syncer::certs::Certificate>) -> Vec<u8> {
    let options = BundleOptions { drop_expired: true, now: time::OffsetDateTime::now_utc() };
    Bundle::build(certs, &options).render().into_bytes()
}

// ---------------------------------------------------------------------------------------------------------
// 2. Bad updates

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_update_keeps_the_last_good_file_byte_identical_and_signals_nothing_then_a_good_one_signals_once() {
    let volumes = Volumes::new();
    let counter = HupCounter::start(volumes.root.path());
    let (a, b) = (ca("root-a"), ca("root-b"));
    kubelet_update(&volumes.watched, &[("ca.crt", &a.cert)]);
    let sidecar = Sidecar::start(
        &volumes,
        &[format!("--signal-pid={}", counter.pid()), "--poll-interval=300ms".into(), "--key=ca.crt".into()],
    );
    let good = bundle_of(&[&a.cert]);
    wait_for_output(&volumes, &good, "the first bundle").await;
    let inode = std::fs::metadata(&volumes.output).expect("stat").ino();

    // A private key block appended to the key (what a wrong Secret would give), then plain garbage.
    let with_key = format!("{}{}", a.cert, a.key);
    for (bad, reason) in [(with_key.as_str(), "private_key"), ("this is not PEM at all\n", "text_outside_blocks")] {
        kubelet_update(&volumes.watched, &[("ca.crt", bad)]);
        sidecar.wait_metric(&format!("ca_syncer_sidecar_errors_total{{reason=\"{reason}\"}}"), 1.0).await;
        tokio::time::sleep(SETTLE).await;
        assert_output(&volumes, Some(&good), &format!("the last good bundle, kept after {reason}"));
        assert_eq!(std::fs::metadata(&volumes.output).expect("stat").ino(), inode, "not even rewritten");
        assert_eq!(counter.hups(), 0, "nothing is sent for a rejected update ({reason})");
    }
    // A bad input that stays is reported once, not on every poll.
    let errors = sidecar.metric("ca_syncer_sidecar_errors_total{reason=\"text_outside_blocks\"}").await;
    assert_eq!(errors, Some(1.0));

    kubelet_update(&volumes.watched, &[("ca.crt", &format!("{}{}", a.cert, b.cert))]);
    wait_for_output(&volumes, &bundle_of(&[&a.cert, &b.cert]), "the good update after the bad ones").await;
    eventually("one SIGHUP for the good update", || counter.hups() == 1).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(counter.hups(), 1);
    assert_eq!(sidecar.metric("ca_syncer_sidecar_reloads_total").await, Some(1.0));
    let output = String::from_utf8(volumes.output_bytes().expect("output")).expect("text");
    assert!(!output.contains("PRIVATE KEY"), "a key never reaches the output");
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cert_manager_secret_is_rejected_by_default_but_named_certificate_keys_are_combined() {
    // cert-manager's CA Secret: tls.crt, ca.crt and the CA's private key in tls.key.
    let volumes = Volumes::new();
    let (root, inter) = (ca("kcp-root"), ca("kcp-server-ca"));
    kubelet_update(&volumes.watched, &[("ca.crt", &root.cert), ("tls.crt", &inter.cert), ("tls.key", &inter.key)]);

    let every_key = Sidecar::start(&volumes, &["--poll-interval=1h".into()]);
    every_key.wait_metric("ca_syncer_sidecar_errors_total{reason=\"private_key\"}", 1.0).await;
    assert_output(&volumes, None, "absent: nothing is written from a Secret holding a key");
    let (status, _, _) = testbed::http::get(&format!("{}/readyz", every_key.admin)).await.expect("readyz");
    assert_eq!(status, 503, "not ready without a good bundle");
    every_key.stop().await;

    let named = Sidecar::start(&volumes, &["--poll-interval=1h".into(), "--key=ca.crt,tls.crt".into()]);
    wait_for_output(&volumes, &bundle_of(&[&root.cert, &inter.cert]), "the bundle of the named keys").await;
    // Ready is marked once the written bundle is accepted, a moment after the file is in place: wait for it.
    testbed::eventually(TIMEOUT, "ready once a good bundle is in place", || async {
        let (status, _, _) = testbed::http::get(&format!("{}/readyz", named.admin)).await.ok()?;
        (status == 200).then_some(())
    })
    .await;
    named.stop().await;
}

// ---------------------------------------------------------------------------------------------------------
// 3. The poll backstop

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_backstop_applies_a_change_that_produced_no_file_event() {
    let volumes = Volumes::new();
    let counter = HupCounter::start(volumes.root.path());
    let (a, b) = (ca("root-a"), ca("root-b"));
    kubelet_update(&volumes.watched, &[("ca.crt", &a.cert)]);
    let polling =
        Sidecar::start(&volumes, &[format!("--signal-pid={}", counter.pid()), "--poll-interval=300ms".into()]);
    // The control: same directory, events only (its poll is an hour away), its own output.
    let control_output = volumes.root.path().join("control").join("ca-bundle.pem");
    std::fs::create_dir(control_output.parent().expect("parent")).expect("mkdir");
    let control = Sidecar::start_on(&volumes.watched, &control_output, &["--poll-interval=1h".into()]);
    let first = bundle_of(&[&a.cert]);
    wait_for_output(&volumes, &first, "the first bundle").await;
    eventually("the control's first bundle", || std::fs::read(&control_output).ok().as_deref() == Some(&first[..]))
        .await;

    // Change the payload through a hard link outside the watched directory: the inode changes, but no event
    // reaches a watch on the directory (nor on the timestamped directory the payload really lives in).
    let payload = std::fs::canonicalize(volumes.watched.join("ca.crt")).expect("payload");
    let outside = volumes.root.path().join("outside-link");
    std::fs::hard_link(&payload, &outside).expect("hard link");
    std::fs::write(&outside, format!("{}{}", a.cert, b.cert)).expect("write through the link");

    let second = bundle_of(&[&a.cert, &b.cert]);
    wait_for_output(&volumes, &second, "the polled change").await;
    eventually("one SIGHUP for the polled change", || counter.hups() == 1).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(counter.hups(), 1, "exactly one SIGHUP, however many polls follow");
    assert!(
        std::fs::read(&control_output).ok().as_deref() == Some(&first[..]),
        "no file event announced the change: only the poll could find it"
    );
    control.stop().await;
    polling.stop().await;
}

// ---------------------------------------------------------------------------------------------------------
// 4. Other ways to tell the process

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_process_finds_the_child_by_name_and_signals_it_once() {
    let volumes = Volumes::new();
    let counter = HupCounter::start(volumes.root.path());
    let (a, b) = (ca("root-a"), ca("root-b"));
    kubelet_update(&volumes.watched, &[("ca.crt", &a.cert)]);
    let sidecar = Sidecar::start(&volumes, &[format!("--signal-process={}", counter.name), "--signal=HUP".into()]);
    wait_for_output(&volumes, &bundle_of(&[&a.cert]), "the first bundle").await;

    kubelet_update(&volumes.watched, &[("ca.crt", &b.cert)]);
    wait_for_output(&volumes, &bundle_of(&[&b.cert]), "the update").await;
    eventually("a SIGHUP to the process found by name", || counter.hups() == 1).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(counter.hups(), 1);
    assert_eq!(sidecar.metric("ca_syncer_sidecar_reloads_total").await, Some(1.0));
    sidecar.stop().await;
}

/// A plain-HTTP server on loopback that records each request (`METHOD path?query`) and answers with the next
/// status of `statuses` (200 once they are used up).
struct ReloadServer {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ReloadServer {
    async fn start(statuses: Vec<u16>) -> Self {
        use hyper::body::Incoming;
        use hyper_util::rt::TokioIo;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let statuses = Arc::new(Mutex::new(statuses.into_iter()));
        let recorded = requests.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (recorded, statuses) = (recorded.clone(), statuses.clone());
                let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                    let line = format!("{} {}", req.method(), req.uri());
                    recorded.lock().expect("lock").push(line);
                    let status = statuses.lock().expect("lock").next().unwrap_or(200);
                    async move {
                        let mut response = hyper::Response::new(http_body_util::Empty::<hyper::body::Bytes>::new());
                        *response.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
                        Ok::<_, std::convert::Infallible>(response)
                    }
                });
                tokio::spawn(async move {
                    let io = TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        Self { url, requests, task }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("lock").clone()
    }
}

impl Drop for ReloadServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_url_calls_a_real_local_http_server_once_per_change() {
    let volumes = Volumes::new();
    let server = ReloadServer::start(vec![]).await;
    let (a, b) = (ca("root-a"), ca("root-b"));
    kubelet_update(&volumes.watched, &[("ca.crt", &a.cert)]);
    let sidecar = Sidecar::start(
        &volumes,
        &[format!("--notify-url={}/-/reload?token=t0ken", server.url), "--poll-interval=300ms".into()],
    );
    wait_for_output(&volumes, &bundle_of(&[&a.cert]), "the first bundle").await;
    tokio::time::sleep(SETTLE).await;
    assert!(server.requests().is_empty(), "the first file is not announced");

    kubelet_update(&volumes.watched, &[("ca.crt", &b.cert)]);
    wait_for_output(&volumes, &bundle_of(&[&b.cert]), "the update").await;
    eventually("one reload call", || server.requests().len() == 1).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(server.requests(), ["POST /-/reload?token=t0ken"]);
    assert_eq!(sidecar.metric("ca_syncer_sidecar_reloads_total").await, Some(1.0));
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_http_notification_is_counted_and_retried_on_the_next_poll_until_delivered() {
    let volumes = Volumes::new();
    // The process's reload endpoint fails twice (e.g. still starting), then works.
    let server = ReloadServer::start(vec![503, 500]).await;
    let (a, b) = (ca("root-a"), ca("root-b"));
    kubelet_update(&volumes.watched, &[("ca.crt", &a.cert)]);
    let sidecar = Sidecar::start(
        &volumes,
        &[format!("--notify-url={}/reload", server.url), "--notify-method=get".into(), "--poll-interval=300ms".into()],
    );
    wait_for_output(&volumes, &bundle_of(&[&a.cert]), "the first bundle").await;

    kubelet_update(&volumes.watched, &[("ca.crt", &b.cert)]);
    wait_for_output(&volumes, &bundle_of(&[&b.cert]), "the update, written although the call fails").await;
    sidecar.wait_metric("ca_syncer_sidecar_reloads_total", 1.0).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(server.requests(), ["GET /reload", "GET /reload", "GET /reload"], "retried until delivered, then quiet");
    assert_eq!(sidecar.metric("ca_syncer_sidecar_errors_total{reason=\"http\"}").await, Some(2.0));
    assert_eq!(sidecar.metric("ca_syncer_sidecar_reloads_total").await, Some(1.0));
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_to_a_process_that_is_gone_is_counted_and_the_sidecar_keeps_working() {
    let volumes = Volumes::new();
    let mut counter = HupCounter::start(volumes.root.path());
    let gone = counter.pid();
    counter.process.kill();
    let (a, b) = (ca("root-a"), ca("root-b"));
    kubelet_update(&volumes.watched, &[("ca.crt", &a.cert)]);
    let sidecar = Sidecar::start(&volumes, &[format!("--signal-pid={gone}"), "--poll-interval=300ms".into()]);
    wait_for_output(&volumes, &bundle_of(&[&a.cert]), "the first bundle").await;

    kubelet_update(&volumes.watched, &[("ca.crt", &b.cert)]);
    wait_for_output(&volumes, &bundle_of(&[&b.cert]), "the update").await;
    // Retried on each poll: the counter grows while the sidecar carries on.
    sidecar.wait_metric_until("ca_syncer_sidecar_errors_total{reason=\"signal\"}", ">= 2", |v| v >= 2.0).await;
    assert_eq!(sidecar.metric("ca_syncer_sidecar_reloads_total").await, Some(0.0));
    kubelet_update(&volumes.watched, &[("ca.crt", &a.cert)]);
    wait_for_output(&volumes, &bundle_of(&[&a.cert]), "a later update").await;
    sidecar.stop().await;
}

// ---------------------------------------------------------------------------------------------------------
// 5. Restarts, with the real binary

/// The real `ca-syncer watch` binary, configured through its environment variables as the chart does.
struct WatchProcess {
    process: Process,
    admin: String,
}

impl WatchProcess {
    fn start(volumes: &Volumes, run: &str, hup_pid: u32) -> Self {
        let admin_addr = format!("127.0.0.1:{}", free_port().expect("free port"));
        let (dir, output, pid) =
            (volumes.watched.display().to_string(), volumes.output.display().to_string(), hup_pid.to_string());
        let env = [
            ("CA_SYNCER_WATCH_DIR", dir.as_str()),
            ("CA_SYNCER_WATCH_OUTPUT", output.as_str()),
            ("CA_SYNCER_WATCH_KEY", "ca.crt,extra.crt"),
            ("CA_SYNCER_WATCH_SIGNAL_PID", pid.as_str()),
            ("CA_SYNCER_WATCH_POLL_INTERVAL", "1h"),
            ("CA_SYNCER_WATCH_ADMIN_ADDR", admin_addr.as_str()),
            ("CA_SYNCER_WATCH_LOG_FORMAT", "json"),
            ("CA_SYNCER_WATCH_LOG_LEVEL", "debug"),
        ];
        let log = volumes.root.path().join(format!("watch-{run}.log"));
        let binary = Path::new(env!("CARGO_BIN_EXE_ca-syncer"));
        let process =
            Process::start_with_env(&format!("ca-syncer watch ({run})"), binary, vec!["watch".into()], &env, log)
                .expect("start");
        Self { process, admin: format!("http://{admin_addr}") }
    }

    /// Waits until `path` on the admin port answers 2xx with a body containing `needle`.
    async fn wait_for(&mut self, path: &str, needle: &str) {
        let url = format!("{}{path}", self.admin);
        testbed::process::wait_until(&mut self.process, TIMEOUT, needle, || {
            let (url, needle) = (url.clone(), needle.to_owned());
            async move {
                let (status, _, body) = testbed::http::get(&url).await?;
                anyhow::ensure!(status == 200 && body.contains(&needle), "{status}");
                Ok(())
            }
        })
        .await
        .expect("admin endpoint");
    }

    async fn wait_ready(&mut self) {
        self.wait_for("/readyz", "ok").await;
    }

    /// SIGTERM: must exit 0 promptly. Returns everything it logged.
    fn terminate(mut self) -> String {
        let status = self.process.signal_and_wait(nix::sys::signal::Signal::SIGTERM, TIMEOUT);
        assert!(status.is_some_and(|s| s.success()), "exit after SIGTERM: {status:?}\n{}", self.process.log_tail());
        self.process.log()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_identical_inputs_sends_no_signal_and_a_restart_after_a_change_sends_one() {
    let volumes = Volumes::new();
    let counter = HupCounter::start(volumes.root.path());
    let (a, b, c) = (ca("root-a"), ca("root-b"), ca("root-c"));
    kubelet_update(&volumes.watched, &[("ca.crt", &a.cert), ("extra.crt", &b.cert)]);
    let first_bundle = bundle_of(&[&a.cert, &b.cert]);
    let mut logs = String::new();

    let mut first = WatchProcess::start(&volumes, "first", counter.pid());
    first.wait_ready().await;
    assert_output(&volumes, Some(&first_bundle), "written once ready");
    logs += &first.terminate();
    let inode = std::fs::metadata(&volumes.output).expect("stat").ino();

    // The same inputs: the output is left alone (same inode: not even rewritten) and nothing is sent.
    let mut second = WatchProcess::start(&volumes, "second", counter.pid());
    second.wait_ready().await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(std::fs::metadata(&volumes.output).expect("stat").ino(), inode, "identical output is not rewritten");
    assert_eq!(counter.hups(), 0, "a restart with identical inputs sends no signal");
    let metrics = testbed::http::get(&format!("{}/metrics", second.admin)).await.expect("metrics").2;
    assert!(metrics.contains("ca_syncer_sidecar_reloads_total 0"), "{metrics}");
    logs += &second.terminate();

    // While the sidecar is down, the Secret changes, once wrongly (a private key slips in) and then for real.
    kubelet_update(&volumes.watched, &[("ca.crt", &format!("{}{}", a.cert, a.key)), ("extra.crt", &b.cert)]);
    let mut third = WatchProcess::start(&volumes, "third", counter.pid());
    third.wait_for("/metrics", "ca_syncer_sidecar_errors_total{reason=\"private_key\"} 1").await;
    assert_output(&volumes, Some(&first_bundle), "the last good bundle");
    kubelet_update(&volumes.watched, &[("ca.crt", &a.cert), ("extra.crt", &c.cert)]);
    wait_for_output(&volumes, &bundle_of(&[&a.cert, &c.cert]), "the changed bundle").await;
    eventually("one SIGHUP for the change", || counter.hups() == 1).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(counter.hups(), 1);
    logs += &third.terminate();

    // A restart finding an output that differs from its inputs tells the process, once.
    kubelet_update(&volumes.watched, &[("ca.crt", &c.cert), ("extra.crt", &b.cert)]);
    let mut fourth = WatchProcess::start(&volumes, "fourth", counter.pid());
    fourth.wait_ready().await;
    assert_output(&volumes, Some(&bundle_of(&[&b.cert, &c.cert])), "the changed bundle");
    eventually("one SIGHUP after a restart onto changed inputs", || counter.hups() == 2).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(counter.hups(), 2);
    logs += &fourth.terminate();

    assert!(logs.contains("private_key"), "the rejection is logged with its reason");
    assert!(logs.contains(r#"key \"ca.crt\""#), "the rejection names the key");
    testbed::assert_no_secret_material(&logs, &[&a.key, &a.cert, &b.cert, &c.cert]);
}
