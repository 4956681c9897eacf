//! `retention`: how many published snapshots to keep ([`crate::retention`] applies it).

use kcp_keeper_runtime::config::FieldError;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::retention::Policy;

/// Which published snapshots to keep, applied after a published snapshot only: a run that did not just publish
/// deletes nothing.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawRetention {
    /// The newest snapshots always kept (at least 1).
    pub keep_last: usize,
    /// The newest snapshot of each of the newest this many hours (UTC).
    #[serde(default)]
    pub hourly: usize,
    /// The newest snapshot of each of the newest this many days (UTC).
    #[serde(default)]
    pub daily: usize,
    /// The newest snapshot of each of the newest this many ISO weeks.
    #[serde(default)]
    pub weekly: usize,
    /// The newest snapshot of each of the newest this many months (UTC).
    #[serde(default)]
    pub monthly: usize,
    /// The newest this many verified snapshots (a passing drill report that matches manifest and object): 1
    /// when absent and a shard has a drill schedule, else 0; 0 with drills scheduled is refused (retention could
    /// then delete the last snapshot a drill proved).
    #[serde(default)]
    pub min_verified: Option<usize>,
}

pub(super) fn retention(raw: &RawRetention, drills_scheduled: bool, errors: &mut Vec<FieldError>) -> Policy {
    if raw.keep_last == 0 {
        errors.push(FieldError::new("retention.keepLast", "must be at least 1 (the newest snapshot is always kept)"));
    }
    if drills_scheduled && raw.min_verified == Some(0) {
        errors.push(FieldError::new(
            "retention.minVerified",
            "must be at least 1 when drills are scheduled (0 lets retention delete the last verified snapshot)",
        ));
    }
    Policy {
        keep_last: raw.keep_last,
        hourly: raw.hourly,
        daily: raw.daily,
        weekly: raw.weekly,
        monthly: raw.monthly,
        min_verified: raw.min_verified.unwrap_or(usize::from(drills_scheduled)),
    }
}
