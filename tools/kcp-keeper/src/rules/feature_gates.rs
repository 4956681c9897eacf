//! The `CacheAPIs` feature gate: the infrastructure provider reads its APIs through the cache server, which
//! serves them only with the gate on (every shard's `--feature-gates`).

use crate::layout::Layout;
use crate::verdict::Verdict;

pub const CHECK: &str = "cache-apis";

/// The value of `gate` in a `--feature-gates=A=true,B=false` list; later entries win.
fn gate(list: &str, gate: &str) -> Option<bool> {
    list.rsplit(',')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| k.trim() == gate)
        .filter_map(|(_, v)| v.trim().parse().ok())
        .next()
}

pub fn cache_apis(layout: &Layout) -> Vec<Verdict> {
    layout
        .shards()
        .map(|c| match c.flag("feature-gates").as_deref().and_then(|l| gate(l, "CacheAPIs")) {
            Some(true) => Verdict::ok(CHECK, c.subject(), "--feature-gates has CacheAPIs=true"),
            Some(false) => Verdict::warn(
                CHECK,
                c.subject(),
                "--feature-gates has CacheAPIs=false: the infrastructure provider cannot read its APIs through the cache",
                "add CacheAPIs=true to --feature-gates in spec.extraArgs",
            ),
            None => Verdict::warn(
                CHECK,
                c.subject(),
                "CacheAPIs is not enabled (off by default): the infrastructure provider needs it",
                "add --feature-gates=CacheAPIs=true to spec.extraArgs",
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Component, Kind};
    use crate::verdict::Level;
    use serde_json::json;

    fn check(args: serde_json::Value) -> Level {
        let c = Component::parse(Kind::Shard, "alpha", &json!({"extraArgs": args})).unwrap();
        cache_apis(&Layout { components: vec![c], etcds: vec![] })[0].result
    }

    #[test]
    fn cache_apis_on_is_ok_off_or_absent_warns() {
        assert_eq!(check(json!(["--feature-gates=Foo=true,CacheAPIs=true"])), Level::Ok);
        assert_eq!(check(json!(["--feature-gates", "CacheAPIs=true"])), Level::Ok);
        assert_eq!(check(json!(["--feature-gates=CacheAPIs=false"])), Level::Warn);
        assert_eq!(check(json!(["--feature-gates=CacheAPIs=true,CacheAPIs=false"])), Level::Warn);
        assert_eq!(check(json!([])), Level::Warn);
    }

    #[test]
    fn the_front_proxy_is_not_asked_for_the_gate() {
        let c = Component::parse(Kind::FrontProxy, "fp", &json!({})).unwrap();
        assert!(cache_apis(&Layout { components: vec![c], etcds: vec![] }).is_empty());
    }
}
