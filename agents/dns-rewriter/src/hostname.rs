//! DNS names we write into CoreDNS's configuration. A name that reaches a rule has passed these checks, so
//! the renderer never has to quote or escape anything: strict RFC 1123 labels (`a-z`, `0-9`, `-`, not at
//! either end of a label), lowercase only, no wildcard, at most 63 bytes per label and 253 in all, one
//! optional trailing dot (the FQDN form) which is dropped.
//!
//! Errors say what is wrong, never repeat the name: it may come from a field anyone can edit.

use std::fmt;

/// Why a name was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostnameError {
    #[error("must not be empty")]
    Empty,
    #[error("must be lowercase")]
    Uppercase,
    #[error("must not be a wildcard")]
    Wildcard,
    #[error("must be at most 253 characters")]
    TooLong,
    #[error("label {0} is empty")]
    EmptyLabel(usize),
    #[error("label {0} is longer than 63 characters")]
    LabelTooLong(usize),
    #[error("label {0} may hold only a-z, 0-9 and '-', and must not start or end with '-'")]
    InvalidLabel(usize),
    #[error("must have at least two labels")]
    SingleLabel,
    #[error("must not be an IP address (its last label is all digits)")]
    NumericTopLabel,
}

/// A public hostname a rule may rewrite: at least two labels, the last one not all digits (so no IPv4
/// address slips through). Stored without the trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hostname(String);

/// A DNS domain such as the cluster domain (`cluster.local`); one label is allowed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Domain(String);

impl Hostname {
    pub fn parse(text: &str) -> Result<Self, HostnameError> {
        let name = check(text)?;
        if !name.contains('.') {
            return Err(HostnameError::SingleLabel);
        }
        if name.rsplit('.').next().is_some_and(|top| top.bytes().all(|b| b.is_ascii_digit())) {
            return Err(HostnameError::NumericTopLabel);
        }
        Ok(Self(name.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name with its trailing dot, as written in a Corefile rule.
    pub fn fqdn(&self) -> String {
        format!("{}.", self.0)
    }

    /// True when this name is `domain` or lies below it.
    pub fn is_within(&self, domain: &Domain) -> bool {
        self.0 == domain.0 || self.0.strip_suffix(&domain.0).is_some_and(|rest| rest.ends_with('.'))
    }
}

impl Domain {
    pub fn parse(text: &str) -> Result<Self, HostnameError> {
        Ok(Self(check(text)?.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Hostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An operator object's spelling of a name, as the rules write it: ASCII lowercase (DNS names are
/// case-insensitive) and without one trailing dot; `true` when that changed anything. Nothing else is
/// changed: every other deviation stays an error of [`Hostname::parse`].
pub fn normalize(text: &str) -> (String, bool) {
    let name = text.strip_suffix('.').unwrap_or(text).to_ascii_lowercase();
    let changed = name != text;
    (name, changed)
}

/// The rules every name shares; returns the name without its trailing dot.
fn check(text: &str) -> Result<&str, HostnameError> {
    let name = text.strip_suffix('.').unwrap_or(text);
    if name.is_empty() {
        return Err(HostnameError::Empty);
    }
    if name.len() > 253 {
        return Err(HostnameError::TooLong);
    }
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(HostnameError::Uppercase);
    }
    if name.contains('*') {
        return Err(HostnameError::Wildcard);
    }
    for (i, label) in name.split('.').enumerate() {
        let n = i + 1;
        if label.is_empty() {
            return Err(HostnameError::EmptyLabel(n));
        }
        if label.len() > 63 {
            return Err(HostnameError::LabelTooLong(n));
        }
        let ok = label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(HostnameError::InvalidLabel(n));
        }
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names_are_kept_without_the_trailing_dot() {
        assert_eq!(Hostname::parse("kcp-root.example.com").unwrap().as_str(), "kcp-root.example.com");
        assert_eq!(Hostname::parse("kcp-root.example.com.").unwrap().as_str(), "kcp-root.example.com");
        assert_eq!(Hostname::parse("a.b").unwrap().fqdn(), "a.b.");
        assert_eq!(Hostname::parse("0-shard.kcp.example.com").unwrap().as_str(), "0-shard.kcp.example.com");
        let longest_label = format!("{}.example.com", "a".repeat(63));
        assert!(Hostname::parse(&longest_label).is_ok());
    }

    #[test]
    fn every_malformed_name_is_refused_with_its_reason() {
        use HostnameError::*;
        let long_label = format!("{}.example.com", "a".repeat(64));
        let long_name = format!("{}comx", "abcdefghi.".repeat(25)); // 254 characters
        let cases: &[(&str, HostnameError)] = &[
            ("", Empty),
            (".", Empty),
            ("Kcp.example.com", Uppercase),
            ("*.kcp.example.com", Wildcard),
            ("a*b.example.com", Wildcard),
            ("kcp..example.com", EmptyLabel(2)),
            ("kcp.example.com..", EmptyLabel(4)),
            (".kcp.example.com", EmptyLabel(1)),
            (&long_label, LabelTooLong(1)),
            (&long_name, TooLong),
            ("-kcp.example.com", InvalidLabel(1)),
            ("kcp-.example.com", InvalidLabel(1)),
            ("kcp_root.example.com", InvalidLabel(1)),
            ("kcp root.example.com", InvalidLabel(1)),
            ("kcp.example.com:443", InvalidLabel(3)),
            ("kcp.exämple.com", InvalidLabel(2)),
            ("localhost", SingleLabel),
            ("10.96.0.10", NumericTopLabel),
        ];
        for (name, want) in cases {
            assert_eq!(Hostname::parse(name).unwrap_err(), *want, "{name:?}");
        }
    }

    #[test]
    fn normalizing_lowercases_and_drops_one_trailing_dot_and_nothing_else() {
        assert_eq!(normalize("KCP.Example.COM."), ("kcp.example.com".to_string(), true));
        assert_eq!(normalize("kcp.example.com."), ("kcp.example.com".to_string(), true));
        assert_eq!(normalize("kcp.example.com"), ("kcp.example.com".to_string(), false));
        let (bad, _) = normalize("KCP_Edge.example.com..");
        assert_eq!(Hostname::parse(&bad).unwrap_err(), HostnameError::InvalidLabel(1), "the rest stays an error");
    }

    #[test]
    fn error_messages_never_repeat_the_name() {
        for name in ["Secret.Example.com", "*.secret.example.com", "se cret.example.com"] {
            let msg = Hostname::parse(name).unwrap_err().to_string();
            assert!(!msg.to_lowercase().contains("secret"), "{msg}");
        }
    }

    #[test]
    fn a_domain_may_be_one_label_and_containment_is_by_whole_labels() {
        let domain = Domain::parse("cluster.local").unwrap();
        assert!(Domain::parse("local").is_ok());
        assert!(Hostname::parse("root-kcp.kcp-system.svc.cluster.local").unwrap().is_within(&domain));
        assert!(Hostname::parse("cluster.local").unwrap().is_within(&domain));
        assert!(!Hostname::parse("mycluster.local").unwrap().is_within(&domain));
        assert!(!Hostname::parse("kcp.example.com").unwrap().is_within(&domain));
    }
}
