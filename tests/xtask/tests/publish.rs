//! `cargo xtask publish` against a real registry (Distribution, `testbed::registry`) on loopback, with the
//! images `cargo xtask images` built (`--prebuilt`): what lands there, that the same bytes twice change nothing,
//! and that a version published with other bytes, a registry that is down and one whose certificate is not
//! trusted each fail before anything is pushed, saying which.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use testbed::registry::Registry;

const AGENTS: [&str; 5] = ["ca-syncer", "dns-rewriter", "kubeconfig-rotator", "etcd-snapshotter", "kcp-keeper"];
const SBOM_TYPE: &str = "application/vnd.cyclonedx+json";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn version() -> String {
    let chart = std::fs::read_to_string(root().join("charts/kcp-keeper/Chart.yaml")).unwrap();
    let line = chart.lines().find(|l| l.starts_with("appVersion:")).expect("Chart.yaml has an appVersion");
    line.trim_start_matches("appVersion:").trim().trim_matches('"').to_string()
}

fn peers() -> peers::Peers {
    peers::locate_only(&["registry", "oras", "helm"]).expect("the peers are built: run `cargo xtask peers`")
}

fn publish(registry: &str, ca_file: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.args(["publish", "--prebuilt", "--registry", registry]).current_dir(root());
    if let Some(ca) = ca_file {
        cmd.arg("--ca-file").arg(ca);
    }
    cmd.env("CARGO", std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.output().expect("starting xtask publish")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn oras(peers: &peers::Peers, registry: &Registry, args: &[&str]) -> String {
    let out = Command::new(peers.path("oras"))
        .args(args)
        .arg("--ca-file")
        .arg(&registry.ca_file)
        .output()
        .expect("starting oras");
    assert!(out.status.success(), "oras {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Manifest PUTs the registry has taken so far (its access log).
fn manifest_puts(registry: &Registry) -> usize {
    registry.log().unwrap().lines().filter(|l| l.contains("\"PUT /v2/") && l.contains("/manifests/")).count()
}

#[test]
fn publish_pushes_every_image_with_its_sbom_as_a_referrer_and_the_chart_and_the_same_bytes_again_change_nothing() {
    let peers = peers();
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::start(&peers, dir.path()).unwrap();
    let target = format!("{}/kcp-keeper", registry.host);
    let version = version();

    let first = publish(&target, Some(&registry.ca_file));
    assert!(first.status.success(), "the first publish failed: {}", text(&first));
    for agent in AGENTS {
        assert!(registry.has(&format!("kcp-keeper/{agent}"), &version), "{agent}:{version} is not in the registry");
        let image = format!("{target}/{agent}:{version}");
        let config: serde_json::Value =
            serde_json::from_str(&oras(&peers, &registry, &["manifest", "fetch-config", &image])).unwrap();
        let labels = &config["config"]["Labels"];
        assert_eq!(labels["org.opencontainers.image.title"], agent, "{image}'s labels: {labels}");
        assert_eq!(labels["org.opencontainers.image.version"], version.as_str(), "{image}'s labels: {labels}");
        let found: serde_json::Value = serde_json::from_str(&oras(
            &peers,
            &registry,
            &["discover", "--format", "json", "--artifact-type", SBOM_TYPE, &image],
        ))
        .unwrap();
        let referrers = found["referrers"].as_array().cloned().unwrap_or_default();
        assert_eq!(referrers.len(), 1, "{image} has {} SBOM referrers: {found}", referrers.len());
        let sbom_dir = dir.path().join(format!("sbom-{agent}"));
        std::fs::create_dir_all(&sbom_dir).unwrap();
        let sbom_ref = format!("{target}/{agent}@{}", referrers[0]["digest"].as_str().unwrap());
        oras(&peers, &registry, &["pull", "--output", sbom_dir.to_str().unwrap(), &sbom_ref]);
        let file = std::fs::read_dir(&sbom_dir).unwrap().next().expect("the SBOM referrer has a file").unwrap().path();
        let sbom: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(sbom["bomFormat"], "CycloneDX");
        assert_eq!(sbom["metadata"]["component"]["name"], agent);
        assert!(sbom["components"].as_array().is_some_and(|c| c.len() > 50), "{agent}'s SBOM lists few components");
    }
    assert!(registry.has("kcp-keeper/charts/kcp-keeper", &version), "the chart is not in the registry");

    let puts = manifest_puts(&registry);
    let second = publish(&target, Some(&registry.ca_file));
    let said = text(&second);
    assert!(second.status.success(), "publishing the same build again failed: {said}");
    assert_eq!(said.matches("unchanged ").count(), AGENTS.len() + 1, "not every artefact was left as it was: {said}");
    assert_eq!(manifest_puts(&registry), puts, "the second publish wrote manifests: {said}");
}

#[test]
fn a_version_already_published_with_other_bytes_is_refused_naming_each_and_nothing_is_pushed() {
    let peers = peers();
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::start(&peers, dir.path()).unwrap();
    let target = format!("{}/kcp-keeper", registry.host);
    let version = version();

    // Someone published this version before, with other bytes: ca-syncer's image under dns-rewriter's tag, and
    // a chart whose values differ.
    let certs = tempfile::tempdir().unwrap();
    std::fs::copy(&registry.ca_file, certs.path().join("ca.crt")).unwrap();
    let mut push = peers::buildah::AGENTS.command(&["push", "--quiet"]);
    push.arg("--cert-dir").arg(certs.path());
    push.arg(format!("{}/ca-syncer:{version}", peers::registry::PUBLIC));
    push.arg(format!("docker://{target}/dns-rewriter:{version}"));
    let out = push.output().unwrap();
    assert!(out.status.success(), "buildah push: {}", text(&out));
    let chart = dir.path().join("chart/kcp-keeper");
    std::fs::create_dir_all(chart.parent().unwrap()).unwrap();
    let copied = Command::new("cp").arg("-r").arg(root().join("charts/kcp-keeper")).arg(&chart).status().unwrap();
    assert!(copied.success());
    let values = std::fs::read_to_string(chart.join("values.yaml")).unwrap();
    std::fs::write(chart.join("values.yaml"), values.replace("pullPolicy: IfNotPresent", "pullPolicy: Always"))
        .unwrap();
    let helm = |args: &[&str]| {
        let out = Command::new(peers.path("helm"))
            .args(args)
            .env("HELM_CONFIG_HOME", dir.path().join("helm"))
            .env("HELM_CACHE_HOME", dir.path().join("helm"))
            .output()
            .unwrap();
        assert!(out.status.success(), "helm {args:?}: {}", text(&out));
    };
    helm(&["package", chart.to_str().unwrap(), "--destination", dir.path().to_str().unwrap()]);
    let package = dir.path().join(format!("kcp-keeper-{version}.tgz"));
    helm(&[
        "push",
        package.to_str().unwrap(),
        &format!("oci://{target}/charts"),
        "--ca-file",
        registry.ca_file.to_str().unwrap(),
    ]);
    let puts = manifest_puts(&registry);

    let out = publish(&target, Some(&registry.ca_file));
    let said = text(&out);
    assert!(!out.status.success(), "a publish over other bytes succeeded: {said}");
    assert!(said.contains("nothing was pushed"), "{said}");
    assert!(said.contains("never overwritten"), "{said}");
    assert!(said.contains(&format!("{target}/dns-rewriter:{version} is already published as another image")), "{said}");
    assert!(
        said.contains(&format!(
            "{target}/charts/kcp-keeper:{version} is already published with other files (kcp-keeper/values.yaml)"
        )),
        "{said}"
    );
    for unaffected in ["ca-syncer", "kubeconfig-rotator", "etcd-snapshotter", "kcp-keeper"] {
        assert!(
            !said.contains(&format!("{target}/{unaffected}:{version} is already")),
            "{unaffected} was named: {said}"
        );
        assert!(!registry.has(&format!("kcp-keeper/{unaffected}"), &version), "{unaffected} was pushed: {said}");
    }
    assert_eq!(manifest_puts(&registry), puts, "the refused publish wrote a manifest: {said}");
}

#[test]
fn publishing_to_a_registry_that_is_down_or_not_trusted_fails_before_any_push_and_says_why() {
    let peers = peers();
    let dir = tempfile::tempdir().unwrap();
    let mut registry = Registry::start(&peers, dir.path()).unwrap();
    let target = format!("{}/kcp-keeper", registry.host);

    // Its certificate is not one the system trusts: without --ca-file the publish stops at the first request.
    let out = publish(&target, None);
    let said = text(&out);
    assert!(!out.status.success(), "a publish to an untrusted registry succeeded: {said}");
    assert!(said.contains("cannot be used; nothing was pushed"), "{said}");
    assert!(said.contains("certificate"), "the error does not say it is the certificate: {said}");
    assert_eq!(manifest_puts(&registry), 0, "{said}");

    registry.stop();
    let out = publish(&target, Some(&registry.ca_file));
    let said = text(&out);
    assert!(!out.status.success(), "a publish to a stopped registry succeeded: {said}");
    assert!(said.contains("cannot be used; nothing was pushed"), "{said}");
    assert!(said.contains("connection refused"), "the error does not say the registry is unreachable: {said}");
}
