//! Typed raw configuration fields: a value as written that deserializes straight into a checked one, or into
//! the fact that it is not one. Deserializing never fails on the value itself (a string is still required), so
//! `from_raw` collects every bad field with its path instead of serde stopping at the first, and the value is
//! never kept: a secret pasted into the wrong field cannot reach a log, an Event or an error.
//!
//! In a raw struct, `pub interval: Option<Checked<GoDuration>>` replaces `pub interval: Option<String>`; its JSON
//! schema (and so the chart's `values.schema.json`) is a string's, as before. In `from_raw`,
//! [`duration_within`] (or [`Checked::value`]) turns it into the value or a [`FieldError`].

use std::borrow::Cow;
use std::ops::RangeInclusive;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::config::FieldError;
use crate::duration::parse_go_duration;

/// What a [`Checked`] field holds once read: parsed from the text as written, or nothing.
pub trait Parse: Sized {
    /// What the field must be, in an error's words (`a Go duration like 30s, 10m or 1h`).
    const EXPECTED: &'static str;
    fn parse(text: &str) -> Option<Self>;
}

/// A raw field's value, parsed as it was deserialized: `None` inside when the text was not a `T`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked<T>(Option<T>);

impl<T> Checked<T> {
    /// A field that holds `value` (for configuration built in code, such as tests and defaults).
    pub fn of(value: T) -> Self {
        Self(Some(value))
    }
}

impl<T: Parse> Checked<T> {
    /// The value, or an error at `path` saying what the field must be.
    pub fn value(self, path: impl Into<String>, errors: &mut Vec<FieldError>) -> Option<T> {
        if self.0.is_none() {
            errors.push(FieldError::new(path, T::EXPECTED));
        }
        self.0
    }
}

impl<'de, T: Parse> Deserialize<'de> for Checked<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Ok(Self(T::parse(&text)))
    }
}

impl<T> schemars::JsonSchema for Checked<T> {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        String::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        String::json_schema(generator)
    }
}

/// A Go-style duration (`720h`, `1h30m`), as kcp and cert-manager users write them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

impl Parse for GoDuration {
    const EXPECTED: &'static str = "a Go duration like 30s, 10m or 1h";

    fn parse(text: &str) -> Option<Self> {
        parse_go_duration(text).ok().map(GoDuration)
    }
}

/// An optional duration field within `range`: `default` when absent; the value when it is a duration in the
/// range; otherwise `default` and an error at `path` with `expected`, the field's own words for what it must be
/// (`a Go duration from 1s to 10m`).
pub fn duration_within(
    field: Option<Checked<GoDuration>>,
    range: RangeInclusive<Duration>,
    default: Duration,
    path: impl Into<String>,
    expected: &str,
    errors: &mut Vec<FieldError>,
) -> Duration {
    match field.map(|f| f.0) {
        None => default,
        Some(Some(GoDuration(d))) if range.contains(&d) => d,
        Some(_) => {
            errors.push(FieldError::new(path, expected));
            default
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Raw {
        #[serde(default)]
        a: Option<Checked<GoDuration>>,
        #[serde(default)]
        b: Option<Checked<GoDuration>>,
    }

    #[test]
    fn every_bad_duration_is_an_error_with_its_path_and_none_echoes_the_value() {
        let raw: Raw = serde_yaml::from_str("a: s3cr3t-token\nb: forever\n").expect("strings deserialize");
        let mut errors = Vec::new();
        let range = Duration::from_secs(1)..=Duration::from_secs(600);
        let a = duration_within(
            raw.a,
            range.clone(),
            Duration::from_secs(10),
            "x.a",
            "a Go duration from 1s to 10m",
            &mut errors,
        );
        let b = raw.b.and_then(|b| b.value("x.b", &mut errors));
        assert_eq!((a, b), (Duration::from_secs(10), None));
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(text[0].starts_with("x.a") && text[1].starts_with("x.b"), "{text:?}");
        assert!(text.iter().all(|t| !t.contains("s3cr3t") && !t.contains("forever")), "{text:?}");
    }

    #[test]
    fn a_duration_in_range_is_taken_out_of_range_is_an_error_and_absent_is_the_default() {
        let raw: Raw = serde_yaml::from_str("a: 1m\nb: 2h\n").unwrap();
        let mut errors = Vec::new();
        let range = Duration::from_secs(1)..=Duration::from_secs(600);
        let a = duration_within(raw.a, range.clone(), Duration::ZERO, "a", "1s to 10m", &mut errors);
        let b = duration_within(raw.b, range.clone(), Duration::ZERO, "b", "1s to 10m", &mut errors);
        let absent = duration_within(None, range, Duration::from_secs(7), "c", "1s to 10m", &mut errors);
        assert_eq!((a, b, absent), (Duration::from_secs(60), Duration::ZERO, Duration::from_secs(7)));
        assert_eq!(errors, vec![FieldError::new("b", "1s to 10m")]);
    }

    #[test]
    fn the_schema_of_a_checked_field_is_a_strings() {
        let checked = serde_json::to_value(schemars::schema_for!(Checked<GoDuration>)).unwrap();
        let string = serde_json::to_value(schemars::schema_for!(String)).unwrap();
        assert_eq!(checked["type"], string["type"]);
        let raw = serde_json::to_value(schemars::schema_for!(Raw)).unwrap();
        assert_eq!(raw["properties"]["a"]["type"], serde_json::json!(["string", "null"]), "{raw}");
    }
}
