//! Proof through DNS: ask the resolver for each public name and compare with the Service's ClusterIP. The
//! answer must hold exactly that address, under the public name (an exact rewrite rule renames the answer
//! back; a client that saw the Service's name would not match it against its query).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{RData, RecordType};

use crate::hostname::{Domain, Hostname};
use crate::rules::RuleSet;

/// What one name answered; its label (and `Display`) is the variant's name in snake case, `ok` for a match.
#[derive(Debug, Clone, PartialEq, Eq, strum::IntoStaticStr, strum::Display)]
#[strum(serialize_all = "snake_case")]
pub enum Outcome {
    /// Exactly the expected address, under the public name.
    #[strum(serialize = "ok")]
    Match,
    /// Addresses, but not (only) the expected one, or under another name.
    Mismatch,
    /// The name does not exist or has no address of the expected family.
    NoAnswer,
    /// The resolver did not answer (timeout, refused, unreachable).
    Error,
    /// Nothing to compare with: the Service's ClusterIP is not known.
    Unknown,
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCheck {
    pub host: Hostname,
    pub expected: Option<IpAddr>,
    pub answered: Vec<IpAddr>,
    /// The owner names of the answer records that were not the public name.
    pub other_names: Vec<String>,
    pub outcome: Outcome,
    /// Which resolver answered this, when several were asked ([`check_everywhere`]).
    pub resolver: Option<SocketAddr>,
}

/// A resolver that asks only `server`, without cache or search domains, one attempt of `timeout`.
pub fn resolver(server: SocketAddr, timeout: Duration) -> anyhow::Result<TokioResolver> {
    let mut udp = ConnectionConfig::udp();
    udp.port = server.port();
    let ns = NameServerConfig::new(server.ip(), true, vec![udp]);
    let mut builder = TokioResolver::builder_with_config(
        ResolverConfig::from_name_servers(vec![ns]),
        TokioRuntimeProvider::default(),
    );
    let options = builder.options_mut();
    options.cache_size = 0;
    options.attempts = 1;
    options.timeout = timeout;
    options.ndots = 0;
    options.use_hosts_file = ResolveHosts::Never;
    Ok(builder.build()?)
}

/// The rules whose target name (`<service>.<namespace>.svc.<cluster domain>`) the resolver says does not exist
/// (or has no address): written, their public names would answer nothing in-cluster. A resolver that does not
/// answer proves nothing either way, so those rules are kept.
pub async fn unresolved_targets(resolver: &TokioResolver, rules: &RuleSet, domain: &Domain) -> Vec<(Hostname, String)> {
    let mut out = Vec::new();
    for (host, target) in rules.iter() {
        let name = target.service.cluster_name(domain);
        let Ok(target_host) = Hostname::parse(&name) else { continue };
        if check_one(resolver, &target_host, target.cluster_ip).await.outcome == Outcome::NoAnswer {
            out.push((host.clone(), name));
        }
    }
    out
}

/// Asks for every rule's name, one after another, in the rules' order.
pub async fn check_all(resolver: &TokioResolver, rules: &RuleSet) -> Vec<HostCheck> {
    let mut out = Vec::with_capacity(rules.len());
    for (host, target) in rules.iter() {
        out.push(check_one(resolver, host, target.cluster_ip).await);
    }
    out
}

/// Asks every resolver (`(address, resolver)`) for every rule's name; per name, the first answer that is not a
/// match, or the first resolver's match: a name is verified only when every resolver a pod can be given answers
/// it right.
pub async fn check_everywhere(resolvers: &[(SocketAddr, TokioResolver)], rules: &RuleSet) -> Vec<HostCheck> {
    let mut out: Vec<HostCheck> = Vec::with_capacity(rules.len());
    for (addr, resolver) in resolvers {
        let checks = check_all(resolver, rules).await.into_iter().map(|c| HostCheck { resolver: Some(*addr), ..c });
        if out.is_empty() {
            out = checks.collect();
            continue;
        }
        for (kept, check) in out.iter_mut().zip(checks) {
            if kept.outcome == Outcome::Match && check.outcome != Outcome::Match {
                *kept = check;
            }
        }
    }
    out
}

pub async fn check_one(resolver: &TokioResolver, host: &Hostname, expected: Option<IpAddr>) -> HostCheck {
    let record_type = match expected {
        Some(IpAddr::V6(_)) => RecordType::AAAA,
        _ => RecordType::A,
    };
    let mut check = HostCheck {
        host: host.clone(),
        expected,
        answered: Vec::new(),
        other_names: Vec::new(),
        outcome: Outcome::Error,
        resolver: None,
    };
    match resolver.lookup(host.fqdn().as_str(), record_type).await {
        Ok(lookup) => {
            for record in lookup.answers() {
                let ip = match &record.data {
                    RData::A(a) => IpAddr::V4(a.0),
                    RData::AAAA(a) => IpAddr::V6(a.0),
                    _ => continue,
                };
                check.answered.push(ip);
                let owner = record.name.to_ascii().trim_end_matches('.').to_ascii_lowercase();
                if owner != host.as_str() && !check.other_names.contains(&owner) {
                    check.other_names.push(owner);
                }
            }
            check.outcome = match expected {
                None => Outcome::Unknown,
                Some(_) if check.answered.is_empty() => Outcome::NoAnswer,
                Some(ip) if check.answered.iter().all(|a| *a == ip) && check.other_names.is_empty() => Outcome::Match,
                Some(_) => Outcome::Mismatch,
            };
        }
        Err(e) if e.is_no_records_found() || e.is_nx_domain() => {
            check.outcome = if expected.is_some() { Outcome::NoAnswer } else { Outcome::Unknown };
        }
        Err(_) => check.outcome = Outcome::Error,
    }
    check
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outcome_reads_as_its_label() {
        let all = [Outcome::Match, Outcome::Mismatch, Outcome::NoAnswer, Outcome::Error, Outcome::Unknown];
        let labels: Vec<&str> = all.iter().map(Outcome::label).collect();
        assert_eq!(labels, ["ok", "mismatch", "no_answer", "error", "unknown"]);
        assert!(all.iter().all(|o| o.to_string() == o.label()));
    }
}
