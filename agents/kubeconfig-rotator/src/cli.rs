//! The operator one-shots, beside the runtime's `run` and `rbac`: `status` (a table of every kubeconfig) and
//! `rotate NAME` (force a renewal now). They read with plain GETs, through the same resolution the daemon uses,
//! and print nothing secret: subjects, serials, times and hashes only.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use kcp_keeper_runtime::args::KubeArgs;
use time::OffsetDateTime;

use crate::config::{Config, Kubeconfig, Source, certificate_name};
use crate::credential::rfc3339;
use crate::policy::Live;
use crate::renew;
use crate::scope::Reader;
use crate::source::{candidate, resolve};
use crate::target::live_state;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Print every kubeconfig: subject, notAfter, time left, and whether each target is in sync.
    Status {
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Force a new certificate for kubeconfig NAME now (Issuing=True on its Certificate, as `cmctl renew`).
    Rotate {
        name: String,
        #[arg(long, env = "KCP_KEEPER_CONFIG")]
        config: PathBuf,
        #[command(flatten)]
        kube: KubeArgs,
    },
}

/// Runs one of [`Command`]; a failure is an error (exit 1), never a silent exit code.
pub async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Status { config, kube } => status(&config, &kube).await?,
        Command::Rotate { name, config, kube } => rotate(&config, &kube, &name).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// One row of `status`, for each target of a kubeconfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub kubeconfig: String,
    pub subject: String,
    pub not_after: String,
    pub time_left: String,
    pub target: String,
    pub in_sync: &'static str,
}

/// `kubeconfig-rotator status`.
pub async fn status(config_path: &Path, kube: &KubeArgs) -> anyhow::Result<()> {
    let config: Config = kcp_keeper_runtime::config::load(config_path)?;
    let client = kube.client().await?;
    let now = OffsetDateTime::now_utc();
    let mut rows = Vec::new();
    for kc in &config.kubeconfigs {
        rows.extend(status_rows(&client, kc, now).await);
    }
    print!("{}", table(&rows));
    Ok(())
}

async fn status_rows(client: &kube::Client, kc: &Kubeconfig, now: OffsetDateTime) -> Vec<Row> {
    let snap = match Reader::Client(client).snapshot(kc).await {
        Ok(s) => s,
        Err(e) => return vec![row(kc, &format!("(unreadable: {})", api_reason(&e)), "-", "-", "-", "-")],
    };
    let current = resolve(kc, &snap).map_err(|e| e.to_string()).and_then(|s| match &s.missing {
        Some(missing) => Err(format!("{missing} not found")),
        None => candidate(kc, &s, now).map_err(|e| e.to_string()),
    });
    let (subject, not_after, left, hash) = match &current {
        Ok(c) => (c.cert.subject(), rfc3339(c.cert.not_after), human(c.cert.not_after - now), Some(c.hash())),
        Err(e) => (format!("(no usable source: {e})"), "-".into(), "-".into(), None),
    };
    snap.targets(kc)
        .iter()
        .map(|t| {
            let in_sync = match (live_state(snap.secret(&t.namespace, &t.name), t, now), &hash) {
                (Live::Missing, _) => "missing",
                (Live::Unusable, _) => "unusable",
                (Live::Valid { hash: h, .. }, Some(current)) if h == *current => "yes",
                (Live::Valid { .. }, _) => "no",
            };
            row(kc, &subject, &not_after, &left, &format!("{}/{} ({})", t.namespace, t.name, t.key), in_sync)
        })
        .collect()
}

fn row(kc: &Kubeconfig, subject: &str, not_after: &str, left: &str, target: &str, in_sync: &'static str) -> Row {
    Row {
        kubeconfig: kc.name.clone(),
        subject: subject.into(),
        not_after: not_after.into(),
        time_left: left.into(),
        target: target.into(),
        in_sync,
    }
}

/// An apiserver error as its code and reason, without its message.
fn api_reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}", s.code, s.reason),
        _ => "apiserver unreachable".into(),
    }
}

/// Aligned columns under a header.
pub fn table(rows: &[Row]) -> String {
    let header = ["KUBECONFIG", "SUBJECT", "NOT AFTER", "TIME LEFT", "TARGET", "IN SYNC"];
    let cells: Vec<[&str; 6]> = rows
        .iter()
        .map(|r| [r.kubeconfig.as_str(), &r.subject, &r.not_after, &r.time_left, &r.target, r.in_sync])
        .collect();
    let mut widths = header.map(str::len);
    for c in &cells {
        for (w, cell) in widths.iter_mut().zip(c) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |c: [&str; 6]| {
        let parts: Vec<String> = c.iter().zip(widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        format!("{}\n", parts.join("  ").trim_end())
    };
    std::iter::once(line(header)).chain(cells.into_iter().map(line)).collect()
}

/// `1h02m`, `4m05s`, `expired`.
pub fn human(left: time::Duration) -> String {
    let s = left.whole_seconds();
    match s {
        ..=0 => "expired".into(),
        1..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..172_800 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// `kubeconfig-rotator rotate NAME`: forces cert-manager to issue a new certificate now, the cmctl way; the
/// running agent then re-renders, proves and publishes it as for any renewal.
pub async fn rotate(config_path: &Path, kube: &KubeArgs, name: &str) -> anyhow::Result<()> {
    let config: Config = kcp_keeper_runtime::config::load(config_path)?;
    let kc = config.find(name).with_context(|| format!("no kubeconfig named {name:?} in the configuration"))?;
    let Source::Operator { namespace, name: object, .. } = &kc.source else {
        anyhow::bail!(
            "kubeconfig {name} has a {} source: only a kcp-operator Kubeconfig can be re-issued by the agent",
            kc.source.kind()
        );
    };
    let client = kube.client().await?;
    let snap = Reader::Client(&client).snapshot(kc).await.context("reading the Certificate")?;
    let certificate =
        snap.certificate.with_context(|| format!("Certificate {namespace}/{} not found", certificate_name(object)))?;
    if certificate.issuing() {
        println!("kubeconfig {name}: a renewal is already under way (Issuing=True); nothing to do");
        return Ok(());
    }
    renew::force_renewal(&client, &certificate).await?;
    println!(
        "kubeconfig {name}: renewal forced (Issuing=True on Certificate {namespace}/{}); the agent publishes the new certificate once it is proven",
        certificate_name(object)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_boolean_environment_variable_takes_1_0_true_false_yes_no() {
        let command = kcp_keeper_runtime::cli::command::<crate::KubeconfigRotator>();
        let checked = kcp_keeper_runtime::args::boolean_env::check(&command).unwrap();
        assert!(checked.iter().any(|c| c == "KCP_KEEPER_LEADER_ELECTION"), "{checked:?}");
    }

    #[test]
    fn time_left_reads_in_the_largest_useful_units() {
        assert_eq!(human(time::Duration::seconds(-3)), "expired");
        assert_eq!(human(time::Duration::seconds(245)), "4m05s");
        assert_eq!(human(time::Duration::seconds(3720)), "1h02m");
        assert_eq!(human(time::Duration::days(365) + time::Duration::hours(6)), "365d06h");
    }

    #[test]
    fn the_table_aligns_columns_under_the_header() {
        let r = Row {
            kubeconfig: "hub".into(),
            subject: "CN=kcp-admin".into(),
            not_after: "2026-01-01T00:00:00Z".into(),
            time_left: "1h02m".into(),
            target: "rg/railgrid-kcp (admin.kubeconfig)".into(),
            in_sync: "yes",
        };
        let t = table(&[r]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0].find("SUBJECT"), lines[1].find("CN=kcp-admin"));
        assert_eq!(lines[0].find("IN SYNC"), lines[1].find("yes"));
    }
}
