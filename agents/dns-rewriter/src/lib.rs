//! dns-rewriter: CoreDNS split-horizon rules so that, inside the cluster, each public kcp hostname answers
//! with its in-cluster Service's ClusterIP.
//!
//! Pure logic, tested without a cluster: [`config`] (strict file, parsed into validated types), [`hostname`]
//! (what a name in a rule may be), [`render`] (the closed grammar and its pre-write check), [`block`] (the
//! marked block in a foreign Corefile), [`discovery`] (names and Services from the kcp-operator's objects),
//! [`plan`] (rules, per-rule errors and warnings), [`output`] (the value to write, checked). The edges:
//! [`cluster`] (reads for the one-shots), [`scope`] (the daemon's watches), [`operator`] (the operator's kinds as
//! typed resources), [`write`] (the one conditional write), [`verify`] (DNS queries), [`cli`] (the one-shots),
//! [`daemon`] (`run`), [`rbac`] (the Roles a configuration needs).

pub mod block;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod discovery;
pub mod hostname;
pub mod metrics;
pub mod operator;
pub mod output;
pub mod plan;
pub mod rbac;
pub mod render;
pub mod rules;
pub mod scope;
pub mod services;
pub mod verify;
pub mod write;

/// The runtime loads and reloads the file through this; the daemon gets a [`config::Config`].
impl kcp_keeper_runtime::config::AgentConfig for config::Config {
    type Raw = config::RawConfig;

    fn from_raw(raw: config::RawConfig) -> Result<Self, Vec<kcp_keeper_runtime::config::FieldError>> {
        config::Config::from_raw(raw)
    }
}
