//! The thin edge to the apiserver: read the Services and operator objects the configuration names, as plain
//! data for [`crate::plan`]. Reads are scoped: a configured rule's Service by namespace and name (`get`), and
//! in the discovery namespace only the operator's kinds that are switched on and the Services carrying the
//! operator's component labels.

use std::collections::BTreeMap;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};

use crate::config::Config;
use crate::discovery::{COMPONENT_LABEL, Kind, OperatorObject};
use crate::operator::{OPERATOR_GROUP, OPERATOR_VERSION};
use crate::plan::{Plan, plan, rejected_errors};
use crate::services::ServiceFacts;

/// The API resource of an operator kind.
pub fn api_resource(kind: Kind) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(OPERATOR_GROUP, OPERATOR_VERSION, kind.name()),
        kind.plural(),
    )
}

/// What the planner needs from the cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    pub services: Vec<ServiceFacts>,
    pub objects: Vec<OperatorObject>,
}

pub async fn read(client: &kube::Client, config: &Config) -> anyhow::Result<ClusterView> {
    let mut services: BTreeMap<(String, String), ServiceFacts> = BTreeMap::new();
    for rule in &config.rules {
        let key = (rule.service.namespace().to_string(), rule.service.name().to_string());
        if services.contains_key(&key) {
            continue;
        }
        let api: Api<Service> = Api::namespaced(client.clone(), rule.service.namespace());
        // A list by name rather than a get: the one-shots run in the agent's pod with the daemon's rights, which
        // are list and watch on Services (the daemon watches them), not get.
        let by_name = ListParams::default().fields(&format!("metadata.name={}", rule.service.name()));
        let found = api.list(&by_name).await.with_context(|| format!("reading Service {}", rule.service))?;
        if let Some(svc) = found.items.first() {
            services.insert(key, ServiceFacts::from_service(svc));
        }
    }
    let mut objects = Vec::new();
    if let Some(discovery) = &config.discovery {
        let components: Vec<&str> = discovery.kinds.iter().map(|k| k.component()).collect();
        let selector = format!("{COMPONENT_LABEL} in ({})", components.join(","));
        let api: Api<Service> = Api::namespaced(client.clone(), &discovery.namespace);
        let list = api
            .list(&ListParams::default().labels(&selector))
            .await
            .with_context(|| format!("listing Services in {}", discovery.namespace))?;
        for svc in &list.items {
            let facts = ServiceFacts::from_service(svc);
            services.insert((facts.namespace.clone(), facts.name.clone()), facts);
        }
        for &kind in &discovery.kinds {
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &discovery.namespace, &api_resource(kind));
            let list = api
                .list(&ListParams::default())
                .await
                .with_context(|| format!("listing {} objects in {}", kind.name(), discovery.namespace))?;
            for obj in list.items {
                objects.push(OperatorObject {
                    kind,
                    namespace: obj.metadata.namespace.clone().unwrap_or_else(|| discovery.namespace.clone()),
                    name: obj.metadata.name.clone().unwrap_or_default(),
                    spec: obj.data.get("spec").cloned().unwrap_or_default(),
                });
            }
        }
    }
    Ok(ClusterView { services: services.into_values().collect(), objects })
}

/// The plan for `config` against what the cluster holds, the configured rules the configuration left out
/// among its errors.
pub fn plan_with(config: &Config, view: &ClusterView) -> Plan {
    let mut plan = plan(&config.cluster_domain, &config.rules, &view.objects, Some(&view.services));
    plan.errors.splice(0..0, rejected_errors(&config.rejected));
    plan
}
