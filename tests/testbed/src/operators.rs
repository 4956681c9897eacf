//! The two controllers kubeconfig-rotator reacts to, as the real programs: cert-manager's controller (v1.21.1)
//! and the kcp-operator (v0.9.0), both built from their source archives ([`peers::SEED_PEERS`]) and run here as
//! host processes against a test bed's apiserver (the hub), like every other peer.
//!
//! - [`Operators::start`] installs cert-manager's CRDs of the controller's own version (the bed starts with the
//!   CRD-only `cert-manager-crds` peer) and the operator's `deploy.operator.kcp.io` CRDs, then starts both, leader
//!   election off, logs in the bed's directory. The operator runs only its `config` controller group (RootShard,
//!   FrontProxy, Kubeconfig...): the `workload` group would create Deployments that nothing on a host bed runs.
//! - [`seed_front_proxy_kubeconfig`] creates exactly what the operator's Kubeconfig controller reads for a
//!   Kubeconfig targeting a FrontProxy (pkg/controller/kubeconfig/controller.go): the FrontProxy, the RootShard it
//!   references, and through the RootShard's own reconcile the Certificate `<rootshard>-server-ca` that must be
//!   Ready before a render. The kcp it points at is the test bed's (testbed::kcp), whose PKI the bed made, not the
//!   operator: the RootShard's `caSecretRef` is the bed's root CA, the FrontProxy's `caBundleSecretRef` adds the
//!   bed's server CA (which signed the running front proxy's certificate) to every render, and the Kubeconfig's
//!   `certificateTemplate` points its client Certificate at a CA Issuer holding the bed's client CA, the one the
//!   running front proxy trusts (the operator's own `<rootshard>-client-ca` would be a new intermediate it does
//!   not). See docs/architecture.md, "kubeconfig-rotator's tests on the real cert-manager and kcp-operator".

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::ControlPlane;
use crate::kcp::pki::KcpPki;
use crate::process::{Process, free_port};

/// The field manager of the objects seeded here.
const MANAGER: &str = "testbed-operators";
/// The CA Issuer that signs Kubeconfig client certificates with the kcp bed's client CA.
pub const BED_CLIENT_ISSUER: &str = "kcp-bed-client-ca";
/// The RootShard every seeded FrontProxy references (the operator names its CAs after it).
pub const ROOT_SHARD: &str = "root";
pub const FRONT_PROXY: &str = "frontproxy";
/// The Certificate (and Secret) of the server CA the operator's RootShard reconcile has cert-manager issue.
pub const SERVER_CA: &str = "root-server-ca";

pub fn certificate_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate"), "certificates")
}

pub fn issuer_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("cert-manager.io", "v1", "Issuer"), "issuers")
}

pub fn kubeconfig_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("operator.kcp.io", "v1alpha1", "Kubeconfig"),
        "kubeconfigs",
    )
}

pub fn front_proxy_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("operator.kcp.io", "v1alpha1", "FrontProxy"),
        "frontproxies",
    )
}

pub fn root_shard_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("operator.kcp.io", "v1alpha1", "RootShard"), "rootshards")
}

/// cert-manager's controller and the kcp-operator, running against one apiserver; both stop on drop.
pub struct Operators {
    pub cert_manager: Process,
    pub operator: Process,
}

impl Operators {
    /// Installs the CRDs both need and starts both against `bed`'s apiserver as its admin. `namespace` limits
    /// cert-manager to one namespace (its `--namespace`; the operator has no such flag and watches them all).
    pub async fn start(bed: &ControlPlane, namespace: Option<&str>) -> Result<Self> {
        let peers = peers::locate_only(&[
            "cert-manager-controller",
            "cert-manager-controller-crds",
            "kcp-operator",
            "kcp-operator-deploy-crds",
        ])?;
        let mut crds = crate::crds::read(peers.path("cert-manager-controller-crds"))?;
        crds.extend(crate::crds::read(peers.path("kcp-operator-deploy-crds"))?);
        apply_crds(&bed.client(), crds).await?;

        let dir = bed.subdir("operators")?;
        let started = std::time::Instant::now();
        let kubeconfig = bed.apiserver.admin_kubeconfig.display().to_string();
        // Its health server has no flag and listens on 0.0.0.0:9403 by default: two beds side by side would
        // collide, so its configuration file gives it a free loopback port.
        let healthz = free_port()?;
        let config = dir.join("cert-manager.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: controller.config.cert-manager.io/v1alpha1\nkind: ControllerConfiguration\n\
                 healthzListenAddress: 127.0.0.1:{healthz}\n"
            ),
        )?;
        let mut args = vec![
            format!("--config={}", config.display()),
            format!("--kubeconfig={kubeconfig}"),
            "--leader-elect=false".into(),
            format!("--metrics-listen-address=127.0.0.1:{}", free_port()?),
            "--v=2".into(),
        ];
        if let Some(ns) = namespace {
            args.push(format!("--namespace={ns}"));
        }
        let mut cert_manager = Process::start(
            "cert-manager-controller",
            peers.path("cert-manager-controller"),
            args,
            log(&dir, "cert-manager"),
        )?;
        let livez = format!("http://127.0.0.1:{healthz}/livez");
        crate::process::wait_until(&mut cert_manager, Duration::from_secs(60), "live", || crate::http::get_ok(&livez))
            .await?;
        let probe = free_port()?;
        let mut operator = Process::start(
            "kcp-operator",
            peers.path("kcp-operator"),
            vec![
                format!("--kubeconfig={kubeconfig}"),
                "--enabled-controller-groups=config".into(),
                format!("--health-probe-bind-address=127.0.0.1:{probe}"),
                "--metrics-bind-address=0".into(),
                "--zap-time-encoding=iso8601".into(),
            ],
            log(&dir, "kcp-operator"),
        )?;
        let readyz = format!("http://127.0.0.1:{probe}/readyz");
        crate::process::wait_until(&mut operator, Duration::from_secs(60), "ready", || crate::http::get_ok(&readyz))
            .await?;
        eprintln!(
            "testbed: cert-manager and the kcp-operator ready after {:.1?} (logs in {})",
            started.elapsed(),
            dir.display()
        );
        Ok(Self { cert_manager, operator })
    }

    /// `error` with the tails of both logs, for a failure that may be theirs (a test returning an error does not
    /// panic, so their logs are not printed on drop).
    pub fn with_logs(&self, error: anyhow::Error) -> anyhow::Error {
        error.context(format!(
            "cert-manager's log ends:\n{}\nthe kcp-operator's log ends:\n{}",
            self.cert_manager.log_tail(),
            self.operator.log_tail()
        ))
    }

    /// Fails, with the log's tail, when either has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.cert_manager.check_running()?;
        self.operator.check_running()
    }
}

fn log(dir: &std::path::Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.log"))
}

/// Creates or replaces (server-side apply) `crds` and waits until each is Established.
async fn apply_crds(client: &kube::Client, crds: Vec<CustomResourceDefinition>) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for mut crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crd.metadata.managed_fields = None;
        crd.status = None;
        let mut value = serde_json::to_value(&crd)?;
        value["apiVersion"] = json!("apiextensions.k8s.io/v1");
        value["kind"] = json!("CustomResourceDefinition");
        api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&value))
            .await
            .with_context(|| format!("applying CRD {name}"))?;
        names.push(name);
    }
    for name in names {
        crate::eventually(Duration::from_secs(30), &format!("CRD {name} Established"), || async {
            let crd = api.get(&name).await.ok()?;
            crd.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
        })
        .await;
    }
    Ok(())
}

/// The Kubeconfig to seed: what its spec says (username and groups are the bed's admin unless given).
#[derive(Clone, Debug)]
pub struct KubeconfigSpec {
    pub name: String,
    /// `spec.secretRef.name`: the Secret the operator renders into.
    pub secret: String,
    /// `spec.validity` (a Go duration): the client certificate's lifetime.
    pub validity: String,
    /// The client Certificate's `renewBefore` (through `spec.certificateTemplate`): when cert-manager renews it on
    /// its own, before its end. None: cert-manager's default, a third of the lifetime.
    pub renew_before: Option<String>,
    pub username: String,
    pub groups: Vec<String>,
}

impl KubeconfigSpec {
    pub fn admin(name: &str, secret: &str, validity: &str) -> Self {
        Self {
            name: name.into(),
            secret: secret.into(),
            validity: validity.into(),
            renew_before: None,
            username: crate::kcp::pki::ADMIN_USER.into(),
            groups: vec![crate::kcp::pki::ADMIN_GROUP.into()],
        }
    }
}

/// A small key for every certificate the RootShard's reconcile has cert-manager issue (its `certificateTemplates`):
/// the operator's default is RSA 4096, about a second of CPU each, and none of them but the server CA is read
/// here. The Kubeconfig's own certificate keeps the operator's default.
fn small_keys() -> Value {
    let names = [
        "server-ca",
        "client-ca",
        "requestheader-client-ca",
        "service-account-ca",
        "front-proxy-client-ca",
        "server",
        "client",
        "service-account",
        "virtual-workspaces",
        "requestheader",
        "logical-cluster-admin",
        "external-logical-cluster-admin",
        "kcp-operator",
        "kubeconfig",
        "admin-kubeconfig",
        "mounts-proxy",
    ];
    let template = json!({"spec": {"privateKey": {"algorithm": "ECDSA", "size": 256}}});
    Value::Object(names.iter().map(|n| (n.to_string(), template.clone())).collect())
}

fn ca_secret(name: &str, cert: &str, key: &str, ca: &str) -> Secret {
    let data = [("tls.crt", cert), ("tls.key", key), ("ca.crt", ca)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v.as_bytes().to_vec())))
        .collect();
    Secret {
        metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    }
}

async fn apply(client: &kube::Client, ns: &str, resource: &ApiResource, name: &str, body: Value) -> Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
    let mut object = json!({"apiVersion": resource.api_version, "kind": resource.kind, "metadata": {"name": name}});
    if let (Some(o), Some(b)) = (object.as_object_mut(), body.as_object()) {
        o.extend(b.clone());
    }
    api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&object))
        .await
        .with_context(|| format!("applying {} {ns}/{name}", resource.kind))?;
    Ok(())
}

/// Seeds, in `ns`, the operator's objects for one Kubeconfig targeting a FrontProxy whose external address is
/// `hostname:port` (the operator renders `https://<hostname>:<port>`), signed by the kcp bed `pki`, and waits
/// until the operator has rendered it. Returns once `Secret/<spec.secret>` holds a kubeconfig.
pub async fn seed_front_proxy_kubeconfig(
    client: &kube::Client,
    ns: &str,
    pki: &KcpPki,
    (hostname, port): (&str, u16),
    kubeconfig: &KubeconfigSpec,
) -> Result<()> {
    let secrets = Api::<Secret>::namespaced(client.clone(), ns);
    let root = pki.root_ca.cert_pem();
    let seeded = [
        ca_secret("kcp-bed-root-ca", &root, &pki.root_ca.key_pem(), &root),
        ca_secret(BED_CLIENT_ISSUER, &pki.client_ca.cert_pem(), &pki.client_ca.key_pem(), &root),
    ];
    for secret in seeded {
        let name = secret.metadata.name.clone().unwrap_or_default();
        secrets.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&secret)).await?;
    }
    // Only the certificate: the FrontProxy's CA bundle is public, and the operator reads only `tls.crt`.
    let bundle = Secret {
        metadata: kube::api::ObjectMeta { name: Some("kcp-bed-server-ca".into()), ..Default::default() },
        data: Some(
            [("tls.crt".to_string(), k8s_openapi::ByteString(pki.server_ca_bundle().into_bytes()))]
                .into_iter()
                .collect(),
        ),
        ..Default::default()
    };
    secrets.patch("kcp-bed-server-ca", &PatchParams::apply(MANAGER).force(), &Patch::Apply(&bundle)).await?;
    apply(
        client,
        ns,
        &issuer_resource(),
        BED_CLIENT_ISSUER,
        json!({"spec": {"ca": {"secretName": BED_CLIENT_ISSUER}}}),
    )
    .await?;
    apply(
        client,
        ns,
        &root_shard_resource(),
        ROOT_SHARD,
        json!({"spec": {
            "external": {"hostname": hostname, "port": port},
            "certificates": {"caSecretRef": {"name": "kcp-bed-root-ca"}},
            "certificateTemplates": small_keys(),
            "cache": {"embedded": {"enabled": true}},
            // Never dialled: the operator's workload controllers, which would run a shard on it, are off.
            "etcd": {"endpoints": ["http://127.0.0.1:1"]},
        }}),
    )
    .await?;
    apply(
        client,
        ns,
        &front_proxy_resource(),
        FRONT_PROXY,
        json!({"spec": {
            "rootShard": {"ref": {"name": ROOT_SHARD}},
            "external": {"hostname": hostname, "port": port},
            "caBundleSecretRef": {"name": "kcp-bed-server-ca"},
            "certificateTemplates": small_keys(),
        }}),
    )
    .await?;
    let mut template = json!({"issuerRef": {"name": BED_CLIENT_ISSUER, "kind": "Issuer", "group": "cert-manager.io"}});
    if let Some(before) = &kubeconfig.renew_before {
        template["renewBefore"] = json!(before);
    }
    apply(
        client,
        ns,
        &kubeconfig_resource(),
        &kubeconfig.name,
        json!({"spec": {
            "username": kubeconfig.username,
            "groups": kubeconfig.groups,
            "validity": kubeconfig.validity,
            "secretRef": {"name": kubeconfig.secret},
            "target": {"frontProxyRef": {"name": FRONT_PROXY}},
            "certificateTemplate": {"spec": template},
        }}),
    )
    .await?;
    wait_for_render(client, ns, &kubeconfig.secret).await
}

/// Waits (up to two minutes: cert-manager issues the RootShard's CAs first) for the operator's render.
pub async fn wait_for_render(client: &kube::Client, ns: &str, secret: &str) -> Result<()> {
    let secrets = Api::<Secret>::namespaced(client.clone(), ns);
    let started = tokio::time::Instant::now();
    let what = format!("the kcp-operator's render {ns}/{secret}");
    crate::eventually_seen(Duration::from_secs(120), &what, || async {
        if let Ok(Some(s)) = secrets.get_opt(secret).await
            && s.data.is_some_and(|d| d.contains_key("kubeconfig"))
        {
            return Ok(Ok(()));
        }
        // Not yet: what the operator and cert-manager report, for the message if it never comes.
        let kc: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &kubeconfig_resource());
        let status = kc
            .list(&Default::default())
            .await
            .map(|l| l.items.into_iter().map(|o| o.data["status"].to_string()).collect::<Vec<_>>().join("; "));
        let certs: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &certificate_resource());
        let certs = certs.list(&Default::default()).await.map(|l| {
            l.items
                .into_iter()
                .map(|o| format!("{}: {}", o.metadata.name.unwrap_or_default(), o.data["status"]["conditions"]))
                .collect::<Vec<_>>()
                .join("; ")
        });
        Ok(Err(format!("Kubeconfig status {status:?}; Certificates {certs:?}")))
    })
    .await?;
    eprintln!(
        "testbed: the kcp-operator rendered {ns}/{secret} {:.1?} after its objects were applied",
        started.elapsed()
    );
    Ok(())
}
