//! `cargo xtask bench [NAME]`: each benchmark runs its subject and a baseline alternately in the same process,
//! so the figure that matters, the ratio, is robust to a shared, noisy machine. Prints a table and writes
//! `target/bench/<name>.json`.
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use ca_syncer::bundle::{Bundle, BundleOptions};
use ca_syncer::certs::{EmptyPolicy, parse_certificates};
use clap::Parser;

#[derive(Parser)]
struct Args {
    /// Run only the benchmark with this name.
    name: Option<String>,
    /// Rounds per benchmark (each round times the subject and the baseline once).
    #[arg(long, default_value_t = 31)]
    rounds: usize,
}

/// A prepared measurement: the subject and the baseline, each a closure over its input.
type Pair = (Box<dyn Fn()>, Box<dyn Fn()>);

struct Bench {
    name: &'static str,
    what: &'static str,
    baseline: &'static str,
    prepare: fn() -> Pair,
}

const BENCHES: &[Bench] = &[Bench {
    name: "ca-bundle-public-roots",
    what: "strict parse + dedupe + order + render of the ~150 public roots, twice over (300 certificates in)",
    baseline: "pem::parse_many + x509-parser on the same text: the least any tool must do to read it",
    prepare: prepare_bundle,
}];

fn prepare_bundle() -> Pair {
    let once = Bundle::build(ca_syncer::sources::public_roots(), &options()).render();
    let input = format!("{once}{once}").into_bytes();
    let for_baseline = input.clone();
    let subject = move || {
        let certs = parse_certificates(&input, EmptyPolicy::Reject).expect("valid roots");
        black_box(Bundle::build(certs, &options()).render());
    };
    let baseline = move || {
        for block in pem::parse_many(&for_baseline).expect("valid PEM") {
            black_box(x509_parser::parse_x509_certificate(block.contents()).expect("valid DER"));
        }
    };
    (Box::new(subject), Box::new(baseline))
}

fn options() -> BundleOptions {
    BundleOptions { drop_expired: false, now: time::OffsetDateTime::now_utc() }
}

fn time(f: &dyn Fn()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench");
    std::fs::create_dir_all(&dir)?;
    println!("{:<26} {:>14} {:>14} {:>8}", "benchmark", "subject", "baseline", "ratio");
    for bench in BENCHES.iter().filter(|b| args.name.as_deref().is_none_or(|n| n == b.name)) {
        let (subject, baseline) = (bench.prepare)();
        // Warm-up: caches, allocator, lazy statics.
        subject();
        baseline();
        let (mut s, mut b) = (Vec::new(), Vec::new());
        for _ in 0..args.rounds {
            s.push(time(&*subject));
            b.push(time(&*baseline));
        }
        let (s, b) = (median(s), median(b));
        let ratio = s.as_secs_f64() / b.as_secs_f64();
        println!("{:<26} {:>14?} {:>14?} {:>7.2}x", bench.name, s, b, ratio);
        let json = serde_json::json!({
            "name": bench.name, "what": bench.what, "baseline": bench.baseline, "rounds": args.rounds,
            "subject_median_seconds": s.as_secs_f64(), "baseline_median_seconds": b.as_secs_f64(), "ratio": ratio,
        });
        std::fs::write(dir.join(format!("{}.json", bench.name)), serde_json::to_string_pretty(&json)?)?;
    }
    Ok(())
}
