//! Kubernetes name rules, checked at configuration time so that a typo fails at start with its field path
//! instead of as an API error on every sync. Each check returns the reason, worded for a field error.

use std::net::IpAddr;

/// A namespace name, a bundle name: RFC 1123 label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63).
pub fn check_dns_label(value: &str) -> Result<(), String> {
    check_length(value, 63)?;
    if !is_label(value, |c| c.is_ascii_lowercase() || c.is_ascii_digit()) {
        return Err(
            "must be a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit".into(),
        );
    }
    Ok(())
}

/// A Secret or ConfigMap name: RFC 1123 subdomain (dot-separated labels, at most 253).
pub fn check_dns_subdomain(value: &str) -> Result<(), String> {
    check_length(value, 253)?;
    if !value.split('.').all(|l| is_label(l, |c| c.is_ascii_lowercase() || c.is_ascii_digit())) {
        return Err("must be a DNS subdomain: lowercase letters, digits, '-' and '.', each part starting and ending \
                    with a letter or digit"
            .into());
    }
    Ok(())
}

/// A key in a Secret's or ConfigMap's data: `[-._a-zA-Z0-9]+`, at most 253, not `.` or `..`.
pub fn check_data_key(value: &str) -> Result<(), String> {
    check_length(value, 253)?;
    if value == "." || value == ".." {
        return Err("must not be '.' or '..'".into());
    }
    if !value.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_')) {
        return Err("must consist of letters, digits, '-', '_' and '.'".into());
    }
    Ok(())
}

/// A label key: optional DNS-subdomain prefix and '/', then a name of at most 63
/// (`[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`).
pub fn check_label_key(value: &str) -> Result<(), String> {
    let (prefix, name) = match value.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    if let Some(prefix) = prefix {
        check_dns_subdomain(prefix).map_err(|reason| format!("prefix {reason}"))?;
    }
    if name.is_empty() || name.len() > 63 || !is_label_value(name) {
        return Err("name part must be 1-63 characters: letters, digits, '-', '_' and '.', starting and ending with \
                    a letter or digit"
            .into());
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters like a label key's name part.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > 63 || !is_label_value(value) {
        return Err("must be at most 63 characters: letters, digits, '-', '_' and '.', starting and ending with a \
                    letter or digit"
            .into());
    }
    Ok(())
}

/// A TLS server name: a DNS hostname (any case) or an IP address.
pub fn check_server_name(value: &str) -> Result<(), String> {
    if value.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    let host = value.strip_suffix('.').unwrap_or(value);
    let valid = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|l| l.len() <= 63 && is_label(l, |c| c.is_ascii_alphanumeric()));
    if !valid {
        return Err("must be a DNS hostname or an IP address".into());
    }
    Ok(())
}

/// Not empty, and at most `max` characters.
fn check_length(value: &str, max: usize) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > max {
        return Err(format!("must be at most {max} characters, is {}", value.len()));
    }
    Ok(())
}

/// `alnum ( [alnum-]* alnum )?`, where `alnum` is decided by `is_alnum`.
fn is_label(s: &str, is_alnum: impl Fn(char) -> bool) -> bool {
    s.starts_with(|c: char| is_alnum(c))
        && s.ends_with(|c: char| is_alnum(c))
        && s.chars().all(|c| is_alnum(c) || c == '-')
}

fn is_label_value(s: &str) -> bool {
    let starts_ends =
        s.starts_with(|c: char| c.is_ascii_alphanumeric()) && s.ends_with(|c: char| c.is_ascii_alphanumeric());
    starts_ends && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        for ok in ["a", "kcp-system", "a1", "0abc", &"a".repeat(63)] {
            assert_eq!(check_dns_label(ok), Ok(()), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(check_dns_label(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn dns_subdomains() {
        for ok in ["root-server-ca", "kcp.io", "a.b-c.d"] {
            assert_eq!(check_dns_subdomain(ok), Ok(()), "{ok}");
        }
        for bad in ["", ".a", "a.", "a..b", "Root", "a_b", &"a".repeat(254)] {
            assert!(check_dns_subdomain(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn data_keys() {
        for ok in ["ca.crt", "tls.crt", "ca-bundle.pem", "_x", "...", "A.B"] {
            assert_eq!(check_data_key(ok), Ok(()), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "ä", &"a".repeat(254)] {
            assert!(check_data_key(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_keys_and_values() {
        for ok in ["team", "kcp-keeper.io/trust-kcp", "a.b/C_d.e"] {
            assert_eq!(check_label_key(ok), Ok(()), "{ok}");
        }
        for bad in ["", "/x", "a/", "Bad_Prefix/x", "-x", &"a".repeat(64)] {
            assert!(check_label_key(bad).is_err(), "{bad}");
        }
        for ok in ["", "true", "v1.2_3-x"] {
            assert_eq!(check_label_value(ok), Ok(()), "{ok}");
        }
        for bad in ["-x", "x-", "a b", &"a".repeat(64)] {
            assert!(check_label_value(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn server_names() {
        for ok in ["kcp.example.com", "KCP.Example.com", "localhost", "127.0.0.1", "::1", "front-proxy.kcp-system.svc."]
        {
            assert_eq!(check_server_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", "a..b", "-a.com", "a_b.com", "https://x", "[::1]"] {
            assert!(check_server_name(bad).is_err(), "{bad}");
        }
    }
}
