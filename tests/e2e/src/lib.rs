//! End-to-end support: the kcp-like layout the demo and the agents' end-to-end tests run against.

pub mod layout;
