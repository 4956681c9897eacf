//! kubeconfig-rotator: not implemented yet (see the agent issues).
#![forbid(unsafe_code)]

fn main() {
    eprintln!("kubeconfig-rotator: not implemented yet");
    std::process::exit(2);
}
