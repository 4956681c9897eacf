//! Proves the test bed runs the real programs: each test exercises behaviour only the real peer has.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Secret, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, DynamicObject, ObjectMeta, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use testbed::{ControlPlane, eventually};

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.into()), ..Default::default() }
}

async fn create_service(client: &kube::Client, ns: &str, name: &str) -> Result<String> {
    let svc = Service {
        metadata: meta(name),
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort { port: 6443, ..Default::default() }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = Api::<Service>::namespaced(client.clone(), ns).create(&PostParams::default(), &svc).await?;
    Ok(created.spec.and_then(|s| s.cluster_ip).expect("the apiserver allocates a ClusterIP"))
}

#[tokio::test]
async fn apiserver_reports_the_pinned_kubernetes_version() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let version = bed.client().apiserver_version().await?;
    assert_eq!(version.git_version, "v1.37.2");
    Ok(())
}

#[tokio::test]
async fn service_gets_a_cluster_ip_and_coredns_answers_its_name_with_it() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let ip = create_service(&bed.client(), &ns, "front-proxy").await?;
    let dns = bed.coredns(testbed::coredns::KUBEADM_COREFILE).await?;
    let name = format!("front-proxy.{ns}.svc.cluster.local");
    let answer = eventually(Duration::from_secs(15), "CoreDNS to answer", || async {
        dns.resolve_a(&name).await.ok().filter(|a| !a.is_empty())
    })
    .await;
    assert_eq!(answer.iter().map(|a| a.to_string()).collect::<Vec<_>>(), vec![ip]);
    Ok(())
}

#[tokio::test]
async fn coredns_import_reloads_a_configmap_projected_the_kubelet_way() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let ip = create_service(&bed.client(), &ns, "root-kcp").await?;
    let dns = bed.coredns(testbed::coredns::K3S_COREFILE).await?;
    assert!(dns.resolve_a("kcp-root.example.com").await.unwrap_or_default().is_empty());

    let rule = format!("rewrite name exact kcp-root.example.com. root-kcp.{ns}.svc.cluster.local.\n");
    let files = BTreeMap::from([("kcp-split-horizon.override".to_string(), rule)]);
    testbed::projection::project_strings(&dns.dir.join("custom"), &files)?;
    // The reload plugin polls every 2s (+-1s jitter).
    let answer = eventually(Duration::from_secs(20), "the rewrite to load", || async {
        dns.resolve_a("kcp-root.example.com").await.ok().filter(|a| !a.is_empty())
    })
    .await;
    assert_eq!(answer[0].to_string(), ip);
    Ok(())
}

#[tokio::test]
async fn restricted_user_is_forbidden_outside_its_role_and_allowed_inside() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let (allowed_ns, other_ns) = (bed.namespace().await?, bed.namespace().await?);
    let admin = bed.client();
    for ns in [&allowed_ns, &other_ns] {
        let secret = Secret { metadata: meta("kubeconfig"), ..Default::default() };
        Api::<Secret>::namespaced(admin.clone(), ns).create(&PostParams::default(), &secret).await?;
    }
    let role = Role {
        metadata: meta("read-kubeconfig"),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".into()]),
            resource_names: Some(vec!["kubeconfig".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), &allowed_ns).create(&PostParams::default(), &role).await?;
    let binding = RoleBinding {
        metadata: meta("read-kubeconfig"),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "read-kubeconfig".into(),
        },
        subjects: Some(vec![Subject { kind: "User".into(), name: "alice".into(), ..Default::default() }]),
    };
    Api::<RoleBinding>::namespaced(admin.clone(), &allowed_ns).create(&PostParams::default(), &binding).await?;

    let alice = bed.user_client("alice", &["railgrid"]).await?;
    Api::<Secret>::namespaced(alice.clone(), &allowed_ns).get("kubeconfig").await?;
    let denied = Api::<Secret>::namespaced(alice, &other_ns).get("kubeconfig").await.unwrap_err();
    assert!(matches!(denied, kube::Error::Api(ref s) if s.code == 403), "expected 403, got {denied}");
    Ok(())
}

#[tokio::test]
async fn s3_multipart_upload_of_50_mib_reads_back_byte_identical() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let s3 = bed.s3().await?;
    let client = s3.client();
    let data: Vec<u8> = (0..50 * 1024 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let key = "shards/root/snapshot.db";
    let upload = client.create_multipart_upload().bucket(&s3.bucket).key(key).send().await?;
    let upload_id = upload.upload_id().expect("an upload id");
    let mut parts = Vec::new();
    for (i, chunk) in data.chunks(8 * 1024 * 1024).enumerate() {
        let number = i as i32 + 1;
        let part = client
            .upload_part()
            .bucket(&s3.bucket)
            .key(key)
            .upload_id(upload_id)
            .part_number(number)
            .body(ByteStream::from(chunk.to_vec()))
            .send()
            .await?;
        parts.push(CompletedPart::builder().part_number(number).set_e_tag(part.e_tag).build());
    }
    client
        .complete_multipart_upload()
        .bucket(&s3.bucket)
        .key(key)
        .upload_id(upload_id)
        .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
        .send()
        .await?;
    let got = client.get_object().bucket(&s3.bucket).key(key).send().await?.body.collect().await?.into_bytes();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "the object read back differs from what was written");
    Ok(())
}

#[tokio::test]
async fn three_member_etcd_keeps_serving_writes_with_its_leader_killed() -> Result<()> {
    let peers = peers::locate()?;
    let dir = tempfile::tempdir()?;
    let mut etcd = testbed::Etcd::start(peers.path("etcd"), dir.path(), "shard", 3).await?;
    let mut first = etcd.member_client(0).await?;
    first.put("/before", "1", None).await?;
    // Kill the leader: the hardest single failure, since the others must elect a new one first.
    let status = first.status().await?;
    let members = first.member_list().await?;
    let leader = members.members().iter().position(|m| m.id() == status.leader()).expect("a leader");
    etcd.kill_member(leader);
    let survivor = (0..3).find(|i| *i != leader).unwrap();
    let mut client = etcd.member_client(survivor).await?;
    // A write in flight during the election may time out; the cluster must accept one within seconds.
    let written = eventually(Duration::from_secs(15), "a write after the leader died", || {
        let mut client = client.clone();
        async move { client.put("/after", "2", None).await.ok() }
    })
    .await;
    drop(written);
    let other = (0..3).find(|i| *i != leader && *i != survivor).unwrap();
    let got = etcd.member_client(other).await?.get("/after", None).await?;
    assert_eq!(got.kvs()[0].value(), b"2", "the write is replicated to the other survivor");
    assert_eq!(client.member_list().await?.members().len(), 3, "the killed member is still a member, just down");
    Ok(())
}

#[tokio::test]
async fn secret_watch_resumes_and_sees_new_events_after_apiserver_restart() -> Result<()> {
    let mut bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let api = Api::<Secret>::namespaced(bed.client(), &ns);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watch = tokio::spawn(
        watcher(api.clone(), watcher::Config::default()).default_backoff().applied_objects().for_each(move |event| {
            if let Ok(secret) = event {
                let _ = tx.send(secret.metadata.name.unwrap_or_default());
            }
            async {}
        }),
    );
    api.create(&PostParams::default(), &Secret { metadata: meta("before"), ..Default::default() }).await?;
    let seen = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await?;
    assert_eq!(seen.as_deref(), Some("before"));

    bed.apiserver.restart().await?;
    api.create(&PostParams::default(), &Secret { metadata: meta("after"), ..Default::default() }).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let name = tokio::time::timeout_at(deadline, rx.recv()).await?.expect("watch ended");
        if name == "after" {
            break;
        }
    }
    watch.abort();
    Ok(())
}

#[tokio::test]
async fn cert_manager_and_kcp_operator_kinds_are_served_with_their_real_schemas() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    for (group, kind, body) in [
        (
            "cert-manager.io/v1",
            "Certificate",
            serde_json::json!({"secretName": "kubeconfig-cert-admin", "issuerRef": {"name": "root-client-ca"}, "commonName": "admin"}),
        ),
        (
            "operator.kcp.io/v1alpha1",
            "Kubeconfig",
            serde_json::json!({"username": "admin", "validity": "8766h", "secretRef": {"name": "admin-kubeconfig"}, "target": {"frontProxyRef": {"name": "frontproxy"}}}),
        ),
    ] {
        let (g, v) = group.split_once('/').unwrap();
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(g, v, kind));
        let api: Api<DynamicObject> = Api::namespaced_with(bed.client(), &ns, &resource);
        let mut obj = DynamicObject::new("admin", &resource);
        obj.data = serde_json::json!({ "spec": body });
        api.create(&PostParams::default(), &obj).await?;
        let back = api.get("admin").await?;
        assert_eq!(back.data["spec"], body, "{kind} is stored as written");
    }
    // The operator's schema requires spec.target; an open stand-in schema would store this.
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("operator.kcp.io", "v1alpha1", "Kubeconfig"));
    let mut invalid = DynamicObject::new("no-target", &resource);
    invalid.data = serde_json::json!({"spec": {"username": "admin", "validity": "8766h", "secretRef": {"name": "x"}}});
    let api: Api<DynamicObject> = Api::namespaced_with(bed.client(), &ns, &resource);
    let err = api.create(&PostParams::default(), &invalid).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422 && s.message.contains("spec.target")),
        "expected 422 naming spec.target, got {err}"
    );
    Ok(())
}

/// Two test binaries asking for the control-plane template at once, with a killed build's scratch dir left in the
/// cache: it is built once, both get the same one, the leftover is gone, and an etcd started on a copy holds the
/// installed CRDs.
#[test]
fn a_template_asked_for_by_two_binaries_at_once_is_built_once_and_a_copy_holds_the_crds() -> Result<()> {
    use testbed::template;
    testbed::init_crypto();
    let cache = tempfile::tempdir()?;
    let leftover = cache.path().join(".build-control-plane-99999999");
    std::fs::create_dir_all(leftover.join("etcd"))?;
    let ask = || {
        let root = cache.path().to_path_buf();
        std::thread::spawn(move || -> Result<std::path::PathBuf> {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let peers = peers::locate()?;
                let mut crds = testbed::crds::read(peers.path("cert-manager-crds"))?;
                crds.extend(testbed::crds::read(&testbed::crds::kcp_operator())?);
                template::member_dir_in(&root, &peers, &crds).await
            })
        })
    };
    let (first, second) = (ask(), ask());
    let (first, second) = (first.join().expect("first")?, second.join().expect("second")?);
    assert_eq!(first, second);
    let built: Vec<_> = std::fs::read_dir(cache.path())?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    let templates: Vec<_> = built.iter().filter(|n| n.starts_with("control-plane-")).collect();
    assert_eq!(templates.len(), 1, "{built:?}");
    assert!(!leftover.exists(), "a killed build's scratch dir is cleared: {built:?}");

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let peers = peers::locate()?;
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("etcd"))?;
        template::copy_sparse(&first, &dir.path().join("etcd").join(template::member()))?;
        let etcd = testbed::Etcd::start(peers.path("etcd"), &dir.path().join("etcd"), template::ETCD_NAME, 1).await?;
        let prefix = "/registry/apiextensions.k8s.io/customresourcedefinitions/";
        let options = etcd_client::GetOptions::new().with_prefix().with_count_only();
        let count = etcd.client().await?.get(prefix, Some(options)).await?.count();
        assert_eq!(count, 13, "cert-manager's 6 CRDs and kcp-operator's 7");
        Ok(())
    })
}
