//! Command-line arguments shared by every agent. Every flag can also be set from an environment variable, so
//! the chart can configure agents without templating command lines.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::logging::LogFormat;

/// `<agent> run`: the daemon.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// The agent's YAML configuration file (re-read when it changes).
    #[arg(long, env = "KCP_KEEPER_CONFIG")]
    pub config: PathBuf,

    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

#[derive(clap::Args, Debug, Clone)]
pub struct RuntimeArgs {
    /// Log filter, e.g. `info` or `kcp_keeper_runtime=debug,info`.
    #[arg(long, env = "KCP_KEEPER_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Log format: JSON in the cluster, plain on a terminal.
    #[arg(long, env = "KCP_KEEPER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,

    /// Address of the admin server (`/livez`, `/readyz`, `/metrics`).
    #[arg(long, env = "KCP_KEEPER_ADMIN_ADDR", default_value = "0.0.0.0:9090")]
    pub admin_addr: SocketAddr,

    #[command(flatten)]
    pub kube: KubeArgs,

    #[command(flatten)]
    pub lease: LeaseArgs,
}

#[derive(clap::Args, Debug, Clone)]
pub struct KubeArgs {
    /// Kubeconfig file; without it, the in-cluster service account (or `KUBECONFIG`) is used.
    #[arg(long, env = "KCP_KEEPER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(clap::Args, Debug, Clone)]
pub struct LeaseArgs {
    /// Elect a leader among replicas; only the leader writes. Disable only for a single replica.
    #[arg(
        long = "leader-election",
        env = "KCP_KEEPER_LEADER_ELECTION",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub enabled: bool,

    /// Namespace of the Lease (defaults to the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,

    /// Name of the Lease (defaults to `kcp-keeper-<agent>`).
    #[arg(long, env = "KCP_KEEPER_LEASE_NAME")]
    pub lease_name: Option<String>,

    /// This replica's identity in the Lease (defaults to the pod name, else the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// How long a Lease is valid without renewal.
    #[arg(long, env = "KCP_KEEPER_LEASE_DURATION", default_value = "15s", value_parser = crate::duration::parse_go_duration)]
    pub lease_duration: Duration,

    /// A leader that has not renewed for this long stops writing; must be shorter than the lease duration.
    #[arg(long, env = "KCP_KEEPER_LEASE_RENEW_DEADLINE", default_value = "10s", value_parser = crate::duration::parse_go_duration)]
    pub renew_deadline: Duration,
}

/// `<agent> rbac`: the same flags for every agent.
#[derive(clap::Args, Debug, Clone)]
pub struct RbacArgs {
    /// The agent's configuration: the Roles name what it names (not needed by an agent whose grants do not
    /// depend on it).
    #[arg(long, env = "KCP_KEEPER_CONFIG")]
    pub config: Option<PathBuf>,
    /// The agent's namespace: its ServiceAccount and Lease live there.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kcp-keeper")]
    pub namespace: String,
    /// The agent's ServiceAccount (defaults to the agent's name).
    #[arg(long)]
    pub service_account: Option<String>,
    /// The agent's Lease (defaults to `kcp-keeper-<agent>`).
    #[arg(long, env = "KCP_KEEPER_LEASE_NAME")]
    pub lease_name: Option<String>,
}

impl RbacArgs {
    /// Who the Roles are for, with the agent's defaults filled in.
    pub fn subjects(&self, agent: &str) -> crate::rbac::Subjects {
        let defaults = crate::rbac::Subjects::defaults(&self.namespace, agent);
        crate::rbac::Subjects {
            service_account: self.service_account.clone().unwrap_or(defaults.service_account),
            lease_name: self.lease_name.clone().unwrap_or(defaults.lease_name),
            namespace: defaults.namespace,
        }
    }
}

impl KubeArgs {
    /// A client from `--kubeconfig`, else the usual inference (in-cluster, then `KUBECONFIG`).
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
            }
            None => kube::Config::infer().await?,
        };
        Ok(kube::Client::try_from(config)?)
    }
}

impl LeaseArgs {
    /// `--lease-name`, else [`crate::lease::default_name`].
    pub fn lease_name(&self, agent: &str) -> String {
        self.lease_name.clone().unwrap_or_else(|| crate::lease::default_name(agent))
    }

    pub fn identity(&self) -> String {
        self.identity.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| format!("pid-{}", std::process::id()))
        })
    }
}

/// Boolean environment variables. Every one of the agents and of the `kcp-keeper` CLI is read with clap's
/// `BoolishValueParser` (`value_parser = clap::builder::BoolishValueParser::new()` beside `env = ...`): `1`, `true`,
/// `yes`, `on`, `y`, `t` set it and `0`, `false`, `no`, `off`, `n`, `f` clear it, in any case; anything else is
/// refused. (clap's default for a `bool` takes only `true` and `false`.) [`check`] is the test each crate runs on
/// its command line.
pub mod boolean_env {
    use clap::builder::ValueParser;
    use clap::{Arg, ArgAction, Command};

    /// The documented forms, each with its value.
    pub const FORMS: [(&str, bool); 9] = [
        ("1", true),
        ("0", false),
        ("true", true),
        ("false", false),
        ("yes", true),
        ("no", false),
        ("on", true),
        ("off", false),
        ("TRUE", true),
    ];

    /// The arguments of `cmd` and of its subcommands that are read from an environment variable and hold a
    /// `bool`.
    pub fn args(cmd: &Command) -> Vec<Arg> {
        fn walk(cmd: &Command, out: &mut Vec<Arg>) {
            let boolean = ValueParser::bool().type_id();
            out.extend(
                cmd.get_arguments()
                    .filter(|arg| arg.get_env().is_some() && arg.get_value_parser().type_id() == boolean)
                    .cloned(),
            );
            cmd.get_subcommands().for_each(|sub| walk(sub, out));
        }
        let mut cmd = cmd.clone();
        // Building fills in what the derive leaves to clap (a flag's `bool` parser among them).
        cmd.build();
        let mut out = Vec::new();
        walk(&cmd, &mut out);
        out
    }

    /// The value `arg`'s own value parser (the one clap applies to its variable's value) gives `text`, if it
    /// takes it.
    fn parse(arg: &Arg, text: &str) -> Option<bool> {
        let probe = Arg::new("value").long("value").action(ArgAction::Set).value_parser(arg.get_value_parser().clone());
        let matches = Command::new("probe").arg(probe).try_get_matches_from(["probe", "--value", text]).ok()?;
        matches.try_get_one::<bool>("value").ok().flatten().copied()
    }

    /// Checks that every boolean environment variable of `cmd` gives each of [`FORMS`] its value and refuses a
    /// word that is none of them; returns the variables checked, or what failed.
    pub fn check(cmd: &Command) -> Result<Vec<String>, String> {
        let mut checked = Vec::new();
        let mut problems = Vec::new();
        for arg in args(cmd) {
            let variable = arg.get_env().map(|v| v.to_string_lossy().into_owned()).unwrap_or_default();
            for (form, value) in FORMS {
                let got = parse(&arg, form);
                if got != Some(value) {
                    problems.push(format!("{variable}={form} gives {got:?}, not {value}"));
                }
            }
            if let Some(got) = parse(&arg, "maybe") {
                problems.push(format!("{variable}=maybe is taken as {got}"));
            }
            checked.push(variable);
        }
        match problems.is_empty() {
            true => Ok(checked),
            false => Err(problems.join("; ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Parser)]
    #[command(version = crate::VERSION)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand)]
    enum Command {
        Run(RunArgs),
    }

    #[test]
    fn shared_arguments_pass_clap_debug_assert() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let Command::Run(args) = Cli::parse_from(["agent", "run", "--config", "/etc/agent.yaml"]).command;
        assert_eq!(args.runtime.admin_addr.port(), 9090);
        assert!(args.runtime.lease.enabled);
        assert_eq!(args.runtime.lease.lease_duration, Duration::from_secs(15));
        assert!(args.runtime.lease.renew_deadline < args.runtime.lease.lease_duration);
    }
    #[test]
    fn the_shared_boolean_variable_takes_every_documented_form() {
        let checked = boolean_env::check(&Cli::command()).unwrap();
        assert_eq!(checked, ["KCP_KEEPER_LEADER_ELECTION"]);
    }

    /// A flag as the agents declare one, beside the shared arguments.
    #[derive(Parser)]
    struct Probe {
        #[command(flatten)]
        lease: LeaseArgs,
        #[arg(long, env = "KCP_KEEPER_TEST_BOOLEAN_FLAG", value_parser = clap::builder::BoolishValueParser::new())]
        flag: bool,
    }

    #[test]
    fn a_boolean_without_the_shared_parser_is_found_and_fails_the_check() {
        #[derive(Parser)]
        struct Strict {
            #[arg(long, env = "STRICT_FLAG")]
            flag: bool,
        }
        let err = boolean_env::check(&Strict::command()).unwrap_err();
        assert!(err.contains("STRICT_FLAG=1 gives None"), "{err}");
        assert_eq!(boolean_env::check(&Probe::command()).unwrap().len(), 2);
    }

    #[test]
    fn each_form_set_in_the_environment_reaches_the_parsed_arguments() {
        // clap reads a variable when it builds the command, so each form is set in a child: this test binary
        // again, running only this test, which then parses and prints what it got.
        const EXPECT: &str = "KCP_KEEPER_TEST_BOOLEAN_EXPECT";
        if let Ok(expected) = std::env::var(EXPECT) {
            let probe = Probe::try_parse_from(["probe"]).unwrap();
            println!("parsed leader-election={} flag={} expected={expected}", probe.lease.enabled, probe.flag);
            return;
        }
        let name = format!("{}::each_form_set_in_the_environment_reaches_the_parsed_arguments", module_path!());
        let name = name.split_once("::").map_or(name.as_str(), |(_, rest)| rest).to_string();
        for (form, value) in boolean_env::FORMS {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", &name, "--nocapture", "--test-threads=1"])
                .env(EXPECT, value.to_string())
                .env("KCP_KEEPER_LEADER_ELECTION", form)
                .env("KCP_KEEPER_TEST_BOOLEAN_FLAG", form)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{form}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
            let want = format!("parsed leader-election={value} flag={value} expected={value}");
            assert!(stdout.contains(&want), "{form}: expected {want:?} in {stdout}");
        }
    }
}
