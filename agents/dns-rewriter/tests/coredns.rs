//! Every shape the renderer can produce, proven against a real CoreDNS whose `kubernetes` plugin watches the
//! test bed's real kube-apiserver (Services with real ClusterIPs): it loads, and a query for the public
//! name answers with the Service's ClusterIP under the public name. Test traffic is DNS to 127.0.0.1; the
//! ClusterIPs are only data in the answers.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use common::{answers, coredns_with, create_service, domain, rules, wait_answer, wait_no_answer};
use dns_rewriter::block;
use dns_rewriter::hostname::Hostname;
use dns_rewriter::render::{self, HEADER};
use dns_rewriter::rules::RuleSet;
use dns_rewriter::verify::{self, Outcome};
use testbed::ControlPlane;
use testbed::coredns::{K3S_COREFILE, KUBEADM_COREFILE};

const OVERRIDE_KEY: &str = "kcp-split-horizon.override";
/// The server block key of the test bed's Corefiles (the port is filled in at start).
const SERVER: &str = ".:{{port}}";
/// Reload polls every 2s (+-1s) in the test bed's Corefiles; generous for a loaded machine.
const RELOAD: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug)]
enum Mode {
    K3s,
    Corefile,
}

/// The Corefile and projected files CoreDNS starts with when `snippet` is written in `mode`.
fn placed(mode: Mode, snippet: &str) -> Result<(String, BTreeMap<String, String>)> {
    Ok(match mode {
        Mode::K3s => (K3S_COREFILE.into(), BTreeMap::from([(OVERRIDE_KEY.into(), snippet.into())])),
        Mode::Corefile => (block::set(KUBEADM_COREFILE, SERVER, Some(snippet))?, BTreeMap::new()),
    })
}

#[tokio::test]
async fn every_rendered_shape_loads_in_real_coredns_and_answers_the_cluster_ip_under_the_public_name() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let client = bed.client();
    let root = create_service(&client, &ns, "root-kcp", &[], false).await?.unwrap();
    let alpha = create_service(&client, &ns, "alpha-shard-kcp", &[], false).await?.unwrap();
    let proxy = create_service(&client, &ns, "frontproxy-front-proxy", &[], false).await?.unwrap();
    let shapes: Vec<(&str, RuleSet)> = vec![
        ("no rule", RuleSet::new()),
        ("one rule", rules(&[("kcp-root.example.com", &ns, "root-kcp", root)])),
        (
            "many rules, two names for one Service",
            rules(&[
                ("kcp-root.example.com", &ns, "root-kcp", root),
                ("root.kcp.example.com", &ns, "root-kcp", root),
                ("alpha.kcp.example.com", &ns, "alpha-shard-kcp", alpha),
                ("kcp.example.com", &ns, "frontproxy-front-proxy", proxy),
            ]),
        ),
    ];
    for (shape, set) in &shapes {
        let snippet = render::render(set, &domain());
        render::check(&snippet, &domain()).with_context(|| format!("{shape}: our own check"))?;
        for mode in [Mode::K3s, Mode::Corefile] {
            let (corefile, custom) = placed(mode, &snippet)?;
            let dns = coredns_with(&bed, &corefile, &custom).await.with_context(|| format!("{shape}, {mode:?}"))?;
            for (host, target) in set.iter() {
                wait_answer(&dns, host.as_str(), target.cluster_ip.unwrap(), Duration::from_secs(10)).await;
            }
            // The rules are exact: a name without a rule gets no address.
            assert!(answers(&dns, "other.example.com").await.is_empty(), "{shape}, {mode:?}");
            // The Service's own name still answers: the rewrite does not shadow the kubernetes plugin.
            wait_answer(&dns, &format!("root-kcp.{ns}.svc.cluster.local"), root, Duration::from_secs(10)).await;
        }
    }
    Ok(())
}

/// The negative control for the test above: a line our grammar refuses is refused by CoreDNS too, so
/// "CoreDNS started and answered" is a check that can fail. (Not every refused line fails CoreDNS: a rule
/// with one name, `rewrite name exact a.example.com.`, loads as a rewrite of the name `exact`, since the
/// match type is optional. That is why the grammar insists on the exact five-word form.)
#[tokio::test]
async fn a_snippet_our_check_refuses_also_fails_to_load_in_real_coredns() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let broken = format!("{HEADER}rewrite name regex (kcp-root.example.com. root-kcp.kcp-system.svc.cluster.local.\n");
    assert!(render::check(&broken, &domain()).is_err());
    for mode in [Mode::K3s, Mode::Corefile] {
        let (corefile, custom) = placed(mode, &broken)?;
        let err = match coredns_with(&bed, &corefile, &custom).await {
            Ok(_) => panic!("{mode:?}: CoreDNS loaded a rule with one name"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains("exited"), "{mode:?}: {err}");
    }
    Ok(())
}

/// The write path as the agent will use it: a new value of the key (k3s: projected the kubelet way; Corefile:
/// the file rewritten) is picked up by `reload`; an added rule starts answering, a removed one stops.
#[tokio::test]
async fn a_changed_snippet_is_reloaded_added_rules_answer_and_removed_rules_stop() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let client = bed.client();
    let root = create_service(&client, &ns, "root-kcp", &[], false).await?.unwrap();
    let alpha = create_service(&client, &ns, "alpha-shard-kcp", &[], false).await?.unwrap();
    let before = render::render(&rules(&[("kcp-root.example.com", &ns, "root-kcp", root)]), &domain());
    let after = render::render(&rules(&[("alpha.kcp.example.com", &ns, "alpha-shard-kcp", alpha)]), &domain());
    for mode in [Mode::K3s, Mode::Corefile] {
        let (corefile, custom) = placed(mode, &before)?;
        let dns = coredns_with(&bed, &corefile, &custom).await?;
        wait_answer(&dns, "kcp-root.example.com", root, Duration::from_secs(10)).await;
        match mode {
            Mode::K3s => testbed::projection::project_strings(
                &dns.dir.join("custom"),
                &BTreeMap::from([(OVERRIDE_KEY.into(), after.clone())]),
            )?,
            Mode::Corefile => {
                let current = std::fs::read_to_string(dns.dir.join("Corefile"))?;
                let server = format!(".:{}", dns.port);
                let next = block::set(&current, &server, Some(&after))?;
                block::check_candidate(&current, &next, &server, &domain())?;
                std::fs::write(dns.dir.join("Corefile"), next)?;
            }
        }
        wait_answer(&dns, "alpha.kcp.example.com", alpha, RELOAD).await;
        wait_no_answer(&dns, "kcp-root.example.com", RELOAD).await;
    }
    Ok(())
}

/// Verification against real DNS: a loaded rule is a match; a rule whose Service is gone has no answer
/// (NXDOMAIN from the kubernetes plugin); a name without a rule is an error here (the test bed's CoreDNS has
/// no upstream, so it answers REFUSED or SERVFAIL); when the Service was recreated with a new ClusterIP, the
/// old expectation is a mismatch.
#[tokio::test]
async fn verification_tells_match_no_answer_error_and_a_recreated_service_apart() -> Result<()> {
    let bed = ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let client = bed.client();
    let root = create_service(&client, &ns, "root-kcp", &[], false).await?.unwrap();
    let gone = create_service(&client, &ns, "gone", &[], false).await?.unwrap();
    let set = rules(&[("kcp-root.example.com", &ns, "root-kcp", root), ("gone.example.com", &ns, "gone", gone)]);
    let api = kube::Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), &ns);
    api.delete("gone", &Default::default()).await?;
    let (corefile, custom) = placed(Mode::K3s, &render::render(&set, &domain()))?;
    let dns = coredns_with(&bed, &corefile, &custom).await?;
    let resolver = verify::resolver(([127, 0, 0, 1], dns.port).into(), Duration::from_secs(2))?;
    let host = Hostname::parse("kcp-root.example.com")?;

    let ok = testbed::eventually(Duration::from_secs(10), "a match", || async {
        let c = verify::check_one(&resolver, &host, Some(root)).await;
        (c.outcome == Outcome::Match).then_some(c)
    })
    .await;
    assert_eq!(ok.answered, vec![root]);
    assert!(ok.other_names.is_empty());

    let gone_check = verify::check_one(&resolver, &Hostname::parse("gone.example.com")?, Some(gone)).await;
    assert_eq!(gone_check.outcome, Outcome::NoAnswer, "{gone_check:?}");
    let unruled = verify::check_one(&resolver, &Hostname::parse("alpha.kcp.example.com")?, Some(root)).await;
    assert_eq!(unruled.outcome, Outcome::Error, "{unruled:?}");

    api.delete("root-kcp", &Default::default()).await?;
    let recreated = testbed::eventually(Duration::from_secs(10), "the Service to be gone", || {
        let client = client.clone();
        let ns = ns.clone();
        async move { create_service(&client, &ns, "root-kcp", &[], false).await.ok().flatten() }
    })
    .await;
    assert_ne!(recreated, root);
    let stale = testbed::eventually(Duration::from_secs(15), "CoreDNS to answer the new ClusterIP", || async {
        let c = verify::check_one(&resolver, &host, Some(root)).await;
        (c.answered == vec![recreated]).then_some(c)
    })
    .await;
    assert_eq!(stale.outcome, Outcome::Mismatch);
    assert_eq!(verify::check_one(&resolver, &host, Some(recreated)).await.outcome, Outcome::Match);
    Ok(())
}
