//! Namespace selectors, as agents' configurations write them: a Kubernetes label selector (`matchLabels` and
//! `matchExpressions`, all of which must hold). The raw shape ([`NamespaceSelector`], whose doc comments are the
//! chart schema's text), its validation with field paths ([`NamespaceSelector::validate`]), and the validated
//! [`Selector`]: its label-selector string for a watch ([`Selector::label_selector`]) and its match against a
//! namespace's labels ([`Selector::matches`]). Pure.
//!
//! A selector must hold at least one entry that selects by presence (a `matchLabels` entry, `In` or `Exists`):
//! one of only `NotIn`/`DoesNotExist` would select nearly every namespace, kube-system included, and an agent
//! would write a Secret into each.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

use crate::config::FieldError;
use crate::names;

/// Namespaces by their labels, as a Kubernetes label selector: every `matchLabels` entry and every
/// `matchExpressions` requirement must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamespaceSelector {
    /// Labels a namespace must all carry.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements on a namespace's labels. The selector needs at least one entry that selects by presence (a
    /// `matchLabels` entry, `In` or `Exists`): one of only `NotIn`/`DoesNotExist` would select nearly every
    /// namespace, kube-system included.
    #[serde(default)]
    pub match_expressions: Vec<RawRequirement>,
}

/// One requirement on a namespace's labels.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawRequirement {
    /// The label key.
    pub key: String,
    pub operator: Operator,
    /// For `In` and `NotIn`: at least one value; for `Exists` and `DoesNotExist`: none.
    #[serde(default)]
    pub values: Vec<String>,
}

/// How a requirement relates the key to its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// A namespace selector, validated: `matchLabels` and `matchExpressions`, all of which must hold.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Selector {
    pub labels: BTreeMap<String, String>,
    pub expressions: Vec<Requirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Selector {
    /// As a label selector string (`a=b,tier in (prod,staging),!opt-out`), for a watch: the labels sorted, then
    /// the expressions in the configured order, each one's values sorted.
    pub fn label_selector(&self) -> String {
        let labels = self.labels.iter().map(|(k, v)| format!("{k}={v}"));
        let set = |values: &[String]| {
            let mut values = values.to_vec();
            values.sort();
            values.dedup();
            values.join(",")
        };
        let expressions = self.expressions.iter().map(|r| match r {
            Requirement::In(k, values) => format!("{k} in ({})", set(values)),
            Requirement::NotIn(k, values) => format!("{k} notin ({})", set(values)),
            Requirement::Exists(k) => k.clone(),
            Requirement::DoesNotExist(k) => format!("!{k}"),
        });
        labels.chain(expressions).collect::<Vec<_>>().join(",")
    }

    /// Whether a namespace with `labels` is selected, as the apiserver decides it for [`Self::label_selector`].
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.expressions.iter().all(|r| match r {
                Requirement::In(k, values) => labels.get(k).is_some_and(|v| values.contains(v)),
                Requirement::NotIn(k, values) => labels.get(k).is_none_or(|v| !values.contains(v)),
                Requirement::Exists(k) => labels.contains_key(k),
                Requirement::DoesNotExist(k) => !labels.contains_key(k),
            })
    }
}

impl NamespaceSelector {
    /// The validated selector; every mistake is recorded with its path under `path` (`...namespaceSelector`).
    pub fn validate(&self, path: &str, errors: &mut Vec<FieldError>) -> Selector {
        let mut check = |path: String, result: Result<(), String>| {
            if let Err(reason) = result {
                errors.push(FieldError::new(path, reason));
            }
        };
        for (key, value) in &self.match_labels {
            let at = format!("{path}.matchLabels[{key:?}]");
            check(at.clone(), names::check_label_key(key).map_err(|r| format!("key {r}")));
            check(at, names::check_label_value(value).map_err(|r| format!("value {r}")));
        }
        let mut expressions = Vec::new();
        for (i, raw) in self.match_expressions.iter().enumerate() {
            let path = format!("{path}.matchExpressions[{i}]");
            check(format!("{path}.key"), names::check_label_key(&raw.key));
            for (j, value) in raw.values.iter().enumerate() {
                check(format!("{path}.values[{j}]"), names::check_label_value(value));
            }
            let (key, values) = (raw.key.clone(), raw.values.clone());
            match raw.operator {
                Operator::In | Operator::NotIn if values.is_empty() => {
                    check(format!("{path}.values"), Err("In and NotIn need at least one value".into()));
                }
                Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                    check(format!("{path}.values"), Err("Exists and DoesNotExist take no values".into()));
                }
                Operator::In => expressions.push(Requirement::In(key, values)),
                Operator::NotIn => expressions.push(Requirement::NotIn(key, values)),
                Operator::Exists => expressions.push(Requirement::Exists(key)),
                Operator::DoesNotExist => expressions.push(Requirement::DoesNotExist(key)),
            }
        }
        let selects = !self.match_labels.is_empty()
            || self.match_expressions.iter().any(|r| matches!(r.operator, Operator::In | Operator::Exists));
        if !selects {
            check(
                format!("{path}.matchLabels"),
                Err("must name at least one label (or a matchExpressions entry with In or Exists); an empty selector, or one of only NotIn and DoesNotExist, would select nearly everything (every namespace, kube-system included)".into()),
            );
        }
        Selector { labels: self.match_labels.clone(), expressions }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector(yaml: &str) -> (Selector, Vec<String>) {
        let raw: NamespaceSelector = serde_yaml::from_str(yaml).unwrap();
        let mut errors = Vec::new();
        let s = raw.validate("s", &mut errors);
        (s, errors.iter().map(ToString::to_string).collect())
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn every_requirement_must_hold_and_the_string_is_what_the_apiserver_reads() {
        let (s, errors) = selector(
            "matchLabels: {kcp: hub}\nmatchExpressions:\n- {key: tier, operator: In, values: [staging, prod]}\n- {key: opt-out, operator: DoesNotExist}\n- {key: zone, operator: NotIn, values: [b]}\n- {key: team, operator: Exists}\n",
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(s.label_selector(), "kcp=hub,tier in (prod,staging),!opt-out,zone notin (b),team");
        let all = [("kcp", "hub"), ("tier", "prod"), ("team", "a")];
        assert!(s.matches(&labels(&all)));
        assert!(s.matches(&labels(&[("kcp", "hub"), ("tier", "prod"), ("team", "a"), ("zone", "c")])));
        for wrong in [
            labels(&[("kcp", "other"), ("tier", "prod"), ("team", "a")]),
            labels(&[("kcp", "hub"), ("tier", "dev"), ("team", "a")]),
            labels(&[("kcp", "hub"), ("tier", "prod")]),
            labels(&[("kcp", "hub"), ("tier", "prod"), ("team", "a"), ("opt-out", "")]),
            labels(&[("kcp", "hub"), ("tier", "prod"), ("team", "a"), ("zone", "b")]),
        ] {
            assert!(!s.matches(&wrong), "{wrong:?}");
        }
    }

    #[test]
    fn a_selector_that_would_select_every_namespace_and_bad_entries_are_refused_with_their_paths() {
        for everything in
            ["{}", "matchExpressions: [{key: a, operator: NotIn, values: [x]}, {key: b, operator: DoesNotExist}]"]
        {
            let (_, errors) = selector(everything);
            assert!(errors.iter().any(|e| e.starts_with("s.matchLabels: must name at least one label")), "{errors:?}");
        }
        let (_, errors) = selector(
            "matchExpressions:\n- {key: a, operator: NotIn, values: [x]}\n- {key: b, operator: In}\n- {key: c, operator: Exists, values: [y]}\n- {key: 'bad key!', operator: DoesNotExist}\n",
        );
        for expected in [
            "s.matchExpressions[1].values: In and NotIn need at least one value",
            "s.matchExpressions[2].values: Exists and DoesNotExist take no values",
            "s.matchExpressions[3].key:",
        ] {
            assert!(errors.iter().any(|e| e.starts_with(expected)), "missing {expected:?} in {errors:?}");
        }
    }
}
