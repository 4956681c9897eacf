//! Picking the member a snapshot streams from: one client per member URL (etcd-client balances when given
//! several, and a snapshot must come from exactly one), skipping members that do not answer, learners (their
//! data may lag) and members with a CORRUPT alarm of their own. Alarms are decided per member: etcd lists
//! every alarm of the cluster in each member's Status, so another member's alarm says nothing about this
//! one, and NOSPACE (the member refuses writes, serves reads) never stops a snapshot: it is when operators
//! compact and defragment, and a snapshot first is the safety net. A follower is preferred so the leader's
//! disk is spared the long read transaction.

use std::time::Duration;

use etcd_client::{AlarmAction, AlarmType, Client, ConnectOptions, GetOptions};

use crate::config::{Shard, TlsFiles};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Bounds every unary call (status, alarms, counting, HashKV on a large store).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The member chosen, with a client connected to it alone.
pub struct Chosen {
    pub client: Client,
    pub endpoint: String,
    pub id: u64,
    pub name: String,
    pub version: String,
    pub is_leader: bool,
}

/// An active alarm of the cluster, as the `alarms` metric names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alarm {
    Nospace,
    Corrupt,
}

impl Alarm {
    pub fn as_str(self) -> &'static str {
        match self {
            Alarm::Nospace => "nospace",
            Alarm::Corrupt => "corrupt",
        }
    }
}

/// The cluster's active alarms as one member lists them: `(member id, alarm)`.
pub type Alarms = Vec<(u64, Alarm)>;

#[derive(Debug, thiserror::Error)]
#[error("no healthy voting member among {} endpoint(s): {}", skipped.len(), skipped.join("; "))]
pub struct NoMember {
    /// One line per endpoint saying why it was skipped.
    pub skipped: Vec<String>,
}

pub async fn connect(endpoint: &str, tls: Option<&TlsFiles>) -> anyhow::Result<Client> {
    connect_with(endpoint, tls, ConnectOptions::new()).await
}

/// As [`connect`], every call marked as needing a leader: a member that has lost its leader (cut off from its
/// peers) refuses them at once, and ends its watches, rather than answering from what it alone holds.
pub async fn connect_led(endpoint: &str, tls: Option<&TlsFiles>) -> anyhow::Result<Client> {
    connect_with(endpoint, tls, ConnectOptions::new().with_require_leader(true)).await
}

async fn connect_with(endpoint: &str, tls: Option<&TlsFiles>, options: ConnectOptions) -> anyhow::Result<Client> {
    let mut options = options.with_connect_timeout(CONNECT_TIMEOUT);
    if let Some(tls) = tls {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| anyhow::anyhow!("reading a TLS file of the shard: {}", e.kind()))
        };
        let mut config =
            etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(read(&tls.ca_file)?));
        if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
            config = config.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
        }
        options = options.with_tls(config);
    }
    let client = tokio::time::timeout(CONNECT_TIMEOUT * 2, Client::connect([endpoint], Some(options)))
        .await
        .map_err(|_| anyhow::anyhow!("connecting timed out"))??;
    Ok(client)
}

/// The cluster's active alarms (NOSPACE, CORRUPT), as one member lists them for the whole cluster.
pub(crate) async fn alarms(client: &mut etcd_client::Client) -> anyhow::Result<Alarms> {
    let listed = bounded("alarm list", client.alarm(AlarmAction::Get, AlarmType::None, None)).await?;
    Ok(listed
        .alarms()
        .iter()
        .filter_map(|a| match a.alarm() {
            AlarmType::Nospace => Some((a.member_id(), Alarm::Nospace)),
            AlarmType::Corrupt => Some((a.member_id(), Alarm::Corrupt)),
            AlarmType::None => None,
        })
        .collect())
}

/// Disarms every NOSPACE alarm the member lists, as an operator would once space is freed: the number
/// disarmed. A snapshot taken while NOSPACE was raised carries the alarm in its database, and a member restored
/// from it refuses every write until it is disarmed.
pub(crate) async fn disarm_nospace(client: &mut etcd_client::Client) -> anyhow::Result<usize> {
    let mut disarmed = 0;
    for (member, alarm) in alarms(client).await? {
        if alarm == Alarm::Nospace {
            let mut options = etcd_client::AlarmOptions::new();
            options.with_member(member);
            bounded("alarm disarm", client.alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(options))).await?;
            disarmed += 1;
        }
    }
    Ok(disarmed)
}

async fn bounded<T>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> anyhow::Result<T> {
    within(CALL_TIMEOUT, what, f).await.map_err(anyhow::Error::msg)
}

/// `call` within `timeout`, its error as text (`<what> timed out after <timeout>` when it takes longer).
async fn within<T>(
    timeout: Duration,
    what: &str,
    call: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => Err(format!("{what} timed out after {timeout:?}")),
    }
}

/// Probes one member; the cluster's alarms it lists go to `seen` (the first member that lists them wins).
async fn probe(endpoint: &str, tls: Option<&TlsFiles>, seen: &mut Option<Alarms>) -> anyhow::Result<Chosen> {
    let mut client = connect(endpoint, tls).await?;
    let status = bounded("status", client.status()).await?;
    if status.is_learner() {
        anyhow::bail!("a learner");
    }
    let id = status.header().map(|h| h.member_id()).unwrap_or_default();
    let listed = alarms(&mut client).await?;
    seen.get_or_insert_with(|| listed.clone());
    let own: Vec<Alarm> = listed.iter().filter(|(member, _)| *member == id).map(|(_, alarm)| *alarm).collect();
    if own.contains(&Alarm::Corrupt) {
        anyhow::bail!("has a CORRUPT alarm");
    }
    if own.contains(&Alarm::Nospace) {
        tracing::warn!(endpoint, "the member has a NOSPACE alarm (it refuses writes); snapshotting it anyway");
    }
    let members = bounded("member list", client.member_list()).await?;
    let name = members.members().iter().find(|m| m.id() == id).map(|m| m.name().to_string()).unwrap_or_default();
    Ok(Chosen {
        client,
        endpoint: endpoint.to_string(),
        id,
        name,
        version: status.version().to_string(),
        is_leader: status.leader() == id,
    })
}

/// The member to stream from: the first healthy follower in configuration order, else a healthy leader;
/// with the cluster's alarms as the first member that answered listed them (`None`: none answered).
pub async fn choose(shard: &Shard) -> (Result<Chosen, NoMember>, Option<Alarms>) {
    let mut skipped = Vec::new();
    let mut leader = None;
    let mut seen = None;
    for (i, endpoint) in shard.endpoints.iter().enumerate() {
        match probe(endpoint, shard.tls.as_ref(), &mut seen).await {
            Ok(chosen) if chosen.is_leader && shard.endpoints.len() > 1 => {
                leader.get_or_insert(chosen);
            }
            Ok(chosen) => return (Ok(chosen), seen),
            Err(e) => {
                tracing::warn!(shard = shard.name, endpoint = i, error = %format!("{e:#}"), "member skipped");
                skipped.push(format!("endpoints[{i}]: {e:#}"));
            }
        }
    }
    (leader.ok_or(NoMember { skipped }), seen)
}

/// The member's current store revision.
pub async fn revision(client: &mut Client) -> anyhow::Result<i64> {
    let status = bounded("status", client.status()).await?;
    status.header().map(|h| h.revision()).ok_or_else(|| anyhow::anyhow!("status has no header"))
}

/// Keys at `revision` and `HashKV(revision)` with the compact revision it reports. The snapshot is proven by
/// its hashes whether or not HashKV answers (a compaction past `revision` during the stream makes it refuse):
/// then the hash is `None`, the compact revision -1 (unknown), and a drill reports HashKV "not comparable".
pub async fn fingerprint(client: &mut Client, revision: i64) -> anyhow::Result<(u64, Option<u32>, i64)> {
    let options = GetOptions::new().with_all_keys().with_count_only().with_revision(revision);
    let count = bounded("count keys", client.get("", Some(options))).await?.count();
    match bounded("HashKV", client.hash_kv(revision)).await {
        Ok(hash) => Ok((count.max(0) as u64, Some(hash.hash()), hash.compact_version())),
        Err(error) => {
            tracing::warn!(revision, error = %format!("{error:#}"), "HashKV not recorded; drills cannot compare it");
            Ok((count.max(0) as u64, None, -1))
        }
    }
}

/// Bounds each Status, alarm and member-list read (a member that takes longer is not healthy).
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What one member said, as health reads it and as defragmentation reads it right before deciding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    /// The endpoint as configured: the `member` label.
    pub endpoint: String,
    pub id: u64,
    pub db_size: i64,
    pub db_size_in_use: i64,
    /// `--quota-backend-bytes` (0: not reported).
    pub quota: i64,
    /// The leader this member names (0: none).
    pub leader: u64,
}

/// The Status of the member at `endpoint` (within [`READ_TIMEOUT`]) and a client connected to it alone, or
/// why not as text.
pub async fn status(shard: &Shard, endpoint: &str) -> Result<(etcd_client::Client, MemberStatus), String> {
    let mut client = connect(endpoint, shard.tls.as_ref()).await.map_err(|e| format!("{e:#}"))?;
    let status = read_within("status", client.status()).await?;
    let member = MemberStatus {
        endpoint: endpoint.to_string(),
        id: status.header().map(|h| h.member_id()).unwrap_or_default(),
        db_size: status.db_size(),
        db_size_in_use: status.raft_used_db_size(),
        quota: status.db_size_quota(),
        leader: status.leader(),
    };
    Ok((client, member))
}

/// Every configured member's Status (or why not, as text), and what `first` reads from the first member that
/// answers; a member that answers Status but not `first` counts as not answering.
pub async fn statuses<X>(
    shard: &Shard,
    mut first: impl AsyncFnMut(&mut etcd_client::Client) -> Result<X, String>,
) -> (Vec<(String, Result<MemberStatus, String>)>, Option<X>) {
    let (mut members, mut read) = (Vec::new(), None);
    for endpoint in &shard.endpoints {
        let answer = match status(shard, endpoint).await {
            Ok((mut client, seen)) if read.is_none() => first(&mut client).await.map(|x| {
                read = Some(x);
                seen
            }),
            answer => answer.map(|(_, seen)| seen),
        };
        members.push((endpoint.clone(), answer));
    }
    (members, read)
}

/// `call` within [`READ_TIMEOUT`], its error as text (`<what> timed out after 10s` when it takes longer).
pub async fn read_within<T>(
    what: &str,
    call: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    within(READ_TIMEOUT, what, call).await
}
