//! The layout changing under the consumers (consumer.rs), each change made the way its owner makes it:
//! - the kcp server CA rotated: cert-manager re-issues `root-server-ca` (a new key: the operator's Certificate
//!   keeps cert-manager's default `rotationPolicy: Always`), then every serving certificate it issues;
//! - a dns-rewriter rule change: the alpha shard's Service recreated by the operator with another address and a
//!   second public name in its server certificate, then both undone;
//! - restore drills of both shards while the scheduled snapshots (every 20 s) go on.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use chart::on_node::exec_in_agent;
use chart::on_seed::{CA_TARGET, HUB_KEY, HUB_NAMESPACE, HUB_SECRET};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};
use testbed::node::Node;
use testbed::seed::layout::{self, EXTERNAL_HOST, FRONT_PROXY_IP, NAMESPACE, SHARD_HOSTS};

/// The root shard's server CA: the Certificate, its Secret and the Issuer of every serving certificate.
pub fn server_ca() -> String {
    format!("{}-server-ca", layout::ROOT_SHARD)
}

/// The PEM certificate blocks of `pem`, each as written.
pub fn certificates(pem: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some(start) = rest.find("-----BEGIN CERTIFICATE-----") {
        let Some(len) = rest[start..].find("-----END CERTIFICATE-----") else { break };
        let end = start + len + "-----END CERTIFICATE-----".len();
        out.push(rest[start..end].to_string());
        rest = &rest[end..];
    }
    out
}

/// The subject key identifier of the first certificate of `pem`, as the probes print key identifiers
/// (lower-case hex bytes joined by colons).
pub fn subject_key_id(pem: &str) -> Result<String> {
    let block = certificates(pem).into_iter().next().context("no certificate")?;
    let (_, parsed) = x509_parser::pem::parse_x509_pem(block.as_bytes()).context("not PEM")?;
    let cert = parsed.parse_x509().context("not a certificate")?;
    for ext in cert.extensions() {
        if let x509_parser::extensions::ParsedExtension::SubjectKeyIdentifier(id) = ext.parsed_extension() {
            return Ok(id.0.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":"));
        }
    }
    anyhow::bail!("the certificate has no subject key identifier")
}

fn certificate_api(client: &kube::Client) -> (Api<DynamicObject>, ApiResource) {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate"),
        "certificates",
    );
    (Api::namespaced_with(client.clone(), NAMESPACE, &resource), resource)
}

/// What `key` of the Secret `namespace/name` holds, as text.
pub async fn secret_text(client: &kube::Client, namespace: &str, name: &str, key: &str) -> Option<String> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace).get_opt(name).await.ok()??;
    String::from_utf8(secret.data?.get(key)?.0.clone()).ok()
}

/// `cmctl renew`: the Certificate's `Issuing` condition set true on its status.
async fn renew(client: &kube::Client, name: &str) -> Result<()> {
    let (api, _) = certificate_api(client);
    let certificate = api.get(name).await?;
    let mut conditions: Vec<Value> = certificate.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["type"] != "Issuing")
        .collect();
    conditions.push(json!({
        "type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
        "message": "re-issued by the consumer test", "lastTransitionTime": Time(Timestamp::now()),
    }));
    // As `cmctl renew`: conditional on the version read, so a status cert-manager wrote meanwhile is not replaced
    // by this stale copy (a conflict is tried again by the caller).
    let patch = json!({
        "metadata": {"resourceVersion": certificate.metadata.resource_version},
        "status": {"conditions": conditions},
    });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// Renews the Certificate `name` and waits until its Secret holds another `tls.crt`, which it returns. A renewal
/// that has not changed the Secret within a minute (it met an issuance of the operator's in flight, or its status
/// write conflicted) is asked for again, up to four times; the Certificate's conditions are in the error.
async fn reissue(client: &kube::Client, name: &str, secret: &str) -> Result<String> {
    let before = secret_text(client, NAMESPACE, secret, "tls.crt").await.context("no tls.crt")?;
    for attempt in 1..=4 {
        if let Err(e) = renew(client, name).await {
            eprintln!("renewing {name} (attempt {attempt}): {e:#}");
        }
        let what = format!("a new {secret}");
        let changed = testbed::eventually_seen(Duration::from_secs(60), &what, || async {
            let now = secret_text(client, NAMESPACE, secret, "tls.crt").await;
            Ok(now.filter(|now| *now != before).ok_or_else(|| "tls.crt unchanged".to_string()))
        });
        if let Ok(now) = changed.await {
            return Ok(now);
        }
    }
    let (api, _) = certificate_api(client);
    let status = api.get(name).await.map(|c| c.data["status"].clone()).unwrap_or_default();
    bail!("cert-manager did not re-issue {name} after 4 renewals a minute apart: its status {status}")
}

/// The server CA before and after its rotation.
pub struct Rotation {
    pub old: String,
    pub new: String,
    pub new_key_id: String,
}

/// The server CA certificates a rotation replaced: ca-syncer keeps them in the hub's bundle for its overlap, so
/// the bundle may hold them beside the Secret's (ca_syncer.rs).
pub static ROTATED_OUT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// cert-manager re-issues the root shard's server CA; the new one has a new key.
pub async fn rotate_server_ca(client: &kube::Client) -> Result<Rotation> {
    let name = server_ca();
    let old = secret_text(client, NAMESPACE, &name, "tls.crt").await.context("no server CA")?;
    ROTATED_OUT.lock().expect("rotated out").extend(certificates(&old));
    let new = reissue(client, &name, &name).await?;
    let new_key_id = subject_key_id(&new)?;
    ensure!(subject_key_id(&old)? != new_key_id, "the re-issued server CA kept its key");
    eprintln!("server CA rotated: key {} -> {new_key_id}", subject_key_id(&old)?);
    Ok(Rotation { old, new, new_key_id })
}

/// The CA inside the hub's published kubeconfig.
async fn published_ca(client: &kube::Client) -> Option<String> {
    let kubeconfig = secret_text(client, HUB_NAMESPACE, HUB_SECRET, HUB_KEY).await?;
    let doc: Value = serde_yaml::from_str(&kubeconfig).ok()?;
    let data = doc["clusters"][0]["cluster"]["certificate-authority-data"].as_str()?;
    let pem: k8s_openapi::ByteString = serde_json::from_value(json!(data)).ok()?;
    String::from_utf8(pem.0).ok()
}

/// Waits until ca-syncer's bundle for the hub and the rotator's published kubeconfig each trust both CAs (the
/// overlap that lets a consumer reload before any server changes its certificate).
pub async fn published_with_both(client: &kube::Client, rotation: &Rotation) -> Result<()> {
    let both = |pem: &str| {
        let held = certificates(pem);
        certificates(&rotation.old).iter().chain(&certificates(&rotation.new)).all(|c| held.contains(c))
    };
    testbed::eventually(Duration::from_secs(180), "ca-syncer's bundle holding the old and new CA", || async {
        secret_text(client, HUB_NAMESPACE, CA_TARGET, "ca.crt").await.filter(|b| both(b)).map(|_| ())
    })
    .await;
    testbed::eventually(Duration::from_secs(180), "the published kubeconfig trusting the old and new CA", || async {
        published_ca(client).await.filter(|b| both(b)).map(|_| ())
    })
    .await;
    Ok(())
}

/// Re-issues every certificate the server CA issues (the shards', the front proxy's, the virtual workspaces'),
/// as the operator's Certificates name them; returns their names.
pub async fn reissue_serving_certificates(client: &kube::Client) -> Result<Vec<String>> {
    let (api, _) = certificate_api(client);
    let issued: Vec<(String, String)> = api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|c| c.data["spec"]["issuerRef"]["name"] == server_ca().as_str())
        .filter_map(|c| Some((c.metadata.name?, c.data["spec"]["secretName"].as_str()?.to_string())))
        .collect();
    ensure!(issued.len() >= 3, "the server CA issues only {issued:?}");
    let reissued = futures::future::try_join_all(issued.iter().map(|(name, secret)| reissue(client, name, secret)));
    reissued.await?;
    Ok(issued.into_iter().map(|(name, _)| name).collect())
}

/// The alpha shard's Service, its public name and address as installed, and where the rule change moves it.
const ALPHA_SERVICE: &str = "alpha-shard-kcp";
const MOVED_IP: &str = "10.96.100.103";
const SECOND_NAME: &str = "alpha-next.kcp.seed.example.com";

fn shard_api(client: &kube::Client) -> Api<DynamicObject> {
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("operator.kcp.io", "v1alpha1", "Shard"), "shards");
    Api::namespaced_with(client.clone(), NAMESPACE, &resource)
}

/// The alpha shard at `ip` with `names` in its server certificate: its `Shard` patched, its Service deleted so
/// the operator makes it again (a ClusterIP cannot change in place), and waited for until a plain pod resolves
/// every name to `ip` (dns-rewriter's rules and CoreDNS's reload in between) while the front proxy's public name
/// still answers the front proxy.
async fn place_alpha(node: &Node, client: &kube::Client, ip: &str, names: &[&str]) -> Result<()> {
    let patch = json!({"spec": {
        "serviceTemplate": {"spec": {"clusterIP": ip}},
        "certificateTemplates": {"server": {"spec": {"dnsNames": names}}},
    }});
    shard_api(client).patch(layout::SHARD, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    // The operator renders the Service from the Shard only once every certificate of the shard is ready (the
    // second name re-issues one), and then cannot change the address in place: the Service is deleted whenever
    // it stands at another address, until the operator makes it at this one.
    let services = Api::<Service>::namespaced(client.clone(), NAMESPACE);
    let deletions = std::cell::Cell::new(0);
    testbed::eventually(Duration::from_secs(300), "the operator making alpha's Service at its new address", || async {
        match services.get_opt(ALPHA_SERVICE).await.ok()? {
            Some(service) if service.spec.as_ref()?.cluster_ip.as_deref() == Some(ip) => return Some(()),
            Some(service) if service_older_than(&service, 5) => {
                deletions.set(deletions.get() + 1);
                let _ = services.delete(ALPHA_SERVICE, &DeleteParams::default()).await;
            }
            _ => {}
        }
        None
    })
    .await;
    eprintln!("rule change: alpha's Service at {ip} after {} deletion(s)", deletions.get());
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
    let second = names.contains(&SECOND_NAME);
    testbed::eventually(Duration::from_secs(180), "dns-rewriter's rules following alpha's names", || async {
        let rules = config_maps.get_opt("coredns-custom").await.ok()??.data?;
        (rules.values().any(|r| r.contains(SECOND_NAME)) == second).then_some(())
    })
    .await;
    let mut lookups = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    loop {
        lookups += 1;
        let mut asked = names.to_vec();
        asked.push(EXTERNAL_HOST);
        let lookup = crate::dns_rewriter::lookup_names(node, client, "rule-change-lookup", &asked).await?;
        let wrong: Vec<_> = names
            .iter()
            .map(|n| (*n, ip))
            .chain([(EXTERNAL_HOST, FRONT_PROXY_IP)])
            .filter(|(n, ip)| lookup.answers.get(*n).map(String::as_str) != Some(*ip))
            .collect();
        if wrong.is_empty() {
            eprintln!("rule change: {names:?} resolve to {ip} from a plain pod (lookup {lookups})");
            return Ok(());
        }
        ensure!(std::time::Instant::now() < deadline, "after 4 minutes, not answered {wrong:?}:\n{}", lookup.log);
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// Whether `service` was made more than `seconds` ago (one the operator just made may not carry the Shard's newest
/// render yet).
fn service_older_than(service: &Service, seconds: i64) -> bool {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
    service.metadata.creation_timestamp.as_ref().is_some_and(|t| now - t.0.as_second() > seconds)
}

/// The rule change and its undoing: alpha moved to another address with a second public name, then back.
pub async fn rule_change(node: &Node, client: &kube::Client) -> Result<()> {
    let (_, alpha, installed_ip) = SHARD_HOSTS[1];
    place_alpha(node, client, MOVED_IP, &[alpha, SECOND_NAME]).await.context("moving alpha")?;
    place_alpha(node, client, installed_ip, &[alpha]).await.context("moving alpha back")
}

/// The newest snapshot id of each shard (`etcd-snapshotter list` in the agent's pod).
pub fn newest_snapshots(node: &Node) -> Vec<Option<String>> {
    layout::ETCD_MEMBERS.iter().map(|(shard, _)| crate::etcd_snapshotter::newest(node, shard)).collect()
}

/// Drills the snapshots `ids` (one of each shard) in the agent's pod (the root shard's at the kcp level, as its
/// configuration says); returns the ids drilled.
pub fn drill_both(node: &Node, ids: &[String]) -> Result<Vec<String>> {
    let mut drilled = Vec::new();
    for id in ids {
        let out = exec_in_agent(node, "etcd-snapshotter", &["/etcd-snapshotter", "drill", id])
            .with_context(|| format!("drilling {id}"))?;
        eprintln!("drill of {id}:\n{out}");
        drilled.push(id.clone());
    }
    Ok(drilled)
}

/// The operator renders the seed's own admin kubeconfig again (with the new CA): a nudge on its `Kubeconfig`,
/// which it watches, since nothing it watches changed with the CA.
pub async fn rerender_seed_kubeconfig(client: &kube::Client, rotation: &Rotation) -> Result<()> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("operator.kcp.io", "v1alpha1", "Kubeconfig"),
        "kubeconfigs",
    );
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), NAMESPACE, &resource);
    let nudge = json!({"metadata": {"annotations": {"kcp-keeper.test/ca": rotation.new_key_id}}});
    api.patch(layout::KUBECONFIG, &PatchParams::default(), &Patch::Merge(&nudge)).await?;
    let new = certificates(&rotation.new);
    testbed::eventually(Duration::from_secs(180), "the seed's kubeconfig rendered with the new CA", || async {
        let kubeconfig = secret_text(client, NAMESPACE, layout::KUBECONFIG_SECRET, "kubeconfig").await?;
        let doc: Value = serde_yaml::from_str(&kubeconfig).ok()?;
        let data = doc["clusters"][0]["cluster"]["certificate-authority-data"].as_str()?;
        let pem: k8s_openapi::ByteString = serde_json::from_value(json!(data)).ok()?;
        let held = certificates(&String::from_utf8(pem.0).ok()?);
        new.iter().all(|c| held.contains(c)).then_some(())
    })
    .await;
    Ok(())
}
