//! ca-syncer: copies CA certificates into the Secrets and ConfigMaps consumers mount and hot-reload.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    kcp_keeper_runtime::cli::main::<ca_syncer::CaSyncer>()
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_passes_clap_debug_assert() {
        kcp_keeper_runtime::cli::command::<ca_syncer::CaSyncer>().debug_assert();
    }
}
