//! Plain-HTTP GETs on loopback: readiness endpoints of peers and of our agents' admin servers.

use anyhow::{Result, bail};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// GET `url` (http only): status, content type and body.
pub async fn get(url: &str) -> Result<(u16, String, String)> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let response = client.get(url.parse()?).await?;
    let status = response.status().as_u16();
    let content_type =
        response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, content_type, String::from_utf8_lossy(&body).into_owned()))
}

/// GET `url` and fail unless the status is 2xx.
pub async fn get_ok(url: &str) -> Result<()> {
    let (status, _, _) = get(url).await?;
    if !(200..300).contains(&status) {
        bail!("GET {url}: {status}");
    }
    Ok(())
}
