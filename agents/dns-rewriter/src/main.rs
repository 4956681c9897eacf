//! dns-rewriter: not implemented yet (see the agent issues).
#![forbid(unsafe_code)]

fn main() {
    eprintln!("dns-rewriter: not implemented yet");
    std::process::exit(2);
}
