//! OIDC on the shards and the front proxy must match the hub exactly (issuer URL, client ID, `usernameClaim`,
//! the prefixes): a shard that names users differently from the front proxy or the hub sees strangers.

use crate::layout::{Component, Layout, Oidc};
use crate::verdict::Verdict;

pub const CHECK: &str = "oidc-hub";

/// The fields where `have` differs from `want`, as `field "have" (hub "want")`; an empty string is unset.
fn differences(have: &Oidc, want: &Oidc, other: &str) -> Vec<String> {
    let norm = |v: Option<&str>| v.filter(|s| !s.is_empty()).map(str::to_string);
    have.fields()
        .iter()
        .zip(want.fields())
        .filter(|((_, h), (_, w))| norm(*h) != norm(*w))
        .map(|((field, h), (_, w))| {
            let show = |v: Option<&str>| norm(v).map_or("unset".to_string(), |s| format!("{s:?}"));
            format!("{field} {} ({other} {})", show(*h), show(w))
        })
        .collect()
}

fn components(layout: &Layout) -> impl Iterator<Item = &Component> {
    layout.components.iter()
}

pub fn matches_hub(layout: &Layout, hub: Option<&Oidc>) -> Vec<Verdict> {
    let todo = "make spec.auth.oidc of every RootShard, Shard and FrontProxy equal to the hub's OIDC settings";
    match hub {
        Some(hub) => components(layout)
            .map(|c| match &c.oidc {
                None => Verdict::fail(CHECK, c.subject(), "no spec.auth.oidc: the hub's users are unknown here", todo),
                Some(oidc) => {
                    let diff = differences(oidc, hub, "hub");
                    if diff.is_empty() {
                        Verdict::ok(CHECK, c.subject(), "OIDC matches the hub")
                    } else {
                        Verdict::fail(CHECK, c.subject(), format!("differs from the hub: {}", diff.join(", ")), todo)
                    }
                }
            })
            .collect(),
        None => {
            // No hub to compare with: the components must at least agree with each other.
            let with: Vec<&Component> = components(layout).filter(|c| c.oidc.is_some()).collect();
            let Some(first) = with.first() else {
                return vec![Verdict::ok(
                    CHECK,
                    "kcp components",
                    "no OIDC on any component (no hub configured to compare with)",
                )];
            };
            let first_oidc = first.oidc.clone().unwrap_or_default();
            components(layout)
                .map(|c| {
                    let diff = match &c.oidc {
                        None => vec![format!("no spec.auth.oidc ({} has one)", first.subject())],
                        Some(o) => differences(o, &first_oidc, &first.subject()),
                    };
                    if diff.is_empty() {
                        Verdict::ok(
                            CHECK,
                            c.subject(),
                            format!("OIDC equal to {} (no hub configured)", first.subject()),
                        )
                    } else {
                        Verdict::fail(CHECK, c.subject(), diff.join(", "), todo)
                    }
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Kind;
    use crate::verdict::Level;
    use serde_json::json;

    fn hub() -> Oidc {
        serde_json::from_value(json!({"issuerURL": "https://idp.example.com", "clientID": "kcp", "usernameClaim": "email",
                                      "usernamePrefix": "railgrid:", "groupsClaim": "groups", "groupsPrefix": "railgrid:"}))
        .unwrap()
    }

    fn layout(shard_oidc: serde_json::Value) -> Layout {
        let good = json!({"auth": {"oidc": {"issuerURL": "https://idp.example.com", "clientID": "kcp", "clientSecret": "s3cret",
            "usernameClaim": "email", "usernamePrefix": "railgrid:", "groupsClaim": "groups", "groupsPrefix": "railgrid:"}}});
        Layout {
            components: vec![
                Component::parse(Kind::FrontProxy, "fp", &good).unwrap(),
                Component::parse(Kind::Shard, "alpha", &json!({"auth": {"oidc": shard_oidc}})).unwrap(),
            ],
            etcds: vec![],
        }
    }

    #[test]
    fn settings_equal_to_the_hubs_are_ok() {
        let l = layout(json!({"issuerURL": "https://idp.example.com", "clientID": "kcp", "usernameClaim": "email",
                              "usernamePrefix": "railgrid:", "groupsClaim": "groups", "groupsPrefix": "railgrid:"}));
        assert!(matches_hub(&l, Some(&hub())).iter().all(|v| v.result == Level::Ok));
        assert!(matches_hub(&l, None).iter().all(|v| v.result == Level::Ok));
    }

    #[test]
    fn a_mismatched_prefix_fails_naming_the_field_both_values_and_never_the_client_secret() {
        let l = layout(json!({"issuerURL": "https://idp.example.com", "clientID": "kcp", "usernameClaim": "email",
                              "usernamePrefix": "oidc:", "groupsClaim": "groups", "groupsPrefix": "railgrid:"}));
        let v = matches_hub(&l, Some(&hub()));
        assert_eq!(v[0].result, Level::Ok);
        assert_eq!(v[1].result, Level::Fail);
        assert!(v[1].saw.contains(r#"usernamePrefix "oidc:" (hub "railgrid:")"#), "{}", v[1].saw);
        // Without a hub the shard still disagrees with the front proxy.
        assert_eq!(matches_hub(&l, None)[1].result, Level::Fail);
        assert!(!format!("{v:?}").contains("s3cret"));
    }

    #[test]
    fn a_component_without_oidc_fails_against_the_hub_and_sub_as_username_claim_fails() {
        let l = Layout { components: vec![Component::parse(Kind::Shard, "alpha", &json!({})).unwrap()], etcds: vec![] };
        assert_eq!(matches_hub(&l, Some(&hub()))[0].result, Level::Fail);
        assert_eq!(matches_hub(&l, None)[0].result, Level::Ok);
        let l = layout(json!({"issuerURL": "https://idp.example.com", "clientID": "kcp", "usernameClaim": "sub",
                              "usernamePrefix": "railgrid:", "groupsClaim": "groups", "groupsPrefix": "railgrid:"}));
        assert!(matches_hub(&l, Some(&hub()))[1].saw.contains("usernameClaim"));
    }
}
