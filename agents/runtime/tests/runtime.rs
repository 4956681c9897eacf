//! Configuration reload, the admin server, Events and watches, each against the real thing: files projected
//! the way kubelet does it, a real HTTP client, a real apiserver (restarted where it matters).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kcp_keeper_runtime::admin::{self, Health};
use kcp_keeper_runtime::config::{self, AgentConfig, FieldError};
use kcp_keeper_runtime::events::{EventType, Recorder, reference};
use kcp_keeper_runtime::metrics::ConfigMetrics;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use tokio_util::sync::CancellationToken;

#[derive(Debug, PartialEq, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Config {
    name: String,
}

impl AgentConfig for Config {
    type Raw = Self;
    fn from_raw(raw: Self) -> Result<Self, Vec<FieldError>> {
        if raw.name.is_empty() { Err(vec![FieldError::new("name", "must not be empty")]) } else { Ok(raw) }
    }
}

fn project(dir: &Path, text: &str) -> Result<()> {
    testbed::projection::project_strings(dir, &BTreeMap::from([("config.yaml".to_string(), text.to_string())]))
}

async fn next_change(rx: &mut tokio::sync::watch::Receiver<Arc<Config>>) -> Result<String> {
    tokio::time::timeout(Duration::from_secs(10), rx.changed()).await??;
    Ok(rx.borrow().name.clone())
}

/// Waits until the reload error counter for `reason` has counted the rejection.
async fn counted(metrics: &ConfigMetrics, reason: &str) -> Result<()> {
    testbed::eventually(Duration::from_secs(10), &format!("a {reason} reload error"), || async {
        (metrics.errors(reason) > 0).then_some(())
    })
    .await;
    Ok(())
}

#[tokio::test]
async fn config_swapped_in_by_kubelet_is_applied_only_when_valid_and_a_rejected_file_is_flagged_until_fixed()
-> Result<()> {
    let dir = tempfile::tempdir()?;
    project(dir.path(), "name: first\n")?;
    let file = dir.path().join("config.yaml");
    let initial: Config = config::load(&file)?;
    let metrics = ConfigMetrics::default();
    let shutdown = CancellationToken::new();
    let mut rx = config::watch(file, initial, metrics.clone(), Duration::from_secs(3600), shutdown.clone())?;

    project(dir.path(), "name: second\n")?;
    assert_eq!(next_change(&mut rx).await?, "second");

    // Unknown field, then a semantic error: both rejected, the old configuration stays, each counted once.
    project(dir.path(), "name: third\nnmae: typo\n")?;
    counted(&metrics, "parse").await?;
    project(dir.path(), "name: ''\n")?;
    counted(&metrics, "invalid").await?;
    assert!(!rx.has_changed()?, "an invalid file must not be applied");
    assert_eq!(rx.borrow().name, "second");
    assert_eq!((metrics.errors("parse"), metrics.errors("invalid")), (1, 1), "exactly one error of each kind");
    assert!(metrics.rejected(), "the file on disk is the rejected one: config_rejected must say so (the alert)");

    project(dir.path(), "name: fourth\n")?;
    assert_eq!(next_change(&mut rx).await?, "fourth");
    assert!(!metrics.rejected(), "a valid file applied clears config_rejected");
    shutdown.cancel();
    Ok(())
}

#[tokio::test]
async fn poll_backstop_applies_a_change_without_any_notification() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, "name: first\n")?;
    let metrics = ConfigMetrics::default();
    let shutdown = CancellationToken::new();
    let mut rx =
        config::watch(file.clone(), config::load(&file)?, metrics, Duration::from_millis(300), shutdown.clone())?;
    // Write somewhere notify does not watch, then move the content in place behind its back by re-writing the
    // same inode through a hard link outside the watched directory.
    let outside = tempfile::tempdir()?;
    let link = outside.path().join("link");
    std::fs::hard_link(&file, &link)?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    while rx.has_changed()? {
        rx.borrow_and_update();
    }
    std::fs::write(&link, "name: polled\n")?;
    assert_eq!(next_change(&mut rx).await?, "polled");
    shutdown.cancel();
    Ok(())
}

#[tokio::test]
async fn readyz_follows_first_sync_and_shutdown_and_metrics_are_openmetrics() -> Result<()> {
    let registry = kcp_keeper_runtime::metrics::registry("test_agent");
    let health = Arc::new(Health::default());
    let server = admin::serve("127.0.0.1:0".parse()?, health.clone(), Arc::new(registry)).await?;
    let url = |path: &str| format!("http://{}{path}", server.addr);

    assert_eq!(testbed::http::get(&url("/livez")).await?.0, 200);
    assert_eq!(testbed::http::get(&url("/readyz")).await?.0, 503, "not ready before the watches synced");
    health.set_watches_synced(true);
    health.set_leading(true);
    let (status, _, body) = testbed::http::get(&url("/readyz")).await?;
    assert_eq!((status, body.as_str()), (503, "leading, but the first reconcile has not run"));
    health.mark_reconciled();
    assert_eq!(testbed::http::get(&url("/readyz")).await?.0, 200);
    health.set_reachable(false);
    assert_eq!(testbed::http::get(&url("/readyz")).await?.2, "the apiserver is not reachable");
    health.set_reachable(true);
    assert_eq!(testbed::http::get(&url("/readyz")).await?.0, 200);
    health.start_draining();
    assert_eq!(testbed::http::get(&url("/readyz")).await?.0, 503, "not ready once shutdown starts");
    assert_eq!(testbed::http::get(&url("/livez")).await?.0, 200, "still alive while draining");

    let (status, content_type, body) = testbed::http::get(&url("/metrics")).await?;
    assert_eq!(status, 200);
    assert!(content_type.starts_with("application/openmetrics-text"), "{content_type}");
    let build_info = format!("test_agent_build_info{{version=\"{}\",commit=\"", env!("CARGO_PKG_VERSION"));
    assert!(body.contains(&build_info), "{body}");
    let rss: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .expect("resident memory is exported")
        .parse()?;
    assert!(rss > 1e6, "a real process uses more than 1 MB: {rss}");
    assert!(body.ends_with("# EOF\n"));
    Ok(())
}

#[tokio::test]
async fn events_are_recorded_on_the_object_and_a_repeat_storm_creates_one() -> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let recorder = Recorder::new(bed.client(), "test-agent", "replica-a");
    let regarding = reference("v1", "Secret", &ns, "ca-bundle", None);
    // A crash loop: each "process" is a fresh recorder emitting the same Event.
    for _ in 0..10 {
        let fresh = Recorder::new(bed.client(), "test-agent", "replica-a");
        fresh.publish(&regarding, EventType::Warning, "SourceRejected", "Sync", "source 0 holds a private key").await;
    }
    recorder.publish(&regarding, EventType::Normal, "Published", "Sync", "bundle written: 2 certificates").await;
    let events = Api::<Event>::namespaced(bed.client(), &ns).list(&ListParams::default()).await?.items;
    let reasons: Vec<_> = events.iter().filter_map(|e| e.reason.clone()).collect();
    assert_eq!(reasons.iter().filter(|r| *r == "SourceRejected").count(), 1, "{reasons:?}");
    assert_eq!(reasons.iter().filter(|r| *r == "Published").count(), 1, "{reasons:?}");
    let published = events.iter().find(|e| e.reason.as_deref() == Some("Published")).unwrap();
    assert_eq!(published.regarding.as_ref().and_then(|r| r.name.as_deref()), Some("ca-bundle"));
    assert_eq!(published.reporting_controller.as_deref(), Some("kcp-keeper.io/test-agent"));

    // Within one process, a burst beyond the bucket is dropped.
    for i in 0..20 {
        recorder.publish(&regarding, EventType::Warning, "Burst", "Sync", &format!("attempt {i}")).await;
    }
    let events = Api::<Event>::namespaced(bed.client(), &ns).list(&ListParams::default()).await?.items;
    let bursts = events.iter().filter(|e| e.reason.as_deref() == Some("Burst")).count();
    assert!((1..=5).contains(&bursts), "the rate limit holds a burst to 5, got {bursts}");
    Ok(())
}

#[tokio::test]
async fn a_scoped_watch_syncs_sees_only_its_name_and_resumes_after_an_apiserver_restart() -> Result<()> {
    use kcp_keeper_runtime::watch::{Signal, Watches, by_name};
    use kube::runtime::reflector::ObjectRef;
    let mut bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let api = Api::<Secret>::namespaced(bed.client(), &ns);
    let secret = |name: &str| Secret {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        ..Default::default()
    };
    api.create(&PostParams::default(), &secret("other")).await?;
    let mut watches = Watches::new();
    let store = watches.add("watched", api.clone(), by_name("watched"));
    let mut set = watches.start();
    let wait = Duration::from_secs(60);
    assert_eq!(tokio::time::timeout(wait, set.next()).await?, Some(Signal::Synced(0)));
    assert!(set.all_synced());
    assert!(store.state().is_empty(), "the field selector keeps other Secrets out of the store");

    bed.apiserver.restart().await?;
    let created = api.create(&PostParams::default(), &secret("watched")).await?;
    // The object exists only after the restart, so only a watch that resumed can deliver it: the store gets it
    // with a signal of this watch's (a change, or the re-list after the break), and it is that very object.
    let key = ObjectRef::new("watched").within(&ns);
    let delivered_by = tokio::time::timeout(wait, async {
        loop {
            let signal = set.next().await;
            if store.get(&key).is_some() {
                return signal;
            }
        }
    })
    .await?;
    assert!(matches!(delivered_by, Some(Signal::Changed(0) | Signal::Synced(0))), "{delivered_by:?}");
    let seen = store.get(&key).expect("delivered");
    assert_eq!(seen.metadata.uid, created.metadata.uid, "the store holds the object created after the restart");
    Ok(())
}
