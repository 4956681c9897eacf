//! Runs one of our agent binaries as a real process against the test bed, the way the chart runs it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;

use crate::ControlPlane;
use crate::process::{Process, free_port, wait_until};

pub struct AgentProcess {
    pub process: Process,
    pub admin_url: String,
}

impl AgentProcess {
    /// Starts `binary run --config <config>` with the admin kubeconfig, a free admin port, JSON logs and its
    /// Lease in `namespace` under `identity`. `extra_env` adds or overrides environment variables.
    pub fn start(
        bed: &ControlPlane,
        binary: &Path,
        config: &Path,
        namespace: &str,
        identity: &str,
        extra_env: &[(&str, &str)],
    ) -> Result<Self> {
        Self::start_as(bed, &bed.apiserver.admin_kubeconfig, binary, config, namespace, identity, extra_env)
    }

    /// Like [`AgentProcess::start`], authenticating with `kubeconfig` (a ServiceAccount token's) instead of the
    /// admin's.
    pub fn start_as(
        bed: &ControlPlane,
        kubeconfig: &Path,
        binary: &Path,
        config: &Path,
        namespace: &str,
        identity: &str,
        extra_env: &[(&str, &str)],
    ) -> Result<Self> {
        let port = free_port()?;
        let admin_addr = format!("127.0.0.1:{port}");
        let kubeconfig = kubeconfig.display().to_string();
        let mut env: Vec<(&str, &str)> = vec![
            ("KCP_KEEPER_KUBECONFIG", &kubeconfig),
            ("KCP_KEEPER_ADMIN_ADDR", &admin_addr),
            ("KCP_KEEPER_LOG_FORMAT", "json"),
            ("KCP_KEEPER_LOG_LEVEL", "info"),
            ("POD_NAMESPACE", namespace),
            ("POD_NAME", identity),
        ];
        env.extend_from_slice(extra_env);
        let args = vec!["run".to_string(), "--config".into(), config.display().to_string()];
        let log: PathBuf = bed.dir().join(format!("{identity}-{:08x}.log", rand::random::<u32>()));
        let process = Process::start_with_env(identity, binary, args, &env, log)?;
        Ok(Self { process, admin_url: format!("http://{admin_addr}") })
    }

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
    let mut agent = AgentProcess::start(&bed, binary, config, &ns, "replica-a", env)?;
    agent.wait_ready(Duration::from_secs(30)).await?;
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

/// Runs `binary` with `args` to completion: exit code and stderr.
pub fn run_to_completion(binary: &Path, args: &[&str]) -> Result<(Option<i32>, String, String)> {
    let out = std::process::Command::new(binary).args(args).output()?;
    Ok((
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}
