//! One run per shard at a time, across processes: the daemon's replicas (an old leader in its grace included),
//! `snapshot` one-shots in the pod or on a laptop, any agent writing to the same bucket and prefix. The lock is
//! an object of the shard's directory, `<prefix>/<shard>/run.lock`, written with S3's conditional puts:
//!
//! - taken with `If-None-Match: *` (created only where none is), then read back (our token, or we lost);
//! - renewed by its holder every sixth of `storage.lockExpiry` with `If-Match: <its ETag>`, each renewal
//!   writing the next renewal count (so the ETag changes with every renewal, which is what tells a waiter the
//!   holder lives), and confirmed the same way right before an upload is completed and before a manifest is
//!   written: a holder that finds another ETag has lost the lock and publishes nothing. A renewal whose answer
//!   was lost (the SDK's retry then meets its own new ETag) is recognised by reading the lock back;
//! - fenced: a holder whose renewals the store has not taken for half the expiry (by its own monotonic clock,
//!   from when the last taken renewal was sent) stops its run, dropping its requests in flight, before any
//!   waiter may take the lock over ([`Held::fenced`]);
//! - released by a conditional rewrite marking it free (`If-Match`), so a holder that lost it never frees its
//!   successor's; the object is never deleted (a delete marker on a versioned bucket is, for some stores, an
//!   object `If-None-Match` refuses);
//! - taken over only with `If-Match` on the ETag the waiter saw, and only when the holder is provably gone:
//!   a process of this host (same boot id and pid namespace) that no longer runs, or a lock whose ETag has not
//!   changed for the whole expiry by the waiter's own monotonic clock (a live holder renews six times in that
//!   span, and stops at half of it). No clock is compared with another host's.
//!
//! The lock is as strong as the store's conditional put: atomic on AWS S3; versitygw's posix backend checks
//! the condition and then writes, so two runs that race within the same few milliseconds could both pass it
//! (the read-back narrows that window further).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::manifest;
use crate::storage::{Condition, StorageError, Store};

pub const LOCK: &str = "run.lock";
/// The holder renews the lock every `expiry / RENEWALS` (on a versioned bucket each renewal leaves a
/// noncurrent version).
const RENEWALS: u32 = 6;
/// How often a waiter looks at the lock again.
const POLL: Duration = Duration::from_secs(1);

/// What the lock object says about its holder: enough to name it in a message and to prove, on the same
/// host, that it no longer runs. Read from an object anyone with write access can edit: only these fields are
/// taken, and a lock that does not parse is never taken over before the expiry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    pub token: String,
    /// `run` (the daemon) or `snapshot` (the one-shot).
    pub command: String,
    pub host: String,
    pub pid: u32,
    #[serde(default)]
    pub boot_id: Option<String>,
    #[serde(default)]
    pub pid_namespace: Option<String>,
    /// The process's start time in clock ticks since boot (`/proc/<pid>/stat`, field 22): a pid reused by
    /// another process starts at another time.
    #[serde(default)]
    pub start_ticks: Option<u64>,
    pub acquired_at: DateTime<Utc>,
    /// Written by the holder as it lets go: the lock object stays (a deleted object is a delete marker on a
    /// versioned bucket, which some stores count as present for `If-None-Match`), marked free.
    #[serde(default)]
    pub released: bool,
    /// How many times the holder has renewed the lock: every renewal writes another body, so the object's
    /// ETag changes with each one and a waiter sees a live holder renewing (the same body would keep the same
    /// ETag, and a waiter would read a renewing lock as stale and take it over).
    #[serde(default)]
    pub renewals: u64,
}

impl Holder {
    fn this_process(command: &str) -> Self {
        let pid = std::process::id();
        Self {
            token: format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>()),
            command: command.into(),
            host: read_trimmed("/proc/sys/kernel/hostname").unwrap_or_default(),
            pid,
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
            pid_namespace: std::fs::read_link("/proc/self/ns/pid").ok().map(|p| p.display().to_string()),
            start_ticks: start_ticks(pid),
            acquired_at: Utc::now(),
            released: false,
            renewals: 0,
        }
    }

    /// `snapshot (pid 42 on host x, since 2026-12-01T12:00:00Z)`: no token.
    pub fn describe(&self) -> String {
        format!("{} (pid {} on host {}, since {})", self.command, self.pid, self.host, self.acquired_at.to_rfc3339())
    }

    /// True only when the holder provably no longer runs: it ran on this host (boot id) in this pid namespace,
    /// and its pid is gone or now belongs to a process that started at another time.
    pub fn is_provably_gone(&self) -> bool {
        let here = Holder::this_process("");
        let same_host = self.boot_id.is_some() && self.boot_id == here.boot_id;
        let same_namespace = self.pid_namespace.is_some() && self.pid_namespace == here.pid_namespace;
        if !(same_host && same_namespace) || self.pid == here.pid && self.start_ticks == here.start_ticks {
            return false;
        }
        match (self.start_ticks, start_ticks(self.pid)) {
            (_, None) => true,
            (Some(recorded), Some(now)) => recorded != now,
            (None, Some(_)) => false,
        }
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// Field 22 of `/proc/<pid>/stat` (after the command, which may hold spaces, in parentheses).
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("shard {shard}: another run holds the shard's lock: {holder}; waited {waited:?}")]
    Busy { shard: String, holder: String, waited: Duration },
    #[error("shard {shard}: the shard's lock was taken over by another run ({detail}); nothing was published")]
    Lost { shard: String, detail: String },
    #[error(
        "shard {shard}: the store took no renewal of the shard's lock for {unrenewed:?} (half its expiry); the run \
         stopped before another run may take the lock over, and published nothing"
    )]
    Unrenewed { shard: String, unrenewed: Duration },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

struct State {
    etag: String,
    lost: Option<String>,
    /// Renewals written so far (the body's `renewals`).
    renewals: u64,
    /// When the last write the store took (the take, a renewal) was sent, by our monotonic clock: no waiter
    /// can have seen our current ETag earlier, so none takes over before this plus the expiry.
    renewed: Instant,
}

/// The lock, held: renewed in the background until released or the last clone is dropped.
#[derive(Clone)]
pub struct Held {
    store: Store,
    key: String,
    shard: String,
    holder: Holder,
    /// When the store wrote the lock as we took it (the store's clock): anything of the shard's the store
    /// wrote before it is no other run's work in progress.
    pub acquired: aws_smithy_types::DateTime,
    state: Arc<Mutex<State>>,
    /// One renewal at a time (the renewer's and a confirmation): two puts on the same ETag would refuse one.
    turn: Arc<tokio::sync::Mutex<()>>,
    expiry: Duration,
    renewer: Arc<Renewer>,
}

/// Stops renewing when the last holder of the lock goes (a run dropped by a shutdown stops renewing at once).
struct Renewer(tokio::task::JoinHandle<()>);

impl Drop for Renewer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub fn key(prefix: &str, shard: &str) -> String {
    format!("{}{LOCK}", manifest::shard_dir(prefix, shard))
}

/// Takes the shard's lock, waiting up to `wait` while another run holds it; `waiting` is called once, with the
/// holder's description, when the lock is found held.
pub async fn acquire(
    store: &Store,
    shard: &str,
    command: &str,
    wait: Duration,
    waiting: impl Fn(&str),
) -> Result<Held, LockError> {
    let key = key(&store.prefix, shard);
    let expiry = store.lock_expiry;
    let holder = Holder::this_process(command);
    let body = crate::json::object(&holder);
    let started = Instant::now();
    // The ETag last seen and since when (our monotonic clock), for the staleness rule.
    let mut seen: Option<(String, Instant)> = None;
    let mut told = false;
    let mut reread = false;
    // When our last put of the lock was sent: a write of ours the store took was sent no earlier.
    let mut sent = Instant::now();
    loop {
        let (written, description) = match store.get_versioned(&key).await? {
            None => {
                sent = Instant::now();
                let written = store.put_conditional(&key, body.clone(), Condition::Absent).await?;
                if written.is_none() && !reread {
                    // Refused: another run got there first, or our own put took effect and lost its answer (the
                    // SDK's retry then found the object). Read it again before telling anyone we wait.
                    reread = true;
                    continue;
                }
                // Refused although absent: a store that counts a delete marker as an object (versitygw on a
                // versioned bucket). Only a lock released by its holder, never deleted, is taken from there.
                (written, "a lock the store reports deleted but still holds (a delete marker?)".to_string())
            }
            Some(current) => {
                if seen.as_ref().is_none_or(|(etag, _)| *etag != current.etag) {
                    seen = Some((current.etag.clone(), Instant::now()));
                }
                let since = seen.as_ref().map(|(_, since)| *since).unwrap_or_else(Instant::now);
                let other = serde_json::from_slice::<Holder>(&current.body).ok();
                if other.as_ref().is_some_and(|h| h.token == holder.token && !h.released) {
                    // Our own put took effect though its answer was lost (the retry then found the object
                    // there): the lock is ours, not another run's to wait out.
                    tracing::info!(shard, "the shard's lock is this run's own: its put's answer was lost");
                    let acquired = current
                        .last_modified
                        .unwrap_or_else(|| aws_smithy_types::DateTime::from(std::time::SystemTime::now()));
                    return Ok(start(store, key, shard, holder, (current.etag, sent), acquired));
                }
                let released = other.as_ref().is_some_and(|h| h.released);
                let gone = other.as_ref().is_some_and(Holder::is_provably_gone);
                let description = match &other {
                    Some(h) => h.describe(),
                    None => "a lock object that does not parse".into(),
                };
                let written = if released || gone || since.elapsed() >= expiry {
                    if !released {
                        let why = if gone { "its process no longer runs" } else { "it was not renewed" };
                        tracing::warn!(shard, holder = description, "taking over the shard's lock: {why}");
                    }
                    sent = Instant::now();
                    store.put_conditional(&key, body.clone(), Condition::Matches(&current.etag)).await?
                } else {
                    None
                };
                (written, description)
            }
        };
        if written.is_some() {
            // Read back: a store whose conditional put is not atomic may have let another run write after us.
            if let Some(back) = store.get_versioned(&key).await?
                && serde_json::from_slice::<Holder>(&back.body).is_ok_and(|h| h.token == holder.token && !h.released)
            {
                let acquired = back
                    .last_modified
                    .unwrap_or_else(|| aws_smithy_types::DateTime::from(std::time::SystemTime::now()));
                return Ok(start(store, key, shard, holder, (back.etag, sent), acquired));
            }
            continue;
        }
        if !told {
            waiting(&description);
            told = true;
        }
        if started.elapsed() >= wait {
            return Err(LockError::Busy { shard: shard.into(), holder: description, waited: wait });
        }
        tokio::time::sleep(POLL).await;
    }
}

fn start(
    store: &Store,
    key: String,
    shard: &str,
    holder: Holder,
    (etag, renewed): (String, Instant),
    acquired: aws_smithy_types::DateTime,
) -> Held {
    let state = Arc::new(Mutex::new(State { etag, lost: None, renewals: 0, renewed }));
    let turn = Arc::new(tokio::sync::Mutex::new(()));
    let expiry = store.lock_expiry;
    let renewer = tokio::spawn({
        let (store, key, state, holder, turn) =
            (store.clone(), key.clone(), state.clone(), holder.clone(), turn.clone());
        async move {
            // Renewals are sent every sixth of the expiry from the take's own put, however long each one (and
            // the take's read-back) took to be answered.
            let mut sent = renewed;
            loop {
                sent += expiry / RENEWALS;
                tokio::time::sleep_until(sent.into()).await;
                sent = sent.max(Instant::now());
                if let Err(error) = renew(&store, &key, &holder, &state, &turn).await {
                    // Not lost, just not renewed: the next attempt, the confirmation or the fence decides.
                    tracing::warn!(key, %error, "renewing the shard's lock failed; retrying");
                }
                if state.lock().expect("lock state").lost.is_some() {
                    return;
                }
            }
        }
    });
    Held {
        store: store.clone(),
        key,
        shard: shard.into(),
        holder,
        acquired,
        state,
        turn,
        expiry,
        renewer: Arc::new(Renewer(renewer)),
    }
}

/// One conditional rewrite of the lock with the next renewal count (a new body, so a new ETag); marks it lost
/// when the store holds another version. A refusal is read back first: a renewal that took effect but lost its
/// answer meets its own new ETag on the SDK's retry.
async fn renew(
    store: &Store,
    key: &str,
    holder: &Holder,
    state: &Mutex<State>,
    turn: &tokio::sync::Mutex<()>,
) -> Result<(), StorageError> {
    let _turn = turn.lock().await;
    let (etag, renewals) = {
        let state = state.lock().expect("lock state");
        if state.lost.is_some() {
            return Ok(());
        }
        (state.etag.clone(), state.renewals + 1)
    };
    let sent = Instant::now();
    let written = match store
        .put_conditional(key, crate::json::object(&Holder { renewals, ..holder.clone() }), Condition::Matches(&etag))
        .await?
    {
        Some(next) => Some(next),
        None => store
            .get_versioned(key)
            .await?
            .filter(|back| {
                serde_json::from_slice::<Holder>(&back.body)
                    .is_ok_and(|h| h.token == holder.token && h.renewals == renewals && !h.released)
            })
            .map(|back| back.etag),
    };
    let mut state = state.lock().expect("lock state");
    match written {
        Some(next) => (state.etag, state.renewals, state.renewed) = (next, renewals, sent),
        None => state.lost = Some("its ETag changed".into()),
    }
    Ok(())
}

impl Held {
    /// Proves the lock is still ours now (a conditional renewal): called before an upload is completed and
    /// before a manifest is written.
    pub async fn confirm(&self) -> Result<(), LockError> {
        renew(&self.store, &self.key, &self.holder, &self.state, &self.turn).await?;
        match self.state.lock().expect("lock state").lost.clone() {
            None => Ok(()),
            Some(detail) => Err(LockError::Lost { shard: self.shard.clone(), detail }),
        }
    }

    /// Resolves when the run under this lock must stop: the lock was found taken over, or the store has taken
    /// no renewal for half the expiry (a waiter may take it over at the expiry; the run stops first, and its
    /// requests in flight are dropped with it).
    pub async fn fenced(&self) -> LockError {
        let deadline = self.expiry / 2;
        loop {
            let (lost, renewed) = {
                let state = self.state.lock().expect("lock state");
                (state.lost.clone(), state.renewed)
            };
            if let Some(detail) = lost {
                return LockError::Lost { shard: self.shard.clone(), detail };
            }
            let unrenewed = renewed.elapsed();
            if unrenewed >= deadline {
                return LockError::Unrenewed { shard: self.shard.clone(), unrenewed };
            }
            tokio::time::sleep((deadline - unrenewed).min(Duration::from_secs(1))).await;
        }
    }

    /// Marks the lock free if it is still ours (a conditional rewrite); never touches a successor's.
    pub async fn release(self) {
        self.renewer.0.abort();
        let (etag, lost) = {
            let state = self.state.lock().expect("lock state");
            (state.etag.clone(), state.lost.is_some())
        };
        if lost {
            return;
        }
        let body = crate::json::object(&Holder { released: true, ..self.holder.clone() });
        match self.store.put_conditional(&self.key, body, Condition::Matches(&etag)).await {
            Ok(Some(_)) => {}
            Ok(None) => tracing::warn!(key = self.key, "the shard's lock was no longer ours at release; left alone"),
            Err(error) => {
                tracing::warn!(key = self.key, %error, "releasing the shard's lock failed; it goes stale in {:?}", self.expiry)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_not_gone_and_a_pid_that_does_not_run_here_is() {
        let me = Holder::this_process("snapshot");
        assert!(!me.is_provably_gone(), "{me:?}");
        let other_start = Holder { start_ticks: me.start_ticks.map(|t| t + 1), ..me.clone() };
        assert!(other_start.is_provably_gone(), "a reused pid started at another time");
        let gone = Holder { pid: u32::MAX - 1, ..me.clone() };
        assert!(gone.is_provably_gone());
        let elsewhere = Holder { boot_id: Some("another-host".into()), ..gone.clone() };
        assert!(!elsewhere.is_provably_gone(), "another host's process is never judged from here");
        let other_namespace = Holder { pid_namespace: Some("pid:[1]".into()), ..gone };
        assert!(!other_namespace.is_provably_gone(), "nor one of another pid namespace");
        assert!(!me.describe().contains(&me.token), "the token is not named");
    }
}
