//! kubeconfig-rotator: its own logic arrives with its issue; until then it runs as a placeholder agent on the shared
//! runtime (admin port, leader election, configuration, apiserver check), so the binary, chart and probes work.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use kcp_keeper_runtime::agent::AgentInfo;

const INFO: AgentInfo = AgentInfo { name: "kubeconfig-rotator", metrics_prefix: "kubeconfig_rotator" };

#[tokio::main]
async fn main() -> ExitCode {
    kcp_keeper_runtime::placeholder::main(INFO).await
}

#[cfg(test)]
mod tests {
    #[test]
    fn example_configuration_is_valid() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("example.yaml");
        kcp_keeper_runtime::config::load::<kcp_keeper_runtime::placeholder::Config>(&path).unwrap();
    }
}
