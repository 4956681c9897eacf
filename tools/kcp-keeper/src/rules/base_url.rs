//! "Set the virtual-workspace URL, never the base URL": `spec.shardBaseURL` (or `--shard-base-url`) on a
//! public hostname takes the whole platform down within seconds of the shards rolling (every request arrives
//! as an empty user). Its other half, `shard-virtual-workspace-url`: a shard with a public hostname sets the
//! virtual-workspace URL to it.

use std::net::IpAddr;

use kcp_keeper_runtime::redact;

use crate::layout::{Component, Layout};
use crate::verdict::Verdict;

pub const CHECK: &str = "shard-base-url";
pub const VIRTUAL_WORKSPACE: &str = "shard-virtual-workspace-url";

/// The host of an `https://host[:port][/path]` URL, lower-cased; `None` when it has none.
fn host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let host =
        if let Some(v6) = authority.strip_prefix('[') { v6.split(']').next()? } else { authority.split(':').next()? };
    (!host.is_empty()).then(|| host.trim_end_matches('.').to_ascii_lowercase())
}

/// Whether a host names something inside the cluster: a Service (`*.svc`, `*.svc.<cluster domain>`), a bare
/// single-label name, or an address. Anything else is a name that resolves outside or that the ingress serves.
fn in_cluster(host: &str, cluster_domain: &str, public: &[&str]) -> bool {
    if public.iter().any(|p| p.eq_ignore_ascii_case(host)) {
        return false;
    }
    host.parse::<IpAddr>().is_ok()
        || !host.contains('.')
        || host.ends_with(".svc")
        || host.ends_with(&format!(".svc.{}", cluster_domain.trim_end_matches('.')))
}

fn one(c: &Component, public: &[&str]) -> Verdict {
    let urls: Vec<(&str, String)> =
        [("spec.shardBaseURL", c.shard_base_url.clone()), ("--shard-base-url", c.flag("shard-base-url"))]
            .into_iter()
            .filter_map(|(f, u)| u.map(|u| (f, u)))
            .collect();
    if urls.is_empty() {
        return Verdict::ok(CHECK, c.subject(), "no base URL set (the operator's in-cluster default)");
    }
    for (field, url) in &urls {
        let shown = redact::url(url);
        match host(url) {
            Some(h) if in_cluster(&h, &c.cluster_domain, public) => {}
            Some(h) => {
                return Verdict::fail(
                    CHECK,
                    c.subject(),
                    format!("{field} {shown} is on {h}, a name outside the cluster"),
                    "remove the base URL (or point it at the shard's Service); set --shard-virtual-workspace-url for the public name",
                );
            }
            None => {
                return Verdict::fail(CHECK, c.subject(), format!("{field} {shown:?} has no host"), "fix or remove it");
            }
        }
    }
    let shown: Vec<String> = urls.iter().map(|(f, u)| format!("{f} {}", redact::url(u))).collect();
    Verdict::ok(CHECK, c.subject(), format!("{} (in-cluster)", shown.join(", ")))
}

pub fn shard_base_url(layout: &Layout) -> Vec<Verdict> {
    let public = layout.public_hostnames();
    layout.shards().map(|c| one(c, &public)).collect()
}

/// The other half of the rule: a shard with a public hostname (a name in its server certificate's template
/// that is not in-cluster) needs `--shard-virtual-workspace-url`, else kcp advertises the shard's base URL, an
/// in-cluster name, in its APIExportEndpointSlices, and providers outside the cluster cannot reach it (warn).
fn virtual_workspace(c: &Component, public: &[&str]) -> Verdict {
    const FLAG: &str = "--shard-virtual-workspace-url";
    if let Some(url) = c.flag("shard-virtual-workspace-url") {
        return Verdict::ok(VIRTUAL_WORKSPACE, c.subject(), format!("{FLAG} {}", redact::url(&url)));
    }
    let names: Vec<&str> = c
        .server_names
        .iter()
        .map(|n| n.trim_end_matches('.'))
        .filter(|n| !n.starts_with("*.") && !in_cluster(&n.to_ascii_lowercase(), &c.cluster_domain, public))
        .collect();
    match names.first() {
        None => Verdict::ok(VIRTUAL_WORKSPACE, c.subject(), "no public hostname in its server certificate"),
        Some(name) => Verdict::warn(
            VIRTUAL_WORKSPACE,
            c.subject(),
            format!(
                "public hostname {} in its server certificate, {FLAG} unset: endpoint slices advertise the in-cluster base URL",
                names.join(", ")
            ),
            &format!("add {FLAG}=https://{name}:<port> to spec.extraArgs"),
        ),
    }
}

pub fn shard_virtual_workspace_url(layout: &Layout) -> Vec<Verdict> {
    let public = layout.public_hostnames();
    layout.shards().map(|c| virtual_workspace(c, &public)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Kind;
    use crate::verdict::Level;
    use serde_json::json;

    fn check(spec: serde_json::Value) -> Verdict {
        let l = Layout { components: vec![Component::parse(Kind::Shard, "alpha", &spec).unwrap()], etcds: vec![] };
        shard_base_url(&l).remove(0)
    }

    #[test]
    fn no_base_url_or_one_on_the_shards_service_is_ok() {
        assert_eq!(check(json!({})).result, Level::Ok);
        assert_eq!(
            check(json!({"shardBaseURL": "https://alpha-shard-kcp.kcp-system.svc.cluster.local:6443"})).result,
            Level::Ok
        );
        assert_eq!(check(json!({"shardBaseURL": "https://alpha-shard-kcp.kcp-system.svc:6443"})).result, Level::Ok);
        assert_eq!(check(json!({"shardBaseURL": "https://10.96.1.2:6443"})).result, Level::Ok);
    }

    #[test]
    fn a_base_url_on_a_public_name_fails_in_the_spec_and_in_extra_args() {
        let v = check(json!({"shardBaseURL": "https://kcp.example.com:443"}));
        assert_eq!(v.result, Level::Fail);
        assert!(v.saw.contains("kcp.example.com"), "{}", v.saw);
        assert_eq!(check(json!({"extraArgs": ["--shard-base-url=https://alpha.kcp.example.com"]})).result, Level::Fail);
        assert_eq!(
            check(json!({"extraArgs": ["--shard-base-url", "https://alpha.kcp.example.com"]})).result,
            Level::Fail
        );
        assert_eq!(check(json!({"shardBaseURL": "https://"})).result, Level::Fail);
    }

    #[test]
    fn a_base_url_on_the_front_proxys_public_name_fails_even_when_it_looks_internal() {
        let l = Layout {
            components: vec![
                Component::parse(
                    Kind::RootShard,
                    "root",
                    &json!({"external": {"hostname": "kcp"}, "shardBaseURL": "https://kcp:6443"}),
                )
                .unwrap(),
            ],
            etcds: vec![],
        };
        assert_eq!(shard_base_url(&l)[0].result, Level::Fail);
    }

    fn virtual_workspace_of(spec: serde_json::Value) -> Verdict {
        let l = Layout { components: vec![Component::parse(Kind::Shard, "alpha", &spec).unwrap()], etcds: vec![] };
        shard_virtual_workspace_url(&l).remove(0)
    }

    #[test]
    fn a_shard_with_a_public_name_and_no_virtual_workspace_url_warns_and_with_one_is_ok() {
        let public =
            json!({"server": {"spec": {"dnsNames": ["alpha.kcp.example.com", "alpha-shard-kcp.kcp-system.svc"]}}});
        let v = virtual_workspace_of(json!({"certificateTemplates": public}));
        assert_eq!(v.result, Level::Warn);
        assert!(v.saw.contains("alpha.kcp.example.com") && !v.saw.contains(".svc"), "{}", v.saw);
        assert!(v.todo.contains("--shard-virtual-workspace-url=https://alpha.kcp.example.com:"), "{}", v.todo);
        let set = virtual_workspace_of(json!({
            "certificateTemplates": public,
            "extraArgs": ["--shard-virtual-workspace-url=https://alpha.kcp.example.com:6443"],
        }));
        assert_eq!(set.result, Level::Ok);
        assert!(set.saw.contains("https://alpha.kcp.example.com:6443"), "{}", set.saw);
    }

    #[test]
    fn a_shard_with_only_in_cluster_wildcard_or_address_names_needs_no_virtual_workspace_url() {
        assert_eq!(virtual_workspace_of(json!({})).result, Level::Ok);
        let names = json!({"server": {"spec": {"dnsNames": ["alpha-shard-kcp.kcp-system.svc.cluster.local", "alpha", "10.96.0.7", "*.alpha.kcp.example.com"]}}});
        assert_eq!(virtual_workspace_of(json!({"certificateTemplates": names})).result, Level::Ok);
    }

    #[test]
    fn a_base_url_with_userinfo_is_judged_by_its_host_and_shown_without_the_userinfo() {
        let fail = check(json!({"shardBaseURL": "https://admin:hunter2@kcp.example.com:443"}));
        assert_eq!(fail.result, Level::Fail);
        let ok =
            check(json!({"extraArgs": ["--shard-base-url=https://admin:hunter2@alpha-shard-kcp.kcp-system.svc:6443"]}));
        assert_eq!(ok.result, Level::Ok);
        let vw = virtual_workspace_of(
            json!({"extraArgs": ["--shard-virtual-workspace-url=https://u:hunter2@alpha.kcp.example.com"]}),
        );
        for v in [&fail, &ok, &vw] {
            assert!(!v.saw.contains("hunter2") && v.saw.contains("https://REDACTED@"), "{}", v.saw);
        }
    }

    #[test]
    fn hosts_are_read_from_urls_with_ports_paths_users_and_ipv6() {
        assert_eq!(host("https://A.example.com:6443/clusters/root").as_deref(), Some("a.example.com"));
        assert_eq!(host("https://u@h.svc/x").as_deref(), Some("h.svc"));
        assert_eq!(host("https://[fd00::1]:6443").as_deref(), Some("fd00::1"));
        assert_eq!(host("https:///x"), None);
    }
}
