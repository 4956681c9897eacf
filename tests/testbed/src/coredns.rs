//! A real CoreDNS whose `kubernetes` plugin watches the test bed's apiserver.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use hickory_resolver::TokioResolver;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RData;

use crate::process::{Process, free_port, wait_until};

/// kubeadm's default Corefile, verbatim: what a Corefile-mode edit must leave byte for byte outside its block.
/// A text fixture, not started here (its `forward` and port are the cluster's).
pub const KUBEADM_DEFAULT_COREFILE: &str = ".:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success cluster.local
       disable denial cluster.local
    }
    loop
    reload
    loadbalance
}
";

/// A kubeadm-shaped Corefile. Placeholders filled by [`CoreDns::start`]: `{{port}}` (DNS port),
/// `{{ready_port}}`, `{{kubeconfig}}` (the apiserver credentials) and `{{dir}}` (the CoreDNS config dir, where
/// tests project ConfigMaps, e.g. `{{dir}}/custom` for k3s's `coredns-custom`).
pub const KUBEADM_COREFILE: &str = r#".:{{port}} {
    errors
    ready 127.0.0.1:{{ready_port}}
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig {{kubeconfig}} testbed
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    reload 2s 1s
}
"#;

/// A k3s-shaped Corefile: the server block imports `*.override` files from the projected `coredns-custom`.
pub const K3S_COREFILE: &str = r#".:{{port}} {
    errors
    ready 127.0.0.1:{{ready_port}}
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig {{kubeconfig}} testbed
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    import {{dir}}/custom/*.override
    reload 2s 1s
}
"#;

pub struct CoreDns {
    pub port: u16,
    pub ready_port: u16,
    /// The directory holding the Corefile; projected ConfigMaps go below it.
    pub dir: PathBuf,
    pub process: Process,
}

impl CoreDns {
    /// Writes `corefile` (placeholders filled) to `dir/Corefile` and starts CoreDNS on it, waiting until its
    /// `ready` plugin says every plugin (including the `kubernetes` watch) is ready.
    pub async fn start(coredns: &Path, dir: &Path, corefile: &str, kubeconfig: &Path) -> Result<Self> {
        ensure!(corefile.contains("{{ready_port}}"), "the Corefile needs `ready 127.0.0.1:{{{{ready_port}}}}`");
        std::fs::create_dir_all(dir.join("custom"))?;
        let port = free_port()?;
        let ready_port = free_port()?;
        let text = fill(corefile, port, ready_port, kubeconfig, dir);
        let path = dir.join("Corefile");
        std::fs::write(&path, text)?;
        let args = vec!["-conf".into(), path.display().to_string()];
        let process = Process::start("coredns", coredns, args, dir.join("coredns.log"))?;
        let mut server = Self { port, ready_port, dir: dir.into(), process };
        let url = format!("http://127.0.0.1:{ready_port}/ready");
        wait_until(&mut server.process, Duration::from_secs(30), "ready", || {
            let url = url.clone();
            async move { crate::http::get_ok(&url).await }
        })
        .await?;
        Ok(server)
    }

    /// A resolver that asks only this CoreDNS, over UDP, without caching (every call is a fresh query).
    pub fn resolver(&self) -> Result<TokioResolver> {
        let mut udp = ConnectionConfig::udp();
        udp.port = self.port;
        let ns = NameServerConfig::new(IpAddr::V4(Ipv4Addr::LOCALHOST), true, vec![udp]);
        let mut builder = TokioResolver::builder_with_config(
            ResolverConfig::from_name_servers(vec![ns]),
            TokioRuntimeProvider::default(),
        );
        builder.options_mut().cache_size = 0;
        builder.options_mut().attempts = 1;
        builder.options_mut().timeout = Duration::from_secs(2);
        Ok(builder.build()?)
    }

    /// The IPv4 addresses CoreDNS answers for `name` (a fully qualified name, trailing dot optional).
    pub async fn resolve_a(&self, name: &str) -> Result<Vec<Ipv4Addr>> {
        let fqdn = if name.ends_with('.') { name.to_string() } else { format!("{name}.") };
        let lookup = self.resolver()?.ipv4_lookup(fqdn.as_str()).await.with_context(|| format!("resolving {fqdn}"))?;
        Ok(lookup
            .answers()
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(a.0),
                _ => None,
            })
            .collect())
    }
}

fn fill(corefile: &str, port: u16, ready_port: u16, kubeconfig: &Path, dir: &Path) -> String {
    corefile
        .replace("{{port}}", &port.to_string())
        .replace("{{ready_port}}", &ready_port.to_string())
        .replace("{{kubeconfig}}", &kubeconfig.display().to_string())
        .replace("{{dir}}", &dir.display().to_string())
}

/// kubernetes/dns's `nodelocaldns.yaml` Corefile as kubeadm's docs have it after their `sed`: node-cache's
/// listen address `local` (an IP, or `__PILLAR__LOCAL__DNS__` left for node-cache), `__PILLAR__DNS__SERVER__`
/// and `__PILLAR__CLUSTER__DNS__` left for node-cache (it fills the latter from `$KUBE_DNS_SERVICE_HOST`), the
/// root zone forwarded to `upstream` in place of `__PILLAR__UPSTREAM__SERVERS__`, and the `prometheus` and
/// `health` listen addresses. The node-local-dns tests of dns-rewriter (host process) and of the chart (the
/// DaemonSet on the node) start from it.
pub fn node_local_corefile(local: &str, upstream: &str, prometheus: &str, health: &str) -> String {
    format!(
        "cluster.local:53 {{
    errors
    cache {{
            success 9984 30
            denial 9984 5
    }}
    reload
    loop
    bind {local} __PILLAR__DNS__SERVER__
    forward . __PILLAR__CLUSTER__DNS__ {{
            force_tcp
    }}
    prometheus {prometheus}
    health {health}
    }}
in-addr.arpa:53 {{
    errors
    cache 30
    reload
    loop
    bind {local} __PILLAR__DNS__SERVER__
    forward . __PILLAR__CLUSTER__DNS__ {{
            force_tcp
    }}
    prometheus {prometheus}
    }}
.:53 {{
    errors
    cache 30
    reload
    loop
    bind {local} __PILLAR__DNS__SERVER__
    forward . {upstream}
    prometheus {prometheus}
    }}
"
    )
}
