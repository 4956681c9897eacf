//! The hub's kubeconfig and every CA the agents manage expire: the earliest notAfter of what a Secret holds,
//! against now. Read from the certificates themselves (DER in, times out), never printing their content.

use base64::Engine;
use serde::Deserialize;

use crate::verdict::Verdict;

pub const KUBECONFIG: &str = "hub-kubeconfig-expiry";
pub const CA: &str = "ca-expiry";

/// Warn this long before a notAfter; fail this long before (and after).
#[derive(Debug, Clone, Copy)]
pub struct Margins {
    pub warn_secs: i64,
    pub fail_secs: i64,
}

impl Default for Margins {
    fn default() -> Self {
        Self { warn_secs: 30 * 86400, fail_secs: 7 * 86400 }
    }
}

/// The notAfter (unix seconds) of every certificate in a PEM bundle; an error names what did not parse.
pub fn not_afters(pem_text: &[u8]) -> Result<Vec<i64>, String> {
    let blocks = pem::parse_many(pem_text).map_err(|e| format!("not PEM: {e}"))?;
    let mut out = Vec::new();
    for block in blocks.iter().filter(|b| b.tag() == "CERTIFICATE") {
        let (_, cert) = x509_parser::parse_x509_certificate(block.contents())
            .map_err(|e| format!("a certificate does not parse: {e}"))?;
        out.push(cert.validity().not_after.timestamp());
    }
    if out.is_empty() {
        return Err("no certificate in it".into());
    }
    Ok(out)
}

#[derive(Deserialize)]
struct Kubeconfig {
    #[serde(default)]
    users: Vec<NamedUser>,
}

#[derive(Deserialize)]
struct NamedUser {
    #[serde(default)]
    user: User,
}

#[derive(Deserialize, Default)]
struct User {
    #[serde(rename = "client-certificate-data")]
    client_certificate_data: Option<String>,
}

/// The client certificates' notAfters of a kubeconfig; `Ok(empty)` when it authenticates otherwise (a token).
pub fn kubeconfig_not_afters(text: &[u8]) -> Result<Vec<i64>, String> {
    // serde_yaml's errors quote no input beyond a position, so a token cannot leak through them.
    let k: Kubeconfig = serde_yaml::from_slice(text).map_err(|e| {
        format!("not a kubeconfig: {}", e.location().map_or("".into(), |l| format!("line {}", l.line())))
    })?;
    let mut out = Vec::new();
    for u in k.users {
        if let Some(data) = u.user.client_certificate_data {
            let pem = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|_| "client-certificate-data is not base64".to_string())?;
            out.extend(not_afters(&pem)?);
        }
    }
    Ok(out)
}

fn days(secs: i64) -> String {
    format!("{:.1} days", secs as f64 / 86400.0)
}

/// The verdict on the earliest of `not_afters` at `now`.
pub fn judge(check: &'static str, subject: &str, not_afters: &[i64], now: i64, m: Margins, todo: &str) -> Verdict {
    let Some(first) = not_afters.iter().min().copied() else {
        return Verdict::ok(check, subject, "no client certificate (another credential): nothing expires here");
    };
    let left = first - now;
    let when = format!("earliest of {} certificate(s) expires in {}", not_afters.len(), days(left));
    if left <= 0 {
        Verdict::fail(check, subject, format!("expired {} ago", days(-left)), todo)
    } else if left < m.fail_secs {
        Verdict::fail(check, subject, when, todo)
    } else if left < m.warn_secs {
        Verdict::warn(check, subject, when, todo)
    } else {
        Verdict::ok(check, subject, when)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Level;

    fn cert_pem(days_left: i64) -> (String, i64) {
        let mut params = rcgen::CertificateParams::new(vec!["x".into()]).unwrap();
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(days_left);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), params.not_after.unix_timestamp())
    }

    #[test]
    fn the_earliest_certificate_of_a_bundle_decides() {
        let (a, a_end) = cert_pem(300);
        let (b, b_end) = cert_pem(20);
        let ends = not_afters(format!("{a}{b}").as_bytes()).unwrap();
        assert_eq!(ends, vec![a_end, b_end]);
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        assert_eq!(judge(CA, "s", &ends, now, Margins::default(), "renew").result, Level::Warn);
        assert_eq!(judge(CA, "s", &[a_end], now, Margins::default(), "renew").result, Level::Ok);
        assert_eq!(judge(CA, "s", &[now + 3600], now, Margins::default(), "renew").result, Level::Fail);
        let expired = judge(CA, "s", &[now - 86400], now, Margins::default(), "renew");
        assert_eq!(expired.result, Level::Fail);
        assert!(expired.saw.starts_with("expired"), "{}", expired.saw);
    }

    #[test]
    fn a_kubeconfig_is_read_for_its_client_certificates_and_a_bad_one_names_no_content() {
        let (a, end) = cert_pem(100);
        let data = base64::engine::general_purpose::STANDARD.encode(a);
        let yaml = format!(
            "users:\n- name: admin\n  user:\n    client-certificate-data: {data}\n    client-key-data: c2VjcmV0\n"
        );
        assert_eq!(kubeconfig_not_afters(yaml.as_bytes()).unwrap(), vec![end]);
        assert_eq!(kubeconfig_not_afters(b"users:\n- name: t\n  user:\n    token: abc\n").unwrap(), Vec::<i64>::new());
        let bad = kubeconfig_not_afters(b"users: [ {user: {token: s3cr3t-token}} ] ]").unwrap_err();
        assert!(!bad.contains("s3cr3t"), "{bad}");
        assert!(not_afters(b"hello").is_err());
    }
}
