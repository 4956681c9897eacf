//! `shards`: each kcp shard's etcd (its members' client URLs and TLS) and its snapshot schedule.

use std::path::PathBuf;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::names::check_dns_label;
use kcp_keeper_runtime::schedule::{Schedule, ScheduleSpec};
use schemars::JsonSchema;
use serde::Deserialize;

use super::defrag::{Defrag, RawDefrag, defrag};
use super::deltas::{Deltas, RawDeltas, deltas};
use super::drills::{RawShardDrill, ShardDrill, shard_drill};

/// One kcp shard's etcd.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawShard {
    /// The shard's name (a DNS label): its directory in the bucket, its metrics' `shard` label.
    pub name: String,
    /// Client URLs of the shard's etcd members (`scheme://host:port`; `https://` with `tls`). One healthy
    /// voting member is picked per run.
    pub endpoints: Vec<String>,
    /// Client TLS for the members.
    #[serde(default)]
    pub tls: Option<TlsFiles>,
    /// When the shard is snapshotted (recorded on the Lease as `snapshot-<shard>`).
    pub schedule: ScheduleSpec,
    /// Restore drills of the shard's snapshots.
    #[serde(default)]
    pub drill: Option<RawShardDrill>,
    /// Delta snapshots between full snapshots (watch events written every few seconds): the recovery point
    /// and restores to a point in time (`restore --at`).
    #[serde(default)]
    pub deltas: Option<RawDeltas>,
    /// A full snapshot and a drill of the shard whenever the kcp image of the kcp-operator object that runs it
    /// changes (watched by name; off when absent).
    #[serde(default)]
    pub before_upgrade: Option<crate::upgrade::RawBeforeUpgrade>,
    /// Scheduled defragmentation of the shard's members (off when absent): a snapshot first, then each
    /// follower alone, never the leader while followers exist.
    #[serde(default)]
    pub defrag: Option<RawDefrag>,
}

/// Client TLS for a shard's etcd: PEM files (mounted from a Secret), read at each connection.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsFiles {
    /// The CA that signed the members' serving certificates.
    pub ca_file: PathBuf,
    /// A client certificate (with `keyFile`).
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// The client certificate's key (with `certFile`).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    pub name: String,
    pub endpoints: Vec<String>,
    pub tls: Option<TlsFiles>,
    pub schedule: Schedule,
    pub drill: Option<ShardDrill>,
    /// Present when deltas are enabled.
    pub deltas: Option<Deltas>,
    /// Present when `beforeUpgrade` is configured.
    pub before_upgrade: Option<crate::upgrade::Watched>,
    /// Present when scheduled defragmentation is enabled.
    pub defrag: Option<Defrag>,
}

pub(super) fn shards(raw: Vec<RawShard>, kcp_binary: bool, errors: &mut Vec<FieldError>) -> Vec<Shard> {
    if raw.is_empty() {
        errors.push(FieldError::new("shards", "at least one shard is required"));
    }
    let mut out: Vec<Shard> = Vec::new();
    for (i, shard) in raw.into_iter().enumerate() {
        let at = |field: &str| format!("shards[{i}].{field}");
        if check_dns_label(&shard.name).is_err() {
            errors.push(FieldError::new(at("name"), "must be a DNS label (lowercase letters, digits, '-')"));
        } else if out.iter().any(|s| s.name == shard.name) {
            errors.push(FieldError::new(at("name"), "duplicate shard name"));
        }
        if shard.endpoints.is_empty() {
            errors.push(FieldError::new(at("endpoints"), "at least one endpoint is required"));
        }
        for (j, endpoint) in shard.endpoints.iter().enumerate() {
            if let Err(reason) = check_endpoint(endpoint, shard.tls.is_some()) {
                errors.push(FieldError::new(at(&format!("endpoints[{j}]")), reason));
            }
        }
        if let Some(tls) = &shard.tls
            && tls.cert_file.is_some() != tls.key_file.is_some()
        {
            errors.push(FieldError::new(at("tls"), "certFile and keyFile go together"));
        }
        if shard.drill.as_ref().is_some_and(|d| d.kcp.is_some()) && !kcp_binary {
            errors.push(FieldError::new(at("drill.kcp"), "needs drills.kcp (the kcp binary)"));
        }
        let drill = shard.drill.and_then(|raw| shard_drill(&shard.name, raw, &at, errors));
        let deltas = deltas(shard.deltas, &at, errors);
        let before_upgrade = crate::upgrade::before_upgrade(shard.before_upgrade, &at, errors);
        let defrag = defrag(&shard.name, shard.endpoints.len(), shard.defrag, &at, errors);
        let name = format!("snapshot-{}", shard.name);
        let Some(schedule) = super::schedule(&name, &shard.schedule, at("schedule"), errors) else { continue };
        out.push(Shard {
            name: shard.name,
            endpoints: shard.endpoints,
            tls: shard.tls,
            schedule,
            drill,
            deltas,
            before_upgrade,
            defrag,
        });
    }
    out
}

/// An etcd client URL: `http://` or `https://` (matching whether TLS is configured), host and port, no
/// credentials and no path.
pub(super) fn check_endpoint(endpoint: &str, tls: bool) -> Result<(), &'static str> {
    let rest = match (endpoint.strip_prefix("http://"), endpoint.strip_prefix("https://")) {
        (Some(rest), _) if !tls => rest,
        (_, Some(rest)) if tls => rest,
        (Some(_), _) => return Err("tls is configured: use https://"),
        (_, Some(_)) => return Err("https:// needs tls (caFile)"),
        _ => return Err("must start with http:// or https://"),
    };
    if rest.contains('@') {
        return Err("must not carry credentials");
    }
    let hostport = rest.trim_end_matches('/');
    match hostport.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && !hostport.contains('/') && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err("must be scheme://host:port"),
    }
}
