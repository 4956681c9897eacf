//! The admin server: one port with `/livez`, `/readyz` and `/metrics` (OpenMetrics text).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// Readiness, from what the replica has proven rather than from its loop having run:
/// - its watches have delivered their initial list (caches are synced), and
/// - the apiserver answers (a watch error clears this until a request succeeds again), and
/// - while it leads, its first full reconcile has run (a failing item is reported by metrics and Events, not
///   here: one bad target must not take every replica out of the Service), and
/// - for an agent that asked for it ([`Health::require_success`]), while it leads, a cycle has succeeded (an
///   agent with one item, whose whole job fails together, is not ready until it has done that job once), and
/// - shutdown has not started.
#[derive(Debug, Default)]
pub struct Health {
    watches_synced: AtomicBool,
    /// Cleared at start: the apiserver counts as reachable until a watch fails.
    unreachable: AtomicBool,
    leading: AtomicBool,
    reconciled: AtomicBool,
    needs_success: AtomicBool,
    succeeded: AtomicBool,
    draining: AtomicBool,
}

impl Health {
    /// For a process without watches or leader election (the sidecar): its first complete pass is all there is.
    pub fn mark_synced(&self) {
        self.watches_synced.store(true, Ordering::SeqCst);
        self.mark_reconciled();
    }

    /// Every watch has delivered its initial list (or, `false`, a new set of watches has not yet).
    pub fn set_watches_synced(&self, synced: bool) {
        if !self.watches_synced.swap(synced, Ordering::SeqCst) && synced {
            tracing::info!("watches synced");
        }
    }

    /// Whether the apiserver answered the last time we asked.
    pub fn set_reachable(&self, reachable: bool) {
        if self.unreachable.swap(!reachable, Ordering::SeqCst) == reachable {
            tracing::info!(reachable, "apiserver reachability changed");
        }
    }

    pub fn is_reachable(&self) -> bool {
        !self.unreachable.load(Ordering::SeqCst)
    }

    /// Whether this replica leads; a leader is ready only once it has reconciled.
    pub fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::SeqCst);
    }

    /// The leader's first full reconcile has run.
    pub fn mark_reconciled(&self) {
        if !self.reconciled.swap(true, Ordering::SeqCst) {
            tracing::info!("first reconcile complete");
        }
    }

    /// From now on a leader is ready only once [`Health::mark_succeeded`] has been called.
    pub fn require_success(&self) {
        self.needs_success.store(true, Ordering::SeqCst);
    }

    /// A cycle did its job (for [`Health::require_success`]).
    pub fn mark_succeeded(&self) {
        if !self.succeeded.swap(true, Ordering::SeqCst) {
            tracing::info!("first successful cycle");
        }
    }

    /// Called when shutdown starts, so load balancers and rollouts stop counting on this replica.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// `None` when ready, otherwise the first reason it is not.
    pub fn not_ready_reason(&self) -> Option<&'static str> {
        let get = |flag: &AtomicBool| flag.load(Ordering::SeqCst);
        if get(&self.draining) {
            Some("shutting down")
        } else if !get(&self.watches_synced) {
            Some("watches have not delivered their initial list")
        } else if get(&self.unreachable) {
            Some("the apiserver is not reachable")
        } else if get(&self.leading) && !get(&self.reconciled) {
            Some("leading, but the first reconcile has not run")
        } else if get(&self.leading) && get(&self.needs_success) && !get(&self.succeeded) {
            Some("leading, but no cycle has succeeded yet")
        } else {
            None
        }
    }

    pub fn is_ready(&self) -> bool {
        self.not_ready_reason().is_none()
    }
}

/// A running admin server; it stops when dropped.
pub struct AdminServer {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `addr` (port 0 picks a free one) and serves until dropped.
pub async fn serve(addr: SocketAddr, health: Arc<Health>, registry: Arc<Registry>) -> std::io::Result<AdminServer> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "admin server listening");
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let (health, registry) = (health.clone(), registry.clone());
            let service = service_fn(move |req| {
                let response = respond(&req, &health, &registry);
                async move { Ok::<_, Infallible>(response) }
            });
            tokio::spawn(async move {
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    Ok(AdminServer { addr, task })
}

fn respond(req: &Request<Incoming>, health: &Health, registry: &Registry) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    match req.uri().path() {
        "/livez" => text(StatusCode::OK, "ok\n"),
        "/readyz" => match health.not_ready_reason() {
            None => text(StatusCode::OK, "ok\n"),
            Some(reason) => text(StatusCode::SERVICE_UNAVAILABLE, reason),
        },
        "/metrics" => Response::builder()
            .header(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")
            .body(Full::new(Bytes::from(crate::metrics::encode(registry))))
            .unwrap_or_default(),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_that_requires_success_is_not_ready_as_leader_until_a_cycle_succeeded() {
        let health = Health::default();
        health.set_watches_synced(true);
        health.set_leading(true);
        health.mark_reconciled();
        assert!(health.is_ready(), "without the requirement, a pass that ran is enough");
        health.require_success();
        assert_eq!(health.not_ready_reason(), Some("leading, but no cycle has succeeded yet"));
        health.set_leading(false);
        assert!(health.is_ready(), "a follower does not reconcile, so it needs no success");
        health.set_leading(true);
        health.mark_succeeded();
        assert!(health.is_ready());
    }
}
