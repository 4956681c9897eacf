//! The RBAC the daemon needs, printed by `etcd-snapshotter rbac`: it touches Kubernetes only for its Lease
//! (leader election, and the schedule record patched onto it) and for Events about that Lease. Snapshots go
//! to S3 and etcd, never through the apiserver. `create` on Leases cannot be limited by name (the name is not
//! in the URL of a create).

/// Role and RoleBinding in `namespace` for ServiceAccount `service_account`, Lease `lease_name`.
pub fn render(namespace: &str, service_account: &str, lease_name: &str) -> String {
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: etcd-snapshotter
  namespace: {namespace}
rules:
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  resourceNames: [{lease_name}]
  verbs: [get, update, patch]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [create]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: etcd-snapshotter
  namespace: {namespace}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: etcd-snapshotter
subjects:
- kind: ServiceAccount
  name: {service_account}
  namespace: {namespace}
"
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_docs_show_exactly_what_rbac_prints() {
        let docs = include_str!("../../../docs/etcd-snapshotter.md");
        let printed = super::render("kcp-keeper", "etcd-snapshotter", "kcp-keeper-etcd-snapshotter");
        assert!(docs.contains(&format!("```yaml\n{printed}```")), "docs/etcd-snapshotter.md#rbac is stale:\n{printed}");
    }
}
