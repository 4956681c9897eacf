//! Durations in configuration files, written the way Kubernetes users write them (`90s`, `5m`, `720h`).

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A configuration duration; deserializes from strings like `30s`, `5m`, `1h30m`, `720h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ConfigDuration(pub Duration);

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text)
            .map(ConfigDuration)
            .map_err(|e| serde::de::Error::custom(format!("{text:?} is not a duration like 30s, 5m or 720h: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_style_durations_parse() {
        let d: ConfigDuration = serde_json::from_str("\"1h30m\"").unwrap();
        assert_eq!(d.0, Duration::from_secs(5400));
        assert!(serde_json::from_str::<ConfigDuration>("\"soon\"").is_err());
    }
}
