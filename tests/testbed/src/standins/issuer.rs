//! The **issuer stand-in**: plays cert-manager's part for Certificates in one namespace. cert-manager's controller
//! does not build here; this follows its API on its real CRD:
//! - a Certificate without its Secret, with condition `Issuing=True` (what `cmctl renew` and kubeconfig-rotator
//!   set), or past its `status.renewalTime` is issued: a new key and certificate from the CA (CN =
//!   `spec.commonName`, O = `spec.subject.organizations`, valid for `spec.duration`);
//! - the Secret `spec.secretName` gets `tls.crt`, `tls.key`, `ca.crt` and `spec.secretTemplate.labels`;
//! - the status gets `Ready=True`, `notBefore`, `notAfter`, `renewalTime` (`spec.renewBefore` before the end,
//!   else at two thirds of the lifetime, as cert-manager) and `revision` + 1, and loses `Issuing`.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{POLL, StandIn, certificate_resource, parse_duration};
use crate::certs::Ca;

pub const FIELD_MANAGER: &str = "cert-manager-stand-in";

#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Re-issue at `status.renewalTime`, as cert-manager does. Off, it plays a cert-manager that failed to renew
    /// on its own: only `Issuing=True` makes it issue.
    pub renew_at_renewal_time: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self { renew_at_renewal_time: true }
    }
}

/// Starts the issuer stand-in for Certificates in `namespace`, signing with `ca` (e.g. `&'static Ca` from the
/// shared kcp bed, or an owner of one that outlives the task).
pub fn spawn<C>(client: kube::Client, namespace: &str, ca: C, settings: Settings) -> StandIn
where
    C: std::borrow::Borrow<Ca> + Send + Sync + 'static,
{
    let certificates: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &certificate_resource());
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client, namespace);
    StandIn(tokio::spawn(async move {
        loop {
            if let Ok(list) = certificates.list(&ListParams::default()).await {
                for cert in list.items {
                    if let Err(e) = reconcile(&certificates, &secrets, &cert, ca.borrow(), settings).await {
                        eprintln!("issuer stand-in: {}: {e:#}", cert.metadata.name.as_deref().unwrap_or("?"));
                    }
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }))
}

async fn reconcile(
    certificates: &Api<DynamicObject>,
    secrets: &Api<k8s_openapi::api::core::v1::Secret>,
    cert: &DynamicObject,
    ca: &Ca,
    settings: Settings,
) -> anyhow::Result<()> {
    let name = cert.metadata.name.clone().unwrap_or_default();
    let spec = &cert.data["spec"];
    let status = &cert.data["status"];
    let secret_name = spec["secretName"].as_str().unwrap_or_default();
    let issuing = conditions(status).iter().any(|c| c["type"] == "Issuing" && c["status"] == "True");
    let now = OffsetDateTime::now_utc();
    let renewal_due = status["renewalTime"]
        .as_str()
        .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
        .is_some_and(|at| settings.renew_at_renewal_time && at <= now);
    let missing = secrets.get_opt(secret_name).await?.is_none_or(|s| s.data.is_none_or(|d| !d.contains_key("tls.crt")));
    if !(missing || issuing || renewal_due) {
        return Ok(());
    }
    let duration = spec["duration"].as_str().and_then(parse_duration).unwrap_or(Duration::from_secs(90 * 24 * 3600));
    let renew_before = spec["renewBefore"].as_str().and_then(parse_duration).unwrap_or(duration / 3);
    let orgs: Vec<&str> =
        spec["subject"]["organizations"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let issued = ca.issue_client(spec["commonName"].as_str().unwrap_or_default(), &orgs, duration)?;
    let labels: BTreeMap<String, String> =
        serde_json::from_value(spec["secretTemplate"]["labels"].clone()).unwrap_or_default();
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": secret_name, "labels": labels},
        "data": {
            "tls.crt": B64.encode(&issued.cert_pem),
            "tls.key": B64.encode(&issued.key_pem),
            "ca.crt": B64.encode(ca.cert_pem()),
        },
    });
    secrets.patch(secret_name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&secret)).await?;
    let not_before = issued.not_after - time::Duration::try_from(duration)?;
    let renewal = issued.not_after - time::Duration::try_from(renew_before)?;
    let ts = |t: OffsetDateTime| t.replace_nanosecond(0).unwrap_or(t).format(&Rfc3339).unwrap_or_default();
    let revision = status["revision"].as_i64().unwrap_or(0) + 1;
    let patch = json!({"status": {
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "Ready",
            "message": "Certificate is up to date and has not expired (issuer stand-in)",
            "lastTransitionTime": ts(now), "observedGeneration": cert.metadata.generation,
        }],
        "notBefore": ts(not_before),
        "notAfter": ts(issued.not_after),
        "renewalTime": ts(renewal),
        "revision": revision,
    }});
    certificates.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    eprintln!("issuer stand-in: issued {name} revision {revision}, valid until {}", ts(issued.not_after));
    Ok(())
}

fn conditions(status: &Value) -> Vec<Value> {
    status["conditions"].as_array().cloned().unwrap_or_default()
}
