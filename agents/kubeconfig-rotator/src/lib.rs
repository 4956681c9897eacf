//! kubeconfig-rotator: keeps the admin kubeconfigs other components use fresh. It follows a kcp-operator
//! `Kubeconfig` (or a plain Secret, or a cert-manager certificate Secret), nudges the operator when its render
//! is stale, forces a renewal that is overdue, proves every candidate against the real server, and publishes it
//! to target Secrets in other namespaces, never replacing a credential with a worse one.
//!
//! Pure logic (no client, no I/O): [`config`], [`credential`] (parse, check, rewrite, build), [`policy`] (the
//! decisions), [`rbac`]. The edges: [`scope`] (watches and stores from the configuration), [`prove`] (the
//! SelfSubjectReview), [`controller`] (the reconciler the runtime's driver runs) and [`oneshot`].
#![forbid(unsafe_code)]

pub mod config;
pub mod controller;
pub mod credential;
pub mod metrics;
pub mod objects;
pub mod oneshot;
pub mod policy;
pub mod prove;
pub mod rbac;
pub mod scope;
