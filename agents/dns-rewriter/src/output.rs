//! What goes into the target key, checked before it may be written ("never write what has not been proven
//! to load"). The check is our own closed grammar ([`crate::render::check`]; in Corefile mode also "every
//! byte outside the block is the original's", [`crate::block::check_candidate`]), not a run of CoreDNS:
//! CoreDNS has no validate-only mode, and the agent's image carries no CoreDNS. What makes the grammar
//! check enough is that the grammar is closed: it admits exactly the texts the renderer produces, and the
//! test suite starts a real CoreDNS on every shape of those (no rule, one, many; k3s key, Corefile block)
//! and queries it.

use crate::block::{self, CandidateError};
use crate::config::Target;
use crate::hostname::Domain;
use crate::render::{self, GrammarError};
use crate::rules::RuleSet;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputError {
    #[error("the rendered snippet fails our own check: {0}")]
    Grammar(#[from] GrammarError),
    #[error("{0}")]
    Corefile(#[from] CandidateError),
    #[error("the Corefile key does not exist: the agent adds a block to a Corefile, it never creates one")]
    NoCorefile,
}

impl OutputError {
    pub fn reason(&self) -> &'static str {
        match self {
            OutputError::Grammar(_) => "grammar",
            OutputError::Corefile(CandidateError::Block(e)) => e.metric_label(),
            OutputError::Corefile(_) => "grammar",
            OutputError::NoCorefile => "no_corefile",
        }
    }
}

/// The full new value of the target key: the snippet in k3s mode; in Corefile mode `current` (the Corefile
/// as it is now) with our block set, our unmarked lines adopted into it ([`block::adopt`]). Only returned
/// when it passed the pre-write check.
pub fn desired_value(
    target: &Target,
    domain: &Domain,
    rules: &RuleSet,
    current: Option<&str>,
) -> Result<String, OutputError> {
    desired_value_adopting(target, domain, rules, current).map(|(value, _)| value)
}

/// [`desired_value`], and the unmarked lines it adopted from `current` (none in k3s mode): each is now inside
/// the block (a current rule writes the same line) or gone, and the caller must say which.
pub fn desired_value_adopting(
    target: &Target,
    domain: &Domain,
    rules: &RuleSet,
    current: Option<&str>,
) -> Result<(String, Vec<String>), OutputError> {
    let snippet = render::render(rules, domain);
    match target {
        Target::K3s(_) => {
            render::check(&snippet, domain)?;
            Ok((snippet, Vec::new()))
        }
        Target::Corefile { server_block, .. } => {
            let current = current.ok_or(OutputError::NoCorefile)?;
            // Our lines without their markers (after a kubeadm migration) are adopted, not duplicated: the
            // check then holds the candidate against the Corefile without them.
            let (current, adopted) = block::adopt(current, server_block, domain).map_err(CandidateError::Block)?;
            let candidate = block::set(&current, server_block, Some(&snippet)).map_err(CandidateError::Block)?;
            block::check_candidate(&current, &candidate, server_block, domain)?;
            Ok((candidate, adopted))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigMapKey;
    use crate::hostname::Hostname;
    use crate::rules::{ServiceRef, Target as RuleTarget};

    fn key() -> ConfigMapKey {
        ConfigMapKey { namespace: "kube-system".into(), name: "coredns".into(), key: "Corefile".into() }
    }

    fn rules() -> RuleSet {
        let mut set = RuleSet::new();
        let target = RuleTarget { service: ServiceRef::parse("kcp-system", "root-kcp").unwrap(), cluster_ip: None };
        set.insert(Hostname::parse("kcp-root.example.com").unwrap(), target).unwrap();
        set
    }

    const COREFILE: &str = ".:53 {\n    errors\n    kubernetes cluster.local\n}\n";

    #[test]
    fn k3s_mode_writes_the_checked_snippet_as_the_whole_key() {
        let domain = Domain::parse("cluster.local").unwrap();
        let value = desired_value(&Target::K3s(key()), &domain, &rules(), None).unwrap();
        assert_eq!(value, render::render(&rules(), &domain));
    }

    #[test]
    fn corefile_mode_sets_the_block_in_the_current_corefile_and_never_creates_one() {
        let domain = Domain::parse("cluster.local").unwrap();
        let target = Target::Corefile { key: key(), server_block: ".:53".into() };
        let value = desired_value(&target, &domain, &rules(), Some(COREFILE)).unwrap();
        assert_eq!(block::set(&value, ".:53", None).unwrap(), COREFILE);
        assert!(
            value.contains("    rewrite name exact kcp-root.example.com. root-kcp.kcp-system.svc.cluster.local.\n")
        );
        assert_eq!(desired_value(&target, &domain, &rules(), Some(&value)).unwrap(), value, "idempotent");
        assert_eq!(desired_value(&target, &domain, &rules(), None), Err(OutputError::NoCorefile));
        let other = Target::Corefile { key: key(), server_block: ".:5353".into() };
        let err = desired_value(&other, &domain, &rules(), Some(COREFILE)).unwrap_err();
        assert_eq!(err.reason(), "no_server_block", "{err}");
    }
}
