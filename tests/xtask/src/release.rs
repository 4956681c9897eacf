//! The release rule, part of `cargo xtask house`: the chart and the agents move in lockstep. The workspace's
//! version (every agent's and the tool's, `version.workspace = true`), the chart's `version` and its
//! `appVersion` (the default image tag) are one semantic version, and CHANGELOG.md has a section for it, so a
//! user reading the changelog finds the version they install.
//!
//! It also knows the release before the working tree's ([`PREVIOUS`]): `cargo xtask images` builds that
//! release's images once from its commit ([`previous_images`]) and publishes them to the test bed's registry
//! beside this tree's, so the upgrade test installs what users of the previous version run.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use crate::images::{self, AGENTS, Source};

/// The previous release: its version and the commit it was cut from (in main's history, so every clone has it).
pub const PREVIOUS: (&str, &str) = ("0.1.0", "1ea85d89ebe2c059f1a3fe2ae5b6855b15d2d2de");

/// The previous release's source tree (`git archive` of its commit, once, into the machine cache) with its
/// images in buildah's storage, built from that tree unless they are there already with its revision.
pub fn previous_images() -> Result<Source> {
    let (version, commit) = PREVIOUS;
    let here = images::workspace_root();
    let dir = peers::cache_root().join("releases").join(format!("{version}-{}", &commit[..12]));
    let root = dir.join("src");
    if !root.exists() {
        let scratch = dir.join("src.partial");
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch)?;
        let archive = Command::new("git")
            .arg("-C")
            .arg(&here)
            .args(["archive", "--format=tar", commit])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("starting git archive")?;
        let status = Command::new("tar")
            .arg("-x")
            .arg("-C")
            .arg(&scratch)
            .stdin(archive.stdout.context("git archive's output")?)
            .status()?;
        ensure!(status.success(), "unpacking release {version} ({commit}): is the commit in this clone's history?");
        std::fs::rename(&scratch, &root)?;
    }
    // The commit's time beside the tree: the images' `created`, known without the history from then on.
    if !dir.join("created").exists() {
        std::fs::write(dir.join("created"), images::git_commit_time(&here, commit)?)?;
    }
    let created = std::fs::read_to_string(dir.join("created")).context("the previous release's commit time")?;
    let source = Source { root, revision: commit.to_string(), created: created.trim().to_string() };
    let built = AGENTS.iter().all(|agent| {
        peers::buildah::AGENTS
            .output(&[
                "inspect",
                "--type",
                "image",
                "--format",
                "{{index .OCIv1.Config.Labels \"org.opencontainers.image.revision\"}}",
                &images::image_tag(agent, version),
            ])
            .is_ok_and(|label| label.trim() == commit)
    });
    if !built {
        crate::step_with(&format!("the previous release's images ({version}, built once from {commit})"), || {
            images::build_tree(&source)
        })?;
    }
    Ok(source)
}

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
    let (previous, _) = PREVIOUS;
    if version_key(previous) >= version_key(&workspace) {
        problems.push(format!("the previous release {previous} is not older than the workspace's {workspace}"));
    }
    let released = changelog.lines().any(|l| {
        l.strip_prefix("## ").is_some_and(|h| h.split([' ', '(']).next() == Some(previous) && !h.contains("unreleased"))
    });
    if !released {
        problems.push(format!("CHANGELOG.md has no released `## {previous}` section for the previous release"));
    }
    problems
}

fn version_key(version: &str) -> Vec<u64> {
    version.split(['-', '+']).next().unwrap_or_default().split('.').map(|p| p.parse().unwrap_or(0)).collect()
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

    #[test]
    fn a_previous_release_that_is_not_older_or_not_released_in_the_changelog_is_named() {
        let (previous, _) = PREVIOUS;
        let found = problems(
            CARGO,
            CHART,
            &CHANGELOG.replace(&format!("## {previous}"), &format!("## {previous} (unreleased)")),
        );
        assert!(found.iter().any(|p| p.contains("no released")), "{found:?}");
        let same = CARGO.replace("0.2.0", previous);
        let found = problems(&same, &CHART.replace("0.2.0", previous), &format!("## {previous}\n"));
        assert!(found.iter().any(|p| p.contains("is not older")), "{found:?}");
    }
}
