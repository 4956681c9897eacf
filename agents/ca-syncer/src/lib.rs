//! ca-syncer: CA certificates into the Secrets and ConfigMaps consumers mount and hot-reload.
//!
//! Where the code is (the same roles in every agent):
//! - [`config`]: the file as written and the validated [`config::Config`] (`config/sources.rs`,
//!   `config/targets.rs`, `config/live_check.rs`: one part per thing it configures);
//! - [`error`]: [`error::SyncError`], why a bundle's reconcile failed (the `reason` label);
//! - [`scope`]: the [`scope::Plan`] of what the configuration names, the watches and stores built from it,
//!   and [`scope::rbac`], the Roles rendered from the same plan;
//! - [`reconcile`]: the daemon: one reconcile per bundle under the runtime's driver;
//! - [`metrics`]: the `ca_syncer_*` series and the bookkeeping that removes stale ones;
//! - [`cli`]: the one-shots, `render` and `watch`.
//!
//! The domain, pure (no Kubernetes client, no I/O): [`certs`] (strict parsing), [`bundle`] (byte-stable
//! bundles), [`rotation`] (keeping rotated-out CAs), [`keystore`] (the JKS and PKCS#12 trust stores), [`report`]
//! (a pass over a bundle's targets told in one Event). The edges: [`sources`] (reading them), [`state`] (each
//! bundle's rotation record, in the agent's own namespace), [`observed`] (a target as a pass sees it), [`live_check`], and [`sidecar`]
//! (`ca-syncer watch`).
#![forbid(unsafe_code)]
#![warn(clippy::too_many_lines)]

pub mod bundle;
pub mod certs;
pub mod cli;
pub mod config;
pub mod consumers;
pub mod error;
pub mod keystore;
pub mod live_check;
pub mod metrics;
pub mod observed;
pub mod reconcile;
pub mod report;
pub mod rotation;
pub mod scope;
pub mod sidecar;
pub mod sources;
pub mod state;
pub mod target_metadata;

#[cfg(test)]
mod testcerts;

use std::process::ExitCode;

use kcp_keeper_runtime::agent::{Agent, Daemon, Driven};
use kcp_keeper_runtime::rbac::{Rbac, Subjects, needs_config};

/// The agent.
pub struct CaSyncer;

impl Agent for CaSyncer {
    const NAME: &'static str = "ca-syncer";
    const METRICS_PREFIX: &'static str = "ca_syncer";
    const ABOUT: &'static str = "CA bundles into hot-reloaded Secrets";
    type Config = config::Config;
    type Error = error::SyncError;
    type Form = Driven;
    type Metrics = metrics::Metrics;
    type Command = cli::Command;
    type RunFlags = reconcile::RunFlags;

    /// Secrets only by name: without `--config` there is nothing to name.
    fn rbac(config: Option<&config::Config>, who: &Subjects) -> anyhow::Result<Rbac> {
        Ok(scope::rbac::render(needs_config(config)?, who))
    }

    async fn daemon(daemon: Daemon<Self>) -> anyhow::Result<()> {
        let Daemon { ctx, metrics, form, flags } = daemon;
        let own = reconcile::Own { lease_name: ctx.lease_name.clone(), namespace: ctx.namespace.clone() };
        reconcile::daemon(ctx, metrics, form, flags, own).await
    }

    async fn oneshot(command: cli::Command) -> anyhow::Result<ExitCode> {
        cli::run(command).await
    }
}
