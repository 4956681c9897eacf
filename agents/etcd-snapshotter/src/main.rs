//! etcd-snapshotter: not implemented yet (see the agent issues).
#![forbid(unsafe_code)]

fn main() {
    eprintln!("etcd-snapshotter: not implemented yet");
    std::process::exit(2);
}
