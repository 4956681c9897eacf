//! One write per target, read from the apiserver's audit log: the first fan-out to many new targets sends each
//! target exactly one write, so does a CA change after it, and the cycles that follow send none. Everything the
//! agent sends for the CA change (its writes, its one Event, its rotation record) stays within 1.05 times the
//! writes alone, which is what a loop applying one write per target sends (the bench's raw apply loop). The agent
//! runs as a user of its own, so the log tells its requests from the test's.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use testbed::agent_process::AgentProcess;
use testbed::certs::Ca;
use testbed::{ControlPlane, eventually};

const USER: &str = "ca-syncer-writes";
const TARGET: &str = "kcp-ca";
const LABEL: &str = "writes.kcp-keeper.io/trust";
/// Generous: a thousand targets on a loaded two-core machine.
const FAN_OUT: Duration = Duration::from_secs(240);

/// The agent's writes to target Secrets, by namespace, from the audit log (every write verb, whatever its code:
/// a refused or no-op write is a write sent all the same).
fn writes_by_namespace(bed: &ControlPlane) -> Result<BTreeMap<String, Vec<String>>> {
    let mut by_ns: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in testbed::audit::by_user(&bed.apiserver.audit_log, USER)? {
        if r.resource == "secrets" && r.name.as_deref() == Some(TARGET) && r.is_write() {
            let code = r.code.map_or("-".into(), |c| c.to_string());
            by_ns.entry(r.namespace.unwrap_or_default()).or_default().push(format!("{} {code}", r.verb));
        }
    }
    Ok(by_ns)
}

/// Waits until every target Secret holds a certificate with `marker` in its base64.
async fn wait_all_hold(client: &kube::Client, namespaces: &[String], marker: &str) {
    let api = Api::<Secret>::all(client.clone());
    let params = ListParams::default().fields(&format!("metadata.name={TARGET}"));
    eventually(FAN_OUT, "every target to hold the CA", || async {
        let listed = api.list(&params).await.ok()?;
        let holding = listed
            .items
            .iter()
            .filter(|s| {
                s.data
                    .as_ref()
                    .and_then(|d| d.get("ca.crt"))
                    .is_some_and(|v| String::from_utf8_lossy(&v.0).contains(marker))
            })
            .count();
        (holding == namespaces.len()).then_some(())
    })
    .await;
}

/// Waits for `cycles` more successful passes of the bundle (the 1s resync runs them even when nothing changes).
async fn settle(agent: &AgentProcess, cycles: usize) {
    let series = "ca_syncer_last_sync_timestamp_seconds{bundle=\"fleet\"}";
    let mut last = wait_for_metric(agent, series, "a synced bundle", |v| v > 0.0).await;
    for _ in 0..cycles {
        last = wait_for_metric(agent, series, "another cycle", |v| v > last).await;
    }
}

/// The agent's requests from the `from`th of its requests in the audit log up to and including its first Event
/// create after it: a pass's one Event is its last request, sent once every target is written. Lease renewals
/// are left out: they come every 2 seconds whatever changes, and the loop compared with holds no lease.
async fn requests_for_the_change(bed: &ControlPlane, from: usize) -> Vec<testbed::audit::Request> {
    eventually(FAN_OUT, "the change's Event after its writes", || async {
        let requests = testbed::audit::by_user(&bed.apiserver.audit_log, USER).ok()?;
        let after = requests.get(from..)?;
        let end = after.iter().position(|r| r.resource == "events" && r.verb == "create")?;
        Some(after[..=end].iter().filter(|r| r.resource != "leases").cloned().collect())
    })
    .await
}

/// Each namespace exactly once in `after` beyond `before`, nowhere else.
fn assert_one_write_each(
    what: &str,
    namespaces: &[String],
    before: &BTreeMap<String, Vec<String>>,
    after: &BTreeMap<String, Vec<String>>,
) {
    let mut wrong = Vec::new();
    let mut total = 0;
    for (ns, writes) in after {
        let new = &writes[before.get(ns).map_or(0, Vec::len)..];
        total += new.len();
        if new.len() != 1 || !namespaces.contains(ns) {
            wrong.push(format!("{ns}: {new:?}"));
        }
    }
    let missing: Vec<_> = namespaces.iter().filter(|ns| !after.contains_key(*ns)).collect();
    assert!(
        wrong.is_empty() && missing.is_empty(),
        "{what}: {total} writes to {} targets; not exactly one: {} (first: {:?}); none: {}",
        namespaces.len(),
        wrong.len(),
        wrong.iter().take(5).collect::<Vec<_>>(),
        missing.len()
    );
}

/// A control plane with a source Secret and `count` new namespaces the bundle's selector picks, and ca-syncer
/// (as [`USER`] in `groups`, `resyncInterval: 1s`, with `env`) after its first fan-out has written every target
/// and three more passes ran.
struct Fleet {
    bed: ControlPlane,
    agent: AgentProcess,
    src: String,
    sources: Api<Secret>,
    namespaces: Vec<String>,
}

impl Fleet {
    /// Puts `ca` in the source in place of the CA it held.
    async fn change_to(&self, ca: &Ca) -> Result<()> {
        self.sources
            .replace("source", &PostParams::default(), &secret("source", &[("ca.crt", &ca.cert_pem())]))
            .await?;
        Ok(())
    }
}

fn marker(ca: &Ca) -> String {
    ca.cert_pem().lines().nth(1).unwrap_or_default().to_string()
}

async fn fleet(count: usize, groups: &[&str], env: &[(&str, &str)], before_start: &str) -> Result<Fleet> {
    let bed = ControlPlane::start().await?;
    let src = bed.namespace().await?;
    let first = Ca::new("kcp-ca", YEAR)?;
    let sources = Api::<Secret>::namespaced(bed.client(), &src);
    sources.create(&PostParams::default(), &secret("source", &[("ca.crt", &first.cert_pem())])).await?;
    if !before_start.is_empty() {
        apply_yaml(&bed.client(), &before_start.replace("SOURCE_NAMESPACE", &src)).await?;
    }
    let namespaces: Vec<String> = (0..count).map(|i| format!("fleet-{count}-{i:04}")).collect();
    let api = Api::<Namespace>::all(bed.client());
    futures::stream::iter(&namespaces)
        .map(|name| {
            let api = api.clone();
            async move {
                let labels = BTreeMap::from([(LABEL.to_string(), "true".to_string())]);
                let ns = Namespace {
                    metadata: ObjectMeta { name: Some(name.clone()), labels: Some(labels), ..Default::default() },
                    ..Default::default()
                };
                api.create(&PostParams::default(), &ns).await.map(|_| ())
            }
        })
        .buffer_unordered(16)
        .try_collect::<()>()
        .await?;
    let config = format!(
        "resyncInterval: 1s\nbundles:\n- name: fleet\n  sources:\n  - secret: {{namespace: {src}, name: source, key: ca.crt}}\n  targets:\n  - secret: {{name: {TARGET}, key: ca.crt, namespaceSelector: {{matchLabels: {{{LABEL}: \"true\"}}}}}}\n"
    );
    let kubeconfig = bed.apiserver.user_kubeconfig(USER, groups, Duration::from_secs(3600))?;
    let agent = common::agent(&bed, &write_config(&bed, &config)?, &src).kubeconfig(&kubeconfig).envs(env);
    let mut agent = agent.spawn()?;
    agent.wait_ready(FAN_OUT).await?;
    wait_all_hold(&bed.client(), &namespaces, &marker(&first)).await;
    settle(&agent, 3).await;
    Ok(Fleet { bed, agent, src, sources, namespaces })
}

/// The agent's GETs of target Secrets among its requests from the `from`th on, by namespace.
fn target_reads(bed: &ControlPlane, from: usize) -> Result<BTreeMap<String, usize>> {
    let mut by_ns = BTreeMap::new();
    for r in testbed::audit::by_user(&bed.apiserver.audit_log, USER)?.into_iter().skip(from) {
        if r.resource == "secrets" && r.name.as_deref() == Some(TARGET) && r.verb == "get" {
            *by_ns.entry(r.namespace.unwrap_or_default()).or_default() += 1;
        }
    }
    Ok(by_ns)
}

async fn one_write_per_target(count: usize) -> Result<()> {
    let fleet = fleet(count, &["system:masters"], &[], "").await?;
    let Fleet { bed, agent, namespaces, .. } = &fleet;
    let created = writes_by_namespace(bed)?;
    assert_one_write_each("the first fan-out", namespaces, &BTreeMap::new(), &created);

    let next = Ca::new("kcp-ca", YEAR)?;
    let from = testbed::audit::by_user(&bed.apiserver.audit_log, USER)?.len();
    fleet.change_to(&next).await?;
    wait_all_hold(&bed.client(), namespaces, &marker(&next)).await;
    let change = requests_for_the_change(bed, from).await;
    settle(agent, 3).await;
    assert_one_write_each("the CA change", namespaces, &created, &writes_by_namespace(bed)?);

    // What the change cost: one write per target and, beside them, one Event and the rotation record (a read
    // and a write), against the one write per target a raw apply loop sends.
    let mut by_kind: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in &change {
        *by_kind.entry((r.verb.clone(), r.resource.clone())).or_default() += 1;
    }
    let events = by_kind.get(&("create".to_string(), "events".to_string())).copied().unwrap_or(0);
    assert_eq!(events, 1, "one Event for the change: {by_kind:?}");
    let ratio = change.len() as f64 / count as f64;
    eprintln!(
        "the CA change to {count} targets: {} requests ({ratio:.3}x the raw loop's {count}): {by_kind:?}",
        change.len()
    );
    assert!(ratio <= 1.05, "{} requests for {count} targets ({ratio:.3}x): {by_kind:?}", change.len());
    Ok(())
}

#[tokio::test]
async fn a_fan_out_to_300_new_targets_and_a_ca_change_write_each_once_and_the_change_sends_at_most_1_05x_the_writes()
-> Result<()> {
    one_write_per_target(300).await
}

#[tokio::test]
async fn a_fan_out_to_1000_new_targets_and_a_ca_change_write_each_once_and_the_change_sends_at_most_1_05x_the_writes()
-> Result<()> {
    one_write_per_target(1000).await
}

/// ca-syncer's rights in [`a_pass_whose_store_is_behind_its_own_writes_reads_no_target_back`]: everything it
/// does, with the cluster-wide list and watch of Secrets (the targets' watch) in a binding of its own, and the
/// source's watch in a Role of the source's namespace.
const RBAC: &str = "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: writes-agent}
rules:
- {apiGroups: [''], resources: [configmaps, events, namespaces], verbs: ['*']}
- {apiGroups: [events.k8s.io], resources: [events], verbs: ['*']}
- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: ['*']}
- {apiGroups: [''], resources: [secrets], verbs: [get, create, update, patch]}
- {nonResourceURLs: ['*'], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: writes-agent}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: writes-agent}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: writes-agent}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: writes-agent-watch-targets}
rules:
- {apiGroups: [''], resources: [secrets], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: writes-agent-watch-targets}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: writes-agent-watch-targets}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: writes-agent}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: writes-agent-source, namespace: SOURCE_NAMESPACE}
rules:
- {apiGroups: [''], resources: [secrets], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: writes-agent-source, namespace: SOURCE_NAMESPACE}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: writes-agent-source}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: writes-agent}]
";

/// A pass whose reflector store is behind the agent's own last writes (what the pass after a fan-out to
/// thousands of targets meets: it is woken by the first watch events of those writes, and the watch lags or
/// restarts) must not read every target back. Here the store is held behind for good: after the first fan-out
/// the targets' watch loses its right to list and the apiserver restarts, so the store keeps the targets as
/// they were before the change. The CA change then costs one write per target, and the passes after it (every
/// second) no GET of any target: each plans from the same view as the write and arrives at what it wrote.
/// A target the agent creates meanwhile (the store never shows it) and someone deletes at once is created again
/// once the agent's trust in its own create runs out. Once the watch may list again, a change made by someone
/// else after the agent's write is seen and corrected.
#[tokio::test]
async fn a_pass_whose_store_is_behind_its_own_writes_reads_no_target_back() -> Result<()> {
    let env = [("KCP_KEEPER_LEADER_ELECTION", "false")];
    let mut fleet = fleet(300, &["writes-agent"], &env, RBAC).await?;
    let client = fleet.bed.client();
    let bindings = Api::<ClusterRoleBinding>::all(client.clone());
    let watch_binding = bindings.get("writes-agent-watch-targets").await?;
    bindings.delete("writes-agent-watch-targets", &DeleteParams::default()).await?;
    let restarted_at = testbed::audit::by_user(&fleet.bed.apiserver.audit_log, USER)?.len();
    fleet.bed.apiserver.restart().await?;
    let Fleet { bed, agent, namespaces, src, .. } = &fleet;
    eventually(FAN_OUT, "the targets' watch refused and the source's watching again", || async {
        let after = testbed::audit::by_user(&bed.apiserver.audit_log, USER).ok()?.split_off(restarted_at);
        let refused = after.iter().any(|r| r.resource == "secrets" && r.namespace.is_none() && r.code == Some(403));
        let source = after
            .iter()
            .any(|r| r.resource == "secrets" && r.verb == "watch" && r.namespace.as_deref() == Some(src.as_str()));
        (refused && source).then_some(())
    })
    .await;
    settle(agent, 2).await;
    let before = writes_by_namespace(bed)?;

    let next = Ca::new("kcp-ca", YEAR)?;
    let from = testbed::audit::by_user(&bed.apiserver.audit_log, USER)?.len();
    fleet.change_to(&next).await?;
    wait_all_hold(&client, namespaces, &marker(&next)).await;
    // The change's pass and four more, all with the store behind the change's writes.
    settle(agent, 5).await;
    assert_one_write_each("the CA change", namespaces, &before, &writes_by_namespace(bed)?);
    let reads = target_reads(bed, from)?;
    let total: usize = reads.values().sum();
    assert_eq!(
        total,
        0,
        "{total} GETs of {} targets after the change (first: {:?})",
        reads.len(),
        reads.iter().take(5).collect::<Vec<_>>()
    );

    // A namespace labelled now gets its target, which the store never shows; someone deletes it at once. The
    // agent takes a target it created as created for a while, and then reads it: it is created again.
    let late = bed.namespace().await?;
    let labels = serde_json::json!({"metadata": {"labels": {LABEL: "true"}}});
    Api::<Namespace>::all(client.clone()).patch(&late, &PatchParams::default(), &Patch::Merge(labels)).await?;
    let late_targets = Api::<Secret>::namespaced(client.clone(), &late);
    let first = eventually(FAN_OUT, "the late namespace's target", || async {
        late_targets.get_opt(TARGET).await.ok().flatten()
    })
    .await;
    late_targets.delete(TARGET, &DeleteParams::default()).await?;
    let again = eventually(Duration::from_secs(60), "the deleted target created again", || async {
        late_targets.get_opt(TARGET).await.ok().flatten()
    })
    .await;
    assert_ne!(again.metadata.uid, first.metadata.uid, "a new object");

    // The watch may list again; someone else then replaces a target's content with something that is not a
    // bundle: the agent writes the bundle back (what its sources hold: nothing is retained from what it cannot
    // parse).
    let mut back = watch_binding;
    back.metadata = ObjectMeta { name: back.metadata.name.clone(), ..Default::default() };
    bindings.create(&PostParams::default(), &back).await?;
    let edited = &namespaces[7];
    let targets = Api::<Secret>::namespaced(client.clone(), edited);
    let patch = serde_json::json!({"data": {"ca.crt": base64_of("not a bundle")}});
    targets.patch(TARGET, &PatchParams::default(), &Patch::Merge(patch)).await?;
    eventually(FAN_OUT, "the edited target to hold the bundle again", || async {
        key(&client, edited, TARGET, "ca.crt").await.filter(|pem| pem.contains(&marker(&next))).map(|_| ())
    })
    .await;
    Ok(())
}

fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}
