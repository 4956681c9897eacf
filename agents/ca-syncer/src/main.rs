//! ca-syncer: not implemented yet (see the agent issues).
#![forbid(unsafe_code)]

fn main() {
    eprintln!("ca-syncer: not implemented yet");
    std::process::exit(2);
}
