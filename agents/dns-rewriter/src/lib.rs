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
pub mod metrics;
pub mod output;
pub mod plan;
pub mod render;
pub mod rules;
pub mod services;
pub mod verify;

/// The runtime loads and reloads the file through this (the daemon, once built, gets a [`config::Config`]).
impl kcp_keeper_runtime::config::AgentConfig for config::Config {
    type Raw = config::RawConfig;

    fn from_raw(raw: config::RawConfig) -> Result<Self, Vec<kcp_keeper_runtime::config::FieldError>> {
        config::Config::from_raw(raw)
    }
}
