//! Sources by label selector, against the test bed's real apiserver, with only the Roles `ca-syncer rbac`
//! renders: a labelled ConfigMap (every key) and labelled Secrets (one key) feed the bundle, an object gaining
//! or losing the label joins or leaves it, the watches list by label in the named namespaces only, and a
//! selected object holding a private key is refused while the target keeps what it holds.

mod common;

use std::path::Path;

use anyhow::Result;
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use testbed::ControlPlane;
use testbed::agent_process::{AgentProcess, run_to_completion};
use testbed::certs::Ca;

const LABEL: &str = "kcp-keeper.io/ca-source";

struct Setup {
    bed: ControlPlane,
    /// Where the selected sources live, and the target's namespace.
    src: String,
    dst: String,
    user: String,
    kubeconfig: std::path::PathBuf,
    agent: AgentProcess,
}

fn labelled<T: Default>(name: &str, value: &str, meta: impl FnOnce(ObjectMeta) -> T) -> T {
    meta(ObjectMeta {
        name: Some(name.into()),
        labels: Some([(LABEL.to_string(), value.to_string())].into()),
        ..Default::default()
    })
}

fn config_map(name: &str, label: &str, data: &[(&str, &str)]) -> ConfigMap {
    let mut cm = labelled(name, label, |metadata| ConfigMap { metadata, ..Default::default() });
    cm.data = Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    cm
}

fn labelled_secret(name: &str, label: &str, data: &[(&str, &str)]) -> Secret {
    let mut s = secret(name, data);
    s.metadata.labels = Some([(LABEL.to_string(), label.to_string())].into());
    s
}

/// The bed, the agent with the RBAC its `rbac` one-shot renders for a bundle of a ConfigMap selector (every
/// key) and a Secret selector (key `ca.crt`) in `src`, written to Secret `dst/kcp-ca`. `rotationGrace: 0s`: a CA
/// that leaves the sources leaves the bundle at once, so an object losing its label shows in the target.
async fn setup(configmaps: &[ConfigMap], secrets: &[Secret]) -> Result<Setup> {
    let bed = ControlPlane::start().await?;
    let (agent_ns, src, dst) = (bed.namespace().await?, bed.namespace().await?, bed.namespace().await?);
    for cm in configmaps {
        Api::<ConfigMap>::namespaced(bed.client(), &src).create(&PostParams::default(), cm).await?;
    }
    for s in secrets {
        Api::<Secret>::namespaced(bed.client(), &src).create(&PostParams::default(), s).await?;
    }
    let config = write_config(
        &bed,
        &format!(
            "resyncInterval: 1s\nbundles:\n- name: kcp\n  sources:\n  - configMap: {{namespace: {src}, selector: {{matchLabels: {{{LABEL}: bundle}}}}, includeAllKeys: true}}\n  - secret: {{namespace: {src}, selector: {{matchExpressions: [{{key: {LABEL}, operator: In, values: [bundle]}}]}}, key: ca.crt}}\n  targets:\n  - secret: {{namespace: {dst}, name: kcp-ca, key: ca.crt}}\n  rotationGrace: 0s\n"
        ),
    )?;
    let args =
        ["rbac", "--config", &config.display().to_string(), "--namespace", &agent_ns, "--service-account", "ca-syncer"];
    let (code, rbac, stderr) = run_to_completion(Path::new(BINARY), &args)?;
    assert_eq!(code, Some(0), "{stderr}");
    apply_yaml(&bed.client(), &rbac).await?;
    let (kubeconfig, user) = bed.service_account_kubeconfig(&agent_ns, "ca-syncer").await?;
    let agent = agent(&bed, &config, &agent_ns).kubeconfig(&kubeconfig).spawn()?;
    Ok(Setup { bed, src, dst, user, kubeconfig, agent })
}

/// The target's certificates, once it holds `count` of them.
async fn bundle_with(s: &Setup, count: usize, what: &str) -> String {
    let client = s.bed.client();
    testbed::eventually(WAIT, what, || async {
        key(&client, &s.dst, "kcp-ca", "ca.crt").await.filter(|pem| pem.matches("BEGIN CERTIFICATE").count() == count)
    })
    .await
}

async fn set_label<K>(api: &Api<K>, name: &str, value: Option<&str>) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {LABEL: value}}}))).await?;
    Ok(())
}

#[tokio::test]
async fn selected_configmaps_and_secrets_follow_their_label_with_only_the_rendered_roles() -> Result<()> {
    let (a, b, c, d, e) =
        (Ca::new("a", YEAR)?, Ca::new("b", YEAR)?, Ca::new("c", YEAR)?, Ca::new("d", YEAR)?, Ca::new("e", YEAR)?);
    let configmaps = [
        // Every key of a selected ConfigMap.
        config_map("roots", "bundle", &[("a.pem", &a.cert_pem()), ("b.pem", &b.cert_pem())]),
        config_map("other", "elsewhere", &[("e.pem", &e.cert_pem())]),
    ];
    // Only `ca.crt` of a selected Secret: its other keys are never read.
    let secrets = [
        labelled_secret("issuer", "bundle", &[("ca.crt", &c.cert_pem()), ("notes", "not a certificate")]),
        labelled_secret("later", "not-yet", &[("ca.crt", &d.cert_pem())]),
    ];
    let mut s = setup(&configmaps, &secrets).await?;
    s.agent.wait_ready(WAIT).await?;
    let first = bundle_with(&s, 3, "the two selected objects' certificates").await;
    for ca in [&a, &b, &c] {
        assert!(first.contains(ca.cert_pem().trim()), "a selected certificate is in the bundle");
    }
    assert!(!first.contains(d.cert_pem().trim()) && !first.contains(e.cert_pem().trim()));

    // A Secret gaining the label joins the bundle.
    let secrets = Api::<Secret>::namespaced(s.bed.client(), &s.src);
    set_label(&secrets, "later", Some("bundle")).await?;
    let joined = bundle_with(&s, 4, "the Secret that gained the label").await;
    assert!(joined.contains(d.cert_pem().trim()));
    // The ConfigMap losing its label leaves it, with both of its CAs.
    let cms = Api::<ConfigMap>::namespaced(s.bed.client(), &s.src);
    set_label(&cms, "roots", None).await?;
    let left = bundle_with(&s, 2, "the ConfigMap that lost the label gone").await;
    assert!(left.contains(c.cert_pem().trim()) && left.contains(d.cert_pem().trim()), "the Secrets' CAs stay");

    // The agent listed and watched by label, only in the source namespace, and was refused nothing.
    let requests = testbed::audit::by_user(&s.bed.apiserver.audit_log, &s.user)?;
    let by_label: Vec<_> = requests
        .iter()
        .filter(|r| matches!(r.resource.as_str(), "secrets" | "configmaps") && r.uri.contains("labelSelector="))
        .collect();
    assert!(by_label.iter().any(|r| r.resource == "secrets" && r.verb == "watch"), "{by_label:?}");
    assert!(by_label.iter().all(|r| r.namespace.as_deref() == Some(s.src.as_str())), "{by_label:?}");
    let refused: Vec<_> = requests.iter().filter(|r| r.code == Some(403)).collect();
    assert!(refused.is_empty(), "the agent was refused: {refused:?}");
    // Its token may list Secrets in the source namespace, but get none there, and list none elsewhere.
    let token = testbed::apiserver::client_from_file(&s.kubeconfig).await?;
    let code = |r: kube::Result<_>| match r {
        Ok::<_, _>(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(e) => panic!("{e}"),
    };
    let src = Api::<Secret>::namespaced(token.clone(), &s.src);
    assert_eq!(code(src.list(&ListParams::default().labels(&format!("{LABEL}=bundle"))).await.map(|_| ())), 200);
    assert_eq!(code(src.get("issuer").await.map(|_| ())), 403, "no get in the source namespace");
    let dst = Api::<Secret>::namespaced(token, &s.dst);
    assert_eq!(code(dst.list(&ListParams::default()).await.map(|_| ())), 403, "no list in the target namespace");
    assert!(s.agent.terminate(std::time::Duration::from_secs(10)).is_some_and(|st| st.success()));
    Ok(())
}

#[tokio::test]
async fn a_selected_private_key_or_a_selection_left_empty_is_refused_and_the_target_keeps_its_bundle() -> Result<()> {
    let ca = Ca::new("kept", YEAR)?;
    let configmaps = [config_map("roots", "bundle", &[("ca.pem", &ca.cert_pem())])];
    let mut s = setup(&configmaps, &[]).await?;
    s.agent.wait_ready(WAIT).await?;
    // No Secret selected yet: the Secret source alone would be empty, but the ConfigMap's certificate counts.
    let before = bundle_with(&s, 1, "the ConfigMap's certificate").await;

    // A Secret labelled into the selection whose ca.crt carries a private key after its certificate.
    let other = Ca::new("other", YEAR)?;
    let with_key = format!("{}{}", other.cert_pem(), other.key_pem());
    Api::<Secret>::namespaced(s.bed.client(), &s.src)
        .create(&PostParams::default(), &labelled_secret("pasted", "bundle", &[("ca.crt", &with_key)]))
        .await?;
    let series = "ca_syncer_source_errors_total{bundle=\"kcp\",reason=\"private_key\"}";
    wait_for_metric(&s.agent, series, "the private key refused", |v| v > 0.0).await;
    assert_eq!(key(&s.bed.client(), &s.dst, "kcp-ca", "ca.crt").await.as_deref(), Some(before.as_str()));
    // The Event names the object and key, never the content.
    let events = Api::<Event>::namespaced(s.bed.client(), &s.src);
    let event = testbed::eventually(WAIT, "a SourceRejected Event on the Secret at fault", || async {
        let listed = events.list(&ListParams::default()).await.ok()?;
        listed.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("SourceRejected")
                && e.regarding.as_ref().is_some_and(|r| r.name.as_deref() == Some("pasted"))
        })
    })
    .await;
    let note = event.note.unwrap_or_default();
    assert!(note.contains("pasted") && note.contains("ca.crt"), "{note}");
    assert!(!note.contains(other.key_pem().lines().nth(1).unwrap_or_default()), "{note}");

    // Every selection matching nothing would empty the bundle: refused too, and the target still holds it.
    Api::<Secret>::namespaced(s.bed.client(), &s.src).delete("pasted", &Default::default()).await?;
    set_label(&Api::<ConfigMap>::namespaced(s.bed.client(), &s.src), "roots", None).await?;
    let series = "ca_syncer_source_errors_total{bundle=\"kcp\",reason=\"missing\"}";
    wait_for_metric(&s.agent, series, "an empty selection refused", |v| v > 0.0).await;
    assert_eq!(key(&s.bed.client(), &s.dst, "kcp-ca", "ca.crt").await.as_deref(), Some(before.as_str()));
    assert!(s.agent.terminate(std::time::Duration::from_secs(10)).is_some_and(|st| st.success()));
    Ok(())
}
