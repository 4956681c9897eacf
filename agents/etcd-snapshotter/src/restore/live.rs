//! Writing a restored point back into a running etcd: the whole keyspace of a live cluster replaced by the
//! keyspace of a source etcd (a throwaway member serving the point), through the etcd API alone. The live
//! cluster keeps its volumes, its members and its revision counter: every write of the replacement is a new
//! revision, so its clients never see a revision go back, and the history replaced is compacted away at the end.
//!
//! The first write deletes every key and puts a marker ([`MARKER_KEY`]) in one transaction, so from then on the
//! cluster says it is being replaced; the marker goes only once the copy is verified. A replacement that did not
//! finish (its process killed mid-copy) leaves the marker, and the next one names it ([`Copied::interrupted`]) and
//! starts over from an empty keyspace.

use std::collections::HashMap;
use std::ops::Range;

use anyhow::{Context, bail, ensure};
use etcd_client::{
    Client, CompactionOptions, Compare, CompareOp, DeleteOptions, GetOptions, KvClient, LeaseGrantOptions, PutOptions,
    Txn, TxnOp,
};
use sha2::{Digest, Sha256};

use crate::member::CALL_TIMEOUT;

/// The key that marks a live cluster whose keyspace is being replaced (outside kcp's `/registry` prefix).
pub const MARKER_KEY: &str = "/kcp-keeper.io/restore";

/// Keys asked for in one range request while paging: the page is halved while a response is too large to
/// decode (many large values in a row).
const PAGE_KEYS: i64 = 500;
/// The largest range response decoded: well above a full page of ordinary objects, bounded for memory.
const MAX_RESPONSE_BYTES: usize = 64 << 20;
/// Puts in one transaction: under etcd's `--max-txn-ops` (128 by default).
pub const MAX_TXN_PUTS: usize = 100;
/// Keys and values in one transaction: under etcd's `--max-request-bytes` (1.5 MiB by default) with room for
/// the request's framing and the marker it compares.
pub const MAX_TXN_BYTES: usize = 1 << 20;

/// What the marker says: which restore is replacing the keyspace, of which shard, to which point.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    /// The restore's id.
    pub restore: String,
    /// The shard whose etcd this is.
    pub shard: String,
    /// The point being restored (RFC 3339).
    pub at: String,
}

/// What a replacement did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// Keys copied (the marker not counted).
    pub keys: u64,
    /// Bytes of keys and values copied.
    pub bytes: u64,
    /// Leases granted in the live cluster, one for each distinct lease of the source's keys it still knew.
    pub leases: u64,
    /// Leases of the source's keys the source no longer knew (expired): their keys were put without a lease.
    pub unknown_leases: u64,
    /// The source's revision every read of it was at.
    pub source_revision: i64,
    /// The live cluster's revision once the marker was deleted, compacted at.
    pub live_revision: i64,
    /// The marker found before the replacement started: one left by a replacement that did not finish.
    pub interrupted: Option<Marker>,
}

impl Marker {
    /// The marker as a key's value holds it; one that does not parse still marks a replacement.
    pub fn from_value(value: &[u8]) -> Self {
        serde_json::from_slice(value).unwrap_or_else(|_| Self {
            restore: format!("of unreadable marker {:?}", String::from_utf8_lossy(value)),
            shard: String::new(),
            at: String::new(),
        })
    }

    /// `restore <id> (to <at>)`, for messages.
    pub fn describe(&self) -> String {
        if self.at.is_empty() {
            format!("restore {}", self.restore)
        } else {
            format!("restore {} (to {})", self.restore, self.at)
        }
    }
}

/// The marker left by a replacement that did not finish, if any.
pub async fn marker(live: &mut Client) -> anyhow::Result<Option<Marker>> {
    marker_at(live, None).await
}

/// The marker at `revision` (the current one when `None`): whether the keyspace was being replaced then.
pub async fn marker_at(live: &mut Client, revision: Option<i64>) -> anyhow::Result<Option<Marker>> {
    let options = revision.map(|r| GetOptions::new().with_revision(r));
    let response = bounded(live.get(MARKER_KEY, options)).await.context("reading the restore marker")?;
    match response.kvs().first() {
        None => Ok(None),
        Some(kv) => {
            let marker = serde_json::from_slice(kv.value())
                .with_context(|| format!("the restore marker at {MARKER_KEY} is not a marker"))?;
            Ok(Some(marker))
        }
    }
}

/// Replaces `live`'s keyspace with `source`'s at its current revision: every key deleted and the marker put in
/// one transaction, the source's keys copied in key order with leases of the same granted TTL, the copy verified
/// (count and sha256 of every key and value on each side), then the marker deleted and `live` compacted so the
/// replaced history cannot be read. A marker already there (a replacement that did not finish) is reported in
/// [`Copied::interrupted`] and replaced.
pub async fn replace_keyspace(source: &mut Client, live: &mut Client, marker: &Marker) -> anyhow::Result<Copied> {
    let ours = serde_json::to_vec(marker).context("encoding the restore marker")?;

    let header = bounded(source.get(MARKER_KEY, Some(GetOptions::new().with_count_only())))
        .await
        .context("reading the source's revision")?;
    let source_revision = header.header().map(|h| h.revision()).context("the source's answer has no header")?;

    let interrupted = self::marker(live).await.context("reading a marker left in the live cluster")?;

    let start = Txn::new().and_then(vec![
        TxnOp::delete("", Some(DeleteOptions::new().with_all_keys())),
        TxnOp::put(MARKER_KEY, ours.clone(), None),
    ]);
    bounded(live.txn(start)).await.context("deleting the live cluster's keys and putting the marker")?;

    let mut copied =
        Copied { keys: 0, bytes: 0, leases: 0, unknown_leases: 0, source_revision, live_revision: 0, interrupted };
    copy(source, live, &ours, &mut copied).await?;

    let (source_count, source_sha) =
        digest(source, Some(source_revision)).await.context("verifying: reading the source")?;
    let (live_count, live_sha) = digest(live, None).await.context("verifying: reading the live cluster")?;
    ensure!(
        source_count == live_count && source_sha == live_sha,
        "verifying: the live cluster holds {live_count} keys, the source {source_count} at revision {source_revision}, \
         and their keys and values differ"
    );

    let release = Txn::new()
        .when(vec![Compare::value(MARKER_KEY, CompareOp::Equal, ours)])
        .and_then(vec![TxnOp::delete(MARKER_KEY, None)]);
    let released = bounded(live.txn(release)).await.context("deleting the restore marker")?;
    ensure!(released.succeeded(), "deleting the restore marker: another restore's marker replaced ours");
    let live_revision =
        released.header().map(|h| h.revision()).context("deleting the restore marker: the answer has no header")?;
    bounded(live.compact(live_revision, Some(CompactionOptions::new().with_physical())))
        .await
        .with_context(|| format!("compacting the live cluster at revision {live_revision}"))?;
    copied.live_revision = live_revision;
    Ok(copied)
}

/// Copies every source key at `copied.source_revision` into `live`, page by page, each page's puts in
/// transactions under etcd's limits that apply only while the marker is still `ours` (two replacements never
/// interleave). The source's own marker, if it holds one, is not data and is left out.
async fn copy(source: &mut Client, live: &mut Client, ours: &[u8], copied: &mut Copied) -> anyhow::Result<()> {
    let mut reader = source.kv_client().max_decoding_message_size(MAX_RESPONSE_BYTES);
    // Source lease id to the live cluster's, `None` for one the source no longer knows.
    let mut leases: HashMap<i64, Option<i64>> = HashMap::new();
    let mut from = Vec::new();
    let mut limit = PAGE_KEYS;
    loop {
        let (kvs, more) = page(&mut reader, &from, copied.source_revision, &mut limit)
            .await
            .with_context(|| format!("copying: reading the source from {}", String::from_utf8_lossy(&from)))?;
        let Some(last) = kvs.last() else { break };
        from = [last.key(), b"\0"].concat();
        let kvs: Vec<_> = kvs.into_iter().filter(|kv| kv.key() != MARKER_KEY.as_bytes()).collect();
        for kv in &kvs {
            if kv.lease() != 0 && !leases.contains_key(&kv.lease()) {
                let granted = grant_like(source, live, kv.lease()).await?;
                match granted {
                    Some(_) => copied.leases += 1,
                    None => copied.unknown_leases += 1,
                }
                leases.insert(kv.lease(), granted);
            }
        }
        let sizes: Vec<usize> = kvs.iter().map(|kv| kv.key().len() + kv.value().len()).collect();
        for range in batches(&sizes, MAX_TXN_PUTS, MAX_TXN_BYTES) {
            let group = &kvs[range];
            let puts: Vec<TxnOp> = group
                .iter()
                .map(|kv| {
                    let lease = leases.get(&kv.lease()).copied().flatten();
                    TxnOp::put(kv.key(), kv.value(), lease.map(|id| PutOptions::new().with_lease(id)))
                })
                .collect();
            let txn = Txn::new().when(vec![Compare::value(MARKER_KEY, CompareOp::Equal, ours)]).and_then(puts);
            let first = String::from_utf8_lossy(group[0].key()).into_owned();
            let done = bounded(live.txn(txn))
                .await
                .with_context(|| format!("copying: writing {} keys from {first}", group.len()))?;
            if !done.succeeded() {
                bail!("copying: the restore marker is no longer ours (another restore started) before {first}");
            }
            copied.keys += group.len() as u64;
            copied.bytes += group.iter().map(|kv| (kv.key().len() + kv.value().len()) as u64).sum::<u64>();
        }
        if !more {
            break;
        }
    }
    Ok(())
}

/// Grants `live` a lease of the granted TTL the source states for `id` (at least a second): its new id, or
/// `None` when the source no longer knows the lease.
async fn grant_like(source: &mut Client, live: &mut Client, id: i64) -> anyhow::Result<Option<i64>> {
    let known = bounded(source.lease_time_to_live(id, None))
        .await
        .with_context(|| format!("copying: asking the source for lease {id:x}"))?;
    // etcd answers a lease it does not hold with a TTL of -1.
    if known.ttl() < 0 {
        tracing::warn!(lease = format!("{id:x}"), "a lease the source no longer holds: its keys are put without one");
        return Ok(None);
    }
    let ttl = known.granted_ttl().max(1);
    let granted = bounded(live.lease_grant(ttl, None::<LeaseGrantOptions>))
        .await
        .with_context(|| format!("copying: granting the live cluster a lease like {id:x}"))?;
    Ok(Some(granted.id()))
}

/// One page of keys from `from` at `revision`, whether more follow. A page too
/// large to decode is asked for again at half the keys, and `limit` stays halved.
async fn page(
    reader: &mut KvClient,
    from: &[u8],
    revision: i64,
    limit: &mut i64,
) -> anyhow::Result<(Vec<etcd_client::KeyValue>, bool)> {
    loop {
        let options = GetOptions::new().with_from_key().with_limit(*limit).with_revision(revision);
        let key = if from.is_empty() { vec![0] } else { from.to_vec() };
        match bounded(reader.get(key, Some(options))).await {
            Ok(mut response) => {
                let more = response.more();
                return Ok((response.take_kvs(), more));
            }
            Err(e) if *limit > 1 && too_large(&e) => *limit = (*limit / 2).max(1),
            Err(e) => return Err(e),
        }
    }
}

/// Whether a read failed because its answer was larger than the client decodes.
fn too_large(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<etcd_client::Error>(),
        Some(etcd_client::Error::GRpcStatus(status))
            if matches!(i32::from(status.code()), OUT_OF_RANGE | RESOURCE_EXHAUSTED)
    )
}

/// gRPC's codes for a message over the size a side accepts (tonic answers one too large to decode with the first).
const OUT_OF_RANGE: i32 = 11;
const RESOURCE_EXHAUSTED: i32 = 8;

/// The number of keys and a sha256 over every key and value in key order (each length-prefixed), the marker
/// left out: at `revision`, or the current revision when `None`.
async fn digest(client: &mut Client, revision: Option<i64>) -> anyhow::Result<(u64, String)> {
    let mut reader = client.kv_client().max_decoding_message_size(MAX_RESPONSE_BYTES);
    let revision = match revision {
        Some(revision) => revision,
        None => bounded(reader.get(MARKER_KEY, Some(GetOptions::new().with_count_only())))
            .await?
            .header()
            .map(|h| h.revision())
            .context("the answer has no header")?,
    };
    let (mut count, mut hasher, mut from, mut limit) = (0u64, Sha256::new(), Vec::new(), PAGE_KEYS);
    loop {
        let (kvs, more) = page(&mut reader, &from, revision, &mut limit).await?;
        let Some(last) = kvs.last() else { break };
        from = [last.key(), b"\0"].concat();
        for kv in kvs.iter().filter(|kv| kv.key() != MARKER_KEY.as_bytes()) {
            count += 1;
            for part in [kv.key(), kv.value()] {
                hasher.update((part.len() as u64).to_be_bytes());
                hasher.update(part);
            }
        }
        if !more {
            break;
        }
    }
    Ok((count, hex::encode(hasher.finalize())))
}

/// Splits puts of the given sizes (key and value bytes), in order, into consecutive batches of at most
/// `max_ops` puts and `max_bytes` bytes; a put larger than `max_bytes` goes alone.
pub fn batches(sizes: &[usize], max_ops: usize, max_bytes: usize) -> Vec<Range<usize>> {
    let (mut out, mut start, mut bytes) = (Vec::new(), 0, 0usize);
    for (i, &size) in sizes.iter().enumerate() {
        if i > start && (i - start == max_ops || bytes + size > max_bytes) {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

/// `call` within the crate's call timeout, its error kept as etcd's (to tell a page too large).
async fn bounded<T>(call: impl Future<Output = Result<T, etcd_client::Error>>) -> anyhow::Result<T> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(result) => Ok(result?),
        Err(_) => bail!("timed out after {CALL_TIMEOUT:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_stop_at_the_op_limit_and_the_byte_limit() {
        assert_eq!(batches(&[1; 250], 100, 1 << 20), vec![0..100, 100..200, 200..250]);
        // 400 KiB each: two fit under 1 MiB, a third would not.
        assert_eq!(batches(&[400 << 10; 5], 100, 1 << 20), vec![0..2, 2..4, 4..5]);
        // Exactly the byte limit fits.
        assert_eq!(batches(&[512 << 10, 512 << 10, 1], 100, 1 << 20), vec![0..2, 2..3]);
        assert!(batches(&[], 100, 1 << 20).is_empty());
    }

    #[test]
    fn a_put_over_the_byte_limit_goes_alone() {
        let sizes = [10, 0, (1 << 20) + (200 << 10), 0, 10];
        assert_eq!(batches(&sizes, 100, 1 << 20), vec![0..2, 2..3, 3..5]);
        assert_eq!(batches(&[(2 << 20), (2 << 20)], 100, 1 << 20), vec![0..1, 1..2]);
        // Every batch is under both limits unless it is one put alone.
        let sizes: Vec<usize> = (0..1000).map(|i| (i * 7919) % (300 << 10)).collect();
        for range in batches(&sizes, 100, 1 << 20) {
            assert!(range.len() <= 100);
            assert!(range.len() == 1 || sizes[range].iter().sum::<usize>() <= 1 << 20);
        }
    }
}
