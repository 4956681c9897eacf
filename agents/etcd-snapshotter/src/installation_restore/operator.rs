//! Stopping and starting kcp the way the kcp-operator allows: through `spec.replicas` of its objects (and the
//! RootShard's `spec.proxy.replicas`), since the operator owns the Deployments and reverts a direct scale at
//! once, and has no pause. The objects of one installation are the RootShard and the Shards and FrontProxies
//! in its namespace whose `spec.rootShard.ref.name` names it. The replicas each object asked for before are
//! recorded (in the restore's record in the bucket) before any is changed, and given back afterwards, `unset`
//! as unset. "Stopped" and "started" are read from the pods the operator labels, never from the objects'
//! phase (a Deployment at 0 is Available).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How often the pods are looked at while waiting.
const POLL: Duration = Duration::from_secs(2);

/// The kinds of the kcp-operator an installation restore scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    RootShard,
    Shard,
    FrontProxy,
}

impl Kind {
    fn plural(self) -> &'static str {
        match self {
            Kind::RootShard => "rootshards",
            Kind::Shard => "shards",
            Kind::FrontProxy => "frontproxies",
        }
    }
}

/// One object and the replicas it asked for before the restore (`None`: unset, the operator's default).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Saved {
    pub kind: Kind,
    pub name: String,
    pub replicas: Option<i64>,
    /// The RootShard's `spec.proxy.replicas` (its internal proxy); `None` for the others or when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_replicas: Option<i64>,
}

impl Saved {
    pub fn describe(&self) -> String {
        let replicas = |r: Option<i64>| r.map_or_else(|| "unset".to_string(), |r| r.to_string());
        match self.kind {
            Kind::RootShard => format!(
                "RootShard {} (replicas {}, proxy replicas {})",
                self.name,
                replicas(self.replicas),
                replicas(self.proxy_replicas)
            ),
            kind => format!("{kind:?} {} (replicas {})", self.name, replicas(self.replicas)),
        }
    }
}

/// The installation's objects in one namespace: the RootShard first, then its Shards, then its FrontProxies.
pub struct Installation {
    pub client: kube::Client,
    pub namespace: String,
    pub objects: Vec<Saved>,
}

fn api(client: &kube::Client, namespace: &str, kind: Kind) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("operator.kcp.io", "v1alpha1", &format!("{kind:?}"));
    Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk_with_plural(&gvk, kind.plural()))
}

fn replicas(object: &DynamicObject, path: &[&str]) -> Option<i64> {
    path.iter().try_fold(&object.data, |value, key| value.get(key)).and_then(Value::as_i64)
}

/// Reads the RootShard `namespace/name` and the Shards and FrontProxies that name it, with their replicas.
pub async fn discover(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<Installation> {
    let root = api(client, namespace, Kind::RootShard)
        .get(name)
        .await
        .with_context(|| format!("reading RootShard {namespace}/{name}"))?;
    let mut objects = vec![Saved {
        kind: Kind::RootShard,
        name: name.into(),
        replicas: replicas(&root, &["spec", "replicas"]),
        proxy_replicas: replicas(&root, &["spec", "proxy", "replicas"]),
    }];
    for kind in [Kind::Shard, Kind::FrontProxy] {
        let listed = api(client, namespace, kind)
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing the {} in {namespace}", kind.plural()))?;
        let mut mine: Vec<_> = listed
            .items
            .iter()
            .filter(|o| o.data.pointer("/spec/rootShard/ref/name").and_then(Value::as_str) == Some(name))
            .map(|o| Saved {
                kind,
                name: o.metadata.name.clone().unwrap_or_default(),
                replicas: replicas(o, &["spec", "replicas"]),
                proxy_replicas: None,
            })
            .collect();
        mine.sort_by(|a, b| a.name.cmp(&b.name));
        objects.extend(mine);
    }
    Ok(Installation { client: client.clone(), namespace: namespace.into(), objects })
}

impl Installation {
    /// The Shards' names (the shards of the configuration besides the root shard).
    pub fn shard_names(&self) -> Vec<&str> {
        self.objects.iter().filter(|o| o.kind == Kind::Shard).map(|o| o.name.as_str()).collect()
    }

    /// Scales every object to 0 (the front proxies first, the root shard last) and waits until none of their
    /// server pods is left.
    pub async fn stop(&self, timeout: Duration) -> anyhow::Result<()> {
        for saved in self.objects.iter().rev() {
            self.scale(saved, Some(0), Some(0)).await?;
        }
        let all: Vec<&Saved> = self.objects.iter().collect();
        self.wait_pods(&all, timeout, "stopped", |pods| pods.is_empty().then_some(())).await
    }

    /// Gives every object of `kind` its replicas back and waits until each has that many Ready pods (at least
    /// one where the replicas were unset) and no other.
    pub async fn start(&self, kind: Kind, timeout: Duration) -> anyhow::Result<()> {
        let these: Vec<&Saved> = self.objects.iter().filter(|o| o.kind == kind).collect();
        for saved in &these {
            self.scale(saved, saved.replicas, saved.proxy_replicas).await?;
        }
        self.wait_pods(&these, timeout, "started", |pods| these.iter().all(|saved| started(pods, saved)).then_some(()))
            .await
    }

    async fn scale(&self, saved: &Saved, replicas: Option<i64>, proxy: Option<i64>) -> anyhow::Result<()> {
        let mut patch = json!({"spec": {"replicas": replicas}});
        if saved.kind == Kind::RootShard {
            patch["spec"]["proxy"] = json!({"replicas": proxy});
        }
        api(&self.client, &self.namespace, saved.kind)
            .patch(&saved.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("setting the replicas of {:?} {}/{}", saved.kind, self.namespace, saved.name))?;
        Ok(())
    }

    /// Polls the server pods of `objects` until `done` says so, or fails after `timeout` naming what is left.
    async fn wait_pods(
        &self,
        objects: &[&Saved],
        timeout: Duration,
        what: &str,
        done: impl Fn(&[Pod]) -> Option<()>,
    ) -> anyhow::Result<()> {
        let pods = Api::<Pod>::namespaced(self.client.clone(), &self.namespace);
        let names: BTreeSet<&str> = objects.iter().map(|o| o.name.as_str()).collect();
        let selector = format!(
            "app.kubernetes.io/managed-by=kcp-operator,app.kubernetes.io/instance in ({})",
            names.iter().copied().collect::<Vec<_>>().join(",")
        );
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let listed = pods.list(&ListParams::default().labels(&selector)).await.context("listing kcp's pods")?;
            let ours: Vec<Pod> = listed.items.into_iter().filter(|p| objects.iter().any(|o| server_of(p, o))).collect();
            if done(&ours).is_some() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                let left: Vec<String> = ours
                    .iter()
                    .map(|p| {
                        let ready = if is_ready(p) { "ready" } else { "not ready" };
                        format!("{} ({ready})", p.metadata.name.as_deref().unwrap_or("?"))
                    })
                    .collect();
                anyhow::bail!("kcp was not {what} within {timeout:?}: pods {}", left.join(", "));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Whether `saved`'s pods are all Ready, none being deleted, and as many as it asks for (at least one where
/// its replicas are unset); the RootShard's proxy pods likewise by `proxy_replicas`.
fn started(pods: &[Pod], saved: &Saved) -> bool {
    let own: Vec<&Pod> = pods.iter().filter(|p| server_of(p, saved)).collect();
    let count = |proxy: bool| own.iter().filter(|p| is_root_proxy(p) == proxy).count() as i64;
    let proxy_wanted = if saved.kind == Kind::RootShard { saved.proxy_replicas.unwrap_or(1) } else { 0 };
    own.iter().all(|p| is_ready(p)) && count(false) >= saved.replicas.unwrap_or(1) && count(true) >= proxy_wanted
}

/// The object a pod serves, by the operator's labels (the RootShard's proxy pods count as the RootShard's).
fn instance_of(pod: &Pod) -> Option<(Kind, &str)> {
    let labels = pod.metadata.labels.as_ref()?;
    let instance = labels.get("app.kubernetes.io/instance")?.as_str();
    let kind = match labels.get("app.kubernetes.io/component")?.as_str() {
        "rootshard" | "rootshard-proxy" => Kind::RootShard,
        "shard" => Kind::Shard,
        "front-proxy" => Kind::FrontProxy,
        _ => return None,
    };
    Some((kind, instance))
}

fn server_of(pod: &Pod, saved: &Saved) -> bool {
    instance_of(pod).is_some_and(|(kind, name)| kind == saved.kind && name == saved.name)
}

/// Whether `pod` is the RootShard's internal proxy rather than kcp itself.
fn is_root_proxy(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("app.kubernetes.io/component"))
        .is_some_and(|c| c == "rootshard-proxy")
}

fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(component: &str, instance: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{instance}-{component}"), "labels": {
                "app.kubernetes.io/managed-by": "kcp-operator",
                "app.kubernetes.io/component": component, "app.kubernetes.io/instance": instance}},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_belongs_to_its_object_by_the_operators_labels_and_the_root_proxy_counts_as_the_root_shards() {
        assert_eq!(instance_of(&pod("rootshard-proxy", "root", true)), Some((Kind::RootShard, "root")));
        assert_eq!(instance_of(&pod("shard", "alpha", true)), Some((Kind::Shard, "alpha")));
        assert_eq!(instance_of(&pod("front-proxy", "frontproxy", false)), Some((Kind::FrontProxy, "frontproxy")));
        assert_eq!(instance_of(&pod("cache-server", "root", true)), None);
        assert!(is_ready(&pod("shard", "alpha", true)) && !is_ready(&pod("shard", "alpha", false)));
        let saved = Saved { kind: Kind::Shard, name: "alpha".into(), replicas: Some(1), proxy_replicas: None };
        assert!(server_of(&pod("shard", "alpha", true), &saved));
        assert!(!server_of(&pod("rootshard", "alpha", true), &saved));
    }
}
