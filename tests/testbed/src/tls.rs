//! A TLS server on loopback that completes handshakes with a given certificate chain: the "live endpoint"
//! that CA bundles are checked against.

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
