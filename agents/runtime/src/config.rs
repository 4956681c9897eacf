//! One YAML file per agent, read strictly: an unknown field is an error, and every error names the field path
//! and the reason (`bundles[1].targets[0].secret.key: must not be empty`). A changed file is applied only
//! when it is valid; otherwise the old configuration stays, the error is logged and counted.
//!
//! Parse, don't validate: serde reads the file into the agent's raw type ([`AgentConfig::Raw`], plain data as
//! written), and [`AgentConfig::from_raw`] turns it into the validated configuration (enums, durations, parsed
//! URLs) or every error at once. The agent never sees the raw form.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::dirwatch::{self, WatchSettings};
use crate::metrics::ConfigMetrics;

/// An agent's validated configuration, built from its raw serde form.
pub trait AgentConfig: Sized + PartialEq + Send + Sync + 'static {
    /// The file as written. Implementations use `#[serde(deny_unknown_fields)]` on every struct; its JSON
    /// schema (doc comments as descriptions) is the chart's `values.schema.json` for the agent's `config`.
    type Raw: DeserializeOwned + schemars::JsonSchema;
    /// The validated configuration, or every semantic error (not just the first), each with its field path.
    fn from_raw(raw: Self::Raw) -> Result<Self, Vec<FieldError>>;
}

/// One invalid field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct FieldError {
    pub path: String,
    pub reason: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { path: path.into(), reason: reason.into() }
    }
}

#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum ConfigError {
    #[error("reading {file}: {source}")]
    Read { file: PathBuf, source: std::io::Error },
    /// The YAML does not match the schema: the field path and what was expected there, never the value
    /// ([`describe_mismatch`]).
    #[error("{file}: {path}: {reason}")]
    Parse { file: PathBuf, path: String, reason: String },
    #[error("{file}: {}", errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid { file: PathBuf, errors: Vec<FieldError> },
}

impl ConfigError {
    /// A low-cardinality label for the error counter.
    pub fn metric_label(&self) -> &'static str {
        self.into()
    }
}

/// Parses and validates configuration text. `file` is only used in error messages.
pub fn parse<T: AgentConfig>(file: &Path, text: &str) -> Result<T, ConfigError> {
    let deserializer = serde_yaml::Deserializer::from_str(text);
    let raw: T::Raw = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = field_path(e.path());
        ConfigError::Parse {
            file: file.into(),
            path: if path.is_empty() { "(top level)".into() } else { path },
            reason: describe_mismatch(&e.into_inner().to_string()),
        }
    })?;
    T::from_raw(raw).map_err(|errors| ConfigError::Invalid { file: file.into(), errors })
}

/// Serde's message for a value that does not fit the schema, without the value. serde quotes what it found
/// (`invalid type: string "-----BEGIN PRIVATE KEY-----...", expected a sequence`), so a key or a token pasted
/// under the wrong field would reach stderr and the log; only the shape of each known message is kept: the
/// kind of value found and what the schema expected (which comes from the code, not the file). A message of
/// unknown shape that quotes anything is replaced as a whole.
pub fn describe_mismatch(message: &str) -> String {
    // serde_yaml appends where it was: " at line L column C".
    let (message, position) = match message.rfind(" at line ") {
        Some(at) if message[at + 9..].chars().all(|c| c.is_ascii_digit() || c == ' ' || c.is_ascii_lowercase()) => {
            message.split_at(at)
        }
        _ => (message, ""),
    };
    // serde_yaml puts its own path first ("bundles[0]: invalid type: ..."); the caller has the path already.
    const SHAPES: [&str; 7] = [
        "invalid type: ",
        "invalid value: ",
        "unknown variant ",
        "unknown field ",
        "invalid length ",
        "missing field ",
        "duplicate field ",
    ];
    let message = SHAPES.iter().filter_map(|shape| message.find(shape)).min().map_or(message, |at| &message[at..]);
    // serde puts the expectation last; a value cannot end it, so the last ", expected " is serde's.
    let split = |rest: &str| -> (String, String) {
        match rest.rfind(", expected ") {
            Some(at) => (value_kind(&rest[..at]), rest[at + 11..].to_string()),
            None => (value_kind(rest), "something else".to_string()),
        }
    };
    let quotes = |text: &str| text.contains(['"', '\'', '`']);
    let text = if let Some(rest) = message.strip_prefix("invalid type: ") {
        let (found, expected) = split(rest);
        format!("expected {expected}, found {found}")
    } else if let Some(rest) = message.strip_prefix("invalid value: ") {
        let (found, expected) = split(rest);
        format!("invalid {found}, expected {expected}")
    } else if let Some(rest) = message.strip_prefix("unknown variant ") {
        format!("unknown variant, expected {}", split(rest).1)
    } else if let Some(rest) = message.strip_prefix("unknown field ") {
        // A field name is the file's structure, not a value, but one that does not look like a name is not shown.
        let name = rest.split(", expected").next().unwrap_or_default().trim_matches('`');
        let shown = looks_like_a_name(name);
        let expected = rest.rfind(", expected ").map(|at| &rest[at..]).unwrap_or_default();
        if shown { format!("unknown field `{name}`{expected}") } else { format!("unknown field{expected}") }
    } else if message.starts_with("invalid length ")
        || message.starts_with("missing field ")
        || message.starts_with("duplicate field ")
        || !quotes(message)
    {
        // Lengths, and field names from the schema; or a YAML syntax message, which quotes nothing.
        message.to_string()
    } else {
        "does not match the schema".to_string()
    };
    format!("{text}{position}")
}

/// The path as `a[0].b`; a map key that does not look like a field name (a value pasted as a key) is shown as
/// `<key>`.
fn field_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(if looks_like_a_name(key) { key } else { "<key>" });
            }
            Segment::Unknown => out.push_str(if out.is_empty() { "?" } else { ".?" }),
        }
    }
    out
}

fn looks_like_a_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 40
        && text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
}

/// What serde calls the value it found (`string "..."`, "integer `5`", "map"), without the value: the leading
/// words before any quote.
fn value_kind(found: &str) -> String {
    let kind: String = found.chars().take_while(|c| c.is_ascii_alphabetic() || *c == ' ').collect();
    match kind.trim() {
        "" => "a value".to_string(),
        kind if kind.len() > 24 => "a value".to_string(),
        kind => kind.to_string(),
    }
}

/// Reads, parses and validates the file.
pub fn load<T: AgentConfig>(file: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read { file: file.into(), source })?;
    parse(file, &text)
}

/// How often the file is re-read even without a notification (a missed inotify event must not leave an old
/// configuration in force for long).
pub const POLL_INTERVAL: Duration = Duration::from_secs(30);

/// Watches `file` and publishes each new valid configuration; an invalid one is logged and counted once, and the
/// previous configuration stays. kubelet updates a mounted ConfigMap by swapping the `..data` symlink in the
/// file's directory, so the directory is watched, through [`crate::dirwatch`].
pub fn watch<T: AgentConfig>(
    file: PathBuf,
    initial: T,
    metrics: ConfigMetrics,
    poll: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<watch::Receiver<Arc<T>>> {
    metrics.mark_applied();
    let settings = WatchSettings { poll, ..WatchSettings::default() };
    let dir = dirwatch::parent_dir(&file);
    let loaded = metrics.clone();
    let load = move || {
        let config = load::<T>(&file)?;
        loaded.mark_applied();
        Ok(config)
    };
    let on_error = move |err: &ConfigError| metrics.reload_failed(err.metric_label());
    Ok(dirwatch::follow(dir, settings, initial, load, on_error, shutdown))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Config {
        bundles: Vec<Bundle>,
    }

    #[derive(Debug, PartialEq, serde::Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Bundle {
        name: String,
        #[serde(default)]
        keep: u32,
    }

    impl AgentConfig for Config {
        type Raw = Self;
        fn from_raw(raw: Self) -> Result<Self, Vec<FieldError>> {
            let errors: Vec<_> = raw
                .bundles
                .iter()
                .enumerate()
                .filter(|(_, b)| b.name.is_empty())
                .map(|(i, _)| FieldError::new(format!("bundles[{i}].name"), "must not be empty"))
                .collect();
            if errors.is_empty() { Ok(raw) } else { Err(errors) }
        }
    }

    #[test]
    fn unknown_field_is_an_error_naming_its_path() {
        let err = parse::<Config>(Path::new("c.yaml"), "bundles:\n- name: a\n  kepe: 3\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("c.yaml: bundles[0]"), "{msg}");
        assert!(msg.contains("unknown field `kepe`"), "{msg}");
    }

    #[test]
    fn wrong_type_names_the_field() {
        let err = parse::<Config>(Path::new("c.yaml"), "bundles:\n- name: a\n  keep: many\n").unwrap_err();
        assert!(err.to_string().contains("bundles[0].keep"), "{err}");
    }

    #[test]
    fn a_key_or_token_under_a_field_of_the_wrong_type_is_named_by_path_and_type_never_echoed() {
        let pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----";
        let token = "ghp_R3alLyS3cretT0kenValue0123456789abcdef";
        let cases = [
            (format!("bundles: |\n  {}\n", pem.replace('\n', "\n  ")), "bundles", "expected a sequence, found string"),
            (format!("bundles:\n- name: a\n  keep: {token}\n"), "bundles[0].keep", "expected u32, found string"),
            (format!("bundles:\n- name: [{token}]\n"), "bundles[0].name", "expected a string, found sequence"),
            (format!("bundles:\n- name: a\n  {token}-{token}: 1\n"), "bundles[0].<key>", "unknown field"),
        ];
        for (text, path, reason) in cases {
            let err = parse::<Config>(Path::new("c.yaml"), &text).unwrap_err().to_string();
            assert!(err.contains(&format!("{path}: {reason}")), "{err}");
            assert!(!err.contains("MIIEvQ") && !err.contains("PRIVATE") && !err.contains("R3alLy"), "echoed: {err}");
        }
    }

    #[test]
    fn describe_mismatch_keeps_the_shape_and_drops_what_was_found() {
        let cases = [
            (
                "invalid type: string \"s3cret, expected u8\", expected u32 at line 3 column 9",
                "expected u32, found string at line 3 column 9",
            ),
            ("invalid value: integer `77`, expected a port", "invalid integer, expected a port"),
            ("unknown variant `s3cret`, expected `a` or `b`", "unknown variant, expected `a` or `b`"),
            ("missing field `name`", "missing field `name`"),
            ("did not find expected key at line 2 column 1", "did not find expected key at line 2 column 1"),
            ("custom: \"s3cret\" is wrong", "does not match the schema"),
        ];
        for (message, expected) in cases {
            assert_eq!(describe_mismatch(message), expected);
        }
    }

    #[test]
    fn semantic_errors_are_all_reported_with_paths() {
        let err = parse::<Config>(Path::new("c.yaml"), "bundles:\n- name: ''\n- name: ok\n- name: ''\n").unwrap_err();
        assert_eq!(err.to_string(), "c.yaml: bundles[0].name: must not be empty; bundles[2].name: must not be empty");
        assert_eq!(err.metric_label(), "invalid");
    }

    #[test]
    fn valid_text_parses() {
        let config = parse::<Config>(Path::new("c.yaml"), "bundles:\n- name: a\n  keep: 2\n").unwrap();
        assert_eq!(config.bundles[0].keep, 2);
    }
}
