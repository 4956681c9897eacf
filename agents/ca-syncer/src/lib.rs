//! ca-syncer: CA certificates into the Secrets and ConfigMaps consumers mount and hot-reload.
//!
//! Pure domain logic (no Kubernetes client, no I/O): [`certs`] (strict parsing), [`bundle`] (byte-stable
//! bundles), [`rotation`] (keeping rotated-out CAs), [`config`], [`rbac`] (the Roles a configuration needs).
//! The edges: [`scope`] (watches and stores built from the configuration), [`sources`], [`state`] (each
//! bundle's rotation record, in the agent's own namespace), [`live_check`],
//! [`controller`] (the reconciler the runtime's driver runs) and [`sidecar`] (`ca-syncer watch`).
#![forbid(unsafe_code)]

pub mod bundle;
pub mod certs;
pub mod config;
pub mod controller;
pub mod live_check;
pub mod metrics;
pub mod rbac;
pub mod rotation;
pub mod scope;
pub mod sidecar;
pub mod sources;
pub mod state;

#[cfg(test)]
mod testcerts;
