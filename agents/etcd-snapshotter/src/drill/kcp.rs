//! The kcp level of a drill: a real kcp shard (`kcp start`, its own certificates and admin kubeconfig in the
//! drill's directory) on the restored etcd on loopback ports, `/readyz`, then the workspaces and objects the
//! configuration names must be readable through it. This is the "prove one restore" in full: an etcd that
//! restores is not yet a kcp that starts.

use std::path::Path;
use std::time::{Duration, Instant};

use tokio::process::Command;

use crate::config::KcpExpect;
use crate::drill_report::KcpLevel;
use crate::error::DrillError;
use crate::throwaway::{Scratch, free_port, last_lines};

/// kcp takes tens of seconds to become ready (longer on a small node).
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(300);

/// Starts kcp on `etcd_url`, waits for `/readyz` and reads every expected workspace and object.
pub async fn check(
    scratch: &mut Scratch,
    kcp: &Path,
    etcd_url: &str,
    expect: &KcpExpect,
) -> Result<KcpLevel, DrillError> {
    let root = scratch.path().join("kcp");
    let port = free_port()?;
    let log = scratch.path().join("kcp.log");
    let started = Instant::now();
    let process = scratch.spawn(
        Command::new(kcp)
            .arg("start")
            .arg(format!("--root-directory={}", root.display()))
            .arg(format!("--etcd-servers={etcd_url}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={port}")),
        &log,
        "kcp",
    )?;
    let client = wait_ready(scratch, process, &root.join("admin.kubeconfig"), &log).await?;
    let ready_seconds = started.elapsed().as_secs_f64();
    let objects = read_expected(&client, expect).await?;
    Ok(KcpLevel { ready_seconds, workspaces: expect.workspaces.clone(), objects })
}

/// Reads every expected workspace and object through `client` (a shard's admin); the paths of the objects read.
pub(super) async fn read_expected(client: &kube::Client, expect: &KcpExpect) -> Result<Vec<String>, DrillError> {
    for workspace in &expect.workspaces {
        let path = workspace_object_path(workspace);
        get(client, &path).await.map_err(|e| DrillError::Kcp(format!("workspace {workspace}: {e}")))?;
    }
    let mut objects = Vec::new();
    for object in &expect.objects {
        let path = format!("/clusters/{}{}", object.workspace, object.path);
        get(client, &path).await.map_err(|e| DrillError::Kcp(format!("object {path}: {e}")))?;
        objects.push(path);
    }
    Ok(objects)
}

/// Where a workspace is read: `root:a:b` is the Workspace `b` in `root:a`; `root` is its own logical cluster.
pub fn workspace_object_path(workspace: &str) -> String {
    match workspace.rsplit_once(':') {
        Some((parent, name)) => format!("/clusters/{parent}/apis/tenancy.kcp.io/v1alpha1/workspaces/{name}"),
        None => format!("/clusters/{workspace}/api/v1/namespaces/default"),
    }
}

pub(super) async fn wait_ready(
    scratch: &mut Scratch,
    process: usize,
    kubeconfig: &Path,
    log: &Path,
) -> Result<kube::Client, DrillError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut client = None;
    let mut last = String::from("not started");
    loop {
        if let Some(status) = scratch.exited(process) {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            return Err(DrillError::Kcp(format!("kcp exited ({status}): {}", last_lines(&log, 5))));
        }
        if client.is_none() {
            client = admin_client(kubeconfig).await;
        }
        if let Some(client) = &client {
            match get(client, "/readyz").await {
                Ok(_) => return Ok(client.clone()),
                Err(e) => last = e,
            }
        }
        if Instant::now() > deadline {
            return Err(DrillError::Kcp(format!("/readyz not ok within {READY_TIMEOUT:?}: {last}")));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A client from the admin kubeconfig kcp writes into its root directory (the shard admin, at the shard's
/// base URL), once the file exists.
async fn admin_client(path: &Path) -> Option<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).ok()?;
    let options = kube::config::KubeConfigOptions { context: Some("shard-base".into()), ..Default::default() };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await.ok()?;
    kube::Client::try_from(config).ok()
}

async fn get(client: &kube::Client, path: &str) -> Result<String, String> {
    let request = http::Request::get(path).body(Vec::new()).map_err(|e| e.to_string())?;
    client.request_text(request).await.map_err(|e| match e {
        kube::Error::Api(status) => format!("{} {}", status.code, status.reason),
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_is_read_as_the_workspace_object_in_its_parent() {
        assert_eq!(
            workspace_object_path("root:team-a:dev"),
            "/clusters/root:team-a/apis/tenancy.kcp.io/v1alpha1/workspaces/dev"
        );
        assert_eq!(workspace_object_path("root"), "/clusters/root/api/v1/namespaces/default");
    }
}
