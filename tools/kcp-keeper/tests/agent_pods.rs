//! The `agent-pods` check against a real kube-apiserver, run as the chart runs it: the chart is rendered with
//! `helm template` (release `edge` in a namespace of its own), its doctor's ServiceAccount, Roles and RoleBindings
//! are applied as rendered, and the real binary runs with a token of that ServiceAccount and the environment the
//! chart's doctor Deployment sets. The release's pods are made from the chart's own pod templates (labels, container
//! names, image references); there is no kubelet, so the test writes what a kubelet would report through the pods'
//! `status` subresource: an image that cannot be pulled (`ErrImagePull`, then `ImagePullBackOff`), a running pod.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

static BED: OnceLock<Result<testbed::ControlPlane, String>> = OnceLock::new();

fn bed() -> &'static testbed::ControlPlane {
    testbed::shared_for_binary(&BED, "control plane", testbed::ControlPlane::start)
}

const RELEASE: &str = "edge";
const REGISTRY: &str = "registry.example.com/kcp-keeper";
/// ca-syncer's tag: one the registry does not have.
const MISSING_TAG: &str = "0.0.0-not-pushed";
/// What a kubelet reports for a pull the registry refused; the token URL carries a password, as some registries'
/// errors quote the URL they were asked for.
const PULL_ERROR: &str = "failed to pull and unpack image \"registry.example.com/kcp-keeper/ca-syncer:0.0.0-not-pushed\": \
     failed to resolve reference: unexpected status from HEAD request to \
     https://puller:pull-pw-7e1d@registry.example.com/v2/kcp-keeper/ca-syncer/manifests/0.0.0-not-pushed: 404 Not Found";

/// `helm template` of the chart as release [`RELEASE`] in `namespace`: the doctor on (without the Verify checks,
/// which need the cluster's network), reading the kcp objects in `kcp_namespace`; ca-syncer's image tag one the
/// registry lacks. `kube_version`: the cluster's, as `helm install` would read it.
fn render(namespace: &str, kcp_namespace: &str, kube_version: &str) -> Result<Vec<Value>> {
    let values = json!({
        "image": {"registry": REGISTRY, "tag": "0.1.0"},
        "imagePullSecrets": [{"name": "regcred"}],
        "caSyncer": {"enabled": true, "image": {"tag": MISSING_TAG}},
        "doctor": {"enabled": true, "verify": {"enabled": false}, "operator": {"name": ""},
                   "kcp": {"namespace": kcp_namespace}},
    });
    let home = bed().subdir("helm")?;
    let values_file = home.join("values.yaml");
    std::fs::write(&values_file, serde_yaml::to_string(&values)?)?;
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/kcp-keeper");
    let out = std::process::Command::new(bed().peers.path("helm"))
        .args(["template", RELEASE])
        .arg(&chart)
        .args(["--namespace", namespace, "--kube-version", kube_version, "--values"])
        .arg(&values_file)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .output()?;
    if !out.status.success() {
        bail!("helm template: {}", String::from_utf8_lossy(&out.stderr));
    }
    let mut objects = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&String::from_utf8(out.stdout)?) {
        let value: Value = serde::Deserialize::deserialize(doc)?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("the chart renders no {kind} {name}"))
}

/// The doctor's RBAC and every ServiceAccount (the pods' admission looks theirs up) as the chart renders them,
/// applied as they are.
async fn apply_accounts_and_doctor_rbac(client: &kube::Client, objects: &[Value]) -> Result<()> {
    for object in objects {
        let kind = object["kind"].as_str().context("a kind")?;
        let doctors = object["metadata"]["name"] == "kcp-keeper-doctor" && ["Role", "RoleBinding"].contains(&kind);
        if kind != "ServiceAccount" && !doctors {
            continue;
        }
        let name = object["metadata"]["name"].as_str().context("a name")?;
        let (group, version) =
            object["apiVersion"].as_str().context("an apiVersion")?.rsplit_once('/').unwrap_or(("", "v1"));
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, kind),
            &format!("{}s", kind.to_ascii_lowercase()),
        );
        let ns = object["metadata"]["namespace"].as_str().context("a namespace")?;
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
        api.patch(name, &PatchParams::apply("doctor-test").force(), &Patch::Apply(object))
            .await
            .with_context(|| format!("applying {kind} {ns}/{name}"))?;
    }
    Ok(())
}

/// A namespace of a random name.
async fn namespace(client: &kube::Client) -> Result<String> {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    let name = format!("agent-pods-{:08x}", h.finish() as u32);
    let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::all(client.clone()).create(&PostParams::default(), &ns).await?;
    Ok(name)
}

/// A kubeconfig with a token (TokenRequest, one hour) of ServiceAccount `namespace/name`, as its pod would hold.
async fn token_kubeconfig(client: &kube::Client, namespace: &str, name: &str) -> Result<std::path::PathBuf> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
        ..Default::default()
    };
    let minted = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .context("TokenRequest for the chart's ServiceAccount")?;
    let token = minted.status.and_then(|s| s.token).context("the TokenRequest has no token")?;
    bed().apiserver.token_kubeconfig(&format!("system:serviceaccount:{namespace}:{name}"), &token)
}

/// A pod of the release made from the chart's Deployment `deployment`: its pod template's labels, ServiceAccount,
/// containers' names and images, on a node that does not exist (no kubelet will touch it).
async fn create_pod(client: &kube::Client, ns: &str, objects: &[Value], deployment: &str, name: &str) -> Result<()> {
    let template = &find(objects, "Deployment", deployment)["spec"]["template"];
    let containers: Vec<Value> = template["spec"]["containers"]
        .as_array()
        .context("containers")?
        .iter()
        .map(|c| json!({"name": c["name"], "image": c["image"]}))
        .collect();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": template["metadata"]["labels"]},
        "spec": {"nodeName": "node-without-kubelet", "serviceAccountName": template["spec"]["serviceAccountName"],
                 "containers": containers},
    }))?;
    Api::<Pod>::namespaced(client.clone(), ns).create(&PostParams::default(), &pod).await?;
    Ok(())
}

/// Writes what a kubelet would report of pod `name`'s one container: `state` (a ContainerState) and readiness.
async fn set_status(client: &kube::Client, ns: &str, name: &str, state: Value, ready: bool) -> Result<()> {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let pod = api.get(name).await?;
    let container = &pod.spec.as_ref().context("a spec")?.containers[0];
    let image = container.image.clone().unwrap_or_default();
    let running = state.get("running").is_some();
    let status = json!({"status": {
        "phase": if running { "Running" } else { "Pending" },
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        "containerStatuses": [{"name": container.name, "image": image, "imageID": if running { "sha256:0a1b" } else { "" },
                               "ready": ready, "restartCount": 0, "started": running, "state": state}],
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await?;
    Ok(())
}

/// The real binary as the chart's doctor runs, once: the Deployment's environment (but the periodic mode's
/// address and interval, and the agents' metrics URLs, which name Services only the cluster's network reaches),
/// the ServiceAccount's token. Its exit code and JSON report.
fn doctor(env: &BTreeMap<String, String>, kubeconfig: &std::path::Path) -> (Option<i32>, Value) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kcp-keeper"));
    for (name, _) in std::env::vars().filter(|(n, _)| n.starts_with("KCP_KEEPER_DOCTOR_")) {
        cmd.env_remove(name);
    }
    for (name, value) in env {
        let skipped = ["KCP_KEEPER_DOCTOR_SERVE", "KCP_KEEPER_DOCTOR_INTERVAL"].contains(&name.as_str())
            || name.ends_with("_METRICS");
        if !skipped {
            cmd.env(name, value);
        }
    }
    let out = cmd.args(["doctor", "--kubeconfig"]).arg(kubeconfig).output().expect("running kcp-keeper");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{stdout}{stderr}");
    let report = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not a JSON report ({e}): {stdout}"));
    (out.status.code(), report)
}

/// The report's `agent-pods` lines: subject -> (result, saw, todo).
fn agent_pods(report: &Value) -> BTreeMap<String, (String, String, String)> {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|v| v["check"] == "agent-pods")
        .map(|v| (s(&v["subject"]), (s(&v["result"]), s(&v["saw"]), s(&v["todo"]))))
        .collect()
}

#[tokio::test]
async fn the_charts_doctor_names_the_pod_container_image_and_registry_error_of_an_agent_that_cannot_pull_and_is_ok_once_it_runs()
-> Result<()> {
    // The bed's own client belongs to the runtime it started on: everything through ours.
    let client = bed().apiserver.admin_client().await?;
    let (ns, kcp_ns) = (namespace(&client).await?, namespace(&client).await?);
    let objects = render(&ns, &kcp_ns, &client.apiserver_version().await?.git_version)?;
    apply_accounts_and_doctor_rbac(&client, &objects).await?;
    let kubeconfig = token_kubeconfig(&client, &ns, "kcp-keeper-doctor").await?;
    let container = &find(&objects, "Deployment", "kcp-keeper-doctor")["spec"]["template"]["spec"]["containers"][0];
    let env: BTreeMap<String, String> = container["env"]
        .as_array()
        .context("the doctor's env")?
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?.to_string(), e["value"].as_str()?.to_string())))
        .collect();
    assert_eq!(
        env.get("KCP_KEEPER_DOCTOR_RELEASE_NAMESPACE"),
        Some(&ns),
        "the chart points the doctor at its namespace"
    );
    assert_eq!(env.get("KCP_KEEPER_DOCTOR_RELEASE").map(String::as_str), Some(RELEASE));

    // Nothing of the release runs yet: said as a warning, not a failure.
    let (code, report) = doctor(&env, &kubeconfig);
    let lines = agent_pods(&report);
    let none = &lines[&format!("release {RELEASE} in {ns}")];
    assert_eq!((code, none.0.as_str()), (Some(0), "warn"), "{report}");
    assert!(none.1.contains("no pod labelled app.kubernetes.io/instance=edge"), "{}", none.1);

    // ca-syncer's pod cannot pull its image; dns-rewriter's runs; a pod of another release fails too, unread.
    let (syncer, rewriter) = ("kcp-keeper-ca-syncer-5f7d9c8b6-q2w4e", "kcp-keeper-dns-rewriter-7c9d6f5b8-jq6mz");
    create_pod(&client, &ns, &objects, "kcp-keeper-ca-syncer", syncer).await?;
    create_pod(&client, &ns, &objects, "kcp-keeper-dns-rewriter", rewriter).await?;
    set_status(&client, &ns, rewriter, json!({"running": {"startedAt": "2025-01-01T00:00:00Z"}}), true).await?;
    let other: Pod = serde_json::from_value(json!({
        "metadata": {"name": "other-release-ca-syncer", "labels": {"app.kubernetes.io/name": "ca-syncer", "app.kubernetes.io/instance": "other"}},
        "spec": {"nodeName": "node-without-kubelet", "serviceAccountName": "kcp-keeper-ca-syncer",
                 "containers": [{"name": "ca-syncer", "image": "elsewhere/ca-syncer:1"}]},
    }))?;
    Api::<Pod>::namespaced(client.clone(), &ns).create(&PostParams::default(), &other).await?;
    set_status(
        &client,
        &ns,
        "other-release-ca-syncer",
        json!({"waiting": {"reason": "ErrImagePull", "message": "x"}}),
        false,
    )
    .await?;
    set_status(&client, &ns, syncer, json!({"waiting": {"reason": "ErrImagePull", "message": PULL_ERROR}}), false)
        .await?;

    let (code, report) = doctor(&env, &kubeconfig);
    assert_eq!(code, Some(1), "a FAIL line exits 1: {report}");
    let lines = agent_pods(&report);
    let image = format!("{REGISTRY}/ca-syncer:{MISSING_TAG}");
    let (result, saw, todo) = &lines[&format!("pod/{ns}/{syncer} container ca-syncer")];
    assert_eq!(result, "fail");
    assert!(saw.starts_with(&format!("ErrImagePull, image {image}: failed to pull")), "{saw}");
    assert!(saw.contains("404 Not Found"), "the registry's error is shown: {saw}");
    assert!(saw.contains("https://REDACTED@registry.example.com/v2/"), "{saw}");
    for needle in ["image.registry", "imagePullSecrets", "reachable from the nodes"] {
        assert!(todo.contains(needle), "{needle}: {todo}");
    }
    assert_eq!(lines[&format!("pod/{ns}/{rewriter}")].0, "ok");
    assert_eq!(lines.len(), 2, "the other release's pod is not this release's: {lines:#?}");
    let failed: Vec<&Value> = report["checks"].as_array().unwrap().iter().filter(|v| v["result"] == "fail").collect();
    assert!(failed.iter().all(|v| v["check"] == "agent-pods"), "no other check fails: {failed:#?}");
    assert!(!report.to_string().contains("pull-pw-7e1d"), "the password in the message is redacted");

    // The kubelet backs off: the shorter message, the same verdict.
    let backoff = format!("Back-off pulling image \"{image}\"");
    set_status(&client, &ns, syncer, json!({"waiting": {"reason": "ImagePullBackOff", "message": backoff}}), false)
        .await?;
    let (code, report) = doctor(&env, &kubeconfig);
    assert_eq!(code, Some(1), "{report}");
    let (result, saw, _) = &agent_pods(&report)[&format!("pod/{ns}/{syncer} container ca-syncer")];
    assert_eq!(
        (result.as_str(), saw.as_str()),
        ("fail", format!("ImagePullBackOff, image {image}: {backoff}").as_str())
    );

    // The image pulled (the tag pushed, or fixed in the values): running and ready is ok, and the doctor exits 0.
    set_status(&client, &ns, syncer, json!({"running": {"startedAt": "2025-01-01T00:05:00Z"}}), true).await?;
    let (code, report) = doctor(&env, &kubeconfig);
    let lines = agent_pods(&report);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(lines[&format!("pod/{ns}/{syncer}")].0, "ok", "{lines:#?}");
    assert!(lines.values().all(|(result, ..)| result == "ok"), "{lines:#?}");
    Ok(())
}
