//! Writes files into a directory exactly the way kubelet projects a ConfigMap or Secret volume, so CoreDNS
//! `import`/`reload` and our file watchers see what they would see in a pod:
//!
//! ```text
//! dir/..2026_11_30_06_40_00.123456789/<key>   the payload, in a fresh timestamped directory
//! dir/..data -> ..2026_11_30_...              swapped atomically (symlink created aside, then renamed)
//! dir/<key> -> ..data/<key>                   user-visible names, created once
//! ```

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::Path;

use anyhow::{Context, Result, ensure};

const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

/// Replaces the projected content of `dir` with `files` (key -> content) in one atomic step.
pub fn project(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    for key in files.keys() {
        ensure!(!key.is_empty() && !key.contains('/') && !key.starts_with(".."), "invalid key {key:?}");
    }
    let now = time::OffsetDateTime::now_utc();
    let stamp = format!(
        "..{:04}_{:02}_{:02}_{:02}_{:02}_{:02}.{}",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        rand::random::<u32>()
    );
    let ts_dir = dir.join(&stamp);
    std::fs::create_dir(&ts_dir)?;
    for (key, content) in files {
        std::fs::write(ts_dir.join(key), content).with_context(|| format!("writing {key}"))?;
    }
    let old = std::fs::read_link(dir.join(DATA)).ok();
    let tmp = dir.join(DATA_TMP);
    let _ = std::fs::remove_file(&tmp);
    symlink(&stamp, &tmp)?;
    std::fs::rename(&tmp, dir.join(DATA)).context("swapping ..data")?;
    for key in files.keys() {
        let link = dir.join(key);
        if std::fs::symlink_metadata(&link).is_err() {
            symlink(Path::new(DATA).join(key), &link)?;
        }
    }
    // Remove user-visible links of keys that are gone, then the previous payload.
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !files.contains_key(&name) {
            std::fs::remove_file(dir.join(&name))?;
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old))?;
    }
    Ok(())
}

/// Projects string data, as a ConfigMap's `data` holds it.
pub fn project_strings(dir: &Path, data: &BTreeMap<String, String>) -> Result<()> {
    project(dir, &data.iter().map(|(k, v)| (k.clone(), v.as_bytes().to_vec())).collect())
}

/// Fetches a ConfigMap and projects its `data` into `dir`, as kubelet would after its sync.
pub async fn project_configmap(client: &kube::Client, namespace: &str, name: &str, dir: &Path) -> Result<()> {
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(client.clone(), namespace);
    let cm = api.get(name).await.with_context(|| format!("reading ConfigMap {namespace}/{name}"))?;
    project_strings(dir, &cm.data.unwrap_or_default())
}

/// The kubelet's side of a ConfigMap volume, kept up: polls ConfigMap `namespace/name` every `interval` and
/// projects its `data` into `dir` whenever it changed (a ConfigMap that does not exist projects nothing, as
/// an optional volume). The real kubelet's delay is its sync period plus its cache TTL; here it is `interval`.
/// Stops when the returned handle is dropped.
pub fn follow_configmap(
    client: kube::Client,
    namespace: &str,
    name: &str,
    dir: &Path,
    interval: std::time::Duration,
) -> Following {
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(client, namespace);
    let (name, dir) = (name.to_string(), dir.to_path_buf());
    let task = tokio::spawn(async move {
        let mut projected: Option<BTreeMap<String, String>> = None;
        loop {
            if let Ok(Some(cm)) = api.get_opt(&name).await {
                let data = cm.data.unwrap_or_default();
                if projected.as_ref() != Some(&data) {
                    match project_strings(&dir, &data) {
                        Ok(()) => projected = Some(data),
                        Err(e) => eprintln!("projecting ConfigMap {name}: {e:#}"),
                    }
                }
            }
            tokio::time::sleep(interval).await;
        }
    });
    Following(task)
}

/// A running [`follow_configmap`]; dropping it stops the projection.
pub struct Following(tokio::task::JoinHandle<()>);

impl Drop for Following {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect()
    }

    #[test]
    fn projection_swaps_data_symlink_and_keeps_key_links_stable() {
        let dir = tempfile::tempdir().unwrap();
        project(dir.path(), &map(&[("a", "1"), ("b", "2")])).unwrap();
        let first = std::fs::read_link(dir.path().join(DATA)).unwrap();
        assert_eq!(std::fs::read_link(dir.path().join("a")).unwrap(), Path::new("..data/a"));
        assert_eq!(std::fs::read_to_string(dir.path().join("a")).unwrap(), "1");

        project(dir.path(), &map(&[("a", "3")])).unwrap();
        let second = std::fs::read_link(dir.path().join(DATA)).unwrap();
        assert_ne!(first, second, "..data must point at a new timestamped directory");
        assert!(!dir.path().join(&first).exists(), "the old payload is removed");
        assert_eq!(std::fs::read_to_string(dir.path().join("a")).unwrap(), "3");
        assert!(std::fs::symlink_metadata(dir.path().join("b")).is_err(), "a removed key's link is removed");
        assert!(std::fs::symlink_metadata(dir.path().join(DATA_TMP)).is_err());
    }

    #[test]
    fn projection_rejects_keys_that_escape_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert!(project(dir.path(), &map(&[("../x", "1")])).is_err());
        assert!(project(dir.path(), &map(&[("..data", "1")])).is_err());
    }
}
