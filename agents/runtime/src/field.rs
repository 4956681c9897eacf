//! Typed raw configuration fields: a value as written that deserializes straight into a checked one, or into
//! the reason it is not one (`has an unknown unit (use ns, us, ms, s, m or h)`), never the text itself.
//! Deserializing never fails on the value (a string is still required), so `from_raw` collects every bad field
//! with its path instead of serde stopping at the first, and the value is never kept: a secret pasted into the
//! wrong field cannot reach a log, an Event or an error.
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

/// What a [`Checked`] field holds once read: parsed from the text as written.
pub trait Parse: Sized {
    /// The value, or why `text` is not one, in an error's words (`must be k3s or corefile`): never the text.
    fn parse(text: &str) -> Result<Self, String>;
}

/// A raw field's value, parsed as it was deserialized, or the reason its text was not a `T`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked<T>(Result<T, String>);

impl<T> Checked<T> {
    /// A field that holds `value` (for configuration built in code, such as tests and defaults).
    pub fn of(value: T) -> Self {
        Self(Ok(value))
    }

    /// The value, or an error at `path` with the reason.
    pub fn value(self, path: impl Into<String>, errors: &mut Vec<FieldError>) -> Option<T> {
        self.0.map_err(|reason| errors.push(FieldError::new(path, reason))).ok()
    }
}

impl<'de, T: Parse> Deserialize<'de> for Checked<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Ok(Self(T::parse(&text)))
    }
}

/// For the schema alone (raw types are only deserialized): schemars writes a `#[serde(default)]` field's
/// `"default": null` only when it can serialize the field. A field serializes as nothing, never its value.
impl<T> serde::Serialize for Checked<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_none()
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoDuration(pub Duration);

impl Parse for GoDuration {
    /// The parser's reason (`must not have a sign`, `is not a duration like 720h, 1h30m or 90s`, ...).
    fn parse(text: &str) -> Result<Self, String> {
        parse_go_duration(text).map(GoDuration).map_err(|e| e.to_string())
    }
}

/// An optional field within `range`: `default` when absent; the value when it parsed and is in the range;
/// otherwise `default` and an error at `path` with `expected`, the field's own words for what it must be (`a Go
/// duration from 1s to 10m`): not parsing and out of range are one error.
pub fn within<T: PartialOrd>(
    field: Option<Checked<T>>,
    range: RangeInclusive<T>,
    default: T,
    path: impl Into<String>,
    expected: &str,
    errors: &mut Vec<FieldError>,
) -> T {
    match field.map(|f| f.0) {
        None => default,
        Some(Ok(value)) if range.contains(&value) => value,
        Some(_) => {
            errors.push(FieldError::new(path, expected));
            default
        }
    }
}

/// [`within`] for a Go duration.
pub fn duration_within(
    field: Option<Checked<GoDuration>>,
    range: RangeInclusive<Duration>,
    default: Duration,
    path: impl Into<String>,
    expected: &str,
    errors: &mut Vec<FieldError>,
) -> Duration {
    let range = GoDuration(*range.start())..=GoDuration(*range.end());
    within(field, range, GoDuration(default), path, expected, errors).0
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
        assert_eq!(text[1], "x.b: is not a duration like 720h, 1h30m or 90s", "the parser's reason");
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
        assert_eq!(raw["properties"]["a"]["default"], serde_json::Value::Null, "{raw}");
        assert!(raw["properties"]["a"].as_object().unwrap().contains_key("default"), "{raw}");
    }
}
