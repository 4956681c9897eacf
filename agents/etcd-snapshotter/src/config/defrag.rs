//! `shards[].defrag`: scheduled defragmentation of the shard's etcd members, opt-in. etcd's defragmentation
//! rewrites a member's database file and blocks that member (reads and writes) until it is done; Gardener's
//! users report stalls with it on, so it is off unless enabled, bounded by a timeout per member, and never
//! touches the leader of a cluster with followers (see `crate::defrag`).

use std::time::Duration;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::field::{Checked, GoDuration, duration_within};
use kcp_keeper_runtime::schedule::{Schedule, ScheduleSpec};
use schemars::JsonSchema;
use serde::Deserialize;

/// Scheduled defragmentation of one shard's etcd members: a full snapshot first, then each follower alone,
/// never the leader while followers exist.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawDefrag {
    /// Whether the agent's leader defragments this shard's members on `schedule` (false when absent).
    #[serde(default)]
    pub enabled: bool,
    /// When (recorded on the Lease as `defrag-<shard>`); required when enabled.
    #[serde(default)]
    pub schedule: Option<ScheduleSpec>,
    /// Go-style duration: how long one member's defragmentation may take (etcd blocks the member meanwhile);
    /// past it the run stops and reports, and no further member is defragmented (1s to 1h; 5m when absent).
    #[serde(default)]
    pub timeout: Option<Checked<GoDuration>>,
    /// A single-member etcd is its own leader and blocks the whole shard while it defragments: only then
    /// defragmented, and only when this is true (false when absent; required for a shard with one endpoint).
    #[serde(default)]
    pub single_member: bool,
}

/// Defragmentation as validated: present on a shard only when enabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defrag {
    pub schedule: Schedule,
    pub timeout: Duration,
    pub single_member: bool,
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5 * 60);

pub(super) fn defrag(
    shard: &str,
    endpoints: usize,
    raw: Option<RawDefrag>,
    at: &dyn Fn(&str) -> String,
    errors: &mut Vec<FieldError>,
) -> Option<Defrag> {
    let raw = raw.filter(|r| r.enabled)?;
    let timeout = duration_within(
        raw.timeout,
        Duration::from_secs(1)..=Duration::from_secs(3600),
        DEFAULT_TIMEOUT,
        at("defrag.timeout"),
        "a Go duration from 1s to 1h",
        errors,
    );
    if endpoints == 1 && !raw.single_member {
        errors.push(FieldError::new(
            at("defrag.singleMember"),
            "a shard with one endpoint is defragmented only with singleMember: true (it blocks the shard)",
        ));
    }
    let Some(spec) = raw.schedule else {
        errors.push(FieldError::new(at("defrag.schedule"), "required when defrag is enabled"));
        return None;
    };
    let schedule = super::schedule(&format!("defrag-{shard}"), &spec, at("defrag.schedule"), errors)?;
    Some(Defrag { schedule, timeout, single_member: raw.single_member })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(field: &str) -> String {
        format!("shards[0].{field}")
    }

    fn spec(cron: &str) -> ScheduleSpec {
        serde_yaml::from_str(&format!("cron: \"{cron}\"")).unwrap()
    }

    #[test]
    fn defrag_is_off_unless_enabled_defaults_to_five_minutes_and_bad_values_name_their_field() {
        let mut errors = Vec::new();
        assert_eq!(defrag("root", 3, None, &at, &mut errors), None);
        let off = RawDefrag { schedule: Some(spec("0 3 * * SUN")), ..Default::default() };
        assert_eq!(defrag("root", 3, Some(off), &at, &mut errors), None, "not enabled");
        let on = RawDefrag { enabled: true, schedule: Some(spec("0 3 * * SUN")), ..Default::default() };
        let on = defrag("root", 3, Some(on), &at, &mut errors).unwrap();
        assert_eq!((on.timeout, on.single_member, on.schedule.name()), (DEFAULT_TIMEOUT, false, "defrag-root"));
        assert!(errors.is_empty(), "{errors:?}");

        let bad = RawDefrag {
            enabled: true,
            timeout: Some(Checked::of(GoDuration(Duration::from_secs(2 * 3600)))),
            ..Default::default()
        };
        assert_eq!(defrag("root", 1, Some(bad), &at, &mut errors), None);
        let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(text.len(), 3, "{text:?}");
        assert!(text[0].contains("shards[0].defrag.timeout"), "{text:?}");
        assert!(text[1].contains("shards[0].defrag.singleMember"), "{text:?}");
        assert!(text[2].contains("shards[0].defrag.schedule: required"), "{text:?}");
    }

    #[test]
    fn a_single_member_shard_is_defragmented_only_when_the_config_says_so() {
        let mut errors = Vec::new();
        let raw =
            RawDefrag { enabled: true, schedule: Some(spec("0 3 * * SUN")), single_member: true, ..Default::default() };
        assert!(defrag("alpha", 1, Some(raw), &at, &mut errors).unwrap().single_member);
        assert!(errors.is_empty(), "{errors:?}");
    }
}
