//! `dns-rewriter run` as a process against the test bed's real kube-apiserver and a real CoreDNS that reads
//! the agent's ConfigMap projected the kubelet way (tests/common: `k3s_coredns`, `corefile_coredns`). The agent
//! writes; CoreDNS's `reload` picks the change up; DNS queries to 127.0.0.1 prove the answers. Test traffic is
//! DNS to 127.0.0.1 only; ClusterIPs are data in the answers.

mod common;

use std::time::Duration;

use anyhow::{Context, Result};
use common::*;
use dns_rewriter::block;
use dns_rewriter::render;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use testbed::coredns::K3S_COREFILE;

const OVERRIDE_KEY: &str = "kcp-split-horizon.override";

/// A configuration verifying through `dns_port` on loopback, with a short resync so cycles come often.
fn config(mode: &str, body: &str, dns_port: u16) -> String {
    format!("{mode}{body}verify: {{resolver: '127.0.0.1:{dns_port}', settle: 60s}}\nresyncInterval: 10s\n")
}

fn rule(host: &str, ns: &str, service: &str) -> String {
    format!("- {{host: {host}, service: {{namespace: {ns}, name: {service}}}}}\n")
}

fn verified(host: &str) -> String {
    format!("dns_rewriter_host_verified{{host=\"{host}\"}}")
}

/// Changes a label on a watched Service: a change that wakes the agent but changes no rule.
async fn touch(client: &kube::Client, ns: &str, name: &str, value: usize) -> Result<()> {
    let patch = json!({"metadata": {"labels": {"test.kcp-keeper.io/touched": value.to_string()}}});
    Api::<Service>::namespaced(client.clone(), ns).patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

#[tokio::test]
async fn k3s_mode_the_agent_writes_and_coredns_answers_the_public_name_with_the_service_cluster_ip() -> Result<()> {
    let (bed, ns, client) = fresh_bed().await?;
    let root = create_service(&client, &ns, "root-kcp", &[], false).await?.unwrap();
    let (dns, _kubelet) = k3s_coredns(&bed, K3S_COREFILE).await?;
    let path = write_config(
        &bed,
        &config("mode: k3s\n", &format!("rules:\n{}", rule("kcp-root.example.com", &ns, "root-kcp")), dns.port),
    )?;
    let agent = agent(&bed, &ns, &path).start().await?;

    // A replica is ready as a follower before it takes the Lease, so wait for the leader's first cycle, which
    // wrote, then asked CoreDNS until the name answered.
    agent.wait_for_metric(&verified("kcp-root.example.com"), WAIT, |v| v == 1.0).await;
    assert_eq!(answers(&dns, "kcp-root.example.com").await, vec![("kcp-root.example.com".to_string(), root)]);
    let (value, _) = configmap_key(&client, K3S_CONFIGMAP, OVERRIDE_KEY).await.context("the key is written")?;
    assert_eq!(value, render::render(&rules(&[("kcp-root.example.com", &ns, "root-kcp", root)]), &domain()));
    assert_eq!(agent.metric("dns_rewriter_rules ").await?, 1.0);
    assert!(agent.metric("dns_rewriter_write_timestamp_seconds ").await? > 0.0);
    // A host's check time is set just after its result, and a scrape can fall in between: waited for, not raced.
    let checked = "dns_rewriter_host_check_timestamp_seconds{host=\"kcp-root.example.com\"}";
    agent.wait_for_metric(checked, WAIT, |v| v > 0.0).await;
    let events = events_about(&client, K3S_CONFIGMAP).await;
    assert!(events.iter().any(|(reason, note)| reason == "RulesWritten" && note.contains("1 rules")), "{events:?}");
    Ok(())
}

#[tokio::test]
async fn corefile_mode_changes_only_the_marked_block_over_many_cycles_and_removing_a_rule_removes_its_line()
-> Result<()> {
    let (bed, ns, client) = fresh_bed().await?;
    let root = create_service(&client, &ns, "root-kcp", &[], false).await?.unwrap();
    let alpha = create_service(&client, &ns, "alpha-shard-kcp", &[], false).await?.unwrap();
    let (dns, original, server, _kubelet) = corefile_coredns(&bed).await?;
    let one = format!("rules:\n{}", rule("kcp-root.example.com", &ns, "root-kcp"));
    let two = format!("{one}{}", rule("alpha.kcp.example.com", &ns, "alpha-shard-kcp"));
    let path = corefile_config(&bed, &server, &two, dns.port)?;
    let agent = agent(&bed, &ns, &path).start().await?;
    wait_answer(&dns, "kcp-root.example.com", root, WAIT).await;
    wait_answer(&dns, "alpha.kcp.example.com", alpha, WAIT).await;

    let (written, rv) = configmap_key(&client, COREFILE_CONFIGMAP, "Corefile").await.context("the Corefile")?;
    assert_eq!(block::set(&written, &server, None)?, original, "every byte outside the block is the original's");
    let both = rules(&[
        ("kcp-root.example.com", &ns, "root-kcp", root),
        ("alpha.kcp.example.com", &ns, "alpha-shard-kcp", alpha),
    ]);
    assert_eq!(block::content(&written, &server)?, Some(render::render(&both, &domain())));

    // Many cycles, each woken by a change to a watched Service that changes no rule: not one write.
    let mut at = last_cycle(&agent).await;
    for i in 0..5 {
        touch(&client, &ns, "alpha-shard-kcp", i).await?;
        at = wait_cycles(&agent, at, 1).await;
    }
    let (after, rv_after) = configmap_key(&client, COREFILE_CONFIGMAP, "Corefile").await.context("the Corefile")?;
    assert_eq!(after, written, "identical bytes after many cycles");
    assert_eq!(rv_after, rv, "and no write at all: the resourceVersion is unchanged");

    // Removing a rule from the configuration (reloaded live) removes exactly its line.
    std::fs::write(&path, config(&corefile_mode(&server), &one, dns.port))?;
    let removed = testbed::eventually(WAIT, "the Corefile to change", || async {
        configmap_key(&client, COREFILE_CONFIGMAP, "Corefile").await.filter(|(v, _)| *v != written).map(|(v, _)| v)
    })
    .await;
    let line = format!("    rewrite name exact alpha.kcp.example.com. alpha-shard-kcp.{ns}.svc.cluster.local.");
    let expected: Vec<&str> = written.lines().filter(|l| *l != line).collect();
    assert_eq!(written.lines().count(), expected.len() + 1, "the line was there:\n{written}");
    assert_eq!(removed.lines().collect::<Vec<_>>(), expected, "exactly that line is gone");
    assert!(removed.ends_with('\n'));
    wait_no_answer(&dns, "alpha.kcp.example.com", WAIT).await;
    wait_answer(&dns, "kcp-root.example.com", root, WAIT).await;
    agent.wait_for_metric("dns_rewriter_rules ", WAIT, |v| v == 1.0).await;
    Ok(())
}

#[tokio::test]
async fn discovery_from_operator_objects_writes_what_the_equivalent_explicit_configuration_writes() -> Result<()> {
    let (bed, ns, client) = fresh_bed().await?;
    let explicit = seed_operator(&client, &ns).await?;
    let (dns, _kubelet) = k3s_coredns(&bed, K3S_COREFILE).await?;
    let discovery = format!("discovery: {{namespace: {ns}, rootShards: true, shards: true, frontProxies: true}}\n");
    let path = write_config(&bed, &config("mode: k3s\n", &discovery, dns.port))?;
    let agent = agent(&bed, &ns, &path).start().await?;
    let hosts = ["alpha.kcp.example.com", "kcp-root.example.com", "kcp.example.com", "root.kcp.example.com"];
    for host in hosts {
        // Ready may come as a follower, before the Lease: wait for the leader's verified cycle.
        agent.wait_for_metric(&verified(host), WAIT, |v| v == 1.0).await;
    }
    let (discovered, rv) = configmap_key(&client, K3S_CONFIGMAP, OVERRIDE_KEY).await.context("the key")?;
    assert_eq!(discovered.lines().filter(|l| l.starts_with("rewrite name exact")).count(), hosts.len());

    // The explicit configuration, reloaded live: its cycle finds nothing to write.
    let reloaded_before = agent.metric("dns_rewriter_config_last_applied_timestamp_seconds ").await?;
    std::fs::write(&path, config("mode: k3s\n", &explicit, dns.port))?;
    let reloaded = agent
        .wait_for_metric("dns_rewriter_config_last_applied_timestamp_seconds ", WAIT, |v| v > reloaded_before)
        .await;
    wait_cycles(&agent, reloaded, 1).await;
    let (explicit_value, explicit_rv) = configmap_key(&client, K3S_CONFIGMAP, OVERRIDE_KEY).await.context("the key")?;
    assert_eq!(explicit_value, discovered, "the same bytes");
    assert_eq!(explicit_rv, rv, "so no write");
    Ok(())
}

#[tokio::test]
async fn each_bad_rule_is_an_error_for_itself_alone_named_counted_and_evented_while_the_others_are_written()
-> Result<()> {
    use dns_rewriter::discovery::Kind;
    let (bed, ns, client) = fresh_bed().await?;
    let root = create_service(&client, &ns, "root-kcp", &[], false).await?.unwrap();
    create_service(&client, &ns, "beta-shard-kcp", &[], true).await?;
    // A public name no rule can carry, from an operator object (the configuration itself refuses such names).
    create_operator_object(
        &client,
        &ns,
        Kind::FrontProxy,
        "frontproxy",
        json!({
            "rootShard": {"ref": {"name": "root"}}, "external": {"hostname": "kcp_edge.example.com", "port": 443},
        }),
    )
    .await?;
    let (dns, _kubelet) = k3s_coredns(&bed, K3S_COREFILE).await?;
    let body = format!(
        "rules:\n- {{host: kcp-root.example.com, service: {{namespace: {ns}, name: root-kcp}}, port: 443}}\n{}{}\
         discovery: {{namespace: {ns}, frontProxies: true}}\n",
        rule("gone.example.com", &ns, "gone"),
        rule("beta.kcp.example.com", &ns, "beta-shard-kcp"),
    );
    let path = write_config(&bed, &config("mode: k3s\n", &body, dns.port))?;
    let agent = agent(&bed, &ns, &path).start().await?;

    // The good rule is written and answers; the bad ones are not written.
    agent.wait_for_metric(&verified("kcp-root.example.com"), WAIT, |v| v == 1.0).await;
    wait_answer(&dns, "kcp-root.example.com", root, WAIT).await;
    let (value, _) = configmap_key(&client, K3S_CONFIGMAP, OVERRIDE_KEY).await.context("the key")?;
    assert_eq!(value, render::render(&rules(&[("kcp-root.example.com", &ns, "root-kcp", root)]), &domain()));
    assert_eq!(agent.metric("dns_rewriter_rules ").await?, 1.0);
    for (reason, n) in
        [("service_missing", 1.0), ("service_headless", 1.0), ("invalid_hostname", 1.0), ("conflict", 0.0)]
    {
        let series = format!("dns_rewriter_rule_errors{{reason=\"{reason}\"}}");
        assert_eq!(agent.metric(&series).await?, n, "{series}");
    }
    assert!(agent.metric(&verified("gone.example.com")).await.is_err(), "a rule not written has no host series");

    // Each error is an Event on the managed ConfigMap naming where the rule came from; the port is a warning.
    let events = testbed::eventually(WAIT, "four Events", || async {
        let events = events_about(&client, K3S_CONFIGMAP).await;
        (events.iter().filter(|(r, _)| r != "RulesWritten").count() >= 4).then_some(events)
    })
    .await;
    let has = |reason: &str, text: &str| events.iter().any(|(r, n)| r == reason && n.contains(text));
    assert!(
        has("ServiceMissing", &format!("rules[1]: gone.example.com: Service {ns}/gone does not exist")),
        "{events:?}"
    );
    assert!(
        has("ServiceHeadless", &format!("rules[2]: beta.kcp.example.com: Service {ns}/beta-shard-kcp is headless")),
        "{events:?}"
    );
    assert!(
        has("InvalidHostname", &format!("FrontProxy {ns}/frontproxy spec.external.hostname: invalid hostname")),
        "{events:?}"
    );
    assert!(!events.iter().any(|(_, n)| n.contains("kcp_edge")), "an invalid name is never repeated: {events:?}");
    assert!(has("RuleWarning", "does not expose port 443"), "{events:?}");
    assert!(agent.process.log().contains("does not expose port 443"), "the warning is logged too");
    Ok(())
}

/// What `kcp-keeper doctor --rewriter-metrics` says of `host`, read from the running agent's metrics endpoint:
/// its `dns-rules` line's result and what it saw.
async fn doctor_on(client: &kube::Client, admin_url: &str, host: &str) -> (kcp_keeper_doctor::verdict::Level, String) {
    let options = kcp_keeper_doctor::options::Options {
        rewriter_metrics: vec![format!("{admin_url}/metrics")],
        verify: false,
        ..Default::default()
    };
    let report = kcp_keeper_doctor::run(client, &options).await;
    let line = report
        .checks
        .into_iter()
        .find(|v| v.check == kcp_keeper_doctor::rules::dns_rules::CHECK && v.subject == host)
        .unwrap_or_else(|| panic!("a dns-rules line for {host}"));
    (line.result, line.saw)
}

/// k3s's own Corefile caches answers (`cache 30`); with a TTL of 30s, a Service recreated with a new ClusterIP
/// keeps answering its old address from the cache for a while. The agent's verification sees that: the host
/// reads 0 (an alert) until CoreDNS answers the new address, then 1 again; `kcp-keeper doctor`'s `dns-rules`
/// line, read from the same metrics, turns FAIL and back to ok with it.
#[tokio::test]
async fn verification_and_the_doctor_fail_while_a_recreated_service_answers_its_old_address_and_clear_on_the_new()
-> Result<()> {
    use kcp_keeper_doctor::verdict::Level;
    let (bed, ns, client) = fresh_bed().await?;
    let old = create_service(&client, &ns, "root-kcp", &[], false).await?.unwrap();
    let cached = K3S_COREFILE.replace("ttl 5", "ttl 30").replace("    reload", "    cache 30\n    reload");
    let (dns, _kubelet) = k3s_coredns(&bed, &cached).await?;
    let path = write_config(
        &bed,
        &config("mode: k3s\n", &format!("rules:\n{}", rule("kcp-root.example.com", &ns, "root-kcp")), dns.port),
    )?;
    let agent = agent(&bed, &ns, &path).start().await?;
    let series = verified("kcp-root.example.com");
    agent.wait_for_metric(&series, WAIT, |v| v == 1.0).await;
    // The doctor also needs verification to have run, which the agent records just after the hosts' results.
    agent.wait_for_metric("dns_rewriter_verify_timestamp_seconds ", WAIT, |v| v > 0.0).await;
    let (result, saw) = doctor_on(&client, &agent.admin_url, "kcp-root.example.com").await;
    assert_eq!(result, Level::Ok, "{saw}");
    let checked = "dns_rewriter_host_check_timestamp_seconds{host=\"kcp-root.example.com\"}";
    let checked_before = agent.metric(checked).await?;

    // Fill the cache, then recreate the Service: it gets a new ClusterIP.
    assert_eq!(answers(&dns, "kcp-root.example.com").await, vec![("kcp-root.example.com".to_string(), old)]);
    let api = Api::<Service>::namespaced(client.clone(), &ns);
    api.delete("root-kcp", &Default::default()).await?;
    let new = testbed::eventually(WAIT, "the Service recreated", || {
        let (client, ns) = (client.clone(), ns.clone());
        async move { create_service(&client, &ns, "root-kcp", &[], false).await.ok().flatten() }
    })
    .await;
    assert_ne!(new, old);

    agent.wait_for_metric(&series, WAIT, |v| v == 0.0).await;
    // A fresh check, not a stale value: its time is set just after its result, so it is waited for too.
    agent.wait_for_metric(checked, WAIT, |v| v > checked_before).await;
    let (result, saw) = doctor_on(&client, &agent.admin_url, "kcp-root.example.com").await;
    assert_eq!(result, Level::Fail, "{saw}");
    assert!(saw.contains("did not answer exactly its Service's ClusterIP"), "{saw}");
    // Once the cache lets go, the new address answers and the alert clears.
    agent.wait_for_metric(&series, Duration::from_secs(90), |v| v == 1.0).await;
    let (result, saw) = doctor_on(&client, &agent.admin_url, "kcp-root.example.com").await;
    assert_eq!(result, Level::Ok, "{saw}");
    assert_eq!(answers(&dns, "kcp-root.example.com").await, vec![("kcp-root.example.com".to_string(), new)]);
    Ok(())
}

/// The agent never creates `coredns-custom` (its RBAC names the one ConfigMap, and a create cannot be limited
/// by name): until it exists, the leader says why and is not ready; once created, it writes and becomes ready.
#[tokio::test]
async fn without_its_configmap_the_agent_names_it_and_is_not_ready_until_it_exists_then_writes() -> Result<()> {
    let (bed, ns, client) = fresh_bed().await?;
    let root = create_service(&client, &ns, "root-kcp", &[], false).await?.unwrap();
    let path = write_config(&bed, &format!("mode: k3s\nrules:\n{}", rule("kcp-root.example.com", &ns, "root-kcp")))?;
    let agent = agent(&bed, &ns, &path).spawn()?;
    let missing = "dns_rewriter_reconcile_errors_total{reason=\"config_map_missing\"}";
    agent.wait_for_metric(missing, WAIT, |v| v >= 1.0).await;
    // The error is counted a moment before the health state records the failed cycle; not ready throughout.
    let url = format!("{}/readyz", agent.admin_url);
    testbed::eventually_seen(WAIT, "readyz says no cycle has succeeded", || async {
        let (code, _, body) = testbed::http::get(&url).await?;
        anyhow::ensure!(code == 503, "ready before the ConfigMap exists: {code} {body}");
        Ok(if body.contains("no cycle has succeeded yet") { Ok(()) } else { Err(body) })
    })
    .await?;
    assert!(agent.process.log().contains("ConfigMap kube-system/coredns-custom does not exist"));
    let events = events_about(&client, K3S_CONFIGMAP).await;
    assert!(events.iter().any(|(reason, _)| reason == "ConfigMapMissing"), "{events:?}");

    create_coredns_custom(client.clone()).await?;
    testbed::eventually(WAIT, "/readyz 200", || async {
        let code = testbed::http::get(&format!("{}/readyz", agent.admin_url)).await.map(|r| r.0).unwrap_or(0);
        (code == 200).then_some(())
    })
    .await;
    let (value, _) = configmap_key(&client, K3S_CONFIGMAP, OVERRIDE_KEY).await.context("the key")?;
    assert_eq!(value, render::render(&rules(&[("kcp-root.example.com", &ns, "root-kcp", root)]), &domain()));
    Ok(())
}

/// A Corefile the agent cannot edit safely (here, the configured server block appears twice) is refused
/// before writing: nothing is written, the refusal is an Event and a counted error, and the leader is not
/// ready.
#[tokio::test]
async fn a_corefile_the_pre_write_check_refuses_is_never_written_and_the_leader_is_not_ready() -> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let (bed, ns, client) = fresh_bed().await?;
    create_service(&client, &ns, "root-kcp", &[], false).await?;
    let ambiguous = ".:53 {\n    errors\n}\n.:53 {\n    whoami\n}\n";
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta { name: Some(COREFILE_CONFIGMAP.into()), ..Default::default() },
        data: Some([("Corefile".to_string(), ambiguous.to_string())].into()),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system").create(&Default::default(), &cm).await?;
    let (_, rv) = configmap_key(&client, COREFILE_CONFIGMAP, "Corefile").await.context("the Corefile")?;
    let body = format!("mode: corefile\ncorefile: {{}}\nrules:\n{}", rule("kcp-root.example.com", &ns, "root-kcp"));
    let path = write_config(&bed, &body)?;
    let agent = agent(&bed, &ns, &path).spawn()?;
    agent.wait_for_metric("dns_rewriter_reconcile_errors_total{reason=\"refused\"}", WAIT, |v| v >= 2.0).await;
    let (code, _, readyz) = testbed::http::get(&format!("{}/readyz", agent.admin_url)).await?;
    assert_eq!(code, 503, "{readyz}");
    let (value, rv_after) = configmap_key(&client, COREFILE_CONFIGMAP, "Corefile").await.context("the Corefile")?;
    assert_eq!((value.as_str(), rv_after), (ambiguous, rv), "not a byte written");
    let events = events_about(&client, COREFILE_CONFIGMAP).await;
    assert!(
        events.iter().any(|(reason, note)| reason == "WriteRefused" && note.contains("nothing written")),
        "{events:?}"
    );
    Ok(())
}

/// Seven configured rules whose names fail the check (more than the Event burst of five per reason), and one
/// good rule: a fresh `run` starts, writes the good rule and publishes one Event per bad rule. A reload that
/// adds a good rule and another bad one (a duplicate) is applied, not refused: the new good rule is written
/// and the new bad one gets its own Event too.
#[tokio::test]
async fn configured_rules_failing_validation_are_each_an_error_with_its_own_event_at_start_and_on_reload() -> Result<()>
{
    let (bed, ns, client) = fresh_bed().await?;
    let root = create_service(&client, &ns, "root-kcp", &[], false).await?.unwrap();
    let alpha = create_service(&client, &ns, "alpha-shard-kcp", &[], false).await?.unwrap();
    let (dns, _kubelet) = k3s_coredns(&bed, K3S_COREFILE).await?;
    let bad = [
        "'*.kcp.example.com'",
        "kcp_a.example.com",
        "-kcp.example.com",
        "localhost",
        "10.96.0.10",
        "a..b.com",
        "'a b.example.com'",
    ];
    let mut body = format!("rules:\n{}", rule("kcp-root.example.com", &ns, "root-kcp"));
    for host in bad {
        body.push_str(&rule(host, &ns, "root-kcp"));
    }
    let path = write_config(&bed, &config("mode: k3s\n", &body, dns.port))?;
    let agent = agent(&bed, &ns, &path).start().await?;
    agent.wait_for_metric(&verified("kcp-root.example.com"), WAIT, |v| v == 1.0).await;
    let (value, _) = configmap_key(&client, K3S_CONFIGMAP, OVERRIDE_KEY).await.context("the key")?;
    assert_eq!(value, render::render(&rules(&[("kcp-root.example.com", &ns, "root-kcp", root)]), &domain()));
    assert_eq!(agent.metric("dns_rewriter_rule_errors{reason=\"invalid_hostname\"}").await?, bad.len() as f64);
    let invalid = |events: &[(String, String)]| -> Vec<String> {
        let mut notes: Vec<String> =
            events.iter().filter(|(r, _)| r == "InvalidHostname").map(|(_, n)| n.clone()).collect();
        notes.sort();
        notes.dedup();
        notes
    };
    let events = testbed::eventually(WAIT, "an Event for each of the seven bad rules", || async {
        let events = events_about(&client, K3S_CONFIGMAP).await;
        (invalid(&events).len() >= bad.len()).then_some(events)
    })
    .await;
    for i in 1..=bad.len() {
        assert!(
            invalid(&events).iter().any(|n| n.starts_with(&format!("rules[{i}]: invalid hostname: "))),
            "rules[{i}] has its Event: {events:?}"
        );
    }

    // The reload adds a good rule and a duplicate of the first: applied, the good one written, the duplicate
    // its own error and Event.
    body.push_str(&rule("alpha.kcp.example.com", &ns, "alpha-shard-kcp"));
    body.push_str(&rule("kcp-root.example.com", &ns, "alpha-shard-kcp"));
    std::fs::write(&path, config("mode: k3s\n", &body, dns.port))?;
    wait_answer(&dns, "alpha.kcp.example.com", alpha, WAIT).await;
    wait_answer(&dns, "kcp-root.example.com", root, WAIT).await;
    assert_eq!(agent.metric("dns_rewriter_config_rejected ").await?, 0.0, "the reload was applied");
    agent.wait_for_metric("dns_rewriter_rule_errors{reason=\"invalid_rule\"}", WAIT, |v| v == 1.0).await;
    testbed::eventually(WAIT, "the duplicate's Event", || async {
        let events = events_about(&client, K3S_CONFIGMAP).await;
        let dup = format!("rules[{}].host: duplicates rules[0].host", bad.len() + 2);
        events.iter().any(|(r, n)| r == "InvalidRule" && n.contains(&dup)).then_some(())
    })
    .await;
    Ok(())
}

/// An operator object's name in uppercase with a trailing dot is the same DNS name: it is written lowercase
/// without the dot, answers, and is reported once (one `NameNormalized` Event however many cycles run), not
/// refused as an invalid name.
#[tokio::test]
async fn an_uppercase_trailing_dot_name_from_an_operator_object_is_normalised_written_and_reported_once() -> Result<()>
{
    use dns_rewriter::discovery::Kind;
    let (bed, ns, client) = fresh_bed().await?;
    let labels = [("app.kubernetes.io/component", "front-proxy"), ("app.kubernetes.io/instance", "frontproxy")];
    let proxy = create_service(&client, &ns, "frontproxy-front-proxy", &labels, false).await?.unwrap();
    let spec =
        json!({"rootShard": {"ref": {"name": "root"}}, "external": {"hostname": "KCP.Example.COM.", "port": 6443}});
    create_operator_object(&client, &ns, Kind::FrontProxy, "frontproxy", spec).await?;
    let (dns, _kubelet) = k3s_coredns(&bed, K3S_COREFILE).await?;
    let body = format!("discovery: {{namespace: {ns}, frontProxies: true}}\n");
    let path = write_config(&bed, &config("mode: k3s\n", &body, dns.port))?;
    let agent = agent(&bed, &ns, &path).start().await?;
    agent.wait_for_metric(&verified("kcp.example.com"), WAIT, |v| v == 1.0).await;
    wait_answer(&dns, "kcp.example.com", proxy, WAIT).await;
    assert_eq!(agent.metric("dns_rewriter_rule_errors{reason=\"invalid_hostname\"}").await?, 0.0);
    let mut at = last_cycle(&agent).await;
    for i in 0..3 {
        touch(&client, &ns, "frontproxy-front-proxy", i).await?;
        at = wait_cycles(&agent, at, 1).await;
    }
    let events = events_about(&client, K3S_CONFIGMAP).await;
    let normalised: Vec<&String> = events.iter().filter(|(r, _)| r == "NameNormalized").map(|(_, n)| n).collect();
    assert_eq!(normalised.len(), 1, "reported once: {events:?}");
    assert!(
        normalised[0]
            .starts_with(&format!("FrontProxy {ns}/frontproxy spec.external.hostname: written as kcp.example.com")),
        "{normalised:?}"
    );
    let log = agent.process.log();
    assert_eq!(log.matches("written as kcp.example.com").count(), 1, "logged once too");
    Ok(())
}

/// `kubeadm upgrade` migrates a customised Corefile with coredns/corefile-migration (the real library, run as
/// the `corefile-migrate` peer: `migration.Migrate(from, to, corefile, false)`), which drops every comment, our
/// markers included, and keeps the rewrite lines. The agent adopts those unmarked lines into one re-created
/// block with exactly the configured rules (a rule removed meanwhile is gone), says so (Event, metric), and
/// the real CoreDNS loads it.
#[tokio::test]
async fn after_a_kubeadm_corefile_migration_drops_the_markers_the_agent_adopts_the_lines_into_one_block() -> Result<()>
{
    use k8s_openapi::api::core::v1::ConfigMap;
    let (bed, ns, client) = fresh_bed().await?;
    let root = create_service(&client, &ns, "root-kcp", &[], false).await?.unwrap();
    let alpha = create_service(&client, &ns, "alpha-shard-kcp", &[], false).await?.unwrap();
    let (dns, _, server, _kubelet) = corefile_coredns(&bed).await?;
    let one = format!("rules:\n{}", rule("kcp-root.example.com", &ns, "root-kcp"));
    let two = format!("{one}{}", rule("alpha.kcp.example.com", &ns, "alpha-shard-kcp"));
    let path = corefile_config(&bed, &server, &two, dns.port)?;
    let mut first = agent(&bed, &ns, &path).start().await?;
    wait_answer(&dns, "alpha.kcp.example.com", alpha, WAIT).await;
    first.wait_for_metric(&verified("alpha.kcp.example.com"), WAIT, |v| v == 1.0).await;
    first.terminate(WAIT);

    // kubeadm upgrades CoreDNS: the Corefile goes through the migration library and is written back.
    let (marked, _) = configmap_key(&client, COREFILE_CONFIGMAP, "Corefile").await.context("the Corefile")?;
    let mut migrate = std::process::Command::new(bed.peers.path("corefile-migrate"))
        .args(["1.12.0", "1.14.7"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    std::io::Write::write_all(&mut migrate.stdin.take().context("stdin")?, marked.as_bytes())?;
    let out = migrate.wait_with_output()?;
    assert!(out.status.success(), "corefile-migrate: {:?}", out.status);
    let migrated = String::from_utf8(out.stdout)?;
    assert!(!migrated.contains("# kcp-keeper:"), "the migration drops the markers:\n{migrated}");
    assert_eq!(migrated.matches("rewrite name exact").count(), 2, "and keeps the lines:\n{migrated}");
    let patch = json!({"data": {"Corefile": migrated}});
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .patch(COREFILE_CONFIGMAP, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;

    // The agent starts again with one rule fewer.
    std::fs::write(&path, config(&corefile_mode(&server), &one, dns.port))?;
    let agent = agent(&bed, &ns, &path).start().await?;
    let adopted = testbed::eventually(WAIT, "the Corefile to be rewritten", || async {
        configmap_key(&client, COREFILE_CONFIGMAP, "Corefile").await.filter(|(v, _)| *v != migrated).map(|(v, _)| v)
    })
    .await;
    assert_eq!(adopted.matches("# kcp-keeper:begin dns-rewriter").count(), 1, "one block:\n{adopted}");
    assert_eq!(adopted.matches("rewrite name exact").count(), 1, "exactly the configured rule:\n{adopted}");
    let only_root = rules(&[("kcp-root.example.com", &ns, "root-kcp", root)]);
    assert_eq!(block::content(&adopted, &server)?, Some(render::render(&only_root, &domain())));
    let unmarked: String =
        migrated.lines().filter(|l| !l.contains("rewrite name exact")).map(|l| format!("{l}\n")).collect();
    assert_eq!(block::set(&adopted, &server, None)?, unmarked, "every other byte is the migrated Corefile's");
    wait_answer(&dns, "kcp-root.example.com", root, WAIT).await;
    wait_no_answer(&dns, "alpha.kcp.example.com", WAIT).await;
    agent.wait_for_metric(&verified("kcp-root.example.com"), WAIT, |v| v == 1.0).await;
    assert_eq!(agent.metric("dns_rewriter_adopted_lines_total ").await?, 2.0);
    let events = events_about(&client, COREFILE_CONFIGMAP).await;
    assert!(events.iter().any(|(r, n)| r == "UnmarkedRulesAdopted" && n.contains("2 rule lines")), "{events:?}");
    // Steady from here: a cycle adopts nothing more and writes nothing.
    let (steady, rv) = configmap_key(&client, COREFILE_CONFIGMAP, "Corefile").await.context("the Corefile")?;
    let at = last_cycle(&agent).await;
    touch(&client, &ns, "root-kcp", 1).await?;
    wait_cycles(&agent, at, 1).await;
    assert_eq!(configmap_key(&client, COREFILE_CONFIGMAP, "Corefile").await, Some((steady, rv)));
    Ok(())
}

/// At first install (no block of ours yet) an administrator's own rewrite lines in exactly the agent's form
/// cannot be told from the agent's own lines left without markers, and are adopted like them. Each such line
/// is named in an `AdoptedExistingRule` Event saying what became of it: the one no configured rule writes is
/// removed, the one a configured rule writes too now stands in the block (and goes with that rule).
#[tokio::test]
async fn at_first_install_an_admins_own_line_in_the_agents_form_is_adopted_and_each_such_line_is_named_in_an_event()
-> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let (bed, ns, client) = fresh_bed().await?;
    let root = create_service(&client, &ns, "root-kcp", &[], false).await?.unwrap();
    let (dns, original, server, _kubelet) = corefile_coredns(&bed).await?;
    let theirs = format!("rewrite name exact admin.example.com. web.{ns}.svc.cluster.local.");
    let same = format!("rewrite name exact kcp-root.example.com. root-kcp.{ns}.svc.cluster.local.");
    // The admin's lines directly in the server block, no markers anywhere.
    let marked = block::set(&original, &server, Some(&format!("{theirs}\n{same}\n")))?;
    let hand_written: String =
        marked.lines().filter(|l| !l.contains("# kcp-keeper:")).map(|l| format!("{l}\n")).collect();
    assert!(hand_written.contains(&format!("    {theirs}\n")) && !hand_written.contains('#'), "{hand_written}");
    let patch = json!({"data": {"Corefile": hand_written}});
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .patch(COREFILE_CONFIGMAP, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;

    let path = corefile_config(
        &bed,
        &server,
        &format!("rules:\n{}", rule("kcp-root.example.com", &ns, "root-kcp")),
        dns.port,
    )?;
    let agent = agent(&bed, &ns, &path).start().await?;
    let written = testbed::eventually(WAIT, "the Corefile to hold our block", || async {
        configmap_key(&client, COREFILE_CONFIGMAP, "Corefile")
            .await
            .filter(|(v, _)| v.contains("# kcp-keeper:begin dns-rewriter"))
            .map(|(v, _)| v)
    })
    .await;
    assert!(!written.contains(&theirs), "the admin's line is gone:\n{written}");
    assert_eq!(written.matches(&same).count(), 1, "the line a rule writes stands once, in the block:\n{written}");
    assert_eq!(
        block::set(&written, &server, None)?,
        original,
        "outside the block: the Corefile before the admin's lines"
    );
    wait_answer(&dns, "kcp-root.example.com", root, WAIT).await;

    let events = testbed::eventually(WAIT, "an AdoptedExistingRule Event per adopted line", || async {
        let events = events_about(&client, COREFILE_CONFIGMAP).await;
        let adopted: Vec<String> =
            events.iter().filter(|(r, _)| r == "AdoptedExistingRule").map(|(_, n)| n.clone()).collect();
        (adopted.len() == 2).then_some(adopted)
    })
    .await;
    let about = |line: &str| events.iter().find(|n| n.contains(&format!("`{line}`"))).cloned().unwrap_or_default();
    assert!(about(&theirs).contains(&format!("stood in server block {server}")), "{events:?}");
    assert!(about(&theirs).contains("so it was removed"), "{events:?}");
    assert!(about(&same).contains("goes when that rule goes"), "{events:?}");
    let log = agent.process.log();
    assert!(log.contains(&theirs) && log.contains("so it was removed"), "logged too");
    assert_eq!(agent.metric("dns_rewriter_adopted_lines_total ").await?, 2.0);
    Ok(())
}

/// Each rule's target is resolved through the cluster DNS before it is written. Here the real CoreDNS's
/// `kubernetes` plugin serves one namespace only (`namespaces`), so a rule whose Service lives in another one
/// has a target that does not exist: that rule alone is an error (`target_unresolved`, an Event), the other is
/// written and answers.
#[tokio::test]
async fn a_rule_whose_target_does_not_resolve_through_the_cluster_dns_is_an_error_for_that_rule_alone() -> Result<()> {
    let (bed, ns, client) = fresh_bed().await?;
    let other = bed.namespace().await?;
    let root = create_service(&client, &ns, "root-kcp", &[], false).await?.unwrap();
    create_service(&client, &other, "alpha-shard-kcp", &[], false).await?;
    let served = K3S_COREFILE
        .replace("        pods insecure", &format!("        namespaces {ns} default\n        pods insecure"));
    let (dns, _kubelet) = k3s_coredns(&bed, &served).await?;
    let body = format!(
        "rules:\n{}{}",
        rule("kcp-root.example.com", &ns, "root-kcp"),
        rule("alpha.kcp.example.com", &other, "alpha-shard-kcp")
    );
    let path = write_config(&bed, &config("mode: k3s\n", &body, dns.port))?;
    let agent = agent(&bed, &ns, &path).start().await?;
    agent.wait_for_metric(&verified("kcp-root.example.com"), WAIT, |v| v == 1.0).await;
    agent.wait_for_metric("dns_rewriter_rule_errors{reason=\"target_unresolved\"}", WAIT, |v| v == 1.0).await;
    let (value, _) = configmap_key(&client, K3S_CONFIGMAP, OVERRIDE_KEY).await.context("the key")?;
    assert_eq!(value, render::render(&rules(&[("kcp-root.example.com", &ns, "root-kcp", root)]), &domain()));
    // Verification ran: recorded just after the hosts' results, so waited for rather than raced.
    agent.wait_for_metric("dns_rewriter_verify_timestamp_seconds ", WAIT, |v| v > 0.0).await;
    let events = events_about(&client, K3S_CONFIGMAP).await;
    let target = format!("alpha-shard-kcp.{other}.svc.cluster.local");
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "TargetUnresolved" && n.contains("alpha.kcp.example.com") && n.contains(&target)),
        "{events:?}"
    );
    Ok(())
}

/// Without `verify.resolver` the agent verifies through the cluster DNS Service, `kube-system/kube-dns`: while
/// there is none it says so and `verify_timestamp_seconds` stays 0 (the alert's input) though the rules are
/// written; once the Service exists its ClusterIP is asked, and since what answers there does not know
/// `kubernetes.default` it is not taken as the cluster DNS: no rule dropped, verification still not run.
#[tokio::test]
async fn without_a_configured_resolver_the_agent_asks_the_kube_dns_service_and_says_when_verification_has_not_run()
-> Result<()> {
    let (bed, ns, client) = fresh_bed().await?;
    create_service(&client, &ns, "root-kcp", &[], false).await?;
    let (_dns, _kubelet) = k3s_coredns(&bed, K3S_COREFILE).await?;
    let body = format!("mode: k3s\nrules:\n{}resyncInterval: 10s\n", rule("kcp-root.example.com", &ns, "root-kcp"));
    let path = write_config(&bed, &body)?;
    let agent = agent(&bed, &ns, &path).start().await?;
    agent.wait_for_metric("dns_rewriter_write_timestamp_seconds ", WAIT, |v| v > 0.0).await;
    testbed::eventually(WAIT, "the log to say verification has no resolver", || async {
        agent.process.log().contains("no ClusterIP on the cluster DNS Service kube-system/kube-dns").then_some(())
    })
    .await;
    assert_eq!(agent.metric("dns_rewriter_verify_timestamp_seconds ").await?, 0.0);

    create_service(&client, "kube-system", "kube-dns", &[], false).await?;
    // What answers there (this machine answers NXDOMAIN for every name, as a resolver that is not the cluster
    // DNS would) is not taken as the cluster DNS: it does not know kubernetes.default, so no rule is dropped.
    testbed::eventually(WAIT, "the log to say the resolver is not the cluster DNS", || async {
        agent.process.log().contains("does not answer kubernetes.default.svc.cluster.local").then_some(())
    })
    .await;
    assert_eq!(agent.metric("dns_rewriter_rules ").await?, 1.0, "the rule stays");
    assert_eq!(agent.metric("dns_rewriter_rule_errors{reason=\"target_unresolved\"}").await?, 0.0);
    assert_eq!(agent.metric(&verified("kcp-root.example.com")).await?, 0.0);
    assert_eq!(agent.metric("dns_rewriter_verify_timestamp_seconds ").await?, 0.0, "not run");
    Ok(())
}

/// Uninstalling runs `cleanup` (the chart's pre-delete hook) while the agent still runs and watches its
/// ConfigMap: the running agent must not put its block back. Cycles after the cleanup (woken by the cleanup's own
/// write, and by changes to a watched Service) leave the Corefile as it was before the agent's first write.
#[tokio::test]
async fn after_cleanup_a_running_agent_never_writes_its_block_back() -> Result<()> {
    let (bed, ns, client) = fresh_bed().await?;
    create_service(&client, &ns, "root-kcp", &[], false).await?;
    let (dns, original, server, _kubelet) = corefile_coredns(&bed).await?;
    let path = corefile_config(
        &bed,
        &server,
        &format!("rules:\n{}", rule("kcp-root.example.com", &ns, "root-kcp")),
        dns.port,
    )?;
    let agent = agent(&bed, &ns, &path).start().await?;
    agent.wait_for_metric(&verified("kcp-root.example.com"), WAIT, |v| v == 1.0).await;

    let kubeconfig = kubeconfig(&bed).display().to_string();
    let out = std::process::Command::new(BINARY)
        .args(["cleanup", "--kubeconfig", &kubeconfig, "--config", path.to_str().context("path")?])
        .output()?;
    assert!(out.status.success(), "cleanup: {}", String::from_utf8_lossy(&out.stderr));
    let mut at = last_cycle(&agent).await;
    for i in 0..3 {
        touch(&client, &ns, "root-kcp", i).await?;
        at = wait_cycles(&agent, at, 1).await;
    }
    let (after, _) = configmap_key(&client, COREFILE_CONFIGMAP, "Corefile").await.context("the Corefile")?;
    assert_eq!(block::set(&after, &server, None)?, original);
    assert_eq!(after, original, "no block written back after the cleanup");
    Ok(())
}

/// Writes a corefile-mode configuration with `rules` (a `rules:` block) for the Corefile's `server` block, the
/// agent verifying through CoreDNS on `port`.
fn corefile_config(bed: &testbed::ControlPlane, server: &str, rules: &str, port: u16) -> Result<std::path::PathBuf> {
    write_config(bed, &config(&corefile_mode(server), rules, port))
}

/// The configuration's mode lines for the Corefile's `server` block.
fn corefile_mode(server: &str) -> String {
    format!("mode: corefile\ncorefile: {{serverBlock: '{server}'}}\n")
}
