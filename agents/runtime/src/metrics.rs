//! Metrics every agent exports: build info, its own memory and CPU, configuration reloads. Agents register
//! their own metrics under their prefix (`ca_syncer_...`) in the same registry.

use std::sync::atomic::AtomicU64;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::info::Info;
pub use prometheus_client::registry::{Registry, Unit};

/// Seconds since the Unix epoch, as freshness gauges hold them (alerts compute `time() - x`).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// A gauge holding an f64 (timestamps, seconds).
pub type GaugeF64 = Gauge<f64, AtomicU64>;

/// Declares a metrics struct, one line per series, and its `register`: every agent's metrics are written this way,
/// so a series' name, help, unit and label set (the `Family`'s label type) stand in one place and the
/// registration cannot drift from the fields.
///
/// ```
/// use kcp_keeper_runtime::metrics::GaugeF64;
/// use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge};
/// # #[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
/// # pub struct ShardLabel { pub shard: String }
/// kcp_keeper_runtime::metrics! {
///     /// The parts of one feature.
///     pub struct PartMetrics {
///         pub in_flight: Gauge => "parts_in_flight", "Parts uploading now";
///     }
/// }
/// kcp_keeper_runtime::metrics! {
///     pub struct SnapshotMetrics {
///         /// A field's doc comment stays on the field.
///         pub last_success: Family<ShardLabel, GaugeF64> => "last_success_timestamp" [Seconds],
///             "When the shard's last snapshot was published (0: never since start)";
///         pub failures: Family<ShardLabel, Counter> => "failures", "Snapshot runs that failed";
///         ..
///         /// A composed part registers its own series.
///         pub parts: PartMetrics;
///     }
/// }
/// let mut registry = kcp_keeper_runtime::metrics::Registry::with_prefix("demo");
/// let m = SnapshotMetrics::register(&mut registry);
/// m.parts.in_flight.set(1);
/// m.failures.get_or_create(&ShardLabel { shard: "root".into() }).inc();
/// m.last_success.get_or_create(&ShardLabel { shard: "root".into() }).set(1.5);
/// let text = kcp_keeper_runtime::metrics::encode(&registry);
/// assert!(text.contains("# UNIT demo_last_success_timestamp_seconds seconds"), "{text}");
/// assert!(text.contains("demo_failures_total{shard=\"root\"} 1"), "{text}");
/// assert!(text.contains("demo_parts_in_flight 1"));
/// ```
///
/// The unit in brackets is a `prometheus_client::registry::Unit` variant (`Seconds`, `Bytes`); the parts after
/// `..` are other declarations (or anything with a `register(&mut Registry) -> Self`), registered first.
#[macro_export]
macro_rules! metrics {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                pub $field:ident: $ty:ty => $metric:literal $([$unit:ident])?, $help:expr;
            )*
            $(
                ..
                $(
                    $(#[$part_meta:meta])*
                    pub $part:ident: $part_ty:ty;
                )*
            )?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default)]
        $vis struct $name {
            $( $(#[$field_meta])* pub $field: $ty, )*
            $($( $(#[$part_meta])* pub $part: $part_ty, )*)?
        }

        impl $crate::metrics::Register for $name {
            fn register(registry: &mut $crate::metrics::Registry) -> Self {
                <$name>::register(registry)
            }
        }

        impl $name {
            /// Registers every series declared here, and the composed parts', in `registry`.
            pub fn register(registry: &mut $crate::metrics::Registry) -> Self {
                #[allow(clippy::needless_update)]
                let m = Self { $($( $part: <$part_ty>::register(registry), )*)? ..Default::default() };
                $(
                    $crate::metrics::register_series(
                        registry,
                        $metric,
                        $help,
                        $crate::metrics!(@unit $($unit)?),
                        m.$field.clone(),
                    );
                )*
                m
            }
        }
    };
    (@unit) => { None };
    (@unit $unit:ident) => { Some($crate::metrics::Unit::$unit) };
}

/// Metrics that register themselves: every [`metrics!`] declaration, and an agent's metrics (`Agent::Metrics`),
/// which the runtime registers under the agent's prefix.
pub trait Register {
    fn register(registry: &mut Registry) -> Self;
}

/// One series of a [`metrics!`] declaration.
pub fn register_series(
    registry: &mut Registry,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    metric: impl prometheus_client::registry::Metric,
) {
    match unit {
        Some(unit) => registry.register_with_unit(name, help, unit, metric),
        None => registry.register(name, help, metric),
    }
}

/// Creates the series of `family` for every label set in `labels` at 0, so each is exported before its first
/// event (alerts see `0`, not a missing series).
pub fn at_zero<L, M>(family: &Family<L, M>, labels: impl IntoIterator<Item = L>)
where
    L: Clone + std::hash::Hash + Eq,
    M: Default,
{
    for label in labels {
        let _ = family.get_or_create(&label);
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

metrics! {
    /// Configuration reload outcomes.
    pub struct ConfigMetrics {
        pub errors: Family<ReasonLabel, Counter> => "config_reload_errors",
            "Configuration files that were not applied, by reason (read, parse, invalid)";
        pub last_success: GaugeF64 => "config_last_applied_timestamp" [Seconds],
            "When a valid configuration was last loaded";
        /// 1 from a rejected file until a valid one is applied: the state an alert needs, since a bad file is
        /// counted once (not on every poll) and the counter alone cannot say whether it is still on disk.
        pub rejected: Gauge => "config_rejected",
            "1 while the configuration file on disk was rejected and the agent runs on the last valid one \
             (the next restart would fail on it)";
    }
}

impl ConfigMetrics {
    pub fn mark_applied(&self) {
        self.last_success.set(unix_now());
        self.rejected.set(0);
    }

    pub fn reload_failed(&self, reason: &str) {
        self.errors.get_or_create(&ReasonLabel { reason: reason.into() }).inc();
        self.rejected.set(1);
    }

    /// Whether the file on disk is the rejected one (see `config_rejected`).
    pub fn rejected(&self) -> bool {
        self.rejected.get() == 1
    }

    pub fn errors(&self, reason: &str) -> u64 {
        self.errors.get_or_create(&ReasonLabel { reason: reason.into() }).get()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    commit: String,
}

/// A fresh registry with what every kcp-keeper process exports: `<prefix>_build_info` and the standard
/// `process_*` metrics. Agents add their own (and, under `agent::run`, the configuration reload metrics).
pub fn registry(prefix: &str) -> Registry {
    let mut root = Registry::default();
    root.register_collector(Box::new(ProcessCollector));
    let agent = root.sub_registry_with_prefix(prefix);
    agent.register(
        "build",
        "Version and commit of the running agent",
        Info::new(BuildLabels { version: env!("CARGO_PKG_VERSION").into(), commit: crate::COMMIT.into() }),
    );
    root
}

/// Encodes the registry as OpenMetrics text.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// The process's resident memory and CPU time, read from /proc at scrape time.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(stats) = read_proc_stats() else { return Ok(()) };
        let mut encode = |name, help, unit, metric: &dyn EncodeMetric| {
            metric.encode(encoder.encode_descriptor(name, help, Some(&unit), metric.metric_type())?)
        };
        let rss = ConstGauge::new(stats.resident_bytes as i64);
        encode("process_resident_memory", "Resident memory size", Unit::Bytes, &rss)?;
        encode("process_cpu", "User and system CPU time spent", Unit::Seconds, &ConstCounter::new(stats.cpu_seconds))
    }
}

struct ProcStats {
    resident_bytes: u64,
    cpu_seconds: f64,
}

fn read_proc_stats() -> Option<ProcStats> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (page_size, ticks) = system_units()?;
    parse_proc_stats(&statm, &stat, page_size, ticks)
}

/// The page size and clock ticks per second, from the system: 64 KiB pages on some arm64 kernels, and
/// USER_HZ is not always 100. Read once; they cannot change while the process runs.
fn system_units() -> Option<(u64, f64)> {
    use nix::unistd::{SysconfVar, sysconf};
    static UNITS: std::sync::OnceLock<Option<(u64, f64)>> = std::sync::OnceLock::new();
    *UNITS.get_or_init(|| {
        let page = sysconf(SysconfVar::PAGE_SIZE).ok()??;
        let ticks = sysconf(SysconfVar::CLK_TCK).ok()??;
        Some((u64::try_from(page).ok()?, ticks as f64))
    })
}

/// Pure parser for /proc/self/statm and /proc/self/stat (page size and clock ticks given).
fn parse_proc_stats(statm: &str, stat: &str, page_size: u64, ticks_per_second: f64) -> Option<ProcStats> {
    let resident_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // The command name (field 2) may contain spaces; fields after its closing parenthesis are fixed.
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the full line, i.e. 12 and 13 after the command.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some(ProcStats { resident_bytes: resident_pages * page_size, cpu_seconds: (utime + stime) / ticks_per_second })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stats_parse_rss_and_cpu_even_with_spaces_in_the_command() {
        let statm = "2000 300 100 10 0 500 0\n";
        let stat = "42 (my agent) S 1 42 42 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 4 0 100 1000000 300";
        let stats = parse_proc_stats(statm, stat, 4096, 100.0).unwrap();
        assert_eq!(stats.resident_bytes, 300 * 4096);
        assert!((stats.cpu_seconds - 3.0).abs() < 1e-9);
    }

    #[test]
    fn page_size_and_ticks_come_from_the_system() {
        let (page, ticks) = system_units().expect("sysconf answers on Linux");
        assert!(page.is_power_of_two() && page >= 4096, "{page}");
        assert!(ticks >= 1.0, "{ticks}");
        // The same page size the kernel reports for this process's mappings (KernelPageSize in smaps).
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let kernel_kb: u64 = smaps
            .lines()
            .find_map(|l| l.strip_prefix("KernelPageSize:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("KernelPageSize");
        assert_eq!(page, kernel_kb * 1024);
    }

    #[test]
    fn registry_exports_build_info_process_metrics_reload_counters_and_the_rejected_state() {
        let mut registry = registry("test_agent");
        let config = ConfigMetrics::register(registry.sub_registry_with_prefix("test_agent"));
        let before = encode(&registry);
        assert!(before.contains("test_agent_config_rejected 0"), "{before}");
        config.reload_failed("parse");
        let text = encode(&registry);
        assert!(text.contains("test_agent_config_rejected 1"), "{text}");
        assert!(text.contains("test_agent_build_info{version=\""), "{text}");
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
        assert!(text.contains("process_cpu_seconds_total "), "{text}");
        assert!(text.contains("test_agent_config_reload_errors_total{reason=\"parse\"} 1"), "{text}");
        assert!(text.ends_with("# EOF\n"));
        config.mark_applied();
        assert!(!config.rejected() && encode(&registry).contains("test_agent_config_rejected 0"));
    }
}
