//! `cargo xtask ...`: the commands a developer and CI type. Each installs what it needs first and says so.
#![forbid(unsafe_code)]

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

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
    },
    /// Start the local control plane with a kcp-like layout and run the agents against it.
    Demo {
        /// Exit after every agent has completed one cycle, printing one summary line per agent.
        #[arg(long)]
        once: bool,
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
        Task::Demo { once } => demo(once),
        Task::Bench { name } => {
            let mut args = vec!["run", "--quiet", "--locked", "--release", "--package", "e2e", "--bin", "bench", "--"];
            args.extend(name.as_deref());
            step("bench", cargo(&args))
        }
    }
}

fn test() -> Result<()> {
    let started = Instant::now();
    ensure_system_packages()?;
    ensure_peers()?;
    step("format", cargo(&["fmt", "--all", "--check"]))?;
    step("clippy", cargo(&["clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings"]))?;
    step("tests", cargo(&["test", "--workspace", "--locked", "--no-fail-fast"]))?;
    eprintln!("xtask: all checks passed in {:.0?}", started.elapsed());
    Ok(())
}

fn demo(once: bool) -> Result<()> {
    ensure_system_packages()?;
    ensure_peers()?;
    // The demo starts the agent binaries from the target directory, next to itself.
    step("build the agents", cargo(&["build", "--quiet", "--locked", "--workspace", "--bins"]))?;
    let mut args = vec!["run", "--quiet", "--locked", "--package", "e2e", "--bin", "demo", "--"];
    if once {
        args.push("--once");
    }
    // The demo prints its own summary; pass its exit code on unchanged.
    let status = cargo(&args).status().context("starting the demo")?;
    std::process::exit(status.code().unwrap_or(1));
}

fn ensure_peers() -> Result<peers::Peers> {
    eprintln!("xtask: checking peers in {}", peers::cache_root().join("peers").display());
    peers::ensure_all().context("building the peers")
}

/// Debian packages the build needs: protoc for etcd-client's generated gRPC code.
fn ensure_system_packages() -> Result<()> {
    if which("protoc") {
        return Ok(());
    }
    eprintln!("xtask: protoc is missing; installing protobuf-compiler with apt-get");
    let mut cmd = if is_root() { Command::new("apt-get") } else { Command::new("sudo") };
    if !is_root() {
        cmd.arg("apt-get");
    }
    cmd.args(["install", "-y", "--no-install-recommends", "protobuf-compiler"]);
    step("apt-get install protobuf-compiler", cmd)
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0")).unwrap_or(false)
}

fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args);
    cmd
}

fn step(name: &str, mut cmd: Command) -> Result<()> {
    eprintln!("xtask: == {name}");
    let started = Instant::now();
    let status = cmd.status().with_context(|| format!("starting {name}"))?;
    if !status.success() {
        bail!("{name} failed ({status})");
    }
    eprintln!("xtask: {name} ok in {:.0?}", started.elapsed());
    Ok(())
}
