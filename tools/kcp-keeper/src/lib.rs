//! `kcp-keeper doctor`: reads the cluster (and, where a check is a request, makes it) and gives one verdict per
//! check: the seeds' Verify section and the rules learned from kcp outages. The rules are pure functions in
//! [`rules`] (objects in, verdicts out); [`read`], [`verify`] and [`probe`] are the I/O around them.

pub mod cli;
pub mod layout;
pub mod metrics;
pub mod options;
pub mod probe;
pub mod read;
pub mod rules;
pub mod verdict;
pub mod verify;

use std::time::Duration;

use options::Options;
use rules::expiry;
use verdict::{Report, Verdict};

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// Every check `options` asks for. A read that fails is a FAIL line of its own; the other checks still run.
pub async fn run(client: &kube::Client, options: &Options) -> Report {
    let mut checks = Vec::new();
    let layout = match read::layout(client, &options.namespace).await {
        Ok(l) => Some(l),
        Err(e) => {
            checks.push(Verdict::fail(
                "read",
                "kcp-operator objects",
                format!("{e:#}"),
                "check --namespace and the doctor's RBAC",
            ));
            None
        }
    };
    if let Some(layout) = &layout {
        let hub = match &options.hub_oidc {
            None => Ok(None),
            Some(source) => read::hub_oidc(client, source).await.map(Some),
        };
        match hub {
            Ok(hub) => checks.extend(rules::objects(layout, hub.as_ref())),
            Err(e) => {
                checks.push(Verdict::fail(
                    rules::oidc::CHECK,
                    "hub",
                    format!("{e:#}"),
                    "fix --hub-oidc or the hub's settings",
                ));
                checks.extend(rules::objects(layout, None).into_iter().filter(|v| v.check != rules::oidc::CHECK));
            }
        }
        if options.verify {
            checks.extend(verify::run(client, layout, options).await);
        }
    }
    let now = now();
    if let Some(r) = &options.hub_kubeconfig {
        let subject = format!("secret {r}");
        let todo = "renew the hub's kubeconfig (kubeconfig-rotator rotate) before it expires";
        checks.push(
            match read::secret_key(client, r)
                .await
                .map_err(|e| format!("{e:#}"))
                .and_then(|b| expiry::kubeconfig_not_afters(&b))
            {
                Ok(ends) => expiry::judge(expiry::KUBECONFIG, &subject, &ends, now, options.margins, todo),
                Err(e) => Verdict::fail(expiry::KUBECONFIG, subject, e, "check --hub-kubeconfig"),
            },
        );
    }
    for r in &options.cas {
        let subject = format!("secret {r}");
        let todo = "renew the CA (its cert-manager Certificate) and let ca-syncer carry old and new";
        checks.push(
            match read::secret_key(client, r).await.map_err(|e| format!("{e:#}")).and_then(|b| expiry::not_afters(&b)) {
                Ok(ends) => expiry::judge(expiry::CA, &subject, &ends, now, options.margins, todo),
                Err(e) => Verdict::fail(expiry::CA, subject, e, "check --ca"),
            },
        );
    }
    if let Some(url) = &options.snapshotter_metrics {
        match probe::get_plain(url, Duration::from_secs(10)).await {
            Ok(text) => checks.extend(rules::restore::judge(&rules::restore::parse(&text), now as f64)),
            Err(e) => checks.push(Verdict::fail(
                rules::restore::DRILL,
                "etcd-snapshotter",
                format!("{e:#}"),
                "check --snapshotter-metrics",
            )),
        }
    }
    Report { checks }
}
