//! A pull that fails, on the real node: a second release of the chart (ca-syncer alone, all in its own namespace) whose
//! image cannot be pulled, first a tag the registry does not have, then a registry that is down. kubelet reports
//! each as the container's `ErrImagePull`/`ImagePullBackOff`, and `kcp-keeper doctor`'s `agent-pods` check names
//! the pod, the container, the image and the registry's answer.

#[allow(unused_imports)]
use super::*;

use k8s_openapi::api::core::v1::Namespace;
use kcp_keeper_doctor::options::Options;
use kcp_keeper_doctor::verdict::Level;

const PULL_NAMESPACE: &str = "pull-test";
const PULL_RELEASE: &str = "kcp-keeper-pull";
/// A port inside the node where no registry listens.
const DOWN_REGISTRY: &str = "127.0.0.1:5999/kcp-keeper";

fn pull_values(registry: &str, tag: &str) -> Value {
    json!({
        "image": {"registry": registry, "tag": tag},
        "dnsRewriter": {"enabled": false},
        "caSyncer": {"enabled": true, "replicas": 1, "config": {"bundles": [{
            "name": "pull-test",
            // Everything in its own namespace: the release's Roles are named per agent, so a second release may
            // not hold Roles in the first one's namespaces.
            "sources": [{"secret": {"namespace": PULL_NAMESPACE, "name": "pull-source", "key": "ca.crt"}}],
            "targets": [{"secret": {"namespace": PULL_NAMESPACE, "name": "kcp-ca", "key": "ca.crt"}}],
        }]}},
    })
}

/// `helm <verb>` of the second release, without waiting (its pod never becomes Ready).
fn pull_release(node: &Node, verb: &str, values: &Value) -> Result<()> {
    let home = tempfile::tempdir()?;
    let file = home.path().join("values.yaml");
    std::fs::write(&file, serde_yaml::to_string(values)?)?;
    let chart = chart::chart_dir();
    let kubeconfig = node.kubeconfig.display().to_string();
    let args = [
        verb,
        PULL_RELEASE,
        chart.to_str().context("chart path")?,
        "--namespace",
        PULL_NAMESPACE,
        "--kubeconfig",
        &kubeconfig,
        "--values",
        file.to_str().context("values path")?,
    ];
    let out = run(helm(&args, home.path())?)?;
    ensure!(out.success, "helm {verb}: {}", out.stderr);
    Ok(())
}

/// The waiting reason and message of the release's ca-syncer container running `image`, once it is one of
/// `reasons`.
async fn waiting(client: &kube::Client, image: &str, reasons: &[&str]) -> Result<(String, String)> {
    let pods = Api::<Pod>::namespaced(client.clone(), PULL_NAMESPACE);
    let selector = ListParams::default().labels(&format!("app.kubernetes.io/instance={PULL_RELEASE}"));
    let what = format!("a pod of {PULL_RELEASE} running {image} waiting with {reasons:?}");
    testbed::eventually_seen(Duration::from_secs(120), &what, || async {
        let list = pods.list(&selector).await?;
        let mut seen = Vec::new();
        for pod in list.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let spec_image = pod.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.clone());
            if spec_image.as_deref() != Some(image) {
                continue;
            }
            let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default();
            for w in statuses.into_iter().filter_map(|c| c.state.and_then(|s| s.waiting)) {
                let reason = w.reason.unwrap_or_default();
                if reasons.contains(&reason.as_str()) {
                    return Ok(Ok((reason, w.message.unwrap_or_default())));
                }
                seen.push(reason);
            }
        }
        Ok(Err(format!("waiting reasons {seen:?}")))
    })
    .await
}

/// The doctor's `agent-pods` verdicts for the second release, from the host through the node's apiserver.
async fn agent_pods_verdicts(client: &kube::Client) -> Vec<(Level, String)> {
    let options = Options {
        release_namespace: Some(PULL_NAMESPACE.into()),
        release: PULL_RELEASE.into(),
        verify: false,
        ..Options::default()
    };
    let report = kcp_keeper_doctor::run(client, &options).await;
    report.of("agent-pods").into_iter().map(|v| (v.result, format!("{} {}", v.subject, v.saw))).collect()
}

#[tokio::test]
async fn a_missing_tag_and_a_registry_that_is_down_show_as_errimagepull_and_the_doctor_names_pod_image_and_cause()
-> Result<()> {
    installed();
    let node = node::shared();
    let client = node.client().await?;
    let version = version()?;
    let namespaces = Api::<Namespace>::all(client.clone());
    let _ = namespaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": PULL_NAMESPACE}}))?)
        .await;

    // A tag the registry does not have.
    let missing = format!("{}/ca-syncer:0.0.0-never-published", peers::registry::PUBLIC);
    pull_release(node, "install", &pull_values(peers::registry::PUBLIC, "0.0.0-never-published"))?;
    let (reason, message) = waiting(&client, &missing, &["ErrImagePull", "ImagePullBackOff"]).await?;
    eprintln!("missing tag: {reason}: {message}");
    let verdicts = agent_pods_verdicts(&client).await;
    let failing: Vec<&(Level, String)> = verdicts.iter().filter(|(l, _)| *l == Level::Fail).collect();
    ensure!(failing.len() == 1, "agent-pods for a missing tag: {verdicts:#?}");
    let said = &failing[0].1;
    for part in ["ca-syncer", &missing, "not found"] {
        ensure!(said.contains(part), "the doctor's line lacks {part:?}: {said}");
    }
    ensure!(said.contains("ErrImagePull") || said.contains("ImagePullBackOff"), "{said}");

    // The registry is down: the right tag, from an address where nothing listens.
    let unreachable = format!("{DOWN_REGISTRY}/ca-syncer:{version}");
    pull_release(node, "upgrade", &pull_values(DOWN_REGISTRY, &version))?;
    let (reason, message) = waiting(&client, &unreachable, &["ErrImagePull", "ImagePullBackOff"]).await?;
    eprintln!("registry down: {reason}: {message}");
    testbed::eventually_seen(Duration::from_secs(60), "the doctor naming the unreachable registry", || async {
        let verdicts = agent_pods_verdicts(&client).await;
        let named = verdicts
            .iter()
            .any(|(l, s)| *l == Level::Fail && s.contains(&unreachable) && s.contains("connection refused"));
        Ok(if named { Ok(()) } else { Err(format!("{verdicts:?}")) })
    })
    .await?;

    let home = tempfile::tempdir()?;
    let kubeconfig = node.kubeconfig.display().to_string();
    let out = run(helm(
        &["uninstall", PULL_RELEASE, "--namespace", PULL_NAMESPACE, "--kubeconfig", &kubeconfig],
        home.path(),
    )?)?;
    ensure!(out.success, "helm uninstall: {}", out.stderr);
    Ok(())
}
