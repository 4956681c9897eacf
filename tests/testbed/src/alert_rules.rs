//! The metric names the chart's alert rules (charts/kcp-keeper/rules/*.rules.yaml) read, so an agent's test
//! can check each appears in the agent's real `/metrics`: an alert on a metric no agent exports never fires.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The chart's rules directory in this checkout.
pub fn rules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/kcp-keeper/rules")
}

/// Every metric name starting with `prefix` that an alert expression in `files` (names inside the rules
/// directory) reads, including those named through a `__name__=~"(a|b)_suffix"` matcher.
pub fn metric_names(files: &[&str], prefix: &str) -> Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for file in files {
        let path = rules_dir().join(file);
        let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
        let rules: serde_yaml::Value = serde_yaml::from_str(&text)?;
        for group in rules["groups"].as_sequence().context("groups")? {
            for rule in group["rules"].as_sequence().context("rules")? {
                let expr = rule["expr"].as_str().context("expr")?;
                names.extend(names_in(expr).into_iter().filter(|n| n.starts_with(prefix)));
            }
        }
    }
    Ok(names)
}

/// The metric names in one PromQL expression (plain selectors and `__name__` alternations).
pub fn names_in(expr: &str) -> Vec<String> {
    let mut expanded = expr.to_string();
    // `(ca_syncer|dns_rewriter)_leader` inside a regex matcher stands for each alternative with the suffix.
    while let Some(open) = expanded.find('(').filter(|&i| expanded[i..].contains(")_")) {
        let Some(close) = expanded[open..].find(')').map(|c| open + c) else { break };
        let alternatives = &expanded[open + 1..close];
        if !alternatives.contains('|') || alternatives.contains(' ') {
            // Not an alternation of names (a function call or grouping): leave it for the tokenizer.
            expanded.replace_range(open..=open, " ");
            continue;
        }
        let suffix_len = expanded[close + 1..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(expanded.len() - close - 1);
        let suffix = &expanded[close + 1..close + 1 + suffix_len];
        let words: Vec<String> = alternatives.split('|').map(|a| format!("{a}{suffix}")).collect();
        expanded.replace_range(open..close + 1 + suffix_len, &format!(" {} ", words.join(" ")));
    }
    expanded
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.contains('_'))
        .map(str::to_string)
        .collect()
}

/// The names among `names` with no sample line in the OpenMetrics `text`.
pub fn missing_from(names: &BTreeSet<String>, text: &str) -> Vec<String> {
    names
        .iter()
        .filter(|n| !text.lines().any(|l| l.strip_prefix(n.as_str()).is_some_and(|r| r.starts_with(['{', ' ']))))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_plain_selectors_and_from_name_alternations() {
        let names = names_in(r#"time() - max by (namespace, job) ({__name__=~"(ca_syncer|dns_rewriter)_leader"}) > 1"#);
        assert!(names.contains(&"ca_syncer_leader".to_string()) && names.contains(&"dns_rewriter_leader".to_string()));
        let names = names_in("sum by (bundle) (increase(ca_syncer_source_errors_total[10m])) > 0");
        assert!(names.contains(&"ca_syncer_source_errors_total".to_string()), "{names:?}");
    }

    #[test]
    fn a_name_with_only_help_and_type_lines_is_missing() {
        let names = BTreeSet::from(["a_total".to_string(), "b".to_string()]);
        let text = "# HELP a_total x\n# TYPE a_total counter\nb{x=\"1\"} 0\n";
        assert_eq!(missing_from(&names, text), ["a_total"]);
    }
}
