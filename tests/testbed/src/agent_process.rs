//! Runs one of our agent binaries as a real process against the test bed, the way the chart runs it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;

use crate::ControlPlane;
use crate::process::{Process, free_port, wait_until};

/// One agent under test, as the chart runs it: `<binary> run --config <config>` with a free admin port, JSON
/// logs, its Lease in a namespace under an identity, authenticated as the admin or as a ServiceAccount. Every
/// agent's tests start their agents through this one builder:
///
/// ```ignore
/// let agent = AgentUnderTest::new(&bed, BINARY, &config).namespace(&ns).identity("replica-a").start().await?;
/// ```
pub struct AgentUnderTest<'a> {
    bed: &'a ControlPlane,
    binary: PathBuf,
    config: PathBuf,
    namespace: String,
    identity: String,
    kubeconfig: Option<PathBuf>,
    env: Vec<(String, String)>,
    args: Vec<String>,
    ready_within: Duration,
}

impl<'a> AgentUnderTest<'a> {
    /// `binary run --config config`, as the admin, Lease in `default` under identity `replica-a`.
    pub fn new(bed: &'a ControlPlane, binary: impl AsRef<Path>, config: impl AsRef<Path>) -> Self {
        Self {
            bed,
            binary: binary.as_ref().into(),
            config: config.as_ref().into(),
            namespace: "default".into(),
            identity: "replica-a".into(),
            kubeconfig: None,
            env: Vec::new(),
            args: Vec::new(),
            ready_within: Duration::from_secs(30),
        }
    }

    /// The namespace of its Lease (`POD_NAMESPACE`).
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Its identity in the Lease (`POD_NAME`); also names its log file.
    pub fn identity(mut self, identity: &str) -> Self {
        self.identity = identity.into();
        self
    }

    /// Authenticates with `kubeconfig` (e.g. a ServiceAccount token's) instead of the admin's.
    pub fn kubeconfig(mut self, kubeconfig: impl AsRef<Path>) -> Self {
        self.kubeconfig = Some(kubeconfig.as_ref().into());
        self
    }

    /// Adds or overrides one environment variable.
    pub fn env(mut self, name: &str, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Adds or overrides environment variables.
    pub fn envs(mut self, vars: &[(&str, &str)]) -> Self {
        self.env.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self
    }

    /// Adds arguments after `run --config <config>`.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// How long [`AgentUnderTest::start`] waits for `/readyz` (30 s unless set).
    pub fn ready_within(mut self, timeout: Duration) -> Self {
        self.ready_within = timeout;
        self
    }

    /// Starts the process without waiting for it to be ready.
    pub fn spawn(self) -> Result<AgentProcess> {
        let port = free_port()?;
        let admin_addr = format!("127.0.0.1:{port}");
        let kubeconfig =
            self.kubeconfig.as_deref().unwrap_or(&self.bed.apiserver.admin_kubeconfig).display().to_string();
        let mut env: Vec<(&str, &str)> = vec![
            ("KCP_KEEPER_KUBECONFIG", &kubeconfig),
            ("KCP_KEEPER_ADMIN_ADDR", &admin_addr),
            ("KCP_KEEPER_LOG_FORMAT", "json"),
            ("KCP_KEEPER_LOG_LEVEL", "info"),
            ("POD_NAMESPACE", &self.namespace),
            ("POD_NAME", &self.identity),
        ];
        env.extend(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let mut args = vec!["run".to_string(), "--config".into(), self.config.display().to_string()];
        args.extend(self.args);
        let log: PathBuf = self.bed.dir().join(format!("{}-{:08x}.log", self.identity, rand::random::<u32>()));
        let process = Process::start_with_env(&self.identity, &self.binary, args, &env, log)?;
        Ok(AgentProcess { process, admin_url: format!("http://{admin_addr}") })
    }

    /// Starts the process and waits until `/readyz` answers 200.
    pub async fn start(self) -> Result<AgentProcess> {
        let ready_within = self.ready_within;
        let mut agent = self.spawn()?;
        agent.wait_ready(ready_within).await?;
        Ok(agent)
    }
}

/// A running agent under test: its process (log, signals) and its admin server.
pub struct AgentProcess {
    pub process: Process,
    pub admin_url: String,
}

impl AgentProcess {
    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let url = format!("{}/readyz", self.admin_url);
        wait_until(&mut self.process, timeout, "ready", || {
            let url = url.clone();
            async move { crate::http::get_ok(&url).await }
        })
        .await
    }

    /// The agent's `/metrics` text (empty when it does not answer).
    pub async fn metrics(&self) -> String {
        crate::metrics::scrape(&self.admin_url).await
    }

    /// The value of the one series starting with `series` (name and labels) in the agent's metrics now.
    pub async fn metric(&self, series: &str) -> Result<f64> {
        crate::metrics::value(&self.metrics().await, series)
    }

    /// Waits until the series `series` satisfies `check`, and returns its value; a missing series never
    /// satisfies it.
    pub async fn wait_for_metric(&self, series: &str, timeout: Duration, check: impl Fn(f64) -> bool) -> f64 {
        crate::eventually(timeout, &format!("{series} to reach the expected value"), || async {
            self.metric(series).await.ok().filter(|v| check(*v))
        })
        .await
    }

    /// Sends SIGTERM and waits for the exit status (None if it did not exit within `timeout`).
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.process.signal_and_wait(nix::sys::signal::Signal::SIGTERM, timeout)
    }
}

// The checks below fail by panicking, not by returning an error: a panic is what makes every peer print its
// log (and the test bed keep its files) on the way out, see `Process`'s Drop.

/// What a fresh test bed needs before an agent can do its job there (e.g. a ConfigMap the agent edits but may not
/// create), run as the admin before the agent starts.
pub type Prepare = fn(kube::Client) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>>;

fn nothing_to_prepare(_: kube::Client) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>> {
    Box::pin(async { Ok(()) })
}

/// A fresh test bed and namespace with one ready replica, "replica-a", of `binary` holding its Lease there.
async fn ready_replica(
    binary: &Path,
    config: &Path,
    env: &[(&str, &str)],
    prepare: Prepare,
) -> Result<(ControlPlane, String, AgentProcess)> {
    let bed = ControlPlane::start().await?;
    prepare(bed.client()).await?;
    let ns = bed.namespace().await?;
    let agent = AgentUnderTest::new(&bed, binary, config).namespace(&ns).envs(env).start().await?;
    Ok((bed, ns, agent))
}

/// The lifecycle every agent binary must have, checked against a real apiserver: `run` with `config` becomes
/// ready, holds Lease `lease_name`, logs no secret material, and on SIGTERM exits 0 within seconds and
/// releases the Lease.
pub async fn check_lifecycle(binary: &Path, config: &Path, lease_name: &str) -> Result<()> {
    check_lifecycle_prepared(binary, config, lease_name, nothing_to_prepare).await
}

/// [`check_lifecycle`] on a bed `prepare`d first.
pub async fn check_lifecycle_prepared(binary: &Path, config: &Path, lease_name: &str, prepare: Prepare) -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    let (bed, ns, mut agent) = ready_replica(binary, config, &[], prepare).await?;
    let leases = kube::Api::<Lease>::namespaced(bed.client(), &ns);
    let holder = |lease: Lease| lease.spec.and_then(|s| s.holder_identity);
    assert!(holder(leases.get(lease_name).await?).as_deref() == Some("replica-a"), "the replica holds the Lease");
    let status = agent.terminate(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "exit status after SIGTERM: {status:?}\n{}", agent.process.log_tail());
    assert!(holder(leases.get(lease_name).await?).is_none(), "the Lease is released on the way out");
    crate::assert_no_secret_material(&agent.process.log(), &[]);
    Ok(())
}

/// Shutdown's second signal: while the first SIGTERM's drain is stuck (the apiserver is frozen, so releasing the
/// Lease hangs until its deadline), a second SIGTERM exits at once with 143.
pub async fn check_second_signal_exits_at_once(binary: &Path, config: &Path) -> Result<()> {
    check_second_signal_exits_at_once_prepared(binary, config, nothing_to_prepare).await
}

/// [`check_second_signal_exits_at_once`] on a bed `prepare`d first.
pub async fn check_second_signal_exits_at_once_prepared(binary: &Path, config: &Path, prepare: Prepare) -> Result<()> {
    use nix::sys::signal::Signal;
    let (bed, _ns, mut agent) = ready_replica(binary, config, &[], prepare).await?;
    bed.apiserver.process.signal(Signal::SIGSTOP)?;
    let first = agent.process.signal_and_wait(Signal::SIGTERM, Duration::from_millis(1500));
    assert!(first.is_none(), "the drain should still be waiting on the frozen apiserver, got {first:?}");
    let second = agent.process.signal_and_wait(Signal::SIGTERM, Duration::from_secs(2));
    bed.apiserver.process.signal(Signal::SIGCONT)?;
    assert!(second.and_then(|s| s.code()) == Some(143), "second signal: {second:?}");
    Ok(())
}

/// A leader that cannot renew its Lease (the apiserver is frozen) stops and exits non-zero, so it re-joins the
/// election as a fresh process instead of writing on without the lease.
pub async fn check_lost_lease_exits(binary: &Path, config: &Path) -> Result<()> {
    check_lost_lease_exits_prepared(binary, config, nothing_to_prepare).await
}

/// [`check_lost_lease_exits`] on a bed `prepare`d first.
pub async fn check_lost_lease_exits_prepared(binary: &Path, config: &Path, prepare: Prepare) -> Result<()> {
    use nix::sys::signal::Signal;
    let short = [("KCP_KEEPER_LEASE_DURATION", "8s"), ("KCP_KEEPER_LEASE_RENEW_DEADLINE", "3s")];
    let (bed, _ns, mut agent) = ready_replica(binary, config, &short, prepare).await?;
    bed.apiserver.process.signal(Signal::SIGSTOP)?;
    // It stops leading within the renew deadline (3s), before the lease could end for others (8s); the exit
    // follows after the drain, whose release attempt is bounded by the renew deadline again.
    let status = agent.process.wait_exit(Duration::from_secs(12));
    bed.apiserver.process.signal(Signal::SIGCONT)?;
    assert!(status.and_then(|s| s.code()) == Some(1), "exit after losing the lease: {status:?}");
    assert!(agent.process.log().contains("lost the lease"), "the log says why");
    Ok(())
}

/// The Events (events.k8s.io) about object `name` in `namespace`, as `(reason, note)`, in the apiserver's order.
pub async fn events_about(client: &kube::Client, namespace: &str, name: &str) -> Vec<(String, String)> {
    use k8s_openapi::api::events::v1::Event;
    let list = kube::Api::<Event>::namespaced(client.clone(), namespace).list(&Default::default()).await;
    list.map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// Runs `binary` with `args` to completion: exit code and stderr.
pub fn run_to_completion(binary: &Path, args: &[&str]) -> Result<(Option<i32>, String, String)> {
    let out = std::process::Command::new(binary).args(args).output()?;
    Ok((
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}
