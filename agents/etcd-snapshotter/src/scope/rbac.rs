//! The RBAC the daemon needs, printed by `etcd-snapshotter rbac`, for the [`Lease`] it names: get, update and
//! patch on that Lease by name (leader election, and each schedule's tick patched onto it), create on Leases
//! (a create cannot be limited by name: the name is not in its URL), and create on Events: the part that does
//! not depend on the configuration (`upgrade::rbac` adds reads of the objects `beforeUpgrade` watches).

use kcp_keeper_runtime::rbac::{Rbac, Subjects, rule};

use super::Lease;

/// The Role's (and its binding's) name, which the chart's Role keeps.
pub const ROLE: &str = "etcd-snapshotter";

/// One Role in the agent's namespace, bound to its ServiceAccount.
pub fn render(agent: &str, who: &Subjects) -> Rbac {
    let lease = Lease::of(who);
    let rules = vec![
        rule("coordination.k8s.io", &["leases"], &[&lease.name], &["get", "update", "patch"]),
        rule("coordination.k8s.io", &["leases"], &[], &["create"]),
        rule("events.k8s.io", &["events"], &[], &["create"]),
    ];
    let mut rbac = Rbac::default();
    rbac.add(&lease.namespace, ROLE, agent, rules, who);
    rbac
}

#[cfg(test)]
mod tests {
    use kcp_keeper_runtime::rbac::Subjects;

    #[test]
    fn the_docs_show_exactly_what_rbac_prints() {
        let docs = include_str!("../../../../docs/etcd-snapshotter.md");
        let who = Subjects::defaults("kcp-keeper", "etcd-snapshotter");
        let printed = super::render("etcd-snapshotter", &who).to_yaml().unwrap();
        assert!(docs.contains(&format!("```yaml\n{printed}```")), "docs/etcd-snapshotter.md#rbac is stale:\n{printed}");
    }
}
