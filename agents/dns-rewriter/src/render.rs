//! The text we write, from a closed grammar: a fixed header, then one line per rule
//!
//! ```text
//! rewrite name exact <public name>. <service>.<namespace>.svc.<cluster domain>.
//! ```
//!
//! sorted by public name. Nothing else can be produced: every name has passed [`crate::hostname`], so no
//! quoting, no braces, no other plugin (a `hosts` line in a k3s `.override` breaks the Corefile: `hosts` may
//! appear once per server block). The output depends only on the set of rules, so shuffled inputs give the
//! same bytes and CoreDNS's `reload` (which restarts on any byte change) stays quiet.
//!
//! The same text is the whole `.override` key in k3s mode and the content of the marked block in Corefile
//! mode. An exact `rewrite name` rule also rewrites the answer's name back to the public name, so clients
//! see the name they asked for.
//!
//! [`check`] is the pre-write check: it reads text back with the same grammar and insists that rendering what
//! it read gives the same bytes. The agent writes nothing that fails it.

use crate::hostname::{Domain, Hostname};
use crate::rules::{RuleSet, ServiceRef, Target};

/// The first lines of everything we write.
pub const HEADER: &str = "# Managed by kcp-keeper (dns-rewriter); edits here are overwritten.\n\
                          # Split horizon: each kcp public name below answers with its in-cluster Service.\n";

/// The snippet for `rules`: the header, then one sorted line per rule.
pub fn render(rules: &RuleSet, domain: &Domain) -> String {
    let mut out = String::from(HEADER);
    for (host, target) in rules.iter() {
        out.push_str(&line(host, &target.service, domain));
    }
    out
}

fn line(host: &Hostname, service: &ServiceRef, domain: &Domain) -> String {
    format!("rewrite name exact {} {}.\n", host.fqdn(), service.cluster_name(domain))
}

/// Why a candidate was refused: the line and the rule it broke, never the line's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct GrammarError {
    pub line: usize,
    pub reason: &'static str,
}

/// The pre-write check: `text` must be exactly what [`render`] produces for some rule set under `domain`.
/// Returns the number of rules.
pub fn check(text: &str, domain: &Domain) -> Result<usize, GrammarError> {
    let err = |line, reason| GrammarError { line, reason };
    let header_lines = HEADER.lines().count();
    if !text.starts_with(HEADER) {
        return Err(err(1, "the header is missing or altered"));
    }
    if !text.ends_with('\n') {
        return Err(err(text.lines().count(), "the text must end with a newline"));
    }
    let mut rules = RuleSet::new();
    let mut last: Option<Hostname> = None;
    for (i, l) in text[HEADER.len()..].lines().enumerate() {
        let n = header_lines + i + 1;
        let words: Vec<&str> = l.split(' ').collect();
        let [rewrite, name, exact, from, to] = words.as_slice() else {
            return Err(err(n, "a rule line has exactly five words separated by single spaces"));
        };
        if (*rewrite, *name, *exact) != ("rewrite", "name", "exact") {
            return Err(err(n, "a rule line starts with `rewrite name exact`"));
        }
        let (Some(from), Some(to)) = (from.strip_suffix('.'), to.strip_suffix('.')) else {
            return Err(err(n, "both names end with a dot"));
        };
        let host = Hostname::parse(from).map_err(|_| err(n, "the public name is not a valid hostname"))?;
        if host.is_within(domain) {
            return Err(err(n, "the public name lies inside the cluster domain"));
        }
        let service = to
            .strip_suffix(domain.as_str())
            .and_then(|rest| rest.strip_suffix(".svc."))
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(name, namespace)| ServiceRef::parse(namespace, name).ok())
            .ok_or(err(n, "the target is not <service>.<namespace>.svc.<cluster domain>"))?;
        if Hostname::parse(to).is_err() {
            return Err(err(n, "the target is not a valid hostname"));
        }
        if last.as_ref().is_some_and(|last| *last >= host) {
            return Err(err(n, "rules are sorted by public name, each name once"));
        }
        last = Some(host.clone());
        let _ = rules.insert(host, Target { service, cluster_ip: None });
    }
    if render(&rules, domain) != text {
        return Err(err(1, "the text differs from what the renderer produces for the same rules"));
    }
    Ok(rules.len())
}

/// True when `line` (without indentation or line end) is one rule line of the grammar under `domain`: what
/// the renderer writes, so one found without our markers is ours ([`crate::block::adopt`]).
pub fn is_rule_line(line: &str, domain: &Domain) -> bool {
    !line.contains('\n') && check(&format!("{HEADER}{line}\n"), domain).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domain() -> Domain {
        Domain::parse("cluster.local").unwrap()
    }

    fn rules(pairs: &[(&str, &str, &str)]) -> RuleSet {
        let mut set = RuleSet::new();
        for (host, ns, name) in pairs {
            let target = Target { service: ServiceRef::parse(ns, name).unwrap(), cluster_ip: None };
            set.insert(Hostname::parse(host).unwrap(), target).unwrap();
        }
        set
    }

    const SEED: &[(&str, &str, &str)] = &[
        ("kcp.example.com", "kcp-system", "frontproxy-front-proxy"),
        ("root.kcp.example.com", "kcp-system", "root-kcp"),
        ("alpha.kcp.example.com", "kcp-system", "alpha-shard-kcp"),
        ("beta.kcp.example.com", "kcp-system", "beta-shard-kcp"),
        ("kcp-root.example.com", "kcp-system", "root-kcp"),
    ];

    /// A small deterministic shuffle (no randomness in tests that must reproduce).
    fn shuffled<T: Clone>(items: &[T], seed: u64) -> Vec<T> {
        let mut v = items.to_vec();
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        for i in (1..v.len()).rev() {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            v.swap(i, (state >> 33) as usize % (i + 1));
        }
        v
    }

    #[test]
    fn one_rule_renders_the_header_and_one_exact_rewrite_line() {
        let text = render(&rules(&[("kcp-root.example.com", "kcp-system", "root-kcp")]), &domain());
        assert_eq!(
            text,
            "# Managed by kcp-keeper (dns-rewriter); edits here are overwritten.\n\
             # Split horizon: each kcp public name below answers with its in-cluster Service.\n\
             rewrite name exact kcp-root.example.com. root-kcp.kcp-system.svc.cluster.local.\n"
        );
    }

    #[test]
    fn shuffled_inputs_render_identical_bytes_sorted_by_public_name() {
        let expected = render(&rules(SEED), &domain());
        for seed in 0..50 {
            assert_eq!(render(&rules(&shuffled(SEED, seed)), &domain()), expected, "seed {seed}");
        }
        let hosts: Vec<&str> =
            expected.lines().skip(2).map(|l| l.split(' ').nth(3).unwrap().trim_end_matches('.')).collect();
        let mut sorted = hosts.clone();
        sorted.sort();
        assert_eq!(hosts, sorted);
        assert_eq!(hosts.len(), SEED.len());
    }

    #[test]
    fn the_cluster_domain_is_used_for_every_target() {
        let text = render(&rules(SEED), &Domain::parse("k8s.internal").unwrap());
        assert!(text.lines().skip(2).all(|l| l.ends_with(".svc.k8s.internal.")), "{text}");
    }

    #[test]
    fn everything_the_renderer_produces_passes_the_pre_write_check() {
        for n in 0..=SEED.len() {
            let text = render(&rules(&SEED[..n]), &domain());
            assert_eq!(check(&text, &domain()), Ok(n), "{text}");
        }
    }

    #[test]
    fn the_pre_write_check_refuses_every_deviation_from_the_grammar() {
        let good = render(&rules(&SEED[..3]), &domain());
        let body = &good[HEADER.len()..];
        let lines: Vec<&str> = body.lines().collect();
        let cases: Vec<(String, &str)> = vec![
            (body.to_string(), "header"),
            (good.replacen("kcp-keeper", "someone", 1), "header"),
            (good.trim_end().to_string(), "newline"),
            (format!("{HEADER}hosts {{\n  10.0.0.1 kcp.example.com\n}}\n"), "five words"),
            (format!("{good}rewrite name regex (.*).example.com. {{1}}.svc.cluster.local.\n"), "rewrite name exact"),
            (format!("{good}rewrite name exact a.example.com. b.example.com.\n"), "target"),
            (format!("{good}rewrite name exact a.example.com b.kcp-system.svc.cluster.local.\n"), "dot"),
            (format!("{good}rewrite name exact *.example.com. b.kcp-system.svc.cluster.local.\n"), "public name"),
            (format!("{good}rewrite name exact A.example.com. b.kcp-system.svc.cluster.local.\n"), "public name"),
            (format!("{good}rewrite  name exact z.example.com. b.kcp-system.svc.cluster.local.\n"), "five words"),
            (
                format!("{good}rewrite name exact z.svc.cluster.local. b.kcp-system.svc.cluster.local.\n"),
                "cluster domain",
            ),
            (format!("{good}rewrite name exact z.example.com. b.kcp-system.svc.other.local.\n"), "target"),
            (format!("{HEADER}{}\n{}\n", lines[1], lines[0]), "sorted"),
            (format!("{HEADER}{}\n{}\n", lines[0], lines[0]), "sorted"),
            (format!("{good}\n"), "five words"),
            (format!("{good}# a comment\n"), "five words"),
        ];
        for (text, reason) in cases {
            let err = check(&text, &domain()).expect_err(&text);
            assert!(err.reason.contains(reason), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_rule_line_is_recognised_only_in_the_exact_grammar() {
        let d = domain();
        assert!(is_rule_line("rewrite name exact kcp.example.com. root-kcp.kcp-system.svc.cluster.local.", &d));
        for other in [
            "rewrite name exact kcp.example.com. root-kcp.kcp-system.svc.other.local.",
            "rewrite name exact kcp.example.com root-kcp.kcp-system.svc.cluster.local.",
            "rewrite name regex (.*).example.com. root-kcp.kcp-system.svc.cluster.local.",
            "rewrite  name exact kcp.example.com. root-kcp.kcp-system.svc.cluster.local.",
            "forward . /etc/resolv.conf",
            "",
        ] {
            assert!(!is_rule_line(other, &d), "{other:?}");
        }
    }

    #[test]
    fn grammar_errors_never_repeat_the_offending_text() {
        let text = format!("{HEADER}rewrite name exact secret-token.example.com. x\n");
        let err = check(&text, &domain()).unwrap_err().to_string();
        assert!(!err.contains("secret-token"), "{err}");
    }
}
