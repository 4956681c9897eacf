//! The pinned peer versions and how each is built. Change a version here and the next
//! `cargo xtask peers` builds it into a new cache directory beside the old one.

use crate::{Result, module_go_mod};

pub const KUBERNETES: &str = "v1.37.2";
/// The `k8s.io/<staging>` modules are published as v0.<minor>.<patch> of the same release.
pub const KUBERNETES_STAGING: &str = "v0.37.2";
pub const ETCD: &str = "v3.6.16";
pub const COREDNS: &str = "v1.14.7";
pub const VERSITYGW: &str = "v1.7.0";
pub const HELM: &str = "v3.21.4";
pub const PROMTOOL: &str = "v0.309.1";
pub const CERT_MANAGER: &str = "v1.21.2";
pub const KCP: &str = "v0.32.3";
/// The one prometheus-operator version the module proxy here answers for (its checksum is known); only its
/// ServiceMonitor and PrometheusRule CRDs are used (the chart's monitoring objects, applied to the test bed).
pub const PROMETHEUS_OPERATOR: &str = "v0.85.0";
/// The container runtime of the test bed's real node (`testbed::node`): containerd 2 is what Kubernetes 1.37 is
/// tested with (containerd's own support table lists 2.3 and 2.4 for it).
pub const CONTAINERD: &str = "v2.4.2";
pub const RUNC: &str = "v1.5.3";
/// The pause image's version in Kubernetes' `build/pause/Makefile` (`TAG ?=`) at [`KUBERNETES`]; the build checks
/// the Makefile still says so.
pub const PAUSE: &str = "3.10.2";
/// The library kubeadm migrates a customised Corefile with when it upgrades CoreDNS (dns-rewriter's tests run
/// it on a Corefile holding the agent's block).
pub const COREFILE_MIGRATION: &str = "v1.0.36";
/// NodeLocal DNSCache's `node-cache` (kubernetes/dns), which dns-rewriter's NodeLocal DNSCache test runs as a
/// host process in front of a real CoreDNS.
pub const NODE_CACHE: &str = "1.26.7";
/// The NetworkPolicy implementation the node runs when a test asks for enforcement (`Node::enforce_network_policies`):
/// kube-router's firewall alone (iptables and ipset). kube-network-policies (nftables and NFQUEUE) cannot run on
/// this machine kind: its kernel has no nftables `queue` expression (`CONFIG_NFT_QUEUE` unset, no modules), so
/// its ruleset is refused whole and nothing is enforced. v2.1.0 is the version the Go module proxy here serves.
pub const KUBE_ROUTER: &str = "v2.1.0";
/// The CNCF Distribution registry (what most private OCI registries run): the test bed's registry, which
/// `cargo xtask publish` pushes the images and the chart to and the node's containerd pulls from.
pub const DISTRIBUTION: &str = "v3.1.2";
/// ORAS, the OCI registry client `cargo xtask publish` reads manifests with (the refusal to overwrite a published
/// version) and attaches each image's SBOM with (an OCI referrer: `subject` is the image's manifest).
pub const ORAS: &str = "v1.3.6";

/// How a peer is built.
pub enum Recipe {
    /// `go install <package>@<version>...`: the module has no `replace` directives. With `cgo` the build links
    /// against the machine's C libraries (runc needs libseccomp); `tags` are Go build tags.
    GoInstall { packages: &'static [&'static str], cgo: bool, tags: &'static str },
    /// A generated wrapper module that requires the peer's modules, then one `go build` per binary.
    Wrapper {
        go_mod: fn(&str) -> Result<String>,
        builds: &'static [(&'static str, &'static str)],
        ldflags: fn(&str) -> String,
    },
    /// Files copied out of a module download (CRD manifests).
    ModuleFiles { module: &'static str, subdir: &'static str, output: &'static str },
    /// An upstream source tree whose go.mod replaces modules with in-tree directories, so no module download
    /// can build it: taken from a pinned source archive in the third-party directory (see
    /// [`crate::third_party_dir`]), or, without the archive, cloned from git at the tag and checked against the
    /// commit. Then one `go build` per binary inside the tree.
    Source { source: &'static SourceArchive, builds: &'static [(&'static str, &'static str)] },
    /// A one-file Go program of ours (`main_go`) in a generated module requiring the library it calls
    /// (`go_mod` from the version), built with one `go build` into `output`.
    Program { go_mod: fn(&str) -> Result<String>, main_go: &'static str, output: &'static str },
    /// A program that is a nested module of a source tree (cert-manager's `cmd/controller/go.mod` replaces the
    /// tree's root module with `../../`, so neither the proxy nor a wrapper can build it): the pinned archive
    /// unpacked, each `replaces` module pointed at another pinned archive's unpacked tree (`go mod edit
    /// -replace`, at build time only: the archives stay unmodified), then one `go build` per binary in `module`
    /// (`-mod=mod`: the replaced tree's own requirements may be missing from the nested module's go.sum), and
    /// `files` (directories of the tree: CRDs, a chart, RBAC) copied out beside the binaries.
    SourceModule {
        source: &'static SourceArchive,
        module: &'static str,
        replaces: &'static [(&'static str, &'static SourceArchive)],
        builds: &'static [(&'static str, &'static str)],
        files: &'static [(&'static str, &'static str)],
    },
    /// A one-file C program of ours (`main_c`), compiled and linked fully static with `gcc -O2 -Wall -Werror
    /// -static` against the machine's static `libs` (`-l<lib>`, in order), so it runs in a `FROM scratch` image.
    StaticC { main_c: &'static str, output: &'static str, libs: &'static [&'static str] },
    /// Kubernetes' pause program, compiled with `gcc -static` from `build/pause/linux/pause.c` of the
    /// `k8s.io/kubernetes` module download, and a one-layer image holding it as a docker-archive tar (what
    /// `ctr images import` reads): the node's sandbox image, as no registry can be reached.
    Pause { kubernetes: &'static str },
}

/// Where a source tree comes from and how to tell it is the pinned one.
pub struct SourceArchive {
    /// Path of the archive inside the third-party directory.
    pub archive: &'static str,
    /// sha256 of the archive, checked before anything is unpacked.
    pub sha256: &'static str,
    /// The directory the archive unpacks into (`git archive --prefix`).
    pub prefix: &'static str,
    /// Used only without the archive: the repository, the tag to clone and the commit the tag must point at.
    pub git_url: &'static str,
    pub tag: &'static str,
    pub commit: &'static str,
    /// Version ldflags from the pin, the commit and the tree's go.mod.
    pub ldflags: fn(&SourceArchive, &str) -> String,
    /// The tree carries every dependency in `vendor/`: built with `-mod=vendor` and no module proxy at all.
    pub vendored: bool,
}

pub struct Peer {
    pub name: &'static str,
    pub version: &'static str,
    pub recipe: Recipe,
    /// Names of the built artefacts, each a file or directory inside the peer's cache dir.
    pub outputs: &'static [&'static str],
    /// Shown before a cold build so nobody thinks it hung.
    pub expected_time: &'static str,
}

pub static PEERS: &[Peer] = &[
    Peer {
        name: "kubernetes",
        version: KUBERNETES,
        recipe: Recipe::Wrapper {
            go_mod: kubernetes_go_mod,
            builds: &[
                ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
                ("kubectl", "k8s.io/kubernetes/cmd/kubectl"),
                ("kubelet", "k8s.io/kubernetes/cmd/kubelet"),
                ("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
                ("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),
                ("kube-proxy", "k8s.io/kubernetes/cmd/kube-proxy"),
            ],
            ldflags: kubernetes_ldflags,
        },
        outputs: &["kube-apiserver", "kubectl", "kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy"],
        expected_time: "about 15 minutes on 2 cores",
    },
    Peer {
        name: "containerd",
        version: CONTAINERD,
        recipe: Recipe::GoInstall {
            packages: &[
                "github.com/containerd/containerd/v2/cmd/containerd",
                "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
                "github.com/containerd/containerd/v2/cmd/ctr",
            ],
            cgo: false,
            tags: "",
        },
        outputs: &["containerd", "containerd-shim-runc-v2", "ctr"],
        expected_time: "about 3 minutes",
    },
    Peer {
        name: "runc",
        version: RUNC,
        // runc's nsenter is C, and seccomp (the restricted profile's RuntimeDefault) needs libseccomp.
        recipe: Recipe::GoInstall { packages: &["github.com/opencontainers/runc"], cgo: true, tags: "seccomp" },
        outputs: &["runc"],
        expected_time: "about 1 minute",
    },
    Peer {
        name: "pause",
        version: PAUSE,
        recipe: Recipe::Pause { kubernetes: KUBERNETES },
        outputs: &["pause", "pause.tar"],
        expected_time: "seconds",
    },
    Peer {
        name: "etcd",
        version: ETCD,
        recipe: Recipe::Wrapper {
            go_mod: etcd_go_mod,
            builds: &[
                ("etcd", "go.etcd.io/etcd/server/v3"),
                ("etcdctl", "go.etcd.io/etcd/etcdctl/v3"),
                ("etcdutl", "go.etcd.io/etcd/etcdutl/v3"),
            ],
            ldflags: no_ldflags,
        },
        outputs: &["etcd", "etcdctl", "etcdutl"],
        expected_time: "about 2 minutes",
    },
    Peer {
        name: "coredns",
        version: COREDNS,
        recipe: Recipe::GoInstall { packages: &["github.com/coredns/coredns"], cgo: false, tags: "" },
        outputs: &["coredns"],
        expected_time: "about 3 minutes",
    },
    Peer {
        name: "versitygw",
        version: VERSITYGW,
        recipe: Recipe::GoInstall { packages: &["github.com/versity/versitygw/cmd/versitygw"], cgo: false, tags: "" },
        outputs: &["versitygw"],
        expected_time: "about 2 minutes",
    },
    Peer {
        name: "helm",
        version: HELM,
        recipe: Recipe::GoInstall { packages: &["helm.sh/helm/v3/cmd/helm"], cgo: false, tags: "" },
        outputs: &["helm"],
        expected_time: "about 2 minutes",
    },
    Peer {
        name: "promtool",
        version: PROMTOOL,
        recipe: Recipe::Wrapper {
            go_mod: prometheus_go_mod,
            builds: &[("promtool", "github.com/prometheus/prometheus/cmd/promtool")],
            ldflags: no_ldflags,
        },
        outputs: &["promtool"],
        expected_time: "about 3 minutes",
    },
    Peer {
        name: "cert-manager-crds",
        version: CERT_MANAGER,
        recipe: Recipe::ModuleFiles {
            module: "github.com/cert-manager/cert-manager",
            subdir: "deploy/crds",
            output: "cert-manager-crds",
        },
        outputs: &["cert-manager-crds"],
        expected_time: "seconds",
    },
    Peer {
        name: "prometheus-operator-crds",
        version: PROMETHEUS_OPERATOR,
        recipe: Recipe::ModuleFiles {
            module: "github.com/prometheus-operator/prometheus-operator",
            subdir: "example/prometheus-operator-crd",
            output: "prometheus-operator-crds",
        },
        outputs: &["prometheus-operator-crds"],
        expected_time: "seconds",
    },
    Peer {
        name: "corefile-migration",
        version: COREFILE_MIGRATION,
        recipe: Recipe::Program {
            go_mod: corefile_migration_go_mod,
            main_go: include_str!("corefile_migrate.go"),
            output: "corefile-migrate",
        },
        outputs: &["corefile-migrate"],
        expected_time: "seconds",
    },
    Peer {
        name: "kcp",
        version: KCP,
        recipe: Recipe::Source {
            source: &KCP_SOURCE,
            builds: &[("kcp", "./cmd/kcp"), ("kcp-front-proxy", "./cmd/kcp-front-proxy")],
        },
        outputs: &["kcp", "kcp-front-proxy"],
        expected_time: "about 10 minutes on 2 cores",
    },
    Peer {
        name: "node-cache",
        version: NODE_CACHE,
        recipe: Recipe::Source { source: &NODE_CACHE_SOURCE, builds: &[("node-cache", "./cmd/node-cache")] },
        outputs: &["node-cache"],
        expected_time: "about 2 minutes",
    },
    Peer {
        name: "kube-router",
        version: KUBE_ROUTER,
        recipe: Recipe::GoInstall {
            packages: &["github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"],
            cgo: false,
            tags: "",
        },
        outputs: &["kube-router"],
        expected_time: "about 2 minutes",
    },
    Peer {
        name: "registry",
        version: DISTRIBUTION,
        recipe: Recipe::GoInstall {
            packages: &["github.com/distribution/distribution/v3/cmd/registry"],
            cgo: false,
            tags: "",
        },
        outputs: &["registry"],
        expected_time: "about 2 minutes",
    },
    Peer {
        name: "oras",
        version: ORAS,
        recipe: Recipe::GoInstall { packages: &["oras.land/oras/cmd/oras"], cgo: false, tags: "" },
        outputs: &["oras"],
        expected_time: "about 1 minute",
    },
];

/// The reference the pause image is imported under and the node's containerd pins as its sandbox image.
pub const PAUSE_IMAGE: &str = "kcp-keeper.local/pause:3.10.2";

/// kcp's go.mod replaces five `github.com/kcp-dev/*` modules with `./staging/src/...` directories that are not in
/// the module download, and the proxy refuses one of them, so kcp is built from its source tree.
pub static KCP_SOURCE: SourceArchive = SourceArchive {
    archive: "kcp-v0.32.3/kcp-v0.32.3-src.tar.gz",
    sha256: "4e5e18ff0a557723c58fddee01d507b453fdeec43d8c8693fcc14632ed880557",
    prefix: "kcp-v0.32.3",
    git_url: "https://github.com/kcp-dev/kcp.git",
    tag: KCP,
    commit: "08be0a1c8de29f5ec6fc27d3563288be970bd3b4",
    ldflags: kcp_ldflags,
    vendored: false,
};

/// The Go module proxy refuses `k8s.io/dns` (403), so node-cache is built from the unmodified source archive of
/// the tag, whose `vendor/` holds every dependency: the build needs no network.
pub static NODE_CACHE_SOURCE: SourceArchive = SourceArchive {
    archive: "kubernetes-dns-1.26.7/kubernetes-dns-1.26.7-src.tar.gz",
    sha256: "4f2816553e77e7d082d0a6e2a85378f3bb9c65d4492d4992edb4c854327381b4",
    prefix: "dns-1.26.7",
    git_url: "https://github.com/kubernetes/dns.git",
    tag: NODE_CACHE,
    commit: "1d8f1a620b92e5a61242e9efa499b3bf3d274975",
    ldflags: node_cache_ldflags,
    vendored: true,
};

/// What kubernetes/dns's `build/build.sh` stamps: `-X k8s.io/dns/pkg/version.VERSION=<tag>`.
fn node_cache_ldflags(source: &SourceArchive, _go_mod: &str) -> String {
    format!("-X k8s.io/dns/pkg/version.VERSION={}", source.tag)
}

/// The version kcp's own Makefile stamps: `<required k8s.io/kubernetes version>+kcp-<tag>`, with the
/// Kubernetes major and minor, so `/version` names both the Kubernetes base and the kcp pin.
fn kcp_ldflags(source: &SourceArchive, go_mod: &str) -> String {
    let kube = required_version(go_mod, "k8s.io/kubernetes").unwrap_or("v0.0.0");
    let mut parts = kube.trim_start_matches('v').split('.');
    let (major, minor) = (parts.next().unwrap_or("0"), parts.next().unwrap_or("0"));
    let version = format!("{kube}+kcp-{}", source.tag);
    ["k8s.io/client-go/pkg/version", "k8s.io/component-base/version"]
        .iter()
        .map(|pkg| {
            format!(
                "-X {pkg}.gitVersion={version} -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor} -X {pkg}.gitCommit={} -X {pkg}.gitTreeState=clean",
                source.commit
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The version a go.mod's `require` names for a module (single-line or block form).
pub fn required_version<'a>(go_mod: &'a str, module: &str) -> Option<&'a str> {
    go_mod.lines().find_map(|line| {
        let line = line.trim().trim_start_matches("require").trim();
        let mut words = line.split_whitespace();
        (words.next() == Some(module)).then(|| words.next()).flatten()
    })
}

/// A wrapper module for `k8s.io/kubernetes`: it cannot be `go install`ed because its go.mod replaces every
/// `k8s.io/<staging>` module with a local directory. The replace list is read from that go.mod, so it
/// follows the pinned release instead of going stale.
fn kubernetes_go_mod(version: &str) -> Result<String> {
    let upstream = module_go_mod("k8s.io/kubernetes", version)?;
    let mut go_mod = format!(
        "module kcp-keeper.local/peers/kubernetes\n\ngo 1.26\n\nrequire k8s.io/kubernetes {version}\n\nreplace (\n"
    );
    for module in staging_modules(&upstream) {
        go_mod.push_str(&format!("\t{module} => {module} {KUBERNETES_STAGING}\n"));
    }
    go_mod.push_str(")\n");
    Ok(go_mod)
}

/// `k8s.io/<name>` modules that k8s.io/kubernetes's go.mod replaces with `./staging/...`.
pub fn staging_modules(go_mod: &str) -> Vec<&str> {
    go_mod
        .lines()
        .filter_map(|line| {
            let (module, target) = line.trim().split_once("=>")?;
            target.trim().starts_with("./staging/").then(|| module.trim())
        })
        .collect()
}

/// Without these the binaries report v0.0.0 and clients that check the server version complain.
fn kubernetes_ldflags(version: &str) -> String {
    let minor = version.split('.').nth(1).unwrap_or_default();
    ["k8s.io/component-base/version", "k8s.io/client-go/pkg/version"]
        .iter()
        .map(|pkg| {
            format!("-X {pkg}.gitVersion={version} -X {pkg}.gitMajor=1 -X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `corefile-migrate FROM TO < Corefile` calls `migration.Migrate(FROM, TO, corefile, false)`, as kubeadm does.
fn corefile_migration_go_mod(version: &str) -> Result<String> {
    Ok(format!(
        "module kcp-keeper.local/corefile-migrate\n\ngo 1.22\n\nrequire github.com/coredns/corefile-migration {version}\n"
    ))
}

fn etcd_go_mod(version: &str) -> Result<String> {
    Ok(format!(
        "module kcp-keeper.local/peers/etcd\n\ngo 1.26\n\nrequire (\n\tgo.etcd.io/etcd/server/v3 {version}\n\tgo.etcd.io/etcd/etcdctl/v3 {version}\n\tgo.etcd.io/etcd/etcdutl/v3 {version}\n)\n"
    ))
}

/// `go install` refuses prometheus because its go.mod has `exclude` directives; a wrapper module that
/// repeats them resolves the same versions as prometheus's own build.
fn prometheus_go_mod(version: &str) -> Result<String> {
    let upstream = module_go_mod("github.com/prometheus/prometheus", version)?;
    Ok(format!(
        "module kcp-keeper.local/peers/promtool\n\ngo 1.26\n\nrequire github.com/prometheus/prometheus {version}\n\n{}",
        exclude_directives(&upstream)
    ))
}

/// The `exclude` directives of a go.mod, single-line and block form, verbatim.
pub fn exclude_directives(go_mod: &str) -> String {
    let mut out = String::new();
    let mut in_block = false;
    for line in go_mod.lines() {
        let trimmed = line.trim();
        if in_block {
            out.push_str(line);
            out.push('\n');
            in_block = trimmed != ")";
        } else if trimmed.starts_with("exclude") {
            out.push_str(line);
            out.push('\n');
            in_block = trimmed.ends_with('(');
        }
    }
    out
}

fn no_ldflags(_: &str) -> String {
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_modules_are_read_from_replace_directives_only() {
        let go_mod = "require (\n\tk8s.io/api v0.0.0\n)\nreplace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\tk8s.io/kubectl => ./staging/src/k8s.io/kubectl\n\tgithub.com/x/y => github.com/x/y v1.0.0\n)\n";
        assert_eq!(staging_modules(go_mod), vec!["k8s.io/api", "k8s.io/kubectl"]);
    }

    #[test]
    fn exclude_directives_keep_single_lines_and_blocks_only() {
        let go_mod = "require x v1\nexclude a v1\n\n// why\nexclude (\n\tb v2\n\tc v3\n)\nreplace d => e v1\n";
        assert_eq!(exclude_directives(go_mod), "exclude a v1\nexclude (\n\tb v2\n\tc v3\n)\n");
    }

    #[test]
    fn required_version_reads_require_lines_not_replace_lines() {
        let go_mod = "require (\n\tk8s.io/api v0.1.0\n\tk8s.io/kubernetes v1.36.0\n)\nreplace (\n\tk8s.io/kubernetes => github.com/kcp-dev/kubernetes v1.37.0\n)\n";
        assert_eq!(required_version(go_mod, "k8s.io/kubernetes"), Some("v1.36.0"));
        assert_eq!(required_version("require k8s.io/kubernetes v1.2.3\n", "k8s.io/kubernetes"), Some("v1.2.3"));
        assert_eq!(required_version(go_mod, "k8s.io/kube"), None);
    }

    #[test]
    fn kcp_ldflags_report_the_kubernetes_base_and_the_kcp_pin() {
        let flags = kcp_ldflags(&KCP_SOURCE, "require (\n\tk8s.io/kubernetes v1.36.0\n)\n");
        assert!(flags.contains("-X k8s.io/component-base/version.gitVersion=v1.36.0+kcp-v0.32.3 "), "{flags}");
        assert!(flags.contains("-X k8s.io/client-go/pkg/version.gitMinor=36 "), "{flags}");
        assert!(flags.contains(&format!("version.gitCommit={}", KCP_SOURCE.commit)), "{flags}");
    }

    #[test]
    fn kubernetes_ldflags_set_version_for_server_and_client() {
        let flags = kubernetes_ldflags("v1.37.2");
        assert!(flags.contains("-X k8s.io/component-base/version.gitVersion=v1.37.2"));
        assert!(flags.contains("-X k8s.io/client-go/pkg/version.gitMinor=37"));
    }
}
