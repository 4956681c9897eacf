//! dns-rewriter: CoreDNS split-horizon rules so that, inside the cluster, each public kcp hostname answers
//! with its in-cluster Service's ClusterIP.
//!
//! Pure logic, tested without a cluster: [`config`] (strict file, parsed into validated types), [`hostname`]
//! (what a name in a rule may be), [`render`] (the closed grammar and its pre-write check), [`block`] (the
//! marked block in a foreign Corefile), [`discovery`] (names and Services from the kcp-operator's objects),
//! [`plan`] (rules, per-rule errors and warnings), [`output`] (the value to write, checked). The edges:
//! [`cluster`] (reads), [`verify`] (DNS queries), [`cli`] (the one-shots).

pub mod block;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod discovery;
pub mod hostname;
pub mod output;
pub mod plan;
pub mod render;
pub mod rules;
pub mod services;
pub mod verify;

/// Until the runtime's reconcile driver lands, `run` is the runtime's placeholder loop on this agent's real
/// configuration: the file is read with the same strict rules (this impl lets the runtime's loader and
/// reloader use them), but nothing is written yet.
impl kcp_keeper_runtime::config::AgentConfig for config::RawConfig {
    fn validate(&self) -> Vec<kcp_keeper_runtime::config::FieldError> {
        config::Config::from_raw(self.clone()).err().unwrap_or_default()
    }
}
