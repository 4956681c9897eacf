//! The real node (`testbed::node`): it runs a pod, and a test binary killed with SIGKILL while its node runs leaves
//! nothing on the host: no process, cgroup, mount, interface, iptables rule or changed sysctl.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;

const CHILD_ENV: &str = "KCP_KEEPER_NODE_CHILD_DIR";

/// What the host looks like, as far as a node could change it.
#[derive(Debug, PartialEq, Eq)]
struct HostState {
    iptables: String,
    links: String,
    sysctls: Vec<(String, String)>,
}

fn host_state() -> Result<HostState> {
    let run = |program: &str, args: &[&str]| -> Result<String> {
        let out = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
        ensure!(out.status.success(), "{program} failed: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    // Counters and the generated-by comment change on their own.
    let iptables = run("iptables-save", &[])?
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| if l.starts_with(':') { l.split(' ').take(2).collect::<Vec<_>>().join(" ") } else { l.into() })
        .collect::<Vec<_>>()
        .join("\n");
    let links = run("ip", &["-o", "link", "show"])?
        .lines()
        .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n");
    let sysctls = ["vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops"]
        .iter()
        .map(|k| Ok((k.to_string(), std::fs::read_to_string(format!("/proc/sys/{k}"))?.trim().to_string())))
        .collect::<Result<Vec<_>>>()?;
    Ok(HostState { iptables, links, sysctls })
}

/// Processes whose command line names `needle` (the node's directory appears in every node process's arguments).
fn processes_naming(needle: &str) -> Vec<String> {
    let lines = testbed::process::command_lines().into_iter();
    let named = lines.filter(|(_, cmd)| cmd.contains(needle) && !cmd.contains("node_sigkill_child"));
    named.map(|(pid, cmd)| format!("{pid} {cmd}")).collect()
}

fn cgroups_left(root: &str) -> Vec<String> {
    std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|h| format!("{}{root}", h.path().display()))
        .filter(|p| Path::new(p).exists())
        .collect()
}

/// The hierarchies in which this process's memory cgroup path exists (the node's cgroups are made under it).
fn parents_present() -> Vec<String> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let memory = own
        .lines()
        .find_map(|l| l.splitn(3, ':').nth(2).filter(|_| l.split(':').nth(1).is_some_and(|c| c.contains("memory"))))
        .unwrap_or("/")
        .to_string();
    std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|h| format!("{}{memory}", h.path().display()))
        .filter(|p| Path::new(p).exists())
        .collect()
}

/// A pod from the pause image (imported at start), which containerd runs with runc: a sandbox, a shim and a
/// container on the node, so the teardown has all three to remove.
async fn run_a_pod(client: kube::Client) -> Result<()> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pause"},
        "spec": {
            "containers": [{
                "name": "pause",
                "image": peers::PAUSE_IMAGE,
                "imagePullPolicy": "Never",
                "securityContext": {
                    "runAsNonRoot": true, "runAsUser": 65535, "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
            }],
        },
    }))?;
    let pods = Api::<Pod>::namespaced(client, "default");
    pods.create(&PostParams::default(), &pod).await?;
    testbed::eventually(Duration::from_secs(180), "the pause pod to be Running", || async {
        let status = pods.get("pause").await.ok()?.status?;
        (status.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    Ok(())
}

/// Not a test of its own: the child the SIGKILL test starts (it returns at once unless that test started it).
/// Starts a node, runs a pod on it, prints `READY <cgroup root>` and waits to be killed.
#[test]
fn node_sigkill_child() -> Result<()> {
    let Some(dir) = std::env::var_os(CHILD_ENV) else { return Ok(()) };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        let peers = peers::locate_only(testbed::node::PEERS)?;
        let node = testbed::node::Node::start(&peers, Path::new(&dir)).await?;
        run_a_pod(node.client().await?).await?;
        println!("READY {} {:.1}", node.cgroup_root, node.ready_in.as_secs_f64());
        std::mem::forget(node);
        loop {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    })
}

#[test]
fn a_node_runs_a_pod_and_a_sigkilled_test_binary_leaves_nothing_behind_but_the_nodes_logs() -> Result<()> {
    let before = host_state()?;
    let parents_before = parents_present();
    let dir = tempfile::Builder::new().prefix("kcp-keeper-node-kill-").tempdir()?;
    let node_dir = dir.path().join("node");
    let started = Instant::now();
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--exact", "node_sigkill_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &node_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().context("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest may print `test node_sigkill_child ... ` before it on the same line.
            if let Some((_, rest)) = line.split_once("READY ") {
                let _ = tx.send(rest.to_string());
            }
        }
    });
    let ready = match rx.recv_timeout(Duration::from_secs(300)) {
        Ok(ready) => ready,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            let kept = dir.keep();
            bail!("the child's node did not run a pod within 300s; its logs are kept in {}/node/logs", kept.display());
        }
    };
    let (root, ready_in) = ready.split_once(' ').context("READY <root> <secs>")?;
    eprintln!(
        "node Ready in {ready_in} s, a pod Running {:.1?} after the child started; killing the child",
        started.elapsed()
    );
    let needle = node_dir.display().to_string();
    ensure!(!processes_naming(&needle).is_empty(), "no node process found before the kill");
    ensure!(!cgroups_left(root).is_empty(), "the node's cgroups are not there before the kill");

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGKILL)?;
    child.wait()?;
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(30);
    loop {
        let procs = processes_naming(&needle);
        let cgroups = cgroups_left(root);
        let reaper = std::fs::read_to_string(node_dir.join("reaper.log")).unwrap_or_default();
        if procs.is_empty() && cgroups.is_empty() && reaper.contains("reaper: done") {
            break;
        }
        if Instant::now() > deadline {
            let reaper = std::fs::read_to_string(node_dir.join("reaper.log")).unwrap_or_default();
            let kept = dir.keep();
            bail!(
                "30s after SIGKILL: processes {procs:#?}, cgroups {cgroups:#?}; reaper log:\n{reaper}\nfiles kept in {}",
                kept.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("everything gone {:.1?} after the SIGKILL", killed.elapsed());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    ensure!(!mounts.contains(&needle), "a mount of the node shows on the host:\n{mounts}");
    assert_eq!(host_state()?, before, "the host's iptables rules, interfaces or sysctls changed");
    assert_eq!(parents_present(), parents_before, "cgroup parents made for the node are left");
    // The node's state (images, pods, etcd) is gone with it, so a run's disk holds no node it no longer runs; its
    // logs stay for reading.
    let left: Vec<_> = ["containerd", "kubelet", "etcd", "coredns.tar"]
        .into_iter()
        .filter(|name| node_dir.join(name).exists())
        .collect();
    ensure!(left.is_empty(), "the stopped node's state is still in {}: {left:?}", node_dir.display());
    let kubelet_log = std::fs::metadata(node_dir.join("logs/kubelet.log")).context("the kubelet's log is kept")?;
    ensure!(kubelet_log.len() > 0, "the kubelet's log kept is empty");
    Ok(())
}
