//! README.md's Quick start, run verbatim on a real node (`testbed::node`): its `values.yaml` block written to a
//! file, its shell blocks run by `sh -eu` with `kubectl` and `helm` on the PATH and the node's admin kubeconfig.
//! The one substitution is the registry: `oci://ghcr.io/kcp-keeper` becomes the bed's registry as the host reaches
//! it (the node's containerd serves `ghcr.io` from the same registry, so the chart's default image references
//! pull from it unchanged). What the Quick start says you need is put in place first, as cert-manager would have
//! it: namespace `kcp-system` and its Secret `root-server-ca`. Editing the README's commands without the product
//! following fails this test.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use testbed::node;

/// The README's public registry path, the one part of its commands the test changes.
const PUBLIC_CHART_REGISTRY: &str = "oci://ghcr.io/kcp-keeper";

/// The code blocks of README.md's `## Quick start` section: (language, text).
fn quick_start_blocks(readme: &str) -> Result<Vec<(String, String)>> {
    let start = readme.find("\n## Quick start\n").context("README.md has no `## Quick start` section")?;
    let rest = &readme[start + 1..];
    let section = &rest[..rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3)];
    let mut blocks = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```").filter(|l| !l.is_empty()) {
            let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
            blocks.push((lang.to_string(), body.join("\n") + "\n"));
        }
    }
    Ok(blocks)
}

#[test]
fn the_readme_quick_start_block_parser_takes_every_block_of_the_section_and_nothing_after_it() {
    let readme = "# x\n## Quick start\ntext\n```yaml\na: 1\n```\nmore\n```sh\necho hi\n```\n## Next\n```sh\nno\n```\n";
    let blocks = quick_start_blocks(readme).unwrap();
    assert_eq!(blocks, vec![("yaml".into(), "a: 1\n".into()), ("sh".into(), "echo hi\n".into())]);
}

#[tokio::test]
async fn the_readmes_quick_start_run_verbatim_against_the_registry_installs_ca_syncer_and_the_ca_reaches_my_app()
-> Result<()> {
    let node = node::shared();
    let client = node.client().await?;
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))?;
    let blocks = quick_start_blocks(&readme)?;
    let values: Vec<&String> = blocks.iter().filter(|(l, _)| l == "yaml").map(|(_, t)| t).collect();
    let commands: Vec<&String> = blocks.iter().filter(|(l, _)| l == "sh").map(|(_, t)| t).collect();
    ensure!(values.len() == 1, "the Quick start has {} yaml blocks, expected the one values.yaml", values.len());
    ensure!(!commands.is_empty(), "the Quick start has no sh block");
    ensure!(
        commands.iter().any(|c| c.contains(PUBLIC_CHART_REGISTRY)),
        "the Quick start installs from no {PUBLIC_CHART_REGISTRY}/... chart"
    );

    // What the Quick start says the cluster has: kcp in kcp-system, cert-manager's root-server-ca there.
    let ca = testbed::certs::Ca::new("kcp-root-ca", Duration::from_secs(30 * 86400))?;
    let namespaces = Api::<Namespace>::all(client.clone());
    let _ = namespaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "kcp-system"}}))?)
        .await;
    let secret = json!({"metadata": {"name": "root-server-ca"}, "stringData": {"ca.crt": ca.cert_pem()}});
    Api::<Secret>::namespaced(client.clone(), "kcp-system")
        .create(&PostParams::default(), &serde_json::from_value(secret)?)
        .await?;

    let work = tempfile::tempdir()?;
    std::fs::write(work.path().join("values.yaml"), values[0])?;
    let bin = work.path().join("bin");
    std::fs::create_dir_all(&bin)?;
    for tool in ["kubectl", "helm"] {
        std::os::unix::fs::symlink(node.peers.path(tool), bin.join(tool))?;
    }
    let registry = format!("oci://{}/{}", node.registry()?, peers::registry::BED_PATH);
    let mut output = String::new();
    for block in commands {
        let script = block.replace(PUBLIC_CHART_REGISTRY, &registry);
        eprintln!("$ {}", script.trim());
        let out = std::process::Command::new("sh")
            .args(["-eu", "-c", &script])
            .current_dir(work.path())
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("HOME", work.path())
            .env("KUBECONFIG", &node.kubeconfig)
            // helm trusts the bed registry's CA as a user's machine trusts a public registry's: the system roots.
            .env("SSL_CERT_FILE", testbed::registry::bed_ca()?)
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        eprint!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
        ensure!(out.status.success(), "the Quick start's commands failed ({}):\n{script}", out.status);
        output.push_str(&stdout);
    }

    // What the README says the last line prints, and what it means: the source CA in my-app's Secret.
    let last = output.lines().last().unwrap_or_default();
    ensure!(last == "-----BEGIN CERTIFICATE-----", "the last line printed {last:?}");
    let target = Api::<Secret>::namespaced(client.clone(), "my-app").get("kcp-ca").await?;
    let bundle = target.data.unwrap_or_default().remove("ca.crt").context("kcp-ca has no ca.crt")?;
    ensure!(String::from_utf8(bundle.0)?.trim() == ca.cert_pem().trim(), "kcp-ca holds another CA");
    chart::on_node::pulled_from_the_registry(node, &["ca-syncer"], &chart::on_node::version()?)?;
    Ok(())
}
