//! The per-object form: a `kube::runtime::Controller` run by `driver::run_controller_while_leading`, with the
//! driver's metrics and per-object backoff, against a real apiserver. It reconciles only while its replica
//! leads, stops (draining) when another replica takes the lease, and starts again when it leads again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kcp_keeper_runtime::admin::Health;
use kcp_keeper_runtime::agent::Context;
use kcp_keeper_runtime::driver::{self, ObjectBackoff, ReconcileMetrics};
use kcp_keeper_runtime::events::Recorder;
use kcp_keeper_runtime::lease::{self, LeaseConfig};
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
enum ObjectError {
    #[error("refused by the test")]
    Refused,
}

struct Shared {
    /// Each object reconciled, with the controller run (1-based) that reconciled it first.
    seen: Mutex<BTreeMap<String, u32>>,
    /// How many controller runs started, and how many have ended.
    runs: Mutex<(u32, u32)>,
    metrics: ReconcileMetrics,
    backoff: ObjectBackoff,
}

async fn reconcile(object: Arc<ConfigMap>, shared: Arc<Shared>) -> Result<Action, ObjectError> {
    let name = object.name_any();
    shared
        .metrics
        .observe(async {
            let run = shared.runs.lock().unwrap().0;
            shared.seen.lock().unwrap().entry(name.clone()).or_insert(run);
            if name.starts_with("refuse") { Err(ObjectError::Refused) } else { Ok(Action::await_change()) }
        })
        .await
        .inspect(|_| shared.backoff.succeeded(&name))
}

fn error_policy(object: Arc<ConfigMap>, _error: &ObjectError, shared: Arc<Shared>) -> Action {
    Action::requeue(shared.backoff.failed(&object.name_any()))
}

#[tokio::test]
async fn a_controller_reconciles_only_while_its_replica_leads_with_the_drivers_metrics() -> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let lease_config = LeaseConfig {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(300),
        ..LeaseConfig::new(&ns, "controller", "replica-0")
    };
    let lease_stop = CancellationToken::new();
    let (leadership, lease_task) = lease::spawn(bed.client(), lease_config, lease_stop.clone());
    let (_tx, config) = tokio::sync::watch::channel(Arc::new(()));
    let shutdown = CancellationToken::new();
    let ctx = Context {
        client: bed.client(),
        config,
        leadership,
        health: Arc::new(Health::default()),
        shutdown: shutdown.clone(),
        events: Arc::new(Recorder::new(bed.client(), "test", "replica-0")),
        identity: "replica-0".into(),
        lease_record: None,
    };
    let mut registry = Registry::default();
    let shared = Arc::new(Shared {
        seen: Mutex::new(BTreeMap::new()),
        runs: Mutex::new((0, 0)),
        metrics: ReconcileMetrics::register::<ObjectError>(&mut registry),
        backoff: ObjectBackoff::new(driver::default_backoff()),
    });
    let api = Api::<ConfigMap>::namespaced(bed.client(), &ns);
    let runs = || *shared.runs.lock().unwrap();
    let task = {
        let (api, shared) = (api.clone(), shared.clone());
        tokio::spawn(async move {
            driver::run_controller_while_leading(&ctx, |stop| {
                shared.runs.lock().unwrap().0 += 1;
                let controller = Controller::new(api.clone(), watcher::Config::default())
                    .graceful_shutdown_on(stop)
                    .run(reconcile, error_policy, shared.clone())
                    .for_each(|_| async {});
                let shared = shared.clone();
                async move {
                    controller.await;
                    shared.runs.lock().unwrap().1 += 1;
                }
            })
            .await;
        })
    };
    let create = |name: &'static str| {
        let api = api.clone();
        async move {
            let cm = ConfigMap {
                metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
                ..Default::default()
            };
            api.create(&PostParams::default(), &cm).await
        }
    };
    let seen = |name: &'static str| {
        let shared = shared.clone();
        async move { shared.seen.lock().unwrap().get(name).copied() }
    };

    create("first").await?;
    create("refuse-me").await?;
    testbed::eventually(Duration::from_secs(30), "the leader's controller reconciles", || seen("first")).await;
    testbed::eventually(Duration::from_secs(30), "the failing object", || seen("refuse-me")).await;
    let text = kcp_keeper_runtime::metrics::encode(&registry);
    assert!(text.contains("reconcile_errors_total{reason=\"refused\"} 1"), "{text}");
    assert!(!text.contains("reconcile_duration_seconds_count 0"), "{text}");

    // Another replica takes the lease: the controller drains and stops, and objects created while it
    // follows are not reconciled until it leads again (the second run is the one that reconciles them).
    take_lease(&bed, &ns, "replica-1").await?;
    testbed::eventually(Duration::from_secs(10), "the controller run to end", || async {
        (runs() == (1, 1)).then_some(())
    })
    .await;
    assert!(!task.is_finished(), "it waits to lead again");
    create("after").await?;
    // replica-1 never renews: once its lease expires this replica takes it back and starts a second run.
    let run =
        testbed::eventually(Duration::from_secs(30), "the object created while following", || seen("after")).await;
    assert_eq!(run, 2, "the object created while following was reconciled by the run before the handover");
    assert_eq!(runs().0, 2, "one more run after leading again");
    lease_stop.cancel();
    lease_task.await??;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task).await??;
    Ok(())
}

/// Writes the lease as held by `holder`, renewed now, retrying when the elector's own write got in first.
async fn take_lease(bed: &testbed::ControlPlane, ns: &str, holder: &str) -> Result<()> {
    let leases = Api::<Lease>::namespaced(bed.client(), ns);
    testbed::eventually(Duration::from_secs(10), "the lease taken over", || async {
        let mut lease = leases.get("controller").await.ok()?;
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(holder.into());
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        spec.acquire_time = spec.renew_time.clone();
        leases.replace("controller", &PostParams::default(), &lease).await.ok().map(|_| ())
    })
    .await;
    Ok(())
}
