//! What the agent names in Kubernetes: its own Lease, and nothing else. Snapshots go to etcd and S3, drills to
//! S3 and to processes on loopback, never through the apiserver; the Lease holds the leader election and each
//! schedule's tick record, and the Events (the snapshots themselves are not Kubernetes objects) are about it.
//! [`rbac`] grants exactly this, from the same [`Lease`].

pub mod rbac;

use k8s_openapi::api::core::v1::ObjectReference;
use kcp_keeper_runtime::agent::Context;
use kcp_keeper_runtime::args::RunArgs;
use kcp_keeper_runtime::rbac::Subjects;

use crate::config::Config;

/// The agent's Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub namespace: String,
    pub name: String,
}

impl Lease {
    /// The Lease `rbac` grants: in the agent's namespace, by the name the runtime elects on.
    pub fn of(who: &Subjects) -> Self {
        Self { namespace: who.namespace.clone(), name: who.lease_name.clone() }
    }

    /// The Lease the daemon runs on, `agent` being its name (the Lease's default is `kcp-keeper-<agent>`).
    pub fn of_daemon(ctx: &Context<Config>, agent: &str) -> Self {
        if let Some(record) = &ctx.lease_record
            && let Some(namespace) = record.api.namespace()
        {
            return Self { namespace: namespace.into(), name: record.lease_name.clone() };
        }
        // Leader election is off: the runtime hands the daemon no Lease, yet the Events are about the one the
        // flags name, as before. Until the runtime's Context carries the Lease's namespace and name, read them
        // as `run` parsed them, from this process's own command line.
        Self::from_command_line(std::env::args_os(), agent)
    }

    /// The Lease `run`'s arguments name (this agent's `run` has no flags of its own, so the runtime's `RunArgs`
    /// are all of them); the runtime's defaults when they do not parse (not from `run`, which parsed them).
    fn from_command_line(args: impl IntoIterator<Item = std::ffi::OsString>, agent: &str) -> Self {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            run: Run,
        }
        #[derive(clap::Subcommand)]
        enum Run {
            Run(RunArgs),
        }
        use clap::Parser as _;
        match Cli::try_parse_from(args) {
            Ok(Cli { run: Run::Run(args) }) => {
                let lease = &args.runtime.lease;
                Self { namespace: lease.lease_namespace.clone(), name: lease.lease_name(agent) }
            }
            Err(_) => Self { namespace: "default".into(), name: kcp_keeper_runtime::lease::default_name(agent) },
        }
    }

    /// The Events' `regarding`.
    pub fn regarding(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_about_the_lease_rbac_grants() {
        let who = Subjects {
            namespace: "kcp-keeper".into(),
            service_account: "etcd-snapshotter".into(),
            lease_name: "kcp-keeper-etcd-snapshotter".into(),
        };
        let regarding = Lease::of(&who).regarding();
        assert_eq!(regarding.kind.as_deref(), Some("Lease"));
        assert_eq!(regarding.namespace.as_deref(), Some("kcp-keeper"));
        assert_eq!(regarding.name.as_deref(), Some("kcp-keeper-etcd-snapshotter"));
    }

    #[test]
    fn without_leader_election_the_lease_is_the_one_runs_flags_name() {
        let run = |extra: &[&str]| {
            let args = ["etcd-snapshotter", "run", "--config", "/c.yaml", "--leader-election", "false"];
            Lease::from_command_line(args.iter().chain(extra).map(Into::into), "etcd-snapshotter")
        };
        let named = run(&["--lease-namespace", "backups", "--lease-name", "snapshots"]);
        assert_eq!(named, Lease { namespace: "backups".into(), name: "snapshots".into() });
        // POD_NAMESPACE or KCP_KEEPER_LEASE_NAME in the test's environment would change the defaults.
        if std::env::var_os("POD_NAMESPACE").is_none() && std::env::var_os("KCP_KEEPER_LEASE_NAME").is_none() {
            assert_eq!(run(&[]), Lease { namespace: "default".into(), name: "kcp-keeper-etcd-snapshotter".into() });
        }
    }
}
