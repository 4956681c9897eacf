//! Cron schedules under leader election on a real kube-apiserver: only the leader fires, and a contender that
//! takes over right after the leader ran tick T does not run T again (the record on the Lease says it ran),
//! although its catch-up policy would run a missed tick.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::Lease;
use kcp_keeper_runtime::lease::{self, LeaseConfig};
use kcp_keeper_runtime::schedule::{self, LeaseRecord, Missed, Schedule, ScheduleSpec, Tick};
use kube::api::Api;
use tokio_util::sync::CancellationToken;

const LEASE: &str = "kcp-keeper-etcd-snapshotter";

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("kcp_keeper_runtime=debug"));
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter(filter).try_init();
}

type Fired = Arc<Mutex<Vec<(&'static str, DateTime<Utc>)>>>;

struct Replica {
    identity: &'static str,
    client: kube::Client,
    leadership: lease::Leadership,
    /// Stops the election (releasing the lease) and the scheduler.
    shutdown: CancellationToken,
}

/// One replica's election on the shared Lease, with its own client.
async fn elect(bed: &testbed::ControlPlane, ns: &str, identity: &'static str) -> Result<Replica> {
    let client = bed.apiserver.admin_client().await?;
    let shutdown = CancellationToken::new();
    let config = LeaseConfig {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(300),
        ..LeaseConfig::new(ns, LEASE, identity)
    };
    let (leadership, _task) = lease::spawn(client.clone(), config, shutdown.clone());
    Ok(Replica { identity, client, leadership, shutdown })
}

/// Starts the replica's scheduler; each run is recorded in `fired`. With `stop_after_first_run`, the replica
/// goes away right after its first run (its lease is released at once).
fn schedule_on(replica: &Replica, ns: &str, schedule: Schedule, fired: Fired, stop_after_first_run: bool) {
    let record = LeaseRecord {
        api: Api::<Lease>::namespaced(replica.client.clone(), ns),
        lease_name: LEASE.into(),
        identity: replica.identity.into(),
    };
    let (identity, stop) = (replica.identity, replica.shutdown.clone());
    let job = move |tick: Tick| {
        fired.lock().unwrap().push((identity, tick.at));
        if stop_after_first_run {
            stop.cancel();
        }
        async {}
    };
    tokio::spawn(schedule::run(schedule, Some(record), replica.leadership.clone(), replica.shutdown.clone(), job));
}

#[tokio::test]
async fn a_new_leader_does_not_run_again_the_tick_the_old_leader_ran_and_followers_never_fire() -> Result<()> {
    init_tracing();
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    // Every 3 seconds, catching up missed ticks: without the record, the new leader would run T again.
    let spec = ScheduleSpec {
        cron: "*/3 * * * * *".into(),
        time_zone: Some("Europe/Berlin".into()),
        jitter: None,
        missed: Missed::RunOnce,
        starting_deadline: None,
    };
    let schedule = Schedule::new("snapshot-root", &spec)?;
    let fired: Fired = Arc::default();

    let a = elect(&bed, &ns, "a").await?;
    testbed::eventually(Duration::from_secs(10), "a leads", || async { a.leadership.is_leader().then_some(()) }).await;
    let b = elect(&bed, &ns, "b").await?;
    // Both schedulers start together, before the first tick either could run.
    schedule_on(&a, &ns, schedule.clone(), fired.clone(), true);
    schedule_on(&b, &ns, schedule.clone(), fired.clone(), false);

    testbed::eventually(Duration::from_secs(30), "b runs a tick after a stopped", || async {
        let fired = fired.lock().unwrap();
        fired.iter().any(|(who, _)| *who == "b").then_some(())
    })
    .await;
    let fired = fired.lock().unwrap().clone();
    let (first_who, first_tick) = fired[0];
    assert_eq!(first_who, "a", "the leader fired first: {fired:?}");
    assert_eq!(fired.iter().filter(|(who, _)| *who == "a").count(), 1, "a stopped after one run: {fired:?}");
    let b_ticks: Vec<_> = fired.iter().filter(|(who, _)| *who == "b").map(|(_, t)| *t).collect();
    assert!(b_ticks.iter().all(|t| *t > first_tick), "b never ran the tick a ran, nor anything before: {fired:?}");
    let mut ticks: Vec<_> = fired.iter().map(|(_, t)| *t).collect();
    ticks.dedup();
    assert_eq!(ticks.len(), fired.len(), "every tick ran at most once: {fired:?}");

    let lease: Lease = Api::namespaced(bed.client(), &ns).get(LEASE).await?;
    let recorded = &lease.metadata.annotations.unwrap_or_default()[&schedule.record_key()];
    assert_eq!(DateTime::parse_from_rfc3339(recorded)?, *b_ticks.last().unwrap(), "the Lease records the last run");
    assert_eq!(lease.spec.and_then(|s| s.holder_identity).as_deref(), Some("b"));
    for replica in [a, b] {
        tracing::info!(identity = replica.identity, "stopping");
        replica.shutdown.cancel();
    }
    Ok(())
}

#[tokio::test]
async fn without_leader_election_every_tick_fires_with_nothing_recorded() {
    let spec = ScheduleSpec {
        cron: "* * * * * *".into(),
        time_zone: None,
        jitter: None,
        missed: Missed::Skip,
        starting_deadline: None,
    };
    let schedule = Schedule::new("drill-root", &spec).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let job = move |tick: Tick| {
        let _ = tx.send(tick.at);
        async {}
    };
    tokio::spawn(schedule::run(schedule, None, lease::Leadership::always(), shutdown.clone(), job));
    let first = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    assert_eq!(second - first, chrono::Duration::seconds(1), "consecutive ticks, each once");
    shutdown.cancel();
}

#[tokio::test]
async fn a_tick_recorded_by_a_clock_a_year_ahead_is_ignored_and_the_leader_fires_and_records_its_own() -> Result<()> {
    init_tracing();
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let spec = ScheduleSpec {
        cron: "* * * * * *".into(),
        time_zone: None,
        jitter: Some("1s".into()),
        missed: Missed::Skip,
        starting_deadline: None,
    };
    let schedule = Schedule::new("snapshot-root", &spec)?;
    let a = elect(&bed, &ns, "a").await?;
    testbed::eventually(Duration::from_secs(10), "a leads", || async { a.leadership.is_leader().then_some(()) }).await;
    // A previous leader whose clock ran a year ahead recorded a tick that, by our clock, is a year away.
    let ahead_at = Utc::now() + chrono::Duration::days(365);
    let ahead = ahead_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let leases = Api::<Lease>::namespaced(bed.client(), &ns);
    let patch = serde_json::json!({"metadata": {"annotations": {schedule.record_key(): ahead}}});
    leases.patch(LEASE, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await?;

    let fired: Fired = Arc::default();
    schedule_on(&a, &ns, schedule.clone(), fired.clone(), false);
    testbed::eventually(Duration::from_secs(30), "a fires despite the record from the future", || async {
        (!fired.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    a.shutdown.cancel();
    let first = fired.lock().unwrap()[0].1;
    let lease = leases.get(LEASE).await?;
    let recorded =
        DateTime::parse_from_rfc3339(&lease.metadata.annotations.unwrap_or_default()[&schedule.record_key()])?;
    assert!(
        recorded >= first && recorded < ahead_at - chrono::Duration::days(1),
        "the record from the future was overwritten by a tick run: {recorded}"
    );
    Ok(())
}
