//! `secondary`: the second store every published object is copied to ([`crate::secondary`] does it), with its
//! own bucket, credentials and retention. Off when absent.

use std::time::Duration;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::field::{Checked, GoDuration, duration_within};
use schemars::JsonSchema;
use serde::Deserialize;

use super::retention::{self, RawRetention};
use super::storage::{self, RawStorage, Storage};
use crate::retention::Policy;

/// A second bucket (another endpoint, region or provider, its own credentials) that every published object is
/// copied to and verified on, after the primary publish and never in its way.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawSecondary {
    /// The second bucket, written exactly as `storage` (its own endpoint, region, credentials, integrity...).
    pub storage: RawStorage,
    /// Which snapshots the second store keeps, applied to it alone (as `retention` is to the primary).
    pub retention: RawRetention,
    /// Go-style duration: how often a copy pass compares both stores and copies what the second one lacks
    /// (default 1m).
    #[serde(default)]
    pub interval: Option<Checked<GoDuration>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Secondary {
    pub storage: Storage,
    pub retention: Policy,
    pub interval: Duration,
}

/// Validates the section; errors name `secondary.<field>` (the shared validators name `storage.*` and
/// `retention.*`, so their paths are put under `secondary.`).
pub(super) fn secondary(
    raw: Option<RawSecondary>,
    drills_scheduled: bool,
    errors: &mut Vec<FieldError>,
) -> Option<Secondary> {
    let raw = raw?;
    let mut own = Vec::new();
    let storage = storage::storage(raw.storage, &mut own);
    let retention = retention::retention(&raw.retention, drills_scheduled, &mut own);
    let interval = duration_within(
        raw.interval,
        Duration::from_secs(1)..=Duration::MAX,
        Duration::from_secs(60),
        "interval",
        "must be a Go duration of at least 1s, like 1m",
        &mut own,
    );
    let ok = own.is_empty();
    errors.extend(own.into_iter().map(|e| FieldError::new(format!("secondary.{}", e.path), e.reason)));
    ok.then_some(Secondary { storage: storage?, retention, interval })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    fn load(text: &str) -> Result<Config, String> {
        kcp_keeper_runtime::config::parse::<Config>(Path::new("c.yaml"), text).map_err(|e| e.to_string())
    }

    const SECONDARY: &str = "secondary:\n  storage:\n    bucket: offsite-backups\n    region: eu-west-1\n    \
                             endpoint: https://s3.example.net\n    credentials:\n      secretDirectory: /s3-offsite\n  \
                             retention:\n    keepLast: 7\n";

    #[test]
    fn the_second_store_is_off_unless_configured_and_has_its_own_bucket_credentials_and_retention() {
        let example = crate::config::tests::EXAMPLE;
        assert_eq!(load(example).unwrap().secondary, None);
        let config = load(&format!("{example}{SECONDARY}")).unwrap();
        let secondary = config.secondary.expect("configured");
        assert_eq!(secondary.storage.bucket, "offsite-backups");
        assert_ne!(secondary.storage.credentials, config.storage.credentials);
        assert_eq!(secondary.retention.keep_last, 7);
        assert_ne!(secondary.retention, config.retention);
        assert_eq!(secondary.interval, std::time::Duration::from_secs(60));
    }

    #[test]
    fn second_store_errors_name_their_path_under_secondary_and_never_the_value() {
        let text = SECONDARY
            .replace("offsite-backups", "Not_A_Bucket")
            .replace("https://s3.example.net", "https://key:hunter2@s3.example.net")
            .replace("keepLast: 7", "keepLast: 0")
            .replace("  retention:", "  interval: soon\n  retention:");
        let err = load(&format!("{}{text}", crate::config::tests::EXAMPLE)).unwrap_err();
        for path in [
            "secondary.storage.bucket",
            "secondary.storage.endpoint: must not carry credentials",
            "secondary.retention.keepLast",
            "secondary.interval",
        ] {
            assert!(err.contains(path), "{path} missing in {err}");
        }
        assert!(!err.contains("hunter2") && !err.contains("Not_A_Bucket"), "{err}");
    }
}
