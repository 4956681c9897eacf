//! `kcp-keeper doctor`: reads the cluster (and, where a check is a request, makes it) and gives one verdict per
//! check: the seeds' Verify section and the rules learned from kcp outages. The rules are pure functions in
//! [`rules`] (objects in, verdicts out); [`read`], [`verify`] and [`probe`] are the I/O around them.

#![warn(clippy::too_many_lines)]

pub mod cli;
pub mod endpoints;
pub mod kcp_access;
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
    // The command line refuses these before a client exists; a library caller gets the same refusal, unread.
    if let Err(e) = options.check_no_secrets() {
        return Report { checks: vec![Verdict::fail("read", "options", e, "remove the Secret references")] };
    }
    let mut checks = Vec::new();
    match read::layout(client, &options.namespace).await {
        Ok(layout) => checks.extend(layout_checks(client, &layout, options).await),
        Err(e) => checks.push(Verdict::fail(
            "read",
            "kcp-operator objects",
            format!("{e:#}"),
            "check --namespace and the doctor's RBAC",
        )),
    }
    let now = now();
    checks.extend(expiry_checks(client, options, now).await);
    if let Some(r) = &options.kcp_kubeconfig {
        checks.extend(endpoint_slices(client, r, options.endpoint_ca.as_ref()).await);
    } else if options.no_secrets {
        checks.push(Verdict::not_checked(
            rules::endpoint_slices::CHECK,
            "kcp",
            "listing the APIExportEndpointSlices needs a kcp credential, and this doctor reads no Secret",
            "run kcp-keeper doctor --kcp-kubeconfig from a machine with your own kubeconfig",
        ));
    }
    // Before the agents' metrics: an agent whose image cannot be pulled is why its metrics do not answer.
    if let Some(namespace) = &options.release_namespace {
        checks.extend(match read::release_pods(client, namespace, &options.release).await {
            Ok(pods) => rules::agent_pods::judge(namespace, &options.release, &pods),
            Err(e) => vec![Verdict::fail(
                rules::agent_pods::CHECK,
                format!("release {} in {namespace}", options.release),
                format!("{e:#}"),
                "check --release-namespace and the doctor's RBAC (list pods there)",
            )],
        });
    }
    checks.extend(agent_checks(options, now as f64).await);
    if let Some(namespace) = &options.network_policies {
        checks.extend(match read::network_policies(client, namespace).await {
            Ok(policies) => rules::network_policy::judge(namespace, &policies),
            Err(e) => vec![Verdict::fail(
                rules::network_policy::CHECK,
                format!("networkpolicies in {namespace}"),
                format!("{e:#}"),
                "check --network-policies and the doctor's RBAC (list networkpolicies there)",
            )],
        });
    }
    checks.extend(expiry_metrics(options, now).await);
    Report { checks }
}

/// The checks on the kcp-operator objects read: the rules on the objects, the operator's and provider's pairing
/// with kcp's version (when `--operator-deployment` or `--provider-deployment` names them), and `--verify`'s.
async fn layout_checks(client: &kube::Client, layout: &layout::Layout, options: &Options) -> Vec<Verdict> {
    let mut checks = object_checks(client, layout, options).await;
    if options.operator_deployment.is_some() || options.provider_deployment.is_some() {
        let tags: Vec<String> = layout.components.iter().filter_map(|c| c.image.tag.clone()).collect();
        let image = async |r: &Option<options::ObjectRef>| match r {
            Some(r) => Some(read::deployment_image(client, r).await),
            None => None,
        };
        let (operator, provider) =
            (image(&options.operator_deployment).await, image(&options.provider_deployment).await);
        checks.extend(rules::pairing::judge(&tags, operator.as_ref(), provider.as_ref()));
    }
    if options.verify {
        checks.extend(verify::run(client, layout, options).await);
    }
    checks
}

/// The rules on the objects alone, with the hub's OIDC settings when `--hub-oidc` names them; when those cannot
/// be read, a FAIL line for the OIDC check in place of its verdicts, and every other rule still judged.
async fn object_checks(client: &kube::Client, layout: &layout::Layout, options: &Options) -> Vec<Verdict> {
    let hub = match &options.hub_oidc {
        None => Ok(None),
        Some(source) => read::hub_oidc(client, source).await.map(Some),
    };
    match hub {
        Ok(hub) => rules::objects(layout, hub.as_ref()),
        Err(e) => {
            let mut checks = vec![Verdict::fail(
                rules::oidc::CHECK,
                "hub",
                format!("{e:#}"),
                "fix --hub-oidc or the hub's settings",
            )];
            checks.extend(rules::objects(layout, None).into_iter().filter(|v| v.check != rules::oidc::CHECK));
            checks
        }
    }
}

/// The expiry checks at `now` (Unix seconds) on what the doctor reads itself: the hub's kubeconfig
/// (`--hub-kubeconfig`, a Secret) and every CA (`--ca`, a ConfigMap or Secret key).
async fn expiry_checks(client: &kube::Client, options: &Options, now: i64) -> Vec<Verdict> {
    let mut checks = Vec::new();
    if let Some(r) = &options.hub_kubeconfig {
        let subject = format!("secret {r}");
        let todo = "renew the hub's kubeconfig (kubeconfig-rotator rotate) before it expires";
        let read = read::secret_key(client, r).await.map_err(|e| format!("{e:#}"));
        checks.push(match read.and_then(|b| expiry::kubeconfig_not_afters(&b)) {
            Ok(ends) => expiry::judge(expiry::KUBECONFIG, &subject, &ends, now, options.margins, todo),
            Err(e) => Verdict::fail(expiry::KUBECONFIG, subject, e, "check --hub-kubeconfig"),
        });
    } else if options.no_secrets && options.rotator_metrics.is_empty() {
        checks.push(Verdict::not_checked(
            expiry::KUBECONFIG,
            "kubeconfigs",
            "a kubeconfig Secret holds a client key, and this doctor reads no Secret",
            "read kubeconfig-rotator's metrics (--rotator-metrics), or run the doctor with --hub-kubeconfig yourself",
        ));
    }
    for source in &options.cas {
        let subject = source.to_string();
        let todo = "renew the CA (its cert-manager Certificate) and let ca-syncer carry old and new";
        let read = read::ca_bundle(client, source).await.map_err(|e| format!("{e:#}"));
        checks.push(match read.and_then(|b| expiry::not_afters(&b)) {
            Ok(ends) => expiry::judge(expiry::CA, &subject, &ends, now, options.margins, todo),
            Err(e) => Verdict::fail(expiry::CA, subject, e, "check --ca"),
        });
    }
    checks
}

/// The expiry checks from the agents that keep the credentials and CAs: kubeconfig-rotator's targets
/// (`--rotator-metrics`) and ca-syncer's bundles (`--ca-syncer-metrics`), at `now` (Unix seconds).
async fn expiry_metrics(options: &Options, now: i64) -> Vec<Verdict> {
    let m = options.margins;
    let mut checks = agent_metrics(
        &options.rotator_metrics,
        "--rotator-metrics",
        expiry::KUBECONFIG,
        "kubeconfig-rotator",
        |texts| expiry::judge_rotator(&expiry::rotator_targets(texts), now, m),
    )
    .await;
    checks.extend(
        agent_metrics(&options.ca_syncer_metrics, "--ca-syncer-metrics", expiry::CA, "ca-syncer", |texts| {
            expiry::judge_ca_syncer(&expiry::ca_syncer_bundles(texts), now, m)
        })
        .await,
    );
    checks
}

/// The checks judged from the agents' own metrics at `now` (Unix seconds): etcd-snapshotter's restore drill
/// (`--snapshotter-metrics`) and dns-rewriter's rules (`--rewriter-metrics`).
async fn agent_checks(options: &Options, now: f64) -> Vec<Verdict> {
    let mut checks = agent_metrics(
        &options.snapshotter_metrics,
        "--snapshotter-metrics",
        rules::restore::DRILL,
        "etcd-snapshotter",
        |texts| rules::restore::judge(&rules::restore::parse(texts.iter().map(String::as_str)), now),
    )
    .await;
    checks.extend(
        agent_metrics(
            &options.rewriter_metrics,
            "--rewriter-metrics",
            rules::dns_rules::CHECK,
            "dns-rewriter",
            |texts| {
                let read: Vec<_> = texts.iter().map(|t| rules::dns_rules::parse(t)).collect();
                rules::dns_rules::judge(&read, now)
            },
        )
        .await,
    );
    checks
}

/// Every replica's metrics: each URL's host resolved to all its addresses and read at each; the bodies, and one
/// error per address (or URL) that gave none.
async fn replicas(urls: &[String]) -> (Vec<String>, Vec<String>) {
    let (mut texts, mut errors) = (Vec::new(), Vec::new());
    for url in urls {
        match probe::get_every_address(url, Duration::from_secs(10)).await {
            Ok(bodies) => {
                for (_, body) in bodies {
                    match body {
                        Ok(text) => texts.push(text),
                        Err(e) => errors.push(format!("{e:#}")),
                    }
                }
            }
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    (texts, errors)
}

/// An agent's check from its replicas' metrics, the URLs given by `flag` (none when `urls` is empty): FAIL when no replica answered,
/// else `judge` of what did, and a warn line when some did not (the one that leads may be among them).
async fn agent_metrics(
    urls: &[String],
    flag: &str,
    check: &'static str,
    agent: &str,
    judge: impl FnOnce(&[String]) -> Vec<Verdict>,
) -> Vec<Verdict> {
    if urls.is_empty() {
        return Vec::new();
    }
    let (texts, errors) = replicas(urls).await;
    if texts.is_empty() {
        return vec![Verdict::fail(check, agent, errors.join("; "), &format!("check {flag}"))];
    }
    let mut out = judge(&texts);
    if !errors.is_empty() {
        out.push(Verdict::warn(
            check,
            agent,
            format!("{} endpoint(s) did not answer: {}", errors.len(), errors.join("; ")),
            "see the agent's pods",
        ));
    }
    out
}

/// The APIExportEndpointSlices inside kcp, through a client made from the kcp kubeconfig's server, CA and
/// credential alone; their URLs verified with `endpoint_ca`, else that kubeconfig's CA.
async fn endpoint_slices(
    client: &kube::Client,
    kubeconfig: &options::KeyRef,
    endpoint_ca: Option<&options::CaSource>,
) -> Vec<Verdict> {
    use rules::endpoint_slices::CHECK;
    let subject = format!("secret {kubeconfig}");
    let access = match read::secret_key(client, kubeconfig).await.and_then(|b| kcp_access::parse(&b)) {
        Ok(a) => a,
        Err(e) => return vec![Verdict::fail(CHECK, subject, format!("{e:#}"), "check --kcp-kubeconfig")],
    };
    let ca = match endpoint_ca {
        None => access.ca_pem.clone(),
        Some(source) => match read::ca_bundle(client, source).await {
            Ok(ca) => ca,
            Err(e) => {
                return vec![Verdict::fail(CHECK, source.to_string(), format!("{e:#}"), "check --endpoint-ca")];
            }
        },
    };
    match access.client() {
        Ok(kcp) => endpoints::check(&kcp, &ca).await,
        Err(e) => vec![Verdict::fail(CHECK, subject, format!("a client for kcp: {e:#}"), "check --kcp-kubeconfig")],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line links `docs/runbooks.md#doctor-<check>` and docs/doctor.md's table explains each check: both
    /// must exist for every check this crate emits.
    #[test]
    fn every_check_has_a_runbook_section_and_a_row_in_the_doctors_checks_table() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let runbooks = std::fs::read_to_string(root.join("docs/runbooks.md")).unwrap();
        let doctor = std::fs::read_to_string(root.join("docs/doctor.md")).unwrap();
        let checks = [
            verify::ROLLOUT,
            verify::READYZ,
            verify::ANONYMOUS,
            verify::SPLIT_HORIZON,
            rules::base_url::CHECK,
            rules::base_url::VIRTUAL_WORKSPACE,
            rules::endpoint_slices::CHECK,
            rules::restore::SNAPSHOT,
            rules::restore::DRILL,
            rules::images::PINNED,
            rules::images::PROXY,
            rules::images::LOCKSTEP,
            rules::etcd_spread::CHECK,
            rules::oidc::CHECK,
            rules::expiry::KUBECONFIG,
            rules::expiry::CA,
            rules::feature_gates::CHECK,
            rules::dns_rules::CHECK,
            rules::network_policy::CHECK,
            rules::agent_pods::CHECK,
            "read",
        ];
        for check in checks {
            assert!(runbooks.lines().any(|l| l == format!("## doctor: {check}")), "no runbook section for {check}");
            assert!(doctor.lines().any(|l| l.starts_with(&format!("| `{check}` |"))), "no docs/doctor.md row: {check}");
        }
    }
}
