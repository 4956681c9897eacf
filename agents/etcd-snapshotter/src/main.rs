//! etcd-snapshotter: verified streaming snapshots of every kcp shard's etcd to S3, retention and restore.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    kcp_keeper_runtime::cli::main::<etcd_snapshotter::EtcdSnapshotter>()
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_passes_clap_debug_assert() {
        kcp_keeper_runtime::cli::command::<etcd_snapshotter::EtcdSnapshotter>().debug_assert();
    }
}
