//! Getting a snapshot back: download to a local file while hashing (checked against the manifest's
//! `objectSha256`), decrypt and decompress into `snapshot.db` while checking etcd's trailing sha256 (and
//! that it is the manifest's `etcdSha256`), then `etcdutl snapshot status` for the structure and revision,
//! and for a restore `etcdutl snapshot restore` with `--bump-revision` and `--mark-compacted`.

pub mod live;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, ensure};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::encode::{self, Identity};
use crate::error::DrillError;
use crate::manifest::{Location, Manifest};
use crate::storage::Store;
use crate::throwaway::{self, RestoredMember, setup};
use crate::trailer::TrailerCheck;

/// A downloaded, proven etcd database file.
pub struct Fetched {
    pub db: PathBuf,
    pub manifest: Manifest,
}

/// Reads age identities from a file (`age-keygen` output).
pub fn read_identities(path: &Path) -> anyhow::Result<Vec<Identity>> {
    let file = age::IdentityFile::from_file(path.display().to_string())
        .with_context(|| format!("reading the identity file {}", path.display()))?;
    Ok(file.into_identities()?)
}

/// What a fetch measured, each hash recorded before it is compared (a drill's report keeps them when they
/// differ from the manifest's).
#[derive(Debug, Default)]
pub struct Hashes {
    pub object_sha256: Option<String>,
    pub etcd_sha256: Option<String>,
}

/// Downloads the snapshot of `manifest` into `dir` while hashing it, then decrypts and decompresses it into
/// `snapshot.db` while checking etcd's trailing sha256: the one download of every restore, verify, drill and
/// replay. Each hash is recorded in `hashes` before it is compared with the manifest's.
pub async fn fetch(
    store: &Store,
    manifest: Manifest,
    identities: Option<Vec<Identity>>,
    dir: &Path,
    hashes: &mut Hashes,
) -> Result<Fetched, DrillError> {
    let storage = |e: &dyn std::fmt::Display| DrillError::Storage(e.to_string());
    let location =
        Location::from_id(&store.prefix, &manifest.id).ok_or_else(|| DrillError::Setup("invalid id".into()))?;
    let encrypted = !manifest.encryption_recipients.is_empty();
    if encrypted && identities.is_none() {
        return Err(DrillError::Setup("the snapshot is encrypted with age: an identity file is needed".into()));
    }
    let object_path = dir.join("object");
    let mut body = store.get(&format!("{}{}", location.dir(), manifest.object)).await.map_err(|e| storage(&e))?;
    let mut file = tokio::fs::File::create(&object_path).await.map_err(|e| setup("creating the download", &e))?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    while let Some(chunk) = body.try_next().await.map_err(|e| storage(&e))? {
        hasher.update(&chunk);
        size += chunk.len() as u64;
        file.write_all(&chunk).await.map_err(|e| setup("writing the download", &e))?;
    }
    file.flush().await.map_err(|e| setup("writing the download", &e))?;
    drop(file);
    let object_sha256 = hex::encode(hasher.finalize());
    hashes.object_sha256 = Some(object_sha256.clone());
    if object_sha256 != manifest.object_sha256 || size != manifest.object_size_bytes {
        return Err(DrillError::ObjectHashMismatch(format!(
            "the stored object's sha256 is {object_sha256} ({size} bytes), the manifest's objectSha256 is {} ({} bytes)",
            manifest.object_sha256, manifest.object_size_bytes
        )));
    }

    let db = dir.join("snapshot.db");
    let (db_path, compression) = (db.clone(), manifest.compression.clone());
    let decoded = tokio::task::spawn_blocking(move || {
        let open =
            || -> std::io::Result<_> { Ok((std::fs::File::open(&object_path)?, std::fs::File::create(&db_path)?)) };
        let (input, output) = open().map_err(|e| DrillError::Setup(format!("opening the download: {}", e.kind())))?;
        let mut sink = CheckedFile { file: std::io::BufWriter::new(output), check: TrailerCheck::default() };
        let ids = identities.as_deref().filter(|_| encrypted);
        encode::decode(std::io::BufReader::new(input), &compression, ids, &mut sink)
            .map_err(|e| DrillError::Decode(format!("{e:#}")))?;
        sink.file.flush().map_err(|e| DrillError::Setup(format!("writing the database: {}", e.kind())))?;
        let _ = std::fs::remove_file(&object_path);
        Ok::<_, DrillError>(sink.check.finish())
    })
    .await
    .map_err(|e| DrillError::Setup(format!("decoding task: {e}")))??;
    let verified = decoded.map_err(|e| DrillError::EtcdHashMismatch(e.to_string()))?;
    let etcd_sha256 = hex::encode(verified.sha256);
    hashes.etcd_sha256 = Some(etcd_sha256.clone());
    if etcd_sha256 != manifest.etcd_sha256 || verified.total_bytes != manifest.db_size_bytes {
        return Err(DrillError::EtcdHashMismatch(format!(
            "the database's trailing sha256 is {etcd_sha256} ({} bytes), the manifest's etcdSha256 is {} ({} bytes)",
            verified.total_bytes, manifest.etcd_sha256, manifest.db_size_bytes
        )));
    }
    Ok(Fetched { db, manifest })
}

/// [`fetch`], then etcdutl reads the database's structure and its revision ([`check_structure`]): what
/// `verify` proves, and what `restore` proves before it restores.
pub async fn fetch_proven(
    store: &Store,
    manifest: Manifest,
    identities: Option<Vec<Identity>>,
    dir: &Path,
    etcdutl: &Path,
) -> anyhow::Result<(Fetched, Status)> {
    let fetched = fetch(store, manifest, identities, dir, &mut Hashes::default()).await?;
    let status = check_structure(etcdutl, &fetched)?;
    Ok((fetched, status))
}

pub(crate) struct CheckedFile {
    pub(crate) file: std::io::BufWriter<std::fs::File>,
    pub(crate) check: TrailerCheck,
}

impl Write for CheckedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.check.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// What `etcdutl snapshot status -w json` says about a database file.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub hash: u64,
    pub revision: i64,
    pub total_key: u64,
    pub total_size: u64,
}

pub fn etcdutl_status(etcdutl: &Path, db: &Path) -> anyhow::Result<Status> {
    let out = Command::new(etcdutl)
        .args(["snapshot", "status", "-w", "json"])
        .arg(db)
        .output()
        .with_context(|| format!("running {}", etcdutl.display()))?;
    ensure!(out.status.success(), "etcdutl snapshot status failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    let mut status: Status = serde_json::from_slice(&out.stdout).context("reading etcdutl's JSON")?;
    // A cluster never written to stores no revision (etcdutl reads 0), while it answers, and a member
    // restored from it serves, revision 1: the revision everything else compares with.
    if status.revision == 0 {
        status.revision = 1;
    }
    Ok(status)
}

/// Proves a fetched snapshot: both hashes (done by [`fetch`]), then etcdutl reads its structure and finds
/// a revision within the manifest's bounds (its exact revision).
pub fn check_structure(etcdutl: &Path, fetched: &Fetched) -> anyhow::Result<Status> {
    let status = etcdutl_status(etcdutl, &fetched.db)?;
    ensure!(
        status.revision >= 0 && fetched.manifest.holds_revision(status.revision as u64),
        "etcdutl reads revision {} in the database, the manifest says {}",
        status.revision,
        fetched.manifest.revision_bounds()
    );
    Ok(status)
}

/// The key and binaries that restoring a snapshot into a throwaway etcd takes (`drill`, `restore-installation`),
/// each one given here overriding the configuration's `drills` section.
#[derive(Debug, Clone, clap::Args)]
pub struct ToolFlags {
    /// age identity file for encrypted snapshots (default: the configuration's drills.identityFile).
    #[arg(long)]
    pub identity_file: Option<PathBuf>,
    /// etcdutl binary (default: the configuration's drills.etcdutl).
    #[arg(long, env = "ETCDUTL")]
    pub etcdutl: Option<PathBuf>,
    /// etcd binary for the throwaway member (default: the configuration's drills.etcd).
    #[arg(long, env = "ETCD")]
    pub etcd: Option<PathBuf>,
}

impl ToolFlags {
    /// The configuration's `drills` with what was given here instead.
    pub fn over(&self, drills: &crate::config::Drills) -> crate::config::Drills {
        let mut drills = drills.clone();
        drills.identity_file = self.identity_file.clone().or(drills.identity_file);
        drills.etcdutl = self.etcdutl.clone().unwrap_or(drills.etcdutl);
        drills.etcd = self.etcd.clone().unwrap_or(drills.etcd);
        drills
    }
}

/// The member flags of `etcdutl snapshot restore`.
#[derive(Debug, Clone, clap::Args)]
pub struct MemberFlags {
    /// This member's name (as in --initial-cluster).
    #[arg(long)]
    pub name: String,
    /// The new cluster's members: `name=peerURL,...` (one entry for a single member).
    #[arg(long)]
    pub initial_cluster: String,
    /// This member's peer URL.
    #[arg(long)]
    pub initial_advertise_peer_urls: String,
    /// A token new to this restore, so restored members never join the old cluster.
    #[arg(long, default_value = "etcd-restored")]
    pub initial_cluster_token: String,
    /// The data directory to create (must not exist).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Revisions to add, so watchers never see time run backwards (kcp and kube-apiserver watch caches).
    #[arg(long, default_value_t = 1_000_000_000)]
    pub bump_revision: u64,
}

/// Restores `db` as the member `flags` describe, with `--bump-revision` and `--mark-compacted`, into a data
/// directory that must not exist yet.
pub async fn restore_member(etcdutl: &Path, db: &Path, flags: &MemberFlags) -> anyhow::Result<()> {
    ensure!(
        !flags.data_dir.exists(),
        "the data directory {} exists; restore never overwrites",
        flags.data_dir.display()
    );
    let member = RestoredMember {
        name: &flags.name,
        initial_cluster: flags.initial_cluster.clone(),
        peer_url: &flags.initial_advertise_peer_urls,
        token: &flags.initial_cluster_token,
        data_dir: &flags.data_dir,
        bump_revision: Some(flags.bump_revision),
    };
    throwaway::etcdutl_restore(etcdutl, db, &member).await?;
    Ok(())
}

/// What to do after restoring one member of a 3-member shard.
pub fn next_steps(manifest: &Manifest, flags: &MemberFlags) -> String {
    let members = flags.initial_cluster.split(',').count();
    let mut text = format!(
        "restored snapshot {} (revision {}, {} keys, etcd {}) into {}\n\
         the restored revision is {} + {} (bumped) and everything below it is marked compacted\n\nnext steps:\n",
        manifest.id,
        manifest.revision,
        manifest.key_count,
        manifest.etcd_version,
        flags.data_dir.display(),
        manifest.revision,
        flags.bump_revision,
    );
    if members > 1 {
        text.push_str(&format!(
            "  1. stop every member of the old cluster ({members} members in --initial-cluster)\n\
             2. run this same restore (same snapshot id, same --initial-cluster and --initial-cluster-token) on each\n\
             \x20    other member with its own --name, --initial-advertise-peer-urls and --data-dir\n\
             3. start all {members} members on their restored data directories (the membership is in the data now;\n\
             \x20    etcd ignores --initial-cluster once a data directory exists)\n\
             4. check `etcdctl endpoint status --cluster` shows one leader and {members} members\n\
             5. restart the kcp shard (its watch caches must resync), then check its /readyz\n"
        ));
    } else {
        text.push_str(
            "  1. stop the old member\n  2. start etcd with this --data-dir and --name\n\
             \x20 3. restart the kcp shard (its watch caches must resync), then check its /readyz\n",
        );
    }
    text
}
