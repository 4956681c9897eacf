//! The retry helper against a real kube-apiserver that goes away and comes back: retryable failures
//! (connection refused) are retried until it answers, a 404 is not retried at all, attempts are bounded, and
//! shutdown ends a retry that is waiting out its backoff.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::ConfigMap;
use kcp_keeper_runtime::retry::{RetryError, RetryPolicy, retry};
use kube::api::Api;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_call_is_retried_until_the_restarted_apiserver_answers_but_a_404_is_tried_once() -> Result<()> {
    let mut bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let client = bed.client();
    let shutdown = CancellationToken::new();

    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let calls = AtomicUsize::new(0);
    let result = retry(&RetryPolicy::default(), &shutdown, "get configmap", || {
        calls.fetch_add(1, Ordering::SeqCst);
        api.get("absent")
    })
    .await;
    assert!(matches!(result, Err(RetryError::Permanent { attempts: 1, .. })), "{result:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a 404 answers the same every time: not retried");

    bed.apiserver.process.kill();
    let policy = RetryPolicy {
        min_delay: Duration::from_millis(200),
        max_delay: Duration::from_secs(1),
        max_attempts: 200,
        max_waiting: Duration::from_secs(90),
    };
    let calls = AtomicUsize::new(0);
    let call = retry(&policy, &shutdown, "apiserver version", || {
        calls.fetch_add(1, Ordering::SeqCst);
        client.apiserver_version()
    });
    let restart = async {
        // Bring it back only once the helper has seen it fail and retried.
        while calls.load(Ordering::SeqCst) < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bed.apiserver.restart().await
    };
    let (result, restarted) = tokio::join!(call, restart);
    restarted?;
    let version = result.map_err(|e| anyhow::anyhow!("{e}"))?;
    assert!(!version.git_version.is_empty());
    assert!(calls.load(Ordering::SeqCst) >= 3, "it failed while the apiserver was down, then got through");
    Ok(())
}

#[tokio::test]
async fn retries_against_a_dead_apiserver_are_bounded_and_shutdown_ends_the_backoff_at_once() -> Result<()> {
    let mut bed = testbed::ControlPlane::start().await?;
    let client = bed.client();
    bed.apiserver.process.kill();

    let policy = RetryPolicy {
        min_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(50),
        max_attempts: 4,
        max_waiting: Duration::from_secs(30),
    };
    let calls = AtomicUsize::new(0);
    let result = retry(&policy, &CancellationToken::new(), "apiserver version", || {
        calls.fetch_add(1, Ordering::SeqCst);
        client.apiserver_version()
    })
    .await;
    assert!(matches!(result, Err(RetryError::Exhausted { attempts: 4, .. })), "{result:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 4);

    // A long backoff: shutdown must not wait it out.
    let policy = RetryPolicy { min_delay: Duration::from_secs(60), max_delay: Duration::from_secs(60), ..policy };
    let shutdown = CancellationToken::new();
    let calls = AtomicUsize::new(0);
    let call = retry(&policy, &shutdown, "apiserver version", || {
        calls.fetch_add(1, Ordering::SeqCst);
        client.apiserver_version()
    });
    let cancel = async {
        while calls.load(Ordering::SeqCst) < 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        shutdown.cancel();
    };
    let (result, ()) = tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(call, cancel) }).await?;
    assert!(matches!(result, Err(RetryError::ShutDown { .. })), "{result:?}");
    Ok(())
}
