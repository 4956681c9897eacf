//! `cargo xtask ...`: the commands a developer and CI type. Each installs what it needs first and says so.
#![deny(unsafe_code)] // one exception: the parent-death signal in child.rs

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod bed;
mod child;
mod docs;
mod house;
mod images;
mod lanes;
mod prereqs;
mod prune;
mod publish;
mod release;
mod supply_chain;
#[cfg(test)]
mod test_tree;

#[derive(Parser)]
#[command(about = "kcp-keeper developer tasks")]
struct Args {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build the peers (real kube-apiserver, etcd, CoreDNS, S3, helm, promtool) that are missing and list them.
    Peers,
    /// Run every check CI runs: format, the house rules (`house`), clippy (warnings denied), the images, all
    /// tests. The test binaries run two at a time (KCP_KEEPER_TEST_LANES=1: one at a time) and share one kcp bed
    /// (KCP_KEEPER_TEST_SHARED_KCP=0: each starts its own); one line per binary, a failing binary's whole output.
    Test {
        /// Only these test binaries, and no format, house rules, clippy or images (the images too when
        /// `chart:node` is named): `<package>` (all its test binaries) or `<package>:<test>` (its
        /// `tests/<test>.rs`), e.g. `kubeconfig-rotator:kcp`; repeat or separate with commas.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Passed to every test binary, e.g. a test name filter.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Start the kcp bed the test binaries share and keep it running until Ctrl-C; prints the
    /// `export KCP_KEEPER_TEST_KCP=...` under which `cargo test` binaries use it instead of starting their own.
    KcpBed {
        /// Where the bed keeps its files (cleared first); default target/kcp-bed-manual.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Run the benchmarks (optimized build) and print subject/baseline ratios; JSON goes to target/bench/.
    Bench {
        /// Only this benchmark.
        name: Option<String>,
        /// Quick try: the snapshot and drill benchmarks use only the 256 MiB database.
        #[arg(long)]
        quick: bool,
    },
    /// Run etcd-snapshotter's robustness suite longer than CI does: each scenario a real 3-member etcd (fsync on),
    /// the daemon with deltas, traffic recorded against etcd's history and a seeded fault schedule, then every
    /// validator. A failing scenario prints its seed; `--seed N --scenarios 1` replays it.
    Robustness {
        /// The first scenario's seed (the next ones count up from it); default: drawn from the clock.
        #[arg(long)]
        seed: Option<u64>,
        /// How many scenarios.
        #[arg(long, default_value_t = 5)]
        scenarios: u64,
        /// Minutes of faults per scenario.
        #[arg(long, default_value_t = 3)]
        minutes: u64,
    },
    /// Build the agents' container images (static binaries, FROM scratch) with buildah, run `--version` inside
    /// each, print their sizes, and publish them with the chart to the test bed's registry (the nodes pull from
    /// it).
    Images,
    /// Build the images and publish them, each with a CycloneDX SBOM attached as an OCI referrer, and the packaged
    /// chart, to an OCI registry, at the workspace's version. A version already published with other bytes is
    /// refused (nothing is pushed); the same bytes again change nothing.
    Publish {
        /// `HOST[:PORT][/PATH]`: images go to `<registry>/<agent>:<version>`, the chart to
        /// `oci://<registry>/charts/kcp-keeper`.
        #[arg(long)]
        registry: String,
        /// A CA bundle (PEM) to trust the registry's certificate with, beside the system's roots.
        #[arg(long)]
        ca_file: Option<PathBuf>,
        /// Registry credentials in the Docker config format (`{"auths": {...}}`), used by buildah, ORAS and helm.
        #[arg(long)]
        auth_file: Option<PathBuf>,
        /// Push the images `cargo xtask images` last built instead of building them first.
        #[arg(long)]
        prebuilt: bool,
    },
    /// Check the house rules of the product code (agents/, tools/): no two modules import each other, directly or
    /// around a ring, and every agent has its role files; and the user docs link only to files and headings the
    /// repository has and name no issue numbers (docs.rs); and the workspace, the chart and CHANGELOG.md name one
    /// version (release.rs); `test` runs it before clippy.
    House,
    /// Write the chart's values.schema.json, README.md and CRDs from the agents' configuration and object types and
    /// values.yaml's comments (the chart's `schema` tests check that the committed files are these).
    Schema,
    /// Start the local control plane with a kcp-like layout and run the agents against it.
    Demo {
        /// Exit after every agent has completed one cycle, printing one summary line per agent.
        #[arg(long)]
        once: bool,
        /// Run the agents as pods: a real one-node cluster (the test bed's node, as root) with the chart installed
        /// by Helm from the images this builds first (`cargo xtask images`).
        #[arg(long)]
        cluster: bool,
    },
}

fn main() -> Result<()> {
    match Args::parse().task {
        Task::Peers => {
            for artefact in ensure_peers()?.artefacts {
                println!("{artefact}");
            }
            Ok(())
        }
        Task::Test { only, args } => test(&only, &args),
        Task::KcpBed { dir } => kcp_bed(dir),
        Task::Demo { once, cluster } => demo(once, cluster),
        Task::Images => images::images(),
        Task::Publish { registry, ca_file, auth_file, prebuilt } => {
            ensure_peers()?;
            let target = publish::Target::parse(&registry, ca_file, auth_file)?;
            publish::publish(&target, prebuilt).map(|_| ())
        }
        Task::Schema => schema(),
        Task::House => house(),
        Task::Robustness { seed, scenarios, minutes } => robustness(seed, scenarios, minutes),
        Task::Bench { name, quick } => {
            prereqs::ensure_protoc()?;
            ensure_peers()?;
            // One build of every binary, then the bench binary itself from the same directory: `cargo run -p e2e`
            // would resolve features for e2e alone and rebuild half the dependency tree a second time.
            step(
                "build the agents and the bench (release)",
                cargo(&["build", "--quiet", "--locked", "--release", "--workspace", "--bins"]),
            )?;
            let mut bench = Command::new(target_dir().join("release/bench"));
            bench.args(name.as_deref());
            if quick {
                bench.arg("--quick");
            }
            step("bench", bench)
        }
    }
}

fn robustness(seed: Option<u64>, scenarios: u64, minutes: u64) -> Result<()> {
    prereqs::ensure_protoc()?;
    prereqs::ensure_libfaketime()?;
    ensure_peers()?;
    let first = seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_secs() % 1_000_000)
    });
    let seeds: Vec<String> = (first..first + scenarios).map(|s| s.to_string()).collect();
    eprintln!("xtask: robustness, {scenarios} scenario(s) of {minutes} min of faults, seeds {}", seeds.join(","));
    let mut run = cargo(&[
        "test",
        "--locked",
        "-p",
        "etcd-snapshotter",
        "--test",
        "robustness",
        "--",
        "--nocapture",
        "every_restore_under_random_faults",
    ]);
    run.env("ROBUSTNESS_SEEDS", seeds.join(",")).env("ROBUSTNESS_SECONDS", (minutes * 60).to_string());
    step("robustness", run)
}

fn test(only: &[String], args: &[String]) -> Result<()> {
    let started = Instant::now();
    prereqs::ensure_rust_components()?;
    prereqs::ensure_protoc()?;
    ensure_peers()?;
    let everything = only.is_empty();
    if everything {
        prereqs::warn_on_little_disk(&target_dir());
        step("format", cargo(&["fmt", "--all", "--check"]))?;
        house()?;
        supply_chain::check(&images::workspace_root())?;
        step("clippy", cargo(&["clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings"]))?;
    }
    let named = |names: &[&str]| only.iter().any(|o| names.contains(&o.as_str()));
    // A node of the test bed needs its tools; the images go first, published to the bed's registry: the nodes
    // pull them from it, the publish tests push them. (The seed layout's own images are built by its test, with
    // buildah, the first time: testbed::seed::images.)
    let on_a_node = named(&["chart", "testbed"]) || lanes::NODE.iter().any(|binary| named(&[binary]));
    if everything || on_a_node || named(&["xtask", "xtask:publish"]) {
        images::images()?;
    }
    if everything || on_a_node {
        prereqs::ensure_node_tools()?;
    }
    if everything || named(&["ca-syncer", "ca-syncer:keystores"]) {
        prereqs::ensure_trust_store_tools()?;
    }
    if everything || named(&["etcd-snapshotter", "etcd-snapshotter:robustness"]) {
        prereqs::ensure_libfaketime()?;
    }
    // The binaries `cargo xtask demo` runs, built with the whole workspace's features (the test build resolves
    // dev-dependencies' features too, so its binaries are other artifacts): the clean-stop tests start the demo,
    // and its own build is then a check, not minutes of compiling inside their start-up window. testbed's
    // kcp-bed, the shared kcp bed, is one of them.
    step("build the demo's binaries", cargo(&["build", "--quiet", "--locked", "--workspace", "--bins"]))?;
    tests(only, args)?;
    eprintln!("xtask: all checks passed in {:.0?}", started.elapsed());
    Ok(())
}

/// The cargo target flags that build just what `--only` names, when every name is `<package>:<target>` (a bare
/// package needs all its targets: none then). A target named as its package's library (`etcd-snapshotter:
/// etcd_snapshotter`, the name the run prints for a library's unit tests) is `--lib`; any other is its
/// `tests/<target>.rs`.
fn only_targets(only: &[String]) -> Vec<String> {
    let named: Option<std::collections::BTreeSet<(&str, &str)>> = only.iter().map(|o| o.split_once(':')).collect();
    let mut flags = Vec::new();
    for (package, target) in named.into_iter().flatten() {
        if target == package.replace('-', "_") {
            if !flags.iter().any(|f| f == "--lib") {
                flags.push("--lib".to_string());
            }
        } else if !flags.windows(2).any(|w| w[0] == "--test" && w[1] == target) {
            // `kubeconfig-rotator:chart` and `etcd-snapshotter:chart` are one `--test chart`.
            flags.extend(["--test".to_string(), target.to_string()]);
        }
    }
    flags
}

/// The tests step: the workspace's test binaries built once, then run by [`lanes`] beside a shared kcp bed.
fn tests(only: &[String], args: &[String]) -> Result<()> {
    let started = Instant::now();
    let dir = target_dir().join("xtask-test");
    std::fs::create_dir_all(&dir)?;
    let messages = dir.join("artifacts.json");
    // Always the whole workspace: `-p` would resolve other features and rebuild half the dependency tree. When
    // `--only` names integration tests alone, only those targets are built.
    let mut build = cargo(&["test", "--workspace", "--locked", "--no-run", "--message-format=json-render-diagnostics"]);
    build.args(only_targets(only));
    build.stdout(std::fs::File::create(&messages)?);
    step("build the test binaries", build)?;
    let text = std::fs::read_to_string(&messages)?;
    let mut jobs: Vec<lanes::Job> =
        lanes::test_binaries(&text)?.into_iter().filter(|j| lanes::selected(j, only)).collect();
    for job in &mut jobs {
        job.args = args.to_vec();
    }
    if only.is_empty() {
        let current: Vec<_> = jobs.iter().map(|j| j.program.clone()).collect();
        prune::remove_superseded(&current);
        let cargo_program = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        jobs.push(lanes::doc_tests(&cargo_program, &images::workspace_root()));
    }
    if jobs.is_empty() {
        bail!("--only {only:?} names no test binary: give <package> or <package>:<target>, e.g. testbed:kcp");
    }
    let times = dir.join("times.tsv");
    lanes::order(&mut jobs, &lanes::read_times(&times));
    let lane_count = lanes::lanes()?;
    let mut env = Vec::new();
    let mut shared_bed = None;
    if bed::enabled() && jobs.iter().any(|j| lanes::SHARED_KCP_USERS.contains(&j.name.as_str())) {
        let started = bed::SharedBed::start(&target_dir().join("debug/kcp-bed"), &target_dir().join("kcp-bed-shared"))?;
        env.push((bed::ENV.to_string(), started.file.display().to_string()));
        shared_bed = Some(started);
    }
    eprintln!(
        "xtask: == tests: {} test binaries, {lane_count}, {}; logs in {}",
        jobs.len(),
        if shared_bed.is_some() { "one kcp bed shared" } else { "no shared kcp bed" },
        dir.join("logs").display()
    );
    let private = |job: &lanes::Job| !lanes::PRIVATE_KCP.contains(&job.name.as_str());
    let outcomes = lanes::run(jobs, lane_count, env, private, &dir.join("logs"))?;
    let mut failed: Vec<String> = outcomes.iter().filter(|o| !o.ok).map(|o| o.job.label()).collect();
    if let Some(mut shared) = shared_bed {
        if let Some(status) = shared.exited() {
            eprintln!("xtask: the shared kcp bed exited during the run ({status}); its log:\n{}", shared.log_text());
            failed.push("the shared kcp bed".into());
        }
        shared.stop();
    }
    if child::interrupted() {
        failed.push("the run (interrupted)".into());
    }
    lanes::record_times(&times, &outcomes)?;
    let summed: Duration = outcomes.iter().map(|o| o.took).sum();
    eprintln!(
        "xtask: tests: {} binaries in {:.0?} ({:.0?} of binaries' time)",
        outcomes.len(),
        started.elapsed(),
        summed
    );
    if !failed.is_empty() {
        bail!("{} failed: {}", failed.len(), failed.join(", "));
    }
    Ok(())
}

/// `cargo xtask kcp-bed`: the shared kcp bed on its own, until SIGINT or SIGTERM.
fn kcp_bed(dir: Option<PathBuf>) -> Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    prereqs::ensure_protoc()?;
    ensure_peers()?;
    step("build the bed", cargo(&["build", "--quiet", "--locked", "--workspace", "--bins"]))?;
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    let dir = dir.unwrap_or_else(|| target_dir().join("kcp-bed-manual"));
    let mut shared = bed::SharedBed::start(&target_dir().join("debug/kcp-bed"), &dir)?;
    shared.wait_ready(Duration::from_secs(900), || signals.pending().next().is_some())?;
    println!("export {}={}", bed::ENV, shared.file.display());
    eprintln!("xtask: the shared kcp bed runs; Ctrl-C stops it");
    loop {
        if signals.pending().next().is_some() {
            break;
        }
        if let Some(status) = shared.exited() {
            bail!("the shared kcp bed exited ({status}); its log:\n{}", shared.log_text());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    shared.stop();
    eprintln!("xtask: the shared kcp bed stopped");
    Ok(())
}

fn schema() -> Result<()> {
    prereqs::ensure_protoc()?;
    let mut cmd = cargo(&["test", "--quiet", "--locked", "--package", "chart", "--test", "schema"]);
    cmd.env("KCP_KEEPER_BLESS", "1");
    step("generate charts/kcp-keeper/values.schema.json, README.md and crds/", cmd)?;
    eprintln!("xtask: wrote charts/kcp-keeper/values.schema.json, README.md and crds/etcd-snapshotter.yaml");
    Ok(())
}

fn demo(once: bool, cluster: bool) -> Result<()> {
    prereqs::ensure_protoc()?;
    ensure_peers()?;
    if cluster {
        if !prereqs::is_root() {
            bail!("`cargo xtask demo --cluster` starts a node (network and mount namespaces, cgroups): run it as root");
        }
        // The pods run the images built from this working tree, imported into the node's containerd.
        images::images()?;
        prereqs::ensure_node_tools()?;
    }
    // The demo starts the agent binaries from the target directory, next to itself. One build of every binary,
    // the demo's included, then the demo from that directory: `cargo run -p e2e` would resolve features for e2e
    // alone and build half the dependency tree a second time (minutes on a fresh clone, inside the clean-stop
    // tests' start-up window).
    step("build the agents and the demo", cargo(&["build", "--quiet", "--locked", "--workspace", "--bins"]))?;
    let mut demo = Command::new(target_dir().join("debug/demo"));
    if once {
        demo.arg("--once");
    }
    if cluster {
        demo.arg("--cluster");
    }
    // The demo prints its own summary; pass its exit code on unchanged. Its own process group, so nothing it
    // started outlives it even when it is SIGKILLed.
    let status = child::run_as_group(demo, "the demo")?;
    std::process::exit(child::exit_code(status));
}

fn ensure_peers() -> Result<peers::Peers> {
    prereqs::check_go()?;
    prereqs::ensure_peer_c_builds()?;
    eprintln!("xtask: checking peers in {}", peers::cache_root().join("peers").display());
    peers::ensure_all().context("building the peers")
}

/// Where cargo puts what it builds: `CARGO_TARGET_DIR` when set (a relative one is relative to the current
/// directory, for cargo and for us alike), else the workspace's `target`.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

/// A cargo command, without the variables `cargo run` set for the xtask itself (see [`set_by_cargo_run`]), and
/// without incremental compilation unless the caller's environment sets `CARGO_INCREMENTAL`: the xtask builds each
/// workspace crate once per run, and the incremental caches it would keep (7.8 GiB in a long-lived target
/// directory here) buy nothing then but fill the disk a full run already nearly fills.
pub(crate) fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args);
    if std::env::var_os("CARGO_INCREMENTAL").is_none() {
        cmd.env("CARGO_INCREMENTAL", "0");
    }
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_run) {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// Whether a variable is one `cargo run` sets for the binary it runs (`CARGO_MANIFEST_DIR` of the xtask, its
/// `CARGO_PKG_*`, ...). A build script that reads one of these names (ring's reads `CARGO_MANIFEST_DIR` and
/// `CARGO_PKG_*` and declares `rerun-if-env-changed` for them) sees cargo's environment change whenever the xtask's
/// checkout moves, so a clone at a new path rebuilt ring and every crate above it in the static image build's
/// cached target directory: 806 s of a full run. The nested cargo sets them itself for what it builds.
fn set_by_cargo_run(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_RUSTC_CURRENT_DIR"
        )
}

pub(crate) fn step(name: &str, cmd: Command) -> Result<()> {
    step_with(name, || {
        let status = child::run(cmd, name)?;
        if !status.success() {
            bail!("{name} failed ({status})");
        }
        Ok(())
    })
}

/// A step done by the xtask itself rather than by a command, announced and timed as [`step`]'s are.
pub(crate) fn step_with(name: &str, work: impl FnOnce() -> Result<()>) -> Result<()> {
    eprintln!("xtask: == {name}");
    let started = Instant::now();
    work()?;
    eprintln!("xtask: {name} ok in {:.0?}", started.elapsed());
    Ok(())
}

/// The house rules (house.rs, docs.rs, release.rs): no import circles in product code, every agent's role files,
/// the user docs' links and wording, one version for the workspace, the chart and the changelog; read from the sources in well under a second, so they fail before clippy's minutes.
fn house() -> Result<()> {
    let name = "house (import circles, role files, user docs, release versions)";
    step_with(name, || {
        let root = images::workspace_root();
        let failed: Vec<String> = [house::check(&root), docs::check(&root), release::check(&root)]
            .into_iter()
            .filter_map(|result| result.err().map(|e| format!("{e:#}")))
            .collect();
        match failed.is_empty() {
            true => Ok(()),
            false => Err(anyhow::anyhow!("{}", failed.join("; "))),
        }
        .with_context(|| format!("{name} failed"))
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_builds_a_librarys_unit_tests_with_lib_and_an_integration_test_by_its_name() {
        let only = |names: &[&str]| super::only_targets(&names.iter().map(|n| n.to_string()).collect::<Vec<_>>());
        assert_eq!(only(&["etcd-snapshotter:etcd_snapshotter"]), ["--lib"]);
        assert_eq!(
            only(&["kcp-keeper-runtime:kcp_keeper_runtime", "testbed:kcp", "testbed:testbed"]),
            ["--lib", "--test", "kcp"]
        );
        // A bare package needs every target of it: no flag narrows the build.
        assert_eq!(only(&["kubeconfig-rotator:chart", "etcd-snapshotter:chart"]), ["--test", "chart"]);
        assert!(only(&["testbed:kcp", "ca-syncer"]).is_empty());
        assert!(only(&[]).is_empty());
    }

    use super::set_by_cargo_run;

    #[test]
    fn what_cargo_run_set_for_the_xtask_is_kept_from_nested_cargo_and_cargos_own_settings_pass() {
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_CRATE_NAME",
        ] {
            assert!(set_by_cargo_run(name), "{name}");
        }
        for name in ["CARGO", "CARGO_HOME", "CARGO_TARGET_DIR", "CARGO_PROFILE_RELEASE_STRIP", "RUSTFLAGS", "PATH"] {
            assert!(!set_by_cargo_run(name), "{name}");
        }
    }
}
