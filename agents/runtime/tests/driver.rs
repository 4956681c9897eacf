//! The reconcile driver against a real apiserver: a burst of changes becomes one reconcile (with the leading
//! edge: one at once and one after the quiet), a follower does not reconcile and starts at once when it takes
//! the lease, a failing item backs off.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::ConfigMap;
use kcp_keeper_runtime::admin::Health;
use kcp_keeper_runtime::agent::Context;
use kcp_keeper_runtime::driver::{self, ReconcileMetrics, Reconciler, Settings};
use kcp_keeper_runtime::events::Recorder;
use kcp_keeper_runtime::lease::{self, Leadership, LeaseConfig};
use kcp_keeper_runtime::watch::Watches;
use kube::api::{Api, ObjectMeta, PostParams};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
enum TestError {
    #[error("always fails")]
    AlwaysFails,
}

/// Counts its reconciles; fails when told to.
struct Counting {
    calls: Arc<AtomicUsize>,
    fail: bool,
}

impl Reconciler for Counting {
    type Item = String;
    type Error = TestError;

    fn items(&self) -> Vec<String> {
        vec!["only".into()]
    }

    async fn reconcile(&self, _item: &String) -> Result<Option<Duration>, TestError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.fail { Err(TestError::AlwaysFails) } else { Ok(None) }
    }
}

struct Running {
    calls: Arc<AtomicUsize>,
    health: Arc<Health>,
    shutdown: CancellationToken,
    registry: Registry,
}

/// Runs the driver over a ConfigMap watch in `ns`, as `leadership` says.
fn start(bed: &testbed::ControlPlane, ns: &str, leadership: Leadership, fail: bool, settings: Settings) -> Running {
    let client = bed.client();
    let (_tx, config) = tokio::sync::watch::channel(Arc::new(()));
    let health = Arc::new(Health::default());
    let shutdown = CancellationToken::new();
    let ctx = Context {
        client: client.clone(),
        config,
        leadership,
        health: health.clone(),
        shutdown: shutdown.clone(),
        events: Arc::new(Recorder::new(client.clone(), "test", "test-0")),
        identity: "test-0".into(),
        namespace: ns.into(),
        lease_name: "kcp-keeper-test".into(),
        lease_record: None,
    };
    let mut registry = Registry::default();
    let metrics = ReconcileMetrics::register::<TestError>(&mut registry);
    // As `run_with` does for every daemon: `leader` follows the election beside the driver's series.
    ctx.leadership.export(kcp_keeper_runtime::lease::LeaderMetrics::register(&mut registry));
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let api = Api::<ConfigMap>::namespaced(client, ns);
    tokio::spawn(async move {
        let _keep = _tx;
        driver::run(&ctx, &metrics, settings, |_config| {
            let mut watches = Watches::new();
            let _store = watches.add("configmaps", api.clone(), Default::default());
            (Counting { calls: counted.clone(), fail }, watches)
        })
        .await;
    });
    Running { calls, health, shutdown, registry }
}

async fn create(api: &Api<ConfigMap>, name: &str) -> Result<()> {
    let cm = ConfigMap { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() };
    api.create(&PostParams::default(), &cm).await?;
    Ok(())
}

fn settings() -> Settings {
    Settings { debounce: Duration::from_millis(500), resync: Duration::from_secs(3600), ..Settings::default() }
}

#[tokio::test]
async fn a_burst_of_changes_is_debounced_into_one_reconcile() -> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let run = start(&bed, &ns, Leadership::always(), false, settings());
    testbed::eventually(Duration::from_secs(30), "ready after the first pass", || async {
        run.health.is_ready().then_some(())
    })
    .await;
    assert_eq!(run.calls.load(Ordering::SeqCst), 1, "one reconcile once the watch synced");

    let api = Api::<ConfigMap>::namespaced(bed.client(), &ns);
    for i in 0..10 {
        create(&api, &format!("burst-{i}")).await?;
    }
    testbed::eventually(Duration::from_secs(30), "the burst's reconcile", || async {
        (run.calls.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    // A change after the burst has settled gets its own reconcile: so the count below is final.
    create(&api, "sentinel").await?;
    let calls = testbed::eventually(Duration::from_secs(30), "the sentinel's reconcile", || async {
        let calls = run.calls.load(Ordering::SeqCst);
        (calls >= 3).then_some(calls)
    })
    .await;
    assert!(calls <= 4, "11 changes made {calls} reconciles, the burst was not debounced");
    run.shutdown.cancel();
    Ok(())
}

#[tokio::test]
async fn with_the_leading_edge_a_change_after_quiet_runs_before_its_debounce_and_its_burst_in_one_more_pass()
-> Result<()> {
    // A debounce long enough that a reconcile seen within most of it cannot have waited for it.
    let debounce = Duration::from_secs(10);
    let settings = Settings { debounce, leading_edge: true, ..settings() };
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let run = start(&bed, &ns, Leadership::always(), false, settings);
    testbed::eventually(Duration::from_secs(30), "ready after the first pass", || async {
        run.health.is_ready().then_some(())
    })
    .await;
    assert_eq!(run.calls.load(Ordering::SeqCst), 1, "one reconcile once the watch synced");
    // Quiet: the driver's own record of its last full pass (its pass timestamp) a debounce old, and a little more
    // (the gauge is set just before the driver notes the pass's end for the leading edge).
    testbed::eventually(debounce * 3, "a debounce without a pass", || async {
        let text = kcp_keeper_runtime::metrics::encode(&run.registry);
        let at = testbed::metrics::value(&text, "reconcile_pass_timestamp_seconds ").ok()?;
        (kcp_keeper_runtime::metrics::unix_now() - at >= debounce.as_secs_f64() + 0.1).then_some(())
    })
    .await;

    let api = Api::<ConfigMap>::namespaced(bed.client(), &ns);
    let burst_started = tokio::time::Instant::now();
    for i in 0..10 {
        create(&api, &format!("burst-{i}")).await?;
    }
    testbed::eventually(Duration::from_secs(30), "the burst's first reconcile", || async {
        (run.calls.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    let first = burst_started.elapsed();
    assert!(first < debounce, "the first change after quiet waited {first:?}, the debounce ({debounce:?}) or more");
    // The rest of the burst (created within the debounce of that pass) waits for quiet and runs once.
    testbed::eventually(Duration::from_secs(60), "the pass after the burst settled", || async {
        (run.calls.load(Ordering::SeqCst) >= 3).then_some(())
    })
    .await;
    // A sentinel within the debounce of that pass is debounced too: its pass makes the count below final.
    create(&api, "sentinel").await?;
    let calls = testbed::eventually(Duration::from_secs(60), "the sentinel's reconcile", || async {
        let calls = run.calls.load(Ordering::SeqCst);
        (calls >= 4).then_some(calls)
    })
    .await;
    assert_eq!(
        calls, 4,
        "11 changes made {calls} reconciles, not 1 at once, 1 for the burst's rest and 1 for the sentinel"
    );
    run.shutdown.cancel();
    Ok(())
}

#[tokio::test]
async fn a_follower_is_ready_without_reconciling_and_reconciles_at_once_when_it_takes_the_lease() -> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let config = |identity: &str| LeaseConfig {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(300),
        ..LeaseConfig::new(&ns, "driver", identity)
    };
    let leader_stop = CancellationToken::new();
    let (mut leading, leader_task) = lease::spawn(bed.client(), config("leader"), leader_stop.clone());
    tokio::time::timeout(Duration::from_secs(10), leading.wait_until_leader()).await?;
    let follower_stop = CancellationToken::new();
    let (follower, _task) = lease::spawn(bed.client(), config("follower"), follower_stop.clone());
    let run = start(&bed, &ns, follower.clone(), false, settings());

    testbed::eventually(Duration::from_secs(30), "the follower ready on synced caches", || async {
        run.health.is_ready().then_some(())
    })
    .await;
    assert!(!follower.is_leader());
    // A change wakes the follower, but it does not reconcile. (Absence needs a window: three debounce periods,
    // in which a leader would have reconciled.)
    create(&Api::<ConfigMap>::namespaced(bed.client(), &ns), "change").await?;
    tokio::time::sleep(settings().debounce * 3).await;
    assert_eq!(run.calls.load(Ordering::SeqCst), 0, "a follower reconciled");

    // The leader leaves (releasing the lease): the follower leads and reconciles without any change.
    leader_stop.cancel();
    leader_task.await??;
    testbed::eventually(Duration::from_secs(10), "a reconcile once leading", || async {
        (run.calls.load(Ordering::SeqCst) >= 1).then_some(())
    })
    .await;
    let text = kcp_keeper_runtime::metrics::encode(&run.registry);
    assert!(text.contains("leader 1"), "{text}");
    run.shutdown.cancel();
    follower_stop.cancel();
    Ok(())
}

#[tokio::test]
async fn a_failing_item_is_counted_by_reason_and_retried_with_growing_delays() -> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let run = start(&bed, &ns, Leadership::always(), true, settings());
    let started = tokio::time::Instant::now();
    // 1 + (1..2) + (2..4) + (4..8) seconds: the 4th attempt comes after at least 7s, long before the resync (1h).
    testbed::eventually(Duration::from_secs(30), "four attempts", || async {
        (run.calls.load(Ordering::SeqCst) >= 4).then_some(())
    })
    .await;
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(7) && took < Duration::from_secs(20), "4 attempts took {took:?}");
    assert!(run.health.is_ready(), "a failing item does not make the leader unready");
    let text = kcp_keeper_runtime::metrics::encode(&run.registry);
    assert!(
        text.contains("reconcile_errors_total{reason=\"always_fails\"} 4")
            || text.contains("reconcile_errors_total{reason=\"always_fails\"} 5"),
        "{text}"
    );
    run.shutdown.cancel();
    Ok(())
}
