//! One HTTPS GET with no credentials, to an address, verifying the server's certificate for a name against a
//! given CA bundle: what `curl --cacert` does in the seed's Verify section.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use kcp_keeper_runtime::redact;
use rustls::pki_types::{CertificateDer, ServerName};

/// A rustls client config trusting only the certificates of `ca_pem`.
pub fn tls_config(ca_pem: &[u8]) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for block in pem::parse_many(ca_pem).context("the CA bundle is not PEM")? {
        if block.tag() == "CERTIFICATE" {
            roots.add(CertificateDer::from(block.contents().to_vec())).context("a CA certificate is unusable")?;
        }
    }
    if roots.is_empty() {
        bail!("the CA bundle holds no certificate");
    }
    Ok(rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth())
}

/// `GET https://<name><path>` sent to `addr`: the status and up to 4 KiB of the body.
pub async fn get(addr: SocketAddr, name: &str, ca_pem: &[u8], path: &str, timeout: Duration) -> Result<(u16, String)> {
    tokio::time::timeout(timeout, get_inner(addr, name, ca_pem, path))
        .await
        .with_context(|| format!("no answer from {addr} within {timeout:?}"))?
}

async fn get_inner(addr: SocketAddr, name: &str, ca_pem: &[u8], path: &str) -> Result<(u16, String)> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls_config(ca_pem)?));
    let server_name =
        ServerName::try_from(name.to_string()).with_context(|| format!("{name:?} is not a server name"))?;
    let tcp = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
    let tls = connector.connect(server_name, tcp).await.with_context(|| format!("TLS with {addr} as {name}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    let driver = tokio::spawn(conn);
    let request = http::Request::get(path).header(http::header::HOST, name).body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await.context("sending the request")?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.context("reading the body")?.to_bytes();
    driver.abort();
    let text = String::from_utf8_lossy(&body[..body.len().min(4096)]).into_owned();
    Ok((status, text))
}

/// `GET http://<addr><path>` (a metrics endpoint): the body, at most 4 MiB.
pub async fn get_plain(url: &str, timeout: Duration) -> Result<String> {
    let (authority, path) = plain_url(url)?;
    let (shown, shown_authority) = (redact::url(url), redact::url(authority));
    let work = async {
        let tcp = tokio::net::TcpStream::connect(authority)
            .await
            .with_context(|| format!("connecting to {shown_authority}"))?;
        fetch(tcp, authority, &path, &shown).await
    };
    tokio::time::timeout(timeout, work).await.with_context(|| format!("no answer from {shown} within {timeout:?}"))?
}

/// The same GET to every address the URL's host resolves to: one body (or error) per address. An agent's
/// replicas each export only what they did (the Lease holder snapshots, drills and verifies), so the doctor
/// reads them all; a headless Service's name resolves to every replica (the chart's `<agent>-replicas`).
pub async fn get_every_address(url: &str, timeout: Duration) -> Result<Vec<(SocketAddr, Result<String>)>> {
    let (authority, path) = plain_url(url)?;
    let (shown, shown_authority) = (redact::url(url), redact::url(authority));
    let addrs: Vec<SocketAddr> = tokio::time::timeout(timeout, tokio::net::lookup_host(authority))
        .await
        .with_context(|| format!("resolving {shown_authority}: no answer within {timeout:?}"))?
        .with_context(|| format!("resolving {shown_authority}"))?
        .collect();
    if addrs.is_empty() {
        bail!("{shown_authority} resolves to no address");
    }
    let mut out = Vec::new();
    for addr in addrs {
        let work = async {
            let tcp = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
            fetch(tcp, authority, &path, &shown).await
        };
        let body = tokio::time::timeout(timeout, work)
            .await
            .with_context(|| format!("no answer from {shown} at {addr} within {timeout:?}"))
            .and_then(|r| r);
        out.push((addr, body));
    }
    Ok(out)
}

/// `http://authority/path` split; only plain HTTP (a metrics endpoint).
fn plain_url(url: &str) -> Result<(&str, String)> {
    let rest =
        url.strip_prefix("http://").with_context(|| format!("{}: only http:// is supported", redact::url(url)))?;
    Ok(rest.split_once('/').map_or((rest, "/".to_string()), |(a, p)| (a, format!("/{p}"))))
}

/// `shown` is the URL as errors name it, without userinfo.
async fn fetch(tcp: tokio::net::TcpStream, authority: &str, path: &str, shown: &str) -> Result<String> {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    let driver = tokio::spawn(conn);
    let request = http::Request::get(path).header(http::header::HOST, authority).body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    driver.abort();
    if !status.is_success() {
        bail!("{shown} answered {status}");
    }
    if body.len() > 4 << 20 {
        bail!("{shown} answered more than 4 MiB");
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}
