//! `kcp-keeper doctor [--output text|json] ...`: every flag also from an environment variable.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::options::{CaSource, HubOidc, KeyRef, ObjectRef, Options};
use crate::rules::expiry::Margins;
use crate::verdict::Level;

#[derive(Parser, Debug)]
#[command(name = "kcp-keeper", version = kcp_keeper_runtime::VERSION, about = "kcp-keeper's operator tools")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Check the kcp installation: one line per check (ok, warn, FAIL), exit 1 on any FAIL.
    Doctor(Doctor),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Parser, Debug)]
pub struct Doctor {
    /// A kubeconfig file; default: in-cluster, then $KUBECONFIG / ~/.kube/config.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    #[arg(long, env = "KCP_KEEPER_DOCTOR_OUTPUT", value_enum, default_value = "text")]
    pub output: Output,
    /// The namespace of the RootShard, Shards and FrontProxy.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_NAMESPACE", default_value = "kcp-system")]
    pub namespace: String,
    /// The hub's OIDC settings: configmap:NAMESPACE/NAME[:KEY] (key default oidc.yaml) or file:PATH.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_HUB_OIDC")]
    pub hub_oidc: Option<HubOidc>,
    /// The hub's kubeconfig: NAMESPACE/SECRET[:KEY] (key default kubeconfig).
    #[arg(long, env = "KCP_KEEPER_DOCTOR_HUB_KUBECONFIG", value_parser = |s: &str| KeyRef::parse(s, "kubeconfig"))]
    pub hub_kubeconfig: Option<KeyRef>,
    /// A managed CA: configmap:NAMESPACE/NAME[:KEY], or a Secret, [secret:]NAMESPACE/NAME[:KEY] (key default
    /// ca.crt); repeat for each.
    #[arg(long = "ca", env = "KCP_KEEPER_DOCTOR_CAS", value_delimiter = ',', value_parser = |s: &str| CaSource::parse(s, "ca.crt"))]
    pub cas: Vec<CaSource>,
    /// etcd-snapshotter's metrics endpoint, http://HOST:PORT/metrics; repeat for each. The host is read at
    /// every address it resolves to: name a headless Service to read every replica.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_SNAPSHOTTER_METRICS", value_delimiter = ',')]
    pub snapshotter_metrics: Vec<String>,
    /// dns-rewriter's metrics endpoint, likewise: the leading replica's verification of the DNS rules.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_REWRITER_METRICS", value_delimiter = ',')]
    pub rewriter_metrics: Vec<String>,
    /// kubeconfig-rotator's metrics endpoint, likewise: the expiry of the credential each target holds (the
    /// kubeconfig expiry check without reading a kubeconfig).
    #[arg(long, env = "KCP_KEEPER_DOCTOR_ROTATOR_METRICS", value_delimiter = ',')]
    pub rotator_metrics: Vec<String>,
    /// ca-syncer's metrics endpoint, likewise: the expiry of every certificate of each bundle (the CA expiry
    /// check without reading a CA's Secret).
    #[arg(long, env = "KCP_KEEPER_DOCTOR_CA_SYNCER_METRICS", value_delimiter = ',')]
    pub ca_syncer_metrics: Vec<String>,
    /// The kcp-operator's Deployment, NAMESPACE/NAME: its image version must pair with kcp's.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_OPERATOR_DEPLOYMENT")]
    pub operator_deployment: Option<ObjectRef>,
    /// The infrastructure provider's Deployment, NAMESPACE/NAME: its image must be pinned and pair with kcp.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_PROVIDER_DEPLOYMENT")]
    pub provider_deployment: Option<ObjectRef>,
    /// A kcp kubeconfig: NAMESPACE/SECRET[:KEY] (key default kubeconfig). The APIExportEndpointSlices of its
    /// server's workspace are checked; only its server, CA and credential are used.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_KCP_KUBECONFIG", value_parser = |s: &str| KeyRef::parse(s, "kubeconfig"))]
    pub kcp_kubeconfig: Option<KeyRef>,
    /// The CA bundle the endpoint slices' URLs must verify with: configmap:NAMESPACE/NAME[:KEY] or
    /// [secret:]NAMESPACE/NAME[:KEY] (key default ca.crt); default: the kcp kubeconfig's CA.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_ENDPOINT_CA", value_parser = |s: &str| CaSource::parse(s, "ca.crt"))]
    pub endpoint_ca: Option<CaSource>,
    /// The CA the Verify requests verify kcp's serving certificates with: configmap:NAMESPACE/NAME[:KEY] (e.g. a
    /// ca-syncer target) or [secret:]NAMESPACE/NAME[:KEY] (key default ca.crt); default: the tls.crt of the
    /// RootShard's <name>-server-ca Secret, which --no-secrets does not read.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_SERVER_CA", value_parser = |s: &str| CaSource::parse(s, "ca.crt"))]
    pub server_ca: Option<CaSource>,
    /// Read no Secret (the in-cluster doctor): a flag naming one is refused, and a check that needs one is
    /// reported "not checked" with the reason.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_NO_SECRETS", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_secrets: bool,
    /// Skip the Verify section (its requests need the cluster's network: run the doctor in a pod for them).
    #[arg(long, env = "KCP_KEEPER_DOCTOR_NO_VERIFY", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_verify: bool,
    /// The cluster DNS, IP:PORT; default kube-system/kube-dns's ClusterIP:53.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_CLUSTER_DNS")]
    pub cluster_dns: Option<SocketAddr>,
    /// node-local-dns's address, asked as well; repeat for each.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_NODE_LOCAL_DNS", value_delimiter = ',')]
    pub node_local_dns: Vec<IpAddr>,
    /// Send the Verify requests to each Service's ready endpoints instead of its ClusterIP (where ClusterIPs
    /// are not routed).
    #[arg(long, env = "KCP_KEEPER_DOCTOR_VIA_ENDPOINTS", value_parser = clap::builder::BoolishValueParser::new())]
    pub via_endpoints: bool,
    /// A namespace whose NetworkPolicies labelled app.kubernetes.io/part-of=kcp-keeper are read: warn on an
    /// egress rule that reaches any address (no `to`, 0.0.0.0/0, ::/0) on 443 or 6443.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_NETWORK_POLICIES")]
    pub network_policies: Option<String>,
    /// The namespace of the kcp-keeper release: its pods are checked for containers that cannot pull their image,
    /// cannot start or keep exiting (agent-pods).
    #[arg(long, env = "KCP_KEEPER_DOCTOR_RELEASE_NAMESPACE")]
    pub release_namespace: Option<String>,
    /// The kcp-keeper release's name (its pods' app.kubernetes.io/instance label).
    #[arg(long, env = "KCP_KEEPER_DOCTOR_RELEASE", default_value = crate::rules::agent_pods::DEFAULT_RELEASE)]
    pub release: String,
    /// Warn when a certificate has less than this many days left.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_WARN_DAYS", default_value_t = 30)]
    pub warn_days: u32,
    /// FAIL when a certificate has less than this many days left.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_FAIL_DAYS", default_value_t = 7)]
    pub fail_days: u32,
    /// The periodic in-cluster mode: run every --interval and serve /livez, /readyz and /metrics
    /// (kcp_keeper_doctor_check{check,result}) on this address, until SIGTERM.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_SERVE")]
    pub serve: Option<SocketAddr>,
    /// Seconds between runs in the periodic mode.
    #[arg(long, env = "KCP_KEEPER_DOCTOR_INTERVAL", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub interval: u64,
}

impl Doctor {
    pub fn options(&self) -> Options {
        Options {
            namespace: self.namespace.clone(),
            hub_oidc: self.hub_oidc.clone(),
            hub_kubeconfig: self.hub_kubeconfig.clone(),
            cas: self.cas.clone(),
            snapshotter_metrics: self.snapshotter_metrics.clone(),
            rewriter_metrics: self.rewriter_metrics.clone(),
            rotator_metrics: self.rotator_metrics.clone(),
            ca_syncer_metrics: self.ca_syncer_metrics.clone(),
            operator_deployment: self.operator_deployment.clone(),
            provider_deployment: self.provider_deployment.clone(),
            kcp_kubeconfig: self.kcp_kubeconfig.clone(),
            endpoint_ca: self.endpoint_ca.clone(),
            server_ca: self.server_ca.clone(),
            no_secrets: self.no_secrets,
            verify: !self.no_verify,
            cluster_dns: self.cluster_dns,
            node_local_dns: self.node_local_dns.clone(),
            via_endpoints: self.via_endpoints,
            network_policies: self.network_policies.clone(),
            release_namespace: self.release_namespace.clone(),
            release: self.release.clone(),
            margins: Margins {
                warn_secs: i64::from(self.warn_days) * 86400,
                fail_secs: i64::from(self.fail_days) * 86400,
            },
        }
    }
}

async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let k = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(k, &kube::config::KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let Command::Doctor(doctor) = cli.command;
    if let Err(e) = doctor.options().check_no_secrets() {
        eprintln!("kcp-keeper doctor: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => return kcp_keeper_runtime::exit_code(Err(e.into())),
    };
    runtime.block_on(async {
        let client = match client(doctor.kubeconfig.as_deref()).await {
            Ok(c) => c,
            Err(e) => return kcp_keeper_runtime::exit_code(Err(e)),
        };
        if let Some(addr) = doctor.serve {
            return kcp_keeper_runtime::exit_code(periodic(&client, &doctor, addr).await);
        }
        let report = crate::run(&client, &doctor.options()).await;
        match doctor.output {
            Output::Text => print!("{}", report.text()),
            Output::Json => println!("{}", report.json()),
        }
        if report.worst() == Level::Fail { ExitCode::FAILURE } else { ExitCode::SUCCESS }
    })
}

/// Runs the checks every `--interval`, exporting each run's results, until the first SIGTERM or SIGINT.
async fn periodic(client: &kube::Client, doctor: &Doctor, addr: SocketAddr) -> anyhow::Result<()> {
    use std::sync::Arc;
    let shutdown = kcp_keeper_runtime::shutdown::on_signals()?;
    let mut registry = kcp_keeper_runtime::metrics::registry("kcp_keeper_doctor");
    let metrics = crate::metrics::Metrics::register(registry.sub_registry_with_prefix("kcp_keeper_doctor"));
    let health = Arc::new(kcp_keeper_runtime::admin::Health::default());
    let server = kcp_keeper_runtime::admin::serve(addr, health.clone(), Arc::new(registry)).await?;
    eprintln!("kcp-keeper doctor: serving /metrics on {}", server.addr);
    let options = doctor.options();
    loop {
        let report = crate::run(client, &options).await;
        metrics.record(&report, kcp_keeper_runtime::metrics::unix_now());
        health.mark_synced();
        match doctor.output {
            Output::Text => print!("{}", report.text()),
            Output::Json => println!("{}", serde_json::to_string(&report).unwrap_or_default()),
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(std::time::Duration::from_secs(doctor.interval)) => {}
        }
    }
    health.start_draining();
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn every_boolean_environment_variable_takes_1_0_true_false_yes_no() {
        let checked = kcp_keeper_runtime::args::boolean_env::check(&super::Cli::command()).unwrap();
        assert_eq!(
            checked,
            ["KCP_KEEPER_DOCTOR_NO_SECRETS", "KCP_KEEPER_DOCTOR_NO_VERIFY", "KCP_KEEPER_DOCTOR_VIA_ENDPOINTS"]
        );
    }
}
