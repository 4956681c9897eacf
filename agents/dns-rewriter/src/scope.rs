//! What the daemon watches, exactly as the configuration names it, and the plain data read from those watches:
//! - the one ConfigMap it writes (by `metadata.name`, so RBAC can name it with `resourceNames`), and
//!   node-local-dns's ConfigMap the same way when `nodeLocalDns` is on (its existence is the detection);
//! - Services in each namespace a configured rule names, and in the discovery namespace those carrying the
//!   operator's component labels for the kinds switched on;
//! - the operator's RootShards, Shards and FrontProxies in the discovery namespace, only the kinds switched on.
//!
//! Reads come from the watches' stores, never from fresh GETs each cycle. The Roles for exactly these reads
//! (and the one write) are [`rbac`]'s, from the same [`service_scopes`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kcp_keeper_runtime::watch::{Namespaced, Watches, by_name};
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;

use crate::cluster::ClusterView;
use crate::config::Config;
use crate::discovery::COMPONENT_LABEL;
use crate::operator::{FrontProxy, OperatorKind, RootShard, Shard};
use crate::services::ServiceFacts;

pub mod rbac;

/// What one namespace's Service watch covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceScope {
    /// Every Service: a configured rule names one here (by name; Services are not secret, and one watch per
    /// namespace keeps a Service created later in view).
    All,
    /// Only those labelled `app.kubernetes.io/component in (...)`: the discovery namespace's operator Services.
    Components(Vec<&'static str>),
}

impl ServiceScope {
    fn watcher_config(&self) -> watcher::Config {
        match self {
            ServiceScope::All => watcher::Config::default(),
            ServiceScope::Components(c) => {
                watcher::Config::default().labels(&format!("{COMPONENT_LABEL} in ({})", c.join(",")))
            }
        }
    }
}

/// The Service watches a configuration needs, by namespace.
pub fn service_scopes(config: &Config) -> BTreeMap<String, ServiceScope> {
    let mut scopes: BTreeMap<String, ServiceScope> = BTreeMap::new();
    if let Some(d) = &config.discovery {
        let components = d.kinds.iter().map(|k| k.component()).collect();
        scopes.insert(d.namespace.clone(), ServiceScope::Components(components));
    }
    let namespaces: BTreeSet<&str> = config.rules.iter().map(|r| r.service.namespace()).collect();
    for ns in namespaces {
        scopes.insert(ns.to_string(), ServiceScope::All);
    }
    scopes
}

/// The stores behind the watches.
pub struct Scope {
    configmap: Store<ConfigMap>,
    node_local: Option<Store<ConfigMap>>,
    services: Vec<Store<Service>>,
    root_shards: Option<Store<RootShard>>,
    shards: Option<Store<Shard>>,
    front_proxies: Option<Store<FrontProxy>>,
}

impl Scope {
    pub fn build(client: &kube::Client, config: &Config) -> (Self, Watches) {
        let mut watches = Watches::new();
        let key = config.target.configmap();
        let configmap = watches.add(
            format!("configmap {}/{}", key.namespace, key.name),
            Api::<ConfigMap>::namespaced(client.clone(), &key.namespace),
            by_name(&key.name),
        );
        let node_local = config.node_local_dns.as_ref().map(|key| {
            watches.add(
                format!("configmap {}/{} (node-local-dns)", key.namespace, key.name),
                Api::<ConfigMap>::namespaced(client.clone(), &key.namespace),
                by_name(&key.name),
            )
        });
        let services = service_scopes(config)
            .into_iter()
            .map(|(ns, scope)| {
                let api = Api::<Service>::namespaced(client.clone(), &ns);
                watches.add(format!("services in {ns}"), api, scope.watcher_config())
            })
            .collect();
        let root_shards = operator_watch(&mut watches, client, config);
        let shards = operator_watch(&mut watches, client, config);
        let front_proxies = operator_watch(&mut watches, client, config);
        (Self { configmap, node_local, services, root_shards, shards, front_proxies }, watches)
    }

    /// The managed ConfigMap as last seen, if it exists.
    pub fn configmap(&self) -> Option<ConfigMap> {
        self.configmap.state().first().map(|cm| (**cm).clone())
    }

    /// node-local-dns's ConfigMap as last seen: `None` when it is not managed or does not exist (no
    /// NodeLocal DNSCache in the cluster).
    pub fn node_local(&self) -> Option<ConfigMap> {
        self.node_local.as_ref()?.state().first().map(|cm| (**cm).clone())
    }

    /// Services and operator objects, as the planner reads them.
    pub fn view(&self) -> ClusterView {
        let mut services: BTreeMap<(String, String), ServiceFacts> = BTreeMap::new();
        for store in &self.services {
            for svc in store.state() {
                let facts = ServiceFacts::from_service(&svc);
                services.insert((facts.namespace.clone(), facts.name.clone()), facts);
            }
        }
        let mut objects = Vec::new();
        objects.extend(objects_of(self.root_shards.as_ref()));
        objects.extend(objects_of(self.shards.as_ref()));
        objects.extend(objects_of(self.front_proxies.as_ref()));
        ClusterView { services: services.into_values().collect(), objects }
    }
}

/// The watch of the operator's kind `K` in the discovery namespace, when discovery reads that kind.
fn operator_watch<K: OperatorKind + Namespaced>(
    watches: &mut Watches,
    client: &kube::Client,
    config: &Config,
) -> Option<Store<K>> {
    let d = config.discovery.as_ref().filter(|d| d.kinds.contains(&K::KIND))?;
    let name = format!("{} in {}", K::KIND.plural(), d.namespace);
    Some(watches.add(name, Api::namespaced(client.clone(), &d.namespace), Default::default()))
}

fn objects_of<K>(store: Option<&Store<K>>) -> Vec<crate::discovery::OperatorObject>
where
    K: OperatorKind + Clone + 'static,
{
    store.map(|s| s.state().iter().map(|o| o.to_object()).collect()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(text: &str) -> Config {
        kcp_keeper_runtime::config::parse(Path::new("test.yaml"), text).unwrap()
    }

    #[test]
    fn services_are_watched_only_in_the_namespaces_the_configuration_needs() {
        let c = config(
            "mode: k3s\nrules:\n- {host: a.example.com, service: {namespace: apps, name: a}}\n\
             - {host: b.example.com, service: {namespace: apps, name: b}}\n\
             discovery: {namespace: kcp-system, shards: true, frontProxies: true}\n",
        );
        let scopes = service_scopes(&c);
        assert_eq!(
            scopes,
            BTreeMap::from([
                ("apps".to_string(), ServiceScope::All),
                ("kcp-system".to_string(), ServiceScope::Components(vec!["shard", "front-proxy"])),
            ])
        );
        let selector = scopes["kcp-system"].watcher_config().label_selector;
        assert_eq!(selector.as_deref(), Some("app.kubernetes.io/component in (shard,front-proxy)"));
    }

    #[test]
    fn a_rule_in_the_discovery_namespace_widens_that_watch_to_every_service() {
        let c = config(
            "mode: k3s\nrules:\n- {host: a.example.com, service: {namespace: kcp-system, name: a}}\n\
             discovery: {namespace: kcp-system, rootShards: true}\n",
        );
        assert_eq!(service_scopes(&c), BTreeMap::from([("kcp-system".to_string(), ServiceScope::All)]));
    }

    #[test]
    fn without_rules_or_discovery_no_service_is_watched() {
        assert!(service_scopes(&config("mode: k3s\n")).is_empty());
    }
}
