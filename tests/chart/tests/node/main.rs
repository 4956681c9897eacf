//! The chart on a real node (`testbed::node`): `helm install --wait` of all four agents in a namespace that
//! enforces the `restricted` Pod Security Standard, every pod Ready from the shipped image (pulled by the node's
//! containerd from the bed's registry, under the chart's default references), the peers the agents talk to (etcd, S3) inside the node behind Services that
//! pods reach by their DNS names. Then each agent does its job in its pod, proven from outside: ca-syncer into a
//! consumer pod's projected file, dns-rewriter through CoreDNS running as a pod, etcd-snapshotter's snapshot and
//! a restore drill inside its pod, kubeconfig-rotator's renewal rolling its consumer. One node and one install
//! per test binary; the tests run side by side on it.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use chart::on_node::{
    self, AGENTS, Installed, agent_pods, create, exec_in_agent, pod_metric, restricted_pause_spec, settled_hub, version,
};
use chart::{NAMESPACE, helm, run};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Pod, Secret, Service};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testbed::node::{self, Node};

use chart::dns_on_node::{
    NODE_LOCAL, dns_check_account, dns_check_pod, import_node_cache_image, lookup_from_a_pod, node_local_daemonset,
};

// Each agent's further node tests live in a module of their own (same node, same install, same binary).
mod ca_syncer;
mod dns_rewriter;
mod etcd_snapshotter;
mod image_pulls;
mod network_policy;

/// The chart installed once per binary, on the shared node (`chart::on_node`: the same set-up as
/// `cargo xtask demo --cluster`). The peers live on the thread that seeds them.
static INSTALLED: std::sync::OnceLock<Result<Installed, String>> = std::sync::OnceLock::new();

fn installed() -> &'static Installed {
    testbed::shared_for_binary(&INSTALLED, "chart install", || on_node::install(node::shared()))
}

/// The install's values, as each test starts from them before changing one agent's.
fn values(_node: &Node) -> Result<Value> {
    Ok(on_node::values())
}

#[tokio::test]
async fn helm_install_wait_pulls_every_agents_image_from_the_registry_and_runs_it_in_a_restricted_namespace()
-> Result<()> {
    let installed = installed();
    let _shared = RELEASE.read().await;
    let node = node::shared();
    let client = node.client().await?;
    let version = version()?;
    eprintln!("(helm install --wait took {:.1?})", installed.took);
    // Every Deployment's pods are Ready, each running the shipped image.
    let deployments = Api::<Deployment>::namespaced(client.clone(), NAMESPACE).list(&ListParams::default()).await?;
    ensure!(deployments.items.len() == 4, "{} Deployments", deployments.items.len());
    for d in &deployments.items {
        let status = d.status.clone().unwrap_or_default();
        let wanted = d.spec.replicas.unwrap_or(1);
        ensure!(status.ready_replicas == Some(wanted), "{:?}: {status:?}", d.metadata.name);
    }
    // The agents' pods (other tests add pods of their own to the namespace), less any on its way out: a test
    // that rolled or deleted one ends once its replacement is Ready, and the old one may still be draining.
    let agents = ListParams::default().labels("app.kubernetes.io/part-of=kcp-keeper");
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE).list(&agents).await?;
    let pods: Vec<&Pod> = pods.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
    ensure!(pods.len() >= 4, "{} pods", pods.len());
    for pod in pods {
        let status = pod.status.clone().unwrap_or_default();
        for c in status.container_statuses.unwrap_or_default() {
            ensure!(c.ready, "{:?} container {} not ready", pod.metadata.name, c.name);
            ensure!(c.image.starts_with("ghcr.io/kcp-keeper/"), "{} runs {}", c.name, c.image);
            ensure!(c.image.ends_with(&format!(":{version}")), "{} runs {}", c.name, c.image);
        }
    }
    // Every agent's image was pulled (kubelet says so, and the registry was asked for each: `on_node::install`).
    let events = Api::<Event>::namespaced(client.clone(), NAMESPACE).list(&ListParams::default()).await?;
    for agent in AGENTS {
        let image = format!("{}/{agent}:{version}", peers::registry::PUBLIC);
        let pulled = events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Pulled") && e.message.as_deref().is_some_and(|m| m.contains(&image)));
        ensure!(pulled, "no Pulled event for {image}");
    }
    on_node::pulled_from_the_registry(node, &AGENTS, &version)?;
    Ok(())
}

/// Secret `railgrid-system/kcp-ca`'s `ca.crt`.
async fn target_bundle(client: &kube::Client) -> Option<String> {
    let secret = Api::<Secret>::namespaced(client.clone(), "railgrid-system").get_opt("kcp-ca").await.ok()??;
    let bytes = secret.data?.get("ca.crt")?.0.clone();
    String::from_utf8(bytes).ok()
}

/// ca-syncer, in its pod, copied the source CA into the target Secret in another namespace; a consumer pod mounts
/// that Secret; after the source CA changes, the target follows and the file the kubelet projected into the
/// consumer's volume holds the new CA.
#[tokio::test]
async fn ca_syncer_in_its_pod_carries_a_source_ca_change_to_a_target_secret_and_a_consumer_pods_mounted_file()
-> Result<()> {
    installed();
    let _shared = RELEASE.read().await;
    let node = node::shared();
    let client = node.client().await?;
    // The source as it is now (the handover test, if it ran first, changed it).
    let source = Api::<Secret>::namespaced(client.clone(), "kcp-system").get("root-server-ca").await?;
    let before = source.data.context("no data")?.get("ca.crt").context("no ca.crt")?.0.clone();
    let before = String::from_utf8(before)?.trim().to_string();
    let started = Instant::now();
    testbed::eventually(Duration::from_secs(60), "ca-syncer to write the target Secret", || async {
        target_bundle(&client).await.filter(|b| b.contains(&before))
    })
    .await;
    eprintln!("ca-syncer (in its pod) wrote railgrid-system/kcp-ca after {:.1?}", started.elapsed());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "consumer"},
        "spec": restricted_pause_spec(
            json!([{"name": "ca", "secret": {"secretName": "kcp-ca"}}]),
            json!([{"name": "ca", "mountPath": "/etc/kcp-ca", "readOnly": true}]),
        ),
    }))?;
    let pods = Api::<Pod>::namespaced(client.clone(), "railgrid-system");
    pods.create(&PostParams::default(), &pod).await?;
    let uid = testbed::eventually(Duration::from_secs(120), "the consumer pod Running", || async {
        let pod = pods.get("consumer").await.ok()?;
        (pod.status?.phase.as_deref() == Some("Running")).then_some(pod.metadata.uid?)
    })
    .await;
    let file = node.kubelet_root().join(format!("pods/{uid}/volumes/kubernetes.io~secret/ca/ca.crt"));
    let mounted = node.read_inside(&file)?;
    ensure!(mounted.contains(&before), "the consumer's mounted ca.crt lacks the source CA:\n{mounted}");

    // The source CA changes (a new CA, as a re-issued root would be).
    let after = testbed::certs::Ca::new("kcp-root-ca-2", Duration::from_secs(365 * 24 * 3600))?.cert_pem();
    let patch = json!({"stringData": {"ca.crt": after}});
    Api::<Secret>::namespaced(client.clone(), "kcp-system")
        .patch("root-server-ca", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let changed = Instant::now();
    let after = after.trim().to_string();
    testbed::eventually(Duration::from_secs(60), "the new CA in the target Secret", || async {
        target_bundle(&client).await.filter(|b| b.contains(&after))
    })
    .await;
    let in_secret = changed.elapsed();
    testbed::eventually(Duration::from_secs(180), "the new CA in the consumer's mounted file", || async {
        node.read_inside(&file).ok().filter(|m| m.contains(&after))
    })
    .await;
    eprintln!(
        "a source CA change reached the target Secret in {in_secret:.1?} and the consumer pod's mounted file in {:.1?}",
        changed.elapsed()
    );
    Ok(())
}

/// dns-rewriter, in its pod, wrote its rule into k3s's `coredns-custom`; CoreDNS, running as the cluster runs it
/// (a pod with the ConfigMap projected by the kubelet), loads it; a lookup of the public kcp name from inside a
/// pod (the shipped `dns-rewriter check`, asking the CoreDNS Service) answers the Service's ClusterIP.
#[tokio::test]
async fn dns_rewriter_in_its_pod_writes_a_rule_coredns_in_a_pod_loads_so_a_public_kcp_name_answers_the_cluster_ip()
-> Result<()> {
    installed();
    let _shared = RELEASE.read().await;
    let node = node::shared();
    let client = node.client().await?;
    let started = Instant::now();
    let config_maps = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "kube-system");
    let snippet = testbed::eventually(Duration::from_secs(60), "dns-rewriter to write coredns-custom", || async {
        let cm = config_maps.get_opt("coredns-custom").await.ok()??;
        cm.data?.get("kcp-split-horizon.override").filter(|s| s.contains("kcp-root.example.com")).cloned()
    })
    .await;
    ensure!(
        snippet.contains("rewrite name exact kcp-root.example.com. root-kcp.kcp-system.svc.cluster.local."),
        "{snippet}"
    );
    eprintln!("dns-rewriter (in its pod) wrote coredns-custom after {:.1?}", started.elapsed());
    let cluster_ip = Api::<Service>::namespaced(client.clone(), "kcp-system")
        .get("root-kcp")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("root-kcp has no ClusterIP")?;
    let answered = lookup_from_a_pod(node, &client).await?;
    let line = answered
        .lines()
        .find(|l| l.starts_with("kcp-root.example.com "))
        .with_context(|| format!("no line for the name:\n{answered}"))?;
    let columns: Vec<&str> = line.split_whitespace().collect();
    ensure!(columns.get(1) == Some(&cluster_ip.as_str()), "expected {cluster_ip}:\n{answered}");
    ensure!(columns.get(2) == Some(&cluster_ip.as_str()), "answered other than {cluster_ip}:\n{answered}");
    eprintln!("{answered}");
    Ok(())
}

/// etcd-snapshotter, in its pod, snapshots on its schedule the etcd it reaches by its Service's DNS name into
/// the S3 it reaches by another Service's DNS name; a restore drill run inside the same pod (the image's etcd
/// and etcdutl, its spill volume, the age identity from its Secret) passes and is recorded beside the snapshot.
#[tokio::test]
async fn etcd_snapshotter_in_its_pod_snapshots_an_etcd_service_to_an_s3_service_and_a_restore_drill_passes_inside_it()
-> Result<()> {
    installed();
    let _shared = RELEASE.read().await;
    let node = node::shared();
    let started = Instant::now();
    let listed = testbed::eventually(Duration::from_secs(180), "a scheduled snapshot of shard root", || async {
        exec_in_agent(node, "etcd-snapshotter", &["/etcd-snapshotter", "list", "--shard", "root"])
            .ok()
            .filter(|out| out.lines().any(|l| l.starts_with("root/")))
    })
    .await;
    eprintln!("the agent's scheduled snapshot was listed from its pod after {:.1?}:\n{listed}", started.elapsed());
    let id = listed
        .lines()
        .find(|l| l.starts_with("root/"))
        .and_then(|l| l.split_whitespace().next())
        .context("no id")?
        .to_string();
    // The object is in the bucket S3 serves (versitygw's posix backend, on the node's disk).
    let bucket = node.dir.join("peers/s3/kcp-backups/kcp/etcd");
    ensure!(bucket.is_dir(), "nothing under {}", bucket.display());

    let drilled = exec_in_agent(node, "etcd-snapshotter", &["/etcd-snapshotter", "drill", &id])?;
    eprintln!("drill in the pod:\n{drilled}");
    let after = exec_in_agent(node, "etcd-snapshotter", &["/etcd-snapshotter", "list", "--shard", "root"])?;
    let row = after
        .lines()
        .find(|l| l.starts_with(&format!("{id} ")))
        .with_context(|| format!("{id} is gone from the list:\n{after}"))?;
    let verified = row.split_whitespace().last().unwrap_or_default();
    ensure!(verified != "no" && !row.contains("no ("), "the drill's report does not prove {id}:\n{after}");
    Ok(())
}

/// The client certificate a kubeconfig carries (its only user's `client-certificate-data`, decoded).
fn client_certificate(kubeconfig: &str) -> Result<String> {
    let doc: Value = serde_yaml::from_str(kubeconfig)?;
    let data = doc["users"][0]["user"]["client-certificate-data"].as_str().context("no client-certificate-data")?;
    // ByteString reads base64, as the API's `data` fields are.
    let pem: k8s_openapi::ByteString = serde_json::from_value(json!(data))?;
    Ok(String::from_utf8(pem.0)?.trim().to_string())
}

async fn target_kubeconfig(client: &kube::Client) -> Option<String> {
    let secret = Api::<Secret>::namespaced(client.clone(), "railgrid-system").get_opt("railgrid-kcp").await.ok()??;
    String::from_utf8(secret.data?.get("admin.kubeconfig")?.0.clone()).ok()
}

/// kubeconfig-rotator, in its pod: a renewed client certificate in the source is proven (a SelfSubjectReview
/// from the pod to the apiserver's in-cluster name), published to the target in another namespace, and the
/// consumer Deployment rolls: a new pod replaces the old one.
#[tokio::test]
async fn kubeconfig_rotator_in_its_pod_publishes_a_renewed_certificate_and_the_consumer_deployment_rolls() -> Result<()>
{
    installed();
    let _shared = RELEASE.read().await;
    let node = node::shared();
    let client = node.client().await?;
    let sources = Api::<Secret>::namespaced(client.clone(), "kcp-system");
    let source = sources.get("hub-admin-kubeconfig").await?;
    let first = String::from_utf8(source.data.context("no data")?.get("kubeconfig").context("no key")?.0.clone())?;
    let first = client_certificate(&first)?;
    testbed::eventually(Duration::from_secs(90), "the first certificate in the target", || async {
        let published = target_kubeconfig(&client).await?;
        (client_certificate(&published).ok()? == first).then_some(())
    })
    .await;
    let (hash_before, pod_before) =
        testbed::eventually(Duration::from_secs(120), "the hub restarted for the first content, settled", || {
            settled_hub(&client)
        })
        .await;

    // The renewal, as the operator re-renders it: a new certificate (and key) for the same identity.
    let renewed = node.in_cluster_kubeconfig("hub-admin", &["hub-admins"], Duration::from_secs(2 * 365 * 24 * 3600))?;
    let second = client_certificate(&renewed)?;
    ensure!(second != first);
    let patch = json!({"stringData": {"kubeconfig": renewed}});
    sources.patch("hub-admin-kubeconfig", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let renewed_at = Instant::now();
    testbed::eventually(Duration::from_secs(120), "the renewed certificate in the target", || async {
        let published = target_kubeconfig(&client).await?;
        (client_certificate(&published).ok()? == second).then_some(())
    })
    .await;
    let published = renewed_at.elapsed();
    let (hash_after, pod_after) = testbed::eventually(Duration::from_secs(180), "the hub rolled", || async {
        settled_hub(&client).await.filter(|(hash, _)| hash != &hash_before)
    })
    .await;
    ensure!(pod_after != pod_before, "the hub's pod is still {pod_before} (annotation {hash_after})");
    eprintln!(
        "a renewed certificate was published in {published:.1?}; the hub rolled to a new pod in {:.1?}",
        renewed_at.elapsed()
    );
    Ok(())
}

/// The lifecycle tests change what the job tests rely on (the release's values, the agents' pods): they take
/// this for writing, the job tests for reading, so neither sees the other's changes half done.
static RELEASE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// `helm upgrade --wait` of the release with `values`.
fn helm_upgrade(node: &Node, values: &Value) -> Result<()> {
    let out = on_node::helm_release(node, "upgrade", values, "3m")?;
    ensure!(out.success, "helm upgrade failed: {}", out.stderr);
    Ok(())
}

/// `kcp-split-horizon.override` of k3s's `coredns-custom`, as dns-rewriter wrote it.
async fn dns_snippet(client: &kube::Client) -> Option<String> {
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "kube-system")
        .get_opt("coredns-custom")
        .await
        .ok()??;
    cm.data?.get("kcp-split-horizon.override").cloned()
}

/// `helm upgrade` adding a rule to dns-rewriter's configuration: the kubelet projects the new ConfigMap, the
/// agent reloads it and writes the new rule, its pods neither restarted nor replaced. Then an upgrade with a
/// configuration the agent refuses (a resync below its minimum; the chart's schema admits it): the pods stay
/// Ready on the last valid one (the rule stays written) and say so in their log.
#[tokio::test]
async fn helm_upgrade_of_one_agents_configuration_is_picked_up_without_a_restart_and_an_invalid_one_is_refused_while_ready()
-> Result<()> {
    installed();
    let _exclusive = RELEASE.write().await;
    let node = node::shared();
    let client = node.client().await?;
    let before = agent_pods(&client, "dns-rewriter").await?;
    ensure!(before.len() == 2 && before.iter().all(|p| p.3), "{before:?}");

    let mut values = values(node)?;
    values["dnsRewriter"]["config"]["rules"]
        .as_array_mut()
        .context("rules")?
        .push(json!({"host": "kcp-api.example.com", "service": {"namespace": "kcp-system", "name": "root-kcp"}}));
    let started = Instant::now();
    helm_upgrade(node, &values)?;
    let snippet = testbed::eventually(Duration::from_secs(120), "the new rule written", || async {
        dns_snippet(&client).await.filter(|s| s.contains("kcp-api.example.com."))
    })
    .await;
    ensure!(snippet.contains("kcp-root.example.com."), "the first rule went:\n{snippet}");
    eprintln!("a helm upgrade's new rule was written after {:.1?}", started.elapsed());
    let after = agent_pods(&client, "dns-rewriter").await?;
    ensure!(after == before, "dns-rewriter's pods changed: {before:?} -> {after:?}");

    values["dnsRewriter"]["config"]["resyncInterval"] = json!("1s");
    helm_upgrade(node, &values)?;
    for (pod, ..) in &before {
        testbed::eventually(Duration::from_secs(120), "the invalid configuration rejected", || async {
            let out = node.kubectl(&["logs", "-n", NAMESPACE, pod]).ok()?;
            let logs = String::from_utf8_lossy(&out.stdout);
            logs.lines()
                .any(|l| {
                    l.contains("keeping the last good content") && l.contains("resyncInterval: must be at least 10s")
                })
                .then_some(())
        })
        .await;
        // What `KcpKeeperConfigRejected` reads, from this pod's own /metrics.
        testbed::eventually(Duration::from_secs(60), "dns_rewriter_config_rejected 1", || async {
            let (_, value) = pod_metric(node, pod, "dns_rewriter_config_rejected", "").ok()??;
            (value == 1.0).then_some(())
        })
        .await;
    }
    let refused = agent_pods(&client, "dns-rewriter").await?;
    ensure!(refused == before, "dns-rewriter's pods changed on a refused configuration: {before:?} -> {refused:?}");
    let snippet = dns_snippet(&client).await.context("coredns-custom went")?;
    ensure!(snippet.contains("kcp-api.example.com."), "the last valid rules went:\n{snippet}");

    // Back to the values the other tests expect: the alert's metric clears.
    helm_upgrade(node, &self::values(node)?)?;
    for (pod, ..) in &before {
        testbed::eventually(Duration::from_secs(120), "dns_rewriter_config_rejected back to 0", || async {
            let (_, value) = pod_metric(node, pod, "dns_rewriter_config_rejected", "").ok()??;
            (value == 0.0).then_some(())
        })
        .await;
    }
    Ok(())
}

/// The holder of an agent's Lease.
async fn lease_holder(client: &kube::Client, name: &str) -> Option<String> {
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), NAMESPACE)
        .get_opt(name)
        .await
        .ok()??;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

/// ca-syncer's Lease.
const CA_SYNCER_LEASE: &str = "kcp-keeper-ca-syncer";

/// `kubectl delete pod` of ca-syncer's leader (the default grace: SIGTERM): the leaving leader releases its Lease
/// (a write naming no holder, seen on a watch of the Lease), so another replica takes it at its next attempt
/// rather than after the lease expired, and that replica does the work: a source CA change reaches the target.
///
/// Which replica takes it is left open on purpose: the Deployment creates the deleted pod's replacement at once,
/// and a released Lease goes to whichever replica asks first, the follower (every retry period, 2 s) or the
/// replacement (at its start). Expecting the follower alone failed whenever the replacement asked first (CI, a
/// loaded machine: the replacement held the Lease, the follower stayed a follower).
#[tokio::test]
async fn deleting_the_leader_pod_releases_the_lease_and_another_replica_takes_it_and_the_work() -> Result<()> {
    installed();
    let _exclusive = RELEASE.write().await;
    let node = node::shared();
    let client = node.client().await?;
    // Right after the install the second replica may still be starting: wait until both are Ready and one leads.
    let (leader, pods) =
        testbed::eventually(Duration::from_secs(120), "two Ready ca-syncer pods, one holding the Lease", || async {
            let pods = agent_pods(&client, "ca-syncer").await.ok()?;
            let holder = lease_holder(&client, CA_SYNCER_LEASE).await?;
            (pods.len() == 2 && pods.iter().all(|p| p.3) && pods.iter().any(|p| p.0 == holder))
                .then_some((holder, pods))
        })
        .await;

    // Every write to the Lease from here on, in order: the leader's release, then the next holder's acquire.
    let released = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let taken = {
        let (leases, leader) = (Api::namespaced(client.clone(), NAMESPACE), leader.clone());
        let (released, watching) = (released.clone(), watching.clone());
        tokio::spawn(kube::runtime::wait::await_condition(
            leases,
            CA_SYNCER_LEASE,
            move |lease: Option<&k8s_openapi::api::coordination::v1::Lease>| {
                watching.store(true, std::sync::atomic::Ordering::SeqCst);
                let holder = lease.and_then(|l| l.spec.as_ref()?.holder_identity.clone()).filter(|h| !h.is_empty());
                match holder {
                    None => {
                        released.store(true, std::sync::atomic::Ordering::SeqCst);
                        false
                    }
                    Some(holder) => holder != leader,
                }
            },
        ))
    };
    testbed::eventually(Duration::from_secs(30), "the watch of the Lease to start", || async {
        watching.load(std::sync::atomic::Ordering::SeqCst).then_some(())
    })
    .await;
    ensure!(!released.load(std::sync::atomic::Ordering::SeqCst), "the Lease named no holder before the delete");

    let deleted = Instant::now();
    let out = node.kubectl(&["delete", "pod", "-n", NAMESPACE, &leader, "--wait=false"])?;
    ensure!(out.status.success(), "kubectl delete pod: {}", String::from_utf8_lossy(&out.stderr));
    let lease = tokio::time::timeout(Duration::from_secs(120), taken)
        .await
        .context("no other replica took the Lease within 120s of the leader's deletion")???
        .context("the Lease is gone")?;
    let holder = lease.spec.and_then(|s| s.holder_identity).context("no holder")?;
    ensure!(
        released.load(std::sync::atomic::Ordering::SeqCst),
        "{holder} took the Lease but the leaving leader {leader} never released it (taken over only once expired)"
    );
    let now = agent_pods(&client, "ca-syncer").await?;
    ensure!(now.iter().any(|p| p.0 == holder), "the Lease names {holder}, not one of ca-syncer's pods {now:?}");
    let which = if pods.iter().any(|p| p.0 == holder) { "the follower" } else { "the replacement" };
    eprintln!(
        "{leader} released the Lease; {which} {holder} took it {:.1?} after the leader's pod was deleted",
        deleted.elapsed()
    );

    let ca = testbed::certs::Ca::new("kcp-root-ca-after-handover", Duration::from_secs(365 * 24 * 3600))?.cert_pem();
    let patch = json!({"stringData": {"ca.crt": ca}});
    Api::<Secret>::namespaced(client.clone(), "kcp-system")
        .patch("root-server-ca", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let ca = ca.trim().to_string();
    testbed::eventually(Duration::from_secs(90), "the new leader to carry a CA change", || async {
        target_bundle(&client).await.filter(|b| b.contains(&ca))
    })
    .await;
    ensure!(
        lease_holder(&client, CA_SYNCER_LEASE).await.as_deref() == Some(holder.as_str()),
        "the Lease moved on from {holder} while the change was carried"
    );
    // The Deployment has replaced the deleted pod before the other tests run.
    testbed::eventually(Duration::from_secs(120), "ca-syncer back to two Ready pods", || async {
        let pods = agent_pods(&client, "ca-syncer").await.ok()?;
        (pods.len() == 2 && pods.iter().all(|p| p.3)).then_some(())
    })
    .await;
    Ok(())
}

/// An agent's PodDisruptionBudget as the chart rendered it: minAvailable, and the status's disruptionsAllowed
/// once the disruption controller has seen the current spec.
async fn pdb(client: &kube::Client, agent: &str) -> Result<(i32, Option<i32>)> {
    let pdb = Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(client.clone(), NAMESPACE)
        .get(&format!("kcp-keeper-{agent}"))
        .await
        .with_context(|| format!("{agent}'s PodDisruptionBudget"))?;
    let spec = pdb.spec.context("no spec")?;
    let selector = spec.selector.and_then(|s| s.match_labels).unwrap_or_default();
    ensure!(
        selector.get("app.kubernetes.io/name").map(String::as_str) == Some(agent),
        "{agent}'s PodDisruptionBudget selects {selector:?}"
    );
    let min = match spec.min_available.context("no minAvailable")? {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => n,
        other => bail!("minAvailable {other:?}: the test expects a number"),
    };
    let status = pdb.status.unwrap_or_default();
    let seen = status.observed_generation.is_some() && status.observed_generation == pdb.metadata.generation;
    Ok((min, seen.then_some(status.disruptions_allowed.unwrap_or(0))))
}

/// ca-syncer's Ready pods, none terminating.
async fn ready_ca_syncers(client: &kube::Client) -> Option<Vec<(String, String, i32, bool)>> {
    let pods = agent_pods(client, "ca-syncer").await.ok()?;
    Some(pods.into_iter().filter(|p| p.3).collect())
}

/// Every agent runs two replicas and has the chart's PodDisruptionBudget (minAvailable 1, selecting its pods).
/// `kubectl rollout restart` of ca-syncer replaces both pods without ever leaving fewer Ready than minAvailable
/// (sampled every 200 ms), and the leader's work goes on: a CA change made mid-rollout reaches the target.
#[tokio::test]
async fn a_rolling_restart_keeps_the_pdbs_minimum_ready_and_the_leaders_work_goes_on() -> Result<()> {
    installed();
    let _exclusive = RELEASE.write().await;
    let node = node::shared();
    let client = node.client().await?;
    for agent in AGENTS {
        let (min, _) = pdb(&client, agent).await?;
        ensure!(min == 1, "{agent}'s PodDisruptionBudget: minAvailable {min}");
    }
    let (min_available, _) = pdb(&client, "ca-syncer").await?;
    let before =
        testbed::eventually(Duration::from_secs(120), "two Ready ca-syncers, the budget's 1 allowed", || async {
            let ready = ready_ca_syncers(&client).await?;
            let allowed = pdb(&client, "ca-syncer").await.ok()?.1?;
            (ready.len() == 2 && allowed == 1).then_some(ready)
        })
        .await;
    let old: Vec<String> = before.iter().map(|p| p.1.clone()).collect();

    let out = node.kubectl(&["rollout", "restart", "-n", NAMESPACE, "deployment/kcp-keeper-ca-syncer"])?;
    ensure!(out.status.success(), "kubectl rollout restart: {}", String::from_utf8_lossy(&out.stderr));
    let ca = testbed::certs::Ca::new("kcp-root-ca-mid-rollout", Duration::from_secs(365 * 24 * 3600))?.cert_pem();
    let patch = json!({"stringData": {"ca.crt": ca}});
    Api::<Secret>::namespaced(client.clone(), "kcp-system")
        .patch("root-server-ca", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let ca = ca.trim().to_string();
    // Sampled while the rollout runs: the fewest Ready pods seen, and whether the change reached the target.
    let mut fewest = usize::MAX;
    let mut carried = false;
    let deployments = Api::<Deployment>::namespaced(client.clone(), NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let ready = ready_ca_syncers(&client).await.context("listing ca-syncer's pods")?;
        fewest = fewest.min(ready.len());
        carried = carried || target_bundle(&client).await.is_some_and(|b| b.contains(&ca));
        let deployment = deployments.get("kcp-keeper-ca-syncer").await?;
        let status = deployment.status.clone().unwrap_or_default();
        let rolled = status.observed_generation == deployment.metadata.generation
            && status.updated_replicas == Some(2)
            && status.ready_replicas == Some(2)
            && status.replicas == Some(2)
            && ready.len() == 2
            && ready.iter().all(|p| !old.contains(&p.1));
        if rolled && carried {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the rollout did not finish with the change carried within 180s (carried: {carried}, ready: {ready:?})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("rollout restart: both pods replaced, at least {fewest} Ready throughout; the CA change was carried");
    ensure!(
        fewest >= min_available as usize,
        "the rollout left {fewest} Ready pod(s), below the budget's minAvailable {min_available}"
    );

    testbed::eventually(Duration::from_secs(120), "the budget to allow one disruption again", || async {
        let ready = ready_ca_syncers(&client).await?;
        let allowed = pdb(&client, "ca-syncer").await.ok()?.1?;
        (ready.len() == 2 && allowed == 1).then_some(())
    })
    .await;
    Ok(())
}

/// Every agent's pods get a termination grace longer than the agent's drain after SIGTERM, in the runtime's own
/// numbers: the lease release (bounded by the renew deadline plus 1 s) for all, and before it, for
/// etcd-snapshotter, a snapshot in flight finishing (`Grace::finish`) or its upload being aborted
/// (`Grace::abort`). A shorter grace lets the kubelet's SIGKILL cut an abort short and leave half an upload.
#[tokio::test]
async fn each_agents_termination_grace_outlasts_its_drain_after_sigterm() -> Result<()> {
    installed();
    let _shared = RELEASE.read().await;
    let client = node::shared().client().await?;
    let release = kcp_keeper_runtime::lease::LeaseConfig::new("", "", "").renew_deadline + Duration::from_secs(1);
    let upload = kcp_keeper_runtime::shutdown::Grace::default();
    for agent in AGENTS {
        let deployment =
            Api::<Deployment>::namespaced(client.clone(), NAMESPACE).get(&format!("kcp-keeper-{agent}")).await?;
        let grace = deployment
            .spec
            .template
            .spec
            .and_then(|s| s.termination_grace_period_seconds)
            .context("no terminationGracePeriodSeconds")?;
        let drain = if agent == "etcd-snapshotter" { upload.finish + upload.abort + release } else { release };
        ensure!(
            Duration::from_secs(grace.try_into()?) > drain,
            "{agent}: terminationGracePeriodSeconds {grace} does not outlast its drain ({drain:?})"
        );
        eprintln!("{agent}: grace {grace}s, drain at most {drain:?}");
    }
    Ok(())
}
