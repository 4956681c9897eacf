//! dns-rewriter: CoreDNS split-horizon rules for kcp's public hostnames.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    kcp_keeper_runtime::cli::main::<dns_rewriter::DnsRewriter>()
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_passes_clap_debug_assert() {
        kcp_keeper_runtime::cli::command::<dns_rewriter::DnsRewriter>().debug_assert();
    }
}
