//! The one-shots as processes: `render` (offline and against the real apiserver, with discovery from
//! operator objects) and `check` (against a real CoreDNS).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use common::{coredns_with, create_operator_object, create_service, domain, rules};
use dns_rewriter::render;
use serde_json::json;
use testbed::ControlPlane;
use testbed::agent_process::run_to_completion;

const BINARY: &str = env!("CARGO_BIN_EXE_dns-rewriter");

fn write_config(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    run_to_completion(Path::new(BINARY), args).expect("the binary runs")
}

const TWO_RULES: &str = "rules:
- host: root.kcp.example.com
  service: {namespace: kcp-system, name: root-kcp}
- host: kcp-root.example.com
  service: {namespace: kcp-system, name: root-kcp}
  port: 443
discovery: {namespace: kcp-system, shards: true}
";

#[test]
fn render_offline_prints_the_k3s_snippet_from_the_configured_rules() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "c.yaml", &format!("mode: k3s\n{TWO_RULES}"));
    let (code, stdout, stderr) = run(&["render", "--offline", "--config", config.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        stdout,
        format!(
            "{}rewrite name exact kcp-root.example.com. root-kcp.kcp-system.svc.cluster.local.\n\
             rewrite name exact root.kcp.example.com. root-kcp.kcp-system.svc.cluster.local.\n",
            render::HEADER
        )
    );
    assert!(stderr.contains("offline") && stderr.contains("discovery skipped"), "{stderr}");
}

#[test]
fn render_offline_in_corefile_mode_prints_the_marked_block() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        write_config(dir.path(), "c.yaml", &format!("mode: corefile\ncorefile: {{name: coredns}}\n{TWO_RULES}"));
    let (code, stdout, stderr) = run(&["render", "--offline", "--config", config.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some("# kcp-keeper:begin dns-rewriter (managed by kcp-keeper: edits inside this block are overwritten)")
    );
    assert_eq!(lines.last().copied(), Some("# kcp-keeper:end dns-rewriter"));
    assert_eq!(lines.iter().filter(|l| l.starts_with("rewrite name exact ")).count(), 2, "{stdout}");
}

#[test]
fn render_leaves_out_an_invalid_rule_naming_the_field_but_not_the_value_and_prints_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "c.yaml",
        "mode: k3s\nrules:\n- host: Private_Name.example.com\n  service: {namespace: kcp-system, name: root-kcp}\n\
         - host: kcp-root.example.com\n  service: {namespace: kcp-system, name: root-kcp}\n",
    );
    let (code, stdout, stderr) = run(&["render", "--offline", "--config", config.to_str().unwrap()]);
    assert_eq!(code, Some(1), "a rule error makes render exit 1");
    let rules: Vec<&str> = stdout.lines().filter(|l| l.starts_with("rewrite ")).collect();
    assert_eq!(rules, ["rewrite name exact kcp-root.example.com. root-kcp.kcp-system.svc.cluster.local."]);
    assert!(stderr.contains("error: rules[0]: invalid hostname: must be lowercase"), "{stderr}");
    assert!(!stderr.contains("Private"), "{stderr}");
}

#[test]
fn render_refuses_a_configuration_file_that_is_invalid_as_a_whole_printing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "c.yaml", "mode: Private-Mode\n");
    let (code, stdout, stderr) = run(&["render", "--offline", "--config", config.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty(), "nothing is printed as if it would be written: {stdout}");
    assert!(stderr.contains("mode: must be k3s or corefile"), "{stderr}");
    assert!(!stderr.contains("Private"), "{stderr}");
}

/// Objects shaped like the seed's (tests/e2e/src/layout.rs), with every field the operator's real CRDs require,
/// plus a shard whose Service is headless.
#[tokio::test]
async fn render_against_the_apiserver_discovers_what_the_explicit_configuration_says_and_names_bad_rules() -> Result<()>
{
    use dns_rewriter::discovery::Kind;
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let client = bed.client();
    let explicit_rules = common::seed_operator(&client, &ns).await?;
    // Beside the seed's: another Service of the root shard (not its main one), and a shard whose Service is
    // headless.
    for (name, component, instance, headless) in
        [("root-proxy", "rootshard-proxy", "root", false), ("beta-shard-kcp", "shard", "beta", true)]
    {
        let labels = [("app.kubernetes.io/component", component), ("app.kubernetes.io/instance", instance)];
        create_service(&client, &ns, name, &labels, headless).await?;
    }
    create_operator_object(
        &client,
        &ns,
        Kind::Shard,
        "beta",
        json!({
            "rootShard": {"ref": {"name": "root"}},
            "etcd": {"endpoints": ["http://shard-etcd.kcp-system.svc.cluster.local:2379"]},
            "extraArgs": ["--shard-virtual-workspace-url=https://beta.kcp.example.com:6443"],
        }),
    )
    .await?;

    let dir = tempfile::tempdir()?;
    let kubeconfig = common::kubeconfig(&bed).to_str().unwrap().to_string();
    let discovered = write_config(
        dir.path(),
        "discovered.yaml",
        &format!("mode: k3s\ndiscovery: {{namespace: {ns}, rootShards: true, shards: true, frontProxies: true}}\n"),
    );
    let explicit = write_config(dir.path(), "explicit.yaml", &format!("mode: k3s\n{explicit_rules}"));
    let (code_d, out_d, err_d) =
        run(&["render", "--kubeconfig", &kubeconfig, "--config", discovered.to_str().unwrap()]);
    let (code_e, out_e, err_e) = run(&["render", "--kubeconfig", &kubeconfig, "--config", explicit.to_str().unwrap()]);
    assert_eq!(code_e, Some(0), "{err_e}");
    assert_eq!(out_d, out_e, "discovery and the explicit configuration render the same bytes\n{err_d}");
    assert_eq!(out_d.lines().filter(|l| l.starts_with("rewrite name exact")).count(), 4, "{out_d}");
    assert!(!out_d.contains("beta"), "{out_d}");
    assert_eq!(code_d, Some(1), "a rule error makes render exit 1: {err_d}");
    assert!(
        err_d.contains(&format!(
            "error: Shard {ns}/beta spec.extraArgs[0]: beta.kcp.example.com: Service {ns}/beta-shard-kcp is headless"
        )),
        "{err_d}"
    );
    assert!(
        err_d.contains("warning: kcp.example.com: Service") && err_d.contains("does not expose port 443"),
        "{err_d}"
    );
    Ok(())
}

#[tokio::test]
async fn check_prints_expected_and_answered_per_host_and_fails_when_one_does_not_answer() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let client = bed.client();
    let root = create_service(&client, &ns, "root-kcp", &[], false).await?.unwrap();
    let alpha = create_service(&client, &ns, "alpha-shard-kcp", &[], false).await?.unwrap();
    // CoreDNS has only the kcp-root rule loaded.
    let snippet = render::render(&rules(&[("kcp-root.example.com", &ns, "root-kcp", root)]), &domain());
    let custom = BTreeMap::from([("kcp-split-horizon.override".to_string(), snippet)]);
    let dns = coredns_with(&bed, testbed::coredns::K3S_COREFILE, &custom).await?;
    common::wait_answer(&dns, "kcp-root.example.com", root, std::time::Duration::from_secs(10)).await;

    let dir = tempfile::tempdir()?;
    let kubeconfig = common::kubeconfig(&bed).to_str().unwrap().to_string();
    let rule = |host: &str, svc: &str| format!("- {{host: {host}, service: {{namespace: {ns}, name: {svc}}}}}\n");
    let both = write_config(
        dir.path(),
        "both.yaml",
        &format!(
            "mode: k3s\nverify: {{resolver: '127.0.0.1:{}'}}\nrules:\n{}{}",
            dns.port,
            rule("kcp-root.example.com", "root-kcp"),
            rule("alpha.kcp.example.com", "alpha-shard-kcp")
        ),
    );
    let (code, stdout, stderr) = run(&["check", "--kubeconfig", &kubeconfig, "--config", both.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    let row = |host: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(host))
            .unwrap_or_default()
            .split_whitespace()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        row("kcp-root.example.com"),
        vec!["kcp-root.example.com".to_string(), root.to_string(), root.to_string(), "ok".into()],
        "{stdout}"
    );
    // No rule for it, and the test bed's CoreDNS has no upstream: REFUSED or SERVFAIL, reported as an error.
    assert_eq!(
        row("alpha.kcp.example.com"),
        vec!["alpha.kcp.example.com".to_string(), alpha.to_string(), "-".into(), "error".into()],
        "{stdout}"
    );

    // Only the loaded rule, and the resolver from the flag: every host answers, exit 0.
    let one = write_config(
        dir.path(),
        "one.yaml",
        &format!("mode: k3s\nrules:\n{}", rule("kcp-root.example.com", "root-kcp")),
    );
    let resolver = format!("127.0.0.1:{}", dns.port);
    let (code, stdout, stderr) =
        run(&["check", "--kubeconfig", &kubeconfig, "--resolver", &resolver, "--config", one.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.starts_with("HOST"), "{stdout}");
    Ok(())
}

/// `cleanup` against the real apiserver: in Corefile mode the block goes and the Corefile is byte for byte what
/// it was before the block was written; in k3s mode only our key goes from `coredns-custom`; a second run finds
/// nothing and writes nothing.
#[tokio::test]
async fn cleanup_removes_the_block_restoring_the_corefile_bytes_and_the_k3s_key_alone_and_is_idempotent() -> Result<()>
{
    use dns_rewriter::cleanup::CLEANED_ANNOTATION;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, ObjectMeta, PostParams};
    use std::time::Duration;
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let client = bed.client();
    let original =
        testbed::coredns::KUBEADM_DEFAULT_COREFILE.replace("    loop\n", "    # our own comment\n    loop\n");
    let snippet = "# Managed by kcp-keeper (dns-rewriter); edits here are overwritten.\n# Split horizon: each kcp public name below answers with its in-cluster Service.\nrewrite name exact kcp-root.example.com. root-kcp.kcp-system.svc.cluster.local.\n";
    let written = dns_rewriter::block::set(&original, ".:53", Some(snippet))?;
    let api = Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
    let cm = |name: &str, data: &[(&str, &str)]| ConfigMap {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        data: Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    };
    api.create(&PostParams::default(), &cm("coredns", &[("Corefile", &written)])).await?;
    api.create(
        &PostParams::default(),
        &cm("coredns-custom", &[("kcp-split-horizon.override", snippet), ("mine.override", "log\n")]),
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = bed.apiserver.admin_kubeconfig.display().to_string();
    let rule = format!("rules:\n- {{host: kcp-root.example.com, service: {{namespace: {ns}, name: root-kcp}}}}\n");
    let corefile = write_config(dir.path(), "corefile.yaml", &format!("mode: corefile\ncorefile: {{}}\n{rule}"));
    let k3s = write_config(dir.path(), "k3s.yaml", &format!("mode: k3s\n{rule}"));

    let (code, _, stderr) = run(&["cleanup", "--kubeconfig", &kubeconfig, "--config", corefile.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("removed dns-rewriter's rules from kube-system/coredns key Corefile"), "{stderr}");
    let after = api.get("coredns").await?;
    assert_eq!(after.data.as_ref().and_then(|d| d.get("Corefile")), Some(&original), "the bytes before the block");
    // The second cleanup runs in a later second than the first's mark, so a mark rewritten with the new time
    // would show as a write (CI once caught that by chance).
    let marked_at: u64 =
        after.metadata.annotations.as_ref().and_then(|a| a.get(CLEANED_ANNOTATION)).unwrap().parse()?;
    testbed::eventually(Duration::from_secs(3), "a later second", || async {
        (dns_rewriter::cleanup::unix_seconds() > marked_at).then_some(())
    })
    .await;
    let (code, _, stderr) = run(&["cleanup", "--kubeconfig", &kubeconfig, "--config", corefile.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("nothing of dns-rewriter's"), "{stderr}");
    assert_eq!(api.get("coredns").await?.metadata.resource_version, after.metadata.resource_version, "no write");

    let (code, _, stderr) = run(&["cleanup", "--kubeconfig", &kubeconfig, "--config", k3s.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    let custom = api.get("coredns-custom").await?.data.unwrap_or_default();
    assert_eq!(custom.into_iter().collect::<Vec<_>>(), vec![("mine.override".to_string(), "log\n".to_string())]);
    Ok(())
}
