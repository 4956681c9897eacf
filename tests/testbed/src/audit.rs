//! Reading the apiserver's audit log: who sent which requests. `apiserver_request_total` has no user label, so
//! "this agent made no write" and "this agent never touched anything outside its scope" are read here.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;

/// One request, as the audit log records it at Metadata level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub user: String,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, ...
    pub verb: String,
    /// `secrets`, `leases`, ...; empty for non-resource requests (`/version`).
    pub resource: String,
    pub api_group: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub uri: String,
    pub code: Option<u16>,
}

impl Request {
    /// Whether this request changes state.
    pub fn is_write(&self) -> bool {
        matches!(self.verb.as_str(), "create" | "update" | "patch" | "delete" | "deletecollection")
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(rename = "auditID")]
    audit_id: String,
    verb: String,
    #[serde(default, rename = "requestURI")]
    request_uri: String,
    user: User,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default)]
    response_status: Option<Status>,
}

#[derive(Deserialize)]
struct User {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    api_group: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    code: Option<u16>,
}

/// Every request in the log, once each (a watch is logged when it starts and again when it ends), in order.
pub fn read(log: &Path) -> Result<Vec<Request>> {
    let text = std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    let mut order: Vec<String> = Vec::new();
    let mut by_id: HashMap<String, Request> = HashMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        // The last line may be half-written while the apiserver runs.
        let Ok(event) = serde_json::from_str::<Event>(line) else { continue };
        let object = event.object_ref.unwrap_or(ObjectRef {
            resource: String::new(),
            api_group: String::new(),
            namespace: None,
            name: None,
        });
        let request = Request {
            user: event.user.username,
            verb: event.verb,
            resource: object.resource,
            api_group: object.api_group,
            namespace: object.namespace,
            name: object.name,
            uri: event.request_uri,
            code: event.response_status.and_then(|s| s.code),
        };
        if by_id.insert(event.audit_id.clone(), request).is_none() {
            order.push(event.audit_id);
        }
    }
    Ok(order.into_iter().filter_map(|id| by_id.remove(&id)).collect())
}

/// `user`'s requests only.
pub fn by_user(log: &Path, user: &str) -> Result<Vec<Request>> {
    Ok(read(log)?.into_iter().filter(|r| r.user == user).collect())
}

/// How many requests `user` sent, by (verb, resource).
pub fn count(log: &Path, user: &str) -> Result<BTreeMap<(String, String), usize>> {
    let mut counts = BTreeMap::new();
    for r in by_user(log, user)? {
        *counts.entry((r.verb, r.resource)).or_insert(0) += 1;
    }
    Ok(counts)
}
