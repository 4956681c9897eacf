//! The `snapshot` benchmark's anchor: Gardener's etcd-backup-restore (`etcdbrctl snapshot`), what a user would
//! install instead of etcd-snapshotter. It is a server, not a one-shot: it takes a full snapshot at start and then
//! waits for its schedule, so a round runs it until it logs that the full snapshot is saved in the store
//! (`Total time to save Full snapshot`, written after the upload completed) and then kills it. Wall time is from
//! the start of the process to that line, as the agent's one-shot is timed from its start to its exit.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::common::{PeakWatch, Run, children_cpu_seconds};

/// What etcdbrctl logs once a full snapshot is in the store (pkg/etcdutil, `saveSnapshotToStore`).
const SAVED: &str = "Total time to save Full snapshot";

/// A versitygw for every snapshot command of the benchmark, started as the test bed starts it but with
/// `--versioning-dir`: etcdbrctl asks for the bucket's versioning at start, which versitygw's posix backend
/// answers only with a versioning directory (otherwise 501, and etcdbrctl exits). Versioning itself stays off.
pub async fn s3_with_versioning(versitygw: &Path, dir: &Path) -> Result<testbed::S3Server> {
    testbed::S3Server::start_with_versioning_dir(versitygw, dir).await
}

/// etcdbrctl's S3 credentials: a directory of one file per field, named by `AWS_APPLICATION_CREDENTIALS`.
pub fn credentials(dir: &Path, s3: &testbed::S3Server) -> Result<PathBuf> {
    let creds = dir.join("etcdbr-credentials");
    std::fs::create_dir_all(&creds)?;
    std::fs::write(creds.join("accessKeyID"), &s3.access_key)?;
    std::fs::write(creds.join("secretAccessKey"), &s3.secret_key)?;
    std::fs::write(creds.join("region"), testbed::s3::REGION)?;
    std::fs::write(creds.join("s3ForcePathStyle"), "true")?;
    Ok(creds)
}

pub struct Etcdbr<'a> {
    pub binary: &'a Path,
    pub etcd_url: &'a str,
    pub s3: &'a testbed::S3Server,
    pub credentials: &'a Path,
    /// Its `--snapstore-temp-directory`: it writes the whole snapshot there before uploading it.
    pub temp: &'a Path,
}

impl Etcdbr<'_> {
    /// One full snapshot under `prefix`, gzip (its default) or uncompressed; the objects stay for the caller to
    /// delete.
    pub fn snapshot(&self, prefix: &str, compress: bool) -> Result<Run> {
        std::fs::create_dir_all(self.temp)?;
        let mut cmd = Command::new(self.binary);
        cmd.arg("snapshot")
            .arg("--storage-provider=S3")
            .arg(format!("--store-container={}", self.s3.bucket))
            .arg(format!("--store-prefix={prefix}"))
            .arg(format!("--store-endpoint-override={}", self.s3.endpoint))
            .arg(format!("--endpoints={}", self.etcd_url))
            // Never due again while it runs: the full snapshot at start is the one measured.
            .arg("--schedule=0 0 1 1 *")
            .arg("--delta-snapshot-period=0s")
            .arg("--garbage-collection-period=0s")
            .arg(format!("--snapstore-temp-directory={}", self.temp.display()))
            .arg(format!("--compress-snapshots={compress}"))
            .env("AWS_APPLICATION_CREDENTIALS", self.credentials)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            // With AWS_CA_BUNDLE set its S3 client fails to start ("unable to add custom RootCAs HTTPClient").
            .env_remove("AWS_CA_BUNDLE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let cpu_before = children_cpu_seconds();
        let started = Instant::now();
        let mut child = cmd.spawn().context("starting etcdbrctl snapshot")?;
        let watch = PeakWatch::start(child.id());
        // logrus writes to stderr; stdout is drained so a full pipe cannot stall it.
        let stdout = child.stdout.take().context("etcdbrctl's stdout")?;
        let drain =
            std::thread::spawn(move || std::io::copy(&mut std::io::BufReader::new(stdout), &mut std::io::sink()));
        let stderr = child.stderr.take().context("etcdbrctl's stderr")?;
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut tail: Vec<String> = Vec::new();
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains(SAVED) {
                    let _ = tx.send(Ok(Instant::now()));
                }
                tail.push(line);
                if tail.len() > 40 {
                    tail.remove(0);
                }
            }
            // The process ended without saying the snapshot was saved (or after saying it; then this is ignored).
            let _ = tx.send(Err(tail.join("\n")));
        });
        let outcome = rx.recv_timeout(Duration::from_secs(900));
        let _ = child.kill();
        let status = child.wait()?;
        let cpu_seconds = children_cpu_seconds() - cpu_before;
        let peak_bytes = watch.finish();
        let _ = reader.join();
        let _ = drain.join();
        let saved = match outcome {
            Ok(Ok(at)) => at,
            Ok(Err(tail)) => {
                anyhow::bail!("etcdbrctl snapshot exited ({status}) before saving a full snapshot:\n{tail}")
            }
            Err(_) => anyhow::bail!("etcdbrctl snapshot saved no full snapshot within 900s"),
        };
        Ok(Run { seconds: saved.duration_since(started).as_secs_f64(), peak_bytes, cpu_seconds })
    }
}

/// Deletes every object under `prefix` (etcdbrctl's snapshot and whatever it keeps beside it).
pub async fn delete_prefix(s3: &testbed::S3Server, prefix: &str) -> Result<usize> {
    let client = s3.client();
    let listed = client.list_objects_v2().bucket(&s3.bucket).prefix(prefix).send().await?;
    let keys: Vec<String> = listed.contents().iter().filter_map(|o| o.key().map(str::to_string)).collect();
    for key in &keys {
        client.delete_object().bucket(&s3.bucket).key(key).send().await?;
    }
    Ok(keys.len())
}
