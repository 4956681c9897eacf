//! What every part of the configuration shares about a field: recording its error, checking that exactly one
//! of its keys is set, and reading a Go duration from a typed raw field. A leaf, so that the parts can share it
//! without importing each other.

use std::time::Duration;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::field::{Checked, GoDuration};

/// Records `result`'s reason, if any, under `path`.
pub(super) fn check(errors: &mut Vec<FieldError>, path: String, result: Result<(), String>) {
    if let Err(reason) = result {
        errors.push(FieldError::new(path, reason));
    }
}

/// Whether exactly one of `keys` (each with whether it is set) is set; if not, an error at `path` names them all,
/// and those set.
pub(super) fn exactly_one(path: &str, keys: &[(&str, bool)], errors: &mut Vec<FieldError>) -> bool {
    let all = keys.iter().map(|(key, _)| *key).collect::<Vec<_>>().join(", ");
    let set: Vec<&str> = keys.iter().filter(|(_, set)| *set).map(|(key, _)| *key).collect();
    let reason = match set.len() {
        1 => return true,
        0 => format!("must set one of {all}"),
        _ => format!("must set exactly one of {all}; has {}", set.join(", ")),
    };
    errors.push(FieldError::new(path, reason));
    false
}

/// The duration in an optional field: `None` when absent; when its text is not a Go duration, `None` and an
/// error at `path` with the parser's reason.
pub(super) fn go_duration(
    field: Option<Checked<GoDuration>>,
    path: String,
    errors: &mut Vec<FieldError>,
) -> Option<Duration> {
    field?.value(path, errors).map(|GoDuration(d)| d)
}
