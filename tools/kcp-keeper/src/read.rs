//! The cluster reads: the kcp-operator objects and the etcd StatefulSets into a [`Layout`], the hub's OIDC
//! settings, one key of a Secret. Each read returns exactly what a rule needs.

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};

use crate::layout::{Component, EtcdSet, Kind, Layout, Oidc};
use crate::options::{CaSource, HubOidc, KeyRef};

fn resource(kind: Kind) -> ApiResource {
    let (k, plural) = match kind {
        Kind::RootShard => ("RootShard", "rootshards"),
        Kind::Shard => ("Shard", "shards"),
        Kind::FrontProxy => ("FrontProxy", "frontproxies"),
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("operator.kcp.io", "v1alpha1", k), plural)
}

/// Every RootShard, Shard and FrontProxy of `namespace`, and every StatefulSet of the namespaces their etcd
/// endpoints name.
pub async fn layout(client: &kube::Client, namespace: &str) -> Result<Layout> {
    let mut components = Vec::new();
    for kind in [Kind::RootShard, Kind::Shard, Kind::FrontProxy] {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource(kind));
        let list = api
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing {}s in {namespace}", kind.lower()))?;
        for object in list.items {
            let name = object.metadata.name.clone().unwrap_or_default();
            let spec = object.data.get("spec").cloned().unwrap_or_default();
            components.push(
                Component::parse(kind, &name, &spec)
                    .with_context(|| format!("{}/{name} has a spec of the wrong shape", kind.lower()))?,
            );
        }
    }
    let mut namespaces: Vec<String> = vec![namespace.to_string()];
    for c in &components {
        for e in &c.etcd_endpoints {
            let host = e.split_once("://").map_or(e.as_str(), |(_, r)| r).split([':', '/']).next().unwrap_or("");
            let labels: Vec<&str> = host.split('.').collect();
            if let Some(i) = labels.iter().position(|l| *l == "svc").filter(|i| *i >= 2) {
                namespaces.push(labels[i - 1].to_string());
            }
        }
    }
    namespaces.sort();
    namespaces.dedup();
    let mut etcds = Vec::new();
    for ns in namespaces {
        let api: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
        let list = api.list(&ListParams::default()).await.with_context(|| format!("listing StatefulSets in {ns}"))?;
        etcds.extend(list.items.iter().filter_map(EtcdSet::from_statefulset));
    }
    Ok(Layout { components, etcds })
}

/// The hub's OIDC settings, from a file or a ConfigMap key.
pub async fn hub_oidc(client: &kube::Client, source: &HubOidc) -> Result<Oidc> {
    let (text, from) = match source {
        HubOidc::File(path) => (
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
            path.display().to_string(),
        ),
        HubOidc::ConfigMap(r) => {
            let cm = Api::<ConfigMap>::namespaced(client.clone(), &r.namespace)
                .get(&r.name)
                .await
                .with_context(|| format!("reading ConfigMap {}/{}", r.namespace, r.name))?;
            let text =
                cm.data.and_then(|mut d| d.remove(&r.key)).with_context(|| format!("ConfigMap {r} has no such key"))?;
            (text, format!("configmap {r}"))
        }
    };
    serde_yaml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("the hub's OIDC settings in {from} do not parse: {}", location(&e)))
}

/// Where a YAML error is, without the text around it (which may be someone's secret).
pub fn location(e: &serde_yaml::Error) -> String {
    e.location()
        .map_or("not a mapping of the OIDC fields".into(), |l| format!("line {} column {}", l.line(), l.column()))
}

/// The bytes of one Secret key. The Secret's other keys are dropped here, unread.
pub async fn secret_key(client: &kube::Client, r: &KeyRef) -> Result<Vec<u8>> {
    let secret = Api::<Secret>::namespaced(client.clone(), &r.namespace)
        .get(&r.name)
        .await
        .with_context(|| format!("reading Secret {}/{}", r.namespace, r.name))?;
    let value =
        secret.data.and_then(|mut d| d.remove(&r.key)).with_context(|| format!("Secret {r} has no such key"))?;
    Ok(value.0)
}

/// The bytes of one ConfigMap key (`data`, else `binaryData`).
pub async fn configmap_key(client: &kube::Client, r: &KeyRef) -> Result<Vec<u8>> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &r.namespace)
        .get(&r.name)
        .await
        .with_context(|| format!("reading ConfigMap {}/{}", r.namespace, r.name))?;
    if let Some(text) = cm.data.and_then(|mut d| d.remove(&r.key)) {
        return Ok(text.into_bytes());
    }
    let value =
        cm.binary_data.and_then(|mut d| d.remove(&r.key)).with_context(|| format!("ConfigMap {r} has no such key"))?;
    Ok(value.0)
}

/// A CA bundle from where `source` says.
pub async fn ca_bundle(client: &kube::Client, source: &CaSource) -> Result<Vec<u8>> {
    match source {
        CaSource::ConfigMap(r) => configmap_key(client, r).await,
        CaSource::Secret(r) => secret_key(client, r).await,
    }
}

/// The first container's image of a Deployment: `deployment/<ns>/<name>` and the image, or why there is none.
pub async fn deployment_image(client: &kube::Client, r: &crate::options::ObjectRef) -> crate::rules::pairing::Read {
    use k8s_openapi::api::apps::v1::Deployment;
    let subject = format!("deployment/{r}");
    let image = match Api::<Deployment>::namespaced(client.clone(), &r.namespace).get_opt(&r.name).await {
        Err(e) => Err(format!("reading Deployment {r}: {e}")),
        Ok(None) => Err(format!("no Deployment {r}")),
        Ok(Some(d)) => d
            .spec
            .template
            .spec
            .and_then(|s| s.containers.into_iter().next())
            .and_then(|c| c.image)
            .ok_or_else(|| format!("Deployment {r} names no image")),
    };
    (subject, image)
}

/// The pods of release `release` in `namespace` (the chart's selector labels, [`selector`]).
///
/// [`selector`]: crate::rules::agent_pods::selector
pub async fn release_pods(
    client: &kube::Client,
    namespace: &str,
    release: &str,
) -> Result<Vec<k8s_openapi::api::core::v1::Pod>> {
    let api = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), namespace);
    let list = api
        .list(&ListParams::default().labels(&crate::rules::agent_pods::selector(release)))
        .await
        .with_context(|| format!("listing pods in {namespace}"))?;
    Ok(list.items)
}

/// The NetworkPolicies of `namespace` that the chart rendered (labelled [`SELECTOR`]).
///
/// [`SELECTOR`]: crate::rules::network_policy::SELECTOR
pub async fn network_policies(
    client: &kube::Client,
    namespace: &str,
) -> Result<Vec<k8s_openapi::api::networking::v1::NetworkPolicy>> {
    let api = Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(client.clone(), namespace);
    let list = api
        .list(&ListParams::default().labels(crate::rules::network_policy::SELECTOR))
        .await
        .with_context(|| format!("listing NetworkPolicies in {namespace}"))?;
    Ok(list.items)
}
