//! A loopback TCP proxy for faults between the agent and a real peer:
//! - `flip`: in the server-to-client direction, parses HTTP/2 frames and the gRPC messages inside DATA frames,
//!   and flips one byte in the middle of the third large message (a snapshot chunk's `blob`), so the gRPC
//!   framing stays valid and only the payload is wrong;
//! - `throttle`: delays client-to-server bytes to a given rate (a slow S3);
//! - `down`: refuses new connections and cuts open ones (an unreachable S3).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
pub struct Faults {
    pub flip: AtomicBool,
    pub flipped: AtomicBool,
    /// Client-to-server bytes per second; 0 = unthrottled.
    pub throttle_bytes_per_second: AtomicU64,
    pub down: AtomicBool,
}

pub struct Proxy {
    pub url: String,
    pub faults: Arc<Faults>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Only snapshot chunks are this large; unary responses (status, member list) are far smaller.
const LARGE_MESSAGE: usize = 16 * 1024;
const FLIP_MESSAGE: usize = 3;
const FLIP_OFFSET: usize = 1000;

impl Proxy {
    /// Proxies 127.0.0.1:<free port> to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let faults = Arc::new(Faults::default());
        let (upstream, shared) = (upstream.to_string(), faults.clone());
        let task = tokio::spawn(async move {
            let mut open: Vec<tokio::task::JoinHandle<()>> = Vec::new();
            loop {
                let Ok((client, _)) = listener.accept().await else { return };
                if shared.down.load(Ordering::SeqCst) {
                    open.drain(..).for_each(|t| t.abort());
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream).await else { continue };
                open.push(tokio::spawn(relay(client, server, shared.clone())));
            }
        });
        Self { url, faults, task }
    }

    pub fn set_down(&self, down: bool) {
        self.faults.down.store(down, Ordering::SeqCst);
    }
}

async fn relay(client: TcpStream, server: TcpStream, faults: Arc<Faults>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up_faults = faults.clone();
    let up = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if up_faults.down.load(Ordering::SeqCst) {
                return;
            }
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let rate = up_faults.throttle_bytes_per_second.load(Ordering::SeqCst);
            if rate > 0 {
                tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64)).await;
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = async move {
        if faults.flip.load(Ordering::SeqCst) {
            flip_h2(&mut server_read, &mut client_write, &faults).await;
        } else {
            let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        }
    };
    tokio::select! { _ = up => {}, _ = down => {} }
}

/// Per-stream gRPC message parsing state.
#[derive(Default)]
struct GrpcState {
    header: Vec<u8>,
    len: usize,
    offset: usize,
}

async fn flip_h2(from: &mut tokio::net::tcp::OwnedReadHalf, to: &mut tokio::net::tcp::OwnedWriteHalf, faults: &Faults) {
    let mut streams: std::collections::HashMap<u32, GrpcState> = Default::default();
    let mut large_seen = 0usize;
    loop {
        let mut header = [0u8; 9];
        if from.read_exact(&mut header).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let (kind, flags) = (header[3], header[4]);
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        if from.read_exact(&mut payload).await.is_err() {
            return;
        }
        if kind == 0 {
            // DATA; a PADDED frame starts with its pad length and ends with the padding.
            let (start, end) = if flags & 0x8 != 0 { (1, len - payload[0] as usize) } else { (0, len) };
            let state = streams.entry(stream).or_default();
            for byte in &mut payload[start..end] {
                if state.header.len() < 5 {
                    state.header.push(*byte);
                    if state.header.len() == 5 {
                        state.len =
                            u32::from_be_bytes([state.header[1], state.header[2], state.header[3], state.header[4]])
                                as usize;
                        state.offset = 0;
                        if state.len >= LARGE_MESSAGE {
                            large_seen += 1;
                        }
                        if state.len == 0 {
                            state.header.clear();
                        }
                    }
                    continue;
                }
                if state.len >= LARGE_MESSAGE
                    && large_seen == FLIP_MESSAGE
                    && state.offset == FLIP_OFFSET
                    && !faults.flipped.swap(true, Ordering::SeqCst)
                {
                    *byte ^= 0x20;
                }
                state.offset += 1;
                if state.offset == state.len {
                    state.header.clear();
                }
            }
        }
        if to.write_all(&header).await.is_err() || to.write_all(&payload).await.is_err() {
            return;
        }
    }
}
