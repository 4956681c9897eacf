//! The consumer, as the hub: a Go program and an OpenSSL one (whose chain building is curl's), in Deployments of
//! the hub's namespace, read the kubeconfig kubeconfig-rotator publishes (`railgrid-system/railgrid-kcp`) and the
//! CA ca-syncer keeps (`railgrid-system/kcp-server-ca`), reload them the two ways the docs tell hub authors to (the
//! ca-syncer sidecar, `ca-syncer watch`, with the kubeconfig reloaded when its mounted file changes; or a restart
//! by the rotator, for read-once consumers), resolve the front proxy's public name through the pod's own resolver
//! (the cluster DNS, which imports dns-rewriter's rules) and send it a SelfSubjectReview every 100 ms, each on a
//! new connection, while cert-manager renews the hub's client certificate twice (every 100 s, see
//! [`testbed::seed::layout::HUB_RENEW_BEFORE`]).
//!
//! Both programs are in the seed probe image: `kubeconfig-probe` (Go's crypto/tls and resolver) and
//! `openssl-probe` (OpenSSL 3 and glibc's getaddrinfo, static). They print the same lines: `fail <n> <class>
//! <why>` per failure, `cert <serial> notAfter <time>` per client certificate used, `reload <what>` per file read
//! again with new content, and a summary `requests <n> failures <n> certs <n>` every second and at SIGTERM; the
//! OpenSSL one also prints the chain the front proxy sent and the CA certificates it checked it against.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use chart::on_node::HUB;
use chart::on_seed::{CA_TARGET, HUB_KEY, HUB_NAMESPACE, HUB_SECRET};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testbed::node::{self, Node};
use testbed::seed::images::PROBE_IMAGE;
use testbed::seed::layout::{ADMIN_USER, EXTERNAL_HOST, EXTERNAL_PORT, HUB_USER, NAMESPACE};

/// The Deployment whose CA comes through ca-syncer's sidecar and whose kubeconfig is read again when it changes.
const SIDECAR_CONSUMERS: &str = "hub-consumers-sidecar";

/// The two consumers: container name and program.
const PROBES: [(&str, &str); 2] = [("go", "/kubeconfig-probe"), ("openssl", "/openssl-probe")];

/// The front proxy by its public name; the path of the published server (`/clusters/root`) is kept.
fn public_server() -> String {
    format!("https://{EXTERNAL_HOST}:{EXTERNAL_PORT}")
}

fn restricted() -> Value {
    json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}})
}

/// A probe container: the published kubeconfig at `/hub`, every 100 ms to the public name, reloading as `reload`
/// says, trusting `ca` (a file) instead of the kubeconfig's CA when given.
fn probe_container(name: &str, program: &str, user: &str, reload: &str, ca: Option<&str>) -> Value {
    let mut command = vec![
        program.to_string(),
        "-kubeconfig".into(),
        format!("/hub/{HUB_KEY}"),
        "-user".into(),
        user.into(),
        "-every".into(),
        "100ms".into(),
        "-server".into(),
        public_server(),
        "-reload".into(),
        reload.into(),
    ];
    let mut mounts = vec![json!({"name": "kcp", "mountPath": "/hub", "readOnly": true})];
    if let Some(ca) = ca {
        command.extend(["-ca".into(), format!("/ca-{name}/{ca}")]);
        mounts.push(json!({"name": format!("bundle-{name}"), "mountPath": format!("/ca-{name}"), "readOnly": true}));
    }
    json!({
        "name": name,
        "image": PROBE_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "securityContext": restricted(),
        "volumeMounts": mounts,
    })
}

fn pod_security() -> Value {
    json!({
        "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

/// The sidecar path, as docs/ca-syncer.md's "Sidecar" section shapes the pod: `shareProcessNamespace`, one user
/// for every container; per consumer a `ca-syncer watch` sidecar (the agent's own image) that watches the mounted
/// CA Secret ca-syncer keeps, writes the bundle to a volume the consumer reads and sends the consumer SIGHUP on
/// each change. The kubeconfig (`key` of the Secret `kubeconfig`, for `user`) is read again whenever the kubelet
/// swaps the mounted file.
fn sidecar_deployment(app: &str, kubeconfig: &str, user: &str) -> Result<Value> {
    let ca_syncer = format!("ghcr.io/kcp-keeper/ca-syncer:{}", chart::on_node::version()?);
    let mut containers = Vec::new();
    let mut volumes = vec![
        json!({"name": "kcp", "secret": {"secretName": kubeconfig}}),
        json!({"name": "ca", "secret": {"secretName": CA_TARGET}}),
    ];
    for (name, program) in PROBES {
        containers.push(probe_container(name, program, user, "change", Some("ca.crt")));
        let signalled = program.trim_start_matches('/');
        containers.push(json!({
            "name": format!("ca-sidecar-{name}"),
            "image": ca_syncer,
            "imagePullPolicy": "IfNotPresent",
            "args": ["watch", "--dir", "/etc/kcp-ca", "--key", "ca.crt", "--output", "/shared/ca.crt",
                     "--signal-process", signalled, "--poll-interval", "2s"],
            "securityContext": restricted(),
            "volumeMounts": [
                {"name": "ca", "mountPath": "/etc/kcp-ca", "readOnly": true},
                {"name": format!("bundle-{name}"), "mountPath": "/shared"},
            ],
        }));
        volumes.push(json!({"name": format!("bundle-{name}"), "emptyDir": {"sizeLimit": "1Mi"}}));
    }
    let mut deployment = consumer_deployment(app, containers, volumes);
    // The sidecar signals the consumer's process in the same pod.
    deployment["spec"]["template"]["spec"]["shareProcessNamespace"] = json!(true);
    Ok(deployment)
}

/// A one-replica Deployment of the hub's namespace running `containers` with `volumes`, as the consumers run.
fn consumer_deployment(app: &str, containers: Vec<Value>, volumes: Vec<Value>) -> Value {
    json!({
        "metadata": {"name": app, "namespace": HUB_NAMESPACE},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {"labels": {"app": app}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "securityContext": pod_security(),
                    "containers": containers,
                    "volumes": volumes,
                },
            },
        },
    })
}

/// The restart path: the hub's own Deployment (the one the rotator restarts, `restartDeployments` of the chart's
/// values for the layout) runs both consumers instead of pause, each reading the published kubeconfig once, at
/// start, and trusting the CA it carries. A merge patch replaces the containers; the rotator's restart annotation
/// on the pod template stays.
fn restart_patch() -> Value {
    let containers: Vec<Value> =
        PROBES.iter().map(|(name, program)| probe_container(name, program, HUB_USER, "once", None)).collect();
    json!({"spec": {"template": {"spec": {
        "terminationGracePeriodSeconds": 5,
        "securityContext": pod_security(),
        "containers": containers,
        "volumes": [{"name": "kcp", "secret": {"secretName": HUB_SECRET}}],
    }}}})
}

/// A merge patch that puts back the parts of the hub's pod template [`restart_patch`] replaced (a field it did
/// not have is removed).
fn hub_spec(hub: &Deployment) -> Value {
    let spec = serde_json::to_value(&hub.spec.template.spec).unwrap_or_default();
    let field = |name: &str| spec.get(name).cloned().unwrap_or(Value::Null);
    json!({"spec": {"template": {"spec": {
        "terminationGracePeriodSeconds": field("terminationGracePeriodSeconds"),
        "securityContext": field("securityContext"),
        "containers": field("containers"),
        "volumes": field("volumes"),
    }}}})
}

/// The control's read-once consumers: both programs reading `key` of the Secret `kubeconfig` once, at start, and
/// trusting the hub's CA Secret (ca-syncer's) mounted directly.
fn once_deployment(app: &str, kubeconfig: &str, user: &str) -> Value {
    let containers: Vec<Value> =
        PROBES.iter().map(|(name, program)| probe_container(name, program, user, "once", Some("ca.crt"))).collect();
    let mut volumes = vec![json!({"name": "kcp", "secret": {"secretName": kubeconfig}})];
    for (name, _) in PROBES {
        volumes.push(json!({"name": format!("bundle-{name}"), "secret": {"secretName": CA_TARGET}}));
    }
    consumer_deployment(app, containers, volumes)
}

/// `kubectl logs -f --timestamps` of every container of every pod of a Deployment, each into its own file, so a
/// pod the Deployment replaces leaves its whole log (its last summary is printed at SIGTERM) however soon it is
/// deleted. Each line starts with the time the container runtime received it (the node's clock: the host's).
struct Followers {
    dir: PathBuf,
    /// pod/container/restart count, the file and the follower (None once it ended and its file is complete).
    followed: BTreeMap<String, (PathBuf, Option<Child>)>,
}

impl Followers {
    fn new(node: &Node, what: &str) -> Result<Self> {
        let dir = node.dir.join("seed").join(format!("consumer-logs-{what}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(Followers { dir, followed: BTreeMap::new() })
    }

    /// Starts following every running probe container not followed yet; notes the followers that ended.
    async fn poll(&mut self, node: &Node, client: &kube::Client, app: &str) -> Result<()> {
        let pods = Api::<Pod>::namespaced(client.clone(), HUB_NAMESPACE)
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await?;
        for pod in pods.items {
            let name = pod.metadata.name.clone().unwrap_or_default();
            for status in pod.status.and_then(|s| s.container_statuses).unwrap_or_default() {
                if !PROBES.iter().any(|(n, _)| *n == status.name) {
                    continue;
                }
                let started = status.state.as_ref().is_some_and(|s| s.running.is_some() || s.terminated.is_some());
                let key = format!("{name}/{}/{}", status.name, status.restart_count);
                if !started || self.followed.contains_key(&key) {
                    continue;
                }
                let file = self.dir.join(key.replace('/', "_"));
                let child = Command::new(node.peers.path("kubectl"))
                    .arg("--kubeconfig")
                    .arg(&node.kubeconfig)
                    .args(["logs", "-f", "--timestamps", "-n", HUB_NAMESPACE, &name, "-c", &status.name])
                    .env_remove("KUBECONFIG")
                    .stdin(Stdio::null())
                    .stdout(File::create(&file)?)
                    .stderr(Stdio::null())
                    .spawn()
                    .context("starting kubectl logs -f")?;
                self.followed.insert(key, (file, Some(child)));
            }
        }
        for (_, child) in self.followed.values_mut() {
            if child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_some()) {
                *child = None;
            }
        }
        Ok(())
    }

    /// Each probe's logs, one per pod (and container restart).
    fn logs(&self) -> BTreeMap<&'static str, Vec<(String, String)>> {
        let mut out: BTreeMap<&'static str, Vec<(String, String)>> = BTreeMap::new();
        for (key, (file, _)) in &self.followed {
            let probe = PROBES.iter().find(|(n, _)| key.split('/').nth(1) == Some(n)).map(|(n, _)| *n);
            if let Some(probe) = probe {
                let log = std::fs::read_to_string(file).unwrap_or_default();
                out.entry(probe).or_default().push((key.clone(), log));
            }
        }
        out
    }
}

impl Drop for Followers {
    fn drop(&mut self) {
        for (_, child) in self.followed.values_mut() {
            if let Some(child) = child {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// What one probe's logs (every pod it ran in) say.
#[derive(Debug, Default, Clone)]
struct Counts {
    pods: usize,
    ready: usize,
    requests: u64,
    failures: u64,
    /// The client certificates used, in order of first use.
    certs: Vec<String>,
    /// The server certificates seen (`server <serial> authorityKeyId <id>`), in order of first sight.
    servers: Vec<String>,
    classes: BTreeMap<String, u64>,
    fail_lines: Vec<String>,
    /// When each of `fail_lines` was logged.
    fail_times: Vec<Option<Timestamp>>,
    reloads: Vec<String>,
    /// `openssl ...`, `chain ...` and `trust ...` lines (the OpenSSL probe's), first pod's only.
    tls: Vec<String>,
}

impl Counts {
    /// Requests no server answered: the front proxy's 5xx (its backend, the shard, did not answer: the credential
    /// was accepted), no answer within 10 s, or the connection refused or closed before an answer.
    fn unanswered(&self) -> u64 {
        self.fail_lines.iter().filter(|l| is_unanswered(l)).count() as u64
    }

    /// The failure lines of the unanswered requests logged outside every window of `rolls`.
    fn unanswered_outside(&self, rolls: &Rolls) -> Vec<String> {
        let times = self.fail_lines.iter().zip(&self.fail_times).filter(|(l, _)| is_unanswered(l));
        let outside = times.filter(|(_, t)| !t.is_some_and(|t| rolls.covers(t)));
        outside.map(|(l, t)| format!("{} {l}", t.map_or_else(|| "-".into(), |t| t.to_string()))).collect()
    }
}

/// The classes a request may end in without the hub having been refused: no server answered it. A refusal is a
/// resolution, TLS, 401 or 403 failure, another user, another status or an unreadable file.
const UNANSWERED: [&str; 3] = ["5xx", "timeout", "connect"];

fn is_unanswered(fail_line: &str) -> bool {
    UNANSWERED.iter().any(|u| fail_line.split_whitespace().nth(2) == Some(u))
}

fn counts(logs: &[(String, String)]) -> Counts {
    let mut c = Counts { pods: logs.len(), ..Counts::default() };
    for (_, log) in logs {
        let mut last = None;
        for stamped in log.lines() {
            // `<RFC 3339 time> <line>` (kubectl logs --timestamps).
            let (at, line) = match stamped.split_once(' ') {
                Some((t, rest)) => match t.parse::<Timestamp>() {
                    Ok(t) => (Some(t), rest),
                    Err(_) => (None, stamped),
                },
                None => (None, stamped),
            };
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["requests", r, "failures", f, "certs", _] => {
                    last = Some((r.parse().unwrap_or(0), f.parse().unwrap_or(0)))
                }
                ["fail", _, class, ..] => {
                    *c.classes.entry(class.to_string()).or_default() += 1;
                    c.fail_lines.push(line.to_string());
                    c.fail_times.push(at);
                }
                ["cert", ..] if !c.certs.iter().any(|s| s == line) => c.certs.push(line.to_string()),
                ["server", ..] if !c.servers.iter().any(|s| s == line) => c.servers.push(line.to_string()),
                ["reload", ..] => c.reloads.push(line.to_string()),
                ["ready", ..] => c.ready += 1,
                ["openssl", ..] | ["chain", ..] | ["trust", ..] if c.tls.len() < 24 => c.tls.push(line.to_string()),
                _ => {}
            }
        }
        if let Some((r, f)) = last {
            c.requests += r;
            c.failures += f;
        }
    }
    c
}

/// Each probe's counts, by program.
type ByProbe = BTreeMap<&'static str, Counts>;

/// What the observers saw so far, by path (`sidecar`, `restart`), for the changes to wait on.
type Seen = std::sync::Arc<std::sync::Mutex<BTreeMap<&'static str, ByProbe>>>;

fn by_probe(followers: &Followers) -> ByProbe {
    let logs = followers.logs();
    PROBES.iter().map(|(p, _)| (*p, counts(logs.get(p).map(Vec::as_slice).unwrap_or_default()))).collect()
}

/// The client certificate (PEM of the leaf) in the published kubeconfig now.
async fn published_certificate(client: &kube::Client) -> Option<String> {
    let secret = Api::<Secret>::namespaced(client.clone(), HUB_NAMESPACE).get_opt(HUB_SECRET).await.ok()??;
    let kubeconfig = secret.data?.get(HUB_KEY)?.0.clone();
    let doc: Value = serde_yaml::from_slice(&kubeconfig).ok()?;
    let data = doc["users"][0]["user"]["client-certificate-data"].as_str()?;
    let pem: k8s_openapi::ByteString = serde_json::from_value(json!(data)).ok()?;
    String::from_utf8(pem.0).ok()
}

/// Follows the consumers of `app` (already created) until both probes are past their start-up (files read, the
/// public name resolved) and sending; returns when.
async fn started(
    node: &Node,
    client: &kube::Client,
    app: &str,
    what: &str,
    followers: &mut Followers,
) -> Result<Instant> {
    let began = Instant::now();
    loop {
        followers.poll(node, client, app).await?;
        if by_probe(followers).values().all(|c| c.requests >= 10) {
            eprintln!("{what}: both consumers sending {:.1?} after they were created", began.elapsed());
            return Ok(Instant::now());
        }
        if began.elapsed() > Duration::from_secs(180) {
            bail!("{what}: the consumers did not start sending within 3 minutes: {:#?}", followers.logs());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits until each probe has sent twenty more requests, then returns the counts.
async fn twenty_more(node: &Node, client: &kube::Client, app: &str, what: &str, f: &mut Followers) -> Result<ByProbe> {
    let before = by_probe(f);
    let followers = tokio::sync::Mutex::new(f);
    let (followers, before) = (&followers, &before);
    let what = format!("{what}: each consumer sending 20 more requests");
    testbed::eventually_seen(Duration::from_secs(60), &what, || async move {
        let mut f = followers.lock().await;
        f.poll(node, client, app).await?;
        let now = by_probe(&f);
        let short: Vec<_> =
            now.iter().filter(|(p, c)| c.requests < before[*p].requests + 20).map(|(p, _)| *p).collect();
        Ok(if short.is_empty() { Ok(now) } else { Err(format!("not yet: {short:?}")) })
    })
    .await
}

/// Runs the consumers of `app` until the rotator has published two renewals after they started, each probe has
/// used the second one's certificate and `done` says the layout's changes are over; then twenty more requests.
/// Returns the counts and when both probes were sending.
async fn observe(
    node: &Node,
    client: &kube::Client,
    (app, what): (&str, &'static str),
    seen: &Seen,
    mut done: tokio::sync::watch::Receiver<bool>,
) -> Result<(ByProbe, Instant)> {
    let mut followers = Followers::new(node, what)?;
    let sending = started(node, client, app, what, &mut followers).await?;
    let first = published_certificate(client).await.context("no published kubeconfig")?;
    let mut published = vec![first];
    let deadline = Instant::now() + Duration::from_secs(900);
    // Two renewals published, and each probe has logged three client certificates (the one it started with
    // and the two renewals'), or, for the one that started after the first renewal, at least its own two.
    loop {
        followers.poll(node, client, app).await?;
        if let Some(now) = published_certificate(client).await
            && !published.contains(&now)
        {
            eprintln!("{what}: renewal {} published {:.1?} into the wait", published.len(), sending.elapsed());
            published.push(now);
        }
        let now = by_probe(&followers);
        seen.lock().expect("seen").insert(what, now.clone());
        let used = now.values().all(|c| c.certs.len() >= 3);
        if published.len() >= 3 && used && *done.borrow_and_update() {
            break;
        }
        if Instant::now() > deadline {
            let summary: Vec<String> = now
                .iter()
                .map(|(p, c)| {
                    format!(
                        "{p}: {} requests, {} failures, certs {:?}, {:?}",
                        c.requests, c.failures, c.certs, c.classes
                    )
                })
                .collect();
            bail!(
                "{what}: {} renewal(s) published within 15 minutes, changes over: {}; {summary:?}",
                published.len() - 1,
                *done.borrow()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok((twenty_more(node, client, app, what, &mut followers).await?, sending))
}

/// Runs the consumers of `app` (already created) for `length` after both are sending, then twenty more requests.
async fn observe_for(
    node: &Node,
    client: &kube::Client,
    app: &str,
    what: &'static str,
    length: Duration,
) -> Result<ByProbe> {
    let mut followers = Followers::new(node, what)?;
    let sending = started(node, client, app, what, &mut followers).await?;
    while sending.elapsed() < length {
        followers.poll(node, client, app).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    twenty_more(node, client, app, what, &mut followers).await
}

/// What in `counts` shows the hub refused: any failure but an unanswered request (resolution, connection, TLS,
/// 401, 403, another user, an unreadable file), failures counted but not logged, or too few requests sent.
fn refusals(what: &str, counts: &ByProbe, length: Duration) -> Vec<String> {
    let mut problems = Vec::new();
    for (probe, c) in counts {
        eprintln!(
            "{what}: {probe}: {} pod(s), {} requests, {} failures {:?}, {} client certificates, servers {:?}, reloads {:?}",
            c.pods,
            c.requests,
            c.failures,
            c.classes,
            c.certs.len(),
            c.servers,
            c.reloads
        );
        for line in &c.tls {
            eprintln!("{what}: {probe}: {line}");
        }
        let refused: Vec<&String> = c.fail_lines.iter().filter(|l| !is_unanswered(l)).collect();
        if !refused.is_empty() {
            problems.push(format!(
                "{what}: {probe} was refused {} time(s) ({:?}): {:#?}{}",
                refused.len(),
                c.classes,
                refused.iter().take(10).collect::<Vec<_>>(),
                if c.tls.is_empty() { String::new() } else { format!("\nits TLS view: {:#?}", c.tls) }
            ));
        }
        if (c.fail_lines.len() as u64) < c.failures {
            problems.push(format!("{what}: {probe}: {} failures counted, {} logged", c.failures, c.fail_lines.len()));
        }
        // Sending all along: 10 requests a second when the machine is idle; a full test run on 2 cores gave about
        // 1.6 a second (each request waits for its answer). One every 2 s on average is the floor.
        if c.requests < length.as_secs() / 2 {
            problems.push(format!("{what}: {probe}: only {} requests in {length:.0?}", c.requests));
        }
    }
    problems
}

/// Waits until every consumer holds the rotated CA: the sidecar path's probes have each read their CA file again
/// since `reloads_before` (the sidecar's SIGHUP), and every pod of the restart path was created after `published`
/// (the rotator's restart for the kubeconfig that carries both CAs).
async fn consumers_reloaded(
    client: &kube::Client,
    seen: &Seen,
    reloads_before: &BTreeMap<&str, usize>,
    published: u64,
) {
    let pods = Api::<Pod>::namespaced(client.clone(), HUB_NAMESPACE);
    testbed::eventually(Duration::from_secs(300), "every consumer holding the rotated CA", || async {
        let sidecar = seen.lock().ok()?.get("sidecar")?.clone();
        let reloaded = sidecar.iter().all(|(p, c)| {
            c.reloads.iter().filter(|r| r.starts_with("reload ca")).count()
                > reloads_before.get(p).copied().unwrap_or(0)
        });
        let hub = pods.list(&ListParams::default().labels(&format!("app={HUB}"))).await.ok()?.items;
        let restarted = !hub.is_empty()
            && hub.iter().all(|p| {
                p.metadata.creation_timestamp.as_ref().is_some_and(|t| t.0.as_second() as u64 > published)
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            });
        (reloaded && restarted).then_some(())
    })
    .await;
}

/// Waits until every probe of both paths has been served a certificate issued by the key `key_id`.
async fn served_by(seen: &Seen, key_id: &str) {
    let wanted = format!("authorityKeyId {key_id}");
    testbed::eventually(Duration::from_secs(300), "every consumer served by the rotated CA's certificate", || async {
        let seen = seen.lock().ok()?;
        let all = ["sidecar", "restart"]
            .iter()
            .all(|w| seen.get(w).is_some_and(|b| b.values().all(|c| c.servers.iter().any(|s| s.ends_with(&wanted)))));
        all.then_some(())
    })
    .await;
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs()
}

/// The server CA rotated as cert-manager and the operator do it, consumers first: the new CA published next to
/// the old by ca-syncer and the rotator and taken up by every consumer, then every serving certificate re-issued
/// by it and served to every consumer. Returns the new CA's key id.
async fn rotate_server_ca(client: &kube::Client, seen: &Seen) -> Result<crate::everything::Rotation> {
    let reloads_before: BTreeMap<&str, usize> =
        seen.lock().expect("seen").get("sidecar").map_or_else(BTreeMap::new, |b| {
            b.iter().map(|(p, c)| (*p, c.reloads.iter().filter(|r| r.starts_with("reload ca")).count())).collect()
        });
    let rotation = crate::everything::rotate_server_ca(client).await?;
    crate::everything::published_with_both(client, &rotation).await?;
    let published = now_secs();
    consumers_reloaded(client, seen, &reloads_before, published).await;
    eprintln!("every consumer holds the rotated CA");
    let reissued = crate::everything::reissue_serving_certificates(client).await?;
    eprintln!("re-issued by the rotated CA: {reissued:?}");
    served_by(seen, &rotation.new_key_id).await;
    eprintln!("every consumer served by the rotated CA's certificate");
    Ok(rotation)
}

/// Everything that changes during the consumers' run, at once: the server CA rotation, the rule change, drills of
/// both shards; then a scheduled snapshot of both shards taken since the changes began.
async fn change_everything(
    node: &'static Node,
    client: &kube::Client,
    seen: &Seen,
) -> Result<crate::everything::Rotation> {
    testbed::eventually(Duration::from_secs(240), "both paths sending", || async {
        let seen = seen.lock().ok()?;
        (seen.len() == 2).then_some(())
    })
    .await;
    // The agent may not have listed a snapshot of every shard yet (a fresh install, or retention between ticks).
    let before = testbed::eventually(Duration::from_secs(120), "a listed snapshot of both shards", || async {
        let ids: Option<Vec<String>> = crate::everything::newest_snapshots(node).into_iter().collect();
        ids
    })
    .await;
    let ids = before.clone();
    let drills = tokio::task::spawn_blocking(move || crate::everything::drill_both(node, &ids));
    let (rotation, rules) = tokio::join!(rotate_server_ca(client, seen), crate::everything::rule_change(node, client));
    rules.context("the rule change")?;
    let rotation = rotation.context("the server CA rotation")?;
    let drilled = drills.await?.context("the drills")?;
    eprintln!("drilled {drilled:?} during the changes");
    testbed::eventually(
        Duration::from_secs(120),
        "a scheduled snapshot of both shards since the changes began",
        || async {
            let now = crate::everything::newest_snapshots(node);
            now.iter().zip(&before).all(|(n, b)| n.as_ref().is_some_and(|n| n != b)).then_some(())
        },
    )
    .await;
    Ok(rotation)
}

/// The control's kubeconfig: the seed's own admin kubeconfig (a year's certificate: nothing renews it during the
/// run), copied into the hub's namespace under the key the probes read.
const CONTROL_KUBECONFIG: &str = "control-kubeconfig";

async fn copy_seed_kubeconfig(client: &kube::Client) -> Result<()> {
    let seed = crate::everything::secret_text(
        client,
        testbed::seed::layout::NAMESPACE,
        testbed::seed::layout::KUBECONFIG_SECRET,
        "kubeconfig",
    )
    .await
    .context("no seed kubeconfig")?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": CONTROL_KUBECONFIG, "namespace": HUB_NAMESPACE},
        "stringData": {HUB_KEY: seed},
    }))?;
    Api::<Secret>::namespaced(client.clone(), HUB_NAMESPACE).create(&PostParams::default(), &secret).await?;
    Ok(())
}

/// The control run: the same two programs on the same two reload paths (the sidecar, and read-once), as many
/// pods, for `length`, with a credential and CA nothing changes meanwhile: no renewal reaches them, no CA
/// rotates, no rule changes, no drill runs.
async fn control(node: &Node, client: &kube::Client, length: Duration) -> Result<(ByProbe, ByProbe)> {
    copy_seed_kubeconfig(client).await?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), HUB_NAMESPACE);
    let sidecar: Deployment =
        serde_json::from_value(sidecar_deployment(CONTROL_SIDECAR, CONTROL_KUBECONFIG, ADMIN_USER)?)?;
    let once: Deployment = serde_json::from_value(once_deployment(CONTROL_ONCE, CONTROL_KUBECONFIG, ADMIN_USER))?;
    deployments.create(&PostParams::default(), &sidecar).await?;
    deployments.create(&PostParams::default(), &once).await?;
    let (a, b) = tokio::join!(
        observe_for(node, client, CONTROL_SIDECAR, "control-sidecar", length),
        observe_for(node, client, CONTROL_ONCE, "control-once", length)
    );
    for app in [CONTROL_SIDECAR, CONTROL_ONCE] {
        let _ = deployments.delete(app, &Default::default()).await;
    }
    Ok((a?, b?))
}

/// The kcp-operator's rolls of its servers (the front proxy's and the shards' pods) during the changes, by pod: it
/// rolls a Deployment whose serving certificate was re-issued. A roll starts a new pod first (kcp's start takes
/// tens of seconds of this 2-core machine's CPU, while the old pod serves), then stops the old one once the new one
/// is Ready; kcp v0.32's servers stop accepting at SIGTERM (neither has a shutdown delay, and the operator sets no
/// preStop hook), while the node's Service rules still send new connections to them until the endpoint change
/// reaches the node.
#[derive(Debug, Default)]
struct Rolls {
    /// When each old pod was told to stop.
    stops: BTreeMap<String, Timestamp>,
    /// Each pod started during the changes: its creation and, once seen, when it became Ready.
    starts: BTreeMap<String, (Timestamp, Option<Timestamp>)>,
    /// When the watch began: a pod created before is no roll of the changes.
    since: Option<Timestamp>,
}

/// From a second before a server's SIGTERM (the clocks of the pod log and the apiserver's whole-second deletion
/// times) to this long after it: a request sent then may meet the stopping server.
const ROLL_WINDOW: Duration = Duration::from_secs(10);

/// How long a probe waits for an answer: a failure is logged when it ends, up to this long after the request was
/// sent (a request sent to the stopping server at its SIGTERM can time out 10 s later).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

impl Rolls {
    /// Whether a failure logged at `at` may be of a request sent during a roll: within [`ROLL_WINDOW`] of a stop,
    /// or while a new server pod started (from its creation until it was Ready; until the end when never seen
    /// Ready).
    fn covers(&self, at: Timestamp) -> bool {
        let after = |t: &Timestamp| at.duration_since(*t).as_secs_f64();
        let stopping = -1.0..=(ROLL_WINDOW + PROBE_TIMEOUT).as_secs_f64();
        let starting = |(created, ready): &(Timestamp, Option<Timestamp>)| {
            after(created) >= -1.0 && ready.is_none_or(|r| after(&r) <= PROBE_TIMEOUT.as_secs_f64())
        };
        self.stops.values().any(|stop| stopping.contains(&after(stop))) || self.starts.values().any(starting)
    }

    /// A pod seen: a new one (created since the watch began) and when it became Ready; one being deleted, when its
    /// SIGTERM was sent (its deletion timestamp minus its grace period).
    fn note(&mut self, pod: &Pod) {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
        if let (Some(created), Some(since)) = (created, self.since)
            && created.duration_since(since).as_secs_f64() >= 0.0
        {
            let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
            let ready = conditions
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
                .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0));
            let entry = self.starts.entry(name.clone()).or_insert((created, None));
            entry.1 = entry.1.or(ready);
        }
        let Some(deleted) = &pod.metadata.deletion_timestamp else { return };
        let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
        let stop = deleted.0.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(grace)).unwrap_or(deleted.0);
        self.stops.entry(name).or_insert(stop);
    }
}

/// Watches the kcp-operator's pods in the layout's namespace until `until` says stop: the [`Rolls`] seen.
async fn watch_rolls(client: kube::Client, mut until: tokio::sync::watch::Receiver<bool>) -> Rolls {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    let pods = Api::<Pod>::namespaced(client, NAMESPACE);
    let config = watcher::Config::default().labels("app.kubernetes.io/managed-by=kcp-operator");
    let mut events = watcher::watcher(pods, config).boxed();
    let mut rolls = Rolls { since: Some(Timestamp::now()), ..Rolls::default() };
    loop {
        tokio::select! {
            _ = until.wait_for(|stop| *stop) => return rolls,
            event = events.next() => match event {
                Some(Ok(Event::Apply(pod) | Event::InitApply(pod) | Event::Delete(pod))) => rolls.note(&pod),
                Some(_) => {}
                None => return rolls,
            },
        }
    }
}

const CONTROL_SIDECAR: &str = "hub-control-sidecar";
const CONTROL_ONCE: &str = "hub-control-once";

fn unanswered(counts: &[&ByProbe]) -> (u64, u64) {
    let all = counts.iter().flat_map(|b| b.values());
    all.fold((0, 0), |(u, r), c| (u + c.unanswered(), r + c.requests))
}

/// Both reload paths side by side, through everything at once: two cert-manager renewals of the hub's
/// certificate, a rotation of the kcp server CA (cert-manager re-issues `root-server-ca`, then every serving
/// certificate it issues: the front proxy's and the shards'), a dns-rewriter rule change (the alpha shard's
/// Service recreated with another address and a second public name, then back) and restore drills of both shards
/// while the scheduled snapshots go on. The sidecar path: the CA comes from ca-syncer's Secret through `ca-syncer
/// watch` (a SIGHUP to the consumer on a change), the kubeconfig is read again whenever the kubelet swaps the
/// mounted file. The restart path: the consumers read the published kubeconfig once, at start (the CA it carries
/// too), and the rotator restarts their Deployment (the hub's) for each kubeconfig it publishes. On both paths
/// neither the Go consumer nor the OpenSSL one, in any of its pods, is ever refused: no resolution, connection,
/// TLS, 401 or 403 failure (and no wrong user or unreadable file); each has used three client certificates and
/// been served the rotated CA's certificate. Unanswered requests (the front proxy's 5xx, timeouts, a connection
/// refused or closed) outside the kcp-operator's rolls are no more than a control run's: the same programs and
/// paths, as long, with nothing changing. The operator rolls the front proxy and the shards when their serving
/// certificates are re-issued: a new kcp pod starts (tens of seconds of this machine's two cores) and the old
/// one's server stops at SIGTERM before the node stops sending it connections. The requests sent while a new
/// server pod started or within [`ROLL_WINDOW`] of a stop are counted apart and printed (see [`Rolls`]).
#[tokio::test]
async fn go_and_openssl_hubs_reloading_through_the_sidecar_or_restarted_by_the_rotator_are_never_refused_through_two_renewals_a_server_ca_rotation_a_rule_change_and_drills_and_miss_no_more_than_a_quiet_control_run()
-> Result<()> {
    // The layout changes (its server CA, alpha's Service): no other test of the binary runs meanwhile.
    let _layout = crate::LAYOUT_CHANGES.write().await;
    crate::keeper();
    let node = node::shared();
    let client = node.client().await?;
    let secrets = Api::<Secret>::namespaced(client.clone(), HUB_NAMESPACE);
    testbed::eventually(Duration::from_secs(180), "the published kubeconfig and the hub's CA", || async {
        let kubeconfig = secrets.get_opt(HUB_SECRET).await.ok()??;
        let ca = secrets.get_opt(CA_TARGET).await.ok()??;
        (kubeconfig.data.is_some() && ca.data.is_some()).then_some(())
    })
    .await;
    let deployments = Api::<Deployment>::namespaced(client.clone(), HUB_NAMESPACE);
    let sidecar: Deployment = serde_json::from_value(sidecar_deployment(SIDECAR_CONSUMERS, HUB_SECRET, HUB_USER)?)?;
    deployments.create(&PostParams::default(), &sidecar).await?;
    // The hub's own spec, put back at the end: its consumers would go on sending 20 requests a second.
    let hub_before = deployments.get(HUB).await?;
    deployments.patch(HUB, &PatchParams::default(), &Patch::Merge(&restart_patch())).await?;
    let seen = Seen::default();
    let (done, changes_over) = tokio::sync::watch::channel(false);
    let (observed, observing_over) = tokio::sync::watch::channel(false);
    let rolls = tokio::spawn(watch_rolls(client.clone(), observing_over));
    let changes = async {
        let changed = change_everything(node, &client, &seen).await;
        let _ = done.send(true);
        changed
    };
    let (sidecar, restart, changed) = tokio::join!(
        observe(node, &client, (SIDECAR_CONSUMERS, "sidecar"), &seen, changes_over.clone()),
        observe(node, &client, (HUB, "restart"), &seen, changes_over),
        changes,
    );
    let (sidecar, restart, rotation) = match (sidecar, restart, changed) {
        (Ok(s), Ok(r), Ok(c)) => (s, r, c),
        (s, r, c) => {
            bail!("sidecar path: {:?}\nrestart path: {:?}\nchanges: {:?}", s.map(|_| ()), r.map(|_| ()), c.map(|_| ()))
        }
    };
    let length = sidecar.1.max(restart.1).elapsed();
    let _ = observed.send(true);
    let rolls = rolls.await?;
    // The seed's own kubeconfig follows the rotated CA (the operator renders it again when nudged), as the other
    // tests of the layout use it; the hub's consumers stop.
    crate::everything::rerender_seed_kubeconfig(&client, &rotation).await?;
    deployments.delete(SIDECAR_CONSUMERS, &Default::default()).await?;
    // The control runs on the layout as it is left for the binary's other tests: rolled out, quiet.
    testbed::seed::settled(node, &client, Duration::from_secs(20)).await?;
    let (quiet_sidecar, quiet_once) = control(node, &client, length).await?;
    deployments.patch(HUB, &PatchParams::default(), &Patch::Merge(&hub_spec(&hub_before))).await?;

    let mut problems = refusals("sidecar", &sidecar.0, length);
    problems.extend(refusals("restart", &restart.0, length));
    problems.extend(refusals("control-sidecar", &quiet_sidecar, length));
    problems.extend(refusals("control-once", &quiet_once, length));
    for (what, counts) in [("sidecar", &sidecar.0), ("restart", &restart.0)] {
        for (probe, c) in counts {
            if c.certs.len() < 3 {
                problems.push(format!("{what}: {probe} used {} client certificates, not 3", c.certs.len()));
            }
        }
    }
    let (changed_unanswered, changed_requests) = unanswered(&[&sidecar.0, &restart.0]);
    let (quiet_unanswered, quiet_requests) = unanswered(&[&quiet_sidecar, &quiet_once]);
    eprintln!(
        "unanswered over {length:.0?}: {changed_unanswered} of {changed_requests} requests through the changes, \
         {quiet_unanswered} of {quiet_requests} in the quiet control run"
    );
    let outside_lines: Vec<String> =
        [&sidecar.0, &restart.0].iter().flat_map(|b| b.values()).flat_map(|c| c.unanswered_outside(&rolls)).collect();
    let outside = outside_lines.len() as u64;
    let inside = changed_unanswered - outside;
    eprintln!(
        "through the changes: {inside} unanswered sent within {ROLL_WINDOW:?} of the kcp-operator stopping a server's pod \
         ({} stops: {:?}) or while a new server pod started ({} pods, created and Ready: {:?}), {outside} at other \
         times: {outside_lines:?}",
        rolls.stops.len(),
        rolls.stops,
        rolls.starts.len(),
        rolls.starts,
    );
    if outside > quiet_unanswered {
        problems.push(format!(
            "{outside} requests unanswered through the changes outside the operator's rolls, more than the \
             control's {quiet_unanswered}"
        ));
    }
    ensure!(problems.is_empty(), "{problems:#?}");
    Ok(())
}
