//! What every part of the configuration shares about a field: recording its error, and reading a Go duration
//! from a typed raw field. A leaf, so that the parts can share it without importing each other.

use std::time::Duration;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::duration::{DurationError, parse_go_duration};
use kcp_keeper_runtime::field::{Checked, GoDuration, Parse};

/// Records `result`'s reason, if any, under `path`.
pub(super) fn check(errors: &mut Vec<FieldError>, path: String, result: Result<(), String>) {
    if let Err(reason) = result {
        errors.push(FieldError::new(path, reason));
    }
}

/// A Go duration (`720h`, `1h30m`, `90s`) in a raw field (`Option<Checked<ParsedDuration>>`): the duration, or
/// why its text is not one. Unlike the runtime's [`GoDuration`], it keeps that reason (`must not have a sign`,
/// `has an unknown unit (use ns, us, ms, s, m or h)`, ...), so a bad field's error says what is wrong with it;
/// the reason never holds the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedDuration(Result<Duration, DurationError>);

impl Parse for ParsedDuration {
    const EXPECTED: &'static str = GoDuration::EXPECTED;

    /// Always a value: a text that is not a duration is kept as the reason it is not.
    fn parse(text: &str) -> Option<Self> {
        Some(Self(parse_go_duration(text)))
    }
}

/// The duration in an optional field: `None` when absent; when its text is not a Go duration, `None` and an
/// error at `path` with the reason.
pub(super) fn go_duration(
    field: Option<Checked<ParsedDuration>>,
    path: String,
    errors: &mut Vec<FieldError>,
) -> Option<Duration> {
    let ParsedDuration(parsed) = field?.value(path.clone(), errors)?;
    match parsed {
        Ok(duration) => Some(duration),
        Err(reason) => {
            errors.push(FieldError::new(path, reason.to_string()));
            None
        }
    }
}
