//! The one-shots beside the runtime's `run` and `rbac`: `render` (print what would be written) and `check`
//! (ask the resolver for every name). Results go to stdout; rule errors, warnings and notes to stderr, so
//! `render > file` keeps only the text.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use kcp_keeper_runtime::args::KubeArgs;
use kcp_keeper_runtime::config::load;

use crate::cluster::{self, ClusterView};
use crate::config::{self, Config, Target};
use crate::plan::{Plan, plan, rejected_errors};
use crate::{block, render, verify};

/// dns-rewriter's one-shots.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum Command {
    /// Print what would be written: the k3s snippet, or the marked Corefile block.
    Render(RenderArgs),
    /// Ask the resolver for every public name and print expected against answered.
    Check(CheckArgs),
    /// Remove the agent's rules (the Corefile block, or the k3s key), every other byte kept: for uninstalling.
    Cleanup(CleanupArgs),
}

/// Runs one; exit code 1 when a rule has an error or (`check`) a name does not answer as expected.
pub async fn run(command: Command) -> anyhow::Result<ExitCode> {
    let passed = match command {
        Command::Render(args) => render(&args).await?,
        Command::Check(args) => check(&args).await?,
        Command::Cleanup(args) => cleanup(&args).await?,
    };
    Ok(if passed { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// `dns-rewriter render`.
#[derive(clap::Args, Debug, Clone)]
pub struct RenderArgs {
    /// The agent's YAML configuration file.
    #[arg(long, env = "KCP_KEEPER_CONFIG")]
    pub config: PathBuf,

    /// Do not read the cluster: render the configured rules as written (no Service checks, no discovery).
    #[arg(long, env = "DNS_REWRITER_OFFLINE", value_parser = clap::builder::BoolishValueParser::new())]
    pub offline: bool,

    #[command(flatten)]
    pub kube: KubeArgs,
}

/// `dns-rewriter check`.
#[derive(clap::Args, Debug, Clone)]
pub struct CheckArgs {
    /// The agent's YAML configuration file.
    #[arg(long, env = "KCP_KEEPER_CONFIG")]
    pub config: PathBuf,

    /// The DNS server to ask (`IP` or `IP:port`); defaults to the configuration's `verify.resolver`.
    #[arg(long, env = "DNS_REWRITER_RESOLVER")]
    pub resolver: Option<String>,

    #[command(flatten)]
    pub kube: KubeArgs,
}

/// `dns-rewriter cleanup`.
#[derive(clap::Args, Debug, Clone)]
pub struct CleanupArgs {
    /// The agent's YAML configuration file.
    #[arg(long, env = "KCP_KEEPER_CONFIG")]
    pub config: PathBuf,

    #[command(flatten)]
    pub kube: KubeArgs,
}

/// Removes the block or key; says which on stderr. Exits 0 when it is gone (or was never there).
pub async fn cleanup(args: &CleanupArgs) -> anyhow::Result<bool> {
    let config: Config = load(&args.config)?;
    let client = args.kube.client().await.context("creating the Kubernetes client")?;
    let key = config.target.configmap();
    let what = format!("{}/{} key {}", key.namespace, key.name, key.key);
    match crate::cleanup::cleanup(&client, &config).await? {
        crate::cleanup::Cleaned::Removed => eprintln!("removed dns-rewriter's rules from {what}"),
        crate::cleanup::Cleaned::Nothing => eprintln!("nothing of dns-rewriter's in {what}"),
    }
    Ok(true)
}

/// Prints the snippet (k3s mode) or the marked block (Corefile mode) the agent would write. Exits 1 when a
/// rule has an error (the text is printed all the same: the other rules would still be written).
pub async fn render(args: &RenderArgs) -> anyhow::Result<bool> {
    let config: Config = load(&args.config)?;
    let plan = if args.offline {
        eprintln!("note: offline: the configured rules as written; no Service checks, no discovery");
        offline_plan(&config)?
    } else {
        let client = args.kube.client().await.context("creating the Kubernetes client (or pass --offline)")?;
        let view = cluster::read(&client, &config).await?;
        cluster::plan_with(&config, &view)
    };
    report(&plan);
    let snippet = render::render(&plan.rules, &config.cluster_domain);
    render::check(&snippet, &config.cluster_domain).context("the rendered snippet fails our own check")?;
    let text = match &config.target {
        Target::K3s(_) => snippet,
        Target::Corefile { .. } => block::standalone(&snippet)?,
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(plan.errors.is_empty())
}

fn offline_plan(config: &Config) -> anyhow::Result<Plan> {
    if config.discovery.is_some() {
        eprintln!("note: offline: discovery skipped");
    }
    let mut plan = plan(&config.cluster_domain, &config.rules, &[], None);
    plan.errors.splice(0..0, rejected_errors(&config.rejected));
    Ok(plan)
}

fn report(plan: &Plan) {
    for e in &plan.errors {
        eprintln!("error: {e}");
    }
    for w in &plan.warnings {
        eprintln!("warning: {w}");
    }
}

/// Asks the resolver for every name the plan holds and prints expected against answered. Exits 1 unless
/// every name answered with exactly its Service's ClusterIP and no rule had an error.
pub async fn check(args: &CheckArgs) -> anyhow::Result<bool> {
    let config: Config = load(&args.config)?;
    let resolver = match &args.resolver {
        Some(text) => config::parse_resolver(text).context("--resolver must be an IP address with an optional port")?,
        None => match config.verify.resolver {
            Some(addr) => addr,
            None => bail!("no resolver: set verify.resolver in the configuration or pass --resolver"),
        },
    };
    let client = args.kube.client().await.context("creating the Kubernetes client")?;
    let view: ClusterView = cluster::read(&client, &config).await?;
    let plan = cluster::plan_with(&config, &view);
    report(&plan);
    let resolver = verify::resolver(resolver, config.verify.timeout)?;
    let checks = verify::check_all(&resolver, &plan.rules).await;
    let width = checks.iter().map(|c| c.host.as_str().len()).max().unwrap_or(4).max(4);
    let mut out = format!("{:width$}  {:15}  {:31}  RESULT\n", "HOST", "EXPECTED", "ANSWERED");
    for c in &checks {
        let expected = c.expected.map(|ip| ip.to_string()).unwrap_or_else(|| "-".into());
        let answered = if c.answered.is_empty() {
            "-".to_string()
        } else {
            c.answered.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
        };
        let mut result = c.outcome.label().to_string();
        if !c.other_names.is_empty() {
            result.push_str(&format!(" (answer named {})", c.other_names.join(",")));
        }
        out.push_str(&format!("{:width$}  {expected:15}  {answered:31}  {result}\n", c.host.as_str()));
    }
    std::io::stdout().write_all(out.as_bytes())?;
    Ok(plan.errors.is_empty() && checks.iter().all(|c| c.outcome == verify::Outcome::Match))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_boolean_environment_variable_takes_1_0_true_false_yes_no() {
        let command = kcp_keeper_runtime::cli::command::<crate::DnsRewriter>();
        let checked = kcp_keeper_runtime::args::boolean_env::check(&command).unwrap();
        for variable in ["KCP_KEEPER_LEADER_ELECTION", "DNS_REWRITER_OFFLINE"] {
            assert!(checked.iter().any(|c| c == variable), "{variable} is not among {checked:?}");
        }
    }
}
