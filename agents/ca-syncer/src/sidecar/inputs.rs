//! Reading the watched directory's keys and turning them into one bundle.
//!
//! A key is read through its user-visible name (`key -> ..data/key`), so one read sees one consistent
//! projection: kubelet swaps `..data` atomically. Errors name the key and the kind of problem only; the bytes of
//! a key are never part of a message.

use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::ensure;
use time::OffsetDateTime;

use super::metrics::Reason;
use crate::bundle::{Bundle, BundleOptions};
use crate::certs::{EmptyPolicy, MAX_SOURCE_BYTES, SourceError, parse_certificates};

/// Which files of the directory are combined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Keys {
    /// Every non-hidden file, as listed at each read (keys come and go with the Secret).
    All,
    /// These keys, each of which must be present.
    Named(Vec<String>),
}

impl Keys {
    pub(super) fn from_args(keys: &[String]) -> anyhow::Result<Self> {
        let mut named: Vec<String> = Vec::new();
        for key in keys.iter().map(|k| k.trim()).filter(|k| !k.is_empty()) {
            // kubelet never projects such names, and a path would let a key point out of the volume.
            ensure!(!key.contains('/') && !key.starts_with('.'), "--key {key:?} is not a file name in --dir");
            if !named.iter().any(|k| k == key) {
                named.push(key.to_owned());
            }
        }
        Ok(if named.is_empty() { Self::All } else { Self::Named(named) })
    }
}

impl fmt::Display for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("(every file)"),
            Self::Named(keys) => f.write_str(&keys.join(",")),
        }
    }
}

/// Why an update was rejected. No variant carries key content.
#[derive(Debug, thiserror::Error)]
pub(super) enum InputError {
    #[error("listing {}: {source}", dir.display())]
    List { dir: PathBuf, source: std::io::Error },
    #[error("key {key:?} is missing")]
    Missing { key: String },
    #[error("reading key {key:?}: {source}")]
    Read { key: String, source: std::io::Error },
    #[error("key {key:?}: {source}")]
    Rejected { key: String, source: SourceError },
    #[error("no certificate in {}; --allow-empty writes an empty bundle", describe_keys(.keys))]
    Empty { keys: usize },
    #[error("every certificate has expired ({expired}); --keep-expired keeps them")]
    AllExpired { expired: usize },
}

fn describe_keys(keys: &usize) -> String {
    match *keys {
        0 => "the directory (no keys)".to_owned(),
        1 => "the key".to_owned(),
        n => format!("any of the {n} keys"),
    }
}

impl InputError {
    /// A bounded label for `errors_total{reason}`.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            Self::List { .. } | Self::Read { .. } => Reason::Read.into(),
            Self::Missing { .. } => Reason::MissingKey.into(),
            Self::Rejected { source, .. } => source.metric_label(),
            Self::Empty { .. } => Reason::NoCertificates.into(),
            Self::AllExpired { .. } => Reason::AllExpired.into(),
        }
    }
}

/// Reads every key, rejects the whole update on the first bad one, and builds the bundle.
pub(super) fn load(
    dir: &Path,
    keys: &Keys,
    allow_empty: bool,
    drop_expired: bool,
    now: OffsetDateTime,
) -> Result<Bundle, InputError> {
    let names = match keys {
        Keys::All => list_keys(dir)?,
        Keys::Named(names) => names.clone(),
    };
    let empty = if allow_empty { EmptyPolicy::Allow } else { EmptyPolicy::Reject };
    let mut certs = Vec::new();
    for key in &names {
        let bytes = read_key(dir, key)?;
        let parsed =
            parse_certificates(&bytes, empty).map_err(|source| InputError::Rejected { key: key.clone(), source })?;
        certs.extend(parsed);
    }
    let parsed = certs.len();
    let bundle = Bundle::build(certs, &BundleOptions { drop_expired, now });
    if bundle.is_empty() && !allow_empty {
        return Err(if parsed == 0 {
            InputError::Empty { keys: names.len() }
        } else {
            InputError::AllExpired { expired: bundle.dropped_expired().len() }
        });
    }
    Ok(bundle)
}

/// The directory's keys: every entry not starting with `.` (kubelet's `..data` and timestamped directories,
/// and hidden files) that is a file or a symlink to one, sorted.
fn list_keys(dir: &Path) -> Result<Vec<String>, InputError> {
    let list_error = |source| InputError::List { dir: dir.to_path_buf(), source };
    let mut keys = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(list_error)? {
        let entry = entry.map_err(list_error)?;
        let Ok(name) = entry.file_name().into_string() else {
            // kubelet projects only valid key names; anything else was not put there by it.
            tracing::debug!("skipping a file whose name is not UTF-8");
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        // Follows symlinks. A dangling link (a key removed while kubelet tidies up) is simply not a key.
        match std::fs::metadata(entry.path()) {
            Ok(meta) if meta.is_file() => keys.push(name),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(InputError::Read { key: name, source }),
        }
    }
    keys.sort();
    Ok(keys)
}

/// Reads one key, refusing more than the parser accepts without reading it all.
fn read_key(dir: &Path, key: &str) -> Result<Vec<u8>, InputError> {
    let read_error = |source| InputError::Read { key: key.to_owned(), source };
    let file = match std::fs::File::open(dir.join(key)) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(InputError::Missing { key: key.to_owned() }),
        Err(e) => return Err(read_error(e)),
    };
    let limit = u64::try_from(MAX_SOURCE_BYTES).unwrap_or(u64::MAX);
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes).map_err(read_error)?;
    if bytes.len() > MAX_SOURCE_BYTES {
        let size = std::fs::metadata(dir.join(key)).map(|m| m.len()).unwrap_or(limit.saturating_add(1));
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        let source = SourceError::TooLarge { size, limit: MAX_SOURCE_BYTES };
        return Err(InputError::Rejected { key: key.to_owned(), source });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::testcerts::{DAY, T2025, TestCa, at};

    fn now() -> OffsetDateTime {
        at(T2025 + 100 * DAY)
    }

    fn write(dir: &Path, files: &[(&str, &str)]) {
        for (name, content) in files {
            std::fs::write(dir.join(name), content).expect("write");
        }
    }

    #[test]
    fn key_names_are_trimmed_deduplicated_and_must_be_plain_file_names() {
        let keys = Keys::from_args(&[" ca.crt".into(), "tls.crt".into(), "ca.crt".into(), String::new()]);
        assert_eq!(keys.expect("valid"), Keys::Named(vec!["ca.crt".into(), "tls.crt".into()]));
        assert_eq!(Keys::from_args(&[]).expect("valid"), Keys::All);
        for bad in ["../etc/passwd", "a/b", "..data", ".hidden"] {
            assert!(Keys::from_args(&[bad.into()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn default_keys_skip_hidden_entries_directories_and_dangling_links() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = TestCa::root("a");
        write(dir.path(), &[("ca.crt", &a.pem()), (".hidden", "junk")]);
        std::fs::create_dir(dir.path().join("..2026_01_01")).expect("mkdir");
        std::fs::create_dir(dir.path().join("subdir")).expect("mkdir");
        std::os::unix::fs::symlink("..data/gone", dir.path().join("gone")).expect("symlink");
        assert_eq!(list_keys(dir.path()).expect("lists"), ["ca.crt"]);
    }

    #[test]
    fn keys_are_combined_deduplicated_and_expired_certificates_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = TestCa::root("a");
        let b = TestCa::root("b");
        let expired = TestCa::root_valid("old", at(T2025), at(T2025 + DAY));
        write(dir.path(), &[("ca.crt", &a.pem()), ("tls.crt", &format!("{}{}{}", b.pem(), a.pem(), expired.pem()))]);
        let bundle = load(dir.path(), &Keys::All, false, true, now()).expect("loads");
        assert_eq!(bundle.len(), 2);
        assert_eq!(bundle.dropped_expired().len(), 1);
        let kept = load(dir.path(), &Keys::All, false, false, now()).expect("loads");
        assert_eq!(kept.len(), 3);
    }

    #[test]
    fn one_bad_key_rejects_the_update_naming_the_key_but_not_the_content() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = TestCa::root("a");
        write(dir.path(), &[("ca.crt", &a.pem()), ("tls.key", &a.key_pem())]);
        let err = load(dir.path(), &Keys::All, false, true, now()).expect_err("rejected");
        assert_eq!(err.reason(), "private_key");
        let message = err.to_string();
        assert!(message.contains("\"tls.key\""), "{message}");
        assert!(!message.contains("BEGIN"), "{message}");
        // Naming only the certificate key is how a cert-manager Secret is mounted whole.
        let named = Keys::Named(vec!["ca.crt".into()]);
        assert_eq!(load(dir.path(), &named, false, true, now()).expect("loads").len(), 1);
    }

    #[test]
    fn missing_named_keys_empty_inputs_and_all_expired_are_errors_unless_allowed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let named = Keys::Named(vec!["ca.crt".into()]);
        assert_eq!(load(dir.path(), &named, false, true, now()).expect_err("missing").reason(), "missing_key");
        assert_eq!(load(dir.path(), &Keys::All, false, true, now()).expect_err("empty").reason(), "no_certificates");
        assert!(load(dir.path(), &Keys::All, true, true, now()).expect("allowed").is_empty());

        write(dir.path(), &[("ca.crt", "")]);
        assert_eq!(load(dir.path(), &named, false, true, now()).expect_err("empty").reason(), "no_certificates");
        assert!(load(dir.path(), &named, true, true, now()).expect("allowed").is_empty());

        let expired = TestCa::root_valid("old", at(T2025), at(T2025 + DAY));
        write(dir.path(), &[("ca.crt", &expired.pem())]);
        assert_eq!(load(dir.path(), &named, false, true, now()).expect_err("expired").reason(), "all_expired");
    }

    #[test]
    fn oversized_keys_are_refused_without_reading_them_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let big = vec![b' '; MAX_SOURCE_BYTES + 10];
        std::fs::write(dir.path().join("big"), big).expect("write");
        let err = load(dir.path(), &Keys::All, false, true, now()).expect_err("too large");
        assert_eq!(err.reason(), "too_large");
        assert!(err.to_string().contains(&(MAX_SOURCE_BYTES + 10).to_string()), "{err}");
    }

    #[test]
    fn bundle_bytes_do_not_depend_on_key_names_or_order() {
        let a = TestCa::root("a");
        let b = TestCa::root("b");
        let first = tempfile::tempdir().expect("tempdir");
        let second = tempfile::tempdir().expect("tempdir");
        let files: BTreeMap<&str, String> = [("x", a.pem()), ("y", b.pem())].into();
        write(first.path(), &files.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>());
        write(second.path(), &[("z", &format!("{}{}", b.pem(), a.pem()))]);
        let one = load(first.path(), &Keys::All, false, true, now()).expect("loads").render();
        let two = load(second.path(), &Keys::All, false, true, now()).expect("loads").render();
        assert_eq!(one, two);
    }
}
