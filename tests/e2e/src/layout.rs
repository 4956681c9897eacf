//! Seeds a test bed with what kcp-operator and cert-manager would have created in a real cluster
//! (DESIGN.md section 7): namespaces `kcp-system` and `railgrid-system`, a `root` and an `alpha` shard etcd with
//! data, shard and front-proxy Services with fixed ClusterIPs and the operator's labels, cert-manager-shaped CA
//! Secrets, and RootShard/Shard/FrontProxy/Kubeconfig objects with the Certificate and Secrets they lead to.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, Service, ServicePort, ServiceSpec};
use kube::api::{Api, DynamicObject, ObjectMeta, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use testbed::apiserver::kubeconfig_yaml;
use testbed::certs::Ca;
use testbed::{ControlPlane, Etcd};

pub const KCP_NAMESPACE: &str = "kcp-system";
pub const HUB_NAMESPACE: &str = "railgrid-system";
pub const EXTERNAL_HOSTNAME: &str = "kcp.example.com";

/// A Service the operator would create, with the ClusterIP the demo pins.
pub struct ServiceSeed {
    pub name: &'static str,
    pub component: &'static str,
    pub instance: &'static str,
    pub cluster_ip: &'static str,
    pub public_hostname: &'static str,
}

pub const SERVICES: &[ServiceSeed] = &[
    ServiceSeed {
        name: "frontproxy-front-proxy",
        component: "front-proxy",
        instance: "frontproxy",
        cluster_ip: "10.96.100.10",
        public_hostname: EXTERNAL_HOSTNAME,
    },
    ServiceSeed {
        name: "root-kcp",
        component: "rootshard",
        instance: "root",
        cluster_ip: "10.96.100.20",
        public_hostname: "root.kcp.example.com",
    },
    ServiceSeed {
        name: "alpha-shard-kcp",
        component: "shard",
        instance: "alpha",
        cluster_ip: "10.96.100.30",
        public_hostname: "alpha.kcp.example.com",
    },
];

/// How long the seeded admin kubeconfig's client certificate lives: short, so rotation is due at once.
pub const ADMIN_CERT_VALIDITY: Duration = Duration::from_secs(5 * 60);

/// What [`seed`] created that the caller needs to reach.
pub struct Layout {
    pub shard_etcds: BTreeMap<&'static str, Etcd>,
    /// The CA that issues kcp client certificates (`Issuer/root-client-ca`), for stand-ins that play
    /// cert-manager.
    pub client_ca: Ca,
    /// The root CA and intermediate server CA of `Secret/root-server-ca`.
    pub server_root_ca: Ca,
    pub server_ca: Ca,
}

fn meta(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        labels: (!labels.is_empty()).then(|| labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    }
}

fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: meta(name, &[]),
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data.iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect()),
        ..Default::default()
    }
}

/// Creates the layout in `bed`. Shard etcds hold a few keys each so snapshots have something in them.
pub async fn seed(bed: &ControlPlane) -> Result<Layout> {
    let client = bed.client();
    for ns in [KCP_NAMESPACE, HUB_NAMESPACE] {
        bed.create_namespace(ns).await.with_context(|| format!("creating namespace {ns}"))?;
    }

    let mut shard_etcds = BTreeMap::new();
    for shard in ["root", "alpha"] {
        let etcd = bed.etcd(&format!("{shard}-etcd"), 1).await?;
        let mut kv = etcd.client().await?;
        for i in 0..100 {
            kv.put(format!("/registry/demo/{shard}/object-{i:03}"), format!("value {i} of shard {shard}"), None)
                .await?;
        }
        shard_etcds.insert(shard, etcd);
    }

    let services = Api::<Service>::namespaced(client.clone(), KCP_NAMESPACE);
    for seed in SERVICES {
        let labels = [
            ("app.kubernetes.io/component", seed.component),
            ("app.kubernetes.io/instance", seed.instance),
            ("app.kubernetes.io/managed-by", "kcp-operator"),
        ];
        let svc = Service {
            metadata: meta(seed.name, &labels),
            spec: Some(ServiceSpec {
                cluster_ip: Some(seed.cluster_ip.into()),
                ports: Some(vec![ServicePort { name: Some("https".into()), port: 6443, ..Default::default() }]),
                selector: Some(BTreeMap::from([("app.kubernetes.io/instance".to_string(), seed.instance.to_string())])),
                ..Default::default()
            }),
            ..Default::default()
        };
        services
            .create(&PostParams::default(), &svc)
            .await
            .with_context(|| format!("creating Service {}", seed.name))?;
    }

    let year = Duration::from_secs(365 * 24 * 3600);
    let server_root_ca = Ca::new("root-ca", year * 10)?;
    let server_ca = server_root_ca.intermediate("root-server-ca", year * 5)?;
    let client_ca = Ca::new("root-client-ca", year * 5)?;
    let secrets = Api::<Secret>::namespaced(client.clone(), KCP_NAMESPACE);
    // cert-manager's CA Secrets carry the CA's private key next to the certificates; agents must never copy it.
    for (name, ca, root) in
        [("root-server-ca", &server_ca, &server_root_ca), ("root-client-ca", &client_ca, &client_ca)]
    {
        let s = secret(name, &[("tls.crt", &ca.cert_pem()), ("tls.key", &ca.key_pem()), ("ca.crt", &root.cert_pem())]);
        secrets.create(&PostParams::default(), &s).await?;
    }

    let admin = client_ca.issue_client("kcp-admin", &["system:kcp:admin", "kubeconfig:admin"], ADMIN_CERT_VALIDITY)?;
    let cert_secret = secret(
        "kubeconfig-cert-admin",
        &[("tls.crt", &admin.cert_pem), ("tls.key", &admin.key_pem), ("ca.crt", &client_ca.cert_pem())],
    );
    secrets.create(&PostParams::default(), &cert_secret).await?;
    let server = format!("https://{EXTERNAL_HOSTNAME}:6443");
    let mut rendered = Secret { metadata: meta("admin-kubeconfig", &[]), ..Default::default() };
    let kubeconfig = kubeconfig_yaml(&format!("{server}/clusters/root"), &server_ca.cert_pem(), &admin, "kcp-admin");
    rendered.data = Some(BTreeMap::from([("kubeconfig".to_string(), ByteString(kubeconfig.into_bytes()))]));
    secrets.create(&PostParams::default(), &rendered).await?;

    let objects = [
        (
            "operator.kcp.io",
            "v1alpha1",
            "RootShard",
            "root",
            json!({
                "spec": {
                    "external": {"hostname": "root.kcp.example.com", "port": 6443},
                    "etcd": {"endpoints": [shard_etcds["root"].client_urls()]},
                    "certificates": {"issuerRef": {"kind": "Issuer", "name": "root-ca"}},
                }
            }),
        ),
        (
            "operator.kcp.io",
            "v1alpha1",
            "Shard",
            "alpha",
            json!({
                "spec": {
                    "rootShard": {"ref": {"name": "root"}},
                    "etcd": {"endpoints": [shard_etcds["alpha"].client_urls()]},
                }
            }),
        ),
        (
            "operator.kcp.io",
            "v1alpha1",
            "FrontProxy",
            "frontproxy",
            json!({
                "spec": {
                    "rootShard": {"ref": {"name": "root"}},
                    "external": {"hostname": EXTERNAL_HOSTNAME, "port": 6443},
                }
            }),
        ),
        (
            "operator.kcp.io",
            "v1alpha1",
            "Kubeconfig",
            "admin",
            json!({
                "spec": {
                    "username": "kcp-admin",
                    "groups": ["system:kcp:admin"],
                    "validity": "5m",
                    "secretRef": {"name": "admin-kubeconfig"},
                    "target": {"frontProxyRef": {"name": "frontproxy"}},
                }
            }),
        ),
        (
            "cert-manager.io",
            "v1",
            "Certificate",
            "kubeconfig-cert-admin",
            json!({
                "spec": {
                    "secretName": "kubeconfig-cert-admin",
                    "commonName": "kcp-admin",
                    "duration": "5m",
                    "usages": ["client auth"],
                    "subject": {"organizations": ["system:kcp:admin", "kubeconfig:admin"]},
                    "issuerRef": {"kind": "Issuer", "name": "root-client-ca"},
                }
            }),
        ),
    ];
    for (group, version, kind, name, body) in objects {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), KCP_NAMESPACE, &resource);
        let mut obj = DynamicObject::new(name, &resource);
        obj.data = body;
        api.create(&PostParams::default(), &obj).await.with_context(|| format!("creating {kind} {name}"))?;
    }

    Ok(Layout { shard_etcds, client_ca, server_root_ca, server_ca })
}
