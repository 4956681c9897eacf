//! The chart with all four agents against a real kube-apiserver (the test bed): the rendered output passes the apiserver's own
//! validation and admission (`kubectl apply --dry-run=server`), `helm install` creates it, and the RBAC it
//! installs holds for a token minted for the agent's ServiceAccount: the Secrets the configuration names can
//! be read, any other Secret is forbidden (403).
//!
//! There is no kubelet in the bed, so the Deployments' pods never run; the agents' behaviour under this RBAC
//! is proven by running their binaries with such a token (each agent's own RBAC test).

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use chart::{NAMESPACE, documents, helm, peer, run, template};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::{Value, json};

fn example(agent: &str) -> Value {
    let path = chart::repo_root().join(format!("agents/{agent}/example.yaml"));
    serde_yaml::from_str(&std::fs::read_to_string(path).expect("example.yaml")).expect("parses")
}

/// All four agents, with their example configurations (the snapshotter's S3 keys and age identity from Secrets it
/// names).
fn all_agents() -> Value {
    json!({
        "caSyncer": {"enabled": true, "config": example("ca-syncer")},
        "dnsRewriter": {"enabled": true, "config": example("dns-rewriter")},
        "kubeconfigRotator": {"enabled": true, "config": example("kubeconfig-rotator")},
        "etcdSnapshotter": {"enabled": true, "config": example("etcd-snapshotter"),
                            "s3Credentials": {"existingSecret": "etcd-backup-s3"},
                            "ageIdentity": {"existingSecret": "etcd-backup-age"}},
    })
}

/// `networkPolicy` values turning every agent's policy on, with a scraper, the apiserver's address, and a peer of
/// each kind for the agents that have peers.
fn network_policies() -> Value {
    json!({
        "enabled": true,
        "metrics": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In", "values": ["prometheus"]}]},
        },
        "apiServer": {"to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}]},
        "caSyncer": {"kcp": {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kcp-system"}}}]}},
        "kubeconfigRotator": {"kcp": {"to": [{"podSelector": {"matchLabels": {"app": "front-proxy"}}, "namespaceSelector": {}}], "ports": [8443]}},
        "etcdSnapshotter": {
            "etcd": {"to": [{"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.9.0/24"]}}]},
            "s3": {"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]},
        },
        "extraEgress": [{"to": [{"ipBlock": {"cidr": "198.51.100.7/32"}}], "ports": [{"port": 4317, "protocol": "TCP"}]}],
    })
}

/// `kind namespace/name` -> resourceVersion of every object of the release (all kinds the chart renders).
async fn versions(bed: &testbed::ControlPlane) -> Result<BTreeMap<String, String>> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    async fn of<K>(bed: &testbed::ControlPlane, out: &mut BTreeMap<String, String>) -> Result<()>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let params = kube::api::ListParams::default().labels("app.kubernetes.io/instance=kcp-keeper");
        for o in Api::<K>::all(bed.client()).list(&params).await?.items {
            let key = format!("{} {}/{}", K::kind(&()), o.namespace().unwrap_or_default(), o.name_any());
            out.insert(key, o.resource_version().unwrap_or_default());
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    of::<Deployment>(bed, &mut out).await?;
    of::<ConfigMap>(bed, &mut out).await?;
    of::<Service>(bed, &mut out).await?;
    of::<ServiceAccount>(bed, &mut out).await?;
    of::<PodDisruptionBudget>(bed, &mut out).await?;
    of::<Role>(bed, &mut out).await?;
    of::<RoleBinding>(bed, &mut out).await?;
    of::<ClusterRole>(bed, &mut out).await?;
    of::<ClusterRoleBinding>(bed, &mut out).await?;
    Ok(out)
}

/// The objects added, removed or changed between two [`versions`].
fn changed(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    let keys: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    keys.into_iter().filter(|k| before.get(*k) != after.get(*k)).cloned().collect()
}

/// The namespaces the example configurations name, plus the release namespace.
async fn namespaces(bed: &testbed::ControlPlane) -> Result<()> {
    for ns in [NAMESPACE, "kcp-system", "railgrid-system", "kubev-system"] {
        bed.create_namespace(ns).await.with_context(|| format!("namespace {ns}"))?;
    }
    Ok(())
}

fn kubeconfig(bed: &testbed::ControlPlane) -> String {
    bed.apiserver.admin_kubeconfig.to_string_lossy().into_owned()
}

/// Installs prometheus-operator's ServiceMonitor and PrometheusRule CRDs (from its module download) into the bed.
async fn monitoring_crds(bed: &testbed::ControlPlane) -> Result<()> {
    let dir = peers::locate_only(&["prometheus-operator-crds"])?;
    let crds = testbed::crds::read(dir.path("prometheus-operator-crds"))?
        .into_iter()
        .filter(|c| ["servicemonitors", "prometheusrules"].contains(&c.spec.names.plural.as_str()))
        .collect::<Vec<_>>();
    assert_eq!(crds.len(), 2);
    testbed::crds::install(&bed.client(), crds).await
}

#[tokio::test]
async fn the_rendered_chart_with_monitoring_and_network_policies_passes_server_side_dry_run_on_a_real_apiserver()
-> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    namespaces(&bed).await?;
    monitoring_crds(&bed).await?;
    let mut values = all_agents();
    values["monitoring"] =
        json!({"serviceMonitor": {"enabled": true, "force": true}, "prometheusRule": {"enabled": true, "force": true}});
    values["grafana"] = json!({"dashboard": {"enabled": true}});
    // Every agent's NetworkPolicy, with each kind of peer a user gives (selectors, ipBlocks) and extra rules.
    values["networkPolicy"] = network_policies();
    let rendered = template(&values, &[])?;
    let objects = documents(&rendered)?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("rendered.yaml");
    std::fs::write(&file, &rendered)?;
    let mut kubectl = std::process::Command::new(peer("kubectl")?);
    kubectl.args(["--kubeconfig", &kubeconfig(&bed), "apply", "--dry-run=server", "-f"]).arg(&file);
    let out = run(kubectl)?;
    assert!(out.success, "kubectl apply --dry-run=server failed:\n{}{}", out.stdout, out.stderr);
    // One line per object: the apiserver accepted each of them.
    assert_eq!(out.stdout.lines().filter(|l| l.ends_with("(server dry run)")).count(), objects.len(), "{}", out.stdout);
    assert!(out.stdout.contains("prometheusrule.monitoring.coreos.com/kcp-keeper created (server dry run)"));
    assert!(out.stdout.contains("servicemonitor.monitoring.coreos.com/kcp-keeper created (server dry run)"));
    assert!(out.stdout.contains("configmap/kcp-keeper-dashboard created (server dry run)"));
    for agent in ["ca-syncer", "dns-rewriter", "kubeconfig-rotator", "etcd-snapshotter"] {
        let line = format!("networkpolicy.networking.k8s.io/kcp-keeper-{agent} created (server dry run)");
        assert!(out.stdout.contains(&line), "{line} missing:\n{}", out.stdout);
    }

    // The negative control: an object the apiserver refuses fails the same command.
    let bad = rendered.replace("minAvailable: 1", "minAvailable: -1");
    std::fs::write(&file, bad)?;
    let mut kubectl = std::process::Command::new(peer("kubectl")?);
    kubectl.args(["--kubeconfig", &kubeconfig(&bed), "apply", "--dry-run=server", "-f"]).arg(&file);
    let out = run(kubectl)?;
    assert!(!out.success && out.stderr.contains("PodDisruptionBudget"), "{}{}", out.stdout, out.stderr);
    // The apiserver validates the policies too: a peer the schema lets through (it is the user's, verbatim) but
    // Kubernetes refuses fails the same command, naming the NetworkPolicy.
    values["networkPolicy"]["etcdSnapshotter"]["s3"]["to"] = json!([{"ipBlock": {"cidr": "192.0.2.0/33"}}]);
    std::fs::write(&file, template(&values, &[])?)?;
    let mut kubectl = std::process::Command::new(peer("kubectl")?);
    kubectl.args(["--kubeconfig", &kubeconfig(&bed), "apply", "--dry-run=server", "-f"]).arg(&file);
    let out = run(kubectl)?;
    assert!(
        !out.success && out.stderr.contains("NetworkPolicy") && out.stderr.contains("kcp-keeper-etcd-snapshotter"),
        "{}{}",
        out.stdout,
        out.stderr
    );

    // Not forced, the monitoring objects render because this apiserver now serves monitoring.coreos.com/v1.
    let home = tempfile::tempdir()?;
    let chart = chart::chart_dir();
    let set = "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true";
    let args = [
        "install",
        "kcp-keeper",
        chart.to_str().unwrap(),
        "--namespace",
        NAMESPACE,
        "--kubeconfig",
        &kubeconfig(&bed),
        "--dry-run=server",
        "--set",
        set,
    ];
    let out = run(helm(&args, home.path())?)?;
    assert!(out.success, "{}", out.stderr);
    assert!(out.stdout.contains("kind: PrometheusRule") && out.stdout.contains("kind: ServiceMonitor"));

    // With every agent, the snapshotter's S3 Secret is looked up: NOTES warns while it does not exist.
    let values_file = dir.path().join("all.yaml");
    std::fs::write(&values_file, serde_yaml::to_string(&all_agents())?)?;
    let mut all = args.to_vec();
    all.truncate(all.len() - 2);
    all.extend(["--values", values_file.to_str().unwrap()]);
    let out = run(helm(&all, home.path())?)?;
    assert!(out.success, "{}", out.stderr);
    assert!(
        out.stdout
            .contains("WARNING: Secret etcd-backup-s3 (etcdSnapshotter.s3Credentials.existingSecret) does not exist"),
        "{}",
        out.stdout
    );
    Ok(())
}

/// A token for ServiceAccount `namespace/name` (which the chart created), through TokenRequest.
async fn token_client(bed: &testbed::ControlPlane, namespace: &str, name: &str) -> Result<kube::Client> {
    let accounts = Api::<ServiceAccount>::namespaced(bed.client(), namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
        ..Default::default()
    };
    let minted = accounts.create_token_request(name, &PostParams::default(), &request).await?;
    let token = minted.status.and_then(|s| s.token).context("no token")?;
    let file = bed.apiserver.token_kubeconfig(&format!("system:serviceaccount:{namespace}:{name}"), &token)?;
    testbed::apiserver::client_from_file(&file).await
}

async fn secret(bed: &testbed::ControlPlane, namespace: &str, name: &str) -> Result<()> {
    let secret = Secret {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        string_data: Some([("ca.crt".to_string(), "not a certificate".to_string())].into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(bed.client(), namespace).create(&PostParams::default(), &secret).await?;
    Ok(())
}

fn status_of(result: kube::Result<Secret>) -> u16 {
    match result {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(other) => panic!("unexpected error: {other}"),
    }
}

#[tokio::test]
async fn helm_install_grants_each_agent_exactly_what_its_configuration_names_and_upgrades_and_rolls_back() -> Result<()>
{
    let bed = testbed::ControlPlane::start().await?;
    namespaces(&bed).await?;
    for (ns, name) in [("kcp-system", "root-server-ca"), ("kcp-system", "frontproxy-ca"), ("kcp-system", "other")] {
        secret(&bed, ns, name).await?;
    }
    secret(&bed, "railgrid-system", "unrelated").await?;
    secret(&bed, NAMESPACE, "etcd-backup-s3").await?;
    let home = tempfile::tempdir()?;
    let values = home.path().join("values.yaml");
    let mut v = all_agents();
    v["replicas"] = json!(1);
    // Asked for, but this apiserver has no monitoring.coreos.com/v1: nothing to create, and NOTES says so.
    v["monitoring"] = json!({"serviceMonitor": {"enabled": true}, "prometheusRule": {"enabled": true}});
    std::fs::write(&values, serde_yaml::to_string(&v)?)?;
    let chart = chart::chart_dir();
    let args = [
        "install",
        "kcp-keeper",
        chart.to_str().unwrap(),
        "--namespace",
        NAMESPACE,
        "--kubeconfig",
        &kubeconfig(&bed),
        "--values",
        values.to_str().unwrap(),
    ];
    let out = run(helm(&args, home.path())?)?;
    assert!(out.success, "helm install failed:\n{}{}", out.stdout, out.stderr);
    // NOTES.txt warns about the single replica of each agent.
    assert_eq!(out.stdout.matches("WARNING: ").count(), 4, "{}", out.stdout);
    assert!(out.stdout.contains("ca-syncer runs a single replica"), "{}", out.stdout);
    assert!(out.stdout.contains("does not serve monitoring.coreos.com/v1"), "{}", out.stdout);

    let agent = token_client(&bed, NAMESPACE, "kcp-keeper-ca-syncer").await?;
    let secrets = |ns: &str| Api::<Secret>::namespaced(agent.clone(), ns);
    assert_eq!(status_of(secrets("kcp-system").get("root-server-ca").await), 200, "a configured source");
    assert_eq!(status_of(secrets("kcp-system").get("frontproxy-ca").await), 200, "a configured source");
    assert_eq!(status_of(secrets("kcp-system").get("other").await), 403, "a Secret beside the sources");
    assert_eq!(status_of(secrets("railgrid-system").get("unrelated").await), 403, "a Secret beside a target");
    assert_eq!(status_of(secrets(NAMESPACE).get("anything").await), 403, "its own namespace's Secrets");
    let listed = secrets("kcp-system").list(&Default::default()).await;
    assert!(matches!(listed, Err(kube::Error::Api(ref s)) if s.code == 403), "listing without a name: {listed:?}");

    // dns-rewriter's token reads no Secret at all, and of kube-system's ConfigMaps only the one it manages.
    let dns = token_client(&bed, NAMESPACE, "kcp-keeper-dns-rewriter").await?;
    let got = Api::<Secret>::namespaced(dns.clone(), "kcp-system").get("root-server-ca").await;
    assert_eq!(status_of(got), 403);
    let code = |r: kube::Result<ConfigMap>| match r {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("{e}"),
    };
    // k3s mode: the chart created the empty coredns-custom the agent may not create, marked to outlive an
    // uninstall; the Corefile ConfigMap beside it is the cluster's.
    let admin_cms = Api::<ConfigMap>::namespaced(bed.client(), "kube-system");
    let created = admin_cms.get("coredns-custom").await?;
    assert_eq!(created.annotations().get("helm.sh/resource-policy").map(String::as_str), Some("keep"));
    assert!(created.data.is_none(), "the chart never owns the agent's key");
    let corefile =
        ConfigMap { metadata: ObjectMeta { name: Some("coredns".into()), ..Default::default() }, ..Default::default() };
    admin_cms.create(&PostParams::default(), &corefile).await?;
    let cms = Api::<ConfigMap>::namespaced(dns.clone(), "kube-system");
    assert_eq!(code(cms.get("coredns-custom").await), 200, "the ConfigMap it manages");
    assert_eq!(code(cms.get("coredns").await), 403, "the Corefile beside it");
    let services = Api::<Service>::namespaced(dns, "kcp-system").list(&Default::default()).await;
    assert!(services.is_ok(), "listing Services where discovery runs: {services:?}");

    // kubeconfig-rotator's token reads the Secrets its example names (the server CA) and no other; the
    // snapshotter's reads no Secret at all, not even its S3 keys (mounted, never read through the apiserver).
    let rotator = token_client(&bed, NAMESPACE, "kcp-keeper-kubeconfig-rotator").await?;
    let secrets = |ns: &str| Api::<Secret>::namespaced(rotator.clone(), ns);
    assert_eq!(status_of(secrets("kcp-system").get("root-server-ca").await), 200, "its configured server CA");
    assert_eq!(status_of(secrets("kcp-system").get("other").await), 403, "a Secret beside its sources");
    assert_eq!(status_of(secrets("railgrid-system").get("unrelated").await), 403, "a Secret beside its target");
    let snapshotter = token_client(&bed, NAMESPACE, "kcp-keeper-etcd-snapshotter").await?;
    let got = Api::<Secret>::namespaced(snapshotter.clone(), NAMESPACE).get("etcd-backup-s3").await;
    assert_eq!(status_of(got), 403, "the snapshotter's own S3 Secret");
    assert_eq!(status_of(Api::<Secret>::namespaced(snapshotter, "kcp-system").get("other").await), 403);

    // helm upgrade with a changed value changes only what that value touches; rollback restores it. Selector
    // labels are stable, so neither hits an immutable field.
    let deployments = Api::<Deployment>::namespaced(bed.client(), NAMESPACE);
    let before = versions(&bed).await?;
    assert!(before.len() >= 30, "{before:#?}");
    let upgrade = [
        "upgrade",
        "kcp-keeper",
        chart.to_str().unwrap(),
        "--namespace",
        NAMESPACE,
        "--kubeconfig",
        &kubeconfig(&bed),
        "--values",
        values.to_str().unwrap(),
        "--set",
        "dnsRewriter.replicas=2",
    ];
    let out = run(helm(&upgrade, home.path())?)?;
    assert!(out.success, "helm upgrade failed:\n{}{}", out.stdout, out.stderr);
    assert_eq!(deployments.get("kcp-keeper-dns-rewriter").await?.spec.replicas, Some(2));
    let pdbs = Api::<PodDisruptionBudget>::namespaced(bed.client(), NAMESPACE);
    assert!(pdbs.get_opt("kcp-keeper-dns-rewriter").await?.is_some(), "two replicas get a PDB");
    let after = versions(&bed).await?;
    assert_eq!(
        changed(&before, &after),
        ["Deployment kcp-keeper/kcp-keeper-dns-rewriter", "PodDisruptionBudget kcp-keeper/kcp-keeper-dns-rewriter"],
        "only dns-rewriter's Deployment and its new PDB"
    );

    // A changed snapshotter configuration changes its ConfigMap alone: the agent re-reads the file (no checksum
    // annotation restarts the pods).
    let mut snapshot_values = v.clone();
    snapshot_values["etcdSnapshotter"]["config"]["retention"]["keepLast"] = json!(5);
    let values_2 = home.path().join("values-2.yaml");
    std::fs::write(&values_2, serde_yaml::to_string(&snapshot_values)?)?;
    let mut upgrade_2 = upgrade;
    upgrade_2[8] = values_2.to_str().unwrap();
    let out = run(helm(&upgrade_2, home.path())?)?;
    assert!(out.success, "helm upgrade failed:\n{}{}", out.stdout, out.stderr);
    let after_2 = versions(&bed).await?;
    assert_eq!(
        changed(&after, &after_2),
        ["ConfigMap kcp-keeper/kcp-keeper-etcd-snapshotter"],
        "the snapshotter's ConfigMap alone"
    );
    let cm = Api::<ConfigMap>::namespaced(bed.client(), NAMESPACE).get("kcp-keeper-etcd-snapshotter").await?;
    assert!(cm.data.unwrap_or_default()["config.yaml"].contains("keepLast: 5"));

    let rollback = ["rollback", "kcp-keeper", "1", "--namespace", NAMESPACE, "--kubeconfig", &kubeconfig(&bed)];
    let out = run(helm(&rollback, home.path())?)?;
    assert!(out.success, "helm rollback failed:\n{}{}", out.stdout, out.stderr);
    assert_eq!(deployments.get("kcp-keeper-dns-rewriter").await?.spec.replicas, Some(1));
    assert!(pdbs.get_opt("kcp-keeper-dns-rewriter").await?.is_none(), "one replica again: no PDB");
    let rolled_back = versions(&bed).await?;
    assert_eq!(
        changed(&after_2, &rolled_back),
        [
            "ConfigMap kcp-keeper/kcp-keeper-etcd-snapshotter",
            "Deployment kcp-keeper/kcp-keeper-dns-rewriter",
            "PodDisruptionBudget kcp-keeper/kcp-keeper-dns-rewriter"
        ],
        "rollback to revision 1 restores exactly what the two upgrades changed"
    );
    Ok(())
}
