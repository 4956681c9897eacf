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

/// Readiness: false until the agent's first successful sync, false again once shutdown starts.
#[derive(Debug, Default)]
pub struct Health {
    synced: AtomicBool,
    draining: AtomicBool,
}

impl Health {
    /// Called by the agent after its first complete, successful cycle.
    pub fn mark_synced(&self) {
        if !self.synced.swap(true, Ordering::SeqCst) {
            tracing::info!("first sync complete: ready");
        }
    }

    /// Called when shutdown starts, so load balancers and rollouts stop counting on this replica.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.synced.load(Ordering::SeqCst) && !self.draining.load(Ordering::SeqCst)
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
        "/readyz" if health.is_ready() => text(StatusCode::OK, "ok\n"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
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
