//! Restore drills: prove a published snapshot restores, and measure how long that takes (the shard's real
//! RTO). The steps and what each proves are in docs/etcd-snapshotter.md ("Restore drills").

pub mod chain;
pub mod installation;
pub mod kcp;
pub mod run;
pub mod scheduled;

pub use crate::drill_report::HashKvResult;
use crate::error::DrillError;
use crate::manifest::Manifest;

/// What the restored etcd says: its revision (the exact one the snapshot holds), and keys and HashKV read at
/// the manifest's revision (the lower bound the live member's were recorded at).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub revision: u64,
    pub key_count: u64,
    /// `HashKV(revision)` of the restored member.
    pub hash_kv: u32,
    /// The compact revision that HashKV began at: its hash covers the history after it.
    pub compact_revision: i64,
}

/// Compares the restored member with the manifest: revision, then key count, then HashKV. The first
/// difference fails the drill with the field named and both values (counts and hashes, never data).
pub fn compare(manifest: &Manifest, observed: &Observed) -> Result<HashKvResult, DrillError> {
    if !manifest.holds_revision(observed.revision) {
        return Err(DrillError::RevisionMismatch(format!(
            "the restored etcd is at revision {}, the manifest's revision is {}",
            observed.revision,
            manifest.revision_bounds()
        )));
    }
    if observed.key_count != manifest.key_count {
        return Err(DrillError::KeyCountMismatch(format!(
            "the restored etcd holds {} keys at revision {}, the manifest's keyCount is {}",
            observed.key_count, manifest.revision, manifest.key_count
        )));
    }
    match manifest.hash_kv {
        None => Ok(HashKvResult::NotComparable),
        Some(_) if manifest.compact_revision != observed.compact_revision => Ok(HashKvResult::NotComparable),
        Some(live) if live == observed.hash_kv => Ok(HashKvResult::Match),
        Some(live) => Err(DrillError::HashKvMismatch(format!(
            "HashKV({}) of the restored etcd is {}, the manifest's hashKv is {live}",
            manifest.revision, observed.hash_kv
        ))),
    }
}

/// Whether a failed drill says the snapshot is bad (its object, its database or what it holds is not what the
/// manifest says, or its chain of deltas does not reproduce what the live member held), rather than that the drill could not run (storage, setup, the throwaway etcd, a timeout,
/// reading keys, the kcp level): only the first takes a verification back.
pub fn caused_by_snapshot(error: &DrillError) -> bool {
    matches!(
        error,
        DrillError::ObjectHashMismatch(_)
            | DrillError::Decode(_)
            | DrillError::EtcdHashMismatch(_)
            | DrillError::RevisionMismatch(_)
            | DrillError::KeyCountMismatch(_)
            | DrillError::HashKvMismatch(_)
            | DrillError::DeltaChainBroken(_)
            | DrillError::DeltaMismatch(_)
    )
}

/// The snapshot a scheduled drill takes besides the newest: a random older retained one, with probability
/// `rate`. `roll` and `pick` are uniform draws in [0, 1) (the caller's randomness; pure here).
pub fn older_choice(newest_first: &[Manifest], rate: f64, roll: f64, pick: f64) -> Option<&Manifest> {
    let older = newest_first.get(1..).filter(|o| !o.is_empty())?;
    if roll >= rate {
        return None;
    }
    let index = ((pick * older.len() as f64) as usize).min(older.len() - 1);
    Some(&older[index])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::sample;

    fn observed(m: &Manifest) -> Observed {
        Observed {
            revision: m.revision,
            key_count: m.key_count,
            hash_kv: m.hash_kv.unwrap(),
            compact_revision: m.compact_revision,
        }
    }

    #[test]
    fn a_restore_that_matches_the_manifest_passes_and_a_missing_live_hash_is_not_comparable() {
        let m = sample();
        assert_eq!(compare(&m, &observed(&m)).unwrap(), HashKvResult::Match);
        let without = Manifest { hash_kv: None, ..m.clone() };
        assert_eq!(compare(&without, &observed(&m)).unwrap(), HashKvResult::NotComparable);
    }

    #[test]
    fn a_hash_kv_over_another_compact_revision_is_not_comparable_and_over_the_same_one_it_must_match() {
        let m = sample();
        let compacted_later = Observed { hash_kv: 1, compact_revision: m.compact_revision - 5, ..observed(&m) };
        assert_eq!(compare(&m, &compacted_later).unwrap(), HashKvResult::NotComparable);
        let same_history = Observed { hash_kv: 1, ..observed(&m) };
        assert!(compare(&m, &same_history).is_err());
    }

    #[test]
    fn only_a_failure_of_the_snapshot_itself_takes_a_verification_back() {
        let its_own = [
            DrillError::ObjectHashMismatch(String::new()),
            DrillError::Decode(String::new()),
            DrillError::EtcdHashMismatch(String::new()),
            DrillError::RevisionMismatch(String::new()),
            DrillError::KeyCountMismatch(String::new()),
            DrillError::HashKvMismatch(String::new()),
            DrillError::DeltaChainBroken(String::new()),
            DrillError::DeltaMismatch(String::new()),
        ];
        assert!(its_own.iter().all(caused_by_snapshot));
        let environment = [
            DrillError::Storage(String::new()),
            DrillError::Setup(String::new()),
            DrillError::EtcdStart(String::new()),
            DrillError::Restore(String::new()),
            DrillError::Timeout(String::new()),
            DrillError::KeyRead(String::new()),
            DrillError::Kcp(String::new()),
            DrillError::DeltaReplay(String::new()),
            DrillError::Interrupted,
            DrillError::NoSnapshot(String::new()),
        ];
        assert!(!environment.iter().any(caused_by_snapshot));
    }

    #[test]
    fn a_restored_revision_within_the_manifest_bounds_passes_and_one_outside_fails() {
        let m = Manifest { revision_upper_bound: Some(1005), ..sample() };
        for exact in [1000, 1003, 1005] {
            assert!(compare(&m, &Observed { revision: exact, ..observed(&m) }).is_ok(), "{exact}");
        }
        for exact in [999, 1006] {
            let error = compare(&m, &Observed { revision: exact, ..observed(&m) }).unwrap_err();
            assert!(error.to_string().contains("1000..1005"), "{error}");
        }
        // Without an upper bound (older manifests) the revision is exact.
        let exact = Manifest { revision_upper_bound: None, ..sample() };
        assert!(compare(&exact, &Observed { revision: 1001, ..observed(&exact) }).is_err());
    }

    #[test]
    fn each_difference_fails_with_its_field_named() {
        let m = sample();
        let cases = [
            (Observed { revision: m.revision + 1, ..observed(&m) }, "revision_mismatch", "revision"),
            (Observed { key_count: m.key_count - 1, ..observed(&m) }, "key_count_mismatch", "keyCount"),
            (Observed { hash_kv: 1, ..observed(&m) }, "hash_kv_mismatch", "hashKv"),
        ];
        for (o, reason, field) in cases {
            let error = compare(&m, &o).unwrap_err();
            let label: &'static str = (&error).into();
            assert_eq!(label, reason);
            assert!(error.to_string().contains(field), "{error}");
        }
    }

    #[test]
    fn an_older_snapshot_is_drilled_at_the_configured_rate_and_never_the_newest_twice() {
        let mut list = vec![sample(), sample(), sample()];
        list[1].id = "root/older-1".into();
        list[2].id = "root/older-2".into();
        assert_eq!(older_choice(&list, 0.5, 0.7, 0.0), None);
        assert_eq!(older_choice(&list, 0.5, 0.2, 0.0).unwrap().id, "root/older-1");
        assert_eq!(older_choice(&list, 0.5, 0.2, 0.999).unwrap().id, "root/older-2");
        assert_eq!(older_choice(&list, 0.0, 0.0, 0.5), None, "rate 0 never");
        assert_eq!(older_choice(&list[..1], 1.0, 0.0, 0.5), None, "nothing older");
    }
}
