//! Building blocks for an agent's `rbac` one-shot: Roles rendered from the configuration, so that what an agent
//! is granted and what it reads cannot drift apart. The agent decides the rules; these helpers give every agent
//! the same object shapes, labels and YAML layout.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::ObjectMeta;

/// Who the Roles are bound to, and where its Lease lives.
#[derive(Debug, Clone)]
pub struct Subjects {
    /// The agent's namespace (its ServiceAccount and Lease).
    pub namespace: String,
    pub service_account: String,
    pub lease_name: String,
}

/// A rule on `resource` in API group `group`, limited to `names` when there are any.
pub fn rule<'a>(
    group: &str,
    resource: &str,
    names: impl IntoIterator<Item = &'a String>,
    verbs: &[&str],
) -> PolicyRule {
    let names: Vec<String> = names.into_iter().cloned().collect();
    PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        resource_names: (!names.is_empty()).then_some(names),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    }
}

/// The agent's own Lease: get and update by name; create cannot be limited by name (it is not in the URL).
pub fn lease_rules(who: &Subjects) -> Vec<PolicyRule> {
    let lease = [who.lease_name.clone()];
    vec![
        rule("coordination.k8s.io", "leases", &lease, &["get", "update"]),
        rule("coordination.k8s.io", "leases", &[], &["create"]),
    ]
}

/// A Role named `name` in `namespace` with `rules`, and its binding to the agent's ServiceAccount.
pub fn role_and_binding(
    name: &str,
    agent: &str,
    namespace: &str,
    rules: Vec<PolicyRule>,
    who: &Subjects,
) -> (Role, RoleBinding) {
    let meta = ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        labels: Some(BTreeMap::from([("app.kubernetes.io/name".to_string(), agent.to_string())])),
        ..Default::default()
    };
    let binding = RoleBinding {
        metadata: meta.clone(),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: name.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: who.service_account.clone(),
            namespace: Some(who.namespace.clone()),
            ..Default::default()
        }]),
    };
    (Role { metadata: meta, rules: Some(rules) }, binding)
}

/// Multi-document YAML of Role/RoleBinding pairs, in the order given.
pub fn to_yaml(pairs: &[(Role, RoleBinding)]) -> Result<String, serde_yaml::Error> {
    let mut docs = Vec::new();
    for (role, binding) in pairs {
        docs.push(document("Role", role)?);
        docs.push(document("RoleBinding", binding)?);
    }
    Ok(docs.join("---\n"))
}

/// One object as YAML with `apiVersion` and `kind` first, as people write them.
pub fn document(kind: &str, object: &impl serde::Serialize) -> Result<String, serde_yaml::Error> {
    let mut value = serde_yaml::to_value(object)?;
    let mut out = serde_yaml::Mapping::new();
    out.insert("apiVersion".into(), "rbac.authorization.k8s.io/v1".into());
    out.insert("kind".into(), kind.into());
    if let serde_yaml::Value::Mapping(fields) = &mut value {
        for (k, v) in std::mem::take(fields) {
            out.insert(k, v);
        }
    }
    serde_yaml::to_string(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_name_objects_only_when_given_names_and_yaml_starts_with_the_kind() {
        let names = ["a".to_string()];
        assert_eq!(rule("", "secrets", &names, &["get"]).resource_names, Some(vec!["a".to_string()]));
        assert_eq!(rule("", "secrets", &[], &["get"]).resource_names, None);
        let who = Subjects { namespace: "ns".into(), service_account: "sa".into(), lease_name: "l".into() };
        let yaml = to_yaml(&[role_and_binding("r", "agent", "ns", lease_rules(&who), &who)]).unwrap();
        assert!(yaml.starts_with("apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n"), "{yaml}");
        assert!(yaml.contains("---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n"), "{yaml}");
    }
}
