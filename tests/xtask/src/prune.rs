//! Keeps a long-lived target directory from filling the disk. Every rebuild of a test binary writes a new
//! `deps/<name>-<hash>` (50 to 130 MiB each, with line tables) and leaves the old one, and a test bed keeps its files
//! in `node-bed-<binary>` or `kcp-bed-<binary>` beside it; after a few days of work the superseded ones held 17 GiB
//! here, and a full run on that machine ran out of space. A full run knows every test binary it builds, so it
//! removes the older builds of those binaries and the beds of binaries that no longer exist. Libraries, the
//! binaries `cargo build` uplifts (hard links) and anything of a name the run did not build are left alone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// What [`superseded`] found: files and directories, and the bytes they hold.
#[derive(Debug, Default, PartialEq)]
pub struct Stale {
    pub paths: Vec<PathBuf>,
    pub bytes: u64,
}

/// `<name>-<16 hex digits>`, cargo's file name for a test executable: the name.
fn build_name(file: &str) -> Option<&str> {
    let (name, hash) = file.rsplit_once('-')?;
    (hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit())).then_some(name)
}

/// The older builds of `current` (the executables this run built, all in one `deps` directory) and the beds of
/// builds that are not current: `node-bed-<file>` and `kcp-bed-<file>` in the profile directory above `deps`.
pub fn superseded(current: &[PathBuf]) -> Stale {
    let mut stale = Stale::default();
    let Some(deps) = current.first().and_then(|p| p.parent()) else { return stale };
    let files: BTreeSet<&str> = current.iter().filter_map(|p| p.file_name()?.to_str()).collect();
    let names: BTreeSet<&str> = files.iter().filter_map(|f| build_name(f)).collect();
    let mut add = |path: PathBuf| {
        stale.bytes += size(&path);
        stale.paths.push(path);
    };
    for entry in std::fs::read_dir(deps).into_iter().flatten().flatten() {
        let Ok(file) = entry.file_name().into_string() else { continue };
        let Ok(meta) = entry.metadata() else { continue };
        let old_build = build_name(&file).is_some_and(|n| names.contains(n)) && !files.contains(file.as_str());
        if old_build && meta.is_file() && !uplifted(&meta) {
            add(entry.path());
        }
    }
    let Some(profile) = deps.parent() else { return stale };
    for entry in std::fs::read_dir(profile).into_iter().flatten().flatten() {
        let Ok(dir) = entry.file_name().into_string() else { continue };
        let Some(binary) = dir.strip_prefix("node-bed-").or_else(|| dir.strip_prefix("kcp-bed-")) else { continue };
        if build_name(binary).is_some() && !files.contains(binary) && entry.path().is_dir() {
            add(entry.path());
        }
    }
    stale
}

/// A file cargo also links into the profile directory (a `--bins` build): removing it would cost a rebuild.
fn uplifted(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    meta.nlink() > 1
}

fn size(path: &Path) -> u64 {
    if path.is_dir() { walkdir(path) } else { std::fs::symlink_metadata(path).map(|m| m.len()).unwrap_or(0) }
}

fn walkdir(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => walkdir(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}

/// Removes what [`superseded`] finds and says how much; a path that cannot be removed (a bed still mounted by a
/// run of another checkout) is named and left.
pub fn remove_superseded(current: &[PathBuf]) {
    let stale = superseded(current);
    if stale.paths.is_empty() {
        return;
    }
    for path in &stale.paths {
        let removed = if path.is_dir() { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
        if let Err(e) = removed {
            eprintln!("xtask: could not remove the superseded {}: {e}", path.display());
        }
    }
    eprintln!(
        "xtask: removed {} superseded test builds and beds ({:.1} GiB) from the target directory",
        stale.paths.len(),
        stale.bytes as f64 / (1u64 << 30) as f64
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path, bytes: usize) {
        std::fs::write(path, vec![0u8; bytes]).unwrap();
    }

    #[test]
    fn only_older_builds_of_this_runs_binaries_and_beds_of_gone_binaries_are_removed() {
        let target = tempfile::tempdir().unwrap();
        let deps = target.path().join("debug/deps");
        std::fs::create_dir_all(&deps).unwrap();
        let current = deps.join("node-0c8d2cda6324d9e6");
        touch(&current, 10);
        touch(&deps.join("node-6c062cf2de478367"), 100);
        // A library, another package's binary and an uplifted `--bins` build stay.
        touch(&deps.join("libnode-6c062cf2de478367.rlib"), 1);
        touch(&deps.join("demo-8ca74afddbfd90e9"), 1);
        touch(&deps.join("node-1111111111111111"), 1);
        std::fs::hard_link(deps.join("node-1111111111111111"), target.path().join("debug/node")).unwrap();
        for bed in ["node-bed-node-0c8d2cda6324d9e6", "node-bed-node-6c062cf2de478367", "kcp-bed-shared"] {
            std::fs::create_dir_all(target.path().join("debug").join(bed)).unwrap();
        }
        touch(&target.path().join("debug/node-bed-node-6c062cf2de478367/log"), 7);

        let stale = superseded(std::slice::from_ref(&current));
        let mut names: Vec<_> = stale.paths.iter().map(|p| p.file_name().unwrap().to_str().unwrap()).collect();
        names.sort();
        assert_eq!(names, ["node-6c062cf2de478367", "node-bed-node-6c062cf2de478367"]);
        assert_eq!(stale.bytes, 107);

        remove_superseded(std::slice::from_ref(&current));
        assert!(current.exists() && deps.join("demo-8ca74afddbfd90e9").exists());
        assert!(superseded(std::slice::from_ref(&current)).paths.is_empty());
    }

    #[test]
    fn a_run_that_built_nothing_removes_nothing() {
        assert_eq!(superseded(&[]), Stale::default());
    }
}
