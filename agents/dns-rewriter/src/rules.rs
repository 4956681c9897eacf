//! What a rule points at, and the set of rules the renderer turns into text. A [`RuleSet`] is keyed by the
//! public name, so two rules for one name cannot both reach the output, and its order is the output's order.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use crate::hostname::{Domain, Hostname};

/// A Service by namespace and name, both checked: the namespace is an RFC 1123 label, the name an RFC 1035
/// label (what Kubernetes requires of Service names), so `<name>.<namespace>.svc.<domain>` is a valid name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceRef {
    namespace: String,
    name: String,
}

impl ServiceRef {
    /// Returns the field (`namespace` or `name`) and the reason when one is invalid.
    pub fn parse(namespace: &str, name: &str) -> Result<Self, (&'static str, String)> {
        kcp_keeper_runtime::names::check_dns_label(namespace).map_err(|r| ("namespace", r))?;
        kcp_keeper_runtime::names::check_dns_label(name).map_err(|r| ("name", r))?;
        if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
            return Err(("name", "must start with a letter (a Service name is an RFC 1035 label)".into()));
        }
        Ok(Self { namespace: namespace.into(), name: name.into() })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `<name>.<namespace>.svc.<domain>`, the name CoreDNS's `kubernetes` plugin answers with the ClusterIP.
    pub fn cluster_name(&self, domain: &Domain) -> String {
        format!("{}.{}.svc.{}", self.name, self.namespace, domain)
    }
}

impl fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Where one public name goes, and what it should answer once the rule is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub service: ServiceRef,
    /// The Service's ClusterIP when the cluster was read (`None` when rendering without a cluster).
    pub cluster_ip: Option<IpAddr>,
}

/// The rules to write, one per public name, in the order they are written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSet(BTreeMap<Hostname, Target>);

impl RuleSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a rule; returns the target already held for `host`, if any (and keeps it).
    pub fn insert(&mut self, host: Hostname, target: Target) -> Result<(), &Target> {
        use std::collections::btree_map::Entry;
        match self.0.entry(host) {
            Entry::Vacant(v) => {
                v.insert(target);
                Ok(())
            }
            Entry::Occupied(o) => Err(o.into_mut()),
        }
    }

    pub fn remove(&mut self, host: &Hostname) -> Option<Target> {
        self.0.remove(host)
    }

    pub fn get(&self, host: &Hostname) -> Option<&Target> {
        self.0.get(host)
    }

    pub fn contains(&self, host: &Hostname) -> bool {
        self.0.contains_key(host)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Hostname, &Target)> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_refs_are_checked_and_name_the_bad_field() {
        assert!(ServiceRef::parse("kcp-system", "root-kcp").is_ok());
        assert_eq!(ServiceRef::parse("Kcp", "root-kcp").unwrap_err().0, "namespace");
        assert_eq!(ServiceRef::parse("kcp-system", "root.kcp").unwrap_err().0, "name");
        assert_eq!(ServiceRef::parse("kcp-system", "0-kcp").unwrap_err().0, "name");
        assert_eq!(ServiceRef::parse("kcp-system", "").unwrap_err().0, "name");
    }

    #[test]
    fn cluster_name_is_the_kubernetes_plugin_name() {
        let svc = ServiceRef::parse("kcp-system", "root-kcp").unwrap();
        assert_eq!(svc.cluster_name(&Domain::parse("cluster.local").unwrap()), "root-kcp.kcp-system.svc.cluster.local");
    }
}
