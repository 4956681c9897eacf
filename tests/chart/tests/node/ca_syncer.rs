//! ca-syncer's tests on the shared node and install (see main.rs), beyond the install-wide ones there.

#[allow(unused_imports)]
use super::*;

use chart::on_node::{SIGNER, TRUST_BUNDLE};
use k8s_openapi::api::certificates::v1::ClusterTrustBundle;

/// ca-syncer, in its pod, writes the source CA into a ClusterTrustBundle with the configured signer; a pod on the
/// real node projects every bundle of that signer (`projected.sources[].clusterTrustBundle`, no Secret and no
/// RBAC of its own), and the kubelet-written file holds the source's certificate.
#[tokio::test]
async fn a_pod_on_the_node_projects_the_cluster_trust_bundle_ca_syncer_writes_by_its_signer_and_reads_the_ca()
-> Result<()> {
    installed();
    let _shared = RELEASE.read().await;
    let node = node::shared();
    let client = node.client().await?;
    let bundles = Api::<ClusterTrustBundle>::all(client.clone());
    let source = Api::<Secret>::namespaced(client.clone(), "kcp-system").get("root-server-ca").await?;
    let want = source.data.context("no data")?.get("ca.crt").context("no ca.crt")?.0.clone();
    let want = String::from_utf8(want)?.trim().to_string();
    // The source as it is now; another test may change it meanwhile, so the bundle is waited for, not assumed.
    let bundle = testbed::eventually(Duration::from_secs(60), "ca-syncer to write the ClusterTrustBundle", || async {
        bundles.get_opt(TRUST_BUNDLE).await.ok().flatten().filter(|b| b.spec.trust_bundle.contains(&want))
    })
    .await;
    ensure!(bundle.spec.signer_name.as_deref() == Some(SIGNER), "signer: {:?}", bundle.spec.signer_name);

    let name = "trust-bundle-reader";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": restricted_pause_spec(
            json!([{"name": "trust", "projected": {"sources": [{"clusterTrustBundle": {
                "signerName": SIGNER, "labelSelector": {}, "path": "ca.pem"}}]}}]),
            json!([{"name": "trust", "mountPath": "/etc/kcp-trust", "readOnly": true}]),
        ),
    }))?;
    let pods = Api::<Pod>::namespaced(client.clone(), "railgrid-system");
    let _ = pods.delete(name, &Default::default()).await;
    testbed::eventually(Duration::from_secs(60), "no reader pod left from an earlier run", || async {
        pods.get_opt(name).await.ok().and_then(|p| p.is_none().then_some(()))
    })
    .await;
    pods.create(&PostParams::default(), &pod).await?;
    let uid = testbed::eventually(Duration::from_secs(120), "the reader pod Running", || async {
        let pod = pods.get(name).await.ok()?;
        (pod.status?.phase.as_deref() == Some("Running")).then_some(pod.metadata.uid?)
    })
    .await;
    let file = node.kubelet_root().join(format!("pods/{uid}/volumes/kubernetes.io~projected/trust/ca.pem"));
    let projected = testbed::eventually(Duration::from_secs(60), "the projected bundle holding the CA", || async {
        node.read_inside(&file).ok().filter(|m| {
            let current = bundle.spec.trust_bundle.trim();
            m.contains(&want) || m.contains(current)
        })
    })
    .await;
    let certificates = projected.matches("BEGIN CERTIFICATE").count();
    ensure!(certificates >= 1, "no certificate in the projected file:\n{projected}");
    eprintln!("the kubelet projected {TRUST_BUNDLE} ({certificates} certificates) into a pod by its signer");
    pods.delete(name, &Default::default()).await?;
    Ok(())
}
