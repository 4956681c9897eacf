//! etcd-snapshotter: verified streaming snapshots of every kcp shard's etcd to S3, retention and restore.
//!
//! Where the code is (the same roles in every agent; docs/etcd-snapshotter.md has the table):
//! - [`config`]: the file as written and validated, one part per section in `config/`;
//! - [`error`]: why a snapshot or a drill failed (the `reason` labels);
//! - [`scope`]: what it names in Kubernetes (its own Lease; the operator's objects `beforeUpgrade` watches),
//!   and [`scope::rbac`], the Role for it;
//! - [`schedule`]: the daemon, every shard's snapshot and drill schedules;
//! - [`metrics`] (composing each feature's own metrics; the label types are [`labels`], a leaf);
//! - [`cli`]: the one-shots (`snapshot`, `list`, `verify`, `drill`, `restore`, `plan`).
//!
//! The domain, pure logic: [`retention`], [`manifest`] (bucket layout and manifest format), [`parts`] (part
//! sizes within S3's 10,000 parts), [`trailer`]
//! (etcd's trailing sha256), [`encode`] (zstd, age and parts), [`cadence`] (a schedule's longest gap). The
//! edges: [`member`] (etcd), [`storage`] (S3), [`shard_lock`] (one run per shard at a time, across processes),
//! [`snapshot`] (one proven snapshot), [`catalog`] (listing, retention applied), [`generation`] (the etcd cluster
//! a snapshot belongs to), [`restore`] and [`drill`] (restore drills; [`drill_report`] is the report's format,
//! beside the manifest), [`throwaway`] (the throwaway etcd and the one `etcdutl snapshot restore` wrapper every
//! restore, drill and replay goes through), [`delta`] (delta snapshots: the format
//! and chain, pure; `delta::writer` the leader's watch, `delta::replay` point-in-time restore, `delta::recovery` the recovery point stored per
//! shard), [`plan`] (a restore of every shard to one point in time, planned from the bucket), [`health`]
//! (every member's database size, quota, alarms and leader changes, read every 15 s), [`defrag`] (scheduled
//! defragmentation of the followers, one at a time: the decisions, pure; `defrag::run` the etcd calls),
//! [`upgrade`] (a snapshot before every kcp upgrade: the operator's object watched by the leader).
#![forbid(unsafe_code)]
#![warn(clippy::too_many_lines)]

pub mod cadence;
pub mod catalog;
pub mod cli;
pub mod clock;
pub mod config;
pub mod defrag;
pub mod delta;
pub mod drill;
pub mod drill_report;
pub mod encode;
pub mod error;
pub mod generation;
pub mod health;
pub mod installation_restore;
pub mod integrity;
pub mod json;
pub mod labels;
pub mod manifest;
pub mod member;
pub mod metrics;
pub mod objects;
pub mod part_buf;
pub mod parts;
pub mod plan;
pub mod requests;
pub mod restore;
pub mod retention;
pub mod retries;
pub mod schedule;
pub mod scope;
pub mod secondary;
pub mod shard_lock;
pub mod signing;
pub mod snapshot;
pub mod storage;
pub mod throwaway;
pub mod trailer;
pub mod upgrade;

use std::process::ExitCode;

use kcp_keeper_runtime::agent::{Agent, Daemon, NoFlags, Scheduled};
use kcp_keeper_runtime::rbac::{Rbac, Subjects};

/// The agent: snapshots on the runtime's schedules ([`Scheduled`]), failures counted per shard by itself.
pub struct EtcdSnapshotter;

impl Agent for EtcdSnapshotter {
    const NAME: &'static str = "etcd-snapshotter";
    const METRICS_PREFIX: &'static str = "etcd_snapshotter";
    const ABOUT: &'static str = "Verified etcd snapshots to S3";
    type Config = config::Config;
    type Error = error::SnapshotError;
    type Form = Scheduled;
    type Metrics = metrics::Metrics;
    type Command = cli::Command;
    type RunFlags = NoFlags;

    /// The Role: the Lease and Events, whatever the shards; plus, for each shard's `beforeUpgrade`, reads of
    /// the operator's object by name and Events in its namespace ([`scope::rbac`]).
    fn rbac(config: Option<&config::Config>, who: &Subjects) -> anyhow::Result<Rbac> {
        Ok(scope::rbac::render(Self::NAME, who, config))
    }

    async fn daemon(daemon: Daemon<Self>) -> anyhow::Result<()> {
        let lease = scope::Lease::of_daemon(&daemon.ctx);
        schedule::run(daemon.ctx, daemon.metrics, lease).await
    }

    async fn oneshot(command: cli::Command) -> anyhow::Result<ExitCode> {
        cli::run(command).await
    }
}
