//! kubeconfig-rotator: keeps kcp admin kubeconfigs fresh, proven against the real server before publishing.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    kcp_keeper_runtime::cli::main::<kubeconfig_rotator::KubeconfigRotator>()
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_passes_clap_debug_assert() {
        kcp_keeper_runtime::cli::command::<kubeconfig_rotator::KubeconfigRotator>().debug_assert();
    }
}
