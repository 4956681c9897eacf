//! The APIExportEndpointSlice check against real kcp (the test bed: root and alpha shards behind a front proxy,
//! certificates laid out as kcp-operator lays them out) and a real kube-apiserver holding the kcp kubeconfig in a
//! Secret: an APIExport with an endpoint slice in a workspace of its own; the URL kcp advertises resolves and
//! verifies with the server CA (ok), and FAILs with a CA bundle that does not verify it; a URL on a name that
//! does not resolve, or on an address nobody answers, FAILs.

use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Secret;
use kcp_keeper_doctor::options::{CaSource, KeyRef, Options};
use kcp_keeper_doctor::verdict::{Level, Report};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::json;

static BED: OnceLock<Result<testbed::ControlPlane, String>> = OnceLock::new();

fn bed() -> &'static testbed::ControlPlane {
    testbed::shared_for_binary(&BED, "control plane", testbed::ControlPlane::start)
}

fn kcp_resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("apis.kcp.io", "v1alpha1", kind))
}

/// A workspace on the root shard with an APIExport, a binding of it (kcp advertises an endpoint per shard where
/// the export is bound) and an endpoint slice of it, until the slice advertises a URL: (workspace path, URL).
async fn exported(kcp: &testbed::kcp::Kcp) -> Result<(String, String)> {
    let ws = kcp.workspace("root").await?;
    let client = kcp.admin_client(&ws.path).await?;
    let name = "widgets.doctor.example";
    let objects = [
        ("APIExport", json!({"metadata": {"name": name}, "spec": {}})),
        (
            "APIBinding",
            json!({"metadata": {"name": "widgets"}, "spec": {"reference": {"export": {"path": ws.path, "name": name}}}}),
        ),
        (
            "APIExportEndpointSlice",
            json!({"metadata": {"name": "widgets"}, "spec": {"export": {"path": ws.path, "name": name}}}),
        ),
    ];
    for (kind, body) in objects {
        let resource = kcp_resource(kind);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let mut object = DynamicObject::new(body["metadata"]["name"].as_str().unwrap(), &resource);
        object.data = json!({"spec": body["spec"]});
        let params = PostParams::default();
        // kcp checks the right to bind against an authorization cache that learns of the export just created a
        // moment later (seen in a full run: "no permission to bind to export"): a 403 is retried, nothing else.
        testbed::eventually_seen(Duration::from_secs(60), &format!("the {kind} created"), || async {
            match testbed::kcp::retry_bad_gateway(|| api.create(&params, &object)).await {
                Ok(_) => Ok(Ok(())),
                Err(kube::Error::Api(e)) if e.code == 403 && kind == "APIBinding" => Ok(Err(e.message)),
                Err(e) => Err(anyhow::Error::from(e)),
            }
        })
        .await
        .with_context(|| format!("creating the {kind}"))?;
    }
    let slices: Api<DynamicObject> = Api::all_with(client, &kcp_resource("APIExportEndpointSlice"));
    let url = testbed::eventually_seen(Duration::from_secs(60), "the slice advertising a URL", || async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let slice = slices.get("widgets").await?;
        Ok(match slice.data["status"]["endpoints"][0]["url"].as_str() {
            Some(url) => Ok(url.to_string()),
            None => Err(slice.data["status"].to_string()),
        })
    })
    .await?;
    Ok((ws.path, url))
}

/// A Secret in `ns` with one key.
async fn secret(client: &kube::Client, ns: &str, name: &str, key: &str, value: &str) -> Result<KeyRef> {
    let s: Secret = serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {key: value}}))?;
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::apply("doctor-test").force(), &Patch::Apply(&s))
        .await?;
    Ok(KeyRef { namespace: ns.into(), name: name.into(), key: key.into() })
}

fn lines(report: &Report) -> Vec<(String, Level, String)> {
    report.of("endpoint-slices").into_iter().map(|v| (v.subject.clone(), v.result, v.saw.clone())).collect()
}

#[tokio::test]
async fn an_endpoint_slice_url_kcp_advertises_is_ok_with_the_kcp_ca_and_fails_with_a_ca_that_does_not_verify_it()
-> Result<()> {
    let kcp = testbed::kcp::shared();
    let _logs = kcp.logs_on_failure();
    let bed = bed();
    let client = bed.apiserver.admin_client().await?;
    // The bed's own client belongs to the runtime it started on: a namespace through ours.
    let ns = format!("doctor-slices-{:08x}", std::process::id());
    let namespace: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    Api::all(client.clone()).create(&PostParams::default(), &namespace).await?;
    let (workspace, url) = exported(kcp).await?;
    // The kcp kubeconfig as kcp-operator renders one, in a Secret of the cluster the doctor reads.
    let kubeconfig = secret(&client, &ns, "kcp-admin", "kubeconfig", &kcp.admin_kubeconfig(&workspace)?).await?;
    let options =
        Options { namespace: ns.clone(), verify: false, kcp_kubeconfig: Some(kubeconfig), ..Options::default() };

    let report = kcp_keeper_doctor::run(&client, &options).await;
    eprint!("{}", report.text());
    // kcp also makes a slice named after the export by itself: one line per slice and URL, all ok.
    let got = lines(&report);
    assert!(got.iter().any(|(subject, _, _)| *subject == format!("apiexportendpointslice/widgets {url}")), "{got:#?}");
    assert!(got.iter().all(|(_, level, _)| *level == Level::Ok), "{got:#?}");

    // A CA bundle that did not issue kcp's serving certificates: the same URL FAILs, naming TLS.
    let other = testbed::certs::Ca::new("not kcp's CA", Duration::from_secs(86400))?;
    let wrong = secret(&client, &ns, "wrong-ca", "ca.crt", &other.cert_pem()).await?;
    let report =
        kcp_keeper_doctor::run(&client, &Options { endpoint_ca: Some(CaSource::Secret(wrong)), ..options.clone() })
            .await;
    eprint!("{}", report.text());
    let got = lines(&report);
    assert!(got.iter().any(|(subject, _, _)| *subject == format!("apiexportendpointslice/widgets {url}")), "{got:#?}");
    for (_, level, saw) in &got {
        assert_eq!(*level, Level::Fail, "{got:#?}");
        assert!(saw.contains("TLS does not verify"), "{saw}");
    }

    // A kubeconfig Secret that is not a kubeconfig: one FAIL line, quoting none of it.
    let junk = secret(&client, &ns, "kcp-junk", "kubeconfig", "token: [SECRET-TOKEN").await?;
    let report = kcp_keeper_doctor::run(&client, &Options { kcp_kubeconfig: Some(junk), ..options }).await;
    let got = lines(&report);
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(got[0].1, Level::Fail);
    assert!(got[0].2.contains("does not parse") && !got[0].2.contains("SECRET"), "{}", got[0].2);
    Ok(())
}

#[tokio::test]
async fn an_advertised_url_on_a_name_that_does_not_resolve_or_an_address_nobody_answers_fails() -> Result<()> {
    let kcp = testbed::kcp::shared();
    let ca = kcp.pki.server_ca_bundle();
    // The front proxy verifies (the probe itself works against the real kcp)...
    let ok =
        kcp_keeper_doctor::endpoints::probe(&format!("{}/services/apiexport/x/y", kcp.front_proxy.url), ca.as_bytes())
            .await;
    assert!(ok.is_ok(), "{ok:?}");
    // ...a name inside someone else's cluster (seed 001: "https://kcp:6443/...") does not resolve here...
    let e = kcp_keeper_doctor::endpoints::probe("https://kcp.invalid:6443/services/apiexport/x/y", ca.as_bytes())
        .await
        .unwrap_err();
    assert!(e.contains("does not resolve"), "{e}");
    // ...and a port nobody listens on refuses.
    let closed = testbed::process::free_port()?;
    let e =
        kcp_keeper_doctor::endpoints::probe(&format!("https://127.0.0.1:{closed}/x"), ca.as_bytes()).await.unwrap_err();
    assert!(e.contains("refuses"), "{e}");
    Ok(())
}
