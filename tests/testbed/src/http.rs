//! The one plain-HTTP call the test bed makes itself: readiness endpoints on loopback.

use anyhow::{Result, bail};
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// GET `url` (http only) and fail unless the status is 2xx.
pub async fn get_ok(url: &str) -> Result<()> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let response = client.get(url.parse()?).await?;
    if !response.status().is_success() {
        bail!("GET {url}: {}", response.status());
    }
    Ok(())
}
