//! The APIExportEndpointSlice check's I/O: the slices listed inside kcp (with a client built from the parsed kcp
//! kubeconfig, [`crate::kcp_access`]), and each advertised URL resolved and its TLS handshake verified against the
//! configured CA bundle for the URL's host name, as a provider connecting to it would.

use std::sync::Arc;
use std::time::Duration;

use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use rustls::pki_types::ServerName;

use crate::rules::endpoint_slices::{self, CHECK, Slice};
use crate::verdict::Verdict;

const TIMEOUT: Duration = Duration::from_secs(10);

fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apis.kcp.io", "v1alpha1", "APIExportEndpointSlice"),
        "apiexportendpointslices",
    )
}

/// The slices of the client's workspace (its server's `/clusters/<workspace>`).
pub async fn slices(client: &kube::Client) -> Result<Vec<Slice>, String> {
    let list = Api::<DynamicObject>::all_with(client.clone(), &resource())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing APIExportEndpointSlices: {e}"))?;
    list.items
        .iter()
        .map(|o| endpoint_slices::parse(&serde_json::json!({"metadata": o.metadata, "status": o.data["status"]})))
        .collect()
}

/// `https://host[:port]/...` resolved, connected, and its certificate verified for `host` against `ca_pem`:
/// what it resolved to and that the chain verified, or what failed.
pub async fn probe(url: &str, ca_pem: &[u8]) -> Result<String, String> {
    let shown = kcp_keeper_runtime::redact::url(url);
    let url = shown.as_str();
    let uri: http::Uri = url.parse().map_err(|_| format!("{url:?} is not a URL"))?;
    if uri.scheme_str() != Some("https") {
        return Err(format!("{url} is not https"));
    }
    let host = uri.host().ok_or_else(|| format!("{url} has no host"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let port = uri.port_u16().unwrap_or(443);
    let config = crate::probe::tls_config(ca_pem).map_err(|e| format!("the CA bundle: {e:#}"))?;
    let work = async {
        let addrs: Vec<_> = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| format!("{host} does not resolve: {e}"))?
            .collect();
        let addr = *addrs.first().ok_or_else(|| format!("{host} resolves to no address"))?;
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("{host} resolves to {addr}, which refuses or drops the connection: {e}"))?;
        let name = ServerName::try_from(host.clone()).map_err(|_| format!("{host:?} is not a server name"))?;
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("{host} at {addr}: TLS does not verify with the configured CA bundle: {e}"))?;
        Ok(format!("{host} resolves to {addr}; its certificate verifies for {host} with the configured CA bundle"))
    };
    tokio::time::timeout(TIMEOUT, work)
        .await
        .unwrap_or_else(|_| Err(format!("{host}:{port}: no answer within {TIMEOUT:?}")))
}

/// Every slice's lines.
pub async fn check(client: &kube::Client, ca_pem: &[u8]) -> Vec<Verdict> {
    let slices = match slices(client).await {
        Ok(s) => s,
        Err(e) => return vec![Verdict::fail(CHECK, "kcp", e, "check --kcp-kubeconfig and its permissions in kcp")],
    };
    if slices.is_empty() {
        return vec![Verdict::ok(CHECK, "kcp", "no APIExportEndpointSlice in the workspace")];
    }
    let mut out = Vec::new();
    for slice in &slices {
        let mut probes = Vec::new();
        for url in &slice.urls {
            probes.push(probe(url, ca_pem).await);
        }
        out.extend(endpoint_slices::judge(slice, &probes));
    }
    out
}
