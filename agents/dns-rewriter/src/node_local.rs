//! NodeLocal DNSCache (`node-local-dns`): pods behind it send every name outside the cluster domain to the
//! node's upstream resolvers, so the rewrite rules in the cluster DNS never see `kcp.example.com`. The agent
//! therefore keeps a marked block at the top level of node-local-dns's Corefile (its ConfigMap's `Corefile`
//! key) holding one server block for the rules' public names, which forwards them to the cluster DNS exactly
//! as the cluster domain's own server block does: the same `bind` addresses (node-local-dns listens only on
//! those) and the same `forward` targets (kubeadm's shape: `__PILLAR__CLUSTER__DNS__`, which node-cache
//! replaces with the cluster DNS Service's address, or the address itself).
//!
//! node-local-dns's Corefile is untrusted text: of it only the cluster domain's server block is read, and of
//! that only the words of `bind` and `forward`, each checked to be an IP address (with a port for `forward`)
//! or one of node-cache's `__PILLAR__` variables. Anything else is refused with a clear error, and nothing is
//! written. The block's content comes from a closed grammar ([`render`], checked by [`check`]), and every
//! byte outside the block is kept (the runtime's [`MarkedBlock::top_level`]).

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use kcp_keeper_runtime::marked_block::{BlockError, MarkedBlock};

use crate::block::BLOCK_ID;
use crate::hostname::{Domain, Hostname};
use crate::rules::RuleSet;

/// node-cache's variables a `bind` line may carry (kubeadm's shape before, or without, its `sed`).
const BIND_VARIABLES: &[&str] = &["__PILLAR__LOCAL__DNS__", "__PILLAR__DNS__SERVER__"];
/// node-cache's variable for the cluster DNS Service's address in a `forward` line.
const CLUSTER_DNS_VARIABLE: &str = "__PILLAR__CLUSTER__DNS__";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeLocalError {
    #[error("no server block for the cluster domain {0} (node-local-dns forwards it to the cluster DNS)")]
    NoClusterBlock(String),
    #[error("{0} server blocks for the cluster domain {1}; expected one")]
    AmbiguousClusterBlock(usize, String),
    #[error("the cluster domain's server block has {0} {1} lines; expected exactly one")]
    Directive(usize, &'static str),
    #[error("the cluster domain's server block has a {0} word that is neither an IP address nor a node-cache variable")]
    UnknownWord(&'static str),
    #[error("the cluster domain's server block has a forward line that does not forward the root zone `.`")]
    ForwardNotRoot,
    #[error("the cluster domain's server block has an invalid port in its key")]
    Port,
    #[error("node-local-dns's Corefile: {0}")]
    Block(#[from] BlockError),
    #[error("the block fails our own check: {0}")]
    Grammar(String),
    #[error("the candidate changes bytes outside its block")]
    ForeignBytesChanged,
    #[error("the ConfigMap has no Corefile key (it is node-local-dns's to create)")]
    NoCorefile,
}

/// What the cluster domain's server block says, checked: where node-local-dns listens and where it forwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterBlock {
    /// The port of the server block's key (53 by default).
    pub port: u16,
    /// `bind`'s words: IP addresses or node-cache's variables.
    pub bind: Vec<String>,
    /// `forward .`'s targets: IP addresses with optional port, or `__PILLAR__CLUSTER__DNS__`.
    pub forward: Vec<String>,
}

impl ClusterBlock {
    /// node-local-dns's listen addresses a pod can be given as its resolver (the bind words that are
    /// addresses; a variable is filled in by node-cache and not known here).
    pub fn listen_addresses(&self) -> Vec<SocketAddr> {
        self.bind.iter().filter_map(|w| w.parse::<IpAddr>().ok()).map(|ip| SocketAddr::new(ip, self.port)).collect()
    }
}

/// A server block at the top level: its keys and the lines (start, end) of its body.
struct Server<'a> {
    keys: Vec<&'a str>,
    body: Vec<&'a str>,
}

/// The top-level server blocks of `text`, line by line (a key line ends in `{`, the block ends when the braces
/// balance again). Comments are dropped; a quote anywhere makes the text one this reader does not trust.
fn servers(text: &str) -> Result<Vec<Server<'_>>, NodeLocalError> {
    let mut out: Vec<Server> = Vec::new();
    let mut depth = 0i64;
    for (number, line) in text.lines().enumerate() {
        let code = line.split('#').next().unwrap_or_default();
        if code.contains('"') {
            return Err(NodeLocalError::Block(BlockError::AmbiguousBrace("\"".into(), number + 1)));
        }
        let words: Vec<&str> = code.split_whitespace().collect();
        let opens = words.iter().filter(|w| **w == "{").count() as i64;
        let closes = words.iter().filter(|w| **w == "}").count() as i64;
        if depth == 0 && opens > 0 {
            let keys = words.iter().take_while(|w| **w != "{").copied().collect();
            out.push(Server { keys, body: Vec::new() });
        } else if depth >= 1
            && let Some(server) = out.last_mut()
        {
            // Only lines directly in the server block count as its directives.
            if depth == 1 {
                server.body.push(code);
            }
        }
        depth += opens - closes;
        if depth < 0 {
            return Err(NodeLocalError::Block(BlockError::Unbalanced(number + 1)));
        }
    }
    Ok(out)
}

/// `dns://a.example.com:53,` as `(a.example.com, Some(53))`.
fn split_key(key: &str) -> (&str, Option<&str>) {
    let key = key.trim_end_matches(',');
    let key = key.strip_prefix("dns://").unwrap_or(key);
    match key.rsplit_once(':') {
        Some((zone, port)) => (zone.trim_end_matches('.'), Some(port)),
        None => (key.trim_end_matches('.'), None),
    }
}

/// Reads and checks the cluster domain's server block of node-local-dns's Corefile `text`, outside our block.
pub fn cluster_block(text: &str, domain: &Domain) -> Result<ClusterBlock, NodeLocalError> {
    let text = block()?.set(text, None)?;
    let servers = servers(&text)?;
    let matching: Vec<(&Server, Option<&str>)> = servers
        .iter()
        .filter_map(|s| {
            s.keys.iter().map(|k| split_key(k)).find(|(zone, _)| *zone == domain.as_str()).map(|(_, port)| (s, port))
        })
        .collect();
    let (server, port) = match matching.as_slice() {
        [] => return Err(NodeLocalError::NoClusterBlock(domain.as_str().into())),
        [one] => *one,
        many => return Err(NodeLocalError::AmbiguousClusterBlock(many.len(), domain.as_str().into())),
    };
    let port = match port {
        None => 53,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0).ok_or(NodeLocalError::Port)?,
    };
    let directive = |name: &'static str| -> Result<Vec<String>, NodeLocalError> {
        let lines: Vec<Vec<&str>> = server
            .body
            .iter()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|w| w.first() == Some(&name))
            .collect();
        match lines.as_slice() {
            [one] => Ok(one[1..].iter().take_while(|w| **w != "{").map(|w| w.to_string()).collect()),
            other => Err(NodeLocalError::Directive(other.len(), name)),
        }
    };
    let bind = directive("bind")?;
    if bind.is_empty() || !bind.iter().all(|w| w.parse::<IpAddr>().is_ok() || BIND_VARIABLES.contains(&w.as_str())) {
        return Err(NodeLocalError::UnknownWord("bind"));
    }
    let mut forward = directive("forward")?;
    if forward.first().map(String::as_str) != Some(".") {
        return Err(NodeLocalError::ForwardNotRoot);
    }
    forward.remove(0);
    let target_ok =
        |w: &str| w == CLUSTER_DNS_VARIABLE || w.parse::<IpAddr>().is_ok() || w.parse::<SocketAddr>().is_ok();
    if forward.is_empty() || !forward.iter().all(|w| target_ok(w)) {
        return Err(NodeLocalError::UnknownWord("forward"));
    }
    Ok(ClusterBlock { port, bind, forward })
}

fn block() -> Result<MarkedBlock, BlockError> {
    MarkedBlock::top_level(BLOCK_ID)
}

/// The server zones (`zone` or `zone:port`) the Corefile already serves outside our block: a rule for one of
/// them would define the zone twice, which CoreDNS refuses at start.
fn served_zones(text: &str, port: u16) -> Result<BTreeSet<String>, NodeLocalError> {
    let text = block()?.set(text, None)?;
    Ok(servers(&text)?
        .iter()
        .flat_map(|s| s.keys.iter().map(|k| split_key(k)))
        .filter(|(_, p)| p.is_none_or(|p| p == port.to_string()))
        .map(|(zone, _)| zone.to_ascii_lowercase())
        .collect())
}

/// The hosts our server block serves: the rules' names, less those another server block of the Corefile
/// already serves on that port (returned apart, to be reported).
pub fn zones(
    text: &str,
    cluster: &ClusterBlock,
    rules: &RuleSet,
) -> Result<(Vec<Hostname>, Vec<Hostname>), NodeLocalError> {
    let served = served_zones(text, cluster.port)?;
    Ok(rules.iter().map(|(h, _)| h.clone()).partition(|h| !served.contains(h.as_str())))
}

/// Our server block: the hosts as its zones, bound and forwarded exactly as the cluster domain's block.
pub fn render(hosts: &[Hostname], cluster: &ClusterBlock) -> String {
    let keys: Vec<String> = hosts.iter().map(|h| format!("{}:{}", h.as_str(), cluster.port)).collect();
    format!(
        "# Managed by kcp-keeper (dns-rewriter): kcp's public names go to the cluster DNS, which rewrites them.\n{} {{\n    errors\n    cache 30\n    reload\n    bind {}\n    forward . {} {{\n        force_tcp\n    }}\n}}\n",
        keys.join(" "),
        cluster.bind.join(" "),
        cluster.forward.join(" "),
    )
}

/// The pre-write check: `content` is exactly what [`render`] makes of its own zones and of `cluster`, and
/// every zone is a valid public name outside the cluster domain. Returns how many zones.
pub fn check(content: &str, cluster: &ClusterBlock, domain: &Domain) -> Result<usize, NodeLocalError> {
    let grammar = |why: &str| NodeLocalError::Grammar(why.into());
    let key_line = content.lines().nth(1).ok_or_else(|| grammar("no server block"))?;
    let keys = key_line.strip_suffix(" {").ok_or_else(|| grammar("the key line does not open a block"))?;
    let mut hosts = Vec::new();
    for key in keys.split(' ') {
        let zone = key
            .strip_suffix(&format!(":{}", cluster.port))
            .ok_or_else(|| grammar("a zone without the cluster block's port"))?;
        let host = Hostname::parse(zone).map_err(|e| NodeLocalError::Grammar(e.to_string()))?;
        if host.is_within(domain) {
            return Err(grammar("a zone inside the cluster domain"));
        }
        hosts.push(host);
    }
    if render(&hosts, cluster) != content {
        return Err(grammar("the block is not the renderer's"));
    }
    Ok(hosts.len())
}

/// The full new Corefile of node-local-dns: `current` with our block set to the server block for `hosts`, or
/// removed when there is none; only returned when it passed [`check`] and kept every byte outside the block.
pub fn desired_value(
    current: &str,
    cluster: &ClusterBlock,
    hosts: &[Hostname],
    domain: &Domain,
) -> Result<String, NodeLocalError> {
    let block = block()?;
    let content = (!hosts.is_empty()).then(|| render(hosts, cluster));
    let candidate = block.set(current, content.as_deref())?;
    if let Some(content) = block.content(&candidate)? {
        check(&(content + "\n"), cluster, domain)?;
    }
    if block.set(&candidate, None)? != block.set(current, None)? {
        return Err(NodeLocalError::ForeignBytesChanged);
    }
    Ok(candidate)
}

/// `current` without our block (the `cleanup` one-shot); every other byte kept.
pub fn removed(current: &str) -> Result<String, NodeLocalError> {
    Ok(block()?.set(current, None)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{ServiceRef, Target};

    /// kubernetes/dns's `nodelocaldns.yaml` Corefile after kubeadm's documented `sed` (iptables mode:
    /// `__PILLAR__LOCAL__DNS__` 169.254.20.10, `__PILLAR__DNS__SERVER__` 10.96.0.10, the domain
    /// cluster.local); `__PILLAR__CLUSTER__DNS__` and `__PILLAR__UPSTREAM__SERVERS__` are node-cache's.
    pub const NODELOCALDNS: &str = "cluster.local:53 {
    errors
    cache {
            success 9984 30
            denial 9984 5
    }
    reload
    loop
    bind 169.254.20.10 10.96.0.10
    forward . __PILLAR__CLUSTER__DNS__ {
            force_tcp
    }
    prometheus :9253
    health 169.254.20.10:8080
    }
in-addr.arpa:53 {
    errors
    cache 30
    reload
    loop
    bind 169.254.20.10 10.96.0.10
    forward . __PILLAR__CLUSTER__DNS__ {
            force_tcp
    }
    prometheus :9253
    }
.:53 {
    errors
    cache 30
    reload
    loop
    bind 169.254.20.10 10.96.0.10
    forward . __PILLAR__UPSTREAM__SERVERS__
    prometheus :9253
    }
";

    fn domain() -> Domain {
        Domain::parse("cluster.local").unwrap()
    }

    fn rules(hosts: &[&str]) -> RuleSet {
        let mut set = RuleSet::new();
        for h in hosts {
            let target = Target { service: ServiceRef::parse("kcp-system", "root-kcp").unwrap(), cluster_ip: None };
            set.insert(Hostname::parse(h).unwrap(), target).unwrap();
        }
        set
    }

    fn hosts(names: &[&str]) -> Vec<Hostname> {
        names.iter().map(|h| Hostname::parse(h).unwrap()).collect()
    }

    #[test]
    fn the_cluster_block_of_kubeadms_shape_gives_the_bind_and_forward_words_and_the_listen_addresses() {
        let c = cluster_block(NODELOCALDNS, &domain()).unwrap();
        assert_eq!(c.port, 53);
        assert_eq!(c.bind, ["169.254.20.10", "10.96.0.10"]);
        assert_eq!(c.forward, ["__PILLAR__CLUSTER__DNS__"]);
        assert_eq!(c.listen_addresses(), ["169.254.20.10:53".parse().unwrap(), "10.96.0.10:53".parse().unwrap()]);
        let unsubstituted =
            NODELOCALDNS.replace("169.254.20.10 10.96.0.10", "__PILLAR__LOCAL__DNS__ __PILLAR__DNS__SERVER__");
        let c = cluster_block(&unsubstituted, &domain()).unwrap();
        assert!(c.listen_addresses().is_empty(), "variables are node-cache's to fill");
    }

    #[test]
    fn our_server_block_goes_last_forwards_like_the_cluster_block_and_removal_restores_every_byte() {
        let c = cluster_block(NODELOCALDNS, &domain()).unwrap();
        let two = hosts(&["kcp.example.com", "kcp-root.example.com"]);
        let out = desired_value(NODELOCALDNS, &c, &two, &domain()).unwrap();
        assert_eq!(
            &out[NODELOCALDNS.len()..],
            "# kcp-keeper:begin dns-rewriter (managed by kcp-keeper: edits inside this block are overwritten)\n\
             # Managed by kcp-keeper (dns-rewriter): kcp's public names go to the cluster DNS, which rewrites them.\n\
             kcp.example.com:53 kcp-root.example.com:53 {\n    errors\n    cache 30\n    reload\n    bind 169.254.20.10 10.96.0.10\n    forward . __PILLAR__CLUSTER__DNS__ {\n        force_tcp\n    }\n}\n\
             # kcp-keeper:end dns-rewriter\n"
        );
        assert_eq!(desired_value(&out, &c, &two, &domain()).unwrap(), out, "idempotent");
        assert_eq!(cluster_block(&out, &domain()).unwrap(), c, "our block is not read as the cluster's");
        let one = desired_value(&out, &c, &hosts(&["kcp.example.com"]), &domain()).unwrap();
        assert_eq!(desired_value(&one, &c, &[], &domain()).unwrap(), NODELOCALDNS, "no rule, no block");
        assert_eq!(removed(&one).unwrap(), NODELOCALDNS);
    }

    #[test]
    fn a_cluster_block_with_words_we_do_not_know_is_refused() {
        let cases: Vec<(String, NodeLocalError)> = vec![
            (
                NODELOCALDNS.replace("cluster.local:53", "example.local:53"),
                NodeLocalError::NoClusterBlock("cluster.local".into()),
            ),
            (
                format!("{NODELOCALDNS}cluster.local:53 {{\n}}\n"),
                NodeLocalError::AmbiguousClusterBlock(2, "cluster.local".into()),
            ),
            (
                NODELOCALDNS.replacen("bind 169.254.20.10 10.96.0.10", "bind eth0", 1),
                NodeLocalError::UnknownWord("bind"),
            ),
            (
                NODELOCALDNS.replacen("forward . __PILLAR__CLUSTER__DNS__", "forward . tls://10.0.0.1", 1),
                NodeLocalError::UnknownWord("forward"),
            ),
            (
                NODELOCALDNS.replacen("forward . __PILLAR__CLUSTER__DNS__", "forward example.com 10.0.0.1", 1),
                NodeLocalError::ForwardNotRoot,
            ),
            (NODELOCALDNS.replacen("    bind 169.254.20.10 10.96.0.10\n", "", 1), NodeLocalError::Directive(0, "bind")),
            (NODELOCALDNS.replacen("cluster.local:53", "cluster.local:99999", 1), NodeLocalError::Port),
        ];
        for (text, expected) in cases {
            assert_eq!(cluster_block(&text, &domain()).unwrap_err(), expected, "{text}");
        }
        let quoted = NODELOCALDNS.replacen("errors", "errors \"x {\"", 1);
        assert!(cluster_block(&quoted, &domain()).is_err());
    }

    #[test]
    fn a_name_another_server_block_serves_is_left_out_of_ours() {
        let text = format!("{NODELOCALDNS}kcp.example.com:53 {{\n    forward . 10.0.0.1\n}}\n");
        let c = cluster_block(&text, &domain()).unwrap();
        let (ours, taken) = zones(&text, &c, &rules(&["kcp.example.com", "kcp-root.example.com"])).unwrap();
        assert_eq!(ours, hosts(&["kcp-root.example.com"]));
        assert_eq!(taken, hosts(&["kcp.example.com"]));
    }

    #[test]
    fn the_check_admits_only_the_renderers_text() {
        let c = cluster_block(NODELOCALDNS, &domain()).unwrap();
        let good = render(&hosts(&["kcp.example.com"]), &c);
        assert_eq!(check(&good, &c, &domain()), Ok(1));
        for bad in [
            good.replace("force_tcp", "force_tcp\n        policy random"),
            good.replace("kcp.example.com:53", "kcp.example.com:5353"),
            good.replace("kcp.example.com", "a.svc.cluster.local"),
            good.replace("kcp.example.com", "*.example.com"),
        ] {
            assert!(check(&bad, &c, &domain()).is_err(), "{bad}");
        }
    }
}
