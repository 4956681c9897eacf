//! Our marked block inside a Corefile key that another field manager ("kubeadm") owns, on a real apiserver:
//! only the block changes, a no-op makes zero writes, a concurrent change by the owner is kept, ambiguous
//! content is refused without a write, and a real CoreDNS loads a Corefile holding our block. A whole key of
//! our own ([`write_key`]) is added to a ConfigMap that exists, a repeat makes zero writes, a change made
//! after our read is kept (the text is computed again from the fresh object), and a missing ConfigMap is
//! never created.

use std::collections::BTreeMap;

use anyhow::Result;
use k8s_openapi::api::core::v1::ConfigMap;
use kcp_keeper_runtime::apply::Outcome;
use kcp_keeper_runtime::marked_block::MarkedBlock;
use kcp_keeper_runtime::marked_block::configmap::{KeyError, WriteError, write_block, write_key};
use kube::api::{Api, ObjectMeta, PostParams};

const COREFILE: &str = ".:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30
    loop
    reload
    loadbalance
}
";
const RULES: &str = "rewrite name exact kcp-root.example.com. root-kcp.kcp-system.svc.cluster.local.";

fn block() -> MarkedBlock {
    MarkedBlock::new("dns-rewriter", ".:53").unwrap()
}

fn kubeadm() -> PostParams {
    PostParams { field_manager: Some("kubeadm".into()), ..Default::default() }
}

/// `kube-system/coredns` as kubeadm creates it, with a second key we never touch.
async fn coredns_configmap(api: &Api<ConfigMap>) -> Result<ConfigMap> {
    let cm = ConfigMap {
        metadata: ObjectMeta { name: Some("coredns".into()), ..Default::default() },
        data: Some(BTreeMap::from([
            ("Corefile".to_string(), COREFILE.to_string()),
            ("other".to_string(), "untouched\n".to_string()),
        ])),
        ..Default::default()
    };
    Ok(api.create(&kubeadm(), &cm).await?)
}

fn corefile(cm: &ConfigMap) -> String {
    cm.data.as_ref().unwrap()["Corefile"].clone()
}

/// Write requests the apiserver served for ConfigMaps in `ns`, from its audit log (blocking mode: a request is
/// logged before it is answered). Not `apiserver_request_total`: it has no namespace label, and the apiserver's
/// own controllers write ConfigMaps in kube-system at times of their choosing (the client CA it publishes).
fn configmap_writes(bed: &testbed::ControlPlane, ns: &str) -> Result<usize> {
    let requests = testbed::audit::read(&bed.apiserver.audit_log)?;
    Ok(requests
        .iter()
        .filter(|r| r.resource == "configmaps" && r.namespace.as_deref() == Some(ns) && r.is_write())
        .count())
}

#[tokio::test]
async fn only_our_block_changes_in_a_key_kubeadm_owns_and_a_repeat_makes_zero_writes() -> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let api = Api::<ConfigMap>::namespaced(bed.client(), &ns);
    coredns_configmap(&api).await?;

    let written = write_block(&api, "coredns", "Corefile", &block(), Some(RULES), None).await?;
    assert_eq!(written.outcome, Outcome::Updated);
    let live = api.get("coredns").await?;
    let text = corefile(&live);
    assert_eq!(block().set(&text, None)?, COREFILE, "every byte outside the block is kubeadm's, unchanged");
    assert_eq!(block().content(&text)?.as_deref(), Some(RULES));
    assert_eq!(live.data.as_ref().unwrap()["other"], "untouched\n");
    let managers: Vec<_> =
        live.metadata.managed_fields.unwrap_or_default().into_iter().filter_map(|m| m.manager).collect();
    assert!(managers.contains(&"kubeadm".to_string()) && managers.contains(&"kcp-keeper".to_string()), "{managers:?}");

    let rv = live.metadata.resource_version;
    let writes = configmap_writes(&bed, &ns)?;
    for _ in 0..3 {
        let again = write_block(&api, "coredns", "Corefile", &block(), Some(RULES), None).await?;
        assert_eq!(again.outcome, Outcome::Unchanged);
    }
    assert_eq!(api.get("coredns").await?.metadata.resource_version, rv, "resourceVersion must not move");
    assert_eq!(configmap_writes(&bed, &ns)?, writes, "the apiserver saw no write to configmaps");

    let removed = write_block(&api, "coredns", "Corefile", &block(), None, None).await?;
    assert_eq!(removed.outcome, Outcome::Updated);
    assert_eq!(corefile(&api.get("coredns").await?), COREFILE, "removing the block gives back kubeadm's bytes");
    assert!(configmap_writes(&bed, &ns)? > writes, "a real change is written (the counter works)");
    Ok(())
}

#[tokio::test]
async fn a_change_the_owner_made_after_our_read_is_kept_we_re_read_on_conflict() -> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let api = Api::<ConfigMap>::namespaced(bed.client(), &ns);
    coredns_configmap(&api).await?;

    // We read (as a reflector store would hold it), then kubeadm rewrites the Corefile before we write.
    let seen = api.get("coredns").await?;
    let mut theirs = seen.clone();
    theirs.data.as_mut().unwrap().insert("Corefile".into(), COREFILE.replace("cache 30", "cache 60"));
    api.replace("coredns", &kubeadm(), &theirs).await?;

    let written = write_block(&api, "coredns", "Corefile", &block(), Some(RULES), Some(seen)).await?;
    assert_eq!(written.outcome, Outcome::Updated);
    assert_eq!(written.conflicts, 1, "the stale write was refused by its resourceVersion, then redone");
    let text = corefile(&api.get("coredns").await?);
    assert!(text.contains("    cache 60\n"), "kubeadm's change is kept: {text}");
    assert_eq!(block().content(&text)?.as_deref(), Some(RULES), "and our block is in place");
    assert_eq!(block().set(&text, None)?, COREFILE.replace("cache 30", "cache 60"));
    Ok(())
}

#[tokio::test]
async fn ambiguous_content_is_refused_and_nothing_is_written() -> Result<()> {
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let api = Api::<ConfigMap>::namespaced(bed.client(), &ns);
    let cm = coredns_configmap(&api).await?;
    // Someone pasted our begin marker twice.
    let once = block().set(COREFILE, Some(RULES))?;
    let begin = once.lines().find(|l| l.contains("kcp-keeper:begin")).unwrap().to_string();
    let mut broken = cm.clone();
    broken.data.as_mut().unwrap().insert("Corefile".into(), once.replacen(&begin, &format!("{begin}\n{begin}"), 1));
    let broken = api.replace("coredns", &kubeadm(), &broken).await?;

    let err = write_block(&api, "coredns", "Corefile", &block(), Some(RULES), None).await.unwrap_err();
    assert!(matches!(err, WriteError::Block(..)), "{err}");
    assert_eq!(err.metric_label(), "ambiguous");
    assert_eq!(api.get("coredns").await?.metadata.resource_version, broken.metadata.resource_version);

    let err = write_block(&api, "coredns", "Missing", &block(), Some(RULES), None).await.unwrap_err();
    assert!(matches!(err, WriteError::MissingKey(..)), "{err}");
    let err = write_block(&api, "absent", "Corefile", &block(), Some(RULES), None).await.unwrap_err();
    assert!(matches!(err, WriteError::Missing(_)), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_corefile_with_our_block_loads_in_real_coredns_and_the_block_acts_inside_the_server_block() -> Result<()> {
    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let service = Service {
        metadata: ObjectMeta { name: Some("root-kcp".into()), ..Default::default() },
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort { port: 6443, ..Default::default() }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let service = Api::<Service>::namespaced(bed.client(), &ns).create(&PostParams::default(), &service).await?;
    let cluster_ip: std::net::Ipv4Addr = service.spec.and_then(|s| s.cluster_ip).expect("a ClusterIP").parse()?;

    // The test bed's kubeadm-shaped Corefile; its server key carries the port placeholder.
    let block = MarkedBlock::new("dns-rewriter", ".:{{port}}")?;
    let rule = format!("rewrite name exact kcp-root.example.com. root-kcp.{ns}.svc.cluster.local.");
    let corefile = block.set(testbed::coredns::KUBEADM_COREFILE, Some(&rule))?;
    assert_eq!(block.set(&corefile, None)?, testbed::coredns::KUBEADM_COREFILE);

    let coredns = bed.coredns(&corefile).await?;
    let answer = coredns.resolve_a("kcp-root.example.com").await?;
    assert_eq!(answer, [cluster_ip], "the rewrite in our block answers with the Service's ClusterIP");
    Ok(())
}

#[tokio::test]
async fn a_whole_key_of_our_own_is_added_computed_again_after_a_conflict_and_the_configmap_never_created() -> Result<()>
{
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let api = Api::<ConfigMap>::namespaced(bed.client(), &ns);
    let ours = |_: Option<&str>| Ok::<_, std::convert::Infallible>(format!("{RULES}\n"));

    let err = write_key(&api, "coredns-custom", "kcp.override", None, ours).await.unwrap_err();
    assert!(matches!(err, KeyError::Missing(_)), "{err}");
    assert!(api.get_opt("coredns-custom").await?.is_none(), "never created");

    // The ConfigMap as the chart creates it, with a key of someone else's.
    let cm = ConfigMap {
        metadata: ObjectMeta { name: Some("coredns-custom".into()), ..Default::default() },
        data: Some(BTreeMap::from([("theirs.server".to_string(), "one\n".to_string())])),
        ..Default::default()
    };
    let seen = api.create(&kubeadm(), &cm).await?;
    // Someone changes their key after our read: the stale write is refused, we read again and compute again.
    let mut theirs = seen.clone();
    theirs.data.as_mut().unwrap().insert("theirs.server".into(), "two\n".into());
    api.replace("coredns-custom", &kubeadm(), &theirs).await?;
    let mut given = Vec::new();
    let written = write_key(&api, "coredns-custom", "kcp.override", Some(seen), |text: Option<&str>| {
        given.push(text.map(String::from));
        ours(text)
    })
    .await?;
    assert_eq!((written.outcome, written.conflicts), (Outcome::Updated, 1));
    let own = written.written.expect("written");
    let now = api.get("coredns-custom").await?;
    assert_eq!(own.after.metadata.resource_version, now.metadata.resource_version, "the object written is returned");
    assert_ne!(own.over, own.after.metadata.resource_version, "over the fresh version, not its own");
    assert_eq!(given, [None, None], "computed again from the fresh object, where the key is still absent");
    let data = api.get("coredns-custom").await?.data.unwrap();
    assert_eq!(data["theirs.server"], "two\n", "their change is kept");
    assert_eq!(data["kcp.override"], format!("{RULES}\n"));

    let rv = api.get("coredns-custom").await?.metadata.resource_version;
    let writes = configmap_writes(&bed, &ns)?;
    for _ in 0..3 {
        let again = write_key(&api, "coredns-custom", "kcp.override", None, ours).await?;
        assert_eq!(again.outcome, Outcome::Unchanged);
    }
    let refused = write_key(&api, "coredns-custom", "kcp.override", None, |_| Err("not today")).await.unwrap_err();
    assert!(matches!(refused, KeyError::Refused("not today")), "{refused}");
    assert_eq!(api.get("coredns-custom").await?.metadata.resource_version, rv, "resourceVersion must not move");
    assert_eq!(configmap_writes(&bed, &ns)?, writes, "the apiserver saw no write to configmaps");
    Ok(())
}
