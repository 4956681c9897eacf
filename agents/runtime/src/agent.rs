//! The shape of every agent: the [`Agent`] trait, and `<agent> run`, everything around an agent's own loop.
//!
//! An agent is one type implementing [`Agent`]: its name and metric prefix, its configuration (raw and
//! validated), its error enum, its metrics, its RBAC (computed from its validated configuration), its
//! one-shot subcommands and its daemon's work, in one of two [`Form`]s: the reconcile driver
//! ([`Driven`]: [`crate::driver::run`]) or the runtime's schedules ([`Scheduled`]: [`crate::schedule`]).
//! [`crate::cli::main`] turns that into a binary with `run`, `rbac` and `--version`, the same for every agent.
//! The daemon gets a [`Daemon`] and returns when its shutdown token is cancelled.

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, Health};
use crate::args::RunArgs;
use crate::config::{self, AgentConfig};
pub use crate::context::Context;
use crate::driver::{ErrorReason, ReconcileMetrics};
use crate::events::Recorder;
use crate::lease::{self, Leadership, LeaseConfig};
use crate::metrics::ConfigMetrics;
use crate::rbac::{Rbac, Subjects};

/// One kcp-keeper agent. Implemented once per agent crate (in its `lib.rs`); everything else about the binary
/// (arguments, logging, configuration and its reload, the admin server, leader election, shutdown) is the
/// runtime's.
pub trait Agent: Sized + 'static {
    /// The binary's name: also its Lease (`kcp-keeper-<name>`), its Events' reporter and its ServiceAccount.
    const NAME: &'static str;
    /// The prefix of every metric it exports (`ca_syncer`).
    const METRICS_PREFIX: &'static str;
    /// One line for `--help`.
    const ABOUT: &'static str;
    /// The validated configuration; its [`AgentConfig::Raw`] is the file as written (and the chart's schema).
    type Config: AgentConfig;
    /// The daemon's error enum; its variant names are the bounded `reason` label.
    type Error: ErrorReason;
    /// Which of the runtime's two forms the daemon's work takes.
    type Form: Form;
    /// The agent's own metrics, registered under [`Agent::METRICS_PREFIX`] (the reconcile metrics of [`Driven`]
    /// agents are the runtime's).
    type Metrics: crate::metrics::Register + Send + Sync + 'static;
    /// The one-shot subcommands, beside the runtime's `run` and `rbac`.
    type Command: clap::Subcommand;
    /// Flags of `run` only this agent has ([`NoFlags`] when there are none).
    type RunFlags: clap::Args + Send + 'static;

    /// Every Role and ClusterRole this configuration needs. `None` when `rbac` ran without `--config`:
    /// an agent whose grants name what its configuration names answers [`crate::rbac::needs_config`].
    fn rbac(config: Option<&Self::Config>, who: &Subjects) -> anyhow::Result<Rbac>;

    /// The daemon's work, until `daemon.ctx.shutdown` is cancelled.
    fn daemon(daemon: Daemon<Self>) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Runs one of [`Agent::Command`]; the exit code says whether what it checked passed.
    fn oneshot(command: Self::Command) -> impl Future<Output = anyhow::Result<ExitCode>>;
}

/// What `run` has no agent-specific flags of.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NoFlags {}

/// The form of a daemon's work, and the metrics the runtime keeps for that form.
pub trait Form {
    type Metrics: Clone + Send + Sync + 'static;
    fn register<E: ErrorReason>(registry: &mut Registry) -> Self::Metrics;
}

/// Work items reconciled by [`crate::driver::run`]: the runtime registers `<prefix>_reconcile_*` from the
/// agent's error enum ([`ReconcileMetrics`]).
pub struct Driven;

impl Form for Driven {
    type Metrics = ReconcileMetrics;
    fn register<E: ErrorReason>(registry: &mut Registry) -> ReconcileMetrics {
        ReconcileMetrics::register::<E>(registry)
    }
}

/// Cron schedules ([`crate::schedule`]): the agent counts its failures itself, per schedule.
pub struct Scheduled;

impl Form for Scheduled {
    type Metrics = ();
    fn register<E: ErrorReason>(_: &mut Registry) {}
}

/// What an agent's daemon gets.
pub struct Daemon<A: Agent> {
    pub ctx: Context<A::Config>,
    pub metrics: A::Metrics,
    /// The form's own metrics: [`ReconcileMetrics`] for [`Driven`].
    pub form: <A::Form as Form>::Metrics,
    pub flags: A::RunFlags,
}

/// Names an agent: its binary name (Lease, Events) and metric prefix.
#[derive(Debug, Clone, Copy)]
pub struct AgentInfo {
    pub name: &'static str,
    pub metrics_prefix: &'static str,
}

impl AgentInfo {
    pub fn of<A: Agent>() -> Self {
        Self { name: A::NAME, metrics_prefix: A::METRICS_PREFIX }
    }
}

/// `<agent> run`: the agent's daemon under [`run_with`].
pub async fn run<A: Agent>(args: RunArgs, flags: A::RunFlags) -> anyhow::Result<()> {
    let register = |registry: &mut Registry| {
        let form = <A::Form as Form>::register::<A::Error>(registry);
        (<A::Metrics as crate::metrics::Register>::register(registry), form)
    };
    run_with(AgentInfo::of::<A>(), args, register, |ctx, (metrics, form)| {
        A::daemon(Daemon { ctx, metrics, form, flags })
    })
    .await
}

/// Runs an agent: logging, configuration (fails at start with the field path when invalid), metrics and the
/// admin server, the Kubernetes client, leader election, configuration reload and graceful shutdown.
/// `metrics` registers the agent's own metrics under its prefix; `body` is the agent's loop.
pub async fn run_with<C, M, F, Fut>(
    info: AgentInfo,
    args: RunArgs,
    metrics: impl FnOnce(&mut Registry) -> M,
    body: F,
) -> anyhow::Result<()>
where
    C: AgentConfig,
    F: FnOnce(Context<C>, M) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let rt = &args.runtime;
    crate::logging::init(&rt.log_level, rt.log_format)?;
    tracing::info!(agent = info.name, version = crate::VERSION, "starting");
    let initial: C = config::load(&args.config)?;

    let mut registry = crate::metrics::registry(info.metrics_prefix);
    let config_metrics = ConfigMetrics::register(registry.sub_registry_with_prefix(info.metrics_prefix));
    let leader_metrics = lease::LeaderMetrics::register(registry.sub_registry_with_prefix(info.metrics_prefix));
    let agent_metrics = metrics(registry.sub_registry_with_prefix(info.metrics_prefix));
    let health = Arc::new(Health::default());
    let _admin = admin::serve(rt.admin_addr, health.clone(), Arc::new(registry))
        .await
        .with_context(|| format!("binding the admin server to {}", rt.admin_addr))?;

    let signals = crate::shutdown::on_signals()?;
    // One token for the agent: cancelled by a signal or by losing the lease.
    let shutdown = signals.child_token();
    let client = rt.kube.client().await.context("creating the Kubernetes client")?;
    let identity = rt.lease.identity();

    let lease_token = CancellationToken::new();
    let lease_name = rt.lease.lease_name(info.name);
    let lease_record = rt.lease.enabled.then(|| crate::schedule::LeaseRecord {
        api: kube::Api::namespaced(client.clone(), &rt.lease.lease_namespace),
        lease_name: lease_name.clone(),
        identity: identity.clone(),
    });
    let (leadership, lease_task) = if rt.lease.enabled {
        let mut lease_config = LeaseConfig::new(rt.lease.lease_namespace.clone(), lease_name, identity.clone());
        lease_config.lease_duration = rt.lease.lease_duration;
        lease_config.renew_deadline = rt.lease.renew_deadline;
        lease_config.validate().map_err(|e| anyhow::anyhow!("leader election: {e}"))?;
        let (leadership, task) = lease::spawn(client.clone(), lease_config, lease_token.clone());
        (leadership, Some(task))
    } else {
        (Leadership::always(), None)
    };
    let lost = spawn_lost_lease_monitor(&leadership, shutdown.clone());
    leadership.export(leader_metrics);

    {
        let (health, shutdown) = (health.clone(), shutdown.clone());
        tokio::spawn(async move {
            shutdown.cancelled().await;
            health.start_draining();
        });
    }
    let config = config::watch(args.config.clone(), initial, config_metrics, config::POLL_INTERVAL, shutdown.clone())?;
    let events = Arc::new(Recorder::new(client.clone(), info.name, &identity));
    let ctx = Context {
        client,
        config,
        leadership,
        health,
        shutdown: shutdown.clone(),
        events,
        identity,
        namespace: rt.lease.lease_namespace.clone(),
        lease_name: rt.lease.lease_name(info.name),
        lease_record,
    };
    let result = body(ctx, agent_metrics).await;

    // Release the lease on the way out so another replica takes over at once.
    shutdown.cancel();
    lease_token.cancel();
    if let Some(task) = lease_task {
        // The lease task bounds its release by the renew deadline.
        let bound = rt.lease.renew_deadline + Duration::from_secs(1);
        match tokio::time::timeout(bound, task).await {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "leader election ended with an error"),
            Err(_) => tracing::warn!("lease not released in time"),
            _ => {}
        }
    }
    tracing::info!(agent = info.name, "stopped");
    if lost.is_finished() && lost.await.unwrap_or(false) {
        anyhow::bail!("lost the lease while leading; exiting so a fresh start re-joins the election");
    }
    result
}

/// Cancels `shutdown` when this replica stops leading after it led: writes in flight must stop, and a fresh
/// process re-joins the election cleanly. Resolves to whether that happened.
fn spawn_lost_lease_monitor(leadership: &Leadership, shutdown: CancellationToken) -> tokio::task::JoinHandle<bool> {
    let mut rx = leadership.subscribe();
    tokio::spawn(async move {
        let mut led = *rx.borrow();
        loop {
            tokio::select! {
                // A clean shutdown releases the lease too; it must not read as "lost".
                biased;
                _ = shutdown.cancelled() => return false,
                changed = rx.changed() => {
                    if changed.is_err() {
                        return false;
                    }
                    let now = *rx.borrow();
                    if led && !now {
                        tracing::error!("lost the lease while leading; stopping");
                        shutdown.cancel();
                        return true;
                    }
                    led = now;
                }
            }
        }
    })
}
