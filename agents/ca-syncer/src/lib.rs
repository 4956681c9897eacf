//! ca-syncer: CA certificates into the Secrets and ConfigMaps consumers mount and hot-reload.
//!
//! Pure domain logic (no Kubernetes client, no I/O): [`certs`] (strict parsing), [`bundle`] (byte-stable
//! bundles), [`rotation`] (keeping rotated-out CAs), [`config`]. The edges: [`sources`], [`live_check`],
//! [`controller`] (the agent loop) and [`sidecar`] (`ca-syncer watch`).
#![forbid(unsafe_code)]

pub mod bundle;
pub mod certs;
pub mod config;
pub mod controller;
pub mod live_check;
pub mod metrics;
pub mod rotation;
pub mod sidecar;
pub mod sources;

#[cfg(test)]
mod testcerts;
