//! `snapshot`: one shard etcd filled with kcp-shaped `/registry/...` objects to 256 MiB and then to 1 GiB. At
//! each size, rounds alternate (a) `etcdctl snapshot save` to a local file (etcd's own limit), (b) the same and
//! then the AWS CLI's upload to the same versitygw (what a CronJob does today), (c) `etcd-snapshotter snapshot`
//! with zstd, and with zstd plus age, (d) Gardener's `etcdbrctl snapshot` with its default gzip and (e) without
//! compression (what a user would install instead; see `etcdbr.rs`), all on the same etcd and the same versitygw.
//! Reports wall-time ratios against the floor (c/a), the CronJob (c/b) and the anchor (c/d, c/e), and each one's
//! peak resident memory (the agent's must not grow with the database). Every file and object a round makes is
//! deleted after it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use futures::StreamExt;
use serde_json::json;

use crate::common::{self, MIB, Report, Row, Run};

pub const SIZES_MIB: &[u64] = &[256, 1024];

pub async fn run(rounds: usize, quick: bool) -> Result<Report> {
    let peers = peers::locate()?;
    let aws = crate::awscli::ensure()?;
    // Under target/, not /tmp: the 1 GiB database, its snapshot file and the uploaded objects need the room.
    let work = tempfile::Builder::new().prefix("snapshot-").tempdir_in(crate::bench_dir())?;
    let etcd = testbed::Etcd::start(peers.path("etcd"), &work.path().join("etcd"), "shard", 1).await?;
    // The bench-only peer, built into the machine cache on first use (never by `cargo xtask test`).
    let etcdbrctl = peers::ensure_bench(&["etcdbrctl"])?;
    let s3 = crate::etcdbr::s3_with_versioning(peers.path("versitygw"), &work.path().join("s3")).await?;
    let url = etcd.client_urls();
    let snapshotter = common::agent_binary("etcd-snapshotter")?;
    let configs = Configs::write(work.path(), &url, &s3)?;
    let etcdbr_credentials = crate::etcdbr::credentials(work.path(), &s3)?;
    let etcdbr_temp = work.path().join("etcdbr-temp");
    let gardener = crate::etcdbr::Etcdbr {
        binary: etcdbrctl.path("etcdbrctl"),
        etcd_url: &url,
        s3: &s3,
        credentials: &etcdbr_credentials,
        temp: &etcdbr_temp,
    };
    let sizes: Vec<u64> = if quick { vec![SIZES_MIB[0]] } else { SIZES_MIB.to_vec() };

    let mut rows = Vec::new();
    let mut figures = Vec::new();
    let mut filler = Filler::new(&url).await?;
    for size in sizes {
        let fill = filler.fill_to(size * 1024 * 1024).await?;
        eprintln!(
            "snapshot: etcd at {:.0} MiB ({} keys) after {:.1}s of filling",
            fill.db_bytes as f64 / MIB,
            fill.keys,
            fill.seconds
        );
        let file = work.path().join("etcdctl.db");
        let (mut a, mut b, mut c, mut c_age) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut d_gzip, mut e_plain) = (Vec::new(), Vec::new());
        let (mut phases, mut phases_age) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            eprintln!("snapshot: {size} MiB round {}/{rounds}", round + 1);
            a.push(etcdctl_save(&peers, &url, &file)?);
            std::fs::remove_file(&file)?;

            let save = etcdctl_save(&peers, &url, &file)?;
            let key = format!("cronjob/{size}-{round}.db");
            let upload = common::run(
                Command::new(&aws)
                    .args(["s3", "cp", "--only-show-errors", "--endpoint-url", &s3.endpoint, "--region"])
                    .arg(testbed::s3::REGION)
                    .arg(&file)
                    .arg(format!("s3://{}/{key}", s3.bucket))
                    .env("AWS_ACCESS_KEY_ID", &s3.access_key)
                    .env("AWS_SECRET_ACCESS_KEY", &s3.secret_key)
                    .env("AWS_EC2_METADATA_DISABLED", "true")
                    .env("AWS_CONFIG_FILE", "/dev/null")
                    .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
                "aws s3 cp",
            )?;
            b.push(Run {
                seconds: save.seconds + upload.seconds,
                peak_bytes: save.peak_bytes.max(upload.peak_bytes),
                cpu_seconds: save.cpu_seconds + upload.cpu_seconds,
            });
            std::fs::remove_file(&file)?;
            s3.client().delete_object().bucket(&s3.bucket).key(&key).send().await?;

            c.push(snapshot(&snapshotter, &configs.zstd)?);
            phases.push(newest_phases(&s3).await?);
            c_age.push(snapshot(&snapshotter, &configs.zstd_age)?);
            phases_age.push(newest_phases(&s3).await?);

            for (compress, runs) in [(true, &mut d_gzip), (false, &mut e_plain)] {
                let prefix = format!("gardener/{size}-{round}-{}", if compress { "gzip" } else { "none" });
                runs.push(gardener.snapshot(&prefix, compress)?);
                let objects = crate::etcdbr::delete_prefix(&s3, &prefix).await?;
                anyhow::ensure!(objects > 0, "etcdbrctl said it saved a full snapshot, but {prefix} holds no object");
            }
        }
        let secs = |runs: &[Run]| common::median(&runs.iter().map(|r| r.seconds).collect::<Vec<_>>());
        let peak = |runs: &[Run]| common::max(&runs.iter().map(|r| r.peak_bytes as f64).collect::<Vec<_>>());
        let (ta, tb, tc, tca) = (secs(&a), secs(&b), secs(&c), secs(&c_age));
        let (td, te) = (secs(&d_gzip), secs(&e_plain));
        let label = format!("{size} MiB");
        rows.push(Row::new(format!("{label}: filling etcd ({} keys)", fill.keys), common::secs(fill.seconds)));
        rows.push(
            Row::new(format!("{label}: snapshot, zstd, vs etcdctl snapshot save (c/a)"), common::secs(tc))
                .baseline(common::secs(ta), tc / ta)
                .target(target(tc / ta, 1.15)),
        );
        rows.push(
            Row::new(format!("{label}: snapshot, zstd, vs etcdctl + aws s3 cp (c/b)"), common::secs(tc))
                .baseline(common::secs(tb), tc / tb)
                .target(target(tc / tb, 0.6)),
        );
        rows.push(
            Row::new(format!("{label}: snapshot, zstd+age, vs etcdctl snapshot save (c/a)"), common::secs(tca))
                .baseline(common::secs(ta), tca / ta)
                .target(target(tca / ta, 1.15)),
        );
        rows.push(
            Row::new(format!("{label}: snapshot, zstd+age, vs etcdctl + aws s3 cp (c/b)"), common::secs(tca))
                .baseline(common::secs(tb), tca / tb)
                .target(target(tca / tb, 0.6)),
        );
        rows.push(
            Row::new(
                format!("{label}: snapshot, zstd, vs Gardener etcdbrctl, gzip (its default) (c/d)"),
                common::secs(tc),
            )
            .baseline(common::secs(td), tc / td),
        );
        rows.push(
            Row::new(format!("{label}: snapshot, zstd, vs Gardener etcdbrctl, uncompressed (c/e)"), common::secs(tc))
                .baseline(common::secs(te), tc / te),
        );
        let agent_peak = peak(&c).max(peak(&c_age));
        rows.push(
            Row::new(
                format!("{label}: etcd-snapshotter peak RSS (zstd / zstd+age)"),
                format!("{:.1} / {:.1} MiB", peak(&c) / MIB, peak(&c_age) / MIB),
            )
            .baseline(format!("aws CLI {:.1} MiB", peak(&b) / MIB), agent_peak / peak(&b))
            .target(if agent_peak / MIB < 100.0 {
                "< 100 MiB".to_string()
            } else {
                format!("< 100 MiB: missed by {:.1} MiB", agent_peak / MIB - 100.0)
            }),
        );
        rows.push(
            Row::new(
                format!("{label}: peak RSS, etcd-snapshotter zstd vs etcdbrctl gzip / uncompressed"),
                common::mib(peak(&c) as u64),
            )
            .baseline(
                format!("{} / {}", common::mib(peak(&d_gzip) as u64), common::mib(peak(&e_plain) as u64)),
                peak(&c) / peak(&d_gzip),
            ),
        );
        rows.push(
            Row::new(
                format!("{label}: peak RSS, etcd-snapshotter zstd vs etcdctl snapshot save (floor)"),
                common::mib(peak(&c) as u64),
            )
            .baseline(common::mib(peak(&a) as u64), peak(&c) / peak(&a)),
        );
        let split = |phases: &[serde_json::Value], field: &str| {
            common::median(&phases.iter().filter_map(|p| p[field].as_f64()).collect::<Vec<_>>())
        };
        let cpu = |runs: &[Run]| common::median(&runs.iter().map(|r| r.cpu_seconds).collect::<Vec<_>>());
        rows.push(
            Row::new(format!("{label}: CPU time of the process, zstd (user + system)"), common::secs(cpu(&c)))
                .baseline(
                    format!(
                        "etcdctl {}, + aws {}; etcdbrctl gzip {}, uncompressed {}",
                        common::secs(cpu(&a)),
                        common::secs(cpu(&b)),
                        common::secs(cpu(&d_gzip)),
                        common::secs(cpu(&e_plain))
                    ),
                    cpu(&c) / cpu(&b),
                ),
        );
        rows.push(Row::new(
            format!("{label}: the agent's split, zstd (manifest): stream / whole run; object / database"),
            format!(
                "{} / {}; {:.0}%",
                common::secs(split(&phases, "stream")),
                common::secs(split(&phases, "total")),
                100.0 * split(&phases, "object_bytes") / split(&phases, "db_bytes")
            ),
        ));
        figures.push(json!({
            "target_mib": size, "db_size_bytes": fill.db_bytes, "keys": fill.keys, "fill_seconds": fill.seconds,
            "rounds": rounds,
            "a_etcdctl_save": Run::json(&a), "b_etcdctl_save_and_aws_cp": Run::json(&b),
            "c_snapshotter_zstd": Run::json(&c), "c_snapshotter_zstd_age": Run::json(&c_age),
            "d_etcdbrctl_gzip": Run::json(&d_gzip), "e_etcdbrctl_uncompressed": Run::json(&e_plain),
            "c_zstd_manifest_seconds": phases, "c_zstd_age_manifest_seconds": phases_age,
            "median_seconds": {"a": ta, "b": tb, "c_zstd": tc, "c_zstd_age": tca, "d_gzip": td, "e_uncompressed": te},
            "ratios": {"c_zstd/a": tc / ta, "c_zstd/b": tc / tb, "c_zstd_age/a": tca / ta, "c_zstd_age/b": tca / tb,
                "c_zstd/d_gzip": tc / td, "c_zstd/e_uncompressed": tc / te},
        }));
    }
    drop(filler);
    drop(etcd);
    drop(s3);
    // The data directories and objects go with the temp dir.
    work.close()?;
    Ok(Report { rows, json: json!({ "sizes": figures }) })
}

fn target(ratio: f64, at_most: f64) -> String {
    if ratio <= at_most {
        format!("<= {at_most}")
    } else {
        format!("<= {at_most}: missed by {:.0}%", (ratio / at_most - 1.0) * 100.0)
    }
}

/// The agent's own split of the run it just made, from the manifest it published (retention keeps one):
/// `stream_seconds` (etcd's stream read, encoded and uploaded part by part) and `total_seconds` (plus the
/// upload's completion, the size check and the key count and HashKV at the revision).
async fn newest_phases(s3: &testbed::S3Server) -> Result<serde_json::Value> {
    let client = s3.client();
    let listed = client.list_objects_v2().bucket(&s3.bucket).prefix("bench/").send().await?;
    let key = listed
        .contents()
        .iter()
        .filter_map(|o| o.key())
        .find(|k| k.ends_with("/manifest.json"))
        .context("no manifest after the agent's run")?
        .to_string();
    let body = client.get_object().bucket(&s3.bucket).key(&key).send().await?.body.collect().await?.into_bytes();
    let manifest: serde_json::Value = serde_json::from_slice(&body)?;
    Ok(json!({
        "stream": manifest["streamSeconds"], "total": manifest["totalSeconds"],
        "object_bytes": manifest["objectSizeBytes"], "db_bytes": manifest["dbSizeBytes"],
    }))
}

fn etcdctl_save(peers: &peers::Peers, url: &str, file: &Path) -> Result<Run> {
    common::run(
        Command::new(peers.path("etcdctl")).args(["--endpoints", url, "snapshot", "save"]).arg(file),
        "etcdctl snapshot save",
    )
}

fn snapshot(binary: &Path, config: &Path) -> Result<Run> {
    common::run(
        Command::new(binary)
            .args(["snapshot", "--config"])
            .arg(config)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("KCP_KEEPER_LOG_FORMAT", "plain"),
        "etcd-snapshotter snapshot",
    )
}

/// The agent's configurations: the same shard and bucket, zstd, and zstd plus an age recipient, with the spill
/// settings of the agent's example (64 MiB of parts in memory, 8 MiB parts, two in flight). Retention keeps only
/// the newest, so the bucket holds one object between rounds.
pub struct Configs {
    pub zstd: PathBuf,
    pub zstd_age: PathBuf,
}

impl Configs {
    pub fn write(dir: &Path, url: &str, s3: &testbed::S3Server) -> Result<Self> {
        let secrets = dir.join("s3-credentials");
        std::fs::create_dir_all(&secrets)?;
        std::fs::write(secrets.join("AWS_ACCESS_KEY_ID"), &s3.access_key)?;
        std::fs::write(secrets.join("AWS_SECRET_ACCESS_KEY"), &s3.secret_key)?;
        let base = format!(
            "shards:\n- name: bench\n  endpoints: [{url}]\n  schedule:\n    cron: \"0 0 * * * *\"\nstorage:\n  bucket: {}\n  \
             prefix: bench\n  endpoint: {}\n  region: {}\n  pathStyle: true\n  credentials:\n    secretDirectory: {}\n\
             compression: zstd\nretention:\n  keepLast: 1\nspill:\n  directory: {}\n  memoryBudget: 64Mi\n  \
             partSize: 8Mi\n  partsInFlight: 2\n",
            s3.bucket,
            s3.endpoint,
            testbed::s3::REGION,
            secrets.display(),
            dir.join("spill").display(),
        );
        let recipient = age::x25519::Identity::generate().to_public().to_string();
        let zstd = dir.join("zstd.yaml");
        std::fs::write(&zstd, &base)?;
        let zstd_age = dir.join("zstd-age.yaml");
        std::fs::write(&zstd_age, format!("{base}encryption:\n  ageRecipients: [{recipient}]\n"))?;
        Ok(Self { zstd, zstd_age })
    }
}

pub struct Fill {
    pub db_bytes: u64,
    pub keys: u64,
    pub seconds: f64,
}

/// Writes kcp-shaped objects into etcd with many puts in flight until its database reaches a size.
pub struct Filler {
    client: etcd_client::Client,
    next: u64,
    seconds: f64,
    rng: u64,
}

/// kcp keeps objects under `/registry/<group>/<resource>/<logical cluster>/<namespace>/<name>`.
const RESOURCES: &[(&str, &str, &str)] = &[
    ("core", "secrets", "Secret"),
    ("core", "configmaps", "ConfigMap"),
    ("apis.kcp.io", "apibindings", "APIBinding"),
    ("tenancy.kcp.io", "workspaces", "Workspace"),
    ("rbac.authorization.k8s.io", "rolebindings", "RoleBinding"),
];

impl Filler {
    pub async fn new(url: &str) -> Result<Self> {
        let client = etcd_client::Client::connect([url], None).await.context("connecting to the shard's etcd")?;
        Ok(Self { client, next: 0, seconds: 0.0, rng: 0x9e37_79b9_7f4a_7c15 })
    }

    /// Fills until the database is at least `bytes`; the time reported adds up over calls.
    pub async fn fill_to(&mut self, bytes: u64) -> Result<Fill> {
        let started = Instant::now();
        loop {
            let db = self.client.status().await?.db_size() as u64;
            if db >= bytes {
                self.seconds += started.elapsed().as_secs_f64();
                return Ok(Fill { db_bytes: db, keys: self.next, seconds: self.seconds });
            }
            // A batch of ~8 MiB between size checks, 64 puts in flight.
            let batch: Vec<(String, Vec<u8>)> = (0..1000).map(|_| self.object()).collect();
            let client = self.client.kv_client();
            let puts = futures::stream::iter(batch)
                .map(|(key, value)| {
                    let mut kv = client.clone();
                    async move { kv.put(key, value, None).await }
                })
                .buffer_unordered(64);
            let results: Vec<_> = puts.collect().await;
            for r in results {
                r.context("a put")?;
            }
        }
    }

    fn random(&mut self) -> u64 {
        // xorshift64*: fast, and good enough to keep zstd from finding repeats that real objects would not have.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// One object as kcp stores it: JSON metadata and a payload of 1 to 12 KiB (certificates, kubeconfigs and
    /// managed fields in real Secrets and bindings), base64 of random bytes.
    fn object(&mut self) -> (String, Vec<u8>) {
        use base64::Engine;
        let n = self.next;
        self.next += 1;
        let (group, resource, kind) = RESOURCES[(n % RESOURCES.len() as u64) as usize];
        let cluster = format!("{:016x}", self.random() % 512);
        let namespace = ["default", "kube-system", "railgrid", "tenant-a"][(n % 4) as usize];
        let name = format!("{}-{n:08}", resource.trim_end_matches('s'));
        let key = format!("/registry/{group}/{resource}/{cluster}/{namespace}/{name}");
        let len = 1024 + (self.random() % (11 * 1024)) as usize;
        let payload: Vec<u8> = (0..len.div_ceil(8)).flat_map(|_| self.random().to_le_bytes()).take(len).collect();
        let value = json!({
            "apiVersion": if group == "core" { "v1".to_string() } else { format!("{group}/v1alpha1") },
            "kind": kind,
            "metadata": {
                "name": name, "namespace": namespace, "uid": format!("{:016x}{:016x}", self.random(), self.random()),
                "resourceVersion": n.to_string(), "creationTimestamp": "2026-11-30T19:00:00Z",
                "annotations": {"kcp.io/cluster": cluster},
                "labels": {"app.kubernetes.io/managed-by": "railgrid"},
            },
            "data": {"payload": base64::engine::general_purpose::STANDARD.encode(&payload)},
        });
        (key, serde_json::to_vec(&value).expect("JSON"))
    }
}
