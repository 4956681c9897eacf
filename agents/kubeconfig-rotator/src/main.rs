//! kubeconfig-rotator: not built yet (keeping kcp admin kubeconfigs fresh arrives with its own issue).
//!
//! Until then the binary refuses to start: a binary that served `/readyz` 200 while doing nothing would let a
//! deployment look healthy with none of the agent's work done.
#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "error: kubeconfig-rotator is not built yet (keeping kcp admin kubeconfigs fresh arrives with its own issue); this binary does nothing and refuses \
         to run"
    );
    ExitCode::FAILURE
}
