//! One watcher for mounted ConfigMap and Secret volumes, shared by the configuration reload and ca-syncer's
//! sidecar (and by any agent that reads credentials or CA files from a volume).
//!
//! Why it looks the way it does:
//! - kubelet updates a volume by writing a fresh timestamped directory and swapping the `..data` symlink, so a
//!   watch on a file would stay on the old inode forever. The *directory* is watched (not recursively: the swap
//!   happens in it), and every event is only a hint to re-read: the reader follows the symlinks anew.
//! - One update is a burst of events (create, write, rename, delete). [`DirWatch::next`] waits until the
//!   directory has been quiet for the debounce, bounded so a directory that never calms down is still read.
//! - Opens and reads are not changes: without that filter our own reading would wake us again, forever.
//! - inotify can lose events (queue overflow, watch limit reached): a poll re-reads anyway, and a watch that
//!   cannot be set up degrades to polling only, with a warning, rather than failing the agent.
//!
//! [`follow`] builds the common case on top: load, keep the last good content when a load fails (logged and
//! reported once per distinct error, not on every poll), publish each new valid content on a `watch` channel.

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::Watcher as _;
use notify::event::{AccessKind, AccessMode, EventKind};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How a directory is watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchSettings {
    /// Quiet time after an event before the directory is read (one kubelet update is a burst of events).
    pub debounce: Duration,
    /// Re-read this often even without an event: the backstop for a missed event.
    pub poll: Duration,
}

impl Default for WatchSettings {
    fn default() -> Self {
        Self { debounce: Duration::from_millis(200), poll: Duration::from_secs(30) }
    }
}

/// Why [`DirWatch::next`] woke up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Something in the directory changed (or events were lost) and has settled.
    Changed,
    /// The poll interval passed without an event.
    Poll,
}

/// Wakes its owner when a directory changed (debounced) or the poll interval passed.
pub struct DirWatch {
    dir: PathBuf,
    settings: WatchSettings,
    changed: Arc<Notify>,
    /// Dropping the watcher ends the notifications; `None` when only polling works.
    _watcher: Option<notify::RecommendedWatcher>,
    next_poll: Instant,
}

impl DirWatch {
    /// Starts watching `dir`. If the watch cannot be set up (typically the node's inotify limit), this logs a
    /// warning and polls only: slower, but it converges. [`DirWatch::is_polling_only`] says which.
    pub fn new(dir: impl Into<PathBuf>, settings: WatchSettings) -> Self {
        let dir = dir.into();
        let changed = Arc::new(Notify::new());
        let watcher = match watch_dir(&dir, changed.clone()) {
            Ok(watcher) => Some(watcher),
            Err(error) => {
                tracing::warn!(%error, dir = %dir.display(), "cannot watch the directory; polling only");
                None
            }
        };
        Self { dir, settings, changed, _watcher: watcher, next_poll: Instant::now() + settings.poll }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn is_polling_only(&self) -> bool {
        self._watcher.is_none()
    }

    /// Waits for the next reason to re-read the directory. Select it only against shutdown: a future dropped
    /// while the burst settles loses that wake-up.
    pub async fn next(&mut self) -> Wake {
        tokio::select! {
            () = self.changed.notified() => {
                self.settle().await;
                self.next_poll = Instant::now() + self.settings.poll;
                Wake::Changed
            }
            () = tokio::time::sleep_until(self.next_poll) => {
                self.next_poll = Instant::now() + self.settings.poll;
                Wake::Poll
            }
        }
    }

    /// Returns once no event arrived for the debounce, or after ten debounces (at least a second) in all.
    async fn settle(&self) {
        let quiet = self.settings.debounce;
        let deadline = Instant::now() + quiet.saturating_mul(10).max(Duration::from_secs(1));
        loop {
            tokio::select! {
                () = self.changed.notified() => {
                    if Instant::now() >= deadline {
                        return;
                    }
                }
                () = tokio::time::sleep(quiet) => return,
            }
        }
    }
}

/// Watches `dir` and wakes `changed` on every event except opens and reads.
fn watch_dir(dir: &Path, changed: Arc<Notify>) -> notify::Result<notify::RecommendedWatcher> {
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
        // A file closed after writing is a change; every other access is not.
        Ok(event) if matches!(event.kind, EventKind::Access(kind) if kind != AccessKind::Close(AccessMode::Write)) => {}
        Ok(_) => changed.notify_one(),
        Err(error) => {
            // E.g. a queue overflow: events were lost, so re-read.
            tracing::warn!(%error, "file watch error; re-reading");
            changed.notify_one();
        }
    })?;
    watcher.watch(dir, notify::RecursiveMode::NonRecursive)?;
    Ok(watcher)
}

/// The directory a file lives in (`.` for a bare file name).
pub fn parent_dir(file: &Path) -> PathBuf {
    file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf()
}

/// Follows content loaded from a watched directory: `load` runs on every change and poll; a value that
/// differs from the current one is published; a failed load keeps the current value. Each distinct error is
/// logged and passed to `on_error` once (an unchanged bad file is not reported on every poll); a success in
/// between resets that.
///
/// `load` runs on a blocking thread (file I/O). Its errors are logged with their Display, so they must name
/// what is wrong, never the content. The task ends when `shutdown` is cancelled.
pub fn follow<T, E, L, R>(
    dir: impl Into<PathBuf>,
    settings: WatchSettings,
    initial: T,
    load: L,
    mut on_error: R,
    shutdown: CancellationToken,
) -> watch::Receiver<Arc<T>>
where
    T: PartialEq + Send + Sync + 'static,
    E: Display + Send + 'static,
    L: Fn() -> Result<T, E> + Send + Sync + 'static,
    R: FnMut(&E) + Send + 'static,
{
    let (tx, rx) = watch::channel(Arc::new(initial));
    let mut dirwatch = DirWatch::new(dir, settings);
    let load = Arc::new(load);
    tokio::spawn(async move {
        let mut last_error: Option<String> = None;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                wake = dirwatch.next() => tracing::trace!(?wake, dir = %dirwatch.dir().display(), "re-reading"),
            }
            let load = load.clone();
            let loaded = match tokio::task::spawn_blocking(move || load()).await {
                Ok(loaded) => loaded,
                Err(error) => {
                    tracing::error!(%error, "loading panicked; keeping the previous content");
                    continue;
                }
            };
            match loaded {
                Ok(value) => {
                    if last_error.take().is_some() {
                        tracing::info!(dir = %dirwatch.dir().display(), "content is valid again");
                    }
                    let changed = tx.send_if_modified(|current| {
                        if **current == value {
                            return false;
                        }
                        *current = Arc::new(value);
                        true
                    });
                    if changed {
                        tracing::info!(dir = %dirwatch.dir().display(), "new content applied");
                    }
                }
                Err(error) => {
                    let message = error.to_string();
                    if last_error.as_deref() == Some(message.as_str()) {
                        continue;
                    }
                    tracing::error!(error = %message, "not applied; keeping the last good content");
                    on_error(&error);
                    last_error = Some(message);
                }
            }
        }
    });
    rx
}
