//! kcp-keeper: `kcp-keeper doctor` checks a kcp installation against the seeds' Verify steps and known foot-guns.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    kcp_keeper_runtime::init_crypto();
    kcp_keeper_doctor::cli::main()
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_passes_clap_debug_assert() {
        use clap::CommandFactory;
        kcp_keeper_doctor::cli::Cli::command().debug_assert();
    }
}
