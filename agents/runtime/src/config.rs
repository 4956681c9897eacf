//! One YAML file per agent, read strictly: an unknown field is an error, and every error names the field path
//! and the reason (`bundles[1].targets[0].secret.key: must not be empty`). A changed file is applied only
//! when it is valid; otherwise the old configuration stays, the error is logged and counted.
//!
//! Parse, don't validate: serde reads the file into the agent's raw type ([`AgentConfig::Raw`], plain data as
//! written), and [`AgentConfig::from_raw`] turns it into the validated configuration (enums, durations, parsed
//! URLs) or every error at once. The agent never sees the raw form.

use std::fmt;
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
    /// The file as written. Implementations use `#[serde(deny_unknown_fields)]` on every struct.
    type Raw: DeserializeOwned;
    /// The validated configuration, or every semantic error (not just the first), each with its field path.
    fn from_raw(raw: Self::Raw) -> Result<Self, Vec<FieldError>>;
}

/// One invalid field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub reason: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { path: path.into(), reason: reason.into() }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {file}: {source}")]
    Read { file: PathBuf, source: std::io::Error },
    /// The YAML does not match the schema. Serde's messages name the field, never its value.
    #[error("{file}: {path}: {reason}")]
    Parse { file: PathBuf, path: String, reason: String },
    #[error("{file}: {}", errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid { file: PathBuf, errors: Vec<FieldError> },
}

impl ConfigError {
    /// A low-cardinality label for the error counter.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ConfigError::Read { .. } => "read",
            ConfigError::Parse { .. } => "parse",
            ConfigError::Invalid { .. } => "invalid",
        }
    }
}

/// Parses and validates configuration text. `file` is only used in error messages.
pub fn parse<T: AgentConfig>(file: &Path, text: &str) -> Result<T, ConfigError> {
    let deserializer = serde_yaml::Deserializer::from_str(text);
    let raw: T::Raw = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        ConfigError::Parse {
            file: file.into(),
            path: if path == "." { "(top level)".into() } else { path },
            reason: e.into_inner().to_string(),
        }
    })?;
    T::from_raw(raw).map_err(|errors| ConfigError::Invalid { file: file.into(), errors })
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

    #[derive(Debug, PartialEq, serde::Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Config {
        bundles: Vec<Bundle>,
    }

    #[derive(Debug, PartialEq, serde::Deserialize)]
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
