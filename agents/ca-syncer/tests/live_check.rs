//! The live check against real kcp: the front proxy and both shards of the test bed's kcp, each serving its own
//! certificate from the server CA (as kcp-operator lays them out), are every one verified with the bundle as it
//! will be published. When one shard serves a certificate from another CA, nothing is published and that
//! endpoint alone is named and counted; once the sources carry that CA, the bundle goes out.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use ca_syncer::certs::{EmptyPolicy, parse_certificates};
use ca_syncer::config::Endpoint;
use common::*;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use rustls::pki_types::ServerName;
use testbed::certs::Ca;
use testbed::{ControlPlane, eventually};

/// Replaces a file the way a kubelet-mounted Secret changes: the new content appears at once, whole.
fn replace(path: &Path, content: &str) -> Result<()> {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
}

fn endpoint(url: &str) -> Endpoint {
    let address = url.trim_start_matches("https://").to_string();
    Endpoint { url: url.into(), address, server_name: ServerName::IpAddress(Ipv4Addr::LOCALHOST.into()) }
}

fn certificates(pem: &str) -> Vec<ca_syncer::certs::Certificate> {
    parse_certificates(pem.as_bytes(), EmptyPolicy::Reject).expect("test certificates parse")
}

#[tokio::test]
async fn every_endpoint_of_kcp_must_verify_and_a_shard_serving_from_another_ca_holds_the_bundle_back() -> Result<()> {
    // A bed of this binary's own even when `cargo xtask test` shares one: the test replaces the alpha shard's
    // serving certificate, which would fail every other binary's requests to alpha meanwhile.
    let kcp = testbed::kcp::private();
    let _logs = kcp.logs_on_failure();
    let bed = ControlPlane::start().await?;
    let (src, dst) = (bed.namespace().await?, bed.namespace().await?);
    let (front_proxy, root, alpha) = (&kcp.front_proxy.url, &kcp.shard("root").url, &kcp.shard("alpha").url);

    // The server CA Secret as kcp-operator writes it (its private key included, never read).
    let server_ca = kcp.pki.ca_secret_data(&kcp.pki.server_ca);
    let sources = Api::<Secret>::namespaced(bed.client(), &src);
    let source = |extra: &str| {
        let tls = format!("{}{extra}", server_ca["tls.crt"]);
        secret(
            "root-server-ca",
            &[("tls.crt", &tls), ("ca.crt", &server_ca["ca.crt"]), ("tls.key", &server_ca["tls.key"])],
        )
    };
    sources.create(&PostParams::default(), &source("")).await?;
    let config = format!(
        "resyncInterval: 1s\nbundles:\n- name: kcp\n  sources:\n  - secret: {{namespace: {src}, name: root-server-ca, key: tls.crt}}\n  - secret: {{namespace: {src}, name: root-server-ca, key: ca.crt}}\n  targets:\n  - secret: {{namespace: {dst}, name: kcp-ca, key: ca.crt}}\n  liveCheck:\n    endpoints:\n    - url: {front_proxy}\n    - url: {root}\n    - url: {alpha}\n"
    );
    let mut agent = start_agent(&bed, &src, &config)?;
    agent.wait_ready(Duration::from_secs(60)).await?;
    let client = bed.client();
    let published = eventually(WAIT, "the bundle verified by all three endpoints", || async {
        key(&client, &dst, "kcp-ca", "ca.crt").await
    })
    .await;
    assert_eq!(certificates(&published).len(), 2, "the server CA and its root");

    // The alpha shard is re-issued by another CA (kcp reloads its serving certificate from the files).
    let other = Ca::new("another server CA", YEAR)?;
    let mut serving = other.issue_server(&["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)], YEAR)?;
    serving.cert_pem.push_str(&other.cert_pem());
    let alpha_dir = kcp.dir.join("alpha");
    let originals =
        (std::fs::read_to_string(alpha_dir.join("tls.crt"))?, std::fs::read_to_string(alpha_dir.join("tls.key"))?);
    replace(&alpha_dir.join("tls.key"), &serving.key_pem)?;
    replace(&alpha_dir.join("tls.crt"), &serving.cert_pem)?;
    let others = certificates(&other.cert_pem());
    eventually(Duration::from_secs(120), "the alpha shard to serve from the other CA", || async {
        ca_syncer::live_check::verify(&endpoint(alpha), &others).await.ok()
    })
    .await;

    // A change to the sources that alpha's certificate does not verify is not published.
    let unrelated = Ca::new("an unrelated CA", YEAR)?;
    sources.replace("root-server-ca", &PostParams::default(), &source(&unrelated.cert_pem())).await?;
    let failing = |url: &str| {
        format!("ca_syncer_live_check_failures_total{{bundle=\"kcp\",endpoint=\"{url}\",reason=\"not_verified\"}}")
    };
    wait_for_metric(&agent, &failing(alpha), "alpha counted as not verified", |v| v >= 1.0).await;
    let text = metrics(&agent).await;
    for url in [front_proxy, root] {
        assert!(!text.contains(&format!("endpoint=\"{url}\"")), "{url} verified, so never counted:\n{text}");
    }
    let in_sync =
        format!("ca_syncer_target_in_sync{{bundle=\"kcp\",kind=\"Secret\",namespace=\"{dst}\",name=\"kcp-ca\"}}");
    wait_for_metric(&agent, &in_sync, "the target out of sync", |v| v == 0.0).await;
    assert_eq!(
        key(&client, &dst, "kcp-ca", "ca.crt").await.as_deref(),
        Some(published.as_str()),
        "target kept as it was"
    );
    // One Event for the bundle, on its source (not one per target).
    let event = eventually(WAIT, "a LiveCheckFailed Event", || async {
        let events = Api::<Event>::namespaced(client.clone(), &src).list(&ListParams::default()).await.ok()?;
        events.items.into_iter().find(|e| e.reason.as_deref() == Some("LiveCheckFailed"))
    })
    .await;
    assert_eq!(event.regarding.as_ref().and_then(|r| r.name.as_deref()), Some("root-server-ca"));
    let note = event.note.unwrap_or_default();
    assert!(note.contains(alpha.as_str()), "the Event names the failing endpoint: {note}");
    assert!(!note.contains(root.as_str()) && !note.contains(front_proxy.as_str()), "and only it: {note}");
    let log = agent.process.log();
    let line = log.lines().find(|l| l.contains("live check failed")).expect("a log line per failing endpoint");
    assert!(line.contains(&format!("\"endpoint\":\"{alpha}\"")), "{line}");
    // Neither the Event nor the log carries any certificate of the bundle.
    let everything = format!("{note}\n{log}");
    for pem in [&server_ca["tls.crt"], &server_ca["ca.crt"], &unrelated.cert_pem(), &server_ca["tls.key"]] {
        let body = pem.lines().nth(1).expect("a PEM body line");
        assert!(!everything.contains(body), "bundle content in the Event or log");
    }

    // Once the sources carry alpha's CA, every endpoint verifies and the bundle goes out.
    sources.replace("root-server-ca", &PostParams::default(), &source(&other.cert_pem())).await?;
    let updated = eventually(WAIT, "the bundle with the other CA published", || async {
        key(&client, &dst, "kcp-ca", "ca.crt").await.filter(|b| certificates(b).len() == 3)
    })
    .await;
    assert!(updated.contains(other.cert_pem().lines().nth(1).expect("body")), "{updated}");
    wait_for_metric(&agent, &in_sync, "the target in sync", |v| v == 1.0).await;

    replace(&alpha_dir.join("tls.key"), &originals.1)?;
    replace(&alpha_dir.join("tls.crt"), &originals.0)?;
    Ok(())
}
