//! The chart's alert rules, with the real promtool: every rules file passes `promtool check rules` and its
//! unit tests (`promtool test rules`), every alert is tested firing and not firing, and every `runbook_url`
//! points at a section that exists in docs/runbooks.md.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use anyhow::Result;
use chart::{chart_dir, peer, repo_root, run};
use serde_json::Value;

fn rules_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart_dir().join("rules"))
        .expect("rules dir")
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".rules.yaml"))
        .collect();
    files.sort();
    files
}

fn yaml(path: &PathBuf) -> Value {
    serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn alerts(rules: &Value) -> Vec<&Value> {
    rules["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap()).collect()
}

#[test]
fn every_rules_file_passes_promtool_check_and_its_unit_tests() -> Result<()> {
    let files = rules_files();
    assert_eq!(files.len(), 6, "common, one per agent and the doctor's: {files:?}");
    for file in files {
        let test = PathBuf::from(file.to_string_lossy().replace(".rules.yaml", ".test.yaml"));
        assert!(test.exists(), "{} has no unit tests ({})", file.display(), test.display());
        let mut check = Command::new(peer("promtool")?);
        check.arg("check").arg("rules").arg(&file);
        let out = run(check)?;
        assert!(out.success, "promtool check rules {}:\n{}{}", file.display(), out.stdout, out.stderr);
        let mut unit = Command::new(peer("promtool")?);
        unit.current_dir(chart_dir().join("rules")).arg("test").arg("rules").arg(&test);
        let out = run(unit)?;
        assert!(out.success, "promtool test rules {}:\n{}{}", test.display(), out.stdout, out.stderr);
        assert!(out.stdout.contains("SUCCESS"), "{}", out.stdout);
    }
    Ok(())
}

#[test]
fn every_alert_is_tested_both_firing_and_not_firing() {
    for file in rules_files() {
        let tests = yaml(&PathBuf::from(file.to_string_lossy().replace(".rules.yaml", ".test.yaml")));
        let cases: Vec<&Value> =
            tests["tests"].as_array().unwrap().iter().flat_map(|t| t["alert_rule_test"].as_array().unwrap()).collect();
        for alert in alerts(&yaml(&file)) {
            let name = alert["alert"].as_str().unwrap();
            let of_this: Vec<&&Value> = cases.iter().filter(|c| c["alertname"] == name).collect();
            let fires = of_this.iter().any(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()));
            // Each case lists exactly the alerts expected, so one with neighbours that must stay quiet already
            // tests "not firing" for them; an explicit empty case is required as well (before `for:` elapses).
            let quiet = of_this.iter().any(|c| c["exp_alerts"].as_array().is_some_and(|a| a.is_empty()));
            assert!(fires, "{name} ({}) is never tested firing", file.display());
            assert!(quiet, "{name} ({}) is never tested not firing", file.display());
        }
    }
}

#[test]
fn every_alert_has_a_severity_and_a_runbook_url_to_an_existing_section_of_docs_runbooks() {
    let runbooks = std::fs::read_to_string(repo_root().join("docs/runbooks.md")).unwrap();
    // GitHub's anchors: the heading in lower case.
    let anchors: BTreeSet<String> =
        runbooks.lines().filter_map(|l| l.strip_prefix("## ")).map(|h| h.trim().to_lowercase()).collect();
    let base = "https://github.com/kcp-keeper/kcp-keeper/blob/main/docs/runbooks.md#";
    for file in rules_files() {
        for alert in alerts(&yaml(&file)) {
            let name = alert["alert"].as_str().unwrap();
            let severity = alert["labels"]["severity"].as_str().unwrap_or_default();
            assert!(["warning", "critical"].contains(&severity), "{name}: severity {severity:?}");
            let url = alert["annotations"]["runbook_url"].as_str().unwrap_or_default();
            let anchor = url.strip_prefix(base).unwrap_or_else(|| panic!("{name}: runbook_url {url:?}"));
            assert!(anchors.contains(anchor), "{name}: no section #{anchor} in docs/runbooks.md");
        }
    }
}
