//! What every benchmark shares: agent binaries next to this one, timing child processes with their peak
//! resident memory, the apiserver's own request counters, and the table and JSON a benchmark reports.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

pub const MIB: f64 = 1024.0 * 1024.0;

/// One line of the printed table: a measure of ours next to its baseline (if it has one) and the target.
pub struct Row {
    pub measure: String,
    pub ours: String,
    pub baseline: String,
    pub ratio: Option<f64>,
    pub target: String,
}

impl Row {
    pub fn new(measure: impl Into<String>, ours: impl Into<String>) -> Self {
        Self { measure: measure.into(), ours: ours.into(), baseline: "-".into(), ratio: None, target: "-".into() }
    }

    pub fn baseline(mut self, baseline: impl Into<String>, ratio: f64) -> Self {
        self.baseline = baseline.into();
        self.ratio = Some(ratio);
        self
    }

    pub fn target(mut self, target: impl Into<String>) -> Self {
        self.target = target.into();
        self
    }
}

/// What a benchmark hands back: its rows and the full figures for `target/bench/<name>.json`.
pub struct Report {
    pub rows: Vec<Row>,
    pub json: serde_json::Value,
}

/// An agent binary built next to this one (`cargo xtask bench` builds them in release first), or in
/// `KCP_KEEPER_BENCH_AGENTS` when set: the images' static musl binaries, say, to measure what ships.
pub fn agent_binary(name: &str) -> Result<PathBuf> {
    let dir = match std::env::var_os("KCP_KEEPER_BENCH_AGENTS") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::current_exe()?.parent().context("the bench binary has no directory")?.to_path_buf(),
    };
    let path = dir.join(name);
    anyhow::ensure!(path.exists(), "{} is not built (run `cargo xtask bench`, which builds it)", path.display());
    Ok(path)
}

/// A field of `/proc/<pid>/status` in bytes (`VmRSS`, `VmHWM`); None once the process is gone or a zombie.
pub fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    Some(line.trim().trim_end_matches("kB").trim().parse::<u64>().ok()? * 1024)
}

/// Where a process's resident memory is, from `/proc/<pid>/smaps`: `Rss` summed by mapping kind (`heap` for
/// the brk heap, `anonymous` for mmapped memory, which holds allocator arenas and large allocations, `stack`,
/// `binary` for the executable's own pages, `other` files). The cheap profile of an idle process.
pub fn resident_by_kind(pid: u32) -> BTreeMap<String, u64> {
    let mut kinds = BTreeMap::new();
    let Ok(smaps) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) else { return kinds };
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.display().to_string()).unwrap_or_default();
    let mut kind = String::new();
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or_default();
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            // A mapping's header: address range, perms, offset, device, inode, then the path if any.
            let path = fields.nth(4).unwrap_or_default();
            kind = match path {
                "" => "anonymous".into(),
                "[heap]" => "heap".into(),
                p if p.starts_with("[stack") => "stack".into(),
                p if p == exe => "binary".into(),
                _ => "other".into(),
            };
        } else if first == "Rss:" {
            let kib: u64 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            *kinds.entry(kind.clone()).or_insert(0) += kib * 1024;
        }
    }
    kinds
}

/// Samples a process's high-water mark (`VmHWM`, which the kernel keeps itself) every 10 ms until it exits or
/// [`PeakWatch::finish`] is called; the last sample before exit holds the peak up to then.
pub struct PeakWatch {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<u64>,
}

impl PeakWatch {
    pub fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut peak = 0;
            while !flag.load(Ordering::Relaxed) {
                match status_bytes(pid, "VmHWM") {
                    Some(hwm) => peak = peak.max(hwm),
                    None => break,
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        });
        Self { stop, handle }
    }

    pub fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// A finished child process: wall time, peak resident memory, and the CPU time it (and the children it waited
/// for) used: CPU near wall time × cores means it was busy; far below, it was waiting.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    pub seconds: f64,
    pub peak_bytes: u64,
    pub cpu_seconds: f64,
}

impl Run {
    /// Every round's figures, for `target/bench/<name>.json`.
    pub fn json(runs: &[Run]) -> Vec<serde_json::Value> {
        runs.iter()
            .map(|r| serde_json::json!({"seconds": r.seconds, "peak_rss_bytes": r.peak_bytes, "cpu_seconds": r.cpu_seconds}))
            .collect()
    }
}

/// User plus system time of this process's reaped children so far.
pub fn children_cpu_seconds() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(0.0, |u| {
        let (user, system) = (u.user_time(), u.system_time());
        user.tv_sec() as f64 + system.tv_sec() as f64 + (user.tv_usec() + system.tv_usec()) as f64 / 1e6
    })
}

/// Runs `cmd` to completion (it must succeed), timing it and watching its peak memory and CPU time (the
/// children's usage before and after: benchmarks run one such command at a time).
pub fn run(cmd: &mut Command, what: &str) -> Result<Run> {
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let cpu_before = children_cpu_seconds();
    let started = Instant::now();
    let child = cmd.spawn().with_context(|| format!("starting {what}"))?;
    let watch = PeakWatch::start(child.id());
    let out = child.wait_with_output()?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = children_cpu_seconds() - cpu_before;
    let peak_bytes = watch.finish();
    anyhow::ensure!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(Run { seconds, peak_bytes, cpu_seconds })
}

pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

pub fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(0.0, f64::max)
}

/// `apiserver_request_total` from the apiserver's own `/metrics`, summed by (verb, resource); non-resource
/// requests (`/metrics`, `/readyz`) have an empty resource.
pub async fn apiserver_requests(client: &kube::Client) -> Result<BTreeMap<(String, String), f64>> {
    let text = client.request_text(http::Request::get("/metrics").body(Vec::new())?).await?;
    Ok(parse_request_totals(&text))
}

fn parse_request_totals(text: &str) -> BTreeMap<(String, String), f64> {
    let mut totals = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default()
                .to_string()
        };
        // `,resource="` must not match `subresource="`.
        let resource = labels
            .split(",resource=\"")
            .nth(1)
            .or_else(|| labels.split("{resource=\"").nth(1))
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_default()
            .to_string();
        *totals.entry((label("verb"), resource)).or_insert(0.0) += value;
    }
    totals
}

/// `after - before`, per key, leaving out keys that did not move.
pub fn delta(
    before: &BTreeMap<(String, String), f64>,
    after: &BTreeMap<(String, String), f64>,
) -> BTreeMap<(String, String), f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

pub fn is_write_verb(verb: &str) -> bool {
    matches!(verb.to_ascii_uppercase().as_str(), "POST" | "PUT" | "PATCH" | "DELETE" | "APPLY" | "CREATE" | "UPDATE")
        || matches!(verb, "deletecollection")
}

/// `{"GET secrets": 3, ...}` for the JSON report.
pub fn by_verb_json(counts: &BTreeMap<(String, String), f64>) -> serde_json::Value {
    counts.iter().map(|((verb, resource), n)| (format!("{verb} {resource}"), serde_json::json!(n))).collect()
}

pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB)
}

pub fn secs(s: f64) -> String {
    if s < 1.0 { format!("{:.0} ms", s * 1000.0) } else { format!("{s:.2} s") }
}

/// The load average now (1, 5, 15 minutes), for the report.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn request_totals_sum_by_verb_and_resource_without_taking_subresource_for_resource() {
        let text = "apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"secrets\",scope=\"namespace\",subresource=\"\",verb=\"GET\",version=\"v1\"} 3\n\
apiserver_request_total{code=\"404\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"secrets\",scope=\"namespace\",subresource=\"\",verb=\"GET\",version=\"v1\"} 2\n\
apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"namespace\",subresource=\"status\",verb=\"PATCH\",version=\"v1\"} 1\n";
        let totals = super::parse_request_totals(text);
        assert_eq!(totals[&("GET".into(), "secrets".into())], 5.0);
        assert_eq!(totals[&("PATCH".into(), "pods".into())], 1.0);
    }
}
