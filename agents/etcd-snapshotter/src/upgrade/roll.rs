//! Whether the operator's roll of a shard may have begun before a snapshot's content was fixed. The agent cannot
//! hold the roll back, so after the snapshot it looks: a pod of the shard (the kcp-operator's labels on the
//! object's Deployment) whose kcp container runs another image than the one the snapshot is labelled with, and
//! that was created at or before the snapshot's `startedAt`, may have written to etcd before the snapshot. Then
//! its manifest says `afterRollMayHaveBegun`.
//!
//! A pod exists before its container starts, and the API server records its creation at once (a container's
//! start reaches the API only when the kubelet reports it), so a pod created after `startedAt` cannot have
//! written to the snapshot's etcd revision. Creation times are whole seconds, cut down: a pod created in the
//! second of `startedAt` counts as before it. The pods cannot be read (no RBAC, the API down): the snapshot is
//! marked, because nothing shows the roll had not begun.

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::{Kind, Watched};

/// The container the kcp-operator runs kcp in, in every shard's pod.
const KCP_CONTAINER: &str = "kcp";

/// Looks, once a snapshot's content is fixed, for a sign that the roll began before it.
pub trait Roll: Send + Sync {
    /// Why the roll may have begun by `started_at` (a pod, or the pods unreadable), or `None`.
    fn begun_by(&self, started_at: DateTime<Utc>) -> BoxFuture<'_, Option<String>>;
}

/// The shard's pods, listed by the labels the kcp-operator gives the Deployment of a RootShard or Shard.
pub struct Pods {
    pub client: kube::Client,
    pub watched: Watched,
    /// The image the snapshot is labelled with (the one before the change).
    pub from: String,
}

impl Pods {
    fn selector(&self) -> String {
        let component = match self.watched.kind {
            Kind::RootShard => "rootshard",
            Kind::Shard => "shard",
        };
        format!(
            "app.kubernetes.io/managed-by=kcp-operator,app.kubernetes.io/component={component},app.kubernetes.io/instance={}",
            self.watched.name
        )
    }
}

impl Roll for Pods {
    fn begun_by(&self, started_at: DateTime<Utc>) -> BoxFuture<'_, Option<String>> {
        Box::pin(async move {
            let api = Api::<Pod>::namespaced(self.client.clone(), &self.watched.namespace);
            match api.list(&ListParams::default().labels(&self.selector())).await {
                Ok(pods) => first_new(&pods.items, &self.from, started_at),
                Err(error) => Some(format!(
                    "the pods of {} could not be listed ({error}), so nothing shows the roll had not begun",
                    self.watched.describe()
                )),
            }
        })
    }
}

/// The first pod in `pods` that runs kcp from another image than `from` and was created at or before
/// `started_at` (its whole second), described.
fn first_new(pods: &[Pod], from: &str, started_at: DateTime<Utc>) -> Option<String> {
    pods.iter().find_map(|pod| {
        let created = pod.metadata.creation_timestamp.as_ref()?.0;
        let containers = &pod.spec.as_ref()?.containers;
        // The kcp container when the pod names one; otherwise any container (a renamed one still counts).
        let kcp: Vec<_> = containers.iter().filter(|c| c.name == KCP_CONTAINER).collect();
        let candidates = if kcp.is_empty() { containers.iter().collect() } else { kcp };
        let image = candidates.iter().filter_map(|c| c.image.as_deref()).find(|image| *image != from)?;
        let created = DateTime::<Utc>::from_timestamp(created.as_second(), 0)?;
        (created <= started_at).then(|| {
            let name = pod.metadata.name.as_deref().unwrap_or("?");
            format!("pod {name} runs {image} and was created at {created:?}, by the snapshot's start {started_at:?}")
        })
    })
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    use super::first_new;

    const OLD: &str = "ghcr.io/kcp-dev/kcp:v0.32.3";
    const NEW: &str = "ghcr.io/kcp-dev/kcp:v0.32.4";

    fn pod(name: &str, created: &str, containers: &[(&str, &str)]) -> Pod {
        let containers: Vec<_> = containers.iter().map(|(n, i)| json!({"name": n, "image": i})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"containers": containers},
        }))
        .unwrap()
    }

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    #[test]
    fn a_new_image_pod_created_in_or_before_the_snapshots_second_marks_it_and_a_later_or_old_image_one_does_not() {
        let started = at("2026-12-06T20:28:22.021Z");
        let old = pod("old", "2026-12-06T20:00:00Z", &[("kcp", OLD)]);
        let later = pod("later", "2026-12-06T20:28:23Z", &[("kcp", NEW)]);
        assert_eq!(first_new(&[old.clone(), later], OLD, started), None);
        // Created somewhere in 20:28:22: perhaps before 22.021, so it counts.
        let same_second = pod("same", "2026-12-06T20:28:22Z", &[("kcp", NEW)]);
        let found = first_new(&[old.clone(), same_second], OLD, started).unwrap();
        assert!(found.contains("pod same runs ghcr.io/kcp-dev/kcp:v0.32.4"), "{found}");
        let before = pod("before", "2026-12-06T20:28:21Z", &[("kcp", NEW)]);
        assert!(first_new(&[before], OLD, started).is_some());
    }

    #[test]
    fn only_the_kcp_container_counts_when_the_pod_has_one_and_any_container_when_it_has_none() {
        let started = at("2026-12-06T20:28:22Z");
        let sidecar = pod("sidecar", "2026-12-06T20:28:00Z", &[("kcp", OLD), ("proxy", "nginx:1")]);
        assert_eq!(first_new(&[sidecar], OLD, started), None);
        let renamed = pod("renamed", "2026-12-06T20:28:00Z", &[("server", NEW)]);
        assert!(first_new(&[renamed], OLD, started).is_some());
    }
}
