//! The directory watcher on the real filesystem, with volumes updated exactly the way kubelet updates them
//! (`testbed::projection`: a fresh timestamped directory, then an atomic `..data` symlink swap).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use kcp_keeper_runtime::dirwatch::{self, WatchSettings};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const TIMEOUT: Duration = Duration::from_secs(10);

fn project(dir: &Path, value: &str) {
    let files = BTreeMap::from([("value".to_string(), value.to_string())]);
    testbed::projection::project_strings(dir, &files).expect("projection");
}

/// What a test's loader saw: every successful load, in order.
#[derive(Default)]
struct Loads {
    seen: Mutex<Vec<u32>>,
    attempts: AtomicUsize,
}

fn loader(file: PathBuf, loads: Arc<Loads>) -> impl Fn() -> Result<u32, String> + Send + Sync + 'static {
    move || {
        loads.attempts.fetch_add(1, Ordering::SeqCst);
        let text = std::fs::read_to_string(&file).map_err(|e| format!("read: {e}"))?;
        let value = text.trim().parse::<u32>().map_err(|_| "not a number".to_string())?;
        loads.seen.lock().unwrap().push(value);
        Ok(value)
    }
}

async fn wait_for_value(rx: &mut watch::Receiver<Arc<u32>>, expected: u32) {
    tokio::time::timeout(TIMEOUT, rx.wait_for(|v| **v == expected))
        .await
        .unwrap_or_else(|_| panic!("value {expected} not published within {TIMEOUT:?}"))
        .expect("the follow task is alive");
}

async fn wait_until(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn kubelet_swaps_are_followed_and_a_bad_update_keeps_the_last_good_value_and_is_reported_once() {
    let dir = tempfile::tempdir().unwrap();
    project(dir.path(), "1");
    let loads = Arc::new(Loads::default());
    let errors = Arc::new(AtomicUsize::new(0));
    let shutdown = CancellationToken::new();
    let settings = WatchSettings { debounce: Duration::from_millis(50), poll: Duration::from_millis(200) };
    let counted = errors.clone();
    let mut rx = dirwatch::follow(
        dir.path(),
        settings,
        1,
        loader(dir.path().join("value"), loads.clone()),
        move |_: &String| {
            counted.fetch_add(1, Ordering::SeqCst);
        },
        shutdown.clone(),
    );

    project(dir.path(), "2");
    wait_for_value(&mut rx, 2).await;

    project(dir.path(), "not a number");
    wait_until("the bad update to be reported", || errors.load(Ordering::SeqCst) == 1).await;
    // Several polls re-read the same bad content: it stays unreported and the last good value stays.
    let attempts = loads.attempts.load(Ordering::SeqCst);
    wait_until("three more polls", || loads.attempts.load(Ordering::SeqCst) >= attempts + 3).await;
    assert_eq!(errors.load(Ordering::SeqCst), 1, "an unchanged bad file is reported once, not on every poll");
    assert_eq!(**rx.borrow(), 2, "the last good value stays");

    project(dir.path(), "3");
    wait_for_value(&mut rx, 3).await;
    shutdown.cancel();
}

#[tokio::test]
async fn a_burst_of_updates_is_read_once_it_settled_so_no_intermediate_value_is_published() {
    let dir = tempfile::tempdir().unwrap();
    project(dir.path(), "0");
    let loads = Arc::new(Loads::default());
    let shutdown = CancellationToken::new();
    // No poll during the test: every load comes from an event.
    // A debounce far above the burst's spacing: a stall of a loaded machine mid-burst must not settle it.
    let settings = WatchSettings { debounce: Duration::from_secs(2), poll: Duration::from_secs(3600) };
    let mut rx = dirwatch::follow(
        dir.path(),
        settings,
        0,
        loader(dir.path().join("value"), loads.clone()),
        |_: &String| {},
        shutdown.clone(),
    );
    // Ten updates 40 ms apart: a burst slower than a read, far quicker than the debounce.
    for value in 1..=10 {
        project(dir.path(), &value.to_string());
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    wait_for_value(&mut rx, 10).await;
    let seen = loads.seen.lock().unwrap().clone();
    assert_eq!(seen, [10], "only the settled content is read (a watcher without debounce reads mid-burst)");
    shutdown.cancel();
}

#[tokio::test]
async fn the_watchers_own_reads_do_not_wake_it() {
    let dir = tempfile::tempdir().unwrap();
    // A plain file in the watched directory: reading it opens it there (a projected key lives one level down).
    let file = dir.path().join("value");
    std::fs::write(&file, "1").unwrap();
    let loads = Arc::new(Loads::default());
    let shutdown = CancellationToken::new();
    let settings = WatchSettings { debounce: Duration::from_millis(50), poll: Duration::from_secs(3600) };
    let mut rx = dirwatch::follow(
        dir.path(),
        settings,
        1,
        loader(file.clone(), loads.clone()),
        |_: &String| {},
        shutdown.clone(),
    );
    std::fs::write(&file, "2").unwrap();
    wait_for_value(&mut rx, 2).await;
    let attempts = loads.attempts.load(Ordering::SeqCst);
    // If opening the file woke the watcher, every load would cause the next one: a busy loop. Nothing else
    // touches the directory, so any further load in this window would be one.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(loads.attempts.load(Ordering::SeqCst), attempts, "reads must not wake the watcher");
    shutdown.cancel();
}
