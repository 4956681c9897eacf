//! On-demand snapshots by object (`snapshotObjects: true`): an `EtcdSnapshotRequest` in the agent's namespace
//! names shards; the leader snapshots each of them now, in the snapshots' turn and under the shard's lock as a
//! scheduled run would, and says how it went in the request's status: `Queued`, `Running`, then `Done` with the
//! snapshot ids or `Failed` with the reason. Who may ask is who may create the object (RBAC). A request that
//! cannot be carried out as written (no shard, a shard this agent does not snapshot) fails at once with a status
//! that says so, and is never retried; a request that was `Queued` or `Running` when the leader stopped is carried
//! out again by the next leader. Finished requests are left for their owner to delete.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;
use kcp_keeper_runtime::lease::Leadership;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::{CustomResource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// Takes a snapshot of one shard now: the published snapshot's id, or the failure's reason label.
pub type Snapshotter = Arc<dyn Fn() -> BoxFuture<'static, Result<String, &'static str>> + Send + Sync>;

/// A request for snapshots now.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "kcp-keeper.io",
    version = "v1alpha1",
    kind = "EtcdSnapshotRequest",
    plural = "etcdsnapshotrequests",
    namespaced,
    status = "EtcdSnapshotRequestStatus",
    doc = "Snapshots of the named shards, taken now by etcd-snapshotter's leader",
    printcolumn = r#"{"name":"Shards","type":"string","jsonPath":".spec.shards"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Snapshots","type":"string","jsonPath":".status.snapshots"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.reason"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSnapshotRequestSpec {
    /// The shards to snapshot, by their names in the agent's configuration.
    pub shards: Vec<String>,
}

/// How a request went.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSnapshotRequestStatus {
    /// `Queued`, `Running`, `Done` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The snapshots published for it, one id per shard, in the order they were taken.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<String>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it finished (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

/// How often the requests are listed again with no change seen (a watch that missed one).
const RELIST: std::time::Duration = std::time::Duration::from_secs(300);

const QUEUED: &str = "Queued";
const RUNNING: &str = "Running";
const DONE: &str = "Done";
const FAILED: &str = "Failed";

fn finished(request: &EtcdSnapshotRequest) -> bool {
    request.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|p| p == DONE || p == FAILED)
}

/// Why `shards` cannot be carried out as written, given the shards this agent snapshots (`known`).
pub fn refused(shards: &[String], known: &[&str]) -> Option<String> {
    if shards.is_empty() {
        return Some("spec.shards names no shard".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    for shard in shards {
        if !known.contains(&shard.as_str()) {
            // The name is shown only if it looks like one: the request's author chose it.
            let shown = if kcp_keeper_runtime::names::check_dns_label(shard).is_ok() {
                shard.as_str()
            } else {
                "(not a DNS label)"
            };
            return Some(format!("unknown shard {shown}: this agent snapshots {}", known.join(", ")));
        }
        if !seen.insert(shard) {
            return Some(format!("shard {shard} is named twice"));
        }
    }
    None
}

async fn set_status(api: &Api<EtcdSnapshotRequest>, name: &str, status: EtcdSnapshotRequestStatus) -> kube::Result<()> {
    let patch = serde_json::json!({ "status": status });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ())
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Carries out one request: its status through to `Done` or `Failed`.
async fn carry_out(
    api: &Api<EtcdSnapshotRequest>,
    request: &EtcdSnapshotRequest,
    shards: &BTreeMap<String, Snapshotter>,
) -> kube::Result<()> {
    let name = request.name_any();
    let known: Vec<&str> = shards.keys().map(String::as_str).collect();
    if let Some(reason) = refused(&request.spec.shards, &known) {
        tracing::warn!(request = name, reason, "snapshot request refused");
        let status = EtcdSnapshotRequestStatus {
            phase: Some(FAILED.into()),
            reason: Some(reason),
            finished_at: Some(now()),
            ..Default::default()
        };
        return set_status(api, &name, status).await;
    }
    set_status(api, &name, EtcdSnapshotRequestStatus { phase: Some(RUNNING.into()), ..Default::default() }).await?;
    let mut snapshots = Vec::new();
    for shard in &request.spec.shards {
        match (shards[shard])().await {
            Ok(id) => snapshots.push(id),
            Err(reason) => {
                tracing::warn!(request = name, shard, reason, "snapshot request failed");
                let status = EtcdSnapshotRequestStatus {
                    phase: Some(FAILED.into()),
                    snapshots,
                    reason: Some(format!(
                        "snapshot of shard {shard} failed ({reason}); see the agent's SnapshotFailed Event"
                    )),
                    finished_at: Some(now()),
                };
                return set_status(api, &name, status).await;
            }
        }
    }
    tracing::info!(request = name, snapshots = ?snapshots, "snapshot request done");
    let status =
        EtcdSnapshotRequestStatus { phase: Some(DONE.into()), snapshots, reason: None, finished_at: Some(now()) };
    set_status(api, &name, status).await
}

/// The leader's handling of requests until `token` is cancelled: every unfinished request, oldest first, marked
/// `Queued` when seen and carried out one after another.
pub async fn run(
    client: kube::Client,
    namespace: String,
    mut leadership: Leadership,
    shards: BTreeMap<String, Snapshotter>,
    token: CancellationToken,
) {
    let api: Api<EtcdSnapshotRequest> = Api::namespaced(client, &namespace);
    let mut changes =
        kube::runtime::watcher(api.clone(), kube::runtime::watcher::Config::default()).default_backoff().boxed();
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            () = leadership.wait_until_leader() => {}
        }
        let pending = match api.list(&ListParams::default()).await {
            Ok(list) => {
                let mut pending: Vec<_> = list.items.into_iter().filter(|r| !finished(r)).collect();
                pending.sort_by_key(|r| r.metadata.creation_timestamp.clone());
                pending
            }
            Err(error) => {
                tracing::warn!(%error, "snapshot requests could not be listed");
                Vec::new()
            }
        };
        for request in &pending {
            if request.status.as_ref().and_then(|s| s.phase.as_deref()).is_none()
                && let Err(error) = set_status(
                    &api,
                    &request.name_any(),
                    EtcdSnapshotRequestStatus { phase: Some(QUEUED.into()), ..Default::default() },
                )
                .await
            {
                tracing::warn!(request = request.name_any(), %error, "a snapshot request's status could not be set");
            }
        }
        for request in pending {
            let outcome = tokio::select! {
                () = token.cancelled() => return,
                outcome = carry_out(&api, &request, &shards) => outcome,
            };
            if let Err(error) = outcome {
                tracing::warn!(request = request.name_any(), %error, "a snapshot request's status could not be set");
            }
        }
        // The next change to any request (ours included: a pass that changed nothing ends the cycle).
        tokio::select! {
            () = token.cancelled() => return,
            Some(_) = changes.next() => {}
            () = tokio::time::sleep(RELIST) => {}
        }
        // Everything that came meanwhile (our own status writes among it) is one more look, not one each.
        while let Some(Some(_)) = futures::FutureExt::now_or_never(changes.next()) {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_for_no_shard_an_unknown_one_or_one_twice_is_refused_naming_what_is_wrong() {
        let known = ["root", "alpha"];
        let shards = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(refused(&shards(&["root", "alpha"]), &known), None);
        assert_eq!(refused(&[], &known).unwrap(), "spec.shards names no shard");
        assert_eq!(
            refused(&shards(&["beta"]), &known).unwrap(),
            "unknown shard beta: this agent snapshots root, alpha"
        );
        assert!(refused(&shards(&["Evil Name\n"]), &known).unwrap().starts_with("unknown shard (not a DNS label)"));
        assert_eq!(refused(&shards(&["root", "root"]), &known).unwrap(), "shard root is named twice");
    }
}
