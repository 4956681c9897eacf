//! The kubeconfig-rotator binary as the chart runs it, against the real test bed.

testbed::agent_binary_tests!("kubeconfig-rotator");
