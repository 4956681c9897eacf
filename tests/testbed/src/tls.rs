//! A TLS server on loopback that completes handshakes with a given certificate chain: the "live endpoint"
//! that CA bundles are checked against; and a client handshake that records what a server advertises.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use crate::certs::Credential;

/// A running TLS server; it stops when dropped.
pub struct TlsServer {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsServer {
    /// Serves `leaf` followed by `chain` (intermediates, PEM) on 127.0.0.1 with a free port.
    pub async fn start(leaf: &Credential, chain: &[String]) -> Result<Self> {
        crate::init_crypto();
        let mut certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes()).collect::<Result<_, _>>()?;
        for pem in chain {
            certs.extend(CertificateDer::pem_slice_iter(pem.as_bytes()).collect::<Result<Vec<_>, _>>()?);
        }
        let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).context("parsing the server key")?;
        let config = rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(certs, key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(stream).await {
                        let _ = tls.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
                        let _ = tls.shutdown().await;
                    }
                });
            }
        });
        Ok(Self { addr, task })
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

/// What a TLS server showed in one handshake.
#[derive(Debug)]
pub struct Handshake {
    /// The distinguished names the server listed as acceptable client-certificate issuers (DER), in order.
    pub acceptable_client_cas: Vec<Vec<u8>>,
}

/// Completes a handshake with `addr` for `server_name`, trusting only `roots_pem`, and presenting `client` (if
/// any) whatever issuers the server advertises, as rustls (and so kube-rs) does. Fails when the server's chain
/// does not verify.
pub async fn handshake(
    addr: &str,
    server_name: &str,
    roots_pem: &str,
    client: Option<&Credential>,
) -> Result<Handshake> {
    crate::init_crypto();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(roots_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let recorder = Arc::new(RecordingResolver { hints: Default::default(), key: None });
    let recorder = match client {
        Some(cred) => {
            let certs = CertificateDer::pem_slice_iter(cred.cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
            let key = PrivateKeyDer::from_pem_slice(cred.key_pem.as_bytes()).context("parsing the client key")?;
            let key = rustls::crypto::ring::default_provider().key_provider.load_private_key(key)?;
            Arc::new(RecordingResolver {
                hints: Default::default(),
                key: Some(Arc::new(rustls::sign::CertifiedKey::new(certs, key))),
            })
        }
        None => recorder,
    };
    let config =
        rustls::ClientConfig::builder().with_root_certificates(roots).with_client_cert_resolver(recorder.clone());
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string())?;
    let mut tls = connector.connect(name, tcp).await.with_context(|| format!("TLS handshake with {addr}"))?;
    let _ = tls.shutdown().await;
    let acceptable_client_cas = recorder.hints.lock().expect("not poisoned").clone();
    Ok(Handshake { acceptable_client_cas })
}

/// Records the issuer hints of the server's certificate request and answers with its key regardless of them.
#[derive(Debug)]
struct RecordingResolver {
    hints: std::sync::Mutex<Vec<Vec<u8>>>,
    key: Option<Arc<rustls::sign::CertifiedKey>>,
}

impl rustls::client::ResolvesClientCert for RecordingResolver {
    fn resolve(
        &self,
        root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        *self.hints.lock().expect("not poisoned") = root_hint_subjects.iter().map(|h| h.to_vec()).collect();
        self.key.clone()
    }

    fn has_certs(&self) -> bool {
        self.key.is_some()
    }
}
