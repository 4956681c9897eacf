//! "Versions move in lockstep (kcp, the operator, the provider)": the kcp-operator's and the infrastructure
//! provider's Deployment images against the version pairing known for the kcp the components run.
//!
//! The pairing table is kcp-keeper's own, from the seed's versions. kcp-operator v0.9.0 runs kcp v0.32.3 by
//! default (`ImageTag` in its `internal/resources/resources.go`), and the seed layout runs exactly those two. The
//! seed names no infrastructure provider version, so the table has none for kcp 0.32: a provider's line then
//! warns that its pairing is unknown (its image must still be pinned). Add a row when a release pairs them.

use crate::verdict::Verdict;

use super::images::LOCKSTEP;

/// One kcp minor and what moves with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pairing {
    pub kcp: (u64, u64),
    pub operator: (u64, u64),
    /// `None`: no provider release is known to pair with this kcp.
    pub provider: Option<(u64, u64)>,
}

/// The known pairings, newest first (see the module comment for where each comes from).
pub const PAIRINGS: &[Pairing] = &[Pairing { kcp: (0, 32), operator: (0, 9), provider: None }];

/// A container image reference split at its tag (a digest is kept with the repository and has no version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub repository: String,
    pub tag: Option<String>,
}

impl Reference {
    pub fn parse(image: &str) -> Self {
        let (name, _digest) = image.split_once('@').map_or((image, None), |(n, d)| (n, Some(d)));
        // A `:` after the last `/` is the tag; one before it is a registry's port.
        match name.rsplit_once(':').filter(|(_, t)| !t.contains('/')) {
            Some((repository, tag)) => Self { repository: repository.into(), tag: Some(tag.into()) },
            None => Self { repository: name.into(), tag: None },
        }
    }
}

/// `v0.32.3`, `0.32`, `v0.9.0-rc.1` -> `(major, minor)`.
pub fn minor(tag: &str) -> Option<(u64, u64)> {
    let mut parts = tag.strip_prefix('v').unwrap_or(tag).split(['.', '-', '+']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

fn show((a, b): (u64, u64)) -> String {
    format!("v{a}.{b}")
}

/// One deployment's image, as read: `subject` (e.g. `deployment/kcp-operator/kcp-operator`) and its image, or
/// why it could not be read.
pub type Read = (String, Result<String, String>);

/// The operator's and the provider's lines, against `kcp_tags` (the components' kcp image tags).
pub fn judge(kcp_tags: &[String], operator: Option<&Read>, provider: Option<&Read>) -> Vec<Verdict> {
    let mut kcp: Vec<(u64, u64)> = kcp_tags.iter().filter_map(|t| minor(t)).collect();
    kcp.sort();
    kcp.dedup();
    let mut out = Vec::new();
    for (what, read) in [("kcp-operator", operator), ("infrastructure provider", provider)] {
        let Some((subject, image)) = read else { continue };
        let image = match image {
            Ok(i) => Reference::parse(i),
            Err(e) => {
                out.push(Verdict::fail(
                    LOCKSTEP,
                    subject.clone(),
                    e.clone(),
                    "check the Deployment reference and the doctor's RBAC",
                ));
                continue;
            }
        };
        let Some(version) = image.tag.as_deref().filter(|t| *t != "latest").and_then(minor) else {
            out.push(Verdict::fail(
                LOCKSTEP,
                subject.clone(),
                format!(
                    "the {what} runs {}:{}, no version",
                    image.repository,
                    image.tag.as_deref().unwrap_or("<none>")
                ),
                "pin the image to a released version that pairs with your kcp",
            ));
            continue;
        };
        let [kcp] = kcp.as_slice() else {
            out.push(Verdict::warn(
                LOCKSTEP,
                subject.clone(),
                format!("the {what} runs {}; the kcp components run no single version", show(version)),
                "finish the kcp upgrade first",
            ));
            continue;
        };
        let Some(row) = PAIRINGS.iter().find(|p| p.kcp == *kcp) else {
            out.push(Verdict::warn(
                LOCKSTEP,
                subject.clone(),
                format!("no pairing known for kcp {}: the {what} runs {}", show(*kcp), show(version)),
                "check the release notes; kcp-keeper's table (docs/doctor.md) has no row for this kcp",
            ));
            continue;
        };
        let expected = if what == "kcp-operator" { Some(row.operator) } else { row.provider };
        out.push(match expected {
            Some(e) if e == version => Verdict::ok(
                LOCKSTEP,
                subject.clone(),
                format!("the {what} {} pairs with kcp {}", show(version), show(*kcp)),
            ),
            Some(e) => Verdict::fail(
                LOCKSTEP,
                subject.clone(),
                format!("the {what} runs {}; kcp {} pairs with {}", show(version), show(*kcp), show(e)),
                "move kcp, the operator and the provider in lockstep: upgrade or roll back the one out of step",
            ),
            None => Verdict::warn(
                LOCKSTEP,
                subject.clone(),
                format!("no {what} version known to pair with kcp {}: it runs {}", show(*kcp), show(version)),
                "check the provider's release notes for the kcp it supports",
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Level;

    fn read(image: &str) -> Read {
        ("deployment/x/y".into(), Ok(image.into()))
    }

    #[test]
    fn references_split_at_the_tag_not_at_a_registry_port_and_versions_read_their_minor() {
        assert_eq!(Reference::parse("ghcr.io/kcp-dev/kcp-operator:v0.9.0").tag.as_deref(), Some("v0.9.0"));
        assert_eq!(Reference::parse("registry:5000/kcp-operator").tag, None);
        assert_eq!(Reference::parse("registry:5000/op:v1.2@sha256:ab").tag.as_deref(), Some("v1.2"));
        assert_eq!(minor("v0.32.3"), Some((0, 32)));
        assert_eq!(minor("0.9.0-rc.1"), Some((0, 9)));
        assert_eq!(minor("latest"), None);
    }

    #[test]
    fn the_seeds_operator_pairs_with_its_kcp_and_another_operator_minor_fails() {
        let kcp = vec!["v0.32.3".to_string(), "v0.32.3".to_string()];
        let ok = judge(&kcp, Some(&read("ghcr.io/kcp-dev/kcp-operator:v0.9.0")), None);
        assert_eq!(ok.len(), 1);
        assert_eq!(ok[0].result, Level::Ok, "{ok:?}");
        let old = judge(&kcp, Some(&read("ghcr.io/kcp-dev/kcp-operator:v0.8.1")), None);
        assert_eq!(old[0].result, Level::Fail);
        assert!(old[0].saw.contains("pairs with v0.9"), "{}", old[0].saw);
        let unpinned = judge(&kcp, Some(&read("ghcr.io/kcp-dev/kcp-operator:latest")), None);
        assert_eq!(unpinned[0].result, Level::Fail);
    }

    #[test]
    fn a_provider_warns_without_a_known_pairing_a_kcp_outside_the_table_warns_and_a_read_error_fails() {
        let kcp = vec!["v0.32.3".to_string()];
        let p = judge(&kcp, None, Some(&read("example.com/provider:v1.4.0")));
        assert_eq!(p[0].result, Level::Warn, "{p:?}");
        let p = judge(&kcp, None, Some(&read("example.com/provider")));
        assert_eq!(p[0].result, Level::Fail, "an unpinned provider: {p:?}");
        let future = judge(&["v0.40.0".to_string()], Some(&read("op:v0.9.0")), None);
        assert_eq!(future[0].result, Level::Warn);
        let mixed = judge(&["v0.31.0".to_string(), "v0.32.3".to_string()], Some(&read("op:v0.9.0")), None);
        assert_eq!(mixed[0].result, Level::Warn);
        let missing = judge(&kcp, Some(&("deployment/a/b".into(), Err("no Deployment a/b".into()))), None);
        assert_eq!(missing[0].result, Level::Fail);
    }
}
