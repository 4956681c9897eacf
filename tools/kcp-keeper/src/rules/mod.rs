//! The rules, pure: what was read in, one verdict per subject out. No client, no network.

pub mod agent_pods;
pub mod base_url;
pub mod dns_rules;
pub mod endpoint_slices;
pub mod etcd_spread;
pub mod expiry;
pub mod feature_gates;
pub mod images;
pub mod network_policy;
pub mod oidc;
pub mod pairing;
pub mod restore;

use crate::layout::Layout;
use crate::verdict::Verdict;

/// Every rule on the kcp-operator objects and the etcd StatefulSets.
pub fn objects(layout: &Layout, hub: Option<&crate::layout::Oidc>) -> Vec<Verdict> {
    let mut out = Vec::new();
    out.extend(images::pinned(layout));
    out.extend(images::proxy_matches_shard(layout));
    out.extend(images::lockstep(layout));
    out.extend(base_url::shard_base_url(layout));
    out.extend(base_url::shard_virtual_workspace_url(layout));
    out.extend(feature_gates::cache_apis(layout));
    out.extend(oidc::matches_hub(layout, hub));
    out.extend(etcd_spread::spread(layout));
    out
}

/// One sample of a Prometheus text exposition (what an agent's `/metrics` serves): family, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    labels: &'a str,
    pub value: f64,
}

impl Sample<'_> {
    /// A label's value, its escapes (`\\`, `\"`, `\n`) undone; a value may hold commas (a certificate's
    /// subject does).
    pub fn label(&self, key: &str) -> Option<String> {
        let mut rest = self.labels;
        loop {
            rest = rest.trim_start_matches([',', ' ']);
            let (name, after) = rest.split_once("=\"")?;
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next()? {
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    (i, '"') => break i,
                    (_, c) => value.push(c),
                }
            };
            if name.trim() == key {
                return Some(value);
            }
            rest = &after[end + 1..];
        }
    }
}

/// The samples of an exposition; comments and lines that do not parse are skipped.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter(|l| !l.starts_with('#')).filter_map(|line| {
        let (name, labels, value) = match line.split_once('{') {
            Some((name, rest)) => {
                let (labels, value) = rest.rsplit_once("} ")?;
                (name, labels, value)
            }
            None => {
                let (name, value) = line.split_once(' ')?;
                (name, "", value)
            }
        };
        let value = value.split_whitespace().next()?.parse::<f64>().ok()?;
        Some(Sample { name, labels, value })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_with_and_without_labels_are_read_and_comments_skipped() {
        let text = "# HELP x y\nplain 2.5\nwith{a=\"1\",b=\"two\"} 3 1700000000\nbroken{a=\"1\"\n";
        let all: Vec<Sample> = samples(text).collect();
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!((all[0].name, all[0].value, all[0].label("a")), ("plain", 2.5, None));
        assert_eq!((all[1].name, all[1].value), ("with", 3.0));
        assert_eq!(
            (all[1].label("a").as_deref(), all[1].label("b").as_deref(), all[1].label("c")),
            (Some("1"), Some("two"), None)
        );
    }

    #[test]
    fn a_label_value_with_commas_quotes_and_braces_is_read_whole() {
        let text = "ca{bundle=\"kcp\",subject=\"CN=kcp-ca, O=x \\\"q\\\" {}\",sha256=\"ab\"} 7\n";
        let s: Vec<Sample> = samples(text).collect();
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].label("subject").as_deref(), Some("CN=kcp-ca, O=x \"q\" {}"));
        assert_eq!((s[0].label("bundle").as_deref(), s[0].label("sha256").as_deref()), (Some("kcp"), Some("ab")));
        assert_eq!(s[0].value, 7.0);
    }
}
