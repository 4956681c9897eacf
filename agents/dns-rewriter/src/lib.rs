//! dns-rewriter: CoreDNS split-horizon rules so that, inside the cluster, each public kcp hostname answers
//! with its in-cluster Service's ClusterIP. [`DnsRewriter`] is the agent; the runtime gives it `run`, `rbac`
//! and `--version`.
//!
//! Where the code is (the same file roles in every agent):
//! - [`config`]: the file, raw (serde, the chart's schema) and validated;
//! - [`error`]: why a cycle fails ([`error::CycleError`], the `reason` label);
//! - [`scope`]: what the configuration names, watched (the daemon's stores), and [`scope::rbac`], the Roles
//!   for exactly that;
//! - [`reconcile`]: the daemon's one item and its cycle: plan, write, verify;
//! - [`metrics`]: the agent's own series;
//! - [`cli`]: the one-shots `render`, `check` and `cleanup` ([`cleanup`]: the block or key removed, for
//!   uninstalling).
//!
//! The domain, pure and tested without a cluster: [`hostname`] (what a name in a rule may be), [`rules`] (the
//! rule set), [`render`] (the closed grammar and its pre-write check), [`block`] (the marked block in a foreign
//! Corefile), [`node_local`] (the server block in NodeLocal DNSCache's Corefile), [`discovery`] (names and Services from the kcp-operator's objects), [`services`] (what a Service
//! says), [`plan`] (rules, per-rule errors and warnings), [`output`] (the value to write, checked). The edges:
//! [`cluster`] (reads for the one-shots), [`operator`] (the operator's kinds as typed resources), [`verify`]
//! (DNS queries).

#![warn(clippy::too_many_lines)]

use std::process::ExitCode;

use kcp_keeper_runtime::agent::{Agent, Daemon, Driven, NoFlags};
use kcp_keeper_runtime::rbac::{Rbac, Subjects, needs_config};

pub mod block;
pub mod cleanup;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod discovery;
pub mod error;
pub mod hostname;
pub mod metrics;
pub mod node_local;
pub mod operator;
pub mod output;
pub mod plan;
pub mod reconcile;
pub mod render;
pub mod rules;
pub mod scope;
pub mod services;
pub mod verify;

/// The agent.
pub struct DnsRewriter;

impl Agent for DnsRewriter {
    const NAME: &'static str = "dns-rewriter";
    const METRICS_PREFIX: &'static str = "dns_rewriter";
    const ABOUT: &'static str = "CoreDNS split-horizon rules for kcp";
    type Config = config::Config;
    type Error = error::CycleError;
    type Form = Driven;
    type Metrics = metrics::Metrics;
    type Command = cli::Command;
    type RunFlags = NoFlags;

    /// The Roles name the one ConfigMap and the namespaces the configuration names, so `--config` is needed.
    fn rbac(config: Option<&config::Config>, who: &Subjects) -> anyhow::Result<Rbac> {
        Ok(scope::rbac::render(needs_config(config)?, who))
    }

    fn daemon(daemon: Daemon<Self>) -> impl Future<Output = anyhow::Result<()>> + Send {
        reconcile::daemon(daemon.ctx, daemon.metrics, daemon.form)
    }

    fn oneshot(command: cli::Command) -> impl Future<Output = anyhow::Result<ExitCode>> {
        cli::run(command)
    }
}
