//! From the configuration's rules, the operator's objects and the cluster's Services to the rules to write.
//! A problem with one rule (an invalid name, a missing or headless Service, two objects claiming one name) is
//! an error for that rule alone: it is reported and left out, every other rule is still written.
//!
//! Precedence: a rule from the configuration wins over a discovered one for the same name (a warning says so
//! when they point at different Services); two discovered rules for one name and different Services are a
//! conflict, and neither is written.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::{RejectedRule, Rule, RuleProblem};
use crate::discovery::{self, Candidate, OperatorObject, Origin};
use crate::hostname::{self, Domain, Hostname, HostnameError};
use crate::rules::{RuleSet, ServiceRef, Target};
use crate::services::{ClusterIp, ServiceFacts};

/// Why one rule is not written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum RuleError {
    #[error("{origin}: invalid hostname: {reason}")]
    InvalidHostname { origin: Origin, reason: HostnameError },
    #[error("{origin}: the public name lies inside the cluster domain, where the kubernetes plugin answers")]
    InClusterDomain { origin: Origin },
    /// A configured rule's field other than its name (its Service reference, its port, a repeated name).
    #[error("rules[{rule}].{field}: {reason}")]
    InvalidRule { rule: usize, field: String, reason: String },
    #[error("{origin}: not an http(s) URL with a host")]
    InvalidUrl { origin: Origin },
    #[error("{origin}: {host}: Service {service} does not exist")]
    ServiceMissing { origin: Origin, host: Hostname, service: ServiceRef },
    #[error("{origin}: {host}: Service {service} is headless; there is no ClusterIP to answer with")]
    ServiceHeadless { origin: Origin, host: Hostname, service: ServiceRef },
    #[error("{origin}: {host}: Service {service} has no ClusterIP (ExternalName, or none allocated)")]
    ServiceNoClusterIp { origin: Origin, host: Hostname, service: ServiceRef },
    #[error("{origin}: no Service in its namespace is labelled {component_label}={component}, {instance_label}={instance}", component_label = discovery::COMPONENT_LABEL, instance_label = discovery::INSTANCE_LABEL)]
    ServiceNotFound { origin: Origin, component: &'static str, instance: String },
    #[error("{origin}: {count} Services carry the operator's labels for it; expected one")]
    ServiceAmbiguous { origin: Origin, count: usize },
    /// The rule's target name does not resolve through the cluster DNS (a wrong `clusterDomain`, a namespace
    /// the `kubernetes` plugin does not serve): written, the public name would answer NXDOMAIN in-cluster.
    #[error("{host}: the target {target} does not resolve through the cluster DNS; the rule is not written")]
    TargetUnresolved { host: Hostname, target: String },
    #[error(
        "{host}: claimed for Service {first} by {first_origin} and for Service {second} by {second_origin}; neither is written"
    )]
    Conflict { host: Hostname, first: ServiceRef, first_origin: Origin, second: ServiceRef, second_origin: Origin },
}

impl RuleError {
    /// Every label [`RuleError::reason`] can give, so metric series exist (at 0) from the start.
    pub const REASONS: &'static [&'static str] = <Self as strum::VariantNames>::VARIANTS;

    /// A low-cardinality label for metrics and Event reasons: the variant's name in snake case.
    pub fn reason(&self) -> &'static str {
        self.into()
    }
}

/// Something worth saying that does not stop a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleWarning {
    #[error(
        "{host}: Service {service} does not expose port {port} of the public URL; DNS cannot change ports, so clients following the public URL will fail to connect until the Service exposes {port} too"
    )]
    PortMissing { host: Hostname, service: ServiceRef, port: u16 },
    #[error(
        "{host}: rules[{rule}] points at Service {configured}; {origin} would point at {discovered}; the configured rule wins"
    )]
    OverriddenByConfig { host: Hostname, rule: usize, configured: ServiceRef, origin: Origin, discovered: ServiceRef },
    #[error("{origin}: skipped: {reason}")]
    Skipped { origin: Origin, reason: &'static str },
    /// An operator object's name in another case or with the trailing dot, written as the rules write it.
    #[error(
        "{origin}: written as {host} (DNS names are case-insensitive; a rule's name is lowercase, without the trailing dot)"
    )]
    Normalized { origin: Origin, host: Hostname },
}

impl RuleWarning {
    /// A warning said once, not logged again every cycle while it lasts.
    pub fn once(&self) -> bool {
        matches!(self, RuleWarning::Normalized { .. })
    }

    /// The Event reason.
    pub fn event_reason(&self) -> &'static str {
        match self {
            RuleWarning::Normalized { .. } => "NameNormalized",
            _ => "RuleWarning",
        }
    }
}

/// What to write and what to report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub rules: RuleSet,
    pub errors: Vec<RuleError>,
    pub warnings: Vec<RuleWarning>,
}

/// One rule on its way into the set, with everything needed to report about it.
struct Entry {
    service: ServiceRef,
    cluster_ip: Option<std::net::IpAddr>,
    origin: Origin,
    ports: BTreeSet<u16>,
    service_ports: Option<Vec<u16>>,
}

/// Plans the rules. `services` is `None` when there is no cluster to read: the configured rules are then
/// taken as written (no Service checks, no ClusterIPs) and `objects` must be empty.
pub fn plan(
    domain: &Domain,
    configured: &[Rule],
    objects: &[OperatorObject],
    services: Option<&[ServiceFacts]>,
) -> Plan {
    let mut out = Plan::default();
    let mut chosen = configured_entries(configured, services, &mut out.errors);
    let discovered = discovered_entries(domain, configured, &chosen, objects, services, &mut out);
    chosen.extend(discovered.entries);
    out.rules = rule_set(chosen, &mut out.warnings);
    out
}

/// The configured rules by name: as written without a cluster; with one, each whose Service can be its
/// target, and an error for each other.
fn configured_entries(
    configured: &[Rule],
    services: Option<&[ServiceFacts]>,
    errors: &mut Vec<RuleError>,
) -> BTreeMap<Hostname, Entry> {
    let mut chosen = BTreeMap::new();
    for (i, rule) in configured.iter().enumerate() {
        let origin = Origin::Rule(i);
        let (cluster_ip, service_ports) = match services {
            None => (None, None),
            Some(services) => {
                let facts =
                    services.iter().find(|s| s.namespace == rule.service.namespace() && s.name == rule.service.name());
                match usable(&rule.host, &rule.service, facts, &origin) {
                    Ok((ip, service_ports)) => (Some(ip), Some(service_ports)),
                    Err(e) => {
                        errors.push(*e);
                        continue;
                    }
                }
            }
        };
        let entry = Entry {
            service: rule.service.clone(),
            cluster_ip,
            origin,
            ports: rule.port.into_iter().collect(),
            service_ports,
        };
        // The configuration refuses duplicate hosts, so this never replaces anything.
        chosen.insert(rule.host.clone(), entry);
    }
    chosen
}

/// The rules the operator's objects ask for, reading the objects in one order (kind, namespace, name) whatever
/// order they came in. A name a configured rule has stays the configured rule's (a warning when `chosen`
/// points it at another Service); a name objects claim for different Services is a conflict.
fn discovered_entries(
    domain: &Domain,
    configured: &[Rule],
    chosen: &BTreeMap<Hostname, Entry>,
    objects: &[OperatorObject],
    services: Option<&[ServiceFacts]>,
    out: &mut Plan,
) -> Discovered {
    let configured_hosts: BTreeMap<&Hostname, usize> =
        configured.iter().enumerate().map(|(i, r)| (&r.host, i)).collect();
    let mut objects: Vec<&OperatorObject> = objects.iter().collect();
    objects.sort_by(|a, b| (a.kind, &a.namespace, &a.name).cmp(&(b.kind, &b.namespace, &b.name)));
    let mut discovered = Discovered::default();
    for obj in objects {
        let hosts = object_hosts(domain, obj, out);
        if hosts.is_empty() {
            continue;
        }
        let Some(services) = services else { continue };
        let Some(facts) = object_service(obj, services, &mut out.errors) else { continue };
        let Ok(service) = ServiceRef::parse(&facts.namespace, &facts.name) else { continue };
        for (host, c) in hosts {
            let Some(&rule) = configured_hosts.get(&host) else {
                discovered.claim(host, c, &service, facts, &mut out.errors);
                continue;
            };
            if let Some(entry) = chosen.get(&host)
                && entry.service != service
            {
                out.warnings.push(RuleWarning::OverriddenByConfig {
                    host,
                    rule,
                    configured: entry.service.clone(),
                    origin: c.origin,
                    discovered: service.clone(),
                });
            }
        }
    }
    discovered
}

/// The public names `obj` declares that a rule can carry, normalized; an error or a warning (a certificate's
/// name no rule serves is skipped) for each of the others.
fn object_hosts(domain: &Domain, obj: &OperatorObject, out: &mut Plan) -> Vec<(Hostname, Candidate)> {
    let (candidates, unreadable) = discovery::public_names(obj);
    out.errors.extend(unreadable.into_iter().map(|u| RuleError::InvalidUrl { origin: u.0 }));
    let (errors, warnings) = (&mut out.errors, &mut out.warnings);
    let mut hosts: Vec<(Hostname, Candidate)> = Vec::new();
    for c in candidates {
        // An operator's spelling in another case or with the FQDN dot is the same name.
        let (text, normalized) = hostname::normalize(&c.host);
        match Hostname::parse(&text) {
            Ok(host) if host.is_within(domain) && c.from_certificate => {
                warnings.push(RuleWarning::Skipped { origin: c.origin, reason: "an in-cluster name" })
            }
            Ok(host) if host.is_within(domain) => errors.push(RuleError::InClusterDomain { origin: c.origin }),
            Ok(host) => {
                if normalized {
                    warnings.push(RuleWarning::Normalized { origin: c.origin.clone(), host: host.clone() });
                }
                hosts.push((host, c))
            }
            Err(HostnameError::Wildcard) if c.from_certificate => {
                warnings.push(RuleWarning::Skipped { origin: c.origin, reason: "a wildcard name needs no single rule" })
            }
            Err(HostnameError::SingleLabel) if c.from_certificate => {
                warnings.push(RuleWarning::Skipped { origin: c.origin, reason: "a single-label name" })
            }
            Err(reason) => errors.push(RuleError::InvalidHostname { origin: c.origin, reason }),
        }
    }
    hosts
}

/// The one Service carrying the operator's labels for `obj`, or an error saying there is none or more than one.
fn object_service<'a>(
    obj: &OperatorObject,
    services: &'a [ServiceFacts],
    errors: &mut Vec<RuleError>,
) -> Option<&'a ServiceFacts> {
    match discovery::services_of(obj, services).as_slice() {
        [one] => Some(*one),
        [] => {
            errors.push(RuleError::ServiceNotFound {
                origin: obj.origin(""),
                component: obj.kind.component(),
                instance: obj.name.clone(),
            });
            None
        }
        many => {
            errors.push(RuleError::ServiceAmbiguous { origin: obj.origin(""), count: many.len() });
            None
        }
    }
}

/// The rules discovered so far, and the names lost to a conflict (no later object claims them again).
#[derive(Default)]
struct Discovered {
    entries: BTreeMap<Hostname, Entry>,
    conflicted: BTreeSet<Hostname>,
}

impl Discovered {
    /// `c` claims `host` for `service`: a port more for the same Service, a conflict (neither written) for
    /// another, or a new rule when the Service can be its target.
    fn claim(
        &mut self,
        host: Hostname,
        c: Candidate,
        service: &ServiceRef,
        facts: &ServiceFacts,
        errors: &mut Vec<RuleError>,
    ) {
        if self.conflicted.contains(&host) {
            return;
        }
        match self.entries.get_mut(&host) {
            Some(entry) if entry.service == *service => entry.ports.extend(c.port),
            Some(entry) => {
                errors.push(RuleError::Conflict {
                    host: host.clone(),
                    first: entry.service.clone(),
                    first_origin: entry.origin.clone(),
                    second: service.clone(),
                    second_origin: c.origin,
                });
                self.entries.remove(&host);
                self.conflicted.insert(host);
            }
            None => match usable(&host, service, Some(facts), &c.origin) {
                Ok((ip, service_ports)) => {
                    self.entries.insert(
                        host,
                        Entry {
                            service: service.clone(),
                            cluster_ip: Some(ip),
                            origin: c.origin,
                            ports: c.port.into_iter().collect(),
                            service_ports: Some(service_ports),
                        },
                    );
                }
                // One error per object and Service, not one per name.
                Err(e) if errors.contains(&*e) => {}
                Err(e) => errors.push(*e),
            },
        }
    }
}

/// The rules to write, with a warning for each public port a rule's Service does not expose.
fn rule_set(chosen: BTreeMap<Hostname, Entry>, warnings: &mut Vec<RuleWarning>) -> RuleSet {
    let mut rules = RuleSet::new();
    for (host, entry) in chosen {
        if let Some(service_ports) = &entry.service_ports {
            for &port in entry.ports.iter().filter(|p| !service_ports.contains(p)) {
                warnings.push(RuleWarning::PortMissing { host: host.clone(), service: entry.service.clone(), port });
            }
        }
        let _ = rules.insert(host, Target { service: entry.service, cluster_ip: entry.cluster_ip });
    }
    rules
}

/// The errors for the configured rules the configuration left out, first in a plan's errors (they are the
/// file's first rules to report).
pub fn rejected_errors(rejected: &[RejectedRule]) -> Vec<RuleError> {
    rejected
        .iter()
        .map(|r| match &r.problem {
            RuleProblem::Host(reason) => RuleError::InvalidHostname { origin: Origin::Rule(r.index), reason: *reason },
            RuleProblem::InClusterDomain => RuleError::InClusterDomain { origin: Origin::Rule(r.index) },
            RuleProblem::Field { field, reason } => {
                RuleError::InvalidRule { rule: r.index, field: field.clone(), reason: reason.clone() }
            }
        })
        .collect()
}

/// The Service's ClusterIP and ports, or why it cannot be a rule's target.
fn usable(
    host: &Hostname,
    service: &ServiceRef,
    facts: Option<&ServiceFacts>,
    origin: &Origin,
) -> Result<(std::net::IpAddr, Vec<u16>), Box<RuleError>> {
    let (origin, host, service) = (origin.clone(), host.clone(), service.clone());
    let Some(facts) = facts else { return Err(Box::new(RuleError::ServiceMissing { origin, host, service })) };
    match facts.cluster_ip {
        ClusterIp::Ip(ip) => Ok((ip, facts.ports.clone())),
        ClusterIp::Headless => Err(Box::new(RuleError::ServiceHeadless { origin, host, service })),
        ClusterIp::Missing => Err(Box::new(RuleError::ServiceNoClusterIp { origin, host, service })),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::discovery::{COMPONENT_LABEL, INSTANCE_LABEL, Kind};
    use crate::render::render;

    fn domain() -> Domain {
        Domain::parse("cluster.local").unwrap()
    }

    fn svc(name: &str, labels: Option<(&str, &str)>, ip: ClusterIp, ports: &[u16]) -> ServiceFacts {
        ServiceFacts {
            namespace: "kcp-system".into(),
            name: name.into(),
            labels: labels
                .map(|(c, i)| {
                    [(COMPONENT_LABEL.to_string(), c.to_string()), (INSTANCE_LABEL.to_string(), i.to_string())].into()
                })
                .unwrap_or_default(),
            cluster_ip: ip,
            ports: ports.to_vec(),
        }
    }

    fn ip(s: &str) -> ClusterIp {
        ClusterIp::Ip(s.parse().unwrap())
    }

    /// The seed's Services (tests/e2e/src/layout.rs): fixed ClusterIPs, the operator's labels, port 6443.
    fn seed_services() -> Vec<ServiceFacts> {
        vec![
            svc("frontproxy-front-proxy", Some(("front-proxy", "frontproxy")), ip("10.96.100.10"), &[6443]),
            svc("root-kcp", Some(("rootshard", "root")), ip("10.96.100.20"), &[6443]),
            svc("alpha-shard-kcp", Some(("shard", "alpha")), ip("10.96.100.30"), &[6443]),
        ]
    }

    fn seed_objects() -> Vec<OperatorObject> {
        let o =
            |kind, name: &str, spec| OperatorObject { kind, namespace: "kcp-system".into(), name: name.into(), spec };
        vec![
            o(
                Kind::Shard,
                "alpha",
                json!({"rootShard": {"ref": {"name": "root"}}, "extraArgs": ["--shard-virtual-workspace-url=https://alpha.kcp.example.com:6443"]}),
            ),
            o(
                Kind::FrontProxy,
                "frontproxy",
                json!({"rootShard": {"ref": {"name": "root"}}, "external": {"hostname": "kcp.example.com", "port": 6443}}),
            ),
            o(
                Kind::RootShard,
                "root",
                json!({
                    "external": {"hostname": "kcp.example.com", "port": 6443},
                    "extraArgs": ["--shard-virtual-workspace-url=https://root.kcp.example.com:6443"],
                    "certificateTemplates": {"server": {"spec": {"dnsNames": ["root.kcp.example.com", "kcp-root.example.com", "*.root.kcp.example.com", "root-kcp.kcp-system.svc.cluster.local"]}}},
                }),
            ),
        ]
    }

    fn rule(host: &str, name: &str, port: Option<u16>) -> Rule {
        Rule { host: Hostname::parse(host).unwrap(), service: ServiceRef::parse("kcp-system", name).unwrap(), port }
    }

    #[test]
    fn discovery_produces_the_same_rules_as_the_equivalent_configuration() {
        let services = seed_services();
        let discovered = plan(&domain(), &[], &seed_objects(), Some(&services));
        assert!(discovered.errors.is_empty(), "{:?}", discovered.errors);
        let explicit = plan(
            &domain(),
            &[
                rule("root.kcp.example.com", "root-kcp", Some(6443)),
                rule("kcp-root.example.com", "root-kcp", None),
                rule("alpha.kcp.example.com", "alpha-shard-kcp", Some(6443)),
                rule("kcp.example.com", "frontproxy-front-proxy", Some(6443)),
            ],
            &[],
            Some(&services),
        );
        assert_eq!(discovered.rules, explicit.rules);
        assert_eq!(render(&discovered.rules, &domain()), render(&explicit.rules, &domain()));
        assert_eq!(
            discovered.rules.get(&Hostname::parse("kcp.example.com").unwrap()).unwrap().cluster_ip,
            Some("10.96.100.10".parse().unwrap())
        );
        let skipped: Vec<String> = discovered.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(
            skipped,
            vec![
                "RootShard kcp-system/root spec.certificateTemplates.server.spec.dnsNames[2]: skipped: a wildcard name needs no single rule",
                "RootShard kcp-system/root spec.certificateTemplates.server.spec.dnsNames[3]: skipped: an in-cluster name",
            ]
        );
    }

    #[test]
    fn shuffled_objects_and_services_give_identical_output() {
        let services = seed_services();
        let expected = render(&plan(&domain(), &[], &seed_objects(), Some(&services)).rules, &domain());
        let mut objects = seed_objects();
        let mut services = services;
        for _ in 0..objects.len() {
            objects.rotate_left(1);
            services.reverse();
            let p = plan(&domain(), &[], &objects, Some(&services));
            assert_eq!(render(&p.rules, &domain()), expected);
        }
    }

    #[test]
    fn a_bad_rule_is_an_error_for_that_rule_alone() {
        let mut services = seed_services();
        services.push(svc("headless", None, ClusterIp::Headless, &[6443]));
        services.push(svc("external", None, ClusterIp::Missing, &[]));
        let configured = [
            rule("a.example.com", "root-kcp", None),
            rule("b.example.com", "missing", None),
            rule("c.example.com", "headless", None),
            rule("d.example.com", "external", None),
            rule("e.example.com", "alpha-shard-kcp", None),
        ];
        let mut objects = seed_objects();
        objects.push(OperatorObject {
            kind: Kind::Shard,
            namespace: "kcp-system".into(),
            name: "beta".into(),
            spec: json!({"extraArgs": ["--shard-virtual-workspace-url=https://Beta_.example.com"]}),
        });
        objects.push(OperatorObject {
            kind: Kind::Shard,
            namespace: "kcp-system".into(),
            name: "gamma".into(),
            spec: json!({"extraArgs": ["--shard-virtual-workspace-url=https://gamma.kcp.example.com"]}),
        });
        let p = plan(&domain(), &configured, &objects, Some(&services));
        let reasons: Vec<&str> = p.errors.iter().map(RuleError::reason).collect();
        assert_eq!(
            reasons,
            vec![
                "service_missing",
                "service_headless",
                "service_no_cluster_ip",
                "invalid_hostname",
                "service_not_found"
            ]
        );
        let hosts: Vec<&str> = p.rules.iter().map(|(h, _)| h.as_str()).collect();
        assert_eq!(
            hosts,
            vec![
                "a.example.com",
                "alpha.kcp.example.com",
                "e.example.com",
                "kcp-root.example.com",
                "kcp.example.com",
                "root.kcp.example.com"
            ]
        );
        let messages: Vec<String> = p.errors.iter().map(ToString::to_string).collect();
        assert_eq!(messages[0], "rules[1]: b.example.com: Service kcp-system/missing does not exist");
        assert_eq!(
            messages[3],
            "Shard kcp-system/beta spec.extraArgs[0]: invalid hostname: label 1 may hold only a-z, 0-9 and '-', and must not start or end with '-'",
            "names the field, not the value"
        );
        assert!(messages[4].starts_with("Shard kcp-system/gamma: no Service in its namespace is labelled"));
    }

    #[test]
    fn a_service_without_the_public_port_is_written_with_a_warning() {
        let services = seed_services();
        let p = plan(&domain(), &[rule("kcp-root.example.com", "root-kcp", Some(443))], &[], Some(&services));
        assert_eq!(p.rules.len(), 1);
        assert!(p.errors.is_empty());
        assert_eq!(p.warnings.len(), 1);
        assert!(matches!(&p.warnings[0], RuleWarning::PortMissing { port: 443, .. }), "{:?}", p.warnings);
        assert!(p.warnings[0].to_string().contains("DNS cannot change ports"));
    }

    #[test]
    fn two_objects_claiming_one_name_for_different_services_write_neither() {
        let services = seed_services();
        let mut objects = seed_objects();
        objects[0].spec = json!({"extraArgs": ["--shard-virtual-workspace-url=https://root.kcp.example.com:6443"]});
        let p = plan(&domain(), &[], &objects, Some(&services));
        assert_eq!(p.errors.iter().map(RuleError::reason).collect::<Vec<_>>(), vec!["conflict"]);
        assert!(!p.rules.contains(&Hostname::parse("root.kcp.example.com").unwrap()));
        assert!(p.rules.contains(&Hostname::parse("kcp-root.example.com").unwrap()), "the rest stays");
    }

    #[test]
    fn a_configured_rule_wins_over_discovery_and_says_so() {
        let services = seed_services();
        let p = plan(&domain(), &[rule("kcp.example.com", "root-kcp", None)], &seed_objects(), Some(&services));
        let target = p.rules.get(&Hostname::parse("kcp.example.com").unwrap()).unwrap();
        assert_eq!(target.service.name(), "root-kcp");
        assert!(
            p.warnings.iter().any(|w| matches!(w, RuleWarning::OverriddenByConfig { rule: 0, .. })),
            "{:?}",
            p.warnings
        );
    }

    #[test]
    fn without_a_cluster_configured_rules_are_taken_as_written() {
        let p = plan(&domain(), &[rule("kcp-root.example.com", "root-kcp", Some(443))], &[], None);
        assert_eq!(p.rules.len(), 1);
        assert!(p.errors.is_empty() && p.warnings.is_empty());
    }

    #[test]
    fn every_reason_is_listed() {
        let origin = Origin::Rule(0);
        let host = Hostname::parse("a.example.com").unwrap();
        let service = ServiceRef::parse("a", "b").unwrap();
        let all = [
            RuleError::InvalidHostname { origin: origin.clone(), reason: HostnameError::Empty },
            RuleError::InClusterDomain { origin: origin.clone() },
            RuleError::InvalidRule { rule: 0, field: "port".into(), reason: "r".into() },
            RuleError::InvalidUrl { origin: origin.clone() },
            RuleError::ServiceMissing { origin: origin.clone(), host: host.clone(), service: service.clone() },
            RuleError::ServiceHeadless { origin: origin.clone(), host: host.clone(), service: service.clone() },
            RuleError::ServiceNoClusterIp { origin: origin.clone(), host: host.clone(), service: service.clone() },
            RuleError::ServiceNotFound { origin: origin.clone(), component: "shard", instance: "x".into() },
            RuleError::ServiceAmbiguous { origin: origin.clone(), count: 2 },
            RuleError::TargetUnresolved { host: host.clone(), target: "t".into() },
            RuleError::Conflict {
                host,
                first: service.clone(),
                first_origin: origin.clone(),
                second: service,
                second_origin: origin,
            },
        ];
        assert_eq!(all.iter().map(RuleError::reason).collect::<Vec<_>>(), RuleError::REASONS);
    }
}
