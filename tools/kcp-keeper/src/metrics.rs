//! The periodic in-cluster mode's metrics: `kcp_keeper_doctor_check{check,result}` (how many lines of each check
//! had that result in the last run; all four results exported for every check seen, so a FAIL going away reads
//! 0 rather than vanishing) and the last run's time, for the alerts in `rules/doctor.rules.yaml`.

use std::collections::BTreeSet;
use std::sync::Mutex;

use kcp_keeper_runtime::metrics::{GaugeF64, Registry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::verdict::{Level, Report};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckLabels {
    pub check: String,
    pub result: String,
}

kcp_keeper_runtime::metrics! {
    /// The series of [`Metrics`].
    pub struct DoctorSeries {
        pub check: Family<CheckLabels, Gauge> => "check", "Lines of each doctor check with each result in the last run";
        pub last_run: GaugeF64 => "last_run_timestamp_seconds", "When the doctor last finished a run";
    }
}

/// The [`DoctorSeries`] and the checks seen so far (each keeps its series, all four results, once seen).
#[derive(Debug, Default)]
pub struct Metrics {
    series: DoctorSeries,
    seen: Mutex<BTreeSet<&'static str>>,
}

impl Metrics {
    /// Registers under `kcp_keeper_doctor_` in `registry` (made by `kcp_keeper_runtime::metrics::registry`).
    pub fn register(registry: &mut Registry) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self { series: DoctorSeries::register(registry), seen: Mutex::default() })
    }

    pub fn record(&self, report: &Report, now: f64) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.extend(report.checks.iter().map(|v| v.check));
        for check in seen.iter() {
            for level in [Level::Ok, Level::NotChecked, Level::Warn, Level::Fail] {
                let n = report.checks.iter().filter(|v| v.check == *check && v.result == level).count();
                let labels = CheckLabels { check: (*check).into(), result: level.label().into() };
                self.series.check.get_or_create(&labels).set(n as i64);
            }
        }
        self.series.last_run.set(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Verdict;

    #[test]
    fn every_result_of_every_seen_check_is_exported_and_a_fail_that_goes_away_reads_zero() {
        let mut registry = kcp_keeper_runtime::metrics::registry("kcp_keeper_doctor");
        let m = Metrics::register(registry.sub_registry_with_prefix("kcp_keeper_doctor"));
        let failing = Report {
            checks: vec![
                Verdict::fail("pinned-images", "shard/a", "x", "y"),
                Verdict::ok("pinned-images", "shard/b", "z"),
            ],
        };
        m.record(&failing, 10.0);
        let text = kcp_keeper_runtime::metrics::encode(&registry);
        assert!(text.contains(r#"kcp_keeper_doctor_check{check="pinned-images",result="fail"} 1"#), "{text}");
        assert!(text.contains(r#"kcp_keeper_doctor_check{check="pinned-images",result="ok"} 1"#), "{text}");
        assert!(text.contains(r#"kcp_keeper_doctor_check{check="pinned-images",result="warn"} 0"#), "{text}");
        assert!(text.contains(r#"kcp_keeper_doctor_check{check="pinned-images",result="not_checked"} 0"#), "{text}");
        assert!(text.contains("kcp_keeper_doctor_last_run_timestamp_seconds 10.0"), "{text}");
        m.record(&Report { checks: vec![Verdict::ok("readyz", "fp", "200")] }, 20.0);
        let text = kcp_keeper_runtime::metrics::encode(&registry);
        assert!(text.contains(r#"kcp_keeper_doctor_check{check="pinned-images",result="fail"} 0"#), "{text}");
        assert!(text.contains(r#"kcp_keeper_doctor_check{check="readyz",result="ok"} 1"#), "{text}");
    }
}
