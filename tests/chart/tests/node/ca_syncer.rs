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

/// The consumer of the sidecar test: a static program that counts the SIGHUPs it gets, printing `reload <n>` for
/// each (`sigwait`, so no signal is lost to a handler race), and exits on SIGTERM. Its comm is `ca-consumer`.
const CONSUMER_C: &str = r#"#include <signal.h>
#include <stdio.h>
int main(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    printf("ready\n");
    fflush(stdout);
    for (unsigned long reloads = 0;;) {
        int sig;
        if (sigwait(&set, &sig) != 0) return 1;
        if (sig == SIGTERM) return 0;
        printf("reload %lu\n", ++reloads);
        fflush(stdout);
    }
}
"#;
const CONSUMER_IMAGE: &str = "kcp-keeper.test/ca-consumer:1";
const SIDECAR_POD: &str = "ca-sidecar-consumer";
/// The sidecar's admin port (its metrics, read through the apiserver's pod proxy).
const SIDECAR_ADMIN: u16 = 9091;

/// The consumer's image: [`CONSUMER_C`] compiled static here, alone in an image (no registry, no shell).
fn consumer_image(node: &Node) -> Result<std::path::PathBuf> {
    let dir = node.dir.join("ca-consumer");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("consumer.c"), CONSUMER_C)?;
    let binary = dir.join("ca-consumer");
    let out = std::process::Command::new("cc")
        .args(["-static", "-Os", "-o"])
        .arg(&binary)
        .arg(dir.join("consumer.c"))
        .output()
        .context("starting cc")?;
    ensure!(out.status.success(), "cc: {}", String::from_utf8_lossy(&out.stderr));
    node::image::single_binary_image(&dir, CONSUMER_IMAGE, &binary, "ca-consumer", "65532:65532")
}

/// Reloads the consumer counted (its `reload <n>` lines).
fn consumer_reloads(node: &Node) -> Result<usize> {
    let out = node.kubectl(&["logs", "-n", "railgrid-system", SIDECAR_POD, "-c", "consumer"])?;
    ensure!(out.status.success(), "consumer logs: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("reload ")).count())
}

/// A sidecar metric (unlabelled) from its admin port, through the apiserver's pod proxy.
fn sidecar_metric(node: &Node, name: &str) -> Result<Option<f64>> {
    let path = format!("/api/v1/namespaces/railgrid-system/pods/{SIDECAR_POD}:{SIDECAR_ADMIN}/proxy/metrics");
    let out = node.kubectl(&["get", "--raw", &path])?;
    ensure!(out.status.success(), "sidecar metrics: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok()))
}

/// A new CA in the source Secret (as a re-issued root would be): its PEM, trimmed.
async fn change_source_ca(client: &kube::Client, name: &str) -> Result<String> {
    let ca = testbed::certs::Ca::new(name, Duration::from_secs(365 * 24 * 3600))?.cert_pem();
    let patch = json!({"stringData": {"ca.crt": ca}});
    Api::<Secret>::namespaced(client.clone(), "kcp-system")
        .patch("root-server-ca", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(ca.trim().to_string())
}

/// `ca-syncer watch` as the sidecar of a consumer pod in a namespace enforcing the `restricted` standard, with
/// `shareProcessNamespace: true`, both containers as the same non-root user (a process may signal only processes
/// of its own user once every capability is dropped). It watches the mounted target Secret ca-syncer writes and
/// signals the consumer by name. A real CA change at the source travels ca-syncer, the kubelet's projection and
/// the sidecar into the shared bundle file, and the consumer counts exactly one reload for it; two changes, two
/// reloads; a rewrite of the Secret that leaves its CA alone (another key added, projected by the kubelet and read
/// by the sidecar) none.
#[tokio::test]
async fn ca_syncer_watch_as_a_sidecar_signals_the_consumer_once_per_real_ca_change_and_never_for_a_no_op_rewrite()
-> Result<()> {
    installed();
    // It changes the source CA, which the other ca-syncer tests wait on.
    let _exclusive = RELEASE.write().await;
    let node = node::shared();
    let client = node.client().await?;
    node.import_image(&consumer_image(node)?)?;
    let out = node.kubectl(&[
        "label",
        "namespace",
        "railgrid-system",
        "pod-security.kubernetes.io/enforce=restricted",
        "--overwrite",
    ])?;
    ensure!(out.status.success(), "labelling railgrid-system: {}", String::from_utf8_lossy(&out.stderr));
    let restricted =
        json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}});
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": SIDECAR_POD},
        "spec": {
            "shareProcessNamespace": true,
            "terminationGracePeriodSeconds": 5,
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "consumer",
                    "image": CONSUMER_IMAGE,
                    "imagePullPolicy": "Never",
                    "securityContext": restricted,
                    "volumeMounts": [{"name": "shared", "mountPath": "/shared", "readOnly": true}],
                },
                {
                    "name": "ca-sidecar",
                    "image": format!("ghcr.io/kcp-keeper/ca-syncer:{}", version()?),
                    "imagePullPolicy": "Never",
                    "args": [
                        "watch", "--dir", "/etc/kcp-ca", "--key", "ca.crt", "--output", "/shared/ca-bundle.crt",
                        "--signal-process", "ca-consumer", "--poll-interval", "2s",
                        "--admin-addr", format!("0.0.0.0:{SIDECAR_ADMIN}"),
                    ],
                    "securityContext": restricted,
                    "volumeMounts": [
                        {"name": "ca", "mountPath": "/etc/kcp-ca", "readOnly": true},
                        {"name": "shared", "mountPath": "/shared"},
                    ],
                },
            ],
            "volumes": [
                {"name": "ca", "secret": {"secretName": "kcp-ca"}},
                {"name": "shared", "emptyDir": {"sizeLimit": "1Mi"}},
            ],
        },
    }))?;
    let pods = Api::<Pod>::namespaced(client.clone(), "railgrid-system");
    let _ = pods.delete(SIDECAR_POD, &Default::default()).await;
    testbed::eventually(Duration::from_secs(60), "no sidecar pod left from an earlier run", || async {
        pods.get_opt(SIDECAR_POD).await.ok().and_then(|p| p.is_none().then_some(()))
    })
    .await;
    pods.create(&PostParams::default(), &pod).await?;
    let uid = testbed::eventually(Duration::from_secs(120), "both containers of the sidecar pod running", || async {
        let pod = pods.get(SIDECAR_POD).await.ok()?;
        let status = pod.status?;
        let running =
            status.container_statuses?.iter().filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some())).count();
        (running == 2).then_some(pod.metadata.uid?)
    })
    .await;
    let bundle = node.kubelet_root().join(format!("pods/{uid}/volumes/kubernetes.io~empty-dir/shared/ca-bundle.crt"));
    let current = target_bundle(&client).await.context("no target bundle")?;
    let first = current.split("-----END CERTIFICATE-----").next().unwrap_or_default().trim().to_string();
    testbed::eventually(Duration::from_secs(60), "the sidecar's first bundle", || async {
        std::fs::read_to_string(&bundle).ok().filter(|b| b.contains(&first))
    })
    .await;
    ensure!(consumer_reloads(node)? == 0, "the consumer was signalled at the sidecar's start");

    let mut changed = Vec::new();
    for (n, name) in [(1, "kcp-root-ca-sidecar-1"), (2, "kcp-root-ca-sidecar-2")] {
        if n == 2 {
            // The no-op: the Secret rewritten with another key; the kubelet projects it, the sidecar reads it
            // (a full sync after the file appeared), and its ca.crt is what it was.
            let patch = json!({"stringData": {"unrelated.txt": "not a certificate"}});
            Api::<Secret>::namespaced(client.clone(), "railgrid-system")
                .patch("kcp-ca", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let marker = node.kubelet_root().join(format!("pods/{uid}/volumes/kubernetes.io~secret/ca/unrelated.txt"));
            testbed::eventually(Duration::from_secs(180), "the rewrite in the pod's volume", || async {
                node.read_inside(&marker).ok()
            })
            .await;
            let seen = sidecar_metric(node, "ca_syncer_sidecar_last_sync_timestamp_seconds")?.unwrap_or(0.0);
            testbed::eventually(Duration::from_secs(60), "a sidecar sync after the rewrite", || async {
                let last = sidecar_metric(node, "ca_syncer_sidecar_last_sync_timestamp_seconds").ok()??;
                (last > seen + 1.0).then_some(())
            })
            .await;
            ensure!(consumer_reloads(node)? == 1, "the consumer was signalled for a rewrite that left its CA");
        }
        let ca = change_source_ca(&client, name).await?;
        let started = Instant::now();
        testbed::eventually(Duration::from_secs(240), "the new CA in the sidecar's bundle", || async {
            std::fs::read_to_string(&bundle).ok().filter(|b| b.contains(&ca))
        })
        .await;
        testbed::eventually(Duration::from_secs(30), "the consumer's reload", || async {
            (consumer_reloads(node).ok()? >= n).then_some(())
        })
        .await;
        changed.push(started.elapsed());
        ensure!(consumer_reloads(node)? == n, "{} reloads after {n} change(s)", consumer_reloads(node)?);
    }
    // One more full sync after the last change: still one reload per change.
    let seen = sidecar_metric(node, "ca_syncer_sidecar_last_sync_timestamp_seconds")?.unwrap_or(0.0);
    testbed::eventually(Duration::from_secs(60), "a sidecar sync after the last change", || async {
        let last = sidecar_metric(node, "ca_syncer_sidecar_last_sync_timestamp_seconds").ok()??;
        (last > seen + 1.0).then_some(())
    })
    .await;
    ensure!(consumer_reloads(node)? == 2, "{} reloads for two changes", consumer_reloads(node)?);
    let delivered = sidecar_metric(node, "ca_syncer_sidecar_reloads_total")?;
    ensure!(delivered == Some(2.0), "the sidecar counts {delivered:?} notifications delivered");
    eprintln!("two CA changes reached the consumer's bundle and one reload each in {changed:.1?}; the rewrite none");

    let patch = json!([{"op": "remove", "path": "/data/unrelated.txt"}]);
    Api::<Secret>::namespaced(client.clone(), "railgrid-system")
        .patch("kcp-ca", &PatchParams::default(), &Patch::<()>::Json(serde_json::from_value(patch)?))
        .await?;
    pods.delete(SIDECAR_POD, &Default::default()).await?;
    Ok(())
}
