//! `ca-bundle-public-roots`: the one in-process micro-benchmark. ca-syncer's strict parse, dedupe, order and
//! render of the public roots against the least any tool must do to read the same text.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ca_syncer::bundle::{Bundle, BundleOptions};
use ca_syncer::certs::{EmptyPolicy, parse_certificates};
use serde_json::json;

use crate::common::{Report, Row};

pub const WHAT: &str =
    "strict parse + dedupe + order + render of the ~150 public roots, twice over (300 certificates in)";
pub const BASELINE: &str = "pem::parse_many + x509-parser on the same text: the least any tool must do to read it";

pub fn run(rounds: usize) -> Report {
    let once = Bundle::build(ca_syncer::sources::public_roots(), &options()).render();
    let input = format!("{once}{once}").into_bytes();
    let subject = || {
        let certs = parse_certificates(&input, EmptyPolicy::Reject).expect("valid roots");
        black_box(Bundle::build(certs, &options()).render());
    };
    let baseline = || {
        for block in pem::parse_many(&input).expect("valid PEM") {
            black_box(x509_parser::parse_x509_certificate(block.contents()).expect("valid DER"));
        }
    };
    // Warm-up: caches, allocator, lazy statics.
    subject();
    baseline();
    let (mut s, mut b) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        s.push(time(&subject));
        b.push(time(&baseline));
    }
    let (s, b) = (median(s), median(b));
    let ratio = s.as_secs_f64() / b.as_secs_f64();
    Report {
        rows: vec![Row::new("bundle build (median)", format!("{s:.1?}")).baseline(format!("{b:.1?}"), ratio)],
        json: json!({
            "what": WHAT, "baseline": BASELINE, "rounds": rounds,
            "subject_median_seconds": s.as_secs_f64(), "baseline_median_seconds": b.as_secs_f64(), "ratio": ratio,
        }),
    }
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
