//! Helpers for the checks of `charts/kcp-keeper`: run the real helm (and promtool) from the peer cache, split
//! and parse what helm renders, and put the chart's RBAC and an agent's `rbac` one-shot output in one
//! comparable shape.
//!
//! The chart derives each agent's Roles from the agent's configuration in its values (Go templates); the
//! agents derive them from the same configuration in Rust (`<agent> rbac`). [`agent_rbac`] calls the code the
//! one-shot runs (load the file with the agent's own loader, render, to YAML), so the tests compare the chart
//! with the agent without building the agent binaries first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use kcp_keeper_runtime::agent::Agent;
use serde_json::Value;

pub mod dns_on_node;
pub mod on_node;
pub mod on_seed;
pub mod readme;
pub mod schema;

/// The chart's directory in this checkout.
pub fn chart_dir() -> PathBuf {
    // A copy of the chart may be tested in its place (e.g. with its schema regenerated beside the checkout's).
    std::env::var_os("KCP_KEEPER_CHART_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/kcp-keeper"))
}

/// The checkout's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The helm built here reports Kubernetes v1.20 unless told otherwise (its version is set by the release
/// build's linker flags); the chart needs >= 1.29, and the test bed runs this version.
pub const KUBE_VERSION: &str = "1.37.2";

/// The release namespace the checks install into.
pub const NAMESPACE: &str = "kcp-keeper";

/// A peer program's path (`helm`, `promtool`, `kubectl`).
pub fn peer(name: &str) -> Result<PathBuf> {
    Ok(peers::locate_only(&[name])?.path(name).to_path_buf())
}

/// What a command printed, and whether it succeeded.
#[derive(Debug)]
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(mut cmd: Command) -> Result<Output> {
    let what = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("starting {what}"))?;
    Ok(Output {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// `helm <args>` with a private helm home (no repositories, no cache shared with anything else).
pub fn helm(args: &[&str], home: &Path) -> Result<Command> {
    let mut cmd = Command::new(peer("helm")?);
    cmd.args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG");
    Ok(cmd)
}

/// `helm template` of the chart with `values` (a YAML or JSON document); Err carries helm's message.
pub fn template(values: &Value, extra: &[&str]) -> Result<String> {
    let dir = tempfile::tempdir()?;
    let values_file = dir.path().join("values.yaml");
    std::fs::write(&values_file, serde_yaml::to_string(values)?)?;
    let chart = chart_dir();
    let mut args = vec![
        "template",
        "kcp-keeper",
        chart.to_str().context("chart path")?,
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBE_VERSION,
        "--values",
        values_file.to_str().context("values path")?,
    ];
    args.extend(extra);
    let out = run(helm(&args, dir.path())?)?;
    if !out.success {
        bail!("helm template failed: {}", out.stderr.trim());
    }
    Ok(out.stdout)
}

/// Every non-empty document of a multi-document YAML stream.
pub fn documents(yaml: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value: Value = serde::Deserialize::deserialize(doc).context("parsing rendered YAML")?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// `(kind, namespace, name)` of an object.
pub type Key = (String, String, String);

pub fn key(object: &Value) -> Key {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (s(&object["kind"]), s(&object["metadata"]["namespace"]), s(&object["metadata"]["name"]))
}

const RBAC_KINDS: [&str; 4] = ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"];

/// The RBAC objects among `objects` labelled for `agent`, keyed by kind/namespace/name, in the shape the
/// comparison uses: labels reduced to `app.kubernetes.io/name` (the chart adds its own release labels; the
/// agent's one label must be among them, which this keeps checked).
pub fn rbac_of(objects: &[Value], agent: &str) -> BTreeMap<Key, Value> {
    objects
        .iter()
        .filter(|o| RBAC_KINDS.contains(&o["kind"].as_str().unwrap_or_default()))
        .filter(|o| o["metadata"]["labels"]["app.kubernetes.io/name"] == agent)
        .map(|o| {
            let mut o = o.clone();
            o["metadata"]["labels"] = serde_json::json!({ "app.kubernetes.io/name": agent });
            (key(&o), o)
        })
        .collect()
}

/// The agent's configuration file as the chart rendered it into the agent's ConfigMap.
pub fn rendered_config(objects: &[Value], agent: &str) -> Result<String> {
    let name = format!("kcp-keeper-{agent}");
    objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == name.as_str())
        .and_then(|o| o["data"]["config.yaml"].as_str())
        .map(str::to_string)
        .with_context(|| format!("no ConfigMap {name} with config.yaml in the rendered chart"))
}

/// What `<agent> rbac --config FILE --namespace NAMESPACE --service-account kcp-keeper-<agent>
/// --lease-name kcp-keeper-<agent>` prints, by the code it runs: the agent's own loader (which rejects an
/// invalid file with its field path) and its own [`Agent::rbac`].
pub fn agent_rbac(agent: &str, config_file: &Path) -> Result<String> {
    match agent {
        "ca-syncer" => rbac_for::<ca_syncer::CaSyncer>(config_file),
        "dns-rewriter" => rbac_for::<dns_rewriter::DnsRewriter>(config_file),
        "kubeconfig-rotator" => rbac_for::<kubeconfig_rotator::KubeconfigRotator>(config_file),
        "etcd-snapshotter" => rbac_for::<etcd_snapshotter::EtcdSnapshotter>(config_file),
        other => bail!("the chart does not run {other}"),
    }
}

fn rbac_for<A: Agent>(config_file: &Path) -> Result<String> {
    let name = format!("kcp-keeper-{}", A::NAME);
    let config: A::Config = kcp_keeper_runtime::config::load(config_file)?;
    let who = kcp_keeper_runtime::rbac::Subjects {
        namespace: NAMESPACE.into(),
        service_account: name.clone(),
        lease_name: name,
    };
    Ok(A::rbac(Some(&config), &who)?.to_yaml()?)
}

/// The differences between two sets of RBAC objects, one line each; empty when they are the same.
pub fn differences(chart: &BTreeMap<Key, Value>, agent: &BTreeMap<Key, Value>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in agent {
        match chart.get(k) {
            None => out.push(format!("the chart lacks {k:?}")),
            Some(c) if c != v => out.push(format!(
                "{k:?} differs:\n  chart: {}\n  agent: {}",
                serde_json::to_string(c).unwrap_or_default(),
                serde_json::to_string(v).unwrap_or_default()
            )),
            Some(_) => {}
        }
    }
    for k in chart.keys().filter(|k| !agent.contains_key(*k)) {
        out.push(format!("the chart grants more: {k:?}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn role(verbs: &[&str]) -> Value {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "kcp-keeper-x", "namespace": "a", "labels": {"app.kubernetes.io/name": "x", "extra": "y"}},
               "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["s"], "verbs": verbs}]})
    }

    #[test]
    fn one_verb_more_or_one_role_more_is_a_difference_and_release_labels_are_not() {
        let agent = rbac_of(&[role(&["get"])], "x");
        assert!(differences(&rbac_of(&[role(&["get"])], "x"), &agent).is_empty());
        assert_eq!(differences(&rbac_of(&[role(&["get", "list"])], "x"), &agent).len(), 1);
        let mut other = role(&["get"]);
        other["metadata"]["namespace"] = json!("b");
        let more = differences(&rbac_of(&[role(&["get"]), other], "x"), &agent);
        assert!(more.len() == 1 && more[0].starts_with("the chart grants more"), "{more:?}");
    }
}
