//! etcd-snapshotter: verified streaming snapshots of every kcp shard's etcd to S3, retention and restore.
//!
//! Pure logic (no I/O): [`config`], [`retention`], [`manifest`] (bucket layout and manifest format),
//! [`trailer`] (etcd's trailing sha256), [`encode`] (zstd, age and parts). The edges: [`member`] (etcd),
//! [`storage`] (S3), [`snapshot`] (one proven snapshot), [`catalog`] (listing, retention applied),
//! [`restore`], [`daemon`] (`run`), [`commands`] (the one-shots) and [`rbac`].
#![forbid(unsafe_code)]

pub mod cadence;
pub mod catalog;
pub mod commands;
pub mod config;
pub mod daemon;
pub mod drill;
pub mod encode;
pub mod manifest;
pub mod member;
pub mod metrics;
pub mod rbac;
pub mod restore;
pub mod retention;
pub mod snapshot;
pub mod storage;
pub mod trailer;
