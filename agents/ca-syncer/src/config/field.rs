//! What every part of the configuration shares about a field: recording its error, and reading a Go duration
//! from a typed raw field. A leaf, so that the parts can share it without importing each other.

use std::time::Duration;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::field::{Checked, GoDuration};

/// Records `result`'s reason, if any, under `path`.
pub(super) fn check(errors: &mut Vec<FieldError>, path: String, result: Result<(), String>) {
    if let Err(reason) = result {
        errors.push(FieldError::new(path, reason));
    }
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
