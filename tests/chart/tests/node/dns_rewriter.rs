//! dns-rewriter's tests on the shared node and install (see main.rs), beyond the install-wide ones there.

#[allow(unused_imports)]
use super::*;
