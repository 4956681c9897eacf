//! `ca-sync`: one change to a source CA propagated by ca-syncer to the target of each of 200 namespaces (or
//! `--ca-namespaces`) picked by a namespace selector, once into a ConfigMap and once into a Secret: time until the
//! last target holds the new certificate, the requests the agent sent (audit log, by its own user; against the one
//! write per target the raw apply loop sends) and its peak memory. In alternate rounds of the same run, for each target kind: the floor, the same objects, prepared in
//! advance, server-side-applied by a minimal kube-rs client at the same concurrency (ca-syncer writes a bundle's
//! targets one after another, so one in flight), and the anchor, trust-manager (what a user would install instead;
//! see `trust_manager.rs`) with a `Bundle` of the same two sources and the same namespace selector. All are timed
//! the same way: from the change until a watch has seen the last target updated. Every target namespace also holds
//! an unrelated Secret and ConfigMap; the agent must never read them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use testbed::agent_process::AgentUnderTest;
use testbed::certs::Ca;

use crate::common::{self, Report, Row};
use crate::curve;
use crate::trust_manager;

/// Tenant namespaces unless `--ca-namespaces` says otherwise (the targets are stated at 200 and at 1000).
pub const NAMESPACES: usize = 200;
const LABEL: (&str, &str) = ("bench.kcp-keeper.io/trust", "kcp");
const SOURCE_NS: &str = "ca-source";
const TARGET: &str = "kcp-ca";
const RAW: &str = "kcp-ca-raw";
/// trust-manager's Bundle, and so its targets' name.
const ANCHOR: &str = "kcp-ca-trust-manager";
const USER: &str = "bench-ca-syncer";

/// When each (kind, namespace, name) target was last seen, by a watch, holding which `ca.crt`.
type Seen = Arc<Mutex<HashMap<(Kind, String, String), (String, Instant)>>>;

/// The agent's namespace (its Lease and state) for one target kind: a fresh one per kind, so the second agent
/// does not wait for the first one's Lease.
fn agent_ns(kind: Kind) -> String {
    format!("ca-syncer-{}", kind.key())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    ConfigMap,
    Secret,
}

impl Kind {
    fn key(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::ConfigMap => "ConfigMap",
            Kind::Secret => "Secret",
        }
    }
}

/// Every figure of one target kind.
pub struct Measured {
    pub kind: Kind,
    pub ours: Vec<f64>,
    pub raw: Vec<f64>,
    /// Empty when trust-manager was not run (the scale curve leaves it out where it would not finish in time).
    pub anchor: Vec<f64>,
    pub requests: Vec<f64>,
    pub anchor_requests: Vec<f64>,
    breakdown: BTreeMap<(String, String), f64>,
    /// Where each round's time went, from the apiserver's own timestamps (audit log).
    split: Vec<serde_json::Value>,
    raw_split: Vec<serde_json::Value>,
    pub hwm: u64,
    /// 0 when trust-manager was not run.
    pub anchor_hwm: u64,
    rss_after_first_sync: u64,
    /// ca-syncer's resident memory after the rounds by mapping kind (`/proc/<pid>/smaps`): what holds it.
    pub rss_by_kind: BTreeMap<String, u64>,
    /// 0 when trust-manager was not run.
    pub anchor_first_sync: f64,
}

impl Measured {
    /// Every figure, for the JSON report.
    pub fn json(&self) -> serde_json::Value {
        let (o, r, a) = (common::median(&self.ours), common::median(&self.raw), common::median(&self.anchor));
        json!({
            "target_kind": self.kind.name(),
            "agent_seconds": self.ours, "raw_apply_seconds": self.raw, "trust_manager_seconds": self.anchor,
            "ratio_floor": o / r, "ratio_anchor": if self.anchor.is_empty() { json!(null) } else { json!(o / a) },
            "agent_requests_per_change": self.requests, "trust_manager_requests_per_change": self.anchor_requests,
            "agent_requests_last_change_by_verb": common::by_verb_json(&self.breakdown),
            "agent_split": self.split, "raw_apply_split": self.raw_split,
            "agent_peak_rss_bytes": self.hwm, "trust_manager_peak_rss_bytes": self.anchor_hwm,
            "agent_rss_after_first_sync_bytes": self.rss_after_first_sync,
            "agent_rss_after_rounds_by_kind_bytes": self.rss_by_kind,
            "trust_manager_first_sync_seconds": self.anchor_first_sync,
        })
    }
}

pub async fn run(rounds: usize, count: usize) -> Result<Report> {
    let (measured, unrelated) = measure(rounds, count, &[Kind::ConfigMap, Kind::Secret], true).await?;
    let mut rows = Vec::new();
    let mut json_kinds = Vec::new();
    for m in &measured {
        let (o, r, a) = (common::median(&m.ours), common::median(&m.raw), common::median(&m.anchor));
        let (req, anchor_req) = (common::median(&m.requests), common::median(&m.anchor_requests));
        let kind = m.kind.name();
        rows.push(
            Row::new(
                format!("{kind}: time to the last of {count} targets updated, vs raw apply (floor; median)"),
                common::secs(o),
            )
            .baseline(common::secs(r), o / r)
            .target(if o / r <= 1.5 {
                "<= 1.5".into()
            } else {
                format!("<= 1.5: missed by {:.0}%", (o / r / 1.5 - 1.0) * 100.0)
            }),
        );
        rows.push(
            Row::new(
                format!("{kind}: the same, vs trust-manager {} (anchor; median)", peers::TRUST_MANAGER),
                common::secs(o),
            )
            .baseline(common::secs(a), o / a),
        );
        rows.push(
            Row::new(
                format!("{kind}: requests sent per change (audit log): ca-syncer vs trust-manager"),
                format!("{req:.0}"),
            )
            .baseline(format!("{anchor_req:.0} (raw apply: {count})"), req / anchor_req),
        );
        rows.push(
            Row::new(
                format!("{kind}: requests sent per change (audit log): ca-syncer vs the raw apply loop (one write per target)"),
                format!("{req:.0}"),
            )
            .baseline(count.to_string(), req / count as f64)
            .target(if req / count as f64 <= 1.05 {
                "<= 1.05".into()
            } else {
                format!("<= 1.05: missed by {:.1}%", (req / count as f64 / 1.05 - 1.0) * 100.0)
            }),
        );
        rows.push(
            Row::new(format!("{kind}: peak RSS (VmHWM): ca-syncer vs trust-manager"), common::mib(m.hwm))
                .baseline(common::mib(m.anchor_hwm), m.hwm as f64 / m.anchor_hwm as f64),
        );
        json_kinds.push(m.json());
    }
    rows.push(Row::new("reads of unrelated objects by the agent (audit log)", unrelated.len().to_string()).target("0"));
    Ok(Report {
        rows,
        json: json!({
            "namespaces": count, "rounds": rounds, "concurrency": 1, "trust_manager": peers::TRUST_MANAGER,
            "kinds": json_kinds, "unrelated_reads": unrelated,
        }),
    })
}

/// The sizes of `ca-sync-curve` unless `--sizes` says otherwise.
pub const CURVE_SIZES: &[usize] = &[100, 1000, 5000];
/// trust-manager is run at a size only while its propagation, extrapolated linearly from the size before, stays
/// within this (its first sync takes as long again).
const ANCHOR_LIMIT_SECONDS: f64 = 600.0;

/// `ca-sync-curve`: `measure` at each size (ConfigMap targets; a fresh control plane per size), ca-syncer with the
/// raw apply loop beside it at every size and trust-manager where it finishes in time; writes the plot.
pub async fn curve(rounds: usize, sizes: &[usize]) -> Result<Report> {
    let mut points: Vec<(usize, Measured, Option<String>)> = Vec::new();
    let mut anchor_last: Option<(usize, f64)> = None;
    // `KCP_KEEPER_BENCH_TRUST_MANAGER=0`: ca-syncer and the floor only (trust-manager takes minutes per size).
    let mut anchor_stopped: Option<String> = (std::env::var("KCP_KEEPER_BENCH_TRUST_MANAGER").as_deref() == Ok("0"))
        .then(|| "not run: KCP_KEEPER_BENCH_TRUST_MANAGER=0".to_string());
    for &count in sizes {
        let skip = anchor_stopped.clone().or_else(|| {
            let (size, seconds) = anchor_last?;
            let expected = seconds * count as f64 / size as f64;
            (expected > ANCHOR_LIMIT_SECONDS).then(|| {
                format!(
                    "not run from {count} namespaces on: {} at {size} extrapolates to {} per change (limit {})",
                    common::secs(seconds),
                    common::secs(expected),
                    common::secs(ANCHOR_LIMIT_SECONDS)
                )
            })
        });
        anchor_stopped = skip.clone();
        eprintln!(
            "ca-sync-curve: {count} namespaces{}",
            skip.as_deref().map(|s| format!("; trust-manager {s}")).unwrap_or_default()
        );
        let (mut measured, unrelated) = measure(rounds, count, &[Kind::ConfigMap], skip.is_none()).await?;
        anyhow::ensure!(unrelated.is_empty(), "ca-syncer read unrelated objects at {count} namespaces: {unrelated:?}");
        let m = measured.pop().context("one target kind measured")?;
        if !m.anchor.is_empty() {
            anchor_last = Some((count, common::median(&m.anchor)));
        }
        eprintln!(
            "ca-sync-curve: {count} namespaces: ca-syncer {} ({:.0} requests, peak {}), raw apply {}, trust-manager {}; \
             ca-syncer resident by kind after the rounds: {:?}",
            common::secs(common::median(&m.ours)),
            common::median(&m.requests),
            common::mib(m.hwm),
            common::secs(common::median(&m.raw)),
            if m.anchor.is_empty() { "not run".into() } else { common::secs(common::median(&m.anchor)) },
            m.rss_by_kind.iter().map(|(k, v)| format!("{k} {}", common::mib(*v))).collect::<Vec<_>>()
        );
        points.push((count, m, skip));
    }

    let series = |f: &dyn Fn(usize, &Measured) -> f64| -> Vec<(f64, f64)> {
        points.iter().map(|(n, m, _)| (*n as f64, f(*n, m))).collect()
    };
    let tm = format!("trust-manager {}", peers::TRUST_MANAGER);
    let time = [
        curve::Series::new("ca-syncer", series(&|_, m| common::median(&m.ours))),
        curve::Series::new("raw apply loop (floor)", series(&|_, m| common::median(&m.raw))),
        curve::Series::new(tm.clone(), series(&|_, m| common::median(&m.anchor))),
    ];
    let requests = [
        curve::Series::new("ca-syncer", series(&|_, m| common::median(&m.requests))),
        curve::Series::new("raw apply loop (floor)", series(&|n, _| n as f64)),
        curve::Series::new(tm.clone(), series(&|_, m| common::median(&m.anchor_requests))),
    ];
    let memory = [
        curve::Series::new("ca-syncer", series(&|_, m| m.hwm as f64 / common::MIB)),
        curve::Series::new(tm.clone(), series(&|_, m| m.anchor_hwm as f64 / common::MIB)),
    ];
    let mut rows = Vec::new();
    for (count, m, skip) in &points {
        let (o, r) = (common::median(&m.ours), common::median(&m.raw));
        rows.push(
            Row::new(
                format!("{count} namespaces: time to the last ConfigMap updated, vs raw apply (floor)"),
                common::secs(o),
            )
            .baseline(common::secs(r), o / r),
        );
        let anchor_row = Row::new(format!("{count} namespaces: the same, vs {tm}"), common::secs(o));
        rows.push(match skip {
            None => anchor_row.baseline(common::secs(common::median(&m.anchor)), o / common::median(&m.anchor)),
            Some(why) => anchor_row.target(why.clone()),
        });
        let req = common::median(&m.requests);
        let anchor_req =
            if skip.is_none() { format!("; {tm}: {:.0}", common::median(&m.anchor_requests)) } else { String::new() };
        rows.push(
            Row::new(format!("{count} namespaces: requests per change (audit log), vs raw apply"), format!("{req:.0}"))
                .baseline(format!("{count}{anchor_req}"), req / *count as f64),
        );
        let memory_row = Row::new(format!("{count} namespaces: peak RSS (VmHWM), vs {tm}"), common::mib(m.hwm));
        rows.push(if skip.is_none() {
            memory_row.baseline(common::mib(m.anchor_hwm), m.hwm as f64 / m.anchor_hwm as f64)
        } else {
            memory_row
        });
    }
    let (json_exponents, svg) = curve::finish(
        &mut rows,
        (
            "ca-sync-curve",
            &format!("ca-sync: one CA change to N namespaces' ConfigMaps ({rounds} round(s) per size)"),
            "namespaces",
        ),
        ("time to the last target", "requests per change"),
        curve::Measures { time: time.into(), requests: requests.into(), memory: memory.into() },
    )?;
    eprintln!("ca-sync-curve: plot written to {}", svg.display());
    Ok(Report {
        rows,
        json: json!({
            "rounds": rounds, "target_kind": "ConfigMap", "trust_manager": peers::TRUST_MANAGER,
            "anchor_limit_seconds": ANCHOR_LIMIT_SECONDS,
            "sizes": points.iter().map(|(n, m, skip)| json!({
                "namespaces": n, "trust_manager_not_run": skip, "figures": m.json(),
            })).collect::<Vec<_>>(),
            "exponents": json_exponents,
        }),
    })
}

/// One fresh control plane with `count` tenant namespaces; for each of `kinds`, a fresh ca-syncer and `rounds`
/// changes, each followed by the raw apply loop's round and (with `anchor`) trust-manager's. Returns each kind's
/// figures and the agent's reads of unrelated objects.
pub async fn measure(
    rounds: usize,
    count: usize,
    kinds: &[Kind],
    anchor: bool,
) -> Result<(Vec<Measured>, Vec<String>)> {
    let tm = peers::ensure_bench(&["trust-manager", "trust-manager-crds"])?;
    eprintln!("ca-sync: starting etcd and kube-apiserver; creating {count} namespaces");
    let bed = testbed::ControlPlane::start().await?;
    let client = bed.client();
    bed.create_namespace(SOURCE_NS).await?;
    bed.create_namespace(trust_manager::TRUST_NAMESPACE).await?;
    for kind in [Kind::ConfigMap, Kind::Secret] {
        bed.create_namespace(&agent_ns(kind)).await?;
    }
    trust_manager::install_crd(&client, tm.path("trust-manager-crds")).await?;
    let namespaces: Vec<String> = (0..count).map(|i| format!("tenant-{i:04}")).collect();
    // Eight at a time: thousands of namespaces one by one (three creates each) take minutes before the clock starts.
    let creates = namespaces.iter().map(|ns| create_tenant(client.clone(), ns.clone()));
    let created: Vec<Result<()>> = futures::stream::iter(creates).buffer_unordered(8).collect().await;
    created.into_iter().collect::<Result<()>>()?;
    let root = Ca::new("bench root CA", Duration::from_secs(30 * 24 * 3600))?;
    let week = Duration::from_secs(7 * 24 * 3600);
    // ca-syncer's source and trust-manager's (in its trust namespace): the same cert-manager-shaped Secret.
    let sources = Api::<Secret>::namespaced(client.clone(), SOURCE_NS);
    let anchor_sources = Api::<Secret>::namespaced(client.clone(), trust_manager::TRUST_NAMESPACE);
    let mut serial = 0;
    let mut next_ca = |what: &str| {
        serial += 1;
        root.intermediate(&format!("bench serving CA {serial} ({what})"), week)
    };
    let first = next_ca("ca-syncer")?;
    sources.create(&PostParams::default(), &source(&root, &first)).await?;
    let mut anchor_ca = next_ca("trust-manager")?;
    anchor_sources.create(&PostParams::default(), &source(&root, &anchor_ca)).await?;

    let seen: Seen = Arc::default();
    let watches = [
        tokio::spawn(watch_targets::<Secret>(client.clone(), seen.clone())),
        tokio::spawn(watch_targets::<ConfigMap>(client.clone(), seen.clone())),
    ];
    let kubeconfig = bed.apiserver.user_kubeconfig(USER, &["system:masters"], Duration::from_secs(24 * 3600))?;
    let binary = common::agent_binary("ca-syncer")?;
    let mut measured = Vec::new();
    let mut current = first;
    for &kind in kinds {
        let target_kind = if kind == Kind::Secret { "secret" } else { "configMap" };
        let config = bed.subdir(&format!("ca-syncer-{}", kind.key()))?.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "bundles:\n- name: kcp\n  sources:\n  - secret: {{namespace: {SOURCE_NS}, name: root-ca, key: tls.crt}}\n  \
                 - secret: {{namespace: {SOURCE_NS}, name: root-ca, key: ca.crt}}\n  targets:\n  - {target_kind}: {{name: {TARGET}, \
                 key: ca.crt, namespaceSelector: {{matchLabels: {{{}: {}}}}}}}\n",
                LABEL.0, LABEL.1
            ),
        )?;
        let env = [("KCP_KEEPER_LOG_FORMAT", "plain")];
        let ns = agent_ns(kind);
        let agent = AgentUnderTest::new(&bed, &binary, &config).kubeconfig(&kubeconfig).namespace(&ns);
        let mut agent = agent.identity("ca-syncer").envs(&env).ready_within(Duration::from_secs(60)).start().await?;
        let pid = agent.process.pid().context("ca-syncer exited")?;
        let started = Instant::now();
        wait_all(&seen, kind, &namespaces, TARGET, &marker(&current), started).await.context("the first sync")?;
        let rss_after_first_sync = common::status_bytes(pid, "VmRSS").unwrap_or_default();

        let (mut anchor_process, anchor_first_sync) = if anchor {
            eprintln!("ca-sync: {}: starting trust-manager and its Bundle", kind.name());
            let process = trust_manager::start(
                tm.path("trust-manager"),
                &bed,
                &bed.subdir(&format!("trust-manager-{}", kind.key()))?,
                kind == Kind::Secret,
            )?;
            let t0 = Instant::now();
            trust_manager::create_bundle(&client, ANCHOR, "root-ca", kind.name(), "ca.crt", LABEL).await?;
            let first_sync = wait_all(&seen, kind, &namespaces, ANCHOR, &marker(&anchor_ca), t0)
                .await
                .with_context(|| format!("trust-manager's first sync (its log: {})", bed.dir().display()))?;
            (Some(process), first_sync)
        } else {
            (None, 0.0)
        };
        let anchor_pid = match &anchor_process {
            Some(process) => Some(process.pid().context("trust-manager exited")?),
            None => None,
        };

        let mut m = Measured {
            kind,
            ours: Vec::new(),
            raw: Vec::new(),
            anchor: Vec::new(),
            requests: Vec::new(),
            anchor_requests: Vec::new(),
            breakdown: BTreeMap::new(),
            split: Vec::new(),
            raw_split: Vec::new(),
            hwm: 0,
            anchor_hwm: 0,
            rss_after_first_sync,
            rss_by_kind: BTreeMap::new(),
            anchor_first_sync,
        };
        for round in 0..rounds {
            eprintln!("ca-sync: {} round {}/{rounds}", kind.name(), round + 1);
            let ca = next_ca("ca-syncer")?;
            let before = audit_count(&bed.apiserver.audit_log, USER)?;
            let (t0, wall0) = (Instant::now(), unix(SystemTime::now()));
            sources.replace("root-ca", &PostParams::default(), &source(&root, &ca)).await?;
            m.ours.push(wait_all(&seen, kind, &namespaces, TARGET, &marker(&ca), t0).await?);
            // The agent sends its pass's one Event after the pass's writes: counted with this change, and finished
            // before the floor's round.
            let events_done = events_sent(&bed.apiserver.audit_log, &before, t0).await?;
            let split = Split::of(&timed(&bed.apiserver.audit_log, wall0)?, Some(USER), TARGET, wall0);
            eprintln!(
                "ca-sync: {} round {}: ca-syncer {split}; its last Event {:.0} ms after the change",
                kind.name(),
                round + 1,
                events_done * 1e3
            );
            m.split.push(json!({"split": split.json(), "last_event_seconds": events_done}));
            // The agent's requests for this change: what it sent from the change until the last target was written.
            let after = audit_count(&bed.apiserver.audit_log, USER)?;
            m.breakdown = after
                .iter()
                .map(|(k, n)| (k.clone(), (n - before.get(k).copied().unwrap_or(0)) as f64))
                .filter(|(_, n)| *n > 0.0)
                .collect();
            m.requests.push(total(&after) - total(&before));
            current = ca;

            // The floor writes what the agent wrote: the same bundle text, prepared before the clock starts.
            let bundle = seen
                .lock()
                .expect("not poisoned")
                .get(&(kind, namespaces[0].clone(), TARGET.to_string()))
                .map(|(text, _)| text.clone())
                .context("the target's ca.crt")?;
            let params = PatchParams::apply("bench-raw-apply").force();
            let (t0, wall0) = match kind {
                Kind::Secret => {
                    let prepared: Vec<(Api<Secret>, Secret)> = namespaces
                        .iter()
                        .map(|ns| {
                            let data =
                                BTreeMap::from([("ca.crt".to_string(), ByteString(bundle.clone().into_bytes()))]);
                            let secret = Secret { metadata: meta(RAW), data: Some(data), ..Default::default() };
                            (Api::<Secret>::namespaced(client.clone(), ns), secret)
                        })
                        .collect();
                    let (t0, wall0) = (Instant::now(), unix(SystemTime::now()));
                    for (api, secret) in &prepared {
                        api.patch(RAW, &params, &Patch::Apply(secret)).await?;
                    }
                    (t0, wall0)
                }
                Kind::ConfigMap => {
                    let prepared: Vec<(Api<ConfigMap>, ConfigMap)> = namespaces
                        .iter()
                        .map(|ns| {
                            let data = BTreeMap::from([("ca.crt".to_string(), bundle.clone())]);
                            let config = ConfigMap { metadata: meta(RAW), data: Some(data), ..Default::default() };
                            (Api::<ConfigMap>::namespaced(client.clone(), ns), config)
                        })
                        .collect();
                    let (t0, wall0) = (Instant::now(), unix(SystemTime::now()));
                    for (api, config) in &prepared {
                        api.patch(RAW, &params, &Patch::Apply(config)).await?;
                    }
                    (t0, wall0)
                }
            };
            m.raw.push(wait_all(&seen, kind, &namespaces, RAW, &bundle, t0).await?);
            let split = Split::of(&timed(&bed.apiserver.audit_log, wall0)?, None, RAW, wall0);
            eprintln!("ca-sync: {} round {}: raw apply {split}", kind.name(), round + 1);
            m.raw_split.push(split.json());

            // The anchor: the same change to its own source.
            if !anchor {
                continue;
            }
            anchor_ca = next_ca("trust-manager")?;
            let before = audit_count(&bed.apiserver.audit_log, trust_manager::USER)?;
            let t0 = Instant::now();
            anchor_sources.replace("root-ca", &PostParams::default(), &source(&root, &anchor_ca)).await?;
            m.anchor.push(wait_all(&seen, kind, &namespaces, ANCHOR, &marker(&anchor_ca), t0).await?);
            let after = audit_count(&bed.apiserver.audit_log, trust_manager::USER)?;
            m.anchor_requests.push(total(&after) - total(&before));
        }
        m.hwm = common::status_bytes(pid, "VmHWM").context("ca-syncer's VmHWM")?;
        m.rss_by_kind = common::resident_by_kind(pid);
        if let (Some(anchor_pid), Some(process)) = (anchor_pid, anchor_process.as_mut()) {
            m.anchor_hwm = common::status_bytes(anchor_pid, "VmHWM").context("trust-manager's VmHWM")?;
            trust_manager::delete_bundle(&client, ANCHOR).await?;
            process.stop(Duration::from_secs(10));
        }
        agent.terminate(Duration::from_secs(10));
        measured.push(m);
    }
    for watch in watches {
        watch.abort();
    }
    let unrelated = unrelated_reads(&bed)?;
    Ok((measured, unrelated))
}

/// A tenant namespace with the selector's label, and what else lives there (an unrelated Secret and ConfigMap).
async fn create_tenant(client: kube::Client, ns: String) -> Result<()> {
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
    Api::<Secret>::namespaced(client.clone(), &ns).create(&PostParams::default(), &unrelated).await?;
    let config = ConfigMap {
        metadata: meta("app-config"),
        data: Some(BTreeMap::from([("k".into(), "v".into())])),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), &ns).create(&PostParams::default(), &config).await?;
    Ok(())
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

/// A target's `ca.crt`, whichever kind holds it.
trait Target:
    kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + k8s_openapi::serde::de::DeserializeOwned
    + Send
    + 'static
{
    const KIND: Kind;
    fn ca_crt(&self) -> Option<String>;
}

impl Target for Secret {
    const KIND: Kind = Kind::Secret;
    fn ca_crt(&self) -> Option<String> {
        self.data.as_ref()?.get("ca.crt").map(|v| String::from_utf8_lossy(&v.0).into_owned())
    }
}

impl Target for ConfigMap {
    const KIND: Kind = Kind::ConfigMap;
    fn ca_crt(&self) -> Option<String> {
        self.data.as_ref()?.get("ca.crt").cloned()
    }
}

async fn watch_targets<T: Target>(client: kube::Client, seen: Seen) {
    let api = Api::<T>::all(client);
    let mut events = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
    while let Some(event) = events.next().await {
        let object = match event {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
            _ => continue,
        };
        let now = Instant::now();
        let meta = object.meta();
        let key = (T::KIND, meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default());
        seen.lock().expect("not poisoned").insert(key, (object.ca_crt().unwrap_or_default(), now));
    }
}

/// Waits until every namespace's `name` object of `kind` holds `marker`; seconds from `t0` to the last one seen.
async fn wait_all(
    seen: &Seen,
    kind: Kind,
    namespaces: &[String],
    name: &str,
    marker: &str,
    t0: Instant,
) -> Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        {
            let seen = seen.lock().expect("not poisoned");
            let times: Option<Vec<Instant>> = namespaces
                .iter()
                .map(|ns| {
                    seen.get(&(kind, ns.clone(), name.to_string()))
                        .filter(|(text, _)| text.contains(marker))
                        .map(|(_, t)| *t)
                })
                .collect();
            if let Some(times) = times {
                let last = times.into_iter().max().unwrap_or(t0);
                return Ok(last.saturating_duration_since(t0).as_secs_f64());
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "not every {} {name} updated within 600s", kind.name());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The audit log and the files the apiserver rotated it into, oldest first: it rotates at 100 MB (the default
/// of its `--audit-log-maxsize`, which the test bed leaves), which a run at 5,000 namespaces goes past.
fn audit_logs(log: &std::path::Path) -> Vec<std::path::PathBuf> {
    let (Some(dir), Some(stem)) = (log.parent(), log.file_stem().and_then(|s| s.to_str())) else {
        return vec![log.to_path_buf()];
    };
    let mut rotated: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{stem}-")) && n.ends_with(".log"))
        })
        .collect();
    // Their names carry the rotation's time, so the name's order is the time's.
    rotated.sort();
    rotated.push(log.to_path_buf());
    rotated
}

/// Retries `read` while a file is missing: for a moment during a rotation the log is not there.
fn retry_missing<T>(mut read: impl FnMut() -> Result<T>) -> Result<T> {
    let mut tries = 0;
    loop {
        match read() {
            Err(e)
                if tries < 40
                    && e.chain().any(|c| {
                        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound)
                    }) =>
            {
                tries += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// `testbed::audit::count` over the log and the files it was rotated into.
fn audit_count(log: &std::path::Path, user: &str) -> Result<BTreeMap<(String, String), usize>> {
    let mut counts = BTreeMap::new();
    for file in audit_logs(log) {
        for (key, n) in retry_missing(|| testbed::audit::count(&file, user))? {
            *counts.entry(key).or_insert(0) += n;
        }
    }
    Ok(counts)
}

fn total(counts: &BTreeMap<(String, String), usize>) -> f64 {
    counts.values().sum::<usize>() as f64
}

/// The agent's reads of Secrets and ConfigMaps other than its source, its targets and its own state: by name,
/// or by a list or watch not narrowed to one name.
fn own_ns(namespace: Option<&str>) -> bool {
    [Kind::ConfigMap, Kind::Secret].iter().any(|k| namespace == Some(agent_ns(*k).as_str()))
}

fn unrelated_reads(bed: &testbed::ControlPlane) -> Result<Vec<String>> {
    let mut requests = Vec::new();
    for file in audit_logs(&bed.apiserver.audit_log) {
        requests.extend(retry_missing(|| testbed::audit::by_user(&file, USER))?);
    }
    Ok(requests
        .into_iter()
        .filter(|r| matches!(r.resource.as_str(), "secrets" | "configmaps") && !r.is_write())
        .filter(|r| match &r.name {
            Some(name) => !(name == "root-ca" || name == TARGET || own_ns(r.namespace.as_deref())),
            None => !r.uri.contains("fieldSelector=metadata.name") && !own_ns(r.namespace.as_deref()),
        })
        .map(|r| format!("{} {}", r.verb, r.uri))
        .collect())
}

/// Waits until ca-syncer (its audit counts were `before` the change) has sent the Event of the pass that wrote
/// its targets (one per pass, after the pass's writes); seconds from `t0` until it had.
async fn events_sent(log: &std::path::Path, before: &BTreeMap<(String, String), usize>, t0: Instant) -> Result<f64> {
    let delta = |after: &BTreeMap<(String, String), usize>, verb: &str, resource: &str| {
        let key = (verb.to_string(), resource.to_string());
        after.get(&key).copied().unwrap_or(0).saturating_sub(before.get(&key).copied().unwrap_or(0))
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let after = audit_count(log, USER)?;
        let written = delta(&after, "patch", "configmaps") + delta(&after, "patch", "secrets");
        if written > 0 && delta(&after, "create", "events") >= 1 {
            return Ok(t0.elapsed().as_secs_f64());
        }
        anyhow::ensure!(Instant::now() < deadline, "ca-syncer sent no Event for the pass of its {written} writes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Seconds since the epoch.
fn unix(at: SystemTime) -> f64 {
    at.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

/// One request as the apiserver timed it (audit log): who, what, and when it was received and answered, in
/// seconds since the epoch.
struct Timed {
    user: String,
    verb: String,
    resource: String,
    name: String,
    received: f64,
    done: f64,
}

/// Every completed request received at or after `from` (the audit log's `ResponseComplete` lines).
fn timed(log: &std::path::Path, from: f64) -> Result<Vec<Timed>> {
    let mut text = String::new();
    for file in audit_logs(log) {
        text +=
            &retry_missing(|| std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display())))?;
    }
    let mut out = Vec::new();
    for line in text.lines() {
        // The last line may be half-written while the apiserver runs.
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if event["stage"] != "ResponseComplete" {
            continue;
        }
        let at = |field: &str| event[field].as_str().and_then(rfc3339_seconds);
        let (Some(received), Some(done)) = (at("requestReceivedTimestamp"), at("stageTimestamp")) else { continue };
        if received < from {
            continue;
        }
        let field = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        out.push(Timed {
            user: field(&event["user"]["username"]),
            verb: field(&event["verb"]),
            resource: field(&event["objectRef"]["resource"]),
            name: field(&event["objectRef"]["name"]),
            received,
            done,
        });
    }
    Ok(out)
}

/// `2026-12-02T02:40:01.123456Z` in seconds since the epoch (the audit log writes UTC).
fn rfc3339_seconds(text: &str) -> Option<f64> {
    let (date, time) = text.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (h, min, s) = (t.next()?.parse::<f64>().ok()?, t.next()?.parse::<f64>().ok()?, t.next()?.parse::<f64>().ok()?);
    // Days from the civil date (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + s)
}

/// Where one propagation's time went, by the apiserver's clock: from the change to the writer's first request
/// (the watch and, for ca-syncer, its debounce), then its requests until the last target write was answered;
/// the target writes' own time in the apiserver, and what else the writer sent in that window (Events, its
/// rotation record). The gap per write (window over writes, less the apiserver's time) is the writer's own.
struct Split {
    to_first_request: f64,
    first_to_last_write: f64,
    writes: usize,
    write_server_mean: f64,
    events: usize,
    event_server_mean: f64,
    other: BTreeMap<String, usize>,
}

impl Split {
    /// `user`: the writer (None: anyone writing objects named `target`, the raw apply loop).
    fn of(requests: &[Timed], user: Option<&str>, target: &str, from: f64) -> Split {
        let mine: Vec<&Timed> = requests.iter().filter(|r| user.is_none_or(|u| r.user == u)).collect();
        let writes: Vec<&&Timed> = mine
            .iter()
            .filter(|r| r.name == target && matches!(r.verb.as_str(), "patch" | "update" | "create"))
            .collect();
        let last = writes.iter().map(|r| r.done).fold(f64::NAN, f64::max);
        let first_write = writes.iter().map(|r| r.received).fold(f64::NAN, f64::min);
        let first = if user.is_some() { mine.iter().map(|r| r.received).fold(f64::NAN, f64::min) } else { first_write };
        let in_window: Vec<&&Timed> = mine.iter().filter(|r| r.received <= last).collect();
        let events: Vec<&&&Timed> = in_window.iter().filter(|r| r.resource == "events").collect();
        let mean = |rs: &mut dyn Iterator<Item = f64>| {
            let (n, sum) = rs.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
            if n == 0 { 0.0 } else { sum / n as f64 }
        };
        let mut other = BTreeMap::new();
        if user.is_some() {
            for r in in_window.iter().filter(|r| r.resource != "events" && r.name != target) {
                *other.entry(format!("{} {}", r.verb, r.resource)).or_insert(0) += 1;
            }
        }
        Split {
            to_first_request: first - from,
            first_to_last_write: last - first_write,
            writes: writes.len(),
            write_server_mean: mean(&mut writes.iter().map(|r| r.done - r.received)),
            events: events.len(),
            event_server_mean: mean(&mut events.iter().map(|r| r.done - r.received)),
            other,
        }
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "change_to_first_request_seconds": self.to_first_request,
            "first_to_last_write_seconds": self.first_to_last_write,
            "writes": self.writes, "write_apiserver_mean_seconds": self.write_server_mean,
            "events_in_window": self.events, "event_apiserver_mean_seconds": self.event_server_mean,
            "other_requests_in_window": self.other,
        })
    }
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per_write = if self.writes == 0 { 0.0 } else { self.first_to_last_write / self.writes as f64 };
        write!(
            f,
            "change -> first request {:.0} ms; first -> last write {:.0} ms for {} writes ({:.2} ms each, of which \
             {:.2} ms in the apiserver); {} Events in that window ({:.2} ms each in the apiserver); other {:?}",
            self.to_first_request * 1e3,
            self.first_to_last_write * 1e3,
            self.writes,
            per_write * 1e3,
            self.write_server_mean * 1e3,
            self.events,
            self.event_server_mean * 1e3,
            self.other
        )
    }
}
