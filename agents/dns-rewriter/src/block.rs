//! Corefile mode: our rules live in a clearly marked block inside one server block (`.:53`) of a Corefile
//! that someone else owns (kubeadm, a cluster's admins), and every byte outside the block is kept. The
//! structure (finding the server block and the markers, refusing anything ambiguous, inserting, replacing,
//! removing) is the runtime's marked-block module ([`kcp_keeper_runtime::marked_block`]); this module adds
//! what dns-rewriter needs on top: the block's id, the content as the renderer writes it (lines ending in a
//! newline), the block shown on its own, and the pre-write check of a candidate Corefile.

use kcp_keeper_runtime::marked_block::{BlockError, MarkedBlock};

use crate::hostname::Domain;

/// The block's owner id in its markers.
pub const BLOCK_ID: &str = "dns-rewriter";

/// Why a Corefile candidate was refused before writing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CandidateError {
    #[error("the candidate Corefile: {0}")]
    Block(#[from] BlockError),
    #[error("the candidate Corefile has no block of ours")]
    NoBlock,
    #[error("the candidate's block: {0}")]
    Grammar(#[from] crate::render::GrammarError),
    #[error("the candidate changes bytes outside its block")]
    ForeignBytesChanged,
}

fn block(server_key: &str) -> Result<MarkedBlock, BlockError> {
    MarkedBlock::new(BLOCK_ID, server_key)
}

/// The content of our block in `corefile` (lines without indentation, each ending in a newline), or `None`.
pub fn content(corefile: &str, server_key: &str) -> Result<Option<String>, BlockError> {
    Ok(block(server_key)?.content(corefile)?.map(|lines| if lines.is_empty() { lines } else { lines + "\n" }))
}

/// `corefile` with our block set to `content`, or removed when `content` is `None`. Every other byte is kept.
pub fn set(corefile: &str, server_key: &str, content: Option<&str>) -> Result<String, BlockError> {
    block(server_key)?.set(corefile, content)
}

/// `corefile` without the rule lines of our grammar found directly in the server block without markers, and
/// those lines (trimmed): when there is no block of ours (a kubeadm CoreDNS upgrade re-serialises the Corefile through
/// coredns/corefile-migration, which drops every comment, our markers included, and keeps the lines). They
/// are adopted: the block written next holds exactly the current rules, so nothing is duplicated and a rule
/// removed meanwhile is gone. With a block present nothing is adopted. An administrator's own line written in
/// exactly our form is taken the same way (no marker tells it apart): the caller says so for each line.
pub fn adopt(corefile: &str, server_key: &str, domain: &Domain) -> Result<(String, Vec<String>), BlockError> {
    block(server_key)?.unmarked(corefile, |line| crate::render::is_rule_line(line, domain))
}

/// The block as it appears in a Corefile, without indentation (what `render` prints in Corefile mode).
pub fn standalone(content: &str) -> Result<String, BlockError> {
    // Placed in an empty server block, whose default indentation is four spaces.
    let placed = set(". {\n}\n", ".", Some(content))?;
    let inner = placed.strip_prefix(". {\n").and_then(|s| s.strip_suffix("}\n")).unwrap_or_default();
    Ok(inner.lines().map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l))).collect())
}

/// The pre-write check of Corefile mode: the candidate's block passes the renderer's grammar, and the
/// candidate equals `original` outside the block.
pub fn check_candidate(
    original: &str,
    candidate: &str,
    server_key: &str,
    domain: &Domain,
) -> Result<usize, CandidateError> {
    let content = content(candidate, server_key)?.ok_or(CandidateError::NoBlock)?;
    let rules = crate::render::check(&content, domain)?;
    if set(candidate, server_key, None)? != set(original, server_key, None)? {
        return Err(CandidateError::ForeignBytesChanged);
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostname::Hostname;
    use crate::render::{HEADER, render};
    use crate::rules::{RuleSet, ServiceRef, Target};

    /// kubeadm's default Corefile.
    const KUBEADM: &str = testbed::coredns::KUBEADM_DEFAULT_COREFILE;

    /// A Corefile with a second server block, comments, quotes and an odd indentation, which must survive.
    const ODD: &str = "# the cluster's DNS\nexample.org:53 {\n\tforward . 9.9.9.9\n}\n\n.:53 {\n\terrors # keep\n\tkubernetes cluster.local {\n\t\tpods \"in secure\"\n\t}\n\treload\n}\n";

    fn domain() -> Domain {
        Domain::parse("cluster.local").unwrap()
    }

    fn snippet(pairs: &[(&str, &str)]) -> String {
        let mut set = RuleSet::new();
        for (host, svc) in pairs {
            let target = Target { service: ServiceRef::parse("kcp-system", svc).unwrap(), cluster_ip: None };
            set.insert(Hostname::parse(host).unwrap(), target).unwrap();
        }
        render(&set, &domain())
    }

    #[test]
    fn the_block_is_inserted_before_the_closing_brace_with_the_servers_indentation() {
        let text = snippet(&[("kcp-root.example.com", "root-kcp")]);
        let out = set(KUBEADM, ".:53", Some(&text)).unwrap();
        let expected_tail = "    loadbalance\n    # kcp-keeper:begin dns-rewriter (managed by kcp-keeper: edits inside this block are overwritten)\n    # Managed by kcp-keeper (dns-rewriter); edits here are overwritten.\n    # Split horizon: each kcp public name below answers with its in-cluster Service.\n    rewrite name exact kcp-root.example.com. root-kcp.kcp-system.svc.cluster.local.\n    # kcp-keeper:end dns-rewriter\n}\n";
        assert!(out.ends_with(expected_tail), "{out}");
        assert_eq!(content(&out, ".:53").unwrap().as_deref(), Some(text.as_str()));
        let odd = set(ODD, ".:53", Some(&text)).unwrap();
        assert!(odd.contains("\treload\n\t# kcp-keeper:begin dns-rewriter"), "{odd}");
        assert!(odd.starts_with("# the cluster's DNS\nexample.org:53 {\n\tforward . 9.9.9.9\n}\n"), "{odd}");
    }

    #[test]
    fn many_cycles_change_only_the_block_and_removal_restores_every_byte() {
        for original in [KUBEADM, ODD, &KUBEADM.replace('\n', "\r\n")] {
            let one = snippet(&[("a.example.com", "a"), ("b.example.com", "b")]);
            let two = snippet(&[("a.example.com", "a"), ("b.example.com", "b"), ("c.example.com", "c")]);
            let mut text = original.to_string();
            for cycle in 0..20 {
                let lines = if cycle % 2 == 0 { &one } else { &two };
                let next = set(&text, ".:53", Some(lines)).unwrap();
                assert_eq!(set(&next, ".:53", Some(lines)).unwrap(), next, "setting the same content is a no-op");
                assert_eq!(set(&next, ".:53", None).unwrap(), original, "outside the block nothing changed");
                text = next;
            }
            assert_eq!(set(&text, ".:53", None).unwrap(), original);
        }
    }

    #[test]
    fn removing_a_rule_removes_exactly_its_line() {
        let three = snippet(&[("a.example.com", "a"), ("b.example.com", "b"), ("c.example.com", "c")]);
        let two = snippet(&[("a.example.com", "a"), ("c.example.com", "c")]);
        let before = set(KUBEADM, ".:53", Some(&three)).unwrap();
        let after = set(&before, ".:53", Some(&two)).unwrap();
        let removed: Vec<&str> = before.lines().filter(|l| !after.lines().any(|a| a == *l)).collect();
        assert_eq!(removed, vec!["    rewrite name exact b.example.com. b.kcp-system.svc.cluster.local."]);
        assert_eq!(before.lines().count(), after.lines().count() + 1);
    }

    #[test]
    fn the_server_block_is_found_by_key_with_a_port_placeholder_or_scheme() {
        let lines = snippet(&[("a.example.com", "a")]);
        let text = ".:{{port}} {\n    errors\n}\n";
        assert!(set(text, ".:{{port}}", Some(&lines)).unwrap().contains("rewrite name exact a.example.com."));
        assert!(set("dns://.:53 {\n    errors\n}\n", ".:53", Some(&lines)).is_ok());
        assert!(set(".:53, example.com:53 {\n    errors\n}\n", ".:53", Some(&lines)).is_ok());
    }

    #[test]
    fn an_ambiguous_corefile_is_refused_by_the_runtime_module() {
        let lines = snippet(&[("a.example.com", "a")]);
        assert_eq!(
            set(&format!("{KUBEADM}{KUBEADM}"), ".:53", Some(&lines)).unwrap_err(),
            BlockError::AmbiguousServerBlock(2, ".:53".into())
        );
        assert_eq!(set(KUBEADM, ".:5353", Some(&lines)).unwrap_err(), BlockError::NoServerBlock(".:5353".into()));
    }

    #[test]
    fn standalone_shows_the_markers_around_the_content() {
        let lines = snippet(&[("a.example.com", "a")]);
        let shown = standalone(&lines).unwrap();
        assert!(shown.starts_with("# kcp-keeper:begin dns-rewriter (managed by kcp-keeper"), "{shown}");
        assert!(shown.ends_with(&format!("{lines}# kcp-keeper:end dns-rewriter\n")), "{shown}");
    }

    #[test]
    fn content_that_could_break_out_of_the_block_is_refused() {
        for bad in ["}\n", "forward . 1.1.1.1 {\n", "\"open\n"] {
            assert_eq!(set(KUBEADM, ".:53", Some(bad)).unwrap_err(), BlockError::ContentUnbalanced, "{bad:?}");
        }
        let marker = "# kcp-keeper:end dns-rewriter\n";
        assert_eq!(set(KUBEADM, ".:53", Some(marker)).unwrap_err(), BlockError::ContentHasMarker);
    }

    #[test]
    fn the_pre_write_check_accepts_our_candidate_and_refuses_tampering() {
        let lines = snippet(&[("a.example.com", "a"), ("b.example.com", "b")]);
        let candidate = set(KUBEADM, ".:53", Some(&lines)).unwrap();
        assert_eq!(check_candidate(KUBEADM, &candidate, ".:53", &domain()), Ok(2));
        let foreign = candidate.replace("ttl 30", "ttl 5");
        assert_eq!(check_candidate(KUBEADM, &foreign, ".:53", &domain()), Err(CandidateError::ForeignBytesChanged));
        assert_eq!(check_candidate(KUBEADM, KUBEADM, ".:53", &domain()), Err(CandidateError::NoBlock));
        let hosts = set(KUBEADM, ".:53", Some(&format!("{HEADER}hosts 10.0.0.1 a.example.com\n"))).unwrap();
        assert!(matches!(check_candidate(KUBEADM, &hosts, ".:53", &domain()), Err(CandidateError::Grammar(_))));
    }
}
