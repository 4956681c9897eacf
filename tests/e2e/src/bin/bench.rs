//! `cargo xtask bench [NAME]`: benchmarks of the agents against what a user would run instead, side by side in
//! one invocation (subject and baseline alternate round by round, so the ratio is robust to a shared, noisy
//! machine). Prints a table and writes `target/bench/<name>.json`. Nothing here asserts a time.
#![forbid(unsafe_code)]

#[path = "bench/awscli.rs"]
mod awscli;
#[path = "bench/ca_sync.rs"]
mod ca_sync;
#[path = "bench/common.rs"]
mod common;
#[path = "bench/curve.rs"]
mod curve;
#[path = "bench/deltas.rs"]
mod deltas;
#[path = "bench/dns.rs"]
mod dns;
#[path = "bench/drill.rs"]
mod drill;
#[path = "bench/etcdbr.rs"]
mod etcdbr;
#[path = "bench/idle.rs"]
mod idle;
#[path = "bench/micro.rs"]
mod micro;
#[path = "bench/rotate.rs"]
mod rotate;
#[path = "bench/snapshot.rs"]
mod snapshot;
#[path = "bench/snapshot_curve.rs"]
mod snapshot_curve;
#[path = "bench/trust_manager.rs"]
mod trust_manager;

use anyhow::Result;
use clap::Parser;

#[derive(Parser)]
struct Args {
    /// Run only the benchmark with this name (ca-bundle-public-roots, idle, snapshot, ca-sync, drill, rotate, dns),
    /// or a scale curve (ca-sync-curve, dns-curve, rotate-curve, snapshot-curve), which runs only when named.
    name: Option<String>,
    /// Rounds of the micro-benchmark (each round times the subject and the baseline once).
    #[arg(long, default_value_t = 31)]
    rounds: usize,
    /// Rounds of each process-level benchmark (snapshot, ca-sync, drill, rotate, dns).
    #[arg(long, env = "KCP_KEEPER_BENCH_ROUNDS", default_value_t = 3)]
    process_rounds: usize,
    /// Tenant namespaces of the ca-sync benchmark (each gets a target from ca-syncer, the raw apply loop and
    /// trust-manager).
    #[arg(long, env = "KCP_KEEPER_BENCH_CA_NAMESPACES", default_value_t = ca_sync::NAMESPACES)]
    ca_namespaces: usize,
    /// Quick try: the snapshot and drill benchmarks use only the 256 MiB database (the documented run uses both).
    #[arg(long, env = "KCP_KEEPER_BENCH_QUICK", value_parser = clap::builder::BoolishValueParser::new())]
    quick: bool,
    /// The sizes of a scale curve, comma-separated (ca-sync-curve: namespaces, default 100,1000,5000;
    /// dns-curve: hosts per round, default 10,100,1000; rotate-curve: targets, default 10,100,500;
    /// snapshot-curve: shards in one replica, default 1,5,20).
    #[arg(long, env = "KCP_KEEPER_BENCH_SIZES", value_delimiter = ',')]
    sizes: Vec<usize>,
}

const NAMES: &[&str] = &["ca-bundle-public-roots", "idle", "ca-sync", "rotate", "dns", "snapshot", "drill", "deltas"];
/// Scale curves: each runs its benchmark at several sizes, so they run only when named.
const CURVES: &[&str] = &["ca-sync-curve", "dns-curve", "rotate-curve", "snapshot-curve"];

/// `target/bench`: the JSON reports, and the big benchmarks' scratch space (removed after each).
pub fn bench_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench")
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(name) = &args.name {
        anyhow::ensure!(
            NAMES.contains(&name.as_str()) || CURVES.contains(&name.as_str()),
            "no benchmark named {name:?}; there are: {}",
            [NAMES, CURVES].concat().join(", ")
        );
    }
    testbed::init_crypto();
    let dir = bench_dir();
    std::fs::create_dir_all(&dir)?;
    let mut table = Vec::new();
    let mut failed = Vec::new();
    let named: Vec<&&str> = CURVES.iter().filter(|n| args.name.as_deref() == Some(**n)).collect();
    let names = if named.is_empty() {
        NAMES.iter().filter(|n| args.name.as_deref().is_none_or(|a| a == **n)).collect()
    } else {
        named
    };
    let sizes = |default: &[usize]| if args.sizes.is_empty() { default.to_vec() } else { args.sizes.clone() };
    for name in names {
        let load_before = common::load_average();
        let started = std::time::Instant::now();
        let report = match *name {
            "ca-bundle-public-roots" => Ok(micro::run(args.rounds)),
            "idle" => idle::run().await,
            "snapshot" => snapshot::run(args.process_rounds, args.quick).await,
            "ca-sync" => ca_sync::run(args.process_rounds, args.ca_namespaces).await,
            "drill" => drill::run(args.process_rounds, args.quick).await,
            "deltas" => deltas::run(args.quick).await,
            "rotate" => rotate::run(args.process_rounds).await,
            "dns" => dns::run(args.process_rounds).await,
            "ca-sync-curve" => ca_sync::curve(args.process_rounds, &sizes(ca_sync::CURVE_SIZES)).await,
            "dns-curve" => dns::curve(args.process_rounds, &sizes(dns::CURVE_SIZES)).await,
            "rotate-curve" => rotate::curve(args.process_rounds, &sizes(rotate::CURVE_SIZES)).await,
            "snapshot-curve" => snapshot_curve::curve(args.process_rounds, &sizes(snapshot_curve::CURVE_SIZES)).await,
            _ => unreachable!("listed in NAMES"),
        };
        // One benchmark failing does not lose the others' figures; the run still fails at the end.
        let report = match report {
            Ok(report) => report,
            Err(e) => {
                eprintln!("bench: {name} failed: {e:#}");
                failed.push(*name);
                continue;
            }
        };
        let json = serde_json::json!({
            "name": name,
            "load_average_before": load_before,
            "load_average_after": common::load_average(),
            "wall_seconds": started.elapsed().as_secs_f64(),
            "figures": report.json,
        });
        std::fs::write(dir.join(format!("{name}.json")), serde_json::to_string_pretty(&json)?)?;
        for row in &report.rows {
            print_row(name, row);
        }
        table.extend(report.rows.into_iter().map(|r| (*name, r)));
    }
    println!("\nload average now: {}\n", common::load_average());
    println!("| benchmark | measure | ours | baseline | ratio | target |\n|---|---|---|---|---|---|");
    for (name, row) in &table {
        let ratio = row.ratio.map_or("-".into(), |r| format!("{r:.2}x"));
        println!("| `{name}` | {} | {} | {} | {ratio} | {} |", row.measure, row.ours, row.baseline, row.target);
    }
    anyhow::ensure!(failed.is_empty(), "failed: {}", failed.join(", "));
    Ok(())
}

fn print_row(name: &str, row: &common::Row) {
    let ratio = row.ratio.map_or("-".into(), |r| format!("{r:.2}x"));
    println!("{name:<24} {:<70} {:>22} {:>22} {ratio:>7}  {}", row.measure, row.ours, row.baseline, row.target);
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// `KCP_KEEPER_BENCH_QUICK` takes the forms every boolean variable takes (`kcp_keeper_runtime::args::boolean_env`), through the
    /// argument's own value parser, the one clap applies to the variable's value.
    #[test]
    fn quick_takes_1_0_true_false_yes_no_from_the_environment() {
        let command = super::Args::command();
        let arg = command.get_arguments().find(|a| a.get_id() == "quick").unwrap();
        assert_eq!(arg.get_env().and_then(|v| v.to_str()), Some("KCP_KEEPER_BENCH_QUICK"));
        let parse = |text: &str| {
            let probe = clap::Arg::new("v").long("v").value_parser(arg.get_value_parser().clone());
            let matches = clap::Command::new("probe").arg(probe).try_get_matches_from(["probe", "--v", text]).ok()?;
            matches.get_one::<bool>("v").copied()
        };
        for (form, value) in [("1", true), ("0", false), ("true", true), ("false", false), ("yes", true), ("no", false)]
        {
            assert_eq!(parse(form), Some(value), "KCP_KEEPER_BENCH_QUICK={form}");
        }
        assert_eq!(parse("maybe"), None);
    }
}
