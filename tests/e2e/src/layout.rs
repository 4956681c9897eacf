//! Seeds a test bed with what kcp-operator and cert-manager would have created in a real cluster
//! (DESIGN.md section 7), around real kcp: a root shard and an `alpha` shard, each on its own etcd, behind a
//! front proxy (what the operator's pods would run). The cluster (the bed's kube-apiserver) holds namespaces
//! `kcp-system` and `railgrid-system`, shard and front-proxy Services with fixed ClusterIPs and the operator's
//! labels, cert-manager-shaped CA Secrets of kcp's real CAs, and RootShard/Shard/FrontProxy/Kubeconfig objects
//! (validated by the operator's real CRDs) with the Certificate and Secrets they lead to.

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
use testbed::kcp::Kcp;
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

/// The Service name the operator gives the front proxy, as a name its serving certificate carries.
pub const FRONT_PROXY_SERVICE_HOST: &str = "frontproxy-front-proxy.kcp-system.svc.cluster.local";

/// What [`seed`] created that the caller needs to reach.
pub struct Layout {
    /// The real kcp: its shards (each with its etcd), front proxy and CAs.
    pub kcp: Kcp,
}

impl Layout {
    /// A shard's etcd (`root` or `alpha`).
    pub fn shard_etcd(&self, shard: &str) -> &Etcd {
        &self.kcp.shard(shard).etcd
    }

    /// The CA that issues kcp client certificates (`Issuer/root-client-ca`): the real cert-manager's CA `Issuer`
    /// signs with it, so the running front proxy trusts what it issues.
    pub fn client_ca(&self) -> &Ca {
        &self.kcp.pki.client_ca
    }

    /// The intermediate server CA of `Secret/root-server-ca` (its `tls.crt`).
    pub fn server_ca(&self) -> &Ca {
        &self.kcp.pki.server_ca
    }

    /// The root CA every kcp CA comes from (`ca.crt` of the CA Secrets).
    pub fn server_root_ca(&self) -> &Ca {
        &self.kcp.pki.root_ca
    }
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

/// Starts real kcp and creates the layout around it in `bed`.
pub async fn seed(bed: &ControlPlane) -> Result<Layout> {
    let client = bed.client();
    for ns in [KCP_NAMESPACE, HUB_NAMESPACE] {
        bed.create_namespace(ns).await.with_context(|| format!("creating namespace {ns}"))?;
    }
    let kcp = bed.kcp(&[EXTERNAL_HOSTNAME, FRONT_PROXY_SERVICE_HOST]).await.context("starting kcp")?;

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

    let pki = &kcp.pki;
    let secrets = Api::<Secret>::namespaced(client.clone(), KCP_NAMESPACE);
    // cert-manager's CA Secrets carry the CA's private key next to the certificates; agents must never copy it.
    for (name, ca) in [
        ("root-ca", &pki.root_ca),
        ("root-server-ca", &pki.server_ca),
        ("root-client-ca", &pki.client_ca),
        ("root-front-proxy-client-ca", &pki.front_proxy_client_ca),
    ] {
        let data = pki.ca_secret_data(ca);
        let s = secret(name, &data.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect::<Vec<_>>());
        secrets.create(&PostParams::default(), &s).await?;
    }

    let admin = pki.client("kcp-admin", &["system:kcp:admin", "kubeconfig:admin"], ADMIN_CERT_VALIDITY)?;
    let cert_secret = secret(
        "kubeconfig-cert-admin",
        &[("tls.crt", &admin.cert_pem), ("tls.key", &admin.key_pem), ("ca.crt", &pki.client_ca.cert_pem())],
    );
    secrets.create(&PostParams::default(), &cert_secret).await?;
    // The operator renders `https://<FrontProxy spec.external.hostname>:<port>`; here that name has no DNS, so the
    // server is the real front proxy's loopback address (its certificate names the public hostname too). The CA
    // is the server CA's `tls.crt`, as the operator writes it.
    let server = format!("{}/clusters/root", kcp.front_proxy.url);
    let mut rendered = Secret { metadata: meta("admin-kubeconfig", &[]), ..Default::default() };
    let kubeconfig = kubeconfig_yaml(&server, &pki.server_ca.cert_pem(), &admin, "kcp-admin");
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
                    "etcd": {"endpoints": [kcp.shard("root").etcd.client_urls()]},
                    "certificates": {"issuerRef": {"kind": "Issuer", "name": "root-ca"}},
                    "cache": {"embedded": {"enabled": true}},
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
                    "etcd": {"endpoints": [kcp.shard("alpha").etcd.client_urls()]},
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

    Ok(Layout { kcp })
}
