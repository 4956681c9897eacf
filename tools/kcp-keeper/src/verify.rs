//! The seed's Verify section, run the way the seed runs it, from inside the cluster's network: the rollout of
//! every Deployment the operator made, `/readyz` through the front proxy, anonymous `/api` (403 on a shard, 401
//! on the front proxy), and the split-horizon lookup of the public name through the cluster DNS (and
//! node-local-dns where given).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::Api;

use crate::layout::{Component, Kind, Layout};
use crate::options::{KeyRef, Options};
use crate::verdict::Verdict;

pub const ROLLOUT: &str = "rollout";
pub const READYZ: &str = "readyz";
pub const ANONYMOUS: &str = "anonymous-api";
pub const SPLIT_HORIZON: &str = "split-horizon";

const TIMEOUT: Duration = Duration::from_secs(10);

/// The Deployments (and Services of the same names) the operator makes for a component.
pub fn deployments(c: &Component) -> Vec<String> {
    match c.kind {
        Kind::RootShard => vec![format!("{}-kcp", c.name), format!("{}-proxy", c.name)],
        Kind::Shard => vec![format!("{}-shard-kcp", c.name)],
        Kind::FrontProxy => vec![format!("{}-front-proxy", c.name)],
    }
}

/// What `kubectl rollout status` decides: the newest generation observed, every replica updated and available,
/// no old replica left.
pub fn rollout(name: &str, d: Option<&Deployment>) -> Verdict {
    let subject = format!("deployment/{name}");
    let todo = "kubectl -n <namespace> describe deployment and its pods: see why the rollout does not finish";
    let Some(d) = d else {
        return Verdict::fail(ROLLOUT, subject, "not found: the operator has not made it", todo);
    };
    let want = d.spec.replicas.unwrap_or(1);
    let s = d.status.clone().unwrap_or_default();
    let observed = s.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0);
    let updated = s.updated_replicas.unwrap_or(0);
    let total = s.replicas.unwrap_or(0);
    let available = s.available_replicas.unwrap_or(0);
    let saw = format!("{updated}/{want} updated, {available} available, {total} in all");
    if observed && updated >= want && total <= updated && available >= want {
        Verdict::ok(ROLLOUT, subject, format!("rolled out: {saw}"))
    } else if !observed {
        Verdict::fail(ROLLOUT, subject, "the newest spec is not observed yet", todo)
    } else {
        Verdict::fail(ROLLOUT, subject, format!("rollout not finished: {saw}"), todo)
    }
}

/// The code a check expects from a request, judged.
pub fn expect(
    check: &'static str,
    subject: String,
    got: anyhow::Result<(u16, String)>,
    want: u16,
    why: &str,
    todo: &str,
) -> Verdict {
    match got {
        Ok((code, _)) if code == want => Verdict::ok(check, subject, format!("{code} ({why})")),
        Ok((code, body)) => {
            let body: String = body.chars().take(120).collect();
            Verdict::fail(check, subject, format!("{code}, want {want} ({why}): {}", body.trim()), todo)
        }
        Err(e) => Verdict::fail(check, subject, format!("no answer: {e:#}"), todo),
    }
}

async fn service_address(client: &kube::Client, namespace: &str, name: &str) -> Result<SocketAddr, String> {
    let svc = Api::<Service>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| format!("reading Service {namespace}/{name}: {e}"))?
        .ok_or_else(|| format!("no Service {namespace}/{name}"))?;
    let spec = svc.spec.unwrap_or_default();
    let ip: IpAddr = spec
        .cluster_ip
        .as_deref()
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| format!("Service {namespace}/{name} has no ClusterIP"))?;
    let port = spec
        .ports
        .unwrap_or_default()
        .first()
        .map(|p| p.port)
        .ok_or_else(|| format!("Service {namespace}/{name} has no port"))?;
    Ok(SocketAddr::new(ip, u16::try_from(port).map_err(|_| "port out of range".to_string())?))
}

/// Where a Service is reached: its ClusterIP and first port, or with `endpoints` a ready endpoint of it (for
/// a network that has no route to ClusterIPs, such as a node's own namespace without kube-proxy's routes).
async fn service_target(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    endpoints: bool,
) -> Result<SocketAddr, String> {
    let cluster = service_address(client, namespace, name).await?;
    if !endpoints {
        return Ok(cluster);
    }
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), namespace)
        .list(&kube::api::ListParams::default().labels(&format!("kubernetes.io/service-name={name}")))
        .await
        .map_err(|e| format!("reading the EndpointSlices of {namespace}/{name}: {e}"))?;
    for slice in slices.items {
        let port = slice.ports.as_ref().and_then(|p| p.first()).and_then(|p| p.port);
        for e in slice.endpoints.unwrap_or_default() {
            let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false);
            if let (true, Some(ip), Some(port)) =
                (ready, e.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()), port)
            {
                return Ok(SocketAddr::new(ip, u16::try_from(port).map_err(|_| "port out of range".to_string())?));
            }
        }
    }
    Err(format!("Service {namespace}/{name} has no ready endpoint"))
}

/// Why the requests to kcp are not made without `--server-ca` under `--no-secrets`, and what makes them.
const NO_SERVER_CA: &str = "no public copy of kcp's server CA to verify the serving certificates with (the \
                            RootShard's <name>-server-ca Secret holds the CA's private key, and this doctor reads no Secret)";
const SERVER_CA_TODO: &str =
    "copy the server CA's certificate into a ConfigMap (a ca-syncer target) and name it with --server-ca";

/// The server CA's certificates: from `--server-ca`; else the `tls.crt` of the root shard's `<name>-server-ca`
/// Secret (its certificate only; the Secret's `tls.key` is dropped unread); else, under `--no-secrets`, none.
async fn server_ca(client: &kube::Client, root: &Component, options: &Options) -> anyhow::Result<Option<Vec<u8>>> {
    if let Some(source) = &options.server_ca {
        return crate::read::ca_bundle(client, source).await.map(Some);
    }
    if options.no_secrets {
        return Ok(None);
    }
    let r = KeyRef {
        namespace: options.namespace.clone(),
        name: format!("{}-server-ca", root.name),
        key: "tls.crt".into(),
    };
    crate::read::secret_key(client, &r).await.map(Some)
}

/// The Verify section: one verdict per Deployment, request and name.
pub async fn run(client: &kube::Client, layout: &Layout, options: &Options) -> Vec<Verdict> {
    let mut out = rollouts(client, layout, &options.namespace).await;
    let Some(root) = layout.components.iter().find(|c| c.kind == Kind::RootShard) else {
        let ns = &options.namespace;
        out.push(Verdict::fail(READYZ, "kcp", format!("no RootShard in {ns}"), "check --namespace"));
        return out;
    };
    let ca = match server_ca(client, root, options).await {
        Ok(ca) => ca,
        Err(e) => {
            out.push(Verdict::fail(
                READYZ,
                "kcp",
                format!("no server CA to verify with: {e:#}"),
                if options.server_ca.is_some() { "check --server-ca" } else { "check the operator's certificates" },
            ));
            return out;
        }
    };
    let public = layout
        .components
        .iter()
        .find(|c| c.kind == Kind::FrontProxy && c.external_hostname.is_some())
        .or(Some(root))
        .and_then(|c| c.external_hostname.clone());
    out.extend(front_proxies(client, layout, options, (ca.as_deref(), public.as_deref())).await);
    out.extend(shards(client, layout, options, ca.as_deref()).await);
    out.extend(split_horizon(client, layout, options, public.as_deref()).await);
    out
}

/// `kubectl rollout status` of every Deployment of the layout's components.
async fn rollouts(client: &kube::Client, layout: &Layout, ns: &str) -> Vec<Verdict> {
    let mut out = Vec::new();
    let deployments_api = Api::<Deployment>::namespaced(client.clone(), ns);
    for c in &layout.components {
        for name in deployments(c) {
            match deployments_api.get_opt(&name).await {
                Ok(d) => out.push(rollout(&name, d.as_ref())),
                Err(e) => out.push(Verdict::fail(
                    ROLLOUT,
                    format!("deployment/{name}"),
                    format!("reading it: {e}"),
                    "grant the doctor get on deployments",
                )),
            }
        }
    }
    out
}

/// Each front proxy's `/readyz` (200) and an anonymous request (401), verified for its public name (else the
/// installation's, else its Service's) with the server CA, when there is one.
async fn front_proxies(
    client: &kube::Client,
    layout: &Layout,
    options: &Options,
    (ca, public): (Option<&[u8]>, Option<&str>),
) -> Vec<Verdict> {
    let ns = &options.namespace;
    let mut out = Vec::new();
    for fp in layout.components.iter().filter(|c| c.kind == Kind::FrontProxy) {
        let service = format!("{}-front-proxy", fp.name);
        let subject = format!("frontproxy/{}", fp.name);
        let name = fp
            .external_hostname
            .clone()
            .or_else(|| public.map(String::from))
            .unwrap_or_else(|| format!("{service}.{ns}.svc.{}", fp.cluster_domain));
        let Some(ca) = ca else {
            out.push(Verdict::not_checked(READYZ, &subject, NO_SERVER_CA, SERVER_CA_TODO));
            out.push(Verdict::not_checked(ANONYMOUS, &subject, NO_SERVER_CA, SERVER_CA_TODO));
            continue;
        };
        match service_target(client, ns, &service, options.via_endpoints).await {
            Ok(addr) => {
                let got = crate::probe::get(addr, &name, ca, "/readyz", TIMEOUT).await;
                out.push(expect(
                    READYZ,
                    subject.clone(),
                    got,
                    200,
                    &format!("GET https://{name}/readyz via {service}"),
                    "see the front proxy's and the root shard's logs",
                ));
                let got = crate::probe::get(addr, &name, ca, "/clusters/root/api", TIMEOUT).await;
                out.push(expect(
                    ANONYMOUS,
                    subject,
                    got,
                    401,
                    "anonymous /clusters/root/api on the front proxy",
                    "the front proxy must refuse unauthenticated requests: check its authentication flags",
                ));
            }
            Err(e) => out.push(Verdict::fail(READYZ, subject, e, "check the front proxy's Service")),
        }
    }
    out
}

/// An anonymous request to each shard (403: it knows `system:anonymous` and forbids it), when there is a CA.
async fn shards(client: &kube::Client, layout: &Layout, options: &Options, ca: Option<&[u8]>) -> Vec<Verdict> {
    let ns = &options.namespace;
    let mut out = Vec::new();
    for shard in layout.components.iter().filter(|c| c.kind == Kind::Shard) {
        let service = format!("{}-shard-kcp", shard.name);
        let name = format!("{service}.{ns}.svc.{}", shard.cluster_domain);
        let subject = format!("shard/{}", shard.name);
        let Some(ca) = ca else {
            out.push(Verdict::not_checked(ANONYMOUS, &subject, NO_SERVER_CA, SERVER_CA_TODO));
            continue;
        };
        match service_target(client, ns, &service, options.via_endpoints).await {
            Ok(addr) => {
                let got = crate::probe::get(addr, &name, ca, "/api", TIMEOUT).await;
                out.push(expect(
                    ANONYMOUS,
                    subject,
                    got,
                    403,
                    "anonymous /api on a shard",
                    "a shard must know system:anonymous and forbid it: check its authorization",
                ));
            }
            Err(e) => out.push(Verdict::fail(ANONYMOUS, subject, e, "check the shard's Service")),
        }
    }
    out
}

/// The public name through each resolver a pod can be given: it must answer the front proxy Service's
/// ClusterIP (not the edge), as the dns-rewriter proves it.
async fn split_horizon(
    client: &kube::Client,
    layout: &Layout,
    options: &Options,
    public: Option<&str>,
) -> Vec<Verdict> {
    use dns_rewriter::hostname::Hostname;
    use dns_rewriter::verify::{Outcome, check_one, resolver};
    let todo = "add the rewrite rule for the public name (dns-rewriter) and see it verified";
    let Some(public) = public else {
        return vec![Verdict::ok(SPLIT_HORIZON, "kcp", "no public hostname: nothing to look up")];
    };
    let Some(fp) = layout.components.iter().find(|c| c.kind == Kind::FrontProxy) else {
        return vec![Verdict::warn(SPLIT_HORIZON, public, "no FrontProxy to resolve to", "check --namespace")];
    };
    let expected = match service_address(client, &options.namespace, &format!("{}-front-proxy", fp.name)).await {
        Ok(a) => a.ip(),
        Err(e) => return vec![Verdict::fail(SPLIT_HORIZON, public, e, todo)],
    };
    let host = match Hostname::parse(public) {
        Ok(h) => h,
        Err(e) => {
            return vec![Verdict::fail(
                SPLIT_HORIZON,
                public,
                format!("not a hostname: {e}"),
                "fix spec.external.hostname",
            )];
        }
    };
    let mut servers = Vec::new();
    match options.cluster_dns {
        Some(a) => servers.push(("cluster DNS", a)),
        None => match service_address(client, "kube-system", "kube-dns").await {
            Ok(a) => servers.push(("cluster DNS", SocketAddr::new(a.ip(), 53))),
            Err(e) => {
                return vec![Verdict::fail(
                    SPLIT_HORIZON,
                    public,
                    format!("no cluster DNS: {e}"),
                    "give --cluster-dns",
                )];
            }
        },
    }
    servers.extend(options.node_local_dns.iter().map(|ip| ("node-local-dns", SocketAddr::new(*ip, 53))));
    let mut out = Vec::new();
    for (what, server) in servers {
        let subject = format!("{public} via {what} {server}");
        let r = match resolver(server, Duration::from_secs(3)) {
            Ok(r) => r,
            Err(e) => {
                out.push(Verdict::fail(SPLIT_HORIZON, subject, format!("{e:#}"), todo));
                continue;
            }
        };
        let check = check_one(&r, &host, Some(expected)).await;
        out.push(match check.outcome {
            Outcome::Match => {
                Verdict::ok(SPLIT_HORIZON, subject, format!("answers {expected}, the front proxy's Service"))
            }
            Outcome::NoAnswer => Verdict::fail(
                SPLIT_HORIZON,
                subject,
                format!("no address (want {expected}): pods go to the edge or nowhere"),
                todo,
            ),
            Outcome::Mismatch => Verdict::fail(
                SPLIT_HORIZON,
                subject,
                format!("answers {:?} under {:?}, want {expected}", check.answered, check.other_names),
                todo,
            ),
            Outcome::Error | Outcome::Unknown => {
                Verdict::fail(SPLIT_HORIZON, subject, "the resolver did not answer", "check the cluster DNS")
            }
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Level;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};
    use kube::api::ObjectMeta;

    fn deployment(
        generation: i64,
        observed: i64,
        replicas: i32,
        updated: i32,
        total: i32,
        available: i32,
    ) -> Deployment {
        Deployment {
            metadata: ObjectMeta { generation: Some(generation), ..Default::default() },
            spec: DeploymentSpec { replicas: Some(replicas), ..Default::default() },
            status: Some(DeploymentStatus {
                observed_generation: Some(observed),
                updated_replicas: Some(updated),
                replicas: Some(total),
                available_replicas: Some(available),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_rollout_is_done_only_when_observed_updated_available_and_no_old_replica_is_left() {
        assert_eq!(rollout("d", Some(&deployment(2, 2, 1, 1, 1, 1))).result, Level::Ok);
        assert_eq!(rollout("d", Some(&deployment(3, 2, 1, 1, 1, 1))).result, Level::Fail);
        assert_eq!(rollout("d", Some(&deployment(2, 2, 1, 1, 2, 1))).result, Level::Fail);
        assert_eq!(rollout("d", Some(&deployment(2, 2, 2, 2, 2, 1))).result, Level::Fail);
        assert_eq!(rollout("d", None).result, Level::Fail);
    }

    #[test]
    fn an_answer_other_than_the_expected_code_fails_with_the_code_and_a_short_body() {
        assert_eq!(expect(ANONYMOUS, "s".into(), Ok((403, "".into())), 403, "w", "t").result, Level::Ok);
        let v = expect(ANONYMOUS, "s".into(), Ok((200, "x".repeat(500))), 403, "w", "t");
        assert_eq!(v.result, Level::Fail);
        assert!(v.saw.starts_with("200, want 403") && v.saw.len() < 200, "{}", v.saw);
        assert_eq!(expect(READYZ, "s".into(), Err(anyhow::anyhow!("refused")), 200, "w", "t").result, Level::Fail);
    }
}
