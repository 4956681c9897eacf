//! The **renderer stand-in**: plays the kcp-operator's Kubeconfig controller for one namespace (the module proxy
//! refuses the operator, so it cannot run here). As the operator does (DESIGN.md section 2):
//! - it applies Certificate `kubeconfig-cert-<name>`: CN = username, O = groups + `kubeconfig:<name>` (sorted),
//!   duration = validity, issuer `Issuer/<rootshard>-client-ca`, Secret labelled `operator.kcp.io/kubeconfig`;
//! - once the Certificate is Ready it renders `Secret/<spec.secretRef.name>`, key `kubeconfig`: client
//!   certificate and key from `Secret/kubeconfig-cert-<name>`, CA = `tls.crt` of `Secret/<rootshard>-server-ca`,
//!   server `https://<FrontProxy spec.external.hostname>:<port>`, contexts `base` and `default`
//!   (`/clusters/<targetWorkspace>`), current context `default`, user named after the username;
//! - and it has the operator's lag: it renders when the Kubeconfig object changes (any update, an annotation
//!   too), while its Certificate is not Ready yet (the operator requeues), and on a slow resync; never because
//!   cert-manager renewed (the operator sets no ownerReferences, so that watch never fires).
//!
//! Only `target.frontProxyRef` is supported: the layout the hub uses.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{POLL, StandIn, certificate_resource, front_proxy_resource, kubeconfig_resource};

pub const FIELD_MANAGER: &str = "kcp-operator-stand-in";

/// Starts the renderer stand-in for Kubeconfigs in `namespace`, re-rendering everything every `resync` (the
/// operator's is 10 h ± 10 %).
pub fn spawn(client: kube::Client, namespace: &str, resync: Duration) -> StandIn {
    let namespace = namespace.to_string();
    StandIn(tokio::spawn(async move {
        // Per Kubeconfig: the resourceVersion last rendered for, and when.
        let mut rendered: BTreeMap<String, (String, Instant)> = BTreeMap::new();
        let kubeconfigs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &kubeconfig_resource());
        loop {
            if let Ok(list) = kubeconfigs.list(&ListParams::default()).await {
                for kc in list.items {
                    let name = kc.metadata.name.clone().unwrap_or_default();
                    let rv = kc.metadata.resource_version.clone().unwrap_or_default();
                    let due = rendered.get(&name).is_none_or(|(last, at)| *last != rv || at.elapsed() >= resync);
                    if !due {
                        continue;
                    }
                    match render(&client, &namespace, &kc).await {
                        Ok(true) => {
                            rendered.insert(name, (rv, Instant::now()));
                        }
                        // Not Ready yet: the operator requeues; so does the stand-in, at its next poll.
                        Ok(false) => {}
                        Err(e) => eprintln!("renderer stand-in: {name}: {e:#}"),
                    }
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }))
}

/// One reconcile of a Kubeconfig; `Ok(true)` once its Secret is rendered.
async fn render(client: &kube::Client, namespace: &str, kc: &DynamicObject) -> anyhow::Result<bool> {
    let name = kc.metadata.name.clone().unwrap_or_default();
    let spec = &kc.data["spec"];
    let username = spec["username"].as_str().unwrap_or_default();
    let cert_name = format!("kubeconfig-cert-{name}");
    let fp_name = spec["target"]["frontProxyRef"]["name"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("only target.frontProxyRef is supported by the renderer stand-in"))?;
    let front_proxy =
        Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &front_proxy_resource()).get(fp_name).await?;
    let root_shard = front_proxy.data["spec"]["rootShard"]["ref"]["name"].as_str().unwrap_or("root").to_string();

    let mut orgs: Vec<String> =
        spec["groups"].as_array().into_iter().flatten().filter_map(Value::as_str).map(String::from).collect();
    orgs.push(format!("kubeconfig:{name}"));
    orgs.sort();
    let certificate = json!({
        "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
        "metadata": {"name": cert_name, "labels": {"operator.kcp.io/kubeconfig": name}},
        "spec": {
            "commonName": username,
            "subject": {"organizations": orgs},
            "duration": spec["validity"],
            "secretName": cert_name,
            "secretTemplate": {"labels": {"operator.kcp.io/kubeconfig": name}},
            "issuerRef": {"name": format!("{root_shard}-client-ca"), "kind": "Issuer", "group": "cert-manager.io"},
            "usages": ["client auth"],
            "privateKey": {"algorithm": "RSA", "size": 4096},
        },
    });
    let certificates: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &certificate_resource());
    let applied =
        certificates.patch(&cert_name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&certificate)).await?;
    let ready = applied.data["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
    if !ready {
        return Ok(false);
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let key = |s: &Secret, k: &str| s.data.as_ref().and_then(|d| d.get(k)).map(|v| v.0.clone()).unwrap_or_default();
    let client_cert = secrets.get(&cert_name).await?;
    let server_ca = secrets.get(&format!("{root_shard}-server-ca")).await?;
    let external = &front_proxy.data["spec"]["external"];
    let server = format!("https://{}:{}", external["hostname"].as_str().unwrap_or_default(), external["port"]);
    let workspace = spec["targetWorkspace"].as_str().unwrap_or("root");
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: base\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n- name: default\n  cluster:\n    server: {server}/clusters/{workspace}\n    certificate-authority-data: {ca}\ncontexts:\n- name: base\n  context:\n    cluster: base\n    user: {username}\n- name: default\n  context:\n    cluster: default\n    user: {username}\ncurrent-context: default\nusers:\n- name: {username}\n  user:\n    client-certificate-data: {crt}\n    client-key-data: {key}\n",
        ca = B64.encode(key(&server_ca, "tls.crt")),
        crt = B64.encode(key(&client_cert, "tls.crt")),
        key = B64.encode(key(&client_cert, "tls.key")),
    );
    let secret_name = spec["secretRef"]["name"].as_str().unwrap_or_default();
    let rendered = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": secret_name},
        "data": {"kubeconfig": B64.encode(kubeconfig)},
    });
    secrets.patch(secret_name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&rendered)).await?;
    eprintln!("renderer stand-in: rendered {namespace}/{secret_name} for Kubeconfig {name}");
    Ok(true)
}
