//! The peer network of a 3-member etcd, through one TCP proxy per member, so that a member can be cut off from
//! its peers while its clients still reach it (what a network partition does to one node).
//!
//! Every member advertises its proxy's address as its peer URL and listens behind it. Traffic *to* a member
//! passes its own proxy; traffic *from* it passes the other members' proxies, where it is told apart by the
//! `X-Server-From` header etcd's peer transport sends on every request (pipeline, stream and snapshot
//! connections alike), read from the head of each connection before anything is forwarded. Cutting member
//! `i` closes every connection to or from it and refuses new ones, in both directions; healing lets them in
//! again. Client ports are never proxied.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// What every proxy shares: who is cut and the members' ids; `changed` wakes every open connection to look.
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Default)]
struct State {
    cut: BTreeSet<usize>,
    /// Member index → its id as etcd's transport writes it (hex, no padding); learned once the cluster runs.
    ids: Vec<Option<String>>,
    /// The network is gone (dropped): every connection closes.
    closed: bool,
}

impl State {
    fn refuses(&self, to: usize, from: Option<usize>) -> bool {
        self.closed || self.cut.contains(&to) || from.is_some_and(|f| self.cut.contains(&f))
    }
}

/// The proxies of one cluster's peer network.
pub struct PeerNet {
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl PeerNet {
    /// One proxy per `(advertised, listened)` port pair: member `i` is reached at `advertised` and listens at
    /// `listened`.
    pub async fn start(ports: &[(u16, u16)]) -> Result<Self> {
        let shared = Arc::new(Shared::default());
        shared.state.lock().unwrap().ids = vec![None; ports.len()];
        let mut tasks = Vec::new();
        for (to, &(advertised, listened)) in ports.iter().enumerate() {
            let listener = TcpListener::bind(("127.0.0.1", advertised))
                .await
                .with_context(|| format!("binding the peer proxy of member {to} on port {advertised}"))?;
            let shared = shared.clone();
            tasks.push(tokio::spawn(async move {
                while let Ok((conn, _)) = listener.accept().await {
                    tokio::spawn(forward(conn, listened, to, shared.clone()));
                }
            }));
        }
        Ok(Self { shared, tasks })
    }

    /// Tells the proxies each member's id (from the cluster's member list), so traffic from a member is known.
    pub fn learn_ids(&self, ids: Vec<String>) {
        self.shared.state.lock().unwrap().ids = ids.into_iter().map(|id| Some(id.to_ascii_lowercase())).collect();
    }

    /// Cuts member `i` off from its peers: every connection to or from it is closed and new ones are refused.
    pub fn cut(&self, i: usize) {
        self.shared.state.lock().unwrap().cut.insert(i);
        self.shared.changed.notify_waiters();
    }

    /// Lets member `i` reach its peers again.
    pub fn heal(&self, i: usize) {
        self.shared.state.lock().unwrap().cut.remove(&i);
    }
}

impl Drop for PeerNet {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        self.shared.state.lock().unwrap().closed = true;
        self.shared.changed.notify_waiters();
    }
}

/// One peer connection to member `to`: its request head read to learn the sender, then forwarded both ways
/// until either end is cut.
async fn forward(mut conn: TcpStream, listened: u16, to: usize, shared: Arc<Shared>) {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    // The head of an HTTP/1.1 request: up to its blank line (etcd's peer requests have small heads).
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
        match tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
            _ => return,
        }
    }
    let from = sender(&head).and_then(|id| {
        let state = shared.state.lock().unwrap();
        state.ids.iter().position(|known| known.as_deref() == Some(id.as_str()))
    });
    if shared.state.lock().unwrap().refuses(to, from) {
        return;
    }
    let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", listened)).await else { return };
    if upstream.write_all(&head).await.is_err() {
        return;
    }
    let copy = tokio::io::copy_bidirectional(&mut conn, &mut upstream);
    tokio::pin!(copy);
    loop {
        let changed = shared.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if shared.state.lock().unwrap().refuses(to, from) {
            return;
        }
        tokio::select! {
            _ = &mut copy => return,
            () = changed => {}
        }
    }
}

/// The `X-Server-From` header of a request head, lowercased.
fn sender(head: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(head).ok()?;
    text.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim().eq_ignore_ascii_case("x-server-from").then(|| value.trim().to_ascii_lowercase())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sender_is_read_from_the_x_server_from_header_whatever_its_case() {
        let head =
            b"GET /raft/stream/msgapp/8e9e05c52164694d HTTP/1.1\r\nHost: x\r\nx-server-FROM: 91BC3C398FB3C146\r\n\r\n";
        assert_eq!(sender(head).as_deref(), Some("91bc3c398fb3c146"));
        assert_eq!(sender(b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n"), None);
    }
}
