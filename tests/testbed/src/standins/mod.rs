//! Stand-ins for the two controllers that cannot run in the test bed: cert-manager's (its controller does not
//! build here) and the kcp-operator's Kubeconfig controller (the module proxy refuses the operator). Each plays
//! its part through the real API, on the real CRDs, as the real one does it (see DESIGN.md section 2), and is
//! named a stand-in wherever it appears: its field manager, its log lines, its Events' absence.
//!
//! - [`issuer`]: the **issuer stand-in** (cert-manager's part): signs Certificates with a CA, writes their Secret,
//!   sets Ready, notAfter, renewalTime and revision, and re-issues on `Issuing=True` or at renewal time.
//! - [`renderer`]: the **renderer stand-in** (the kcp-operator's part): creates a Kubeconfig's Certificate and
//!   renders its kubeconfig Secret, with the operator's lag: only when the Kubeconfig object changes, or on a slow
//!   resync.
//!
//! Both poll the apiserver every [`POLL`] (a controller's watch, simplified) and run until dropped.

pub mod issuer;
pub mod renderer;

use std::time::Duration;

use kube::core::{ApiResource, GroupVersionKind};

/// How often a stand-in looks at its objects.
pub const POLL: Duration = Duration::from_millis(250);

pub fn certificate_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate"), "certificates")
}

pub fn kubeconfig_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("operator.kcp.io", "v1alpha1", "Kubeconfig"),
        "kubeconfigs",
    )
}

pub fn front_proxy_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("operator.kcp.io", "v1alpha1", "FrontProxy"),
        "frontproxies",
    )
}

/// A stand-in's task; dropping it stops the stand-in.
pub struct StandIn(tokio::task::JoinHandle<()>);

impl Drop for StandIn {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A Go duration as cert-manager and the operator write them (`8766h`, `2m0s`, `90s`): hours, minutes, seconds.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = 0u64;
    let mut number = String::new();
    for c in text.chars() {
        match c {
            '0'..='9' => number.push(c),
            'h' | 'm' | 's' => {
                let n: u64 = std::mem::take(&mut number).parse().ok()?;
                total += n * match c {
                    'h' => 3600,
                    'm' => 60,
                    _ => 1,
                };
            }
            _ => return None,
        }
    }
    number.is_empty().then_some(Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_in_hours_minutes_and_seconds_parse() {
        assert_eq!(parse_duration("8766h"), Some(Duration::from_secs(8766 * 3600)));
        assert_eq!(parse_duration("2m0s"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("90"), None);
        assert_eq!(parse_duration("1d"), None);
    }
}
