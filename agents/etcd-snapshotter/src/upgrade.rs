//! A snapshot before every kcp upgrade: per shard, optionally (`shards[].beforeUpgrade`), the leader watches the
//! kcp-operator's `RootShard` or `Shard` that runs the shard, and when the kcp image the operator will roll to
//! changes, takes a full snapshot of the shard (its manifest labelled with the image it was taken under and the
//! one being rolled to) and drills it. The agent cannot hold the operator back: the snapshot races the roll
//! (docs/etcd-snapshotter.md, "Before a kcp upgrade").
//!
//! The decision is made from state, not from events: the last image this agent saw is recorded in the bucket
//! (`<prefix>/<shard>/kcp-image.json`, written only by the leader), so a restart neither takes a second
//! snapshot nor misses a change made while the agent was down (then it snapshots at once and the manifest says
//! the roll may have begun).
//!
//! Here the pure parts: the configuration section, reading the image out of an object others can write (only
//! `spec.image.repository` and `spec.image.tag`, each checked), the recorded state and the step to take. The
//! leader's watch is [`watch`]; the Role it needs is [`rbac`].

pub mod metrics;
pub mod roll;
pub mod watch;

use chrono::{DateTime, Utc};
use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::names::{check_dns_label, check_dns_subdomain};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The kcp-operator's defaults for an unset `spec.image` (v0.9.0, `internal/resources/resources.go`): the image
/// such an object rolls to.
pub const DEFAULT_REPOSITORY: &str = "ghcr.io/kcp-dev/kcp";
pub const DEFAULT_TAG: &str = "v0.32.3";

/// The state object's name under the shard's directory in the bucket.
pub const STATE: &str = "kcp-image.json";

/// Which of the kcp-operator's objects runs the shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema, strum::IntoStaticStr)]
pub enum Kind {
    RootShard,
    Shard,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn plural(self) -> &'static str {
        match self {
            Kind::RootShard => "rootshards",
            Kind::Shard => "shards",
        }
    }
}

/// A snapshot and a drill of the shard whenever the kcp image of the operator's object that runs it changes,
/// before the operator rolls the shard's pods (a race the agent cannot win every time: see the docs).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawBeforeUpgrade {
    /// `RootShard` or `Shard` (`operator.kcp.io/v1alpha1`).
    pub kind: Kind,
    /// The object's namespace.
    pub namespace: String,
    /// The object's name; it is watched by name only.
    pub name: String,
}

/// The object a shard's upgrades are watched on, as validated: the section as written, once its names are.
pub type Watched = RawBeforeUpgrade;

impl Watched {
    /// `RootShard kcp-system/root`: how manifests, Events and errors name it.
    pub fn describe(&self) -> String {
        format!("{} {}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

pub fn before_upgrade(
    raw: Option<RawBeforeUpgrade>,
    at: &dyn Fn(&str) -> String,
    errors: &mut Vec<FieldError>,
) -> Option<Watched> {
    let (raw, before) = (raw?, errors.len());
    if check_dns_label(&raw.namespace).is_err() {
        errors.push(FieldError::new(at("beforeUpgrade.namespace"), "must be a namespace name (a DNS label)"));
    }
    if check_dns_subdomain(&raw.name).is_err() {
        errors.push(FieldError::new(at("beforeUpgrade.name"), "must be an object name (a DNS subdomain)"));
    }
    (errors.len() == before).then_some(raw)
}

/// Why an object's image cannot be read: a field path and what is wrong with it, never the value (the object is
/// anyone's with write access to it, and its text goes into logs and Events).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {field}: {reason}; no snapshot is taken until it is fixed")]
pub struct Malformed {
    pub object: String,
    pub field: &'static str,
    pub reason: String,
}

/// Only the fields read from the object's `spec`; everything else in it is ignored.
#[derive(Deserialize)]
struct Spec {
    #[serde(default)]
    image: Option<ImageSpec>,
}

#[derive(Deserialize)]
struct ImageSpec {
    #[serde(default)]
    repository: Option<String>,
    #[serde(default)]
    tag: Option<String>,
}

/// The image the operator renders into the shard's Deployment from the object's `spec` (`<repository>:<tag>`,
/// its defaults for what is unset or empty, as its `GetImageSettings` does).
pub fn image_of(object: &str, spec: &serde_json::Value) -> Result<String, Malformed> {
    let malformed = |field, reason: &str| Malformed { object: object.into(), field, reason: reason.into() };
    let spec = match spec {
        serde_json::Value::Null => Spec { image: None },
        serde_json::Value::Object(_) => match spec.get("image") {
            None | Some(serde_json::Value::Null) => Spec { image: None },
            Some(serde_json::Value::Object(image)) => {
                for (field, path) in [("repository", "spec.image.repository"), ("tag", "spec.image.tag")] {
                    if image.get(field).is_some_and(|v| !v.is_string() && !v.is_null()) {
                        return Err(malformed(path, "not a string"));
                    }
                }
                serde_json::from_value(serde_json::json!({"image": image}))
                    .map_err(|_| malformed("spec.image", "not an image spec"))?
            }
            Some(_) => return Err(malformed("spec.image", "not an object")),
        },
        _ => return Err(malformed("spec", "not an object")),
    };
    let image = spec.image.unwrap_or(ImageSpec { repository: None, tag: None });
    let repository = image.repository.filter(|r| !r.is_empty()).unwrap_or_else(|| DEFAULT_REPOSITORY.into());
    let tag = image.tag.filter(|t| !t.is_empty()).unwrap_or_else(|| DEFAULT_TAG.into());
    check_repository(&repository).map_err(|reason| malformed("spec.image.repository", reason))?;
    check_tag(&tag).map_err(|reason| malformed("spec.image.tag", reason))?;
    Ok(format!("{repository}:{tag}"))
}

/// A tag as the distribution spec defines it: `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn check_tag(tag: &str) -> Result<(), &'static str> {
    let bytes = tag.as_bytes();
    let ok = (1..=128).contains(&bytes.len())
        && (bytes[0].is_ascii_alphanumeric() || bytes[0] == b'_')
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok { Ok(()) } else { Err("not an image tag ([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})") }
}

/// A repository: an optional registry host (with a port) and lowercase path components joined by `.`, `_`, `__`
/// or `-`; no tag, no digest.
fn check_repository(repository: &str) -> Result<(), &'static str> {
    const BAD: &str = "not an image repository (host[:port]/path, lowercase, no tag or digest)";
    if repository.len() > 255 {
        return Err(BAD);
    }
    let mut parts: Vec<&str> = repository.split('/').collect();
    // The first part is a registry host when it has a '.' or a ':' or is localhost (as the reference grammar has it).
    if parts.len() > 1 && (parts[0].contains(['.', ':']) || parts[0] == "localhost") {
        let host = parts.remove(0);
        let (name, port) = host.split_once(':').unwrap_or((host, ""));
        let host_ok = !name.is_empty()
            && name.split('.').all(|l| {
                !l.is_empty()
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
            && (port.is_empty() && !host.contains(':') || port.parse::<u16>().is_ok());
        if !host_ok {
            return Err(BAD);
        }
    }
    let component_ok = |c: &str| {
        let b = c.as_bytes();
        !b.is_empty()
            && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
            && (b[b.len() - 1].is_ascii_lowercase() || b[b.len() - 1].is_ascii_digit())
            && b.iter().all(|x| x.is_ascii_lowercase() || x.is_ascii_digit() || matches!(x, b'.' | b'_' | b'-'))
            && !c.contains("..")
            && !c.contains("___")
    };
    if parts.is_empty() || !parts.iter().all(|c| component_ok(c)) { Err(BAD) } else { Ok(()) }
}

/// The kcp a snapshot was taken under, in its manifest: set on every snapshot of a shard with `beforeUpgrade`
/// taken because its image changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KcpVersion {
    /// The image the shard ran when the snapshot was taken (the one before the change), `<repository>:<tag>`.
    pub image: String,
    /// The operator's object it was read from, `RootShard kcp-system/root`.
    pub object: String,
    /// The image the operator rolls the shard to: the change that took this snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_to: Option<String>,
    /// The change was found when the agent (re)started watching or on a later attempt, not as it was made: the
    /// operator may have begun the roll before the snapshot.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_roll_may_have_begun: bool,
}

impl KcpVersion {
    /// `kcp ghcr.io/kcp-dev/kcp:v0.32.3 (before the upgrade to ...)`: how `list`, `restore` and drills print it.
    pub fn describe(&self) -> String {
        match &self.upgrade_to {
            Some(to) if self.after_roll_may_have_begun => {
                format!("kcp {} (before the upgrade to {to}; the roll may have begun)", self.image)
            }
            Some(to) => format!("kcp {} (before the upgrade to {to})", self.image),
            None => format!("kcp {}", self.image),
        }
    }
}

/// What the agent last saw of the shard's object, in the bucket beside its snapshots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct State {
    pub format_version: u32,
    /// `RootShard kcp-system/root`: a state of another object is no baseline for this one.
    pub object: String,
    pub image: String,
    pub recorded_at: DateTime<Utc>,
    /// The snapshot taken before the change to `image`; absent for a baseline, or when every attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

impl State {
    pub fn new(object: &str, image: &str, snapshot: Option<String>) -> Self {
        // The clock snapshots' `startedAt` is stamped by, which [`records_change`] compares with.
        Self {
            format_version: 1,
            object: object.into(),
            image: image.into(),
            recorded_at: crate::clock::now(),
            snapshot,
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        crate::json::object(self)
    }

    /// Parses the state read from the bucket; the image in it is checked as an image of the operator's object.
    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let state: Self = serde_json::from_slice(bytes).map_err(|e| format!("does not parse: {e}"))?;
        let (repository, tag) = state.image.rsplit_once(':').ok_or("its image has no tag")?;
        check_repository(repository).and(check_tag(tag)).map_err(|e| format!("its image is {e}"))?;
        Ok(state)
    }
}

/// What to do about one reading of the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing recorded for this object yet: record what it says; there is nothing to compare it with.
    Baseline,
    Unchanged,
    /// The image changed from `from`: snapshot and drill, then record.
    Snapshot {
        from: String,
        late: bool,
    },
}

/// The step for the object's image `now`, given what was recorded. `live` is true for a change seen as it
/// happened (a watch event after this session's first reading); a change found on the first reading of a
/// session happened while no replica was watching, so the roll may already have begun.
pub fn step(recorded: Option<&State>, object: &str, now: &str, live: bool) -> Step {
    match recorded {
        Some(state) if state.object == object && state.image == now => Step::Unchanged,
        Some(state) if state.object == object => Step::Snapshot { from: state.image.clone(), late: !live },
        _ => Step::Baseline,
    }
}

/// Whether a snapshot with `kcp`, started at `started_at`, records the change `from` -> `to` that follows the
/// state recorded at `since`: the snapshot of that change is already published (the process died after
/// publishing it, before recording the state). A snapshot of the same change from before `since` belongs to an
/// earlier round of it (upgraded, rolled back, upgraded again) and holds nothing written since.
pub fn records_change(
    kcp: Option<&KcpVersion>,
    started_at: DateTime<Utc>,
    since: DateTime<Utc>,
    (object, from, to): (&str, &str, &str),
) -> bool {
    started_at >= since
        && kcp.is_some_and(|k| k.object == object && k.image == from && k.upgrade_to.as_deref() == Some(to))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const OBJ: &str = "RootShard kcp-system/root";

    #[test]
    fn the_image_is_the_operators_rendering_with_its_defaults_for_what_is_unset() {
        assert_eq!(image_of(OBJ, &json!({})).unwrap(), "ghcr.io/kcp-dev/kcp:v0.32.3");
        assert_eq!(image_of(OBJ, &serde_json::Value::Null).unwrap(), "ghcr.io/kcp-dev/kcp:v0.32.3");
        assert_eq!(image_of(OBJ, &json!({"image": {"tag": ""}})).unwrap(), "ghcr.io/kcp-dev/kcp:v0.32.3");
        assert_eq!(image_of(OBJ, &json!({"image": {"tag": "v0.33.0"}})).unwrap(), "ghcr.io/kcp-dev/kcp:v0.33.0");
        let both = json!({"image": {"repository": "registry.local:5000/kcp/kcp", "tag": "v0.32.3-b"}, "replicas": 3});
        assert_eq!(image_of(OBJ, &both).unwrap(), "registry.local:5000/kcp/kcp:v0.32.3-b");
        // Explicitly naming the default is no change.
        assert_eq!(
            image_of(OBJ, &json!({"image": {"repository": DEFAULT_REPOSITORY, "tag": DEFAULT_TAG}})).unwrap(),
            image_of(OBJ, &json!({})).unwrap()
        );
    }

    #[test]
    fn a_malformed_image_names_the_object_and_field_and_never_the_value() {
        let cases = [
            (json!({"image": {"tag": "v1 ; rm -rf"}}), "spec.image.tag"),
            (json!({"image": {"tag": ".hidden"}}), "spec.image.tag"),
            (json!({"image": {"tag": 7}}), "spec.image.tag"),
            (json!({"image": {"repository": "Ghcr.io/KCP"}}), "spec.image.repository"),
            (json!({"image": {"repository": "ghcr.io/kcp-dev/kcp@sha256:abc"}}), "spec.image.repository"),
            (json!({"image": {"repository": "ghcr.io:99999/kcp"}}), "spec.image.repository"),
            (json!({"image": "ghcr.io/kcp-dev/kcp:v0.32.3"}), "spec.image"),
            (json!([1]), "spec"),
        ];
        for (spec, field) in cases {
            let error = image_of(OBJ, &spec).unwrap_err();
            assert_eq!(error.field, field, "{spec}");
            let text = error.to_string();
            assert!(text.starts_with(&format!("{OBJ}: {field}: ")), "{text}");
            assert!(!text.contains("rm -rf") && !text.contains("KCP") && !text.contains("sha256"), "{text}");
        }
    }

    #[test]
    fn the_first_reading_records_a_baseline_a_change_snapshots_and_a_change_found_on_start_is_late() {
        let old = "ghcr.io/kcp-dev/kcp:v0.32.3";
        let new = "ghcr.io/kcp-dev/kcp:v0.33.0";
        assert_eq!(step(None, OBJ, old, false), Step::Baseline);
        let state = State::new(OBJ, old, None);
        assert_eq!(step(Some(&state), OBJ, old, true), Step::Unchanged);
        assert_eq!(step(Some(&state), OBJ, old, false), Step::Unchanged);
        assert_eq!(step(Some(&state), OBJ, new, true), Step::Snapshot { from: old.into(), late: false });
        assert_eq!(step(Some(&state), OBJ, new, false), Step::Snapshot { from: old.into(), late: true });
        // A state of another object (the configuration changed) is no baseline.
        assert_eq!(step(Some(&state), "Shard kcp-system/alpha", new, true), Step::Baseline);
    }

    #[test]
    fn a_published_snapshot_of_the_change_is_recognised_so_a_restart_does_not_take_it_twice() {
        let kcp = KcpVersion {
            image: "a:1".into(),
            object: OBJ.into(),
            upgrade_to: Some("a:2".into()),
            after_roll_may_have_begun: false,
        };
        let since: DateTime<Utc> = "2026-12-01T10:00:00Z".parse().unwrap();
        let after = since + chrono::Duration::seconds(5);
        assert!(records_change(Some(&kcp), after, since, (OBJ, "a:1", "a:2")));
        assert!(!records_change(Some(&kcp), after, since, (OBJ, "a:2", "a:3")));
        assert!(!records_change(Some(&kcp), after, since, ("Shard kcp-system/alpha", "a:1", "a:2")));
        assert!(!records_change(None, after, since, (OBJ, "a:1", "a:2")));
        assert_eq!(kcp.describe(), "kcp a:1 (before the upgrade to a:2)");
    }

    #[test]
    fn an_upgrade_repeated_after_a_rollback_is_snapshotted_again_not_matched_to_the_first_rounds_snapshot() {
        let kcp = KcpVersion {
            image: "a:1".into(),
            object: OBJ.into(),
            upgrade_to: Some("a:2".into()),
            after_roll_may_have_begun: false,
        };
        // a:1 -> a:2 snapshotted at 10:00, rolled back to a:1 (recorded 10:05), upgraded to a:2 again: the
        // 10:00 snapshot predates the state the new change follows, so it is not this change's snapshot.
        let first_round: DateTime<Utc> = "2026-12-01T10:00:00Z".parse().unwrap();
        let rolled_back: DateTime<Utc> = "2026-12-01T10:05:00Z".parse().unwrap();
        assert!(!records_change(Some(&kcp), first_round, rolled_back, (OBJ, "a:1", "a:2")));
    }

    #[test]
    fn the_state_round_trips_and_an_edited_one_with_a_bad_image_is_refused() {
        let state = State::new(OBJ, "ghcr.io/kcp-dev/kcp:v0.32.3", Some("root/20261130T120000Z-r1".into()));
        assert_eq!(State::from_json(&state.to_json()).unwrap(), state);
        let edited = String::from_utf8(state.to_json()).unwrap().replace("v0.32.3", "v0 32");
        assert!(State::from_json(edited.as_bytes()).is_err());
        let unknown = String::from_utf8(state.to_json()).unwrap().replace("\"image\"", "\"imagex\"");
        assert!(State::from_json(unknown.as_bytes()).is_err());
    }

    #[test]
    fn the_section_names_its_fields_when_invalid() {
        let at = |f: &str| format!("shards[0].{f}");
        let mut errors = Vec::new();
        let raw = RawBeforeUpgrade { kind: Kind::Shard, namespace: "Kcp_System".into(), name: "alpha/..".into() };
        assert_eq!(before_upgrade(Some(raw), &at, &mut errors), None);
        let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        assert!(text[0].contains("shards[0].beforeUpgrade.namespace"), "{text:?}");
        assert!(text[1].contains("shards[0].beforeUpgrade.name"), "{text:?}");
        let raw = RawBeforeUpgrade { kind: Kind::RootShard, namespace: "kcp-system".into(), name: "root".into() };
        let watched = before_upgrade(Some(raw), &at, &mut Vec::new()).unwrap();
        assert_eq!(watched.describe(), "RootShard kcp-system/root");
    }
}
