//! `ca-sync`: one change to a source CA propagated by ca-syncer to the target Secret in each of 200 namespaces
//! picked by a namespace selector: time until the last target holds the new certificate, the requests the agent
//! sent (audit log, by its own user) and its peak memory. Baseline, in alternate rounds of the same run: the
//! apiserver's own limit, the same 200 Secrets, prepared in advance, server-side-applied by a minimal kube-rs
//! client at the same concurrency (ca-syncer writes a bundle's targets one after another, so one in flight).
//! Both are timed the same way: from the change until a watch has seen the last of the 200 updated. Every
//! target namespace also holds an unrelated Secret and ConfigMap; the agent must never read them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use testbed::agent_process::AgentUnderTest;
use testbed::certs::Ca;

use crate::common::{self, MIB, Report, Row};

const NAMESPACES: usize = 200;
const LABEL: (&str, &str) = ("bench.kcp-keeper.io/trust", "kcp");
const SOURCE_NS: &str = "ca-source";
const AGENT_NS: &str = "ca-syncer";
const TARGET: &str = "kcp-ca";
const RAW: &str = "kcp-ca-raw";
const USER: &str = "bench-ca-syncer";

/// When each (namespace, name) Secret was last seen, by a watch, holding which `ca.crt`.
type Seen = Arc<Mutex<HashMap<(String, String), (String, Instant)>>>;

pub async fn run(rounds: usize) -> Result<Report> {
    eprintln!("ca-sync: starting etcd and kube-apiserver; creating {NAMESPACES} namespaces");
    let bed = testbed::ControlPlane::start().await?;
    let client = bed.client();
    bed.create_namespace(SOURCE_NS).await?;
    bed.create_namespace(AGENT_NS).await?;
    let namespaces: Vec<String> = (0..NAMESPACES).map(|i| format!("tenant-{i:03}")).collect();
    for ns in &namespaces {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.clone()),
                labels: Some(BTreeMap::from([(LABEL.0.into(), LABEL.1.into())])),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await?;
        // What else lives in a tenant namespace, which ca-syncer has no business reading.
        let unrelated = Secret {
            metadata: meta("app-credentials"),
            string_data: Some(BTreeMap::from([("password".into(), "not for ca-syncer".into())])),
            ..Default::default()
        };
        Api::<Secret>::namespaced(client.clone(), ns).create(&PostParams::default(), &unrelated).await?;
        let config = ConfigMap {
            metadata: meta("app-config"),
            data: Some(BTreeMap::from([("k".into(), "v".into())])),
            ..Default::default()
        };
        Api::<ConfigMap>::namespaced(client.clone(), ns).create(&PostParams::default(), &config).await?;
    }
    let root = Ca::new("bench root CA", Duration::from_secs(30 * 24 * 3600))?;
    let sources = Api::<Secret>::namespaced(client.clone(), SOURCE_NS);
    let first = root.intermediate("bench serving CA 0", Duration::from_secs(7 * 24 * 3600))?;
    sources.create(&PostParams::default(), &source(&root, &first)).await?;

    let seen: Seen = Arc::default();
    let watch = tokio::spawn(watch_secrets(client.clone(), seen.clone()));

    let config = bed.subdir("ca-syncer")?.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "bundles:\n- name: kcp\n  sources:\n  - secret: {{namespace: {SOURCE_NS}, name: root-ca, key: tls.crt}}\n  \
             - secret: {{namespace: {SOURCE_NS}, name: root-ca, key: ca.crt}}\n  targets:\n  - secret: {{name: {TARGET}, \
             key: ca.crt, namespaceSelector: {{matchLabels: {{{}: {}}}}}}}\n",
            LABEL.0, LABEL.1
        ),
    )?;
    let kubeconfig = bed.apiserver.user_kubeconfig(USER, &["system:masters"], Duration::from_secs(24 * 3600))?;
    let binary = common::agent_binary("ca-syncer")?;
    let env = [("KCP_KEEPER_LOG_FORMAT", "plain")];
    let agent = AgentUnderTest::new(&bed, &binary, &config).kubeconfig(&kubeconfig).namespace(AGENT_NS);
    let mut agent = agent.identity("ca-syncer").envs(&env).ready_within(Duration::from_secs(60)).start().await?;
    let pid = agent.process.pid().context("ca-syncer exited")?;
    let started = Instant::now();
    wait_all(&seen, &namespaces, TARGET, &marker(&first), started).await.context("the first sync")?;
    let rss_after_first_sync = common::status_bytes(pid, "VmRSS").unwrap_or_default();

    let (mut ours, mut raw, mut requests) = (Vec::new(), Vec::new(), Vec::new());
    let mut breakdown: BTreeMap<(String, String), f64> = BTreeMap::new();
    for round in 0..rounds {
        eprintln!("ca-sync: round {}/{rounds}", round + 1);
        let ca = root.intermediate(&format!("bench serving CA {}", round + 1), Duration::from_secs(7 * 24 * 3600))?;
        let before = testbed::audit::count(&bed.apiserver.audit_log, USER)?;
        let t0 = Instant::now();
        sources.replace("root-ca", &PostParams::default(), &source(&root, &ca)).await?;
        ours.push(wait_all(&seen, &namespaces, TARGET, &marker(&ca), t0).await?);
        // The agent's requests for this change: what it sent from the change until the last target was written.
        let after = testbed::audit::count(&bed.apiserver.audit_log, USER)?;
        breakdown = after
            .iter()
            .map(|(k, n)| (k.clone(), (n - before.get(k).copied().unwrap_or(0)) as f64))
            .filter(|(_, n)| *n > 0.0)
            .collect();
        requests.push(total(&after) - total(&before));

        // The baseline writes what the agent wrote: the same bundle text, prepared before the clock starts.
        let bundle = Api::<Secret>::namespaced(client.clone(), &namespaces[0])
            .get(TARGET)
            .await?
            .data
            .and_then(|d| d.get("ca.crt").cloned())
            .context("the target's ca.crt")?;
        let prepared: Vec<(Api<Secret>, Secret)> = namespaces
            .iter()
            .map(|ns| {
                let secret = Secret {
                    metadata: meta(RAW),
                    data: Some(BTreeMap::from([("ca.crt".to_string(), bundle.clone())])),
                    ..Default::default()
                };
                (Api::<Secret>::namespaced(client.clone(), ns), secret)
            })
            .collect();
        let params = PatchParams::apply("bench-raw-apply").force();
        let t0 = Instant::now();
        for (api, secret) in &prepared {
            api.patch(RAW, &params, &Patch::Apply(secret)).await?;
        }
        let marker_text = String::from_utf8_lossy(&bundle.0).into_owned();
        raw.push(wait_all(&seen, &namespaces, RAW, &marker_text, t0).await?);
    }
    let hwm = common::status_bytes(pid, "VmHWM").context("VmHWM")?;
    agent.terminate(Duration::from_secs(10));
    watch.abort();
    let unrelated = unrelated_reads(&bed)?;

    let (o, r) = (common::median(&ours), common::median(&raw));
    let req = common::median(&requests);
    let rows = vec![
        Row::new(format!("time to the last of {NAMESPACES} targets updated (median)"), common::secs(o))
            .baseline(common::secs(r), o / r)
            .target(if o / r <= 1.5 {
                "<= 1.5".into()
            } else {
                format!("<= 1.5: missed by {:.0}%", (o / r / 1.5 - 1.0) * 100.0)
            }),
        Row::new("requests sent by the agent per change (audit log)", format!("{req:.0}"))
            .baseline(format!("{NAMESPACES}"), req / NAMESPACES as f64),
        Row::new("agent peak RSS (VmHWM)", format!("{:.1} MiB", hwm as f64 / MIB)),
        Row::new("reads of unrelated objects by the agent (audit log)", unrelated.len().to_string()).target("0"),
    ];
    Ok(Report {
        rows,
        json: json!({
            "namespaces": NAMESPACES, "rounds": rounds, "concurrency": 1,
            "agent_seconds": ours, "raw_apply_seconds": raw, "ratio": o / r,
            "agent_requests_per_change": requests,
            "agent_requests_last_change_by_verb": common::by_verb_json(&breakdown), "agent_peak_rss_bytes": hwm,
            "agent_rss_after_first_sync_bytes": rss_after_first_sync,
            "unrelated_reads": unrelated,
        }),
    })
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.into()), ..Default::default() }
}

/// A cert-manager-shaped CA Secret: the serving CA in `tls.crt`, its root in `ca.crt`.
fn source(root: &Ca, ca: &Ca) -> Secret {
    Secret {
        metadata: meta("root-ca"),
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            ("tls.crt".to_string(), ByteString(ca.cert_pem().into_bytes())),
            ("ca.crt".to_string(), ByteString(root.cert_pem().into_bytes())),
            ("tls.key".to_string(), ByteString(ca.key_pem().into_bytes())),
        ])),
        ..Default::default()
    }
}

/// A line of the certificate's base64 that no other certificate here has (it holds the random serial).
fn marker(ca: &Ca) -> String {
    ca.cert_pem().lines().nth(1).unwrap_or_default().to_string()
}

async fn watch_secrets(client: kube::Client, seen: Seen) {
    let api = Api::<Secret>::all(client);
    let mut events = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
    while let Some(event) = events.next().await {
        let objects = match event {
            Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => vec![s],
            _ => continue,
        };
        let now = Instant::now();
        let mut seen = seen.lock().expect("not poisoned");
        for s in objects {
            let key = (s.metadata.namespace.clone().unwrap_or_default(), s.metadata.name.clone().unwrap_or_default());
            let text = s.data.and_then(|d| d.get("ca.crt").map(|v| String::from_utf8_lossy(&v.0).into_owned()));
            seen.insert(key, (text.unwrap_or_default(), now));
        }
    }
}

/// Waits until every namespace's `name` Secret holds `marker`; seconds from `t0` to the last one seen.
async fn wait_all(seen: &Seen, namespaces: &[String], name: &str, marker: &str, t0: Instant) -> Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        {
            let seen = seen.lock().expect("not poisoned");
            let times: Option<Vec<Instant>> = namespaces
                .iter()
                .map(|ns| {
                    seen.get(&(ns.clone(), name.to_string())).filter(|(text, _)| text.contains(marker)).map(|(_, t)| *t)
                })
                .collect();
            if let Some(times) = times {
                let last = times.into_iter().max().unwrap_or(t0);
                return Ok(last.saturating_duration_since(t0).as_secs_f64());
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "not every {name} updated within 300s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn total(counts: &BTreeMap<(String, String), usize>) -> f64 {
    counts.values().sum::<usize>() as f64
}

/// The agent's reads of Secrets and ConfigMaps other than its source, its targets and its own state: by name,
/// or by a list or watch not narrowed to one name.
fn unrelated_reads(bed: &testbed::ControlPlane) -> Result<Vec<String>> {
    let requests = testbed::audit::by_user(&bed.apiserver.audit_log, USER)?;
    Ok(requests
        .into_iter()
        .filter(|r| matches!(r.resource.as_str(), "secrets" | "configmaps") && !r.is_write())
        .filter(|r| match &r.name {
            Some(name) => !(name == "root-ca" || name == TARGET || r.namespace.as_deref() == Some(AGENT_NS)),
            None => !r.uri.contains("fieldSelector=metadata.name") && r.namespace.as_deref() != Some(AGENT_NS),
        })
        .map(|r| format!("{} {}", r.verb, r.uri))
        .collect())
}
