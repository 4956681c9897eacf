//! ca-syncer, in its pod, carrying the root shard's server CA as cert-manager issued it for the kcp-operator
//! (`tls.crt` of `kcp-system/root-server-ca`, the intermediate CA the front proxy's serving certificate comes
//! from) into the hub's CA bundle, after verifying the live front proxy with it.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use testbed::node;
use testbed::seed::layout::{EXTERNAL_HOST, NAMESPACE, ROOT_SHARD};

use chart::on_seed::{CA_TARGET, HUB_NAMESPACE};

use crate::everything::{certificates, secret_text as key};

/// The target holds exactly the server CA's certificates (the intermediate, and with it the chain cert-manager
/// put in `tls.crt`), none of the Secret's private key; ca-syncer publishes a bundle only once its live check
/// passed (the front proxy's chain, presented to its Service address, verified with the bundle for the public
/// name), and its metrics count no live-check failure for the bundle.
#[tokio::test]
async fn ca_syncer_puts_the_operators_root_server_ca_into_the_hubs_bundle_after_verifying_the_live_front_proxy_with_it()
-> Result<()> {
    // The layout as installed: not while upgrade.rs rolls alpha to another tag.
    let _layout = crate::LAYOUT_CHANGES.read().await;
    crate::keeper();
    let node = node::shared();
    let client = node.client().await?;
    let source = format!("{ROOT_SHARD}-server-ca");
    let issued = key(&client, NAMESPACE, &source, "tls.crt").await.context("no tls.crt in the server CA Secret")?;
    let issued = certificates(&issued);
    ensure!(!issued.is_empty(), "{source} holds no certificate");
    let bundle = testbed::eventually(Duration::from_secs(120), "the server CA in the hub's bundle", || async {
        let bundle = key(&client, HUB_NAMESPACE, CA_TARGET, "ca.crt").await?;
        issued.iter().all(|c| bundle.contains(c.as_str())).then_some(bundle)
    })
    .await;
    ensure!(!bundle.contains("PRIVATE KEY"), "the hub's bundle holds a private key");
    let target = Api::<Secret>::namespaced(client.clone(), HUB_NAMESPACE).get(CA_TARGET).await?;
    let keys: Vec<String> = target.data.unwrap_or_default().into_keys().collect();
    ensure!(keys == ["ca.crt"], "the hub's Secret holds {keys:?}, not ca.crt alone");
    // Besides, only a server CA a rotation replaced (consumer.rs rotates it), which ca-syncer keeps for its overlap.
    let rotated_out = crate::everything::ROTATED_OUT.lock().expect("rotated out").clone();
    ensure!(
        certificates(&bundle).iter().all(|c| issued.contains(c) || rotated_out.contains(c)),
        "the hub's bundle holds a certificate the server CA Secret does not"
    );

    let pod = chart::on_seed::agent_pod(node, "ca-syncer")?;
    let metrics = chart::on_seed::pod_metrics(node, &pod)?;
    let failures: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("ca_syncer_live_check_failures_total{") && !l.ends_with(" 0"))
        .collect();
    ensure!(failures.is_empty(), "live-check failures: {failures:?}");
    eprintln!(
        "ca-syncer verified the front proxy for {EXTERNAL_HOST} with {} certificate(s) of {source} and published them",
        issued.len()
    );
    Ok(())
}
