//! The drill's chain level: the drilled snapshot's deltas replayed into its throwaway etcd (each proven as
//! `restore --at` proves it: hash, link, header), then the replayed member compared, at the end revision of
//! the newest delta that carries one, with what the live member reported there when that delta was written
//! ([`Live`]): the key count, and `HashKV`. HashKV covers the history after its compact revision, so the
//! throwaway is first compacted to the live member's compact revision when that is later than its own (the
//! kube-apiserver compacts every few minutes: without this almost every chain would be "not comparable");
//! it stays not comparable when the live one began earlier than the throwaway can, or no delta carries one.

use crate::delta::replay::{self, Outcome, Point};
use crate::delta::{Live, SigningKey};
pub use crate::drill_report::{ChainLevel, HashKvResult};
use crate::encode::Identity;
use crate::error::DrillError;
use crate::manifest::{Location, Manifest};
use crate::storage::Store;

/// What the replayed member says at the compared revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replayed {
    pub key_count: u64,
    pub hash_kv: u32,
    pub compact_revision: i64,
}

/// Compares the replayed member at `at` with the live member's record there: the key count, then HashKV over
/// the same history. The first difference fails with both values (counts and hashes, never data).
pub fn compare(at: u64, live: &Live, replayed: &Replayed) -> Result<HashKvResult, DrillError> {
    if replayed.key_count != live.key_count {
        return Err(DrillError::DeltaMismatch(format!(
            "the replayed chain holds {} keys at revision {at}, the live member held {}",
            replayed.key_count, live.key_count
        )));
    }
    if replayed.compact_revision != live.compact_revision {
        return Ok(HashKvResult::NotComparable);
    }
    if replayed.hash_kv != live.hash_kv {
        return Err(DrillError::DeltaMismatch(format!(
            "HashKV({at}) of the replayed chain is {}, the live member's was {} (both from compact revision {})",
            replayed.hash_kv, live.hash_kv, live.compact_revision
        )));
    }
    Ok(HashKvResult::Match)
}

/// Whether the throwaway must be compacted for its HashKV to cover the live one's history: the live member's
/// compact revision is later than the throwaway's and not past the compared revision.
pub fn compaction_needed(at: u64, live: &Live, own_compact_revision: i64) -> Option<i64> {
    (live.compact_revision > own_compact_revision && live.compact_revision <= at as i64)
        .then_some(live.compact_revision)
}

/// Replays the chain of `manifest` (restored at its exact `revision` in `client`) and compares; `None` when
/// the snapshot has no deltas.
pub async fn prove(
    client: &mut etcd_client::Client,
    store: &Store,
    manifest: &Manifest,
    revision: u64,
    keys: (Option<&[Identity]>, Option<&SigningKey>),
) -> Result<Option<ChainLevel>, DrillError> {
    let location = Location::from_id(&store.prefix, &manifest.id)
        .ok_or_else(|| DrillError::Setup("the manifest's id is not valid".into()))?;
    let stored = store
        .list_keys(&crate::delta::dir(&location))
        .await
        .map_err(|e| DrillError::Storage(format!("listing the deltas: {e}")))?;
    if !stored.iter().any(|key| crate::delta::location_of(&store.prefix, &manifest.shard, key).is_some()) {
        return Ok(None);
    }
    let mut outcome = Outcome::new(manifest, revision);
    replay::replay(store, manifest, Point::Latest, keys, Some(client), &mut outcome)
        .await
        .map_err(|e| DrillError::DeltaReplay(format!("{e:#}")))?;
    if let Some(broken) = &outcome.broken {
        return Err(DrillError::DeltaChainBroken(format!("{broken}; the last good revision is {}", outcome.revision)));
    }
    let mut level = ChainLevel {
        deltas: outcome.deltas,
        transactions: outcome.transactions,
        revision: outcome.revision,
        compared_at: None,
        key_count: None,
        hash_kv: HashKvResult::NotComparable,
    };
    let Some((at, live)) = outcome.live else { return Ok(Some(level)) };
    let replayed = read(client, at, &live).await?;
    level.hash_kv = compare(at, &live, &replayed)?;
    level.compared_at = Some(at);
    level.key_count = Some(replayed.key_count);
    Ok(Some(level))
}

/// The key count and HashKV at `at`, the throwaway compacted first when the live record needs it.
async fn read(client: &mut etcd_client::Client, at: u64, live: &Live) -> Result<Replayed, DrillError> {
    let etcd = |what: &str, e: etcd_client::Error| DrillError::KeyRead(format!("{what} of the replayed chain: {e}"));
    let options = etcd_client::GetOptions::new().with_all_keys().with_count_only().with_revision(at as i64);
    let count = client.get("", Some(options)).await.map_err(|e| etcd("counting keys", e))?.count();
    let mut hash = client.hash_kv(at as i64).await.map_err(|e| etcd("HashKV", e))?;
    if let Some(to) = compaction_needed(at, live, hash.compact_version()) {
        let physical = etcd_client::CompactionOptions::new().with_physical();
        client.compact(to, Some(physical)).await.map_err(|e| etcd("compacting", e))?;
        hash = client.hash_kv(at as i64).await.map_err(|e| etcd("HashKV", e))?;
    }
    Ok(Replayed { key_count: count.max(0) as u64, hash_kv: hash.hash(), compact_revision: hash.compact_version() })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIVE: Live = Live { hash_kv: 77, compact_revision: 40, key_count: 12 };

    #[test]
    fn a_replayed_chain_equal_to_the_live_record_matches_and_each_difference_is_named() {
        let same = Replayed { key_count: 12, hash_kv: 77, compact_revision: 40 };
        assert_eq!(compare(90, &LIVE, &same).unwrap(), HashKvResult::Match);
        let fewer = compare(90, &LIVE, &Replayed { key_count: 11, ..same }).unwrap_err();
        assert!(matches!(fewer, DrillError::DeltaMismatch(_)) && fewer.to_string().contains("11 keys"), "{fewer}");
        let other = compare(90, &LIVE, &Replayed { hash_kv: 78, ..same }).unwrap_err();
        assert!(other.to_string().contains("HashKV(90)"), "{other}");
        let other_history = Replayed { hash_kv: 78, compact_revision: 30, ..same };
        assert_eq!(compare(90, &LIVE, &other_history).unwrap(), HashKvResult::NotComparable);
    }

    #[test]
    fn the_throwaway_is_compacted_only_forward_and_never_past_the_compared_revision() {
        assert_eq!(compaction_needed(90, &LIVE, 10), Some(40));
        assert_eq!(compaction_needed(90, &LIVE, 40), None, "already the same history");
        assert_eq!(compaction_needed(90, &LIVE, 50), None, "cannot go back");
        assert_eq!(compaction_needed(30, &LIVE, 10), None, "past the compared revision");
    }
}
