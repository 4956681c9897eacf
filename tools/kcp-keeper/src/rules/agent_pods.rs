//! "An agent that is not running does none of its work, and its alerts may only say it is down": the release's
//! own pods, each container (init containers too) judged by what the kubelet reports. A container waiting because
//! its image cannot be pulled (`ErrImagePull`, `ImagePullBackOff`, `InvalidImageName`, `ErrImageNeverPull`) or
//! because it cannot start or keeps exiting (`CrashLoopBackOff`, `CreateContainerConfigError`, ...) fails, naming
//! the pod, the container, the image and the kubelet's message (which carries the registry's error).

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};

use crate::verdict::Verdict;

pub const CHECK: &str = "agent-pods";

/// The `app.kubernetes.io/name` of every pod the chart runs (its `kcp-keeper.agents` and the doctor): with
/// `app.kubernetes.io/instance=<release>`, the chart's selector labels.
pub const NAMES: [&str; 5] = ["ca-syncer", "dns-rewriter", "kubeconfig-rotator", "etcd-snapshotter", "doctor"];

/// The release's name when none is given: the name the install guide gives it.
pub const DEFAULT_RELEASE: &str = "kcp-keeper";

/// Waiting reasons of a container whose image the node cannot get.
const PULL: [&str; 4] = ["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"];
/// Waiting reasons of a container that got its image but cannot start, or keeps exiting.
const START: [&str; 4] =
    ["CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError", "RunContainerError"];

/// The label selector of the release's pods: the chart's selector labels.
pub fn selector(release: &str) -> String {
    format!("app.kubernetes.io/instance={release},app.kubernetes.io/name in ({})", NAMES.join(","))
}

/// What to do about a container waiting for `reason` in pod `pod` of `namespace`.
fn todo(reason: &str, namespace: &str, pod: &str, container: &str) -> String {
    match reason {
        "InvalidImageName" => format!(
            "the image reference does not parse: check image.registry, image.tag and the agent's image.repository \
             and image.tag in the chart's values (kubectl -n {namespace} describe pod {pod})"
        ),
        "ErrImageNeverPull" => format!(
            "imagePullPolicy is Never and the node has no such image: set image.pullPolicy IfNotPresent to pull it \
             from the registry, or import the image on every node (kubectl -n {namespace} describe pod {pod})"
        ),
        r if PULL.contains(&r) => format!(
            "check that the image reference and its tag exist in the registry (image.registry, image.tag, the \
             agent's image.repository and image.tag in the chart's values), that imagePullSecrets names a Secret in \
             {namespace} holding credentials for that registry, and that the registry is reachable from the nodes \
             (kubectl -n {namespace} describe pod {pod} shows the kubelet's events)"
        ),
        "CrashLoopBackOff" => format!(
            "read the log of its last run (kubectl -n {namespace} logs {pod} -c {container} --previous): a \
             configuration error names the field; fix it in the chart's values and upgrade"
        ),
        _ => format!(
            "a ConfigMap, Secret or key the pod references is missing, or the runtime refused the container: \
             kubectl -n {namespace} describe pod {pod} names it"
        ),
    }
}

/// One container's state as a phrase, and whether it runs and is ready.
fn state(status: Option<&ContainerStatus>) -> (String, bool) {
    let Some(s) = status else { return ("no status yet".into(), false) };
    let state = s.state.as_ref();
    if let Some(w) = state.and_then(|st| st.waiting.as_ref()) {
        return (format!("waiting ({})", w.reason.as_deref().unwrap_or("no reason")), false);
    }
    if let Some(t) = state.and_then(|st| st.terminated.as_ref()) {
        return (format!("terminated ({}, exit {})", t.reason.as_deref().unwrap_or("no reason"), t.exit_code), false);
    }
    if state.and_then(|st| st.running.as_ref()).is_some() {
        return if s.ready { ("running, ready".into(), true) } else { ("running, not ready".into(), false) };
    }
    ("no state yet".into(), false)
}

/// The FAIL line of a container waiting for a reason of [`PULL`] or [`START`], or None.
fn failing(namespace: &str, pod: &str, kind: &str, spec: &[Container], status: &ContainerStatus) -> Option<Verdict> {
    let waiting = status.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    if !PULL.contains(&reason) && !START.contains(&reason) {
        return None;
    }
    // The reference the pod asks for; the status's `image` is the same until the image is pulled.
    let image = spec.iter().find(|c| c.name == status.name).and_then(|c| c.image.as_deref()).unwrap_or(&status.image);
    let message = waiting.message.as_deref().map(str::trim).filter(|m| !m.is_empty()).unwrap_or("no message");
    let mut saw = format!("{reason}, image {image}: {message}");
    if let Some(last) = status.last_state.as_ref().and_then(|l| l.terminated.as_ref()) {
        let why = last.reason.as_deref().map(|r| format!(" {r}")).unwrap_or_default();
        saw.push_str(&format!(" (restarted {} times, last exit {}{why})", status.restart_count, last.exit_code));
    }
    // Every text of a line has URLs with userinfo redacted (`Verdict`): a message quoting a registry URL too.
    Some(Verdict::fail(
        CHECK,
        format!("pod/{namespace}/{pod} {kind} {}", status.name),
        saw,
        &todo(reason, namespace, pod, &status.name),
    ))
}

/// One line per pod of the release in `namespace`: a FAIL per container (or init container) waiting because its
/// image cannot be pulled or it cannot start; else ok when every container runs and is ready, or the pod has
/// completed; else warn, naming each container's state. No pod at all is a warning: the doctor was pointed at
/// the release, and nothing of it runs there.
pub fn judge(namespace: &str, release: &str, pods: &[Pod]) -> Vec<Verdict> {
    if pods.is_empty() {
        return vec![Verdict::warn(
            CHECK,
            format!("release {release} in {namespace}"),
            format!("no pod labelled {}", selector(release)),
            "check --release-namespace and --release (the Helm release's namespace and name), and that the \
             release's Deployments exist and have replicas (kubectl -n NAMESPACE get deployments)",
        )];
    }
    let mut out = Vec::new();
    for pod in pods {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let subject = format!("pod/{namespace}/{name}");
        let spec = pod.spec.clone().unwrap_or_default();
        let status = pod.status.clone().unwrap_or_default();
        let init_statuses = status.init_container_statuses.clone().unwrap_or_default();
        let statuses = status.container_statuses.clone().unwrap_or_default();
        let init_spec = spec.init_containers.clone().unwrap_or_default();
        let fails: Vec<Verdict> = init_statuses
            .iter()
            .filter_map(|s| failing(namespace, name, "init container", &init_spec, s))
            .chain(statuses.iter().filter_map(|s| failing(namespace, name, "container", &spec.containers, s)))
            .collect();
        if !fails.is_empty() {
            out.extend(fails);
            continue;
        }
        let phase = status.phase.as_deref().unwrap_or("Unknown");
        if phase == "Succeeded" {
            out.push(Verdict::ok(CHECK, subject, "completed"));
            continue;
        }
        let states: Vec<(String, String, bool)> = spec
            .containers
            .iter()
            .map(|c| {
                let (what, up) = state(statuses.iter().find(|s| s.name == c.name));
                (c.name.clone(), what, up)
            })
            .collect();
        if !states.is_empty() && states.iter().all(|(_, _, up)| *up) {
            out.push(Verdict::ok(CHECK, subject, format!("{} container(s) running, ready", states.len())));
            continue;
        }
        let mut saw = format!("phase {phase}");
        if let Some(reason) = status.reason.as_deref() {
            saw.push_str(&format!(" ({reason})"));
        }
        let shown: Vec<String> = states.iter().map(|(c, what, _)| format!("container {c} {what}")).collect();
        if !shown.is_empty() {
            saw.push_str(&format!(": {}", shown.join(", ")));
        }
        out.push(Verdict::warn(
            CHECK,
            subject,
            saw,
            &format!(
                "a pod starting or rolling is fine; if it stays so, kubectl -n {namespace} describe pod {name} \
                 (scheduling, volumes, probes) and its log"
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Level;
    use serde_json::{Value, json};

    fn pod(name: &str, containers: Value, init: Value, status: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "kcp-keeper"},
            "spec": {"containers": containers, "initContainers": init},
            "status": status,
        }))
        .unwrap()
    }

    fn waiting(name: &str, image: &str, reason: &str, message: &str) -> Value {
        json!({"name": name, "image": image, "imageID": "", "ready": false, "restartCount": 0,
               "state": {"waiting": {"reason": reason, "message": message}}})
    }

    fn running(name: &str, image: &str, ready: bool) -> Value {
        json!({"name": name, "image": image, "imageID": "sha256:00", "ready": ready, "restartCount": 0,
               "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}}})
    }

    const IMAGE: &str = "registry.example.com/kcp-keeper/ca-syncer:0.1.0";

    #[test]
    fn a_container_that_cannot_pull_its_image_fails_naming_pod_container_image_and_message_and_a_running_pod_is_ok() {
        let message = "failed to pull and unpack image \"registry.example.com/kcp-keeper/ca-syncer:0.1.0\": 401 \
                       Unauthorized from https://puller:s3cr3t@registry.example.com/v2/token";
        let pods = [
            pod(
                "kcp-keeper-ca-syncer-1",
                json!([{"name": "ca-syncer", "image": IMAGE}]),
                json!([]),
                json!({"phase": "Pending", "containerStatuses": [waiting("ca-syncer", IMAGE, "ErrImagePull", message)]}),
            ),
            pod(
                "kcp-keeper-dns-rewriter-1",
                json!([{"name": "dns-rewriter", "image": "r/dns-rewriter:1"}]),
                json!([]),
                json!({"phase": "Running", "containerStatuses": [running("dns-rewriter", "r/dns-rewriter:1", true)]}),
            ),
        ];
        let lines = judge("kcp-keeper", "kcp-keeper", &pods);
        assert_eq!(lines.len(), 2, "{lines:?}");
        let fail = &lines[0];
        assert_eq!(fail.result, Level::Fail);
        assert_eq!(fail.subject, "pod/kcp-keeper/kcp-keeper-ca-syncer-1 container ca-syncer");
        assert!(fail.saw.starts_with(&format!("ErrImagePull, image {IMAGE}: failed to pull")), "{}", fail.saw);
        assert!(fail.saw.contains("401 Unauthorized"), "{}", fail.saw);
        assert!(!fail.saw.contains("s3cr3t") && fail.saw.contains("https://REDACTED@registry"), "{}", fail.saw);
        for needle in ["image.registry", "imagePullSecrets", "reachable from the nodes", "describe pod"] {
            assert!(fail.todo.contains(needle), "{needle}: {}", fail.todo);
        }
        assert!(fail.runbook.ends_with("#doctor-agent-pods"));
        assert_eq!(
            (lines[1].subject.as_str(), lines[1].result, lines[1].saw.as_str()),
            ("pod/kcp-keeper/kcp-keeper-dns-rewriter-1", Level::Ok, "1 container(s) running, ready")
        );
    }

    #[test]
    fn init_containers_backoffs_crash_loops_and_config_errors_fail_each_with_its_own_hint() {
        let crash = json!({"name": "b", "image": "r/b:1", "imageID": "x", "ready": false, "restartCount": 4,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1m20s restarting failed container"}},
            "lastState": {"terminated": {"exitCode": 2, "reason": "Error"}}});
        let p = pod(
            "p",
            json!([{"name": "a", "image": "r/a:1"}, {"name": "b", "image": "r/b:1"}, {"name": "c", "image": "r/c:1"}]),
            json!([{"name": "init", "image": "r/init:1"}]),
            json!({"phase": "Pending",
                   "initContainerStatuses": [waiting("init", "r/init:1", "ImagePullBackOff", "Back-off pulling image \"r/init:1\"")],
                   "containerStatuses": [waiting("a", "r/a:1", "CreateContainerConfigError", "secret \"s3\" not found"),
                                         crash, running("c", "r/c:1", true)]}),
        );
        let lines = judge("ns", "kcp-keeper", &[p]);
        let got: Vec<_> = lines.iter().map(|v| (v.subject.as_str(), v.result)).collect();
        assert_eq!(
            got,
            [
                ("pod/ns/p init container init", Level::Fail),
                ("pod/ns/p container a", Level::Fail),
                ("pod/ns/p container b", Level::Fail),
            ]
        );
        assert_eq!(lines[0].saw, "ImagePullBackOff, image r/init:1: Back-off pulling image \"r/init:1\"");
        assert!(lines[0].todo.contains("imagePullSecrets"), "{}", lines[0].todo);
        assert!(
            lines[1].saw.contains("secret \"s3\" not found") && lines[1].todo.contains("Secret"),
            "{}",
            lines[1].saw
        );
        assert!(lines[2].saw.ends_with("(restarted 4 times, last exit 2 Error)"), "{}", lines[2].saw);
        assert!(lines[2].todo.contains("logs p -c b --previous"), "{}", lines[2].todo);
    }

    #[test]
    fn a_bad_reference_or_a_never_pull_policy_says_so_and_a_starting_pod_warns_and_a_completed_one_is_ok() {
        let lines = judge(
            "ns",
            "r",
            &[
                pod(
                    "bad",
                    json!([{"name": "a", "image": "Registry/A:"}]),
                    json!([]),
                    json!({"containerStatuses": [waiting("a", "Registry/A:", "InvalidImageName", "couldn't parse image reference")]}),
                ),
                pod(
                    "never",
                    json!([{"name": "a", "image": "r/a:1"}]),
                    json!([]),
                    json!({"containerStatuses": [waiting("a", "r/a:1", "ErrImageNeverPull", "Container image \"r/a:1\" is not present with pull policy of Never")]}),
                ),
                pod(
                    "creating",
                    json!([{"name": "a", "image": "r/a:1"}, {"name": "b", "image": "r/b:1"}]),
                    json!([]),
                    json!({"phase": "Pending", "containerStatuses": [waiting("a", "r/a:1", "ContainerCreating", ""), running("b", "r/b:1", false)]}),
                ),
                pod("unscheduled", json!([{"name": "a", "image": "r/a:1"}]), json!([]), json!({"phase": "Pending"})),
                pod(
                    "done",
                    json!([{"name": "a", "image": "r/a:1"}]),
                    json!([]),
                    json!({"phase": "Succeeded", "containerStatuses": [{"name": "a", "image": "r/a:1", "imageID": "x",
                        "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}),
                ),
            ],
        );
        let got: Vec<_> = lines.iter().map(|v| (v.subject.as_str(), v.result)).collect();
        assert_eq!(
            got,
            [
                ("pod/ns/bad container a", Level::Fail),
                ("pod/ns/never container a", Level::Fail),
                ("pod/ns/creating", Level::Warn),
                ("pod/ns/unscheduled", Level::Warn),
                ("pod/ns/done", Level::Ok),
            ]
        );
        assert!(lines[0].todo.contains("does not parse"), "{}", lines[0].todo);
        assert!(lines[1].todo.contains("pullPolicy"), "{}", lines[1].todo);
        assert_eq!(
            lines[2].saw,
            "phase Pending: container a waiting (ContainerCreating), container b running, not ready"
        );
        assert_eq!(lines[3].saw, "phase Pending: container a no status yet");
    }

    #[test]
    fn no_pod_of_the_release_warns_naming_the_selector_and_the_flags() {
        let lines = judge("kcp-keeper", "prod", &[]);
        assert_eq!((lines.len(), lines[0].result), (1, Level::Warn));
        assert_eq!(lines[0].subject, "release prod in kcp-keeper");
        assert!(lines[0].saw.contains("app.kubernetes.io/instance=prod,app.kubernetes.io/name in (ca-syncer,"));
        assert!(lines[0].todo.contains("--release-namespace") && lines[0].todo.contains("--release "));
    }

    /// The selector names every pod the chart runs: each agent of its `kcp-keeper.agents` list, and the doctor.
    #[test]
    fn the_selector_names_every_agent_of_the_chart() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let helpers = std::fs::read_to_string(root.join("charts/kcp-keeper/templates/_helpers.tpl")).unwrap();
        let start = helpers.find("define \"kcp-keeper.agents\"").expect("the agents list");
        let block = &helpers[start..start + helpers[start..].find("{{- end }}").unwrap()];
        let agents: Vec<&str> =
            block.lines().skip(1).filter_map(|l| l.split_once(": ")).map(|(_, agent)| agent.trim()).collect();
        assert_eq!(agents.len(), 4, "{block}");
        for agent in agents.iter().chain(&["doctor"]) {
            assert!(NAMES.contains(agent), "{agent} is not in the selector");
        }
        assert_eq!(NAMES.len(), agents.len() + 1);
    }
}
