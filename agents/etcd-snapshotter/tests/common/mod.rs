//! Helpers shared by the etcd-snapshotter tests: a real etcd and a real versitygw on loopback, configuration
//! files, running the binary as a process, reading the bucket.
#![allow(dead_code)]

pub mod proxy;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use anyhow::Result;
use testbed::agent_process::AgentUnderTest;
use testbed::{Etcd, S3Server};

pub const BINARY: &str = env!("CARGO_BIN_EXE_etcd-snapshotter");
pub const PREFIX: &str = "kcp/etcd";

/// Every process the tests start gets this: the SDK must never probe a cloud metadata endpoint (no test
/// traffic may leave 127.0.0.0/8), and static credentials alone already keep it from doing so.
pub const NO_METADATA: (&str, &str) = ("AWS_EC2_METADATA_DISABLED", "true");

/// `etcd-snapshotter run --config <config>` against `cluster`, its Lease in `namespace`, with the no-metadata
/// environment: the one builder every agent's tests use, for the identity, token and start to be added.
pub fn agent<'a>(cluster: &'a testbed::ControlPlane, config: &Path, namespace: &str) -> AgentUnderTest<'a> {
    AgentUnderTest::new(cluster, BINARY, config).namespace(namespace).env(NO_METADATA.0, NO_METADATA.1)
}

pub struct Bed {
    pub peers: peers::Peers,
    pub s3: S3Server,
    dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    /// A kube-apiserver, for the daemon (Lease, Events, ServiceAccount tokens).
    pub cluster: Option<testbed::ControlPlane>,
}

impl Bed {
    /// etcd and S3 only: enough for the one-shots.
    pub async fn start() -> Result<Self> {
        testbed::init_crypto();
        let peers = peers::locate()?;
        let tmp = tempfile::Builder::new().prefix("etcd-snapshotter-test-").tempdir()?;
        let s3 = S3Server::start(peers.path("versitygw"), tmp.path()).await?;
        Ok(Self { peers, s3, dir: tmp.path().into(), _tmp: Some(tmp), cluster: None })
    }

    /// With a kube-apiserver too, for the daemon.
    pub async fn with_cluster() -> Result<Self> {
        let cluster = testbed::ControlPlane::start().await?;
        let s3 = cluster.s3().await?;
        Ok(Self {
            peers: peers::locate()?,
            s3,
            dir: cluster.subdir("snapshotter")?,
            _tmp: None,
            cluster: Some(cluster),
        })
    }

    pub fn cluster(&self) -> &testbed::ControlPlane {
        self.cluster.as_ref().expect("started with_cluster")
    }

    /// An etcd under `name` in the bed with `--unsafe-no-fsync`: for the tests that claim what is stored, not how
    /// fast (docs/architecture.md, The test bed).
    pub async fn etcd(&self, name: &str, members: usize) -> Result<Etcd> {
        Etcd::start(self.peers.path("etcd"), &self.dir.join(name), name, members).await
    }

    /// An etcd under `name` in the bed with fsync on every commit, as production runs it: for the tests whose claim
    /// is a time etcd's commit latency is part of (a busy shard's snapshots, the deltas' recovery point). The bed is
    /// in the system temp directory, which must be on the real disk (the test bed warns when it is tmpfs).
    pub async fn etcd_fsync(&self, name: &str, members: usize) -> Result<Etcd> {
        Etcd::start_fsync(self.peers.path("etcd"), &self.dir.join(name), name, members).await
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Where drills make their temporary directories (a test checks it is empty afterwards).
    pub fn drills_dir(&self) -> PathBuf {
        self.path("drills")
    }

    /// versitygw's file for `key` (its posix backend stores each object as a plain file).
    pub fn s3_file(&self, key: &str) -> PathBuf {
        let data = match &self.cluster {
            None => self.path("s3-data"),
            // The control plane starts versitygw in a directory `s3-<random>` of its own.
            Some(cluster) => std::fs::read_dir(cluster.dir())
                .unwrap()
                .flatten()
                .map(|e| e.path().join("s3-data"))
                .find(|p| p.is_dir())
                .expect("versitygw's data directory"),
        };
        data.join(&self.s3.bucket).join(key)
    }

    /// Flips the middle byte of versitygw's file of `key` by `mask` (its ETag and metadata stay); flipping again
    /// with the same mask puts it right.
    pub fn flip_middle_byte(&self, key: &str, mask: u8) {
        let file = self.s3_file(key);
        let mut bytes = std::fs::read(&file).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= mask;
        std::fs::write(&file, bytes).unwrap();
    }

    /// Three members under `name` in the bed with fsync on, whose peers talk through a [`testbed::peer_net::PeerNet`]:
    /// any member can be cut off from its peers ([`Etcd::cut`]).
    pub async fn partitionable_etcd(&self, name: &str) -> Result<Etcd> {
        Etcd::start_partitionable(self.peers.path("etcd"), &self.dir.join(name), name).await
    }

    pub fn etcdutl(&self) -> &Path {
        self.peers.path("etcdutl")
    }

    /// The S3 keys as a mounted Secret would hold them.
    pub fn secret_dir(&self) -> Result<PathBuf> {
        let dir = self.path("s3-secret");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("AWS_ACCESS_KEY_ID"), &self.s3.access_key)?;
        std::fs::write(dir.join("AWS_SECRET_ACCESS_KEY"), &self.s3.secret_key)?;
        Ok(dir)
    }
}

/// What varies between test configurations.
pub struct Options<'a> {
    pub shards: Vec<(&'a str, Vec<String>)>,
    pub s3_endpoint: String,
    pub bucket: String,
    pub extra_storage: &'a str,
    pub compression: &'a str,
    pub recipients: Vec<String>,
    pub keep_last: usize,
    pub spill: &'a str,
    pub cron: &'a str,
    /// The `credentials:` block; a secret directory with the bed's keys when `None`.
    pub credentials: Option<&'a str>,
    /// Lines added to every shard entry (indented by 4), e.g. a `drill:` block.
    pub shard_extra: String,
    /// A top-level `drills:` block (without the key), e.g. the tools' paths.
    pub drills: Option<String>,
    /// Extra retention lines (indented by 2), e.g. `minVerified: 1`.
    pub retention_extra: &'a str,
    /// `storage.attemptTimeout`.
    pub attempt_timeout: &'a str,
    /// `storage.lockExpiry`.
    pub lock_expiry: &'a str,
    /// `deltaSigningKeyFile`, when set.
    pub delta_signing_key: Option<PathBuf>,
}

impl<'a> Options<'a> {
    pub fn new(bed: &Bed, shard: &'a str, endpoints: Vec<String>) -> Self {
        Self {
            shards: vec![(shard, endpoints)],
            s3_endpoint: bed.s3.endpoint.clone(),
            bucket: bed.s3.bucket.clone(),
            extra_storage: "",
            compression: "zstd",
            recipients: vec![],
            keep_last: 10,
            spill: "memoryBudget: 64Mi\n  partSize: 5Mi\n  partsInFlight: 2",
            cron: "0 0 1 1 *",
            credentials: None,
            shard_extra: String::new(),
            drills: None,
            retention_extra: "",
            attempt_timeout: "30s",
            lock_expiry: "2m",
            delta_signing_key: None,
        }
    }

    /// Deltas on every shard, flushed every `interval` (and at `max_bytes` when given): a `deltas:` block added
    /// to `shard_extra`.
    pub fn with_deltas(mut self, interval: &str, max_bytes: Option<&str>) -> Self {
        self.shard_extra.push_str(&format!("deltas:\n  enabled: true\n  interval: {interval}\n"));
        if let Some(max_bytes) = max_bytes {
            self.shard_extra.push_str(&format!("  maxBytes: {max_bytes}\n"));
        }
        self
    }

    /// Drills with the peers' etcd and etcdutl, temporary directories under the bed.
    pub fn with_drills(mut self, bed: &Bed) -> Self {
        self.drills = Some(format!(
            "  etcd: {}\n  etcdutl: {}\n  directory: {}\n  sampleKeys: 50\n",
            bed.peers.path("etcd").display(),
            bed.etcdutl().display(),
            bed.drills_dir().display()
        ));
        self
    }
}

/// Writes a configuration using the bed's S3 with credentials from a secret directory.
pub fn write_config(bed: &Bed, options: &Options) -> Result<PathBuf> {
    let mut text = String::from("shards:\n");
    for (name, endpoints) in &options.shards {
        text.push_str(&format!(
            "  - name: {name}\n    endpoints: [{}]\n    schedule:\n      cron: \"{}\"\n",
            endpoints.join(", "),
            options.cron
        ));
        for line in options.shard_extra.lines() {
            text.push_str(&format!("    {line}\n"));
        }
    }
    text.push_str(&format!(
        "storage:\n  bucket: {}\n  prefix: {PREFIX}\n  endpoint: {}\n  region: {}\n  pathStyle: true\n  maxAttempts: 2\n  attemptTimeout: {}\n  lockExpiry: {}\n  credentials:\n    {}\n{}",
        options.bucket,
        options.s3_endpoint,
        testbed::s3::REGION,
        options.attempt_timeout,
        options.lock_expiry,
        match options.credentials {
            Some(credentials) => credentials.to_string(),
            None => format!("secretDirectory: {}", bed.secret_dir()?.display()),
        },
        options.extra_storage
    ));
    text.push_str(&format!("compression: {}\n", options.compression));
    if !options.recipients.is_empty() {
        text.push_str(&format!("encryption:\n  ageRecipients: [{}]\n", options.recipients.join(", ")));
    }
    text.push_str(&format!("retention:\n  keepLast: {}\n", options.keep_last));
    for line in options.retention_extra.lines() {
        text.push_str(&format!("  {line}\n"));
    }
    if let Some(drills) = &options.drills {
        text.push_str(&format!("drills:\n{drills}"));
    }
    text.push_str(&format!("spill:\n  directory: {}\n  {}\n", bed.path("spill").display(), options.spill));
    if let Some(key) = &options.delta_signing_key {
        text.push_str(&format!("deltaSigningKeyFile: {}\n", key.display()));
    }
    let path = bed.path(&format!("config-{:08x}.yaml", rand_u32()));
    std::fs::write(&path, text)?;
    Ok(path)
}

pub fn rand_u32() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() ^ std::process::id()
}

/// Runs the binary to completion with the no-metadata environment.
pub fn cli(args: &[&str]) -> Output {
    std::process::Command::new(BINARY).args(args).env(NO_METADATA.0, NO_METADATA.1).output().expect("the binary runs")
}

/// The pids whose command line mentions `needle` (a drill's processes all run inside its directories), the agent's
/// own process left out (it names the configuration, never the drills directory).
pub fn processes_mentioning(needle: &str) -> Vec<(u32, String)> {
    let lines = testbed::process::command_lines().into_iter();
    lines.filter(|(_, cmd)| cmd.contains(needle) && !cmd.starts_with(BINARY)).collect()
}

/// Sends SIGTERM to a one-shot run and waits (up to 30 s) until it exits 1 saying it was interrupted: its output.
pub async fn sigterm_interrupts(mut child: std::process::Child) -> Output {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    testbed::eventually(Duration::from_secs(30), "the run to stop after SIGTERM", || {
        let exited = child.try_wait().unwrap().map(|_| ());
        async move { exited }
    })
    .await;
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("interrupted by SIGTERM"), "{}", text(&out));
    out
}

pub fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `etcd-snapshotter restore --config <config> --shard root <options>` into a one-member cluster `restored` at
/// `data_dir`, advertising `peer_url`.
pub fn restore_root(config: &Path, options: &[&str], data_dir: &Path, peer_url: &str) -> Output {
    let initial_cluster = format!("restored={peer_url}");
    let mut args = vec!["restore", "--config", config.to_str().unwrap(), "--shard", "root"];
    args.extend_from_slice(options);
    args.extend(["--name", "restored", "--initial-cluster", &initial_cluster]);
    args.extend(["--initial-advertise-peer-urls", peer_url, "--data-dir", data_dir.to_str().unwrap()]);
    cli(&args)
}

/// `etcd-snapshotter snapshot --config <config>`; panics unless it succeeds.
pub fn snapshot_ok(config: &Path) -> String {
    let out = cli(&["snapshot", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "snapshot failed: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Puts `count` keys under `prefix` with values of `size` pseudo-random (incompressible) bytes.
pub async fn load(client: &mut etcd_client::Client, prefix: &str, count: usize, size: usize) -> Result<()> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(rand_u32());
    for i in 0..count {
        let value: Vec<u8> = (0..size)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        client.put(format!("{prefix}/{i:06}"), value, None).await?;
    }
    Ok(())
}

/// Puts an object at `key` by hand, carrying the agent's `written-by` metadata when `as_ours`: the objects clean-up
/// and retention must tell apart from their own. Returns the key.
pub async fn put_by_hand(s3: &aws_sdk_s3::Client, bucket: &str, key: String, as_ours: bool) -> String {
    let mut request = s3.put_object().bucket(bucket).key(&key).body(b"by hand".to_vec().into());
    if as_ours {
        request = request.metadata("written-by", "etcd-snapshotter");
    }
    request.send().await.unwrap();
    key
}

/// The manifests in the bucket (published snapshots), as JSON. A manifest listed and then deleted before it is read
/// (retention running beside the test) is left out: the result is what the bucket holds when each key is read.
pub async fn manifests(s3: &aws_sdk_s3::Client, bucket: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for key in keys(s3, bucket).await {
        if key.ends_with("/manifest.json") {
            let object = match s3.get_object().bucket(bucket).key(&key).send().await {
                Ok(object) => object,
                Err(e) if e.as_service_error().is_some_and(|e| e.is_no_such_key()) => continue,
                Err(e) => panic!("reading {key}: {e:?}"),
            };
            let body = object.body.collect().await.unwrap();
            out.push(serde_json::from_slice(&body.into_bytes()).unwrap());
        }
    }
    out
}

/// Every key in the bucket (every page of the listing).
pub async fn keys(s3: &aws_sdk_s3::Client, bucket: &str) -> Vec<String> {
    let (mut out, mut token) = (Vec::new(), None);
    loop {
        let page = s3.list_objects_v2().bucket(bucket).set_continuation_token(token).send().await.unwrap();
        out.extend(page.contents().iter().filter_map(|o| o.key().map(str::to_string)));
        token = page.next_continuation_token().map(str::to_string);
        if token.is_none() {
            return out;
        }
    }
}

/// The newest revision the bucket holds of shard `root` under `prefix`: the newest delta's end under each
/// snapshot (its `delta-to`), or the snapshot's own (every page of the listing).
pub async fn stored_through(s3: &aws_sdk_s3::Client, bucket: &str, prefix: &str) -> i64 {
    let mut newest_per_snapshot: std::collections::BTreeMap<String, (u64, String)> = Default::default();
    let mut stored = 0i64;
    for key in keys(s3, bucket).await {
        if let Some((location, from)) = etcd_snapshotter::delta::location_of(prefix, "root", &key) {
            let entry = newest_per_snapshot.entry(location.id).or_insert((0, String::new()));
            if from >= entry.0 {
                *entry = (from, key);
            }
        } else if key.ends_with("manifest.json")
            && let Some(revision) = key.rsplit_once("-r").and_then(|(_, r)| r.split('/').next()?.parse::<i64>().ok())
        {
            stored = stored.max(revision);
        }
    }
    for (_, key) in newest_per_snapshot.values() {
        if let Ok(head) = s3.head_object().bucket(bucket).key(key).send().await
            && let Some(to) = head.metadata().and_then(|m| m.get("delta-to")).and_then(|t| t.parse::<i64>().ok())
        {
            stored = stored.max(to);
        }
    }
    stored
}

/// The second store's prefix: another than the primary's, as another provider's bucket would have.
pub const SECOND_PREFIX: &str = "offsite/etcd";

/// A second real S3 server (versitygw) with its own keys, and those keys as a mounted Secret would hold them.
pub struct SecondStore {
    pub s3: S3Server,
    pub secret_dir: PathBuf,
}

impl SecondStore {
    pub async fn start(bed: &Bed) -> Self {
        let dir = bed.path("second");
        std::fs::create_dir_all(&dir).unwrap();
        let s3 = S3Server::start(bed.peers.path("versitygw"), &dir).await.unwrap();
        let secret_dir = bed.path("second-secret");
        std::fs::create_dir_all(&secret_dir).unwrap();
        std::fs::write(secret_dir.join("AWS_ACCESS_KEY_ID"), &s3.access_key).unwrap();
        std::fs::write(secret_dir.join("AWS_SECRET_ACCESS_KEY"), &s3.secret_key).unwrap();
        Self { s3, secret_dir }
    }

    /// Appends a `secondary` section to `config` pointing at `endpoint` (this server or a proxy in front of it).
    pub fn configure(&self, config: &Path, endpoint: &str, keep_last: usize) {
        let mut text = std::fs::read_to_string(config).unwrap();
        text.push_str(&format!(
            "secondary:\n  interval: 1s\n  storage:\n    bucket: {}\n    prefix: {SECOND_PREFIX}\n    endpoint: {endpoint}\n    \
             region: {}\n    pathStyle: true\n    maxAttempts: 1\n    attemptTimeout: 5s\n    credentials:\n      \
             secretDirectory: {}\n  retention:\n    keepLast: {keep_last}\n",
            self.s3.bucket,
            testbed::s3::REGION,
            self.secret_dir.display()
        ));
        std::fs::write(config, text).unwrap();
    }
}

pub async fn uploads(s3: &aws_sdk_s3::Client, bucket: &str) -> Vec<String> {
    let out = s3.list_multipart_uploads().bucket(bucket).send().await.unwrap();
    out.uploads().iter().filter_map(|u| u.key().map(str::to_string)).collect()
}

/// The member's revision and the number of keys it serves.
pub async fn revision_and_keys(client: &mut etcd_client::Client) -> (i64, i64) {
    let options = etcd_client::GetOptions::new().with_all_keys().with_count_only();
    let response = client.get("", Some(options)).await.unwrap();
    (response.header().unwrap().revision(), response.count())
}

pub const WAIT: Duration = Duration::from_secs(60);

/// The WAL fsyncs the member at `client_url` has done and the seconds they took
/// (`etcd_disk_wal_fsync_duration_seconds`): a member with `--unsafe-no-fsync` does none after its start.
pub async fn wal_fsyncs(client_url: &str) -> (f64, f64) {
    let text = testbed::metrics::scrape(client_url).await;
    let series =
        |s: &str| testbed::metrics::value(&text, &format!("etcd_disk_wal_fsync_duration_seconds_{s} ")).unwrap();
    (series("count"), series("sum"))
}

/// A cron firing once a day, `seconds` from now: the first tick comes soon and the next one only tomorrow,
/// so a snapshot published today can only come from that first tick.
pub fn daily_cron_in(seconds: i64) -> String {
    let at = chrono::Utc::now() + chrono::Duration::seconds(seconds);
    use chrono::Timelike;
    format!("{} {} {} * * *", at.second(), at.minute(), at.hour())
}

/// A single-member etcd started on the data directory `restore` wrote (`extra` flags appended), serving on
/// `client_port`; logs to `<name>.log` in the bed.
pub fn start_restored(
    bed: &Bed,
    name: &str,
    data_dir: &Path,
    client_port: u16,
    peer_url: &str,
    extra: &[&str],
) -> testbed::process::Process {
    let client_url = format!("http://127.0.0.1:{client_port}");
    let mut args = vec![
        "--name=restored".to_string(),
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    testbed::process::Process::start(name, bed.peers.path("etcd"), args, bed.path(&format!("{name}.log"))).unwrap()
}

/// [`start_restored`], and a client once the member answers a status request.
pub async fn serve_restored(
    bed: &Bed,
    name: &str,
    data_dir: &Path,
    client_port: u16,
    peer_url: &str,
) -> (testbed::process::Process, etcd_client::Client) {
    let process = start_restored(bed, name, data_dir, client_port, peer_url, &[]);
    let client_url = format!("http://127.0.0.1:{client_port}");
    let client = testbed::eventually(WAIT, "the restored etcd serves", || {
        let url = client_url.clone();
        async move {
            let mut c = etcd_client::Client::connect([url], None).await.ok()?;
            c.status().await.ok()?;
            Some(c)
        }
    })
    .await;
    (process, client)
}

/// [`restore_root`] into a fresh data directory `name` in the bed on two free ports (run off the runtime's
/// workers), `check` given its output, then [`serve_restored`] on what it wrote.
pub async fn restore_and_serve(
    bed: &Bed,
    config: &Path,
    options: &[&str],
    name: &str,
    check: impl FnOnce(&Output),
) -> (Output, testbed::process::Process, etcd_client::Client) {
    let data_dir = bed.path(name);
    let (client_port, peer_port) = (testbed::process::free_port().unwrap(), testbed::process::free_port().unwrap());
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let (config, owned) = (config.to_path_buf(), options.iter().map(|o| o.to_string()).collect::<Vec<_>>());
    let (dir, url) = (data_dir.clone(), peer_url.clone());
    let out = tokio::task::spawn_blocking(move || {
        let options: Vec<&str> = owned.iter().map(String::as_str).collect();
        restore_root(&config, &options, &dir, &url)
    })
    .await
    .unwrap();
    check(&out);
    let (process, client) = serve_restored(bed, name, &data_dir, client_port, &peer_url).await;
    (out, process, client)
}

/// Raises or disarms etcd's NOSPACE alarm on the member `member` (or asks about it: [`etcd_client::AlarmAction::Get`]).
pub async fn nospace(
    client: &mut etcd_client::Client,
    member: u64,
    action: etcd_client::AlarmAction,
) -> Result<etcd_client::AlarmResponse, etcd_client::Error> {
    let mut options = etcd_client::AlarmOptions::new();
    options.with_member(member);
    client.alarm(action, etcd_client::AlarmType::Nospace, Some(options)).await
}

/// The acknowledged writes, as `(revision, when the answer came in Unix seconds)`, that a recovery point claiming
/// `claimed` vouches for though the bucket holds only up to revision `stored`: answered by then, past what is
/// stored. Any is a violation; the first comes first.
pub fn claimed_but_unstored(
    acks: impl IntoIterator<Item = (i64, f64)>,
    claimed: f64,
    stored: i64,
) -> impl Iterator<Item = (i64, f64)> {
    acks.into_iter().filter(move |(revision, at)| *at <= claimed && *revision > stored)
}

/// One acknowledged write of the load: its key, the revision etcd committed it at, when the ack arrived.
#[derive(Debug, Clone)]
pub struct Ack {
    pub key: String,
    pub revision: i64,
    pub at: Instant,
    /// The wall clock when the answer came (the agent's metrics speak in it).
    pub unix: f64,
}

/// A writer at a steady rate (one put every `every`) until stopped or etcd fails; the acks it got.
pub struct Load {
    acks: std::sync::Arc<std::sync::Mutex<Vec<Ack>>>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    pub fn start(mut client: etcd_client::Client, prefix: &'static str, every: Duration) -> Self {
        let acks = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = tokio_util::sync::CancellationToken::new();
        let (acks_in, stop_in) = (acks.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            for i in 0u64.. {
                tokio::select! {
                    () = stop_in.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let key = format!("{prefix}/{i:06}");
                // A long timeout: a put whose answer is given up on may still commit, unacknowledged, and the
                // restores compare the source's writes with the acknowledged ones exactly.
                let put = tokio::time::timeout(Duration::from_secs(60), client.put(key.clone(), vec![b'x'; 200], None));
                match put.await {
                    Ok(Ok(response)) => {
                        let revision = response.header().unwrap().revision();
                        let (at, unix) = (Instant::now(), kcp_keeper_runtime::metrics::unix_now());
                        acks_in.lock().unwrap().push(Ack { key, revision, at, unix });
                    }
                    // etcd is gone (the node-loss test): the load ends with it.
                    _ => return,
                }
            }
        });
        Self { acks, stop, task }
    }

    pub fn acked(&self) -> Vec<Ack> {
        self.acks.lock().unwrap().clone()
    }

    pub async fn finish(self) -> Vec<Ack> {
        self.stop.cancel();
        let _ = self.task.await;
        self.acks.lock().unwrap().clone()
    }

    /// Stops it and returns the source's revision then: read from etcd once no put is in flight, not taken
    /// from the last ack (a put whose answer was given up on may still have committed).
    pub async fn finish_at_source(self, client: &mut etcd_client::Client) -> i64 {
        let acks = self.finish().await;
        let revision = client.get("/registry/", None).await.unwrap().header().unwrap().revision();
        assert!(acks.last().is_none_or(|a| revision >= a.revision), "the revision never goes back");
        revision
    }
}
