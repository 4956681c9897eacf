//! Command lines of kcp's shards and front proxy. The flags follow kcp's own multi-shard harness
//! (`cmd/sharded-test-server`, `shard.go` and `frontproxy.go`) and kcp-operator's deployments, with one
//! difference that matters: every shard runs on its own external etcd, as in production, never the embedded one.

use std::path::PathBuf;

/// What a shard's command line is built from.
pub struct ShardFlags {
    pub name: String,
    pub port: u16,
    pub etcd_servers: String,
    pub root_directory: PathBuf,
    /// The front proxy's URL: what kcp writes into workspace URLs for outside clients.
    pub external_url: String,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    /// `tls.crt` of the client CA: admin kubeconfigs and kcp's own client certificates.
    pub client_ca: PathBuf,
    /// `ca.crt` of the server CA Secret, the root all kcp CAs come from.
    pub root_ca: PathBuf,
    /// `tls.crt` of the front-proxy client CA: only certificates from it may assert a user in headers.
    pub requestheader_ca: PathBuf,
    pub service_account_pub: PathBuf,
    pub service_account_key: PathBuf,
    pub shard_client_cert: PathBuf,
    pub shard_client_key: PathBuf,
    pub logical_cluster_admin_kubeconfig: PathBuf,
    pub external_logical_cluster_admin_kubeconfig: PathBuf,
    /// For every shard but root: admin credentials to the root shard, which also serves the cache.
    pub root_shard_kubeconfig: Option<PathBuf>,
}

pub fn shard(f: &ShardFlags) -> Vec<String> {
    let p = |flag: &str, path: &PathBuf| format!("--{flag}={}", path.display());
    let mut args = vec![
        "start".to_string(),
        format!("--shard-name={}", f.name),
        format!("--etcd-servers={}", f.etcd_servers),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={}", f.port),
        p("root-directory", &f.root_directory),
        // The base URL is where the front proxy and other shards reach this shard; the external URL is what
        // clients are told (the front proxy).
        format!("--shard-base-url=https://127.0.0.1:{}", f.port),
        format!("--shard-external-url={}", f.external_url),
        p("tls-cert-file", &f.tls_cert),
        p("tls-private-key-file", &f.tls_key),
        p("client-ca-file", &f.client_ca),
        p("root-ca-file", &f.root_ca),
        p("requestheader-client-ca-file", &f.requestheader_ca),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        p("service-account-key-file", &f.service_account_pub),
        p("service-account-private-key-file", &f.service_account_key),
        p("service-account-signing-key-file", &f.service_account_key),
        p("shard-client-cert-file", &f.shard_client_cert),
        p("shard-client-key-file", &f.shard_client_key),
        p("logical-cluster-admin-kubeconfig", &f.logical_cluster_admin_kubeconfig),
        p("external-logical-cluster-admin-kubeconfig", &f.external_logical_cluster_admin_kubeconfig),
        "--v=1".into(),
    ];
    if let Some(root) = &f.root_shard_kubeconfig {
        // A non-root shard reads the root shard's APIs and its cache server (embedded in the root shard, as
        // with kcp-operator's `cache.embedded`) with the same admin credentials.
        args.push(p("root-shard-kubeconfig-file", root));
        args.push(p("cache-kubeconfig", root));
    }
    args
}

/// What the front proxy's command line is built from.
pub struct FrontProxyFlags {
    pub port: u16,
    pub root_directory: PathBuf,
    pub mapping_file: PathBuf,
    pub root_kubeconfig: PathBuf,
    pub shards_kubeconfig: PathBuf,
    /// The client CA bundle it authenticates client certificates with (and advertises in the handshake).
    pub client_ca: PathBuf,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
}

pub fn front_proxy(f: &FrontProxyFlags) -> Vec<String> {
    let p = |flag: &str, path: &PathBuf| format!("--{flag}={}", path.display());
    vec![
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={}", f.port),
        p("root-directory", &f.root_directory),
        p("mapping-file", &f.mapping_file),
        p("root-kubeconfig", &f.root_kubeconfig),
        p("shards-kubeconfig", &f.shards_kubeconfig),
        p("client-ca-file", &f.client_ca),
        p("tls-cert-file", &f.tls_cert),
        p("tls-private-key-file", &f.tls_key),
        "--v=1".into(),
    ]
}

/// The front proxy's path mapping: `/clusters/` goes to the shard that serves the logical cluster (the backend
/// here is only the default, the root shard), with the request-header client certificate and the user in
/// `X-Remote-*` headers.
pub fn mapping_yaml(root_shard_url: &str, server_ca: &str, proxy_cert: &str, proxy_key: &str) -> String {
    format!(
        "- path: /clusters/\n  backend: {root_shard_url}\n  backend_server_ca: {server_ca}\n  proxy_client_cert: {proxy_cert}\n  proxy_client_key: {proxy_key}\n  user_header: X-Remote-User\n  group_header: X-Remote-Group\n  extra_header_prefix: X-Remote-Extra-\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(name: &str, root: Option<&str>) -> ShardFlags {
        let p = |s: &str| PathBuf::from(format!("/d/{s}"));
        ShardFlags {
            name: name.into(),
            port: 6444,
            etcd_servers: "http://127.0.0.1:2379".into(),
            root_directory: p("root"),
            external_url: "https://127.0.0.1:6443".into(),
            tls_cert: p("tls.crt"),
            tls_key: p("tls.key"),
            client_ca: p("client-ca"),
            root_ca: p("root-ca"),
            requestheader_ca: p("rh-ca"),
            service_account_pub: p("sa.pub"),
            service_account_key: p("sa.key"),
            shard_client_cert: p("c.crt"),
            shard_client_key: p("c.key"),
            logical_cluster_admin_kubeconfig: p("lca"),
            external_logical_cluster_admin_kubeconfig: p("elca"),
            root_shard_kubeconfig: root.map(p),
        }
    }

    #[test]
    fn every_shard_uses_its_external_etcd_and_never_the_embedded_one() {
        for f in [flags("root", None), flags("alpha", Some("root.kubeconfig"))] {
            let args = shard(&f);
            assert!(args.contains(&"--etcd-servers=http://127.0.0.1:2379".to_string()), "{args:?}");
            assert!(!args.iter().any(|a| a.contains("embedded-etcd")), "{args:?}");
        }
    }

    #[test]
    fn only_a_non_root_shard_points_at_the_root_shard_and_its_cache() {
        let root = shard(&flags("root", None));
        assert!(!root.iter().any(|a| a.starts_with("--root-shard-kubeconfig-file") || a.starts_with("--cache-")));
        let alpha = shard(&flags("alpha", Some("root.kubeconfig")));
        assert!(alpha.contains(&"--root-shard-kubeconfig-file=/d/root.kubeconfig".to_string()));
        assert!(alpha.contains(&"--cache-kubeconfig=/d/root.kubeconfig".to_string()));
    }

    #[test]
    fn mapping_sends_clusters_to_the_root_shard_with_the_request_header_certificate() {
        let yaml = mapping_yaml("https://127.0.0.1:1", "/ca", "/rh.crt", "/rh.key");
        assert!(yaml.starts_with("- path: /clusters/\n  backend: https://127.0.0.1:1\n"), "{yaml}");
        assert!(yaml.contains("proxy_client_cert: /rh.crt\n") && yaml.contains("user_header: X-Remote-User\n"));
    }
}
