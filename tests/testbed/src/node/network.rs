//! Work a test does from inside the node's network namespace, where only pods and the node's own processes
//! are: a socket belongs to the namespace of the thread that created it, so each piece runs on a thread of its
//! own that joined the namespace, with a runtime of its own. The host still has no route in.

use std::future::Future;
use std::net::SocketAddr;

use anyhow::{Context, Result};

use super::Node;
use crate::fault_proxy::FaultProxy;
use crate::process::Process;

impl Node {
    /// The holder's network namespace, opened.
    fn network_namespace(&self) -> Result<std::fs::File> {
        let holder = self.holder.as_ref().and_then(Process::pid).context("no holder")?;
        std::fs::File::open(format!("/proc/{holder}/ns/net")).context("opening the node's network namespace")
    }

    /// Runs `work` inside the node's network: e.g. a client of a peer at its own address inside the node, as
    /// only pods reach it. Its output once it is done.
    pub async fn in_network<F, Fut, T>(&self, work: F) -> Result<T>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
        T: Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        spawn_joined(self.network_namespace()?, move || async move {
            let _ = tx.send(work().await);
        })?;
        rx.await.context("the thread in the node's network ended without an answer")
    }

    /// A [`FaultProxy`] inside the node's network, listening on `bind` (the node's address: what a Service's
    /// endpoints can name) and forwarding to `upstream` there. It stops when dropped.
    pub async fn fault_proxy(&self, bind: SocketAddr, upstream: SocketAddr) -> Result<NodeFaultProxy> {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        spawn_joined(self.network_namespace()?, move || async move {
            match FaultProxy::start_at(bind, &upstream.to_string()).await {
                Ok(proxy) => {
                    let _ = ready_tx.send(Ok(proxy));
                    // The proxy's tasks run on this thread's runtime until the handle goes.
                    let _ = stopped.await;
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })?;
        let proxy = ready_rx.await.context("the fault proxy's thread ended")??;
        Ok(NodeFaultProxy { proxy, _stop: stop })
    }
}

/// A fault proxy running inside the node (see [`Node::fault_proxy`]); its rules and counts as
/// [`FaultProxy`]'s.
pub struct NodeFaultProxy {
    // Dropped first: its task is aborted before its runtime's thread is told to end.
    proxy: FaultProxy,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl std::ops::Deref for NodeFaultProxy {
    type Target = FaultProxy;
    fn deref(&self) -> &FaultProxy {
        &self.proxy
    }
}

/// A thread that joins `namespace` and runs `work` to its end on a current-thread runtime.
pub(super) fn spawn_joined<F, Fut>(namespace: std::fs::File, work: F) -> Result<()>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    std::thread::Builder::new().name("node-network".into()).spawn(move || {
        if let Err(e) = nix::sched::setns(&namespace, nix::sched::CloneFlags::CLONE_NEWNET) {
            eprintln!("testbed: node: joining the node's network namespace: {e}");
            return;
        }
        drop(namespace);
        match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(runtime) => runtime.block_on(work()),
            Err(e) => eprintln!("testbed: node: a runtime inside the node's network: {e}"),
        }
    })?;
    Ok(())
}
