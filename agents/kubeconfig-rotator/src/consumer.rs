//! Read-once consumers (Deployments, StatefulSets, DaemonSets): what the agent reads from one and the annotations
//! it writes to restart it. Every kind rolls its pods when its pod template changes, so a restart is one
//! pod-template annotation, as `kubectl rollout restart` does; the notAfter of what it was restarted for goes on
//! the object's own metadata (no roll) so a restart window knows how long the consumer may wait. Pure.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::config::ConsumerKind;
use crate::credential::rfc3339;
use crate::target::RESTART_ANNOTATION_PREFIX;

/// Metadata annotation on a consumer, `<prefix><kubeconfig>` = the notAfter (RFC 3339) of the credential it was
/// last restarted for.
pub const HELD_NOT_AFTER_PREFIX: &str = "kcp-keeper.io/restarted-not-after-";

/// A workload kind whose pod template rolls its pods.
pub trait Workload:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Serialize
    + Debug
    + Send
    + Sync
    + 'static
{
    fn template(&self) -> &PodTemplateSpec;
}

impl Workload for Deployment {
    fn template(&self) -> &PodTemplateSpec {
        &self.spec.template
    }
}

impl Workload for StatefulSet {
    fn template(&self) -> &PodTemplateSpec {
        &self.spec.template
    }
}

impl Workload for DaemonSet {
    fn template(&self) -> &PodTemplateSpec {
        &self.spec.template
    }
}

/// The content hash `live` was last restarted for by kubeconfig `kubeconfig`.
pub fn restarted_for<K: Workload>(live: &K, kubeconfig: &str) -> Option<String> {
    let key = format!("{RESTART_ANNOTATION_PREFIX}{kubeconfig}");
    live.template().metadata.as_ref()?.annotations.as_ref()?.get(&key).cloned()
}

/// The notAfter of the credential `live` was last restarted for. Anyone who can edit the workload can write it:
/// anything but an RFC 3339 time is unknown (and unknown means "restart at once").
pub fn held_not_after<K: Workload>(live: &K, kubeconfig: &str) -> Option<OffsetDateTime> {
    let text = live.annotations().get(&format!("{HELD_NOT_AFTER_PREFIX}{kubeconfig}"))?;
    OffsetDateTime::parse(text, &Rfc3339).ok()
}

/// The fields a restart for content `hash` (valid until `not_after`) applies to consumer `namespace/name`.
pub fn restart_patch(
    kind: ConsumerKind,
    namespace: &str,
    name: &str,
    kubeconfig: &str,
    hash: &str,
    not_after: OffsetDateTime,
) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": kind.as_str(),
        "metadata": {
            "name": name, "namespace": namespace,
            "annotations": {format!("{HELD_NOT_AFTER_PREFIX}{kubeconfig}"): rfc3339(not_after)},
        },
        "spec": {"template": {"metadata": {"annotations": {format!("{RESTART_ANNOTATION_PREFIX}{kubeconfig}"): hash}}}},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_garbled_held_not_after_is_unknown() {
        let mut d = Deployment::default();
        let key = format!("{HELD_NOT_AFTER_PREFIX}hub");
        d.metadata.annotations = Some([(key.clone(), "next tuesday".to_string())].into());
        assert_eq!(held_not_after(&d, "hub"), None);
        d.metadata.annotations = Some([(key, "2027-01-01T00:00:00Z".to_string())].into());
        assert_eq!(held_not_after(&d, "hub"), Some(time::macros::datetime!(2027-01-01 00:00 UTC)));
    }

    #[test]
    fn the_restart_patch_names_the_kind_and_both_annotations() {
        let at = time::macros::datetime!(2027-01-01 00:00 UTC);
        let p = restart_patch(ConsumerKind::StatefulSet, "ns", "db", "hub", "abc", at);
        assert_eq!(p["kind"], "StatefulSet");
        assert_eq!(p["spec"]["template"]["metadata"]["annotations"]["kcp-keeper.io/restarted-for-hub"], "abc");
        assert_eq!(p["metadata"]["annotations"]["kcp-keeper.io/restarted-not-after-hub"], "2027-01-01T00:00:00Z");
    }
}
