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
/// as it is now) with our block set. Only returned when it passed the pre-write check.
pub fn desired_value(
    target: &Target,
    domain: &Domain,
    rules: &RuleSet,
    current: Option<&str>,
) -> Result<String, OutputError> {
    let snippet = render::render(rules, domain);
    match target {
        Target::K3s(_) => {
            render::check(&snippet, domain)?;
            Ok(snippet)
        }
        Target::Corefile { server_block, .. } => {
            let current = current.ok_or(OutputError::NoCorefile)?;
            let candidate = block::set(current, server_block, Some(&snippet)).map_err(CandidateError::Block)?;
            block::check_candidate(current, &candidate, server_block, domain)?;
            Ok(candidate)
        }
    }
}
