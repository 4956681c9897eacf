//! `shards[].deltas`: continuous protection between full snapshots. The leader watches the shard's etcd from
//! the newest full snapshot's revision and writes the events as delta objects, flushed every `interval` or
//! once `maxBytes` of events are held (the memory bound).

use std::time::Duration;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::field::{Checked, GoDuration, duration_within, within};
use schemars::JsonSchema;
use serde::Deserialize;

use super::spill::Size;

/// Delta snapshots of one shard: its etcd's watch events between full snapshots, for a recovery point of
/// seconds and restores to a point in time.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawDeltas {
    /// Whether the leader writes deltas for this shard (false when absent).
    #[serde(default)]
    pub enabled: bool,
    /// Go-style duration: how often buffered events are written as a delta object, the recovery point under
    /// a steady write load (1s to 10m; 10s when absent).
    #[serde(default)]
    pub interval: Option<Checked<GoDuration>>,
    /// Bytes of events held in memory at most (`8Mi`, plain bytes; 64Ki to 256Mi; 16Mi when absent): a delta
    /// is written as soon as this much is buffered, before the interval ends.
    #[serde(default)]
    pub max_bytes: Option<Checked<Size>>,
    /// Go-style duration: how often at most a delta also carries the live member's HashKV and key count at
    /// its last revision, what drills compare the replayed chain with (0s: every delta; up to 1h; 1m when
    /// absent). HashKV reads the member's whole database, so not every 10 s on a large one.
    #[serde(default)]
    pub hash_kv_interval: Option<Checked<GoDuration>>,
}

/// Deltas as validated: present on a shard only when enabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deltas {
    pub interval: Duration,
    pub max_bytes: u64,
    pub hash_kv_interval: Duration,
}

const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
const DEFAULT_MAX_BYTES: u64 = 16 << 20;
const DEFAULT_HASH_KV_INTERVAL: Duration = Duration::from_secs(60);

pub(super) fn deltas(
    raw: Option<RawDeltas>,
    at: &dyn Fn(&str) -> String,
    errors: &mut Vec<FieldError>,
) -> Option<Deltas> {
    let raw = raw.filter(|r| r.enabled)?;
    let interval = duration_within(
        raw.interval,
        Duration::from_secs(1)..=Duration::from_secs(600),
        DEFAULT_INTERVAL,
        at("deltas.interval"),
        "a Go duration from 1s to 10m",
        errors,
    );
    let max_bytes = within(
        raw.max_bytes,
        Size(64 << 10)..=Size(256 << 20),
        Size(DEFAULT_MAX_BYTES),
        at("deltas.maxBytes"),
        "a size from 64Ki to 256Mi",
        errors,
    )
    .0;
    let hash_kv_interval = duration_within(
        raw.hash_kv_interval,
        Duration::ZERO..=Duration::from_secs(3600),
        DEFAULT_HASH_KV_INTERVAL,
        at("deltas.hashKvInterval"),
        "a Go duration from 0s to 1h",
        errors,
    );
    Some(Deltas { interval, max_bytes, hash_kv_interval })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(field: &str) -> String {
        format!("shards[0].{field}")
    }

    #[test]
    fn deltas_default_to_ten_seconds_and_16mi_and_bad_values_name_their_field() {
        let mut errors = Vec::new();
        assert_eq!(deltas(None, &at, &mut errors), None);
        assert_eq!(deltas(Some(RawDeltas::default()), &at, &mut errors), None, "not enabled");
        let on = RawDeltas { enabled: true, ..Default::default() };
        assert_eq!(
            deltas(Some(on), &at, &mut errors),
            Some(Deltas {
                interval: Duration::from_secs(10),
                max_bytes: 16 << 20,
                hash_kv_interval: Duration::from_secs(60)
            })
        );
        assert!(errors.is_empty());
        let bad = RawDeltas {
            enabled: true,
            interval: Some(Checked::of(GoDuration(Duration::from_secs(3600)))),
            max_bytes: Some(Checked::of(Size(1 << 30))),
            hash_kv_interval: Some(Checked::of(GoDuration(Duration::from_secs(2 * 3600)))),
        };
        deltas(Some(bad), &at, &mut errors);
        let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        assert!(
            text[0].contains("shards[0].deltas.interval")
                && text[1].contains("shards[0].deltas.maxBytes")
                && text[2].contains("shards[0].deltas.hashKvInterval"),
            "{text:?}"
        );
    }
}
