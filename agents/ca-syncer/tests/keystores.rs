//! JKS and PKCS#12 trust stores (`additionalFormats`), read back by the real tools Java and OpenSSL users have:
//! `keytool -list -rfc` and `openssl pkcs12 -nokeys`. Each read-back is compared with the bundle by SHA-256
//! fingerprint, so a store that loads but lost or changed a certificate fails.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use ca_syncer::certs::{EmptyPolicy, parse_certificates};
use ca_syncer::keystore::{self, Format};
use common::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use sha2::{Digest, Sha256};
use testbed::agent_process::{AgentProcess, run_to_completion};
use testbed::certs::Ca;
use testbed::{ControlPlane, eventually};

/// The SHA-256 fingerprints (lowercase hex) of every certificate block in `text` (the tools print other lines
/// around them).
fn fingerprints(text: &[u8]) -> Result<BTreeSet<String>> {
    let blocks = pem::parse_many(text)?;
    Ok(blocks.iter().filter(|b| b.tag() == "CERTIFICATE").map(|b| hex::encode(Sha256::digest(b.contents()))).collect())
}

fn run(command: &mut Command) -> Result<Vec<u8>> {
    let out = command.output().with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        bail!("{command:?}: {}\n{stdout}{stderr}", out.status);
    }
    Ok(out.stdout)
}

/// What `keytool` lists of the store at `path` (its certificates as PEM), as fingerprints.
fn keytool(path: &Path, store_type: &str, password: &str) -> Result<BTreeSet<String>> {
    let listed = run(Command::new("keytool")
        .args(["-list", "-rfc", "-storetype", store_type, "-storepass", password, "-keystore"])
        .arg(path))?;
    fingerprints(&listed)
}

/// How many entries `keytool` lists as trusted certificates (what a Java TrustManager takes as anchors).
fn trusted_entries(path: &Path, store_type: &str, password: &str) -> Result<usize> {
    let listed = run(Command::new("keytool")
        .args(["-list", "-storetype", store_type, "-storepass", password, "-keystore"])
        .arg(path))?;
    Ok(String::from_utf8_lossy(&listed).matches("trustedCertEntry").count())
}

/// What `openssl pkcs12` reads of the store at `path`, as fingerprints (the MAC is verified when there is one).
fn openssl(path: &Path, password: &str, extra: &[&str]) -> Result<BTreeSet<String>> {
    let pass = format!("pass:{password}");
    let read =
        run(Command::new("openssl").args(["pkcs12", "-nokeys", "-passin", &pass]).args(extra).arg("-in").arg(path))?;
    fingerprints(&read)
}

#[test]
fn the_encoded_stores_read_back_through_keytool_and_openssl_with_every_certificate_and_a_wrong_password_fails()
-> Result<()> {
    let dir = tempfile::tempdir()?;
    let pem = [Ca::new("kcp-root", YEAR)?.cert_pem(), Ca::new("kcp-shard-é", YEAR)?.cert_pem()].concat();
    let certs = parse_certificates(pem.as_bytes(), EmptyPolicy::Reject)?;
    let expected = fingerprints(pem.as_bytes())?;
    let write = |name: &str, bytes: Vec<u8>| -> Result<std::path::PathBuf> {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes)?;
        Ok(path)
    };

    let jks = write("t.jks", keystore::encode(Format::Jks, &certs, "changeit"))?;
    assert_eq!(keytool(&jks, "JKS", "changeit")?, expected, "JKS through keytool");
    let err = keytool(&jks, "JKS", "wrong-pass").expect_err("a JKS digest under another password");
    assert!(err.to_string().contains("password was incorrect"), "{err}");
    assert_eq!(trusted_entries(&jks, "JKS", "changeit")?, 2);

    let p12 = write("t.p12", keystore::encode(Format::Pkcs12, &certs, "s3cret-pass"))?;
    assert_eq!(keytool(&p12, "PKCS12", "s3cret-pass")?, expected, "PKCS#12 through keytool");
    assert!(keytool(&p12, "PKCS12", "wrong-pass").is_err(), "keytool checks the MAC");
    assert_eq!(openssl(&p12, "s3cret-pass", &[])?, expected, "PKCS#12 through openssl");
    assert!(openssl(&p12, "wrong-pass", &[]).is_err(), "the MAC fails under another password");

    let open = write("open.p12", keystore::encode(Format::Pkcs12, &certs, ""))?;
    assert_eq!(keytool(&open, "PKCS12", "any-password")?, expected, "passwordless PKCS#12 through keytool");
    assert_eq!(openssl(&open, "", &[])?, expected, "passwordless PKCS#12 through openssl");
    for (store, password) in [(&p12, "s3cret-pass"), (&open, "any-password")] {
        assert_eq!(trusted_entries(store, "PKCS12", password)?, 2, "Java takes every bag as a trust anchor");
    }
    Ok(())
}

const BUNDLE: &str = "java";
const WRITES: &str = "ca_syncer_target_writes_total{bundle=\"java\"}";
const PASSWORD_ERRORS: &str = "ca_syncer_reconcile_errors_total{reason=\"password_unusable\"}";

/// The agent's writes to the bundle's targets; the series exists from the first write on, so none is 0.
async fn writes(agent: &AgentProcess) -> f64 {
    agent.metric(WRITES).await.unwrap_or(0.0)
}

/// The `resourceVersion`s of the two targets: any write that changed them changes these.
async fn versions(client: &kube::Client, ns: &str) -> Result<(Option<String>, Option<String>)> {
    let secret = Api::<Secret>::namespaced(client.clone(), ns).get("kcp-ca").await?;
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns).get("kcp-ca").await?;
    Ok((secret.metadata.resource_version, cm.metadata.resource_version))
}

/// Waits for `cycles` more successful passes of the bundle (the 1s resync runs them even when nothing changes).
async fn settle(agent: &AgentProcess, cycles: usize) {
    let series = "ca_syncer_last_sync_timestamp_seconds{bundle=\"java\"}";
    let mut last = wait_for_metric(agent, series, "a synced bundle", |v| v > 0.0).await;
    for _ in 0..cycles {
        last = wait_for_metric(agent, series, "another cycle", |v| v > last).await;
    }
}

/// The trust stores the two targets hold now: (Secret's JKS, Secret's PKCS#12, ConfigMap's PKCS#12, ConfigMap's
/// JKS), once all four exist.
async fn stores(client: &kube::Client, ns: &str) -> Option<[Vec<u8>; 4]> {
    let secret = Api::<Secret>::namespaced(client.clone(), ns).get_opt("kcp-ca").await.ok()??;
    let data = secret.data?;
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns).get_opt("kcp-ca").await.ok()??;
    let binary = cm.binary_data?;
    let get = |map: &std::collections::BTreeMap<String, ByteString>, k: &str| map.get(k).map(|v| v.0.clone());
    Some([
        get(&data, "truststore.jks")?,
        get(&data, "truststore.p12")?,
        get(&binary, "truststore.p12")?,
        get(&binary, "truststore.jks")?,
    ])
}

fn password_secret(password: &str) -> Secret {
    secret("store-password", &[("password", password)])
}

#[tokio::test]
async fn secret_and_config_map_targets_carry_jks_and_pkcs12_stores_keytool_and_openssl_read_and_an_idle_pass_or_a_restart_writes_nothing()
-> Result<()> {
    let bed = ControlPlane::start().await?;
    let (src, dst, agent_ns) = (bed.namespace().await?, bed.namespace().await?, bed.namespace().await?);
    let client = bed.client();
    let pem = [Ca::new("kcp-root", YEAR)?.cert_pem(), Ca::new("kcp-shard", YEAR)?.cert_pem()].concat();
    let expected = fingerprints(pem.as_bytes())?;
    let sources = Api::<Secret>::namespaced(client.clone(), &src);
    sources.create(&PostParams::default(), &secret("source", &[("ca.crt", &pem)])).await?;
    // Markers the logs, Events and metrics are searched for: a password must never appear in them.
    let (first_password, next_password) = ("first-p12-marker-5d1c", "next-p12-marker-9e4b");
    sources.create(&PostParams::default(), &password_secret(first_password)).await?;
    let config = format!(
        "resyncInterval: 1s\nbundles:\n- name: {BUNDLE}\n  sources:\n  - secret: {{namespace: {src}, name: source, key: ca.crt}}\n  targets:\n  - secret:\n      namespace: {dst}\n      name: kcp-ca\n      key: ca.crt\n      additionalFormats:\n        jks: {{key: truststore.jks}}\n        pkcs12: {{key: truststore.p12, passwordSecretRef: {{namespace: {src}, name: store-password, key: password}}}}\n  - configMap:\n      namespace: {dst}\n      name: kcp-ca\n      key: ca.crt\n      additionalFormats:\n        pkcs12: {{key: truststore.p12}}\n        jks: {{key: truststore.jks, password: inline-jks-pass}}\n"
    );
    let path = write_config(&bed, &config)?;
    // With only the Roles `ca-syncer rbac` renders: the password Secret is read by name like a source.
    let args =
        ["rbac", "--config", &path.display().to_string(), "--namespace", &agent_ns, "--service-account", "ca-syncer"];
    let (code, rbac, stderr) = run_to_completion(Path::new(BINARY), &args)?;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(rbac.contains("store-password"), "{rbac}");
    apply_yaml(&client, &rbac).await?;
    let (kubeconfig, _) = bed.service_account_kubeconfig(&agent_ns, "ca-syncer").await?;
    let start = || agent(&bed, &path, &agent_ns).kubeconfig(&kubeconfig).spawn();
    let mut first = start()?;
    first.wait_ready(WAIT).await?;
    let [secret_jks, secret_p12, cm_p12, cm_jks] =
        eventually(WAIT, "the four trust stores", || stores(&client, &dst)).await;

    let dir = tempfile::tempdir()?;
    let file = |name: &str, bytes: &[u8]| -> Result<std::path::PathBuf> {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes)?;
        Ok(path)
    };
    let (secret_jks, secret_p12) = (file("s.jks", &secret_jks)?, file("s.p12", &secret_p12)?);
    let (cm_p12, cm_jks) = (file("c.p12", &cm_p12)?, file("c.jks", &cm_jks)?);
    assert_eq!(keytool(&secret_jks, "JKS", "changeit")?, expected, "JKS with trust-manager's default password");
    assert_eq!(keytool(&secret_p12, "PKCS12", first_password)?, expected, "PKCS#12 with the Secret's password");
    assert_eq!(openssl(&secret_p12, first_password, &[])?, expected);
    assert_eq!(keytool(&cm_p12, "PKCS12", "anything")?, expected, "passwordless PKCS#12 from binaryData");
    assert_eq!(openssl(&cm_p12, "", &[])?, expected);
    assert_eq!(keytool(&cm_jks, "JKS", "inline-jks-pass")?, expected, "JKS with the configured password");
    let pem_key = Api::<ConfigMap>::namespaced(client.clone(), &dst).get("kcp-ca").await?.data.unwrap_or_default();
    assert_eq!(fingerprints(pem_key.get("ca.crt").map(String::as_bytes).unwrap_or_default())?, expected);

    // Idle passes write nothing; neither does a new process rendering everything again (a fresh encoder memo).
    let written = writes(&first).await;
    assert_eq!(written, 2.0, "one write per target");
    settle(&first, 3).await;
    assert_eq!(writes(&first).await, written, "idle passes");
    let before = versions(&client, &dst).await?;
    first.terminate(WAIT);
    let mut second = start()?;
    second.wait_ready(WAIT).await?;
    settle(&second, 3).await;
    assert_eq!(writes(&second).await, 0.0, "a restart renders the same bytes");
    assert_eq!(versions(&client, &dst).await?, before, "neither target changed");

    // A new password in the Secret re-encodes that store (trust-manager#433), and only the target holding it.
    sources.replace("store-password", &PostParams::default(), &password_secret(next_password)).await?;
    eventually(WAIT, "the PKCS#12 store under the new password", || async {
        let [_, p12, ..] = stores(&client, &dst).await?;
        let path = file("s2.p12", &p12).ok()?;
        keytool(&path, "PKCS12", next_password).ok().filter(|f| *f == expected)
    })
    .await;
    settle(&second, 2).await;
    assert_eq!(writes(&second).await, 1.0, "the one target whose store changed");

    // A password the agent refuses: nothing is written, the error names the Secret and key, never the value.
    let refused = format!("refused-marker-{}", "x".repeat(150));
    let patch = json!({"stringData": {"password": refused}});
    sources.patch("store-password", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    wait_for_metric(&second, PASSWORD_ERRORS, "a refused password", |v| v >= 1.0).await;
    let events = eventually(WAIT, "the PasswordUnusable Event", || async {
        let listed = Api::<Event>::namespaced(client.clone(), &agent_ns).list(&Default::default()).await.ok()?;
        let events: Vec<(String, String)> =
            listed.items.into_iter().map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default())).collect();
        events.iter().any(|(reason, _)| reason == "PasswordUnusable").then_some(events)
    })
    .await;
    let note =
        events.iter().find(|(reason, _)| reason == "PasswordUnusable").map(|(_, n)| n.clone()).unwrap_or_default();
    assert!(note.contains(&format!("Secret {src}/store-password key password: must be at most 128")), "{note}");
    assert_eq!(writes(&second).await, 1.0, "nothing written while the password is refused");
    let [_, p12, ..] = stores(&client, &dst).await.context("the stores")?;
    assert_eq!(keytool(&file("s3.p12", &p12)?, "PKCS12", next_password)?, expected, "the last good store stays");

    let logs = [first.process.log(), second.process.log()].concat();
    let metrics = second.metrics().await;
    let notes: String = events.iter().map(|(_, n)| n.as_str()).collect();
    for password in [first_password, next_password, "refused-marker", "inline-jks-pass"] {
        assert!(!logs.contains(password), "{password} in the agent's log");
        assert!(!metrics.contains(password), "{password} in the metrics");
        assert!(!notes.contains(password), "{password} in an Event");
    }
    Ok(())
}
