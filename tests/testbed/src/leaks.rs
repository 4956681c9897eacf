//! Checks that captured output (logs, Events, error messages) carries no secret material.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;

/// What gives secret material away in text.
const MARKERS: &[&str] = &["PRIVATE KEY-----", "BEGIN CERTIFICATE-----", "client-key-data", "Bearer "];

/// Panics, naming the kind of leak (never the secret itself), when `output` contains a PEM private key or
/// certificate body, a kubeconfig key field, a bearer token, or any of `secrets` verbatim or base64-encoded.
pub fn assert_no_secret_material(output: &str, secrets: &[&str]) {
    if let Some(problem) = find_secret_material(output, secrets) {
        panic!("secret material in captured output: {problem}");
    }
}

/// The first leak found, described without repeating it.
pub fn find_secret_material(output: &str, secrets: &[&str]) -> Option<String> {
    for marker in MARKERS {
        if output.contains(marker) {
            return Some(format!("the marker {marker:?}"));
        }
    }
    for (i, secret) in secrets.iter().enumerate() {
        for line in secret_fragments(secret) {
            if output.contains(&line) {
                return Some(format!("a line of secret #{i}"));
            }
        }
        // A base64-encoded secret starts with the same 16 characters wherever it is embedded whole.
        let encoded = B64.encode(secret);
        if secret.len() >= 12 && output.contains(&encoded[..16]) {
            return Some(format!("secret #{i} in base64"));
        }
    }
    None
}

/// Distinctive pieces of a secret: each base64 body line of a PEM, or the whole value when short.
fn secret_fragments(secret: &str) -> Vec<String> {
    let lines: Vec<String> =
        secret.lines().map(str::trim).filter(|l| !l.starts_with("-----") && l.len() >= 16).map(String::from).collect();
    if lines.is_empty() && secret.len() >= 8 { vec![secret.to_string()] } else { lines }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----\n";

    #[test]
    fn clean_output_passes() {
        assert_eq!(find_secret_material("rotated kubeconfig admin, serial 0a:1b", &[KEY, "s3cr3t-token-value"]), None);
    }

    #[test]
    fn pem_markers_are_found() {
        assert!(find_secret_material("oops -----BEGIN PRIVATE KEY----- x", &[]).is_some());
        assert!(find_secret_material("-----BEGIN CERTIFICATE-----", &[]).is_some());
    }

    #[test]
    fn a_pem_body_line_without_markers_is_found() {
        let found =
            find_secret_material("error: bad data MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg here", &[KEY]);
        assert_eq!(found.as_deref(), Some("a line of secret #0"));
    }

    #[test]
    fn a_token_verbatim_or_in_base64_is_found_and_not_repeated() {
        let token = "s3cr3t-token-value";
        let found = find_secret_material(&format!("token={token}"), &[token]).unwrap();
        assert!(!found.contains(token));
        assert!(find_secret_material(&format!("data: {}", B64.encode(token)), &[token]).is_some());
    }

    #[test]
    #[should_panic(expected = "secret material")]
    fn assert_panics_on_a_leak() {
        assert_no_secret_material("Authorization: Bearer abc", &[]);
    }
}
