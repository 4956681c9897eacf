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
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testbed::node::{self, Node};
use testbed::seed::images::PROBE_IMAGE;
use testbed::seed::layout::{EXTERNAL_HOST, EXTERNAL_PORT, HUB_USER};

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
fn probe_container(name: &str, program: &str, reload: &str, ca: Option<&str>) -> Value {
    let mut command = vec![
        program.to_string(),
        "-kubeconfig".into(),
        format!("/hub/{HUB_KEY}"),
        "-user".into(),
        HUB_USER.into(),
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
/// each change. The kubeconfig is read again whenever the kubelet swaps the mounted file.
fn sidecar_deployment() -> Result<Value> {
    let ca_syncer = format!("ghcr.io/kcp-keeper/ca-syncer:{}", chart::on_node::version()?);
    let mut containers = Vec::new();
    let mut volumes = vec![
        json!({"name": "kcp", "secret": {"secretName": HUB_SECRET}}),
        json!({"name": "ca", "secret": {"secretName": CA_TARGET}}),
    ];
    for (name, program) in PROBES {
        containers.push(probe_container(name, program, "change", Some("ca.crt")));
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
    Ok(json!({
        "metadata": {"name": SIDECAR_CONSUMERS, "namespace": HUB_NAMESPACE},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": SIDECAR_CONSUMERS}},
            "template": {
                "metadata": {"labels": {"app": SIDECAR_CONSUMERS}},
                "spec": {
                    "shareProcessNamespace": true,
                    "terminationGracePeriodSeconds": 5,
                    "securityContext": pod_security(),
                    "containers": containers,
                    "volumes": volumes,
                },
            },
        },
    }))
}

/// The restart path: the hub's own Deployment (the one the rotator restarts, `restartDeployments` of the chart's
/// values for the layout) runs both consumers instead of pause, each reading the published kubeconfig once, at
/// start, and trusting the CA it carries. A merge patch replaces the containers; the rotator's restart annotation
/// on the pod template stays.
fn restart_patch() -> Value {
    let containers: Vec<Value> =
        PROBES.iter().map(|(name, program)| probe_container(name, program, "once", None)).collect();
    json!({"spec": {"template": {"spec": {
        "terminationGracePeriodSeconds": 5,
        "securityContext": pod_security(),
        "containers": containers,
        "volumes": [{"name": "kcp", "secret": {"secretName": HUB_SECRET}}],
    }}}})
}

/// `kubectl logs -f` of every container of every pod of a Deployment, each into its own file, so a pod the
/// Deployment replaces leaves its whole log (its last summary is printed at SIGTERM) however soon it is deleted.
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
                    .args(["logs", "-f", "-n", HUB_NAMESPACE, &name, "-c", &status.name])
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
#[derive(Debug, Default)]
struct Counts {
    pods: usize,
    ready: usize,
    requests: u64,
    failures: u64,
    /// The client certificates used, in order of first use.
    certs: Vec<String>,
    classes: BTreeMap<String, u64>,
    fail_lines: Vec<String>,
    reloads: Vec<String>,
    /// `openssl ...`, `chain ...` and `trust ...` lines (the OpenSSL probe's), first pod's only.
    tls: Vec<String>,
}

/// The classes a request may end in without the hub having been refused: the front proxy's 5xx (its backend, the
/// shard, did not answer: the credential was accepted) and no answer within 10 s.
const UNANSWERED: [&str; 2] = ["5xx", "timeout"];

fn counts(logs: &[(String, String)]) -> Counts {
    let mut c = Counts { pods: logs.len(), ..Counts::default() };
    for (_, log) in logs {
        let mut last = None;
        for line in log.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["requests", r, "failures", f, "certs", _] => {
                    last = Some((r.parse().unwrap_or(0), f.parse().unwrap_or(0)))
                }
                ["fail", _, class, ..] => {
                    *c.classes.entry(class.to_string()).or_default() += 1;
                    c.fail_lines.push(line.to_string());
                }
                ["cert", ..] if !c.certs.iter().any(|s| s == line) => c.certs.push(line.to_string()),
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

/// The client certificate (PEM of the leaf) in the published kubeconfig now.
async fn published_certificate(client: &kube::Client) -> Option<String> {
    let secret = Api::<Secret>::namespaced(client.clone(), HUB_NAMESPACE).get_opt(HUB_SECRET).await.ok()??;
    let kubeconfig = secret.data?.get(HUB_KEY)?.0.clone();
    let doc: Value = serde_yaml::from_slice(&kubeconfig).ok()?;
    let data = doc["users"][0]["user"]["client-certificate-data"].as_str()?;
    let pem: k8s_openapi::ByteString = serde_json::from_value(json!(data)).ok()?;
    String::from_utf8(pem.0).ok()
}

/// Runs the consumers of `app` (already created) until the rotator has published two renewals after they started
/// and each probe has used the second one's certificate, then checks what they logged.
async fn observe(node: &Node, client: &kube::Client, app: &str, what: &str) -> Result<()> {
    let mut followers = Followers::new(node, what)?;
    let started = Instant::now();
    // Both probes past their start-up (files read, the public name resolved) and sending.
    loop {
        followers.poll(node, client, app).await?;
        let logs = followers.logs();
        if PROBES.iter().all(|(p, _)| logs.get(p).is_some_and(|l| counts(l).requests >= 10)) {
            break;
        }
        if started.elapsed() > Duration::from_secs(180) {
            bail!("{what}: the consumers did not start sending within 3 minutes: {:#?}", followers.logs());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("{what}: both consumers sending {:.1?} after they were created", started.elapsed());
    let first = published_certificate(client).await.context("no published kubeconfig")?;
    let mut published = vec![first];
    let deadline = Instant::now() + Duration::from_secs(540);
    // Two renewals published, and each probe has logged three client certificates (the one it started with
    // and the two renewals'), or, for the one that started after the first renewal, at least its own two.
    loop {
        followers.poll(node, client, app).await?;
        if let Some(now) = published_certificate(client).await
            && !published.contains(&now)
        {
            eprintln!("{what}: renewal {} published {:.1?} into the wait", published.len(), started.elapsed());
            published.push(now);
        }
        let logs = followers.logs();
        let used = PROBES.iter().all(|(p, _)| logs.get(p).is_some_and(|l| counts(l).certs.len() >= 3));
        if published.len() >= 3 && used {
            break;
        }
        if Instant::now() > deadline {
            let summary: Vec<String> = PROBES
                .iter()
                .map(|(p, _)| {
                    let c = counts(logs.get(p).map(Vec::as_slice).unwrap_or_default());
                    format!(
                        "{p}: {} requests, {} failures, certs {:?}, {:?}",
                        c.requests, c.failures, c.certs, c.classes
                    )
                })
                .collect();
            bail!("{what}: {} renewal(s) published within 9 minutes; {summary:?}", published.len() - 1);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Twenty more requests by each probe on the last certificate, then the final logs.
    let sent = |logs: &BTreeMap<&'static str, Vec<(String, String)>>, probe: &str| {
        counts(logs.get(probe).map(Vec::as_slice).unwrap_or_default()).requests
    };
    let before: Vec<u64> = PROBES.iter().map(|(p, _)| sent(&followers.logs(), p)).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        followers.poll(node, client, app).await?;
        let logs = followers.logs();
        if PROBES.iter().zip(&before).all(|((p, _), b)| sent(&logs, p) >= b + 20) {
            break;
        }
        if Instant::now() > deadline {
            bail!("{what}: the consumers sent fewer than 20 requests on the last certificate within a minute");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let logs = followers.logs();
    let mut problems = Vec::new();
    for (probe, _) in PROBES {
        let c = counts(logs.get(probe).map(Vec::as_slice).unwrap_or_default());
        eprintln!(
            "{what}: {probe}: {} pod(s), {} requests, {} failures {:?}, {} certificates, reloads {:?}",
            c.pods,
            c.requests,
            c.failures,
            c.classes,
            c.certs.len(),
            c.reloads
        );
        for line in &c.tls {
            eprintln!("{what}: {probe}: {line}");
        }
        let refused: Vec<&String> = c
            .fail_lines
            .iter()
            .filter(|l| !UNANSWERED.iter().any(|u| l.split_whitespace().nth(2) == Some(u)))
            .collect();
        let unanswered = c.fail_lines.len() - refused.len();
        if !refused.is_empty() {
            problems.push(format!(
                "{probe} was refused {} time(s) ({:?}): {:#?}{}",
                refused.len(),
                c.classes,
                refused.iter().take(10).collect::<Vec<_>>(),
                if c.tls.is_empty() { String::new() } else { format!("\nits TLS view: {:#?}", c.tls) }
            ));
        }
        if unanswered as u64 * 100 > c.requests {
            problems.push(format!("{probe}: {unanswered} of {} requests unanswered (5xx or timeout)", c.requests));
        }
        if (c.fail_lines.len() as u64) < c.failures {
            problems.push(format!("{probe}: {} failures counted, {} logged", c.failures, c.fail_lines.len()));
        }
        if c.requests < 600 {
            problems.push(format!("{probe}: only {} requests", c.requests));
        }
    }
    ensure!(problems.is_empty(), "{what}: {problems:#?}");
    Ok(())
}

/// Both reload paths side by side, through the same two cert-manager renewals of the hub's certificate (one test,
/// not two, since each waits some 200 s for the renewals). The sidecar path: the CA comes from ca-syncer's Secret
/// through `ca-syncer watch` (a SIGHUP to the consumer on a change), the kubeconfig is read again whenever the
/// kubelet swaps the mounted file. The restart path: the consumers read the published kubeconfig once, at start
/// (the CA it carries too), and the rotator restarts their Deployment (the hub's) for each renewal it publishes.
/// On both paths neither the Go consumer nor the OpenSSL one, in any of its pods, is ever refused: no resolution,
/// connection, TLS, 401 or 403 failure (and no wrong user or unreadable file); at most one request in a hundred
/// unanswered (the front proxy's 5xx or a timeout). Each has used three client certificates: the one it started
/// with and the two renewals'.
#[tokio::test]
async fn go_and_openssl_hubs_reloading_through_the_ca_syncer_sidecar_or_restarted_by_the_rotator_reach_the_front_proxy_by_its_public_name_every_100ms_through_two_renewals_and_are_never_refused()
-> Result<()> {
    let _layout = crate::LAYOUT_CHANGES.read().await;
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
    let sidecar: Deployment = serde_json::from_value(sidecar_deployment()?)?;
    deployments.create(&PostParams::default(), &sidecar).await?;
    deployments.patch(HUB, &PatchParams::default(), &Patch::Merge(&restart_patch())).await?;
    let (sidecar, restart) =
        tokio::join!(observe(node, &client, SIDECAR_CONSUMERS, "sidecar"), observe(node, &client, HUB, "restart"),);
    match (sidecar, restart) {
        (Ok(()), Ok(())) => Ok(()),
        (sidecar, restart) => bail!("sidecar path: {sidecar:?}\nrestart path: {restart:?}"),
    }
}
