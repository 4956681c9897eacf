//! The shard's lock against a real versitygw: one holder at a time, a waiter that waits and then refuses with
//! the holder named, a lock left by a process that no longer runs taken over at once, and a holder whose lock
//! was taken over publishes nothing and never removes its successor's; a renewing holder is never taken over
//! however long a waiter waits, and a holder the store takes no renewal from stops before a waiter may take over.

mod common;

use std::time::Duration;

use common::*;
use etcd_snapshotter::config::Config;
use etcd_snapshotter::shard_lock::{self, Holder, LockError};
use etcd_snapshotter::storage::Store;

async fn store(bed: &Bed) -> Store {
    store_at(bed, &bed.s3.endpoint, "2m")
}

/// A store reached at `endpoint` (the bed's, or a fault proxy before it) whose lock expires after `expiry`.
fn store_at(bed: &Bed, endpoint: &str, expiry: &str) -> Store {
    let mut options = Options::new(bed, "root", vec!["http://127.0.0.1:1".into()]);
    (options.s3_endpoint, options.lock_expiry, options.attempt_timeout) = (endpoint.into(), expiry, "3s");
    let config: Config = kcp_keeper_runtime::config::load(&write_config(bed, &options).unwrap()).unwrap();
    Store::new(&config.storage).unwrap()
}

fn nothing(_: &str) {}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_run_waits_while_the_shard_is_held_refuses_naming_the_holder_and_gets_it_once_released() {
    let bed = Bed::start().await.unwrap();
    let store = store(&bed).await;
    let held = shard_lock::acquire(&store, "root", "run", Duration::ZERO, nothing).await.unwrap();
    let told = std::sync::Mutex::new(Vec::new());
    let error = shard_lock::acquire(&store, "root", "snapshot", Duration::from_secs(3), |h: &str| {
        told.lock().unwrap().push(h.to_string())
    })
    .await
    .err()
    .expect("held by the first");
    let message = error.to_string();
    assert!(matches!(error, LockError::Busy { .. }), "{message}");
    assert!(message.contains("another run holds the shard's lock: run (pid"), "{message}");
    assert_eq!(told.lock().unwrap().len(), 1, "told once: {told:?}");
    // Another shard is not held.
    let alpha = shard_lock::acquire(&store, "alpha", "snapshot", Duration::ZERO, nothing).await.unwrap();
    alpha.release().await;

    let told_to_wait = std::sync::Arc::new(tokio::sync::Notify::new());
    let waiter = {
        let (store, told_to_wait) = (store.clone(), told_to_wait.clone());
        tokio::spawn(async move {
            let waiting = move |_: &str| told_to_wait.notify_one();
            shard_lock::acquire(&store, "root", "snapshot", Duration::from_secs(60), waiting).await
        })
    };
    tokio::time::timeout(Duration::from_secs(30), told_to_wait.notified()).await.expect("the waiter finds it held");
    assert!(!waiter.is_finished(), "it waits while the lock is held");
    held.release().await;
    let second = tokio::time::timeout(Duration::from_secs(30), waiter).await.unwrap().unwrap().unwrap();
    second.confirm().await.unwrap();
    second.release().await;
    let key = shard_lock::key(&store.prefix, "root");
    let s3 = bed.s3.client();
    let body = s3.get_object().bucket(&bed.s3.bucket).key(&key).send().await.unwrap().body.collect().await.unwrap();
    let left: Holder = serde_json::from_slice(&body.into_bytes()).unwrap();
    assert!(left.released, "released: the lock says it is free");
    assert_eq!(keys(&s3, &bed.s3.bucket).await.len(), 2, "one lock object per shard, nothing else");
    let third = shard_lock::acquire(&store, "root", "snapshot", Duration::ZERO, nothing).await.unwrap();
    third.release().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_renewal_changes_the_lock_objects_etag_so_a_waiter_never_reads_a_renewing_lock_as_stale() {
    let bed = Bed::start().await.unwrap();
    let store = store(&bed).await;
    let held = shard_lock::acquire(&store, "root", "run", Duration::ZERO, nothing).await.unwrap();
    let (s3, key) = (bed.s3.client(), shard_lock::key(&store.prefix, "root"));
    let etag = || async { s3.head_object().bucket(&bed.s3.bucket).key(&key).send().await.unwrap().e_tag.unwrap() };
    // A waiter takes over a lock whose ETag stays the same for the expiry: each renewal must change it.
    let mut seen = vec![etag().await];
    for _ in 0..3 {
        held.confirm().await.expect("still ours");
        seen.push(etag().await);
    }
    let distinct: std::collections::HashSet<&String> = seen.iter().collect();
    assert_eq!(distinct.len(), seen.len(), "an ETag repeated across renewals: {seen:?}");
    held.release().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lock_left_by_a_process_that_no_longer_runs_is_taken_over_at_once_and_its_holder_publishes_nothing() {
    let bed = Bed::start().await.unwrap();
    let store = store(&bed).await;
    let s3 = bed.s3.client();
    // A lock as a run of this host that has since exited would have left it.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    let holder = Holder {
        token: "left-by-a-dead-run".into(),
        command: "snapshot".into(),
        host: read("/proc/sys/kernel/hostname").unwrap_or_default(),
        pid: dead,
        boot_id: read("/proc/sys/kernel/random/boot_id"),
        pid_namespace: std::fs::read_link("/proc/self/ns/pid").ok().map(|p| p.display().to_string()),
        start_ticks: Some(1),
        acquired_at: chrono::Utc::now(),
        released: false,
        renewals: 0,
    };
    let key = shard_lock::key(&store.prefix, "root");
    s3.put_object()
        .bucket(&bed.s3.bucket)
        .key(&key)
        .body(serde_json::to_vec(&holder).unwrap().into())
        .send()
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let taken = shard_lock::acquire(&store, "root", "snapshot", Duration::from_secs(30), nothing).await.unwrap();
    assert!(started.elapsed() < store.lock_expiry, "taken over without waiting for staleness");

    // A live holder on another host is never judged dead: it is waited for.
    let elsewhere = Holder { boot_id: Some("another-host".into()), ..holder };
    s3.put_object()
        .bucket(&bed.s3.bucket)
        .key(&key)
        .body(serde_json::to_vec(&elsewhere).unwrap().into())
        .send()
        .await
        .unwrap();
    let error = taken.confirm().await.expect_err("the lock is no longer ours");
    assert!(matches!(error, LockError::Lost { .. }), "{error}");
    taken.release().await;
    let body = s3.get_object().bucket(&bed.s3.bucket).key(&key).send().await.unwrap().body.collect().await.unwrap();
    let left: Holder = serde_json::from_slice(&body.into_bytes()).unwrap();
    assert_eq!(left.boot_id.as_deref(), Some("another-host"), "the successor's lock is left alone");
    let refused = shard_lock::acquire(&store, "root", "snapshot", Duration::from_secs(2), nothing).await;
    assert!(matches!(refused, Err(LockError::Busy { .. })), "another host's fresh lock is waited for");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_whose_first_lock_put_took_effect_but_lost_its_answer_holds_its_lock_at_once_not_after_waiting_itself_out()
 {
    use testbed::fault_proxy::{Fault, FaultProxy};
    let bed = Bed::start().await.unwrap();
    let proxy = FaultProxy::start(&bed.s3.endpoint).await.unwrap();
    let mut options = Options::new(&bed, "root", vec!["http://127.0.0.1:1".into()]);
    options.s3_endpoint = proxy.url.clone();
    let config: Config = kcp_keeper_runtime::config::load(&write_config(&bed, &options).unwrap()).unwrap();
    let store = Store::new(&config.storage).unwrap();
    // The first put of the lock is carried out by the store, and its answer never arrives: the SDK retries, and
    // the store refuses the retry (the object is there now).
    proxy.inject("PUT", "run.lock", Fault::LoseAnswer, 1);
    let told = std::sync::Mutex::new(Vec::new());
    let held = shard_lock::acquire(&store, "root", "snapshot", Duration::from_secs(5), |h: &str| {
        told.lock().unwrap().push(h.to_string())
    })
    .await
    .expect("its own lock, not another run's");
    assert_eq!(proxy.injected().len(), 1, "the answer was lost once: {:?}", proxy.injected());
    assert!(told.lock().unwrap().is_empty(), "it never waited for itself: {told:?}");
    held.confirm().await.expect("and it holds it");
    held.release().await;
    let again = shard_lock::acquire(&store, "root", "snapshot", Duration::ZERO, nothing).await.unwrap();
    again.release().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_renewing_holder_is_never_taken_over_by_a_waiter_contending_for_more_than_twice_the_expiry() {
    let bed = Bed::start().await.unwrap();
    let store = store_at(&bed, &bed.s3.endpoint, "6s");
    let held = shard_lock::acquire(&store, "root", "run", Duration::ZERO, nothing).await.unwrap();
    // Confirmations race the background renewals all along: one renewal at a time, or one would refuse the other.
    let confirming = {
        let held = held.clone();
        tokio::spawn(async move {
            for _ in 0..40 {
                held.confirm().await?;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Ok::<_, LockError>(())
        })
    };
    let waited = shard_lock::acquire(&store, "root", "snapshot", Duration::from_secs(15), nothing).await;
    assert!(matches!(waited, Err(LockError::Busy { .. })), "the waiter took a renewing lock over");
    confirming.await.unwrap().expect("the holder kept its lock throughout");
    let fenced = tokio::time::timeout(Duration::from_secs(1), held.fenced()).await;
    assert!(fenced.is_err(), "a renewing holder is not fenced: {:?}", fenced.map(|e| e.to_string()));
    held.release().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_renewal_that_took_effect_but_lost_its_answer_keeps_the_lock_instead_of_reading_as_a_takeover() {
    use testbed::fault_proxy::{Fault, FaultProxy};
    let bed = Bed::start().await.unwrap();
    let proxy = FaultProxy::start(&bed.s3.endpoint).await.unwrap();
    let store = store_at(&bed, &proxy.url, "2m");
    let held = shard_lock::acquire(&store, "root", "run", Duration::ZERO, nothing).await.unwrap();
    proxy.inject("PUT", "run.lock", Fault::LoseAnswer, 1);
    held.confirm().await.expect("the renewal took effect: the lock is still ours");
    assert_eq!(proxy.injected().len(), 1, "the answer was lost once: {:?}", proxy.injected());
    held.confirm().await.expect("and it renews on from there");
    held.release().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_holder_whose_renewals_the_store_does_not_take_stops_its_run_before_a_waiter_may_take_the_lock_over() {
    use testbed::fault_proxy::{Fault, FaultProxy};
    let bed = Bed::start().await.unwrap();
    let proxy = FaultProxy::start(&bed.s3.endpoint).await.unwrap();
    let holder_store = store_at(&bed, &proxy.url, "6s");
    let held = shard_lock::acquire(&holder_store, "root", "run", Duration::ZERO, nothing).await.unwrap();
    // From now on no write of the lock reaches the store through the holder's path (answers stall out).
    proxy.inject("PUT", "run.lock", Fault::Stall(Duration::from_secs(5)), 1000);
    let fence = {
        let held = held.clone();
        tokio::spawn(async move {
            let error = held.fenced().await;
            (error, std::time::Instant::now())
        })
    };
    let waiter_store = store_at(&bed, &bed.s3.endpoint, "6s");
    let taken = shard_lock::acquire(&waiter_store, "root", "snapshot", Duration::from_secs(60), nothing).await.unwrap();
    let taken_at = std::time::Instant::now();
    let (error, fenced_at) = fence.await.unwrap();
    assert!(matches!(error, LockError::Unrenewed { .. }), "{error}");
    assert!(error.to_string().contains("published nothing"), "{error}");
    assert!(fenced_at < taken_at, "the holder stopped before the waiter took the lock over");
    taken.release().await;
    held.release().await;
}
