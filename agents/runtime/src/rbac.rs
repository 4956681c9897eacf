//! The one RBAC type every agent's `rbac` one-shot renders through ([`Rbac`]): the Roles and ClusterRoles a
//! configuration needs, rendered from the same configuration the watches are built from, so that what an
//! agent is granted and what it reads cannot drift apart. The agent decides the rules ([`crate::agent::Agent::rbac`]);
//! this gives every agent the same object shapes, labels and YAML layout.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::ObjectMeta;

/// Who the Roles are bound to, and where its Lease lives.
#[derive(Debug, Clone)]
pub struct Subjects {
    /// The agent's namespace (its ServiceAccount and Lease).
    pub namespace: String,
    pub service_account: String,
    pub lease_name: String,
}

impl Subjects {
    /// An agent's defaults in `namespace`: its ServiceAccount named after it, its Lease `kcp-keeper-<agent>`
    /// (what `rbac` prints without `--service-account` and `--lease-name`).
    pub fn defaults(namespace: &str, agent: &str) -> Self {
        Self {
            namespace: namespace.into(),
            service_account: agent.into(),
            lease_name: crate::lease::default_name(agent),
        }
    }

    /// The ServiceAccount as a binding's subject.
    pub fn subject(&self) -> Subject {
        Subject {
            kind: "ServiceAccount".into(),
            name: self.service_account.clone(),
            namespace: Some(self.namespace.clone()),
            ..Default::default()
        }
    }
}

/// Everything an agent needs, ready to apply: Roles (namespaced) and ClusterRoles, each bound to the agent's
/// ServiceAccount by a binding of the same name.
#[derive(Debug, Default, Clone)]
pub struct Rbac {
    pub roles: Vec<Role>,
    pub role_bindings: Vec<RoleBinding>,
    pub cluster_roles: Vec<ClusterRole>,
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    /// What a grant gives beyond what the agent reads, per Role (namespace, name): printed as comments above it.
    pub notes: Vec<(String, String, String)>,
}

impl Rbac {
    /// Adds Role `name` in `namespace` with `rules`, bound to `who`'s ServiceAccount; `app` labels both.
    pub fn add(&mut self, namespace: &str, name: &str, app: &str, rules: Vec<PolicyRule>, who: &Subjects) {
        let meta = meta(Some(namespace), name, app);
        self.roles.push(Role { metadata: meta.clone(), rules: Some(rules) });
        self.role_bindings.push(RoleBinding {
            metadata: meta,
            role_ref: role_ref("Role", name),
            subjects: Some(vec![who.subject()]),
        });
    }

    /// Adds ClusterRole `name` with `rules`, bound to `who`'s ServiceAccount; `app` labels both.
    pub fn add_cluster(&mut self, name: &str, app: &str, rules: Vec<PolicyRule>, who: &Subjects) {
        let meta = meta(None, name, app);
        self.cluster_roles.push(ClusterRole { metadata: meta.clone(), rules: Some(rules), ..Default::default() });
        self.cluster_role_bindings.push(ClusterRoleBinding {
            metadata: meta,
            role_ref: role_ref("ClusterRole", name),
            subjects: Some(vec![who.subject()]),
        });
    }

    /// Says, above Role `name` in `namespace`, what one of its grants lets the token do that the agent itself
    /// does not (a `list` that returns objects the agent's label selector never asks for): whoever applies the
    /// output reads it there.
    pub fn note(&mut self, namespace: &str, name: &str, text: impl Into<String>) {
        self.notes.push((namespace.into(), name.into(), text.into()));
    }

    /// Multi-document YAML in a stable order: each Role (after its notes, as comments) followed by its
    /// RoleBinding, in the order added, then each ClusterRole with its binding.
    pub fn to_yaml(&self) -> Result<String, serde_yaml::Error> {
        let mut docs = Vec::new();
        for (role, binding) in self.roles.iter().zip(&self.role_bindings) {
            let (ns, name) = (role.metadata.namespace.as_deref(), role.metadata.name.as_deref());
            let notes: String = self
                .notes
                .iter()
                .filter(|(n, r, _)| Some(n.as_str()) == ns && Some(r.as_str()) == name)
                .flat_map(|(_, _, text)| text.lines().map(|l| format!("# {l}\n")))
                .collect();
            docs.push(notes + &document("Role", role)?);
            docs.push(document("RoleBinding", binding)?);
        }
        for (role, binding) in self.cluster_roles.iter().zip(&self.cluster_role_bindings) {
            docs.push(document("ClusterRole", role)?);
            docs.push(document("ClusterRoleBinding", binding)?);
        }
        Ok(docs.join("---\n"))
    }
}

/// The answer of an agent whose grants name what its configuration names, when `rbac` ran without `--config`.
pub fn needs_config<C>(config: Option<&C>) -> anyhow::Result<&C> {
    config.ok_or_else(|| anyhow::anyhow!("--config is required: the Roles name the objects the configuration names"))
}

fn meta(namespace: Option<&str>, name: &str, app: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(Into::into),
        labels: Some(BTreeMap::from([("app.kubernetes.io/name".to_string(), app.to_string())])),
        ..Default::default()
    }
}

fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef { api_group: Some("rbac.authorization.k8s.io".into()), kind: kind.into(), name: name.into() }
}

/// One rule; `names` empty means every object of the resources.
pub fn rule(group: &str, resources: &[&str], names: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(strings(resources)),
        resource_names: (!names.is_empty()).then(|| strings(names)),
        verbs: strings(verbs),
        ..Default::default()
    }
}

/// A rule on one `resource`, limited to `names` when there are any (the form for names an agent collected).
pub fn named_rule<'a>(
    group: &str,
    resource: &str,
    names: impl IntoIterator<Item = &'a String>,
    verbs: &[&str],
) -> PolicyRule {
    let names: Vec<&str> = names.into_iter().map(String::as_str).collect();
    rule(group, &[resource], &names, verbs)
}

/// The agent's own Lease: get and update by name; create cannot be limited by name (it is not in the URL).
pub fn lease_rules(who: &Subjects) -> Vec<PolicyRule> {
    vec![
        rule("coordination.k8s.io", &["leases"], &[&who.lease_name], &["get", "update"]),
        rule("coordination.k8s.io", &["leases"], &[], &["create"]),
    ]
}

/// One RBAC object as YAML with `apiVersion` and `kind` first, as people write them.
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
    fn a_role_renders_with_its_binding_kind_first_and_names_only_when_given() {
        let who = Subjects { namespace: "kcp-keeper".into(), service_account: "x".into(), lease_name: "l".into() };
        let mut rules = vec![rule("", &["configmaps"], &["one"], &["get"]), rule("", &["services"], &[], &["list"])];
        rules.extend(lease_rules(&who));
        let mut roles = Rbac::default();
        roles.add("kube-system", "kcp-keeper-x", "x", rules, &who);
        let yaml = roles.to_yaml().unwrap();
        assert!(yaml.starts_with("apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n"), "{yaml}");
        assert!(yaml.contains("---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n"), "{yaml}");
        assert_eq!(yaml.matches("resourceNames").count(), 2, "{yaml}");
        assert!(yaml.contains("name: x\n  namespace: kcp-keeper"), "{yaml}");
    }

    #[test]
    fn cluster_roles_follow_the_namespaced_ones_each_with_its_binding() {
        let who = Subjects { namespace: "kcp-keeper".into(), service_account: "x".into(), lease_name: "l".into() };
        let mut rbac = Rbac::default();
        rbac.add_cluster("kcp-keeper-x", "x", vec![rule("", &["namespaces"], &[], &["list"])], &who);
        rbac.add("kcp-keeper", "kcp-keeper-x", "x", lease_rules(&who), &who);
        let yaml = rbac.to_yaml().unwrap();
        let kinds: Vec<&str> = yaml.lines().filter_map(|l| l.strip_prefix("kind: ")).collect();
        assert_eq!(kinds, ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"]);
    }
}
