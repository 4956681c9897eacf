//! ca-syncer's domain logic: strict certificate parsing, byte-stable bundles, rotation-safe retention and the
//! configuration. Pure functions and types, no Kubernetes client and no I/O; the agent binary wires them to
//! the cluster.
#![forbid(unsafe_code)]

pub mod bundle;
pub mod certs;
pub mod config;
pub mod duration;
pub mod names;
pub mod rotation;

#[cfg(test)]
mod testcerts;
