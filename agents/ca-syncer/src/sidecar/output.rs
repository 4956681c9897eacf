//! The output file: read back for comparison, replaced atomically.
//!
//! The process may read the file at any moment (its own reload timer, a restart), so it must only ever see the
//! old bundle or the new one: the new bytes go to a temp file in the same directory (a rename is atomic only
//! within one file system), are flushed to disk, and the temp file is renamed over the output.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// Certificates are public and the process often runs as another user: world-readable, like kubelet's 0644.
const MODE: u32 = 0o644;

const TEMP_SUFFIX: &str = ".tmp";

/// The output's current bytes; `None` when there is no file yet.
pub(super) fn read_current(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Replaces `path` with `content` so that a reader sees either the old file or the whole new one.
pub(super) fn write_atomic(path: &Path, content: &[u8]) -> std::io::Result<()> {
    let dir = parent(path);
    let mut temp = tempfile::Builder::new().prefix(&temp_prefix(path)).suffix(TEMP_SUFFIX).tempfile_in(dir)?;
    temp.write_all(content)?;
    temp.as_file().set_permissions(std::fs::Permissions::from_mode(MODE))?;
    temp.as_file().sync_all()?;
    // On any error above, dropping `temp` removes the temp file.
    temp.persist(path).map_err(|e| e.error)?;
    // The rename itself is durable only once the directory is flushed too.
    std::fs::File::open(dir)?.sync_all()
}

/// Removes temp files a killed predecessor may have left next to the output. Best effort.
pub(super) fn remove_stale_temp_files(path: &Path) {
    let prefix = temp_prefix(path);
    let Ok(entries) = std::fs::read_dir(parent(path)) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name.ends_with(TEMP_SUFFIX) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => tracing::info!(file = %entry.path().display(), "removed a stale temp file"),
                Err(e) => tracing::warn!(file = %entry.path().display(), error = %e, "cannot remove a stale temp file"),
            }
        }
    }
}

/// Hidden, so a process that reads every file of the shared directory does not pick it up.
fn temp_prefix(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    format!(".{name}.")
}

fn parent(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_content_leaves_no_temp_file_and_is_world_readable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("ca.crt");
        assert_eq!(read_current(&out).expect("reads"), None);
        write_atomic(&out, b"first\n").expect("writes");
        write_atomic(&out, b"second\n").expect("writes");
        assert_eq!(read_current(&out).expect("reads").as_deref(), Some(&b"second\n"[..]));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("lists")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["ca.crt"]);
        let mode = std::fs::metadata(&out).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, MODE);
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("ca.crt");
        write_atomic(&out, b"good\n").expect("writes");
        // A directory where the output should be: the rename fails, the temp file is cleaned up.
        let blocked = dir.path().join("blocked");
        std::fs::create_dir(&blocked).expect("mkdir");
        std::fs::write(blocked.join("x"), b"x").expect("write");
        assert!(write_atomic(&blocked, b"new\n").is_err());
        assert_eq!(std::fs::read(&out).expect("reads"), b"good\n");
        let temps = std::fs::read_dir(dir.path())
            .expect("lists")
            .filter(|e| e.as_ref().expect("entry").file_name().to_string_lossy().ends_with(TEMP_SUFFIX))
            .count();
        assert_eq!(temps, 0);
    }

    #[test]
    fn stale_temp_files_of_this_output_are_removed_and_others_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("ca.crt");
        std::fs::write(dir.path().join(".ca.crt.abc123.tmp"), b"half").expect("write");
        std::fs::write(dir.path().join(".other.abc123.tmp"), b"not ours").expect("write");
        remove_stale_temp_files(&out);
        assert!(!dir.path().join(".ca.crt.abc123.tmp").exists());
        assert!(dir.path().join(".other.abc123.tmp").exists());
    }
}
