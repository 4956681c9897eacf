//! The hub's kubeconfig and every CA the agents manage expire: the earliest notAfter of what a Secret or
//! ConfigMap holds, against now, read from the certificates themselves (DER in, times out), never printing their
//! content; or, without reading any of them, the notAfters kubeconfig-rotator and ca-syncer export for what they
//! keep ([`rotator_targets`], [`ca_syncer_bundles`]).

use std::collections::BTreeMap;

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

/// Per key, the samples of the replica that synced it last: a follower exports nothing or what it saw when it
/// last held the Lease; the one with the newest `last_sync` speaks for the key. `key_label` names the key
/// (`kubeconfig`, `bundle`), `sync` the family of the last sync's time, `wanted` the family read.
fn freshest<T>(
    texts: &[String],
    key_label: &str,
    sync: &str,
    wanted: &str,
    item: impl Fn(&super::Sample) -> Option<T>,
) -> BTreeMap<String, Vec<T>> {
    let mut best: BTreeMap<String, (f64, Vec<T>)> = BTreeMap::new();
    for text in texts {
        let mut synced: BTreeMap<String, f64> = BTreeMap::new();
        let mut items: BTreeMap<String, Vec<T>> = BTreeMap::new();
        for s in super::samples(text) {
            let Some(key) = s.label(key_label) else { continue };
            if s.name == sync {
                synced.insert(key, s.value);
            } else if s.name == wanted
                && let Some(t) = item(&s)
            {
                items.entry(key).or_default().push(t);
            }
        }
        for (key, list) in items {
            let at = synced.get(&key).copied().unwrap_or(0.0);
            if best.get(&key).is_none_or(|(b, _)| at > *b) {
                best.insert(key, (at, list));
            }
        }
    }
    best.into_iter().map(|(k, (_, v))| (k, v)).collect()
}

/// kubeconfig-rotator's replicas' expositions: per target (`namespace/name`, and its kubeconfig), the notAfter of
/// the credential it holds (0: none usable), from `kubeconfig_rotator_target_not_after_timestamp_seconds`.
pub fn rotator_targets(texts: &[String]) -> BTreeMap<(String, String), f64> {
    let per = freshest(
        texts,
        "kubeconfig",
        "kubeconfig_rotator_last_sync_timestamp_seconds",
        "kubeconfig_rotator_target_not_after_timestamp_seconds",
        |s| Some((format!("{}/{}", s.label("namespace")?, s.label("name")?), s.value)),
    );
    per.into_iter().flat_map(|(kc, ts)| ts.into_iter().map(move |(t, v)| ((t, kc.clone()), v))).collect()
}

/// ca-syncer's replicas' expositions: per bundle, the notAfter of each certificate in it, from
/// `ca_syncer_certificate_not_after_timestamp_seconds`.
pub fn ca_syncer_bundles(texts: &[String]) -> BTreeMap<String, Vec<i64>> {
    let per = freshest(
        texts,
        "bundle",
        "ca_syncer_last_sync_timestamp_seconds",
        "ca_syncer_certificate_not_after_timestamp_seconds",
        |s| Some(s.value as i64),
    );
    per.into_iter().collect()
}

/// One line per target of kubeconfig-rotator: the expiry of the credential it holds.
pub fn judge_rotator(targets: &BTreeMap<(String, String), f64>, now: i64, m: Margins) -> Vec<Verdict> {
    let todo =
        "see kubeconfig-rotator's log and kubeconfig_rotator_verification_failures_total: it renews before expiry";
    if targets.is_empty() {
        return vec![Verdict::warn(
            KUBECONFIG,
            "kubeconfig-rotator",
            "its metrics name no target",
            "check --rotator-metrics",
        )];
    }
    targets
        .iter()
        .map(|((target, kc), not_after)| {
            let subject = format!("kubeconfig-rotator target {target} (kubeconfig {kc})");
            if *not_after <= 0.0 {
                Verdict::fail(KUBECONFIG, subject, "holds no usable credential", todo)
            } else {
                judge(KUBECONFIG, &subject, &[*not_after as i64], now, m, todo)
            }
        })
        .collect()
}

/// One line per bundle of ca-syncer: its earliest certificate's expiry.
pub fn judge_ca_syncer(bundles: &BTreeMap<String, Vec<i64>>, now: i64, m: Margins) -> Vec<Verdict> {
    let todo = "renew the CA (its cert-manager Certificate) and let ca-syncer carry old and new";
    if bundles.is_empty() {
        return vec![Verdict::warn(
            CA,
            "ca-syncer",
            "its metrics name no bundle certificate",
            "check --ca-syncer-metrics",
        )];
    }
    bundles.iter().map(|(b, ends)| judge(CA, &format!("ca-syncer bundle {b}"), ends, now, m, todo)).collect()
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
    fn the_replica_that_synced_a_kubeconfig_or_bundle_last_speaks_for_it_and_an_empty_target_fails() {
        let now = 1_800_000_000;
        let day = 86400.0;
        // The old leader still exports what its target held when it led; the new one synced later.
        let old = format!(
            "kubeconfig_rotator_last_sync_timestamp_seconds{{kubeconfig=\"hub\"}} 100\n\
             kubeconfig_rotator_target_not_after_timestamp_seconds{{kubeconfig=\"hub\",namespace=\"apps\",name=\"kcp\"}} {}\n\
             ca_syncer_last_sync_timestamp_seconds{{bundle=\"kcp\"}} 100\n\
             ca_syncer_certificate_not_after_timestamp_seconds{{bundle=\"kcp\",subject=\"CN=old, O=x\",sha256=\"aa\"}} {}\n",
            now as f64 + 2.0 * day,
            now as f64 + 2.0 * day
        );
        let new = format!(
            "kubeconfig_rotator_last_sync_timestamp_seconds{{kubeconfig=\"hub\"}} 200\n\
             kubeconfig_rotator_target_not_after_timestamp_seconds{{kubeconfig=\"hub\",namespace=\"apps\",name=\"kcp\"}} {}\n\
             kubeconfig_rotator_target_not_after_timestamp_seconds{{kubeconfig=\"hub\",namespace=\"apps\",name=\"empty\"}} 0\n\
             ca_syncer_last_sync_timestamp_seconds{{bundle=\"kcp\"}} 200\n\
             ca_syncer_certificate_not_after_timestamp_seconds{{bundle=\"kcp\",subject=\"CN=new, O=x\",sha256=\"bb\"}} {}\n\
             ca_syncer_certificate_not_after_timestamp_seconds{{bundle=\"kcp\",subject=\"CN=root, O=x\",sha256=\"cc\"}} {}\n",
            now as f64 + 90.0 * day,
            now as f64 + 365.0 * day,
            now as f64 + 20.0 * day
        );
        let texts = vec![old, new];
        let targets = rotator_targets(&texts);
        assert_eq!(targets.len(), 2, "{targets:?}");
        let lines = judge_rotator(&targets, now, Margins::default());
        let of = |t: &str| lines.iter().find(|v| v.subject.contains(t)).unwrap();
        assert_eq!(of("apps/kcp ").result, Level::Ok, "{lines:?}");
        assert_eq!(of("apps/empty").result, Level::Fail, "{lines:?}");
        assert_eq!(of("apps/kcp ").subject, "kubeconfig-rotator target apps/kcp (kubeconfig hub)");
        let bundles = ca_syncer_bundles(&texts);
        assert_eq!(bundles["kcp"].len(), 2, "the newer replica's two certificates, not the old one's: {bundles:?}");
        let lines = judge_ca_syncer(&bundles, now, Margins::default());
        assert_eq!((lines.len(), lines[0].result), (1, Level::Warn), "the earliest, 20 days, decides: {lines:?}");
        assert_eq!(judge_rotator(&Default::default(), now, Margins::default())[0].result, Level::Warn);
        assert_eq!(judge_ca_syncer(&Default::default(), now, Margins::default())[0].result, Level::Warn);
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
