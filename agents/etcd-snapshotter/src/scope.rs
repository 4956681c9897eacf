//! What the agent names in Kubernetes: its own [`Lease`], and, for each shard with `beforeUpgrade`, the
//! kcp-operator object whose kcp image it watches ([`watched`]: by name, Events in its namespace; the leader's
//! watch is `upgrade::watch`). Snapshots go to etcd and S3, drills to S3 and to processes on loopback, never
//! through the apiserver; the Lease holds the leader election and each schedule's tick record, and the
//! snapshots' Events are about it. [`rbac`] grants exactly this, from the same plan.

pub mod rbac;

use k8s_openapi::api::core::v1::ObjectReference;
use kcp_keeper_runtime::agent::Context;
use kcp_keeper_runtime::rbac::Subjects;

use crate::config::{Config, Shard};
use crate::upgrade::Watched;

/// The agent's Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub namespace: String,
    pub name: String,
}

impl Lease {
    /// The Lease `rbac` grants: in the agent's namespace, by the name the runtime elects on.
    pub fn of(who: &Subjects) -> Self {
        Self { namespace: who.namespace.clone(), name: who.lease_name.clone() }
    }

    /// The Lease the daemon runs on (the runtime's, with leader election on or off).
    pub fn of_daemon(ctx: &Context<Config>) -> Self {
        Self { namespace: ctx.namespace.clone(), name: ctx.lease_name.clone() }
    }

    /// The Events' `regarding`.
    pub fn regarding(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            ..Default::default()
        }
    }
}

/// The objects the daemon watches: each shard with `beforeUpgrade` and the operator's object it names.
pub fn watched(config: &Config) -> impl Iterator<Item = (&Shard, &Watched)> {
    config.shards.iter().filter_map(|shard| shard.before_upgrade.as_ref().map(|watched| (shard, watched)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_about_the_lease_rbac_grants() {
        let who = Subjects::defaults("kcp-keeper", "etcd-snapshotter");
        let regarding = Lease::of(&who).regarding();
        assert_eq!(regarding.kind.as_deref(), Some("Lease"));
        assert_eq!(regarding.namespace.as_deref(), Some("kcp-keeper"));
        assert_eq!(regarding.name.as_deref(), Some("kcp-keeper-etcd-snapshotter"));
    }
}
