//! The dns-rewriter binary as the chart runs it, against the real test bed. `run` is still the runtime's
//! placeholder loop (on this agent's real configuration); these prove the lifecycle around it.

testbed::agent_binary_tests!("dns-rewriter");

/// A runtime property, proven once through a real binary.
#[tokio::test]
async fn a_second_sigterm_during_a_stuck_drain_exits_at_once() -> anyhow::Result<()> {
    testbed::agent_process::check_second_signal_exits_at_once(std::path::Path::new(BINARY), &example_config()).await
}

/// A runtime property, proven once through a real binary.
#[tokio::test]
async fn a_leader_that_cannot_renew_its_lease_exits_to_rejoin() -> anyhow::Result<()> {
    testbed::agent_process::check_lost_lease_exits(std::path::Path::new(BINARY), &example_config()).await
}
