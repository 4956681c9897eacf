//! "Pin every kcp image explicitly, including the root shard's proxy image; otherwise a component follows the
//! operator's default and drifts on the next operator upgrade", and versions move in lockstep.

use crate::layout::{Image, Kind, Layout};
use crate::verdict::Verdict;

pub const PINNED: &str = "pinned-images";
pub const PROXY: &str = "proxy-image";
pub const LOCKSTEP: &str = "lockstep-versions";

/// Why an image is not pinned, or `None` when it is.
fn unpinned(image: &Image) -> Option<&'static str> {
    match (image.repository.as_deref(), image.tag.as_deref()) {
        (None | Some(""), _) => Some("no repository: the operator's default image"),
        (_, None | Some("")) => Some("no tag: the operator's default version"),
        (_, Some("latest")) => Some("tag latest moves by itself"),
        _ => None,
    }
}

pub fn pinned(layout: &Layout) -> Vec<Verdict> {
    let mut out = Vec::new();
    for c in &layout.components {
        let mut images = vec![("spec.image", c.image.clone())];
        if c.kind == Kind::RootShard {
            images.push(("spec.proxy.image", c.proxy_image.clone().unwrap_or_default()));
        }
        let bad: Vec<String> = images
            .iter()
            .filter_map(|(field, image)| unpinned(image).map(|why| format!("{field} {}: {why}", image.describe())))
            .collect();
        out.push(if bad.is_empty() {
            let shown: Vec<String> = images.iter().map(|(f, i)| format!("{f} {}", i.describe())).collect();
            Verdict::ok(PINNED, c.subject(), shown.join(", "))
        } else {
            Verdict::fail(
                PINNED,
                c.subject(),
                bad.join("; "),
                "set repository and tag explicitly (for a RootShard also spec.proxy.image) to the version you run",
            )
        });
    }
    out
}

/// The root shard's proxy must run exactly the root shard's image.
pub fn proxy_matches_shard(layout: &Layout) -> Vec<Verdict> {
    layout
        .components
        .iter()
        .filter(|c| c.kind == Kind::RootShard)
        .map(|c| {
            let proxy = c.proxy_image.clone().unwrap_or_default();
            if proxy == c.image && unpinned(&proxy).is_none() {
                Verdict::ok(PROXY, c.subject(), format!("proxy runs the shard's image {}", c.image.describe()))
            } else {
                Verdict::fail(
                    PROXY,
                    c.subject(),
                    format!("proxy image {} differs from the shard image {}", proxy.describe(), c.image.describe()),
                    "set spec.proxy.image to the same repository and tag as spec.image",
                )
            }
        })
        .collect()
}

/// Every kcp component on one version: shards on different versions are a warning (an upgrade in progress is
/// fine for a while; left so, the shards disagree about APIs).
pub fn lockstep(layout: &Layout) -> Vec<Verdict> {
    let mut tags: Vec<(String, String)> = Vec::new();
    for c in &layout.components {
        tags.push((c.subject(), c.image.tag.clone().unwrap_or_else(|| "<operator default>".into())));
    }
    let mut distinct: Vec<&str> = tags.iter().map(|(_, t)| t.as_str()).collect();
    distinct.sort();
    distinct.dedup();
    let subject = "kcp components";
    match distinct.len() {
        0 => vec![Verdict::warn(LOCKSTEP, subject, "no RootShard, Shard or FrontProxy found", "check --namespace")],
        1 => vec![Verdict::ok(LOCKSTEP, subject, format!("all {} on {}", tags.len(), distinct[0]))],
        _ => {
            let each: Vec<String> = tags.iter().map(|(s, t)| format!("{s} {t}")).collect();
            vec![Verdict::warn(
                LOCKSTEP,
                subject,
                format!("versions differ: {}", each.join(", ")),
                "finish the upgrade: move every shard and the front proxy to one kcp version",
            )]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Component, Kind};
    use crate::verdict::Level;
    use serde_json::json;

    fn image(tag: &str) -> serde_json::Value {
        json!({"repository": "ghcr.io/kcp-dev/kcp", "tag": tag})
    }

    fn layout(root: serde_json::Value, shard: serde_json::Value) -> Layout {
        Layout {
            components: vec![
                Component::parse(Kind::RootShard, "root", &root).unwrap(),
                Component::parse(Kind::Shard, "alpha", &shard).unwrap(),
            ],
            etcds: vec![],
        }
    }

    #[test]
    fn every_image_pinned_the_proxy_included_is_ok() {
        let l = layout(
            json!({"image": image("v0.32.3"), "proxy": {"image": image("v0.32.3")}}),
            json!({"image": image("v0.32.3")}),
        );
        assert!(pinned(&l).iter().all(|v| v.result == Level::Ok), "{:?}", pinned(&l));
        assert_eq!(proxy_matches_shard(&l)[0].result, Level::Ok);
        assert_eq!(lockstep(&l)[0].result, Level::Ok);
    }

    #[test]
    fn an_unpinned_proxy_image_fails_the_root_shard_and_the_proxy_rule() {
        let l = layout(json!({"image": image("v0.32.3")}), json!({"image": image("v0.32.3")}));
        let v = pinned(&l);
        assert_eq!(v[0].result, Level::Fail, "{v:?}");
        assert!(v[0].saw.contains("spec.proxy.image"), "{}", v[0].saw);
        assert_eq!(v[1].result, Level::Ok);
        assert_eq!(proxy_matches_shard(&l)[0].result, Level::Fail);
    }

    #[test]
    fn a_missing_tag_or_latest_is_unpinned() {
        for shard in [json!({}), json!({"image": {"repository": "r"}}), json!({"image": image("latest")})] {
            let l = layout(json!({"image": image("v1"), "proxy": {"image": image("v1")}}), shard.clone());
            assert_eq!(pinned(&l)[1].result, Level::Fail, "{shard}");
        }
    }

    #[test]
    fn a_proxy_on_another_tag_than_its_shard_fails() {
        let l = layout(
            json!({"image": image("v0.32.3"), "proxy": {"image": image("v0.32.2")}}),
            json!({"image": image("v0.32.3")}),
        );
        let v = proxy_matches_shard(&l);
        assert_eq!(v[0].result, Level::Fail);
        assert!(v[0].saw.contains("v0.32.2"), "{}", v[0].saw);
    }

    #[test]
    fn shards_on_different_versions_warn_naming_each() {
        let l = layout(
            json!({"image": image("v0.32.3"), "proxy": {"image": image("v0.32.3")}}),
            json!({"image": image("v0.31.0")}),
        );
        let v = lockstep(&l);
        assert_eq!(v[0].result, Level::Warn);
        assert!(v[0].saw.contains("shard/alpha v0.31.0"), "{}", v[0].saw);
    }
}
