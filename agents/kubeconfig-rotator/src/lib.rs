//! kubeconfig-rotator: keeps the admin kubeconfigs other components use fresh. It follows a kcp-operator
//! `Kubeconfig` (or a plain Secret, or a cert-manager certificate Secret), nudges the operator when its render
//! is stale, forces a renewal that is overdue, proves every candidate against the real server, and publishes it
//! to target Secrets in other namespaces, never replacing a credential with a worse one.
//!
//! Where the code is (the same roles in every agent; [`KubeconfigRotator`] ties them to the runtime):
//! - [`config`]: the file, raw (the chart's schema) and validated;
//! - [`error`]: why a reconcile failed, and every reason a candidate is refused;
//! - [`scope`]: the objects the configuration names, watched by name; [`scope::rbac`]: the Roles for them;
//! - [`reconcile`]: the daemon, the driver's reconciler; [`metrics`]: its series; [`cli`]: `status`, `rotate`;
//! - domain modules, pure: [`source`] (the candidate a source offers), [`credential`] (parse, check, rewrite,
//!   build), [`policy`] (the decisions), [`target`] (what a target holds and is written), [`overlap`] (old and
//!   new server CAs), [`report`] (a pass over the targets told in one Event); with I/O: [`prove`] (the SelfSubjectReview), [`renew`] (the nudge and the forced renewal),
//!   [`objects`] (the foreign kinds);
//! - consumer restarts (hash annotation, retries, restart windows) are the runtime's
//!   [`kcp_keeper_runtime::consumer_restart`], shared with ca-syncer.
#![forbid(unsafe_code)]
#![warn(clippy::too_many_lines)]

use std::future::Future;
use std::process::ExitCode;

use kcp_keeper_runtime::agent::{Agent, Daemon, Driven, NoFlags};
use kcp_keeper_runtime::rbac::{Rbac, Subjects, needs_config};

pub mod cli;
pub mod config;
pub mod credential;
pub mod error;
pub mod metrics;
pub mod objects;
pub mod overlap;
pub mod policy;
pub mod prove;
pub mod reconcile;
pub mod renew;
pub mod report;
pub mod scope;
pub mod source;
pub mod target;

/// The agent, for the runtime: `kubeconfig-rotator run` reconciles every configured kubeconfig on the driver.
pub struct KubeconfigRotator;

impl Agent for KubeconfigRotator {
    const NAME: &'static str = "kubeconfig-rotator";
    const METRICS_PREFIX: &'static str = "kubeconfig_rotator";
    const ABOUT: &'static str = "Hands-off rotation of kcp admin kubeconfigs";
    type Config = config::Config;
    type Error = error::SyncError;
    type Form = Driven;
    type Metrics = metrics::Metrics;
    type Command = cli::Command;
    type RunFlags = NoFlags;

    /// Every object is granted by name, so the Roles need the configuration.
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
