//! The decisions, as plain functions: what to do with a target, whether the rendered kubeconfig is stale,
//! whether to force a renewal, what identity a candidate must prove.

use std::time::Duration;

use time::OffsetDateTime;

use crate::credential::{CertInfo, Credential};

/// What to do with one target, given what it holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetAction {
    /// It already holds exactly this kubeconfig (and split keys): no write.
    Unchanged,
    /// It holds a valid credential that lasts longer than the candidate, for the same server: never replaced by a
    /// worse one.
    KeepLonger,
    /// It holds a valid credential that lasts longer, but for another server than the candidate's (an old front
    /// proxy URL, another kcp): replaced, since it works, if at all, where it should not point.
    Repoint,
    /// Missing, unusable, expired, or no better than the candidate: write.
    Write,
}

/// What a target holds now, as far as the decision goes.
#[derive(Debug, Clone)]
pub enum Live {
    Missing,
    /// Present but not a usable credential (unparsable, mismatched, expired): always replaced.
    Unusable,
    Valid {
        cert: CertInfo,
        hash: String,
        /// The server its current context points at.
        server: String,
    },
}

/// Never worse: a target holding a valid credential with more time left for the same server keeps it. Equal time
/// left (the same certificate rewritten, say) is replaced, so configuration changes still reach it; more time
/// left for another server than the candidate's (after the rewrite to `server:`) is replaced too
/// ([`TargetAction::Repoint`]).
/// `complete` is false when a split key the configuration wants is missing or stale.
pub fn target_action(live: &Live, candidate: &Credential, complete: bool) -> TargetAction {
    match live {
        Live::Valid { hash, .. } if *hash == candidate.hash() && complete => TargetAction::Unchanged,
        Live::Valid { cert, server, .. } if cert.not_after > candidate.cert.not_after => {
            if same_server(server, &candidate.server) { TargetAction::KeepLonger } else { TargetAction::Repoint }
        }
        _ => TargetAction::Write,
    }
}

/// Two kubeconfig servers name the same place: equal but for a trailing `/` and the case of scheme and host.
fn same_server(a: &str, b: &str) -> bool {
    let norm = |s: &str| {
        let s = s.trim_end_matches('/');
        let (authority_end, _) = s.match_indices('/').nth(2).unwrap_or((s.len(), ""));
        format!("{}{}", s[..authority_end].to_ascii_lowercase(), &s[authority_end..])
    };
    norm(a) == norm(b)
}

/// cert-manager has written a newer certificate than the one the rendered kubeconfig carries: the operator will
/// not notice until its next resync, so the Kubeconfig needs a nudge.
pub fn render_is_stale(issued: &CertInfo, rendered: Option<&CertInfo>) -> bool {
    match rendered {
        None => true,
        Some(rendered) => issued.serial != rendered.serial && issued.not_after > rendered.not_after,
    }
}

/// Whether to force a renewal (`Issuing=True`, the cmctl way): less than `renew_before` is left, no issuance is
/// under way, and the certificate lives longer than `renew_before` at all (otherwise every fresh certificate
/// would be renewed again at once). `renew_before` defaults to a quarter of the lifetime: later than
/// cert-manager's own renewal at two thirds, so forcing only happens when that did not.
pub fn renewal_due(cert: &CertInfo, now: OffsetDateTime, renew_before: Option<Duration>, issuing: bool) -> bool {
    let lifetime = cert.lifetime();
    let renew_before = match renew_before {
        Some(d) => time::Duration::try_from(d).unwrap_or(time::Duration::MAX),
        None => lifetime / 4,
    };
    !issuing && lifetime > renew_before && cert.not_after - now < renew_before
}

/// The user and groups a SelfSubjectReview must show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub username: String,
    /// A subset of what the server reports (kcp adds `system:authenticated`).
    pub groups: Vec<String>,
    /// Rights it must hold besides (SelfSubjectAccessReviews).
    pub rights: Vec<crate::config::Right>,
}

/// What the kcp-operator puts into a Kubeconfig's certificate: CN = username, O = groups + `kubeconfig:<name>`.
pub fn operator_identity(kubeconfig_name: &str, username: &str, groups: &[String]) -> Expected {
    let mut groups = groups.to_vec();
    groups.push(format!("kubeconfig:{kubeconfig_name}"));
    groups.sort();
    groups.dedup();
    Expected { username: username.into(), groups, rights: Vec::new() }
}

/// Whether a review's answer proves `expected`; `Err` says which part did not, by name only.
pub fn identity_matches(expected: &Expected, username: &str, groups: &[String]) -> Result<(), &'static str> {
    if username != expected.username {
        return Err("the server sees another user");
    }
    if !expected.groups.iter().all(|g| groups.contains(g)) {
        return Err("the server does not see every expected group");
    }
    Ok(())
}

/// When to look again: at the time a renewal could be forced, or after `resync`, whichever is first, and never
/// later than the certificate's own end.
pub fn next_review(cert: &CertInfo, now: OffsetDateTime, renew_before: Option<Duration>, resync: Duration) -> Duration {
    let lifetime = cert.lifetime();
    let renew_before =
        renew_before.and_then(|d| time::Duration::try_from(d).ok()).unwrap_or(lifetime / 4).min(lifetime);
    let at = cert.not_after - renew_before;
    let until = Duration::try_from(at - now).unwrap_or(Duration::ZERO) + Duration::from_secs(1);
    until.min(resync)
}

#[cfg(test)]
mod tests {
    use kcp_keeper_runtime::Sensitive;

    use super::*;

    fn cert(serial: &str, not_before: i64, not_after: i64) -> CertInfo {
        CertInfo {
            serial: serial.into(),
            username: "u".into(),
            groups: vec![],
            not_before: OffsetDateTime::from_unix_timestamp(not_before).unwrap(),
            not_after: OffsetDateTime::from_unix_timestamp(not_after).unwrap(),
        }
    }

    fn candidate(serial: &str, not_after: i64, bytes: &[u8]) -> Credential {
        Credential {
            server: "https://h:1".into(),
            cert: cert(serial, 0, not_after),
            ca_pem: vec![],
            cert_pem: vec![],
            key_pem: Sensitive::new(vec![]),
            kubeconfig: Sensitive::new(bytes.to_vec()),
        }
    }

    #[test]
    fn a_target_with_more_time_left_is_never_replaced() {
        let c = candidate("02", 2000, b"new");
        let longer = Live::Valid { cert: cert("03", 0, 3000), hash: "x".into(), server: "https://h:1".into() };
        assert_eq!(target_action(&longer, &c, true), TargetAction::KeepLonger);
        let shorter = Live::Valid { cert: cert("01", 0, 1000), hash: "x".into(), server: "https://h:1".into() };
        assert_eq!(target_action(&shorter, &c, true), TargetAction::Write);
        let same_time = Live::Valid { cert: cert("02", 0, 2000), hash: "other".into(), server: "https://h:1".into() };
        assert_eq!(target_action(&same_time, &c, true), TargetAction::Write, "same certificate, new content");
    }

    #[test]
    fn a_target_with_more_time_left_for_another_server_is_replaced() {
        let c = candidate("02", 2000, b"new");
        let held = |server: &str| Live::Valid { cert: cert("03", 0, 3000), hash: "x".into(), server: server.into() };
        assert_eq!(target_action(&held("https://old-fp:1"), &c, true), TargetAction::Repoint);
        assert_eq!(target_action(&held("https://h:1/clusters/root"), &c, true), TargetAction::Repoint, "another path");
        assert_eq!(target_action(&held("https://H:1/"), &c, true), TargetAction::KeepLonger, "the same place");
    }

    #[test]
    fn identical_content_is_not_written_unless_split_keys_are_missing() {
        let c = candidate("02", 2000, b"same");
        let live = Live::Valid { cert: cert("02", 0, 2000), hash: c.hash(), server: "https://h:1".into() };
        assert_eq!(target_action(&live, &c, true), TargetAction::Unchanged);
        assert_eq!(target_action(&live, &c, false), TargetAction::Write);
    }

    #[test]
    fn missing_or_unusable_targets_are_written() {
        let c = candidate("02", 2000, b"x");
        assert_eq!(target_action(&Live::Missing, &c, true), TargetAction::Write);
        assert_eq!(target_action(&Live::Unusable, &c, true), TargetAction::Write);
    }

    #[test]
    fn a_render_is_stale_only_when_the_issued_certificate_is_newer() {
        let issued = cert("02", 100, 2000);
        assert!(render_is_stale(&issued, Some(&cert("01", 0, 1000))));
        assert!(!render_is_stale(&issued, Some(&cert("02", 100, 2000))));
        // An older issued certificate (a restore, a clock jump) never asks for a re-render.
        assert!(!render_is_stale(&cert("00", 0, 500), Some(&cert("01", 0, 1000))));
        assert!(render_is_stale(&issued, None));
    }

    #[test]
    fn renewal_is_forced_only_late_and_only_once() {
        let c = cert("01", 0, 1000);
        let at = |t: i64| OffsetDateTime::from_unix_timestamp(t).unwrap();
        // Default: a quarter of the lifetime (250 s) before the end.
        assert!(!renewal_due(&c, at(700), None, false));
        assert!(renewal_due(&c, at(800), None, false));
        assert!(!renewal_due(&c, at(800), None, true), "an issuance under way is not forced again");
        assert!(renewal_due(&c, at(500), Some(Duration::from_secs(600)), false));
        // renewBefore longer than the whole lifetime would renew every fresh certificate at once: never.
        assert!(!renewal_due(&c, at(10), Some(Duration::from_secs(2000)), false));
    }

    #[test]
    fn the_operator_identity_adds_the_kubeconfig_group() {
        let e = operator_identity("hub", "kcp-admin", &["system:kcp:admin".into()]);
        assert_eq!(e.groups, ["kubeconfig:hub", "system:kcp:admin"]);
        let seen = vec!["kubeconfig:hub".into(), "system:kcp:admin".into(), "system:authenticated".into()];
        assert_eq!(identity_matches(&e, "kcp-admin", &seen), Ok(()));
        assert!(identity_matches(&e, "someone", &seen).is_err());
        assert!(identity_matches(&e, "kcp-admin", &seen[1..]).is_err());
    }

    #[test]
    fn the_next_review_is_at_the_renewal_point_or_the_resync() {
        let now = OffsetDateTime::now_utc();
        let c = CertInfo { not_before: now, not_after: now + time::Duration::seconds(400), ..cert("01", 0, 1) };
        let resync = Duration::from_secs(60);
        assert_eq!(next_review(&c, now, None, resync), resync);
        let d = next_review(&c, now, None, Duration::from_secs(3600));
        assert!(d >= Duration::from_secs(300) && d <= Duration::from_secs(302), "{d:?}");
    }
}
