//! `cargo xtask ...`: the commands a developer and CI type. Each installs what it needs first and says so.
#![deny(unsafe_code)] // one exception: the parent-death signal in child.rs

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod child;
mod images;
mod prereqs;

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
    /// Run every check CI runs: format, clippy (warnings denied), all tests.
    Test,
    /// Run the benchmarks (optimized build) and print subject/baseline ratios; JSON goes to target/bench/.
    Bench {
        /// Only this benchmark.
        name: Option<String>,
        /// Quick try: the snapshot and drill benchmarks use only the 256 MiB database.
        #[arg(long)]
        quick: bool,
    },
    /// Build the agents' container images (static binaries, FROM scratch) with buildah, run `--version` inside
    /// each and print their sizes.
    Images,
    /// Write the chart's values.schema.json and README.md from the agents' configuration types and
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
        Task::Test => test(),
        Task::Demo { once, cluster } => demo(once, cluster),
        Task::Images => images::images(),
        Task::Schema => schema(),
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

fn test() -> Result<()> {
    let started = Instant::now();
    prereqs::ensure_rust_components()?;
    prereqs::ensure_protoc()?;
    ensure_peers()?;
    step("format", cargo(&["fmt", "--all", "--check"]))?;
    step("clippy", cargo(&["clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings"]))?;
    // The images first: the node test imports them into the node's containerd.
    images::images()?;
    prereqs::ensure_node_tools()?;
    // The binaries `cargo xtask demo` runs, built with the whole workspace's features (the test build resolves
    // dev-dependencies' features too, so its binaries are other artifacts): the clean-stop tests start the demo,
    // and its own build is then a check, not minutes of compiling inside their start-up window.
    step("build the demo's binaries", cargo(&["build", "--quiet", "--locked", "--workspace", "--bins"]))?;
    step("tests", cargo(&["test", "--workspace", "--locked", "--no-fail-fast"]))?;
    eprintln!("xtask: all checks passed in {:.0?}", started.elapsed());
    Ok(())
}

fn schema() -> Result<()> {
    prereqs::ensure_protoc()?;
    let mut cmd = cargo(&["test", "--quiet", "--locked", "--package", "chart", "--test", "schema"]);
    cmd.env("KCP_KEEPER_BLESS", "1");
    step("generate charts/kcp-keeper/values.schema.json and README.md", cmd)?;
    eprintln!("xtask: wrote charts/kcp-keeper/values.schema.json and charts/kcp-keeper/README.md");
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

pub(crate) fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args);
    cmd
}

pub(crate) fn step(name: &str, cmd: Command) -> Result<()> {
    eprintln!("xtask: == {name}");
    let started = Instant::now();
    let status = child::run(cmd, name)?;
    if !status.success() {
        bail!("{name} failed ({status})");
    }
    eprintln!("xtask: {name} ok in {:.0?}", started.elapsed());
    Ok(())
}
