//! dns-rewriter's tests on the shared node and install (see main.rs), beyond the install-wide ones there.

#[allow(unused_imports)]
use super::*;

use k8s_openapi::api::core::v1::ConfigMap;

/// A kubeadm-shaped Corefile ConfigMap of this test's own (the shared install's CoreDNS pod reads
/// `kube-system/coredns`, k3s-shaped, which the other tests need as it is).
const COREFILE_CONFIGMAP: &str = "kcp-keeper-test-kubeadm-coredns";

/// `helm install --wait` of the shared release again, with the values the other tests expect (the peers and
/// objects `seed` made are still there: an uninstall removes only the release's own objects).
fn helm_reinstall(node: &Node) -> Result<()> {
    let home = tempfile::tempdir()?;
    let values_file = home.path().join("values.yaml");
    std::fs::write(&values_file, serde_yaml::to_string(&values(node)?)?)?;
    let chart_dir = chart::chart_dir();
    let kubeconfig = node.kubeconfig.display().to_string();
    let args = [
        "install",
        "kcp-keeper",
        chart_dir.to_str().context("chart path")?,
        "--namespace",
        NAMESPACE,
        "--kubeconfig",
        &kubeconfig,
        "--values",
        values_file.to_str().context("values path")?,
        "--wait",
        "--timeout",
        "5m",
    ];
    let out = run(helm(&args, home.path())?)?;
    ensure!(out.success, "helm install (again) failed: {}", out.stderr);
    Ok(())
}

async fn corefile(client: &kube::Client) -> Option<String> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), "kube-system").get_opt(COREFILE_CONFIGMAP).await.ok()??;
    cm.data?.get("Corefile").cloned()
}

/// The shared release, switched to Corefile mode on a kubeadm-shaped Corefile, writes its block; `helm
/// uninstall` runs the chart's pre-delete hook (`dns-rewriter cleanup` as a Job, in a pod on the node, with the
/// agent's ServiceAccount and Roles) and the Corefile is byte for byte what it was before the agent's first
/// write. The release is installed again afterwards for the other tests.
#[tokio::test]
async fn helm_uninstall_runs_the_cleanup_hook_and_leaves_the_corefile_byte_for_byte_as_before_install() -> Result<()> {
    installed();
    let _exclusive = RELEASE.write().await;
    let node = node::shared();
    let client = node.client().await?;
    let original = testbed::coredns::KUBEADM_DEFAULT_COREFILE;
    create::<ConfigMap>(
        &client,
        "kube-system",
        json!({"metadata": {"name": COREFILE_CONFIGMAP}, "data": {"Corefile": original}}),
    )
    .await?;

    let mut corefile_values = values(node)?;
    corefile_values["dnsRewriter"]["config"]["mode"] = json!("corefile");
    corefile_values["dnsRewriter"]["config"]["corefile"] = json!({"name": COREFILE_CONFIGMAP});
    helm_upgrade(node, &corefile_values)?;
    let written = testbed::eventually(Duration::from_secs(120), "the block written into the Corefile", || async {
        corefile(&client).await.filter(|c| c.contains("rewrite name exact kcp-root.example.com."))
    })
    .await;
    ensure!(written.contains("# kcp-keeper:begin dns-rewriter"), "{written}");

    let home = tempfile::tempdir()?;
    let kubeconfig = node.kubeconfig.display().to_string();
    let started = Instant::now();
    let out = run(helm(
        &[
            "uninstall",
            "kcp-keeper",
            "--namespace",
            NAMESPACE,
            "--kubeconfig",
            &kubeconfig,
            "--wait",
            "--timeout",
            "5m",
        ],
        home.path(),
    )?)?;
    let uninstall = out.success;
    let after = corefile(&client).await;
    // Whatever happened, the other tests get their release back.
    let reinstalled = helm_reinstall(node);
    ensure!(uninstall, "helm uninstall failed: {}", out.stderr);
    eprintln!("helm uninstall (with its pre-delete hook) took {:.1?}", started.elapsed());
    let after = after.context("the Corefile ConfigMap is kept")?;
    assert_eq!(after, original, "helm uninstall left the Corefile exactly as it was before install");
    reinstalled?;
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system").delete(COREFILE_CONFIGMAP, &Default::default()).await?;
    Ok(())
}
