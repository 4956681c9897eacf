//! Peers of the seed's layout on the real node: cert-manager's controller and the kcp-operator, the two programs
//! that run kcp's certificates and shards in production. They are built from unmodified source archives in the
//! third-party directory (the module proxy refuses both), by `cargo xtask peers` and `cargo xtask test` through
//! [`crate::ensure_all`], but they are apart from [`crate::PEERS`] so that [`crate::locate`], which every other
//! test binary calls, never asks for them: a checkout whose cache predates them keeps working.

use crate::Result;
use crate::pins::{Peer, Recipe, SourceArchive};

pub const CERT_MANAGER_CONTROLLER: &str = "v1.21.1";
pub const VCERT: &str = "v5.13.7";
pub const KCP_OPERATOR: &str = "v0.9.0";
/// Our own one-file program (standard library only); bump when `http_probe.go` changes.
pub const HTTP_PROBE: &str = "v1";
/// Our own one-file program (standard library only); bump when `kubeconfig_probe.go` changes.
pub const KUBECONFIG_PROBE: &str = "v4";
/// Our own one-file C program on OpenSSL (`openssl_probe.c`); bump when it changes. It links the machine's
/// `libssl.a` and `libcrypto.a` (Debian bookworm's libssl-dev: OpenSSL 3.0), and prints that version at start.
pub const OPENSSL_PROBE: &str = "v4";
/// The pod-side `nslookup` of the seed's Verify section: the pod's own resolver configuration, nothing named.
pub const DNS_LOOKUP: &str = "v1";

pub static SEED_PEERS: &[Peer] = &[
    Peer {
        name: "cert-manager",
        version: CERT_MANAGER_CONTROLLER,
        recipe: Recipe::SourceModule {
            source: &CERT_MANAGER_SOURCE,
            module: "cmd/controller",
            replaces: &[("github.com/Venafi/vcert/v5", &VCERT_SOURCE)],
            builds: &[("cert-manager-controller", ".")],
            // The CRDs and the chart of the same tree: one cert-manager version for the CRDs and the controller
            // (the `cert-manager-crds` peer is v1.21.2 from the module proxy, for the tests that need only CRDs).
            files: &[
                ("deploy/crds", "cert-manager-controller-crds"),
                ("deploy/charts/cert-manager", "cert-manager-chart"),
            ],
        },
        outputs: &["cert-manager-controller", "cert-manager-controller-crds", "cert-manager-chart"],
        expected_time: "about 3 minutes on 2 cores with a warm module cache",
    },
    Peer {
        name: "kcp-operator",
        version: KCP_OPERATOR,
        recipe: Recipe::SourceModule {
            source: &KCP_OPERATOR_SOURCE,
            module: ".",
            replaces: &[],
            builds: &[("kcp-operator", "./cmd/operator")],
            // Its CRDs: the `operator.kcp.io` ones (also vendored in testbed/crds) and the `deploy.operator.kcp.io`
            // `Compiled*` ones its controllers render into; its RBAC as `config/rbac` ships it.
            files: &[
                ("config/crd/bases", "kcp-operator-crds"),
                ("config/crd/deploy/bases", "kcp-operator-deploy-crds"),
                ("config/rbac", "kcp-operator-rbac"),
            ],
        },
        outputs: &["kcp-operator", "kcp-operator-crds", "kcp-operator-deploy-crds", "kcp-operator-rbac"],
        expected_time: "about 2 minutes on 2 cores with a warm module cache",
    },
    Peer {
        name: "http-probe",
        version: HTTP_PROBE,
        recipe: Recipe::Program {
            go_mod: http_probe_go_mod,
            main_go: include_str!("http_probe.go"),
            output: "http-probe",
        },
        outputs: &["http-probe"],
        expected_time: "seconds",
    },
    // A hub's use of a published kubeconfig, every 200 ms through renewals (issue 24 item 4).
    Peer {
        name: "kubeconfig-probe",
        version: KUBECONFIG_PROBE,
        recipe: Recipe::Program {
            go_mod: kubeconfig_probe_go_mod,
            main_go: include_str!("kubeconfig_probe.go"),
            output: "kubeconfig-probe",
        },
        outputs: &["kubeconfig-probe"],
        expected_time: "seconds",
    },
    // kubeconfig-probe's twin on OpenSSL: the chain built and verified by OpenSSL, as curl's is (the consumer tests).
    Peer {
        name: "openssl-probe",
        version: OPENSSL_PROBE,
        recipe: Recipe::StaticC {
            main_c: include_str!("openssl_probe.c"),
            output: "openssl-probe",
            libs: &["ssl", "crypto", "pthread"],
        },
        outputs: &["openssl-probe"],
        expected_time: "seconds",
    },
    // A plain pod's lookup through its resolv.conf (the cluster DNS the kubelet names), as the seed's Verify runs it.
    Peer {
        name: "dns-lookup",
        version: DNS_LOOKUP,
        recipe: Recipe::Program {
            go_mod: dns_lookup_go_mod,
            main_go: include_str!("dns_lookup.go"),
            output: "dns-lookup",
        },
        outputs: &["dns-lookup"],
        expected_time: "seconds",
    },
];

fn dns_lookup_go_mod(_version: &str) -> Result<String> {
    Ok("module kcp-keeper.local/dns-lookup\n\ngo 1.22\n".to_string())
}

/// The probe needs nothing but the standard library.
fn http_probe_go_mod(_version: &str) -> Result<String> {
    Ok("module kcp-keeper.local/http-probe\n\ngo 1.22\n".to_string())
}

fn kubeconfig_probe_go_mod(_version: &str) -> Result<String> {
    Ok("module kcp-keeper.local/kubeconfig-probe\n\ngo 1.22\n".to_string())
}

/// cert-manager's binaries are nested modules (`cmd/controller/go.mod` replaces the root module with `../../`)
/// and import `internal/` packages, so only the source tree builds them.
pub static CERT_MANAGER_SOURCE: SourceArchive = SourceArchive {
    archive: "cert-manager-v1.21.1/cert-manager-v1.21.1-src.tar.gz",
    sha256: "8c7211100d6c5f06020c389da85f8e40ff2b26811e3a1dae7cc55b78e2a81409",
    prefix: "cert-manager-v1.21.1",
    git_url: "https://github.com/cert-manager/cert-manager.git",
    tag: CERT_MANAGER_CONTROLLER,
    commit: "24e33194fb39488eff2bbf10c6dc640f407cad44",
    ldflags: cert_manager_ldflags,
    vendored: false,
};

/// The one dependency of cert-manager's controller the module proxy refuses (403 at every version): its
/// unmodified archive, put in place by a build-time `replace`.
pub static VCERT_SOURCE: SourceArchive = SourceArchive {
    archive: "vcert-v5.13.7/vcert-v5.13.7-src.tar.gz",
    sha256: "41639caf5ae539736b4b8d74dd02cc66bcba98246dbb305b9ddf443c9c580c13",
    prefix: "vcert-v5.13.7",
    git_url: "https://github.com/Venafi/vcert.git",
    tag: VCERT,
    commit: "ee9b69160db74a0b502e02b12b6f4fd4ab4b8cbd",
    ldflags: |_, _| String::new(),
    vendored: false,
};

/// The module proxy refuses `github.com/kcp-dev/kcp-operator`; from its tree every dependency comes from the proxy.
pub static KCP_OPERATOR_SOURCE: SourceArchive = SourceArchive {
    archive: "kcp-operator-v0.9.0/kcp-operator-v0.9.0-src.tar.gz",
    sha256: "393ff5b2beb2aecd5757b4ea5d088ac6148c57429e7fd0d852e7051cdce0f105",
    prefix: "kcp-operator-v0.9.0",
    git_url: "https://github.com/kcp-dev/kcp-operator.git",
    tag: KCP_OPERATOR,
    commit: "60a69befc09f3d06fded715bb04a422add32eb3a",
    // Its Makefile stamps no version (only `-extldflags -static`, moot with cgo off).
    ldflags: |_, _| String::new(),
    vendored: false,
};

/// What cert-manager's `make/00_mod.mk` stamps, so the controller's start-up log names the pin.
fn cert_manager_ldflags(source: &SourceArchive, _go_mod: &str) -> String {
    let pkg = "github.com/cert-manager/cert-manager/pkg/util";
    format!("-X {pkg}.AppVersion={} -X {pkg}.AppGitCommit={}", source.tag, source.commit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_peers_are_apart_from_the_peers_every_test_binary_locates() {
        for peer in SEED_PEERS {
            assert!(
                crate::PEERS
                    .iter()
                    .chain(crate::BENCH_PEERS)
                    .all(|p| p.name != peer.name && p.outputs.iter().all(|o| !peer.outputs.contains(o))),
                "{} shares a name or an output with another peer list",
                peer.name
            );
        }
    }

    #[test]
    fn the_controller_is_stamped_with_the_pinned_tag_and_commit() {
        let flags = cert_manager_ldflags(&CERT_MANAGER_SOURCE, "");
        assert!(flags.contains("pkg/util.AppVersion=v1.21.1 "), "{flags}");
        assert!(flags.contains("AppGitCommit=24e33194fb39488eff2bbf10c6dc640f407cad44"), "{flags}");
    }
}
