//! A loopback HTTP/1.1 proxy in front of a real server (versitygw, for the S3 tests) that injects the faults
//! clients meet in production, on the requests a test names: the next N requests matching a method and a
//! path substring (`PUT`, `partNumber=`) are answered with a 503 SlowDown, have their connection reset, stall
//! without an answer, are forwarded late, or are forwarded with one byte of their body flipped. Every other
//! request is forwarded as it came.
//!
//! One request per connection: the proxy asks both sides for `Connection: close`, so it never has to find
//! where a response ends, and a fault on one request cannot leak into the next. It binds 127.0.0.1 unless
//! given an address ([`FaultProxy::start_at`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What to do to a matching request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Read the request, answer `503 Slow Down` with S3's `SlowDown` error document.
    SlowDown,
    /// Read the request head and part of its body, then reset the connection (TCP RST).
    Reset,
    /// Read the request and answer nothing for this long, then close: a client's attempt timeout fires first.
    Stall(Duration),
    /// Forward the request with one byte in the middle of its body flipped; the server's answer is passed on.
    FlipBody,
    /// Read the request, then forward it only after this long (a store slow to take it): the server never sees
    /// it if the client gave up meanwhile, as a request cut off mid-body never reaches a real server.
    Delay(Duration),
    /// Forward the request and let the server carry it out, then drop its answer and reset the connection: the
    /// client never learns that its request took effect (a lost response).
    LoseAnswer,
}

struct Rule {
    method: String,
    path_contains: String,
    fault: Fault,
    remaining: usize,
}

#[derive(Default)]
struct State {
    rules: Vec<Rule>,
    /// (when it arrived in Unix seconds, method, path) of every request seen, in order.
    seen: Vec<(f64, String, String)>,
    /// (fault, method, path) of every fault applied, in order.
    injected: Vec<(Fault, String, String)>,
}

pub struct FaultProxy {
    /// `http://127.0.0.1:<port>`: give this to the client instead of the server's URL.
    pub url: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// Proxies a fresh 127.0.0.1 port to `upstream` (`http://host:port` or `host:port`).
    pub async fn start(upstream: &str) -> Result<Self> {
        Self::start_at("127.0.0.1:0".parse()?, upstream).await
    }

    /// Proxies `bind` to `upstream`: for a proxy others than this process must reach (e.g. one started inside
    /// the test node's network namespace, on the node's address, behind a Service).
    pub async fn start_at(bind: std::net::SocketAddr, upstream: &str) -> Result<Self> {
        let upstream = upstream.trim_start_matches("http://").trim_end_matches('/').to_string();
        let listener = TcpListener::bind(bind).await.context("binding the fault proxy")?;
        let url = format!("http://{}", listener.local_addr()?);
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else { return };
                        connections.spawn(serve(client, upstream.clone(), shared.clone()));
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(Self { url, state, task })
    }

    /// Applies `fault` to the next `times` requests whose method is `method` (any when empty) and whose
    /// path with query contains `path_contains`. Rules are tried in the order they were added.
    pub fn inject(&self, method: &str, path_contains: &str, fault: Fault, times: usize) {
        self.state.lock().expect("proxy state").rules.push(Rule {
            method: method.into(),
            path_contains: path_contains.into(),
            fault,
            remaining: times,
        });
    }

    /// Drops every rule not yet used up.
    pub fn clear(&self) {
        self.state.lock().expect("proxy state").rules.clear();
    }

    /// The faults applied so far: (fault, method, path).
    pub fn injected(&self) -> Vec<(Fault, String, String)> {
        self.state.lock().expect("proxy state").injected.clone()
    }

    /// Requests seen so far whose method is `method` (any when empty) and path contains `path_contains`.
    pub fn seen(&self, method: &str, path_contains: &str) -> usize {
        let state = self.state.lock().expect("proxy state");
        state.seen.iter().filter(|(_, m, p)| (method.is_empty() || m == method) && p.contains(path_contains)).count()
    }

    /// Every request seen so far: (when it arrived in Unix seconds, method, path with query), in order.
    pub fn requests(&self) -> Vec<(f64, String, String)> {
        self.state.lock().expect("proxy state").seen.clone()
    }
}

/// A request head as read: the request line's method and target, and the raw header lines.
struct Head {
    method: String,
    target: String,
    version: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The head to send on: the same request, with `Connection: close` and without `Expect` (the proxy
    /// answers a `100-continue` itself and forwards the whole body at once).
    fn forwarded(&self) -> Vec<u8> {
        let mut out = format!("{} {} {}\r\n", self.method, self.target, self.version);
        for (name, value) in &self.headers {
            if !(name.eq_ignore_ascii_case("connection") || name.eq_ignore_ascii_case("expect")) {
                out.push_str(&format!("{name}: {value}\r\n"));
            }
        }
        out.push_str("Connection: close\r\n\r\n");
        out.into_bytes()
    }
}

/// Reads up to the end of a head (`\r\n\r\n`); returns the head and whatever body bytes came with it.
async fn read_head<R: AsyncRead + Unpin>(from: &mut R) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Some((buf, rest));
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
        let n = from.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn parse_head(raw: &[u8]) -> Option<Head> {
    let text = std::str::from_utf8(raw).ok()?;
    let mut lines = text.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let (method, target, version) = (request_line.next()?, request_line.next()?, request_line.next()?);
    let headers = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':').map(|(n, v)| (n.trim().to_string(), v.trim().to_string())))
        .collect();
    Some(Head { method: method.into(), target: target.into(), version: version.into(), headers })
}

/// Reads the rest of the body after `have`: `Content-Length` bytes, or a chunked body up to its last chunk
/// (kept in its chunked framing, as it is forwarded).
async fn read_body<R: AsyncRead + Unpin>(from: &mut R, head: &Head, mut have: Vec<u8>) -> Option<Vec<u8>> {
    let chunked = head.header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let mut chunk = [0u8; 64 * 1024];
    if chunked {
        // Enough for the tests' clients: the body ends with the zero-size chunk and an empty trailer line.
        while !(have.ends_with(b"\r\n0\r\n\r\n") || have == b"0\r\n\r\n" || ends_with_trailer(&have)) {
            let n = from.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            have.extend_from_slice(&chunk[..n]);
        }
        return Some(have);
    }
    let length: usize = head.header("content-length").map(|v| v.parse().ok()).unwrap_or(Some(0))?;
    while have.len() < length {
        let n = from.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        have.extend_from_slice(&chunk[..n]);
    }
    Some(have)
}

/// A chunked body's end when trailers follow the last chunk: `0\r\n<name>: <value>\r\n...\r\n`.
fn ends_with_trailer(body: &[u8]) -> bool {
    body.ends_with(b"\r\n\r\n") && body.windows(5).any(|w| w == b"\r\n0\r\n")
}

fn take_fault(state: &Mutex<State>, head: &Head) -> Option<Fault> {
    let mut state = state.lock().expect("proxy state");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
    state.seen.push((now, head.method.clone(), head.target.clone()));
    let rule = state.rules.iter_mut().find(|r| {
        r.remaining > 0 && (r.method.is_empty() || r.method == head.method) && head.target.contains(&r.path_contains)
    })?;
    rule.remaining -= 1;
    let fault = rule.fault;
    state.injected.push((fault, head.method.clone(), head.target.clone()));
    Some(fault)
}

const SLOW_DOWN: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
<Message>Please reduce your request rate.</Message><RequestId>fault-proxy</RequestId></Error>";

async fn serve(mut client: TcpStream, upstream: String, state: Arc<Mutex<State>>) {
    let Some((raw, rest)) = read_head(&mut client).await else { return };
    let Some(head) = parse_head(&raw) else { return };
    if head.header("expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
        && client.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.is_err()
    {
        return;
    }
    let fault = take_fault(&state, &head);
    if fault == Some(Fault::Reset) {
        // Some of the body first, so the client is mid-send when the connection goes.
        let mut some = [0u8; 4096];
        let _ = tokio::time::timeout(Duration::from_millis(200), client.read(&mut some)).await;
        let _ = client.set_zero_linger();
        return;
    }
    let Some(mut body) = read_body(&mut client, &head, rest).await else { return };
    match fault {
        Some(Fault::SlowDown) => {
            let response = format!(
                "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\
                 x-amz-request-id: fault-proxy\r\nConnection: close\r\n\r\n{SLOW_DOWN}",
                SLOW_DOWN.len()
            );
            let _ = client.write_all(response.as_bytes()).await;
            let _ = client.shutdown().await;
            return;
        }
        Some(Fault::Stall(how_long)) => {
            tokio::time::sleep(how_long).await;
            return;
        }
        Some(Fault::Delay(how_long)) => {
            // The client closing (or sending anything more: one request per connection) ends it unforwarded.
            let mut probe = [0u8; 1];
            tokio::select! {
                () = tokio::time::sleep(how_long) => {}
                _ = client.read(&mut probe) => return,
            }
        }
        Some(Fault::FlipBody) if !body.is_empty() => {
            let middle = body.len() / 2;
            body[middle] ^= 0x01;
        }
        _ => {}
    }
    let Ok(mut server) = TcpStream::connect(&upstream).await else { return };
    if server.write_all(&head.forwarded()).await.is_err() || server.write_all(&body).await.is_err() {
        return;
    }
    // The response: its head with `Connection: close` (the server closes after it), then the rest as it comes.
    let Some((raw, rest)) = read_head(&mut server).await else { return };
    if fault == Some(Fault::LoseAnswer) {
        // The server has answered, so it has acted; the client hears nothing but a reset.
        let _ = client.set_zero_linger();
        return;
    }
    let text = String::from_utf8_lossy(&raw);
    let mut out = String::new();
    for line in text.split("\r\n").filter(|l| !l.is_empty()) {
        if !line.to_ascii_lowercase().starts_with("connection:") {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    if client.write_all(out.as_bytes()).await.is_err() || client.write_all(&rest).await.is_err() {
        return;
    }
    let _ = tokio::io::copy(&mut server, &mut client).await;
    let _ = client.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_forwarded_with_connection_close_and_without_expect() {
        let raw = b"PUT /b/k?partNumber=2&uploadId=x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\n";
        let head = parse_head(&raw[..raw.len() - 4]).unwrap();
        assert_eq!((head.method.as_str(), head.target.as_str()), ("PUT", "/b/k?partNumber=2&uploadId=x"));
        assert_eq!(head.header("content-length"), Some("3"));
        let forwarded = String::from_utf8(head.forwarded()).unwrap();
        assert!(forwarded.ends_with("Connection: close\r\n\r\n"), "{forwarded}");
        assert!(!forwarded.contains("keep-alive") && !forwarded.contains("100-continue"), "{forwarded}");
    }

    #[test]
    fn rules_apply_to_the_next_n_matching_requests_in_order() {
        let state = Mutex::new(State::default());
        state.lock().unwrap().rules.push(Rule {
            method: "PUT".into(),
            path_contains: "partNumber=".into(),
            fault: Fault::SlowDown,
            remaining: 2,
        });
        let head = |method: &str, target: &str| Head {
            method: method.into(),
            target: target.into(),
            version: "HTTP/1.1".into(),
            headers: vec![],
        };
        assert_eq!(take_fault(&state, &head("GET", "/b/k?partNumber=1")), None);
        assert_eq!(take_fault(&state, &head("PUT", "/b/k?partNumber=1")), Some(Fault::SlowDown));
        assert_eq!(take_fault(&state, &head("PUT", "/b/manifest.json")), None);
        assert_eq!(take_fault(&state, &head("PUT", "/b/k?partNumber=2")), Some(Fault::SlowDown));
        assert_eq!(take_fault(&state, &head("PUT", "/b/k?partNumber=3")), None);
        assert_eq!(state.lock().unwrap().injected.len(), 2);
    }
}
