//! RBAC, proven with a real ServiceAccount token holding exactly what `dns-rewriter rbac` prints (and
//! docs/dns-rewriter.md shows): the agent discovers from the operator's objects, reads Services, creates and
//! writes its one ConfigMap, and CoreDNS answers; the audit log shows no refused request, the ConfigMap only
//! ever addressed by name, and, once settled, cycles that send no write at all.

mod common;

use std::path::Path;

use anyhow::{Context, Result};
use common::*;
use testbed::ControlPlane;
use testbed::agent_process::run_to_completion;
use testbed::audit::Request;
use testbed::coredns::K3S_COREFILE;

const HOSTS: [&str; 4] = ["alpha.kcp.example.com", "kcp-root.example.com", "kcp.example.com", "root.kcp.example.com"];

/// Applies `yaml` as the admin with the bed's real kubectl.
fn kubectl_apply(bed: &ControlPlane, yaml: &str) -> Result<()> {
    let file = bed.subdir("rbac")?.join("rbac.yaml");
    std::fs::write(&file, yaml)?;
    let kubeconfig = kubeconfig(bed).display().to_string();
    let out = std::process::Command::new(bed.peers.path("kubectl"))
        .args(["--kubeconfig", &kubeconfig, "apply", "-f", &file.display().to_string()])
        .output()?;
    anyhow::ensure!(out.status.success(), "kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

#[tokio::test]
async fn with_exactly_the_documented_rbac_the_agent_writes_its_one_configmap_and_a_no_op_cycle_writes_nothing()
-> Result<()> {
    let (bed, ns, client) = fresh_bed().await?;
    let agent_ns = bed.namespace().await?;
    seed_operator(&client, &ns).await?;
    let (dns, _kubelet) = k3s_coredns(&bed, K3S_COREFILE).await?;
    let config = write_config(
        &bed,
        &format!(
            "mode: k3s\ndiscovery: {{namespace: {ns}, rootShards: true, shards: true, frontProxies: true}}\n\
             verify: {{resolver: '127.0.0.1:{}', settle: 60s}}\nresyncInterval: 10s\n",
            dns.port
        ),
    )?;
    let config_arg = config.display().to_string();
    let (code, yaml, stderr) =
        run_to_completion(Path::new(BINARY), &["rbac", "--config", &config_arg, "--namespace", &agent_ns])?;
    assert_eq!(code, Some(0), "{stderr}");
    let (kubeconfig, user) = bed.service_account_kubeconfig(&agent_ns, "dns-rewriter").await?;
    kubectl_apply(&bed, &yaml)?;

    let agent = agent(&bed, &agent_ns, &config).kubeconfig(&kubeconfig).start().await?;
    // A replica can be ready as a follower before it takes the Lease (tests/daemon.rs): wait for the leader's
    // first verified cycle rather than read it once.
    for host in HOSTS {
        let series = format!("dns_rewriter_host_verified{{host=\"{host}\"}}");
        agent.wait_for_metric(&series, WAIT, |v| v == 1.0).await;
    }
    let (_, rv) = configmap_key(&client, K3S_CONFIGMAP, "kcp-split-horizon.override").await.context("created")?;

    let audit = || testbed::audit::by_user(&bed.apiserver.audit_log, &user);
    let requests = audit()?;
    let refused: Vec<&Request> = requests.iter().filter(|r| r.code == Some(403)).collect();
    assert!(refused.is_empty(), "refused: {refused:?}");
    for r in requests.iter().filter(|r| r.resource == "configmaps") {
        // Its own ConfigMap, and node-local-dns's (looked for by default, by name; absent here).
        let by_name = [K3S_CONFIGMAP, "node-local-dns"]
            .iter()
            .any(|name| r.name.as_deref() == Some(*name) || r.uri.contains(&format!("metadata.name%3D{name}")));
        assert!(by_name, "the ConfigMap is only addressed by name: {r:?}");
    }
    assert!(!requests.iter().any(|r| r.resource == "secrets"), "no Secret is ever read");
    // Lease renewals are writes too; what matters is the agent's own work: its ConfigMap and Events.
    let work_writes = |requests: &[Request]| -> Vec<Request> {
        requests.iter().filter(|r| r.is_write() && r.resource != "leases").cloned().collect()
    };
    let before = work_writes(&requests);
    assert!(
        before.iter().any(|r| r.resource == "configmaps" && r.verb == "patch"),
        "the first cycle's write is in the audit log (the count works): {before:?}"
    );

    // Cycles with nothing to do: woken by resyncs and by Service changes that change no rule.
    let at = last_cycle(&agent).await;
    let mut at2 = at;
    for i in 0..3 {
        let patch = serde_json::json!({"metadata": {"labels": {"test.kcp-keeper.io/touched": i.to_string()}}});
        kube::Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), &ns)
            .patch("root-kcp", &Default::default(), &kube::api::Patch::Merge(&patch))
            .await?;
        at2 = wait_cycles(&agent, at2, 1).await;
    }
    assert!(at2 > at, "cycles ran");
    let after = work_writes(&audit()?);
    assert_eq!(after, before, "no write in {} settled cycles", 3);
    let (_, rv_after) = configmap_key(&client, K3S_CONFIGMAP, "kcp-split-horizon.override").await.context("key")?;
    assert_eq!(rv_after, rv);
    Ok(())
}
