//! The release rule, part of `cargo xtask house`: the chart and the agents move in lockstep. The workspace's
//! version (every agent's and the tool's, `version.workspace = true`), the chart's `version` and its
//! `appVersion` (the default image tag) are one semantic version, and CHANGELOG.md has a section for it, so a
//! user reading the changelog finds the version they install.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// Checks the versions under `root`; fails naming each one that differs.
pub fn check(root: &Path) -> Result<()> {
    let read = |file: &str| std::fs::read_to_string(root.join(file)).with_context(|| format!("reading {file}"));
    let problems = problems(&read("Cargo.toml")?, &read("charts/kcp-keeper/Chart.yaml")?, &read("CHANGELOG.md")?);
    if !problems.is_empty() {
        for problem in &problems {
            eprintln!("xtask: release: {problem}");
        }
        bail!("{} release problem(s): {}", problems.len(), problems.join("; "));
    }
    Ok(())
}

fn problems(cargo: &str, chart: &str, changelog: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let workspace = cargo
        .split("[workspace.package]")
        .nth(1)
        .and_then(|section| section.lines().find_map(|l| l.trim().strip_prefix("version = ")))
        .map(|v| v.trim_matches('"').to_string());
    let Some(workspace) = workspace else {
        return vec!["Cargo.toml has no [workspace.package] version".into()];
    };
    if !is_semver(&workspace) {
        problems.push(format!("the workspace version {workspace:?} is not a semantic version (MAJOR.MINOR.PATCH)"));
    }
    let field = |name: &str| {
        chart.lines().find_map(|l| l.strip_prefix(&format!("{name}:"))).map(|v| v.trim().trim_matches('"').to_string())
    };
    for name in ["version", "appVersion"] {
        match field(name) {
            Some(v) if v == workspace => {}
            Some(v) => problems
                .push(format!("Chart.yaml {name} is {v}, the workspace's is {workspace}: they move in lockstep")),
            None => problems.push(format!("Chart.yaml has no {name}")),
        }
    }
    let heading = changelog.lines().any(|l| {
        l.strip_prefix("## ")
            .is_some_and(|h| h.split([' ', '(']).next().map(|v| v.trim_start_matches('v')) == Some(&workspace))
    });
    if !heading {
        problems.push(format!("CHANGELOG.md has no `## {workspace}` section"));
    }
    problems
}

fn is_semver(version: &str) -> bool {
    let core = version.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CARGO: &str = "[workspace]\nmembers = []\n\n[workspace.package]\nversion = \"0.2.0\"\nedition = \"2024\"\n";
    const CHART: &str = "apiVersion: v2\nname: kcp-keeper\nversion: 0.2.0\nappVersion: \"0.2.0\"\n";
    const CHANGELOG: &str = "# Changelog\n\n## 0.2.0 (unreleased)\n\n- things\n\n## 0.1.0\n";

    #[test]
    fn one_version_everywhere_with_its_changelog_section_passes() {
        assert_eq!(problems(CARGO, CHART, CHANGELOG), Vec::<String>::new());
    }

    #[test]
    fn a_chart_out_of_step_a_missing_changelog_section_and_a_non_semver_version_are_each_named() {
        let chart = CHART.replace("appVersion: \"0.2.0\"", "appVersion: \"0.1.9\"");
        let found = problems(CARGO, &chart, CHANGELOG);
        assert!(found.iter().any(|p| p.contains("appVersion is 0.1.9")), "{found:?}");
        let found = problems(CARGO, CHART, "# Changelog\n\n## 0.1.0\n");
        assert!(found.iter().any(|p| p.contains("no `## 0.2.0` section")), "{found:?}");
        let cargo = CARGO.replace("0.2.0", "0.2");
        let found = problems(&cargo, &CHART.replace("0.2.0", "0.2"), "## 0.2\n");
        assert!(found.iter().any(|p| p.contains("not a semantic version")), "{found:?}");
    }
}
