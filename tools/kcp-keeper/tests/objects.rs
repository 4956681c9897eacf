//! The object rules against a real kube-apiserver serving the kcp-operator's CRDs (v0.9.0, as the seed layout
//! runs it): the seed layout's own RootShard, Shard, FrontProxy and etcd StatefulSets are applied in a namespace
//! of their own, then each rule is broken on purpose (its line turns FAIL or warn) and put back (ok again).

use std::sync::OnceLock;

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kcp_keeper_doctor::options::{CaSource, HubOidc, KeyRef, Options};
use kcp_keeper_doctor::verdict::{Level, Report};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};
use testbed::seed::layout;

static BED: OnceLock<Result<testbed::ControlPlane, String>> = OnceLock::new();

fn bed() -> &'static testbed::ControlPlane {
    testbed::shared_for_binary(&BED, "control plane", testbed::ControlPlane::start)
}

fn resource(object: &Value) -> ApiResource {
    let (group, version) =
        object["apiVersion"].as_str().unwrap().rsplit_once('/').unwrap_or(("", object["apiVersion"].as_str().unwrap()));
    let kind = object["kind"].as_str().unwrap();
    let plural = match kind {
        "FrontProxy" => "frontproxies".to_string(),
        k => format!("{}s", k.to_ascii_lowercase()),
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural)
}

/// Server-side apply of `object` (its namespace set to `ns`), owning every field it names.
async fn apply(client: &kube::Client, ns: &str, mut object: Value) -> Result<()> {
    object["metadata"]["namespace"] = json!(ns);
    let name = object["metadata"]["name"].as_str().context("a name")?.to_string();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource(&object));
    api.patch(&name, &PatchParams::apply("doctor-test").force(), &Patch::Apply(&object))
        .await
        .with_context(|| format!("applying {} {name}", object["kind"]))?;
    Ok(())
}

/// The seed layout's objects with every `kcp-system` (namespace and the etcd member URLs) replaced by `ns`.
fn seed_objects(ns: &str) -> Vec<Value> {
    let mut objects = Vec::new();
    for (shard, members) in layout::ETCD_MEMBERS {
        objects.extend(layout::etcd(shard, members));
    }
    objects.extend([layout::root_shard(), layout::shard(), layout::front_proxy()]);
    objects
        .into_iter()
        .map(|o| serde_json::from_str(&o.to_string().replace(layout::NAMESPACE, ns)).expect("still JSON"))
        .collect()
}

fn rand_suffix() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    h.finish() as u32
}

struct Fixture {
    client: kube::Client,
    ns: String,
}

impl Fixture {
    async fn new() -> Result<Self> {
        let bed = bed();
        let client = bed.apiserver.admin_client().await?;
        // The bed's own client belongs to the runtime it started on: a namespace through ours.
        let ns = format!("doctor-{:08x}", rand_suffix());
        let namespace: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        Api::all(client.clone()).create(&Default::default(), &namespace).await?;
        for object in seed_objects(&ns) {
            apply(&client, &ns, object).await?;
        }
        Ok(Self { client, ns })
    }

    fn options(&self) -> Options {
        Options { namespace: self.ns.clone(), verify: false, ..Options::default() }
    }

    async fn doctor(&self, options: &Options) -> Report {
        let report = kcp_keeper_doctor::run(&self.client, options).await;
        eprint!("{}", report.text());
        report
    }

    /// The result of `check` on `subject`.
    async fn result(&self, options: &Options, check: &str, subject: &str) -> Level {
        let report = self.doctor(options).await;
        let found: Vec<_> = report.of(check).into_iter().filter(|v| v.subject == subject).collect();
        assert_eq!(found.len(), 1, "one {check} line for {subject}: {}", report.text());
        found[0].result
    }

    /// Merge-patches the spec of a kcp-operator object (`null` removes a field).
    async fn patch(&self, template: Value, spec: Value) -> Result<()> {
        let name = template["metadata"]["name"].as_str().unwrap().to_string();
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.ns, &resource(&template));
        api.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": spec}))).await?;
        Ok(())
    }
}

#[tokio::test]
async fn the_seed_layouts_objects_pass_every_object_rule_and_warn_on_cache_apis_the_etcd_spread_and_the_virtual_workspace_url()
-> Result<()> {
    let f = Fixture::new().await?;
    let report = f.doctor(&f.options()).await;
    for check in ["pinned-images", "proxy-image", "lockstep-versions", "shard-base-url", "oidc-hub"] {
        let lines = report.of(check);
        assert!(!lines.is_empty(), "no {check} line: {}", report.text());
        assert!(lines.iter().all(|v| v.result == Level::Ok), "{check}: {}", report.text());
    }
    // The seed names three components: the root shard, alpha and the front proxy.
    assert_eq!(report.of("pinned-images").len(), 3, "{}", report.text());
    // Neither shard turns CacheAPIs on, and neither etcd is spread across zones (the root's has 3 members,
    // alpha's one): warnings, not failures.
    assert!(report.of("cache-apis").iter().all(|v| v.result == Level::Warn), "{}", report.text());
    let spread = report.of("etcd-spread");
    assert_eq!(spread.len(), 2, "{}", report.text());
    assert!(spread.iter().all(|v| v.result == Level::Warn), "{}", report.text());
    // Both shards' server certificates carry a public name, and neither sets --shard-virtual-workspace-url.
    let vw = report.of("shard-virtual-workspace-url");
    assert_eq!(vw.len(), 2, "{}", report.text());
    assert!(vw.iter().all(|v| v.result == Level::Warn), "{}", report.text());
    assert_eq!(report.worst(), Level::Warn);
    Ok(())
}

#[tokio::test]
async fn an_unpinned_root_shard_proxy_image_fails_pinned_images_and_proxy_image_and_pinning_it_again_is_ok()
-> Result<()> {
    let f = Fixture::new().await?;
    let o = f.options();
    f.patch(layout::root_shard(), json!({"proxy": {"image": null}})).await?;
    assert_eq!(f.result(&o, "pinned-images", "rootshard/root").await, Level::Fail);
    assert_eq!(f.result(&o, "proxy-image", "rootshard/root").await, Level::Fail);
    assert_eq!(f.doctor(&o).await.worst(), Level::Fail);
    apply(&f.client, &f.ns, seed_objects(&f.ns).into_iter().find(|o| o["kind"] == "RootShard").unwrap()).await?;
    assert_eq!(f.result(&o, "pinned-images", "rootshard/root").await, Level::Ok);
    assert_eq!(f.result(&o, "proxy-image", "rootshard/root").await, Level::Ok);
    Ok(())
}

#[tokio::test]
async fn a_shard_on_an_unpinned_or_other_kcp_version_fails_or_warns_and_back_on_the_pin_is_ok() -> Result<()> {
    let f = Fixture::new().await?;
    let o = f.options();
    f.patch(layout::shard(), json!({"image": {"tag": null}})).await?;
    assert_eq!(f.result(&o, "pinned-images", "shard/alpha").await, Level::Fail);
    f.patch(layout::shard(), json!({"image": {"tag": "v0.31.0"}})).await?;
    assert_eq!(f.result(&o, "pinned-images", "shard/alpha").await, Level::Ok);
    assert_eq!(f.result(&o, "lockstep-versions", "kcp components").await, Level::Warn);
    f.patch(layout::shard(), json!({"image": {"tag": testbed::seed::images::KCP_TAG}})).await?;
    assert_eq!(f.result(&o, "lockstep-versions", "kcp components").await, Level::Ok);
    Ok(())
}

#[tokio::test]
async fn a_shard_base_url_on_the_public_hostname_fails_in_the_spec_and_in_extra_args_and_removing_it_is_ok()
-> Result<()> {
    let f = Fixture::new().await?;
    let o = f.options();
    let public = format!("https://{}:{}", layout::EXTERNAL_HOST, layout::EXTERNAL_PORT);
    f.patch(layout::shard(), json!({"shardBaseURL": public})).await?;
    assert_eq!(f.result(&o, "shard-base-url", "shard/alpha").await, Level::Fail);
    f.patch(layout::shard(), json!({"shardBaseURL": null})).await?;
    assert_eq!(f.result(&o, "shard-base-url", "shard/alpha").await, Level::Ok);
    f.patch(layout::root_shard(), json!({"extraArgs": ["--shard-base-url=https://root.kcp.example.com"]})).await?;
    assert_eq!(f.result(&o, "shard-base-url", "rootshard/root").await, Level::Fail);
    // The shard's own Service is what a base URL may name.
    let internal = format!("https://root-kcp.{}.svc.cluster.local:6443", f.ns);
    f.patch(layout::root_shard(), json!({"extraArgs": [format!("--shard-base-url={internal}")]})).await?;
    assert_eq!(f.result(&o, "shard-base-url", "rootshard/root").await, Level::Ok);
    Ok(())
}

#[tokio::test]
async fn a_shard_with_a_public_name_warns_without_a_virtual_workspace_url_is_ok_with_one_and_warns_once_it_is_removed()
-> Result<()> {
    let f = Fixture::new().await?;
    let o = f.options();
    let check = "shard-virtual-workspace-url";
    assert_eq!(f.result(&o, check, "shard/alpha").await, Level::Warn);
    let url = format!("--shard-virtual-workspace-url=https://{}:6443", layout::SHARD_HOSTS[1].1);
    f.patch(layout::shard(), json!({"extraArgs": [url]})).await?;
    assert_eq!(f.result(&o, check, "shard/alpha").await, Level::Ok);
    // The root shard is its own line: still unset there.
    assert_eq!(f.result(&o, check, "rootshard/root").await, Level::Warn);
    f.patch(layout::shard(), json!({"extraArgs": null})).await?;
    assert_eq!(f.result(&o, check, "shard/alpha").await, Level::Warn);
    Ok(())
}

#[tokio::test]
async fn cache_apis_turned_on_is_ok_and_turned_off_again_warns() -> Result<()> {
    let f = Fixture::new().await?;
    let o = f.options();
    f.patch(layout::shard(), json!({"extraArgs": ["--feature-gates=CacheAPIs=true"]})).await?;
    assert_eq!(f.result(&o, "cache-apis", "shard/alpha").await, Level::Ok);
    f.patch(layout::shard(), json!({"extraArgs": ["--feature-gates=CacheAPIs=false"]})).await?;
    assert_eq!(f.result(&o, "cache-apis", "shard/alpha").await, Level::Warn);
    Ok(())
}

fn oidc(username_prefix: &str) -> Value {
    json!({"issuerURL": "https://login.railgrid.example.com", "clientID": "kcp", "clientSecret": "doctor-test-client-secret",
           "usernameClaim": "email", "usernamePrefix": username_prefix, "groupsClaim": "groups", "groupsPrefix": "railgrid:"})
}

#[tokio::test]
async fn a_mismatched_oidc_prefix_fails_against_the_hubs_configmap_and_the_same_prefix_is_ok_and_the_client_secret_is_never_printed()
-> Result<()> {
    let f = Fixture::new().await?;
    // The hub's settings as a document in a ConfigMap key, with a key the doctor must not care about.
    let hub = "issuerURL: https://login.railgrid.example.com\nclientID: kcp\nusernameClaim: email\nusernamePrefix: 'railgrid:'\ngroupsClaim: groups\ngroupsPrefix: 'railgrid:'\nscopes: [openid, email]\n";
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "railgrid-hub"}, "data": {"oidc.yaml": hub}}))?;
    Api::<ConfigMap>::namespaced(f.client.clone(), &f.ns).create(&Default::default(), &cm).await?;
    let o = Options {
        hub_oidc: Some(HubOidc::ConfigMap(KeyRef::parse(&format!("{}/railgrid-hub", f.ns), "oidc.yaml").unwrap())),
        ..f.options()
    };
    // Nothing has OIDC yet: every component fails against the hub.
    assert_eq!(f.result(&o, "oidc-hub", "shard/alpha").await, Level::Fail);
    for template in [layout::root_shard(), layout::shard()] {
        f.patch(template, json!({"auth": {"oidc": oidc("railgrid:")}})).await?;
    }
    // The CRD insists on ServiceAccount authentication beside OIDC on the front proxy.
    f.patch(layout::front_proxy(), json!({"auth": {"serviceAccount": {"enabled": true}, "oidc": oidc("railgrid:")}}))
        .await?;
    for subject in ["rootshard/root", "shard/alpha", "frontproxy/frontproxy"] {
        assert_eq!(f.result(&o, "oidc-hub", subject).await, Level::Ok, "{subject}");
    }
    f.patch(layout::shard(), json!({"auth": {"oidc": {"usernamePrefix": "oidc:"}}})).await?;
    let report = f.doctor(&o).await;
    let line = report.of("oidc-hub").into_iter().find(|v| v.subject == "shard/alpha").unwrap().clone();
    assert_eq!(line.result, Level::Fail);
    assert!(line.saw.contains(r#"usernamePrefix "oidc:" (hub "railgrid:")"#), "{}", line.saw);
    assert!(
        !report.json().contains("doctor-test-client-secret") && !report.text().contains("doctor-test-client-secret")
    );
    f.patch(layout::shard(), json!({"auth": {"oidc": {"usernamePrefix": "railgrid:"}}})).await?;
    assert_eq!(f.result(&o, "oidc-hub", "shard/alpha").await, Level::Ok);
    // A hub document that does not parse is a FAIL line, not a crash, and the other rules still run.
    let bad: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "railgrid-hub"}, "data": {"oidc.yaml": "clientID: [unclosed"}}),
    )?;
    Api::<ConfigMap>::namespaced(f.client.clone(), &f.ns).replace("railgrid-hub", &Default::default(), &bad).await?;
    let report = f.doctor(&o).await;
    assert!(report.of("oidc-hub").iter().any(|v| v.subject == "hub" && v.result == Level::Fail), "{}", report.text());
    assert!(!report.of("pinned-images").is_empty());
    Ok(())
}

#[tokio::test]
async fn the_root_etcd_spread_across_zones_with_min_domains_three_is_ok_and_without_it_warns() -> Result<()> {
    let f = Fixture::new().await?;
    let o = f.options();
    let subject = "rootshard/root statefulset/etcd-root";
    assert_eq!(f.result(&o, "etcd-spread", subject).await, Level::Warn);
    let spread = json!({"spec": {"template": {"spec": {"topologySpreadConstraints": [{
        "maxSkew": 1, "minDomains": 3, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "etcd-root"}}}]}}}});
    let sets = Api::<StatefulSet>::namespaced(f.client.clone(), &f.ns);
    sets.patch("etcd-root", &PatchParams::default(), &Patch::Merge(&spread)).await?;
    assert_eq!(f.result(&o, "etcd-spread", subject).await, Level::Ok);
    let unspread = json!({"spec": {"template": {"spec": {"topologySpreadConstraints": null}}}});
    sets.patch("etcd-root", &PatchParams::default(), &Patch::Merge(&unspread)).await?;
    assert_eq!(f.result(&o, "etcd-spread", subject).await, Level::Warn);
    Ok(())
}

fn cert_pem(days_left: i64) -> String {
    let mut params = rcgen::CertificateParams::new(vec!["doctor-test".into()]).unwrap();
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(days_left);
    params.self_signed(&rcgen::KeyPair::generate().unwrap()).unwrap().pem()
}

async fn put_secret(client: &kube::Client, ns: &str, name: &str, key: &str, value: &str) -> Result<()> {
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns}, "stringData": {key: value}}))?;
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::apply("doctor-test").force(), &Patch::Apply(&secret))
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_hub_kubeconfig_and_a_managed_ca_near_expiry_fail_and_renewed_are_ok_and_no_key_material_is_printed()
-> Result<()> {
    use base64::Engine;
    let f = Fixture::new().await?;
    let kubeconfig = |days: i64| {
        let cert = base64::engine::general_purpose::STANDARD.encode(cert_pem(days));
        format!(
            "apiVersion: v1\nkind: Config\nusers:\n- name: admin\n  user:\n    client-certificate-data: {cert}\n    client-key-data: ZG9jdG9yLXRlc3Qta2V5\n"
        )
    };
    put_secret(&f.client, &f.ns, "railgrid-kcp", "admin.kubeconfig", &kubeconfig(3)).await?;
    // A bundle of old and new CA during a rotation: the old one, 2 days left, decides.
    put_secret(&f.client, &f.ns, "kcp-ca", "ca.crt", &format!("{}{}", cert_pem(3650), cert_pem(2))).await?;
    let o = Options {
        hub_kubeconfig: Some(KeyRef::parse(&format!("{}/railgrid-kcp:admin.kubeconfig", f.ns), "kubeconfig").unwrap()),
        cas: vec![CaSource::Secret(KeyRef::parse(&format!("{}/kcp-ca", f.ns), "ca.crt").unwrap())],
        ..f.options()
    };
    let hub = format!("secret {}/railgrid-kcp:admin.kubeconfig", f.ns);
    let ca = format!("secret {}/kcp-ca:ca.crt", f.ns);
    assert_eq!(f.result(&o, "hub-kubeconfig-expiry", &hub).await, Level::Fail);
    assert_eq!(f.result(&o, "ca-expiry", &ca).await, Level::Fail);
    put_secret(&f.client, &f.ns, "railgrid-kcp", "admin.kubeconfig", &kubeconfig(20)).await?;
    assert_eq!(f.result(&o, "hub-kubeconfig-expiry", &hub).await, Level::Warn);
    put_secret(&f.client, &f.ns, "railgrid-kcp", "admin.kubeconfig", &kubeconfig(365)).await?;
    put_secret(&f.client, &f.ns, "kcp-ca", "ca.crt", &cert_pem(3650)).await?;
    assert_eq!(f.result(&o, "hub-kubeconfig-expiry", &hub).await, Level::Ok);
    assert_eq!(f.result(&o, "ca-expiry", &ca).await, Level::Ok);
    // A Secret that holds no certificate, and one that is missing, are FAIL lines naming the Secret only.
    put_secret(&f.client, &f.ns, "kcp-ca", "ca.crt", "doctor-test-not-a-certificate").await?;
    put_secret(&f.client, &f.ns, "railgrid-kcp", "admin.kubeconfig", "users: [doctor-test-garbage").await?;
    let report = f.doctor(&o).await;
    assert_eq!(report.of("ca-expiry")[0].result, Level::Fail);
    assert_eq!(report.of("hub-kubeconfig-expiry")[0].result, Level::Fail);
    let missing = Options {
        cas: vec![CaSource::Secret(KeyRef::parse(&format!("{}/nothing-here", f.ns), "ca.crt").unwrap())],
        ..o.clone()
    };
    assert_eq!(f.doctor(&missing).await.of("ca-expiry")[0].result, Level::Fail);
    for out in [report.text(), report.json()] {
        assert!(!out.contains("doctor-test") && !out.contains("ZG9jdG9y"), "{out}");
    }
    Ok(())
}

#[tokio::test]
async fn the_binary_prints_json_and_exits_1_on_a_fail_and_0_when_only_warnings_remain() -> Result<()> {
    let f = Fixture::new().await?;
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_kcp-keeper"))
            .args(["doctor", "--no-verify", "--output", "json", "--namespace", &f.ns])
            .arg("--kubeconfig")
            .arg(&bed().apiserver.admin_kubeconfig)
            .output()
            .expect("running kcp-keeper")
    };
    let out = run();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout)?;
    assert!(json["checks"].as_array().is_some_and(|c| c.iter().all(|v| v["result"] != "fail")), "{json}");
    f.patch(layout::front_proxy(), json!({"image": null})).await?;
    let out = run();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    let json: Value = serde_json::from_slice(&out.stdout)?;
    let failed: Vec<&Value> = json["checks"].as_array().unwrap().iter().filter(|v| v["result"] == "fail").collect();
    assert_eq!(failed.len(), 1, "{json}");
    assert_eq!(failed[0]["check"], "pinned-images");
    assert_eq!(failed[0]["subject"], "frontproxy/frontproxy");
    assert!(failed[0]["runbook"].as_str().unwrap().ends_with("runbooks.md#doctor-pinned-images"));
    Ok(())
}

/// A URL's userinfo is a credential: written into a RootShard's `spec.shardBaseURL`, a Shard's etcd endpoint or a
/// `--snapshotter-metrics` flag, the doctor's text and JSON reports (what the periodic in-cluster mode logs too)
/// show each URL with `REDACTED@` in its place.
#[tokio::test]
async fn urls_with_userinfo_in_the_objects_and_flags_are_reported_redacted_in_text_and_json() -> Result<()> {
    let f = Fixture::new().await?;
    let secret = "pw-marker-7f3a";
    f.patch(layout::root_shard(), json!({"shardBaseURL": format!("https://admin:{secret}@kcp.example.com:6443")}))
        .await?;
    f.patch(layout::shard(), json!({"etcd": {"endpoints": [format!("https://etcd:{secret}@10.0.0.1:2379")]}})).await?;
    for output in ["text", "json"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kcp-keeper"))
            .args(["doctor", "--no-verify", "--output", output, "--namespace", &f.ns])
            .arg(format!("--snapshotter-metrics=http://m:{secret}@127.0.0.1:1/metrics"))
            .arg("--kubeconfig")
            .arg(&bed().apiserver.admin_kubeconfig)
            .output()?;
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        eprintln!("{stdout}{stderr}");
        assert_eq!(out.status.code(), Some(1), "the public base URL fails");
        assert!(!stdout.contains(secret) && !stderr.contains(secret), "{output}: a password is printed");
        for shown in ["https://REDACTED@kcp.example.com:6443", "https://REDACTED@10.0.0.1:2379", "REDACTED@127.0.0.1:1"]
        {
            assert!(stdout.contains(shown), "{output}: {shown} is not shown:\n{stdout}");
        }
    }
    Ok(())
}

/// A free port on loopback (bound and released: the doctor binds it right after).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The periodic mode's /metrics, as Prometheus scrapes it.
async fn scrape(port: u16) -> Option<String> {
    kcp_keeper_doctor::probe::get_plain(&format!("http://127.0.0.1:{port}/metrics"), std::time::Duration::from_secs(5))
        .await
        .ok()
}

#[tokio::test]
async fn the_periodic_mode_exports_a_fail_as_kcp_keeper_doctor_check_and_back_to_zero_once_fixed_and_stops_on_sigterm()
-> Result<()> {
    let f = Fixture::new().await?;
    let port = free_port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_kcp-keeper"))
        .args([
            "doctor",
            "--no-verify",
            "--namespace",
            &f.ns,
            "--interval",
            "1",
            "--serve",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("--kubeconfig")
        .arg(&bed().apiserver.admin_kubeconfig)
        .stdout(std::process::Stdio::null())
        .spawn()?;
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let pid = child.id();
    let guard = Kill(child);
    let fail = r#"kcp_keeper_doctor_check{check="pinned-images",result="fail"}"#;
    let value =
        |text: &str, series: &str| text.lines().find_map(|l| l.strip_prefix(series)).map(|v| v.trim().to_string());
    testbed::eventually(std::time::Duration::from_secs(60), "a first run exported", || async {
        scrape(port).await.filter(|t| value(t, fail).as_deref() == Some("0"))
    })
    .await;
    f.patch(layout::shard(), json!({"image": null})).await?;
    testbed::eventually(std::time::Duration::from_secs(60), "the unpinned shard exported as a FAIL", || async {
        scrape(port).await.filter(|t| value(t, fail).as_deref() == Some("1"))
    })
    .await;
    apply(&f.client, &f.ns, seed_objects(&f.ns).into_iter().find(|o| o["kind"] == "Shard").unwrap()).await?;
    let text = testbed::eventually(std::time::Duration::from_secs(60), "the FAIL back to 0", || async {
        scrape(port).await.filter(|t| value(t, fail).as_deref() == Some("0"))
    })
    .await;
    assert!(text.contains("kcp_keeper_doctor_last_run_timestamp_seconds"), "{text}");
    nix_kill(pid);
    let mut guard = guard;
    let status = guard.0.wait()?;
    assert!(status.success(), "SIGTERM ends the periodic mode cleanly: {status}");
    Ok(())
}

fn nix_kill(pid: u32) {
    let _ = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
}

/// A `/metrics` endpoint on loopback serving `body` to every request, as an agent's admin port does.
async fn serve_metrics(body: String) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/metrics", listener.local_addr()?);
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = tcp.read(&mut buf).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = tcp.write_all(head.as_bytes()).await;
                let _ = tcp.write_all(body.as_bytes()).await;
            });
        }
    });
    Ok(url)
}

/// The in-cluster doctor as the chart runs it: `--no-secrets`, as a user whose Roles grant what the chart's
/// grant (the kcp-operator objects, StatefulSets, Deployments, Services, named ConfigMaps) and no Secret. The CA
/// expiries come from a ConfigMap and from ca-syncer's metrics, the kubeconfigs' from kubeconfig-rotator's;
/// the requests that need kcp's server CA, the endpoint slices (a kcp credential) and nothing else are "not
/// checked" with the reason; no line is a refused read. Given a ConfigMap copy of the server CA, the requests
/// are made. The same user without `--no-secrets` fails reading the server CA's Secret: RBAC, not the flag,
/// keeps the key out of reach.
#[tokio::test]
async fn without_secrets_the_doctor_judges_expiry_from_configmaps_and_agent_metrics_and_says_what_it_did_not_check()
-> Result<()> {
    let f = Fixture::new().await?;
    let user = format!("doctor-incluster-{}", f.ns);
    let role = json!({"metadata": {"name": "doctor"}, "rules": [
        {"apiGroups": ["operator.kcp.io"], "resources": ["rootshards", "shards", "frontproxies"], "verbs": ["list"]},
        {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["list"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["services"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["kcp-ca", "kcp-server-ca"], "verbs": ["get"]},
    ]});
    let binding = json!({"metadata": {"name": "doctor"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "doctor"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    Api::<Role>::namespaced(f.client.clone(), &f.ns)
        .create(&Default::default(), &serde_json::from_value(role)?)
        .await?;
    Api::<RoleBinding>::namespaced(f.client.clone(), &f.ns)
        .create(&Default::default(), &serde_json::from_value(binding)?)
        .await?;
    let doctor = bed().user_client(&user, &[]).await?;
    // The server CA's Secret as cert-manager writes it (a key beside the certificate), and a ConfigMap with
    // only the certificate (a ca-syncer target), and a managed CA's ConfigMap with 2 days left.
    let server_ca = cert_pem(3650);
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "root-server-ca"},
        "stringData": {"tls.crt": server_ca, "tls.key": "doctor-test-private-key"}}))?;
    Api::<Secret>::namespaced(f.client.clone(), &f.ns).create(&Default::default(), &secret).await?;
    for (name, pem) in [("kcp-ca", cert_pem(2)), ("kcp-server-ca", server_ca.clone())] {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}, "data": {"ca.crt": pem}}))?;
        Api::<ConfigMap>::namespaced(f.client.clone(), &f.ns).create(&Default::default(), &cm).await?;
    }
    let now = time::OffsetDateTime::now_utc().unix_timestamp() as f64;
    let metrics = serve_metrics(format!(
        "# TYPE kubeconfig_rotator_target_not_after_timestamp_seconds gauge\n\
         kubeconfig_rotator_last_sync_timestamp_seconds{{kubeconfig=\"hub\"}} {now}\n\
         kubeconfig_rotator_target_not_after_timestamp_seconds{{kubeconfig=\"hub\",namespace=\"apps\",name=\"kcp\"}} {}\n\
         ca_syncer_last_sync_timestamp_seconds{{bundle=\"kcp\"}} {now}\n\
         ca_syncer_certificate_not_after_timestamp_seconds{{bundle=\"kcp\",subject=\"CN=kcp-ca, O=kcp\",sha256=\"0011\"}} {}\n",
        now + 20.0 * 86400.0,
        now + 365.0 * 86400.0
    ))
    .await?;
    let o = Options {
        verify: true,
        no_secrets: true,
        cluster_dns: Some("127.0.0.1:1".parse()?),
        cas: vec![CaSource::parse(&format!("configmap:{}/kcp-ca", f.ns), "ca.crt").unwrap()],
        rotator_metrics: vec![metrics.clone()],
        ca_syncer_metrics: vec![metrics],
        ..f.options()
    };
    let report = kcp_keeper_doctor::run(&doctor, &o).await;
    eprint!("{}", report.text());
    let line = |check: &str, subject: &str| line_of(&report, check, subject);
    for (check, subject) in [
        ("readyz", "frontproxy/frontproxy"),
        ("anonymous-api", "frontproxy/frontproxy"),
        ("anonymous-api", "shard/alpha"),
    ] {
        let (level, saw) = line(check, subject);
        assert_eq!(level, Level::NotChecked, "{check} {subject}: {saw}");
        assert!(saw.starts_with("not checked:") && saw.contains("private key"), "{saw}");
    }
    assert_eq!(line("endpoint-slices", "kcp").0, Level::NotChecked);
    assert_eq!(line("ca-expiry", &format!("configmap {}/kcp-ca:ca.crt", f.ns)).0, Level::Fail, "2 days left");
    assert_eq!(line("ca-expiry", "ca-syncer bundle kcp").0, Level::Ok);
    let hub = "kubeconfig-rotator target apps/kcp (kubeconfig hub)";
    assert_eq!(line("hub-kubeconfig-expiry", hub).0, Level::Warn, "20 days left");
    for out in [report.text(), report.json()] {
        assert!(!out.contains("forbidden") && !out.to_lowercase().contains("reading secret"), "{out}");
        assert!(!out.contains("doctor-test-private-key"), "{out}");
    }
    // Without rotator metrics, the kubeconfigs' expiry is not checked, and says how it would be.
    let report = kcp_keeper_doctor::run(&doctor, &Options { rotator_metrics: vec![], ..o.clone() }).await;
    let v = report.of("hub-kubeconfig-expiry");
    assert!(v.len() == 1 && v[0].result == Level::NotChecked && v[0].todo.contains("--rotator-metrics"), "{v:?}");

    // The server CA from the ConfigMap: the requests are made (the Services are not in this bed: they fail on
    // the Service, past the CA).
    let with_ca = Options {
        server_ca: Some(CaSource::parse(&format!("configmap:{}/kcp-server-ca", f.ns), "ca.crt").unwrap()),
        ..o.clone()
    };
    let report = kcp_keeper_doctor::run(&doctor, &with_ca).await;
    eprint!("{}", report.text());
    let (level, saw) = line_of(&report, "readyz", "frontproxy/frontproxy");
    assert_eq!(level, Level::Fail, "{saw}");
    assert!(saw.contains("Service") && !saw.contains("server CA"), "{saw}");

    // A Secret named where none may be read is refused before anything is read, by the library and the binary.
    let refused = Options { hub_kubeconfig: Some(KeyRef::parse("hub/admin", "kubeconfig").unwrap()), ..o.clone() };
    let report = kcp_keeper_doctor::run(&doctor, &refused).await;
    assert_eq!(report.checks.len(), 1, "{}", report.text());
    assert!(report.checks[0].saw.contains("--hub-kubeconfig hub/admin"), "{}", report.text());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kcp-keeper"))
        .args(["doctor", "--no-secrets", "--hub-kubeconfig", "hub/admin", "--namespace", &f.ns])
        .arg("--kubeconfig")
        .arg(&bed().apiserver.admin_kubeconfig)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--hub-kubeconfig hub/admin") && stderr.contains("--rotator-metrics"), "{stderr}");

    // The same user without --no-secrets: the default server CA is the Secret, which its Roles do not grant.
    let report = kcp_keeper_doctor::run(&doctor, &Options { no_secrets: false, ..o }).await;
    let v = report.of("readyz");
    assert!(
        v.iter().any(|v| v.result == Level::Fail && v.saw.contains("no server CA") && v.saw.contains("forbidden")),
        "{v:?}"
    );
    Ok(())
}

fn line_of(report: &Report, check: &str, subject: &str) -> (Level, String) {
    let v = report.of(check).into_iter().find(|v| v.subject == subject);
    let v = v.unwrap_or_else(|| panic!("no {check} line for {subject}:\n{}", report.text()));
    (v.result, v.saw.clone())
}
