//! What a target's read-once consumers are rolled for ([`kcp_keeper_runtime::consumer_restart`] does the
//! rolling): the content hash of what the target holds, the annotation keys of its bundle, and until when what
//! they hold is good (the restart window's deadline).
//!
//! A consumer is rolled when the target's content really changes: the hash is of the PEM the target holds
//! after this pass's write (or lack of one), so a pass that writes nothing, or writes the same bundle again,
//! rolls nothing, and a consumer created later or whose roll failed is rolled on the next pass.

use kcp_keeper_runtime::consumer_restart::Keys;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

/// The prefix of the annotation keys ca-syncer writes on consumers.
pub const KEY_PREFIX: &str = "ca-syncer.kcp-keeper.io/";

/// The longest bundle name that can have consumers: `restarted-not-after-<bundle>` is an annotation key's name
/// part, at most 63 characters.
pub const MAX_BUNDLE_NAME: usize = 63 - "restarted-not-after-".len();

/// `ca-syncer.kcp-keeper.io/restarted-for-<bundle>` (pod template: the hash it was rolled for) and
/// `ca-syncer.kcp-keeper.io/restarted-not-after-<bundle>` (metadata: until when that bundle is good).
pub fn keys(bundle: &str) -> Keys {
    Keys::for_owner(KEY_PREFIX, bundle)
}

/// The hash of a target's content (the PEM of its key): SHA-256, hex. Only the certificates go in, so the hash
/// says nothing a reader of the bundle could not see.
pub fn content_hash(pem: &str) -> String {
    hex::encode(Sha256::digest(pem.as_bytes()))
}

/// Until when a consumer holding a bundle is good: the earliest notAfter among its certificates (during a
/// rotation, the retained previous CA's), so a deferred roll to the next bundle happens before it. A bundle
/// without certificates (empty means public roots) has no such time: `now`, so a later roll away from it is
/// never deferred on a guess.
pub fn held_until(earliest_not_after: Option<OffsetDateTime>, now: OffsetDateTime) -> OffsetDateTime {
    earliest_not_after.unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_fit_an_annotation_name_for_the_longest_allowed_bundle_name() {
        let name = "b".repeat(MAX_BUNDLE_NAME);
        let keys = keys(&name);
        for key in [&keys.restarted_for, &keys.held_until] {
            let (prefix, name) = key.split_once('/').expect("a prefixed key");
            assert_eq!(prefix, "ca-syncer.kcp-keeper.io");
            assert!(name.len() <= 63, "{key}");
        }
    }

    #[test]
    fn the_hash_changes_with_the_content_only() {
        assert_eq!(content_hash("a"), content_hash("a"));
        assert_ne!(content_hash("a"), content_hash("b"));
    }

    #[test]
    fn an_empty_bundle_is_good_until_now_only() {
        let now = OffsetDateTime::UNIX_EPOCH + time::Duration::days(1);
        assert_eq!(held_until(None, now), now);
        assert_eq!(held_until(Some(OffsetDateTime::UNIX_EPOCH), now), OffsetDateTime::UNIX_EPOCH);
    }
}
