//! Native TLS for a TCP listener (rustls), with the certificate reloaded on demand (the
//! card server reloads on SIGHUP): connections accepted after a reload get the new
//! certificate, connections already open keep theirs.
//!
//! Handshakes run concurrently, each within a deadline and at most a bounded number at a
//! time; at that bound a new connection ends the oldest unfinished handshake (as
//! [`crate::serve`] closes the oldest idle connection), so clients that connect and say
//! nothing cannot keep others out. A finished handshake is handed to [`crate::serve`] as
//! an ordinary connection.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Why a certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file is unreadable or holds no PEM certificate.
    #[error("certificate {path}: {message}")]
    Certificate {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The key file is unreadable or holds no PEM private key.
    #[error("private key {path}: {message}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the pair (a key that does not match the certificate, say).
    #[error("certificate {cert} with key {key}: {message}")]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's reason.
        message: String,
    },
}

/// The certificate and key files, and the TLS configuration made from them.
#[derive(Debug, Clone)]
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    current: Arc<RwLock<Arc<ServerConfig>>>,
}

fn load(cert: &Path, key: &Path) -> Result<ServerConfig, TlsError> {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(key)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(key = %key.display(), mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "the TLS private key is readable by others; chmod 0600 it");
    }
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Certificate {
            path: cert.to_owned(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Certificate {
            path: cert.to_owned(),
            message: "no PEM certificate in it".into(),
        });
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        path: key.to_owned(),
        message: e.to_string(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let pair = |e: rustls::Error| TlsError::Pair {
        cert: cert.to_owned(),
        key: key.to_owned(),
        message: e.to_string(),
    };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(pair)?
        .with_no_client_auth()
        .with_single_cert(certs, private)
        .map_err(pair)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

impl Tls {
    /// Loads the certificate chain and private key (PEM files).
    pub fn load(cert: &Path, key: &Path) -> Result<Tls, TlsError> {
        let config = load(cert, key)?;
        Ok(Tls {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: Arc::new(RwLock::new(Arc::new(config))),
        })
    }

    /// Reads the files again; on an error the configuration in force stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = load(&self.cert, &self.key)?;
        *self.current.write() = Arc::new(config);
        Ok(())
    }

    /// A listener that hands over connections once their TLS handshake is done: each
    /// within `handshake_timeout`, at most `max_pending` at a time.
    pub fn listener(
        &self,
        tcp: TcpListener,
        handshake_timeout: Duration,
        max_pending: usize,
    ) -> io::Result<TlsListener> {
        let addr = tcp.local_addr()?;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(handshakes(
            tcp,
            self.current.clone(),
            tx,
            handshake_timeout,
            max_pending.max(1),
        ));
        Ok(TlsListener { rx, addr })
    }
}

/// Most handshakes in progress at once, whatever the connection cap: each holds a
/// descriptor that the connection cap does not count yet.
pub const MAX_PENDING_HANDSHAKES: usize = 256;

async fn handshakes(
    tcp: TcpListener,
    config: Arc<RwLock<Arc<ServerConfig>>>,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    timeout: Duration,
    max_pending: usize,
) {
    // Unfinished handshakes, oldest first, by id.
    let pending: Arc<Mutex<VecDeque<(u64, tokio::task::AbortHandle)>>> = Arc::default();
    let mut next_id = 0u64;
    let mut last_warning: Option<Instant> = None;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = tcp.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, say: wait a moment instead of spinning, and say
                    // so at most once a minute.
                    if last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                        tracing::warn!(error = %e, "accept failed");
                        last_warning = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = tx.closed() => return,
        };
        // Held while the handshake is spawned and listed, so that its own removal from
        // the list (when it ends) comes after it was put there.
        let mut p = pending.lock();
        while p.len() >= max_pending {
            let Some((_, oldest)) = p.pop_front() else {
                break;
            };
            oldest.abort();
        }
        let acceptor = TlsAcceptor::from(config.read().clone());
        let (tx, list) = (tx.clone(), pending.clone());
        let id = next_id;
        next_id += 1;
        let task = tokio::spawn(async move {
            let result = tokio::time::timeout(timeout, acceptor.accept(stream)).await;
            list.lock().retain(|(i, _)| *i != id);
            match result {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
        p.push_back((id, task.abort_handle()));
    }
}

/// Connections whose TLS handshake is done, for [`crate::serve`].
#[derive(Debug)]
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The handshake task ends only when this listener is gone.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A throwaway certificate for 127.0.0.1 (Debian's openssl, as the tests install it).
    fn certificate(dir: &Path) -> (PathBuf, PathBuf) {
        let (cert, key) = (dir.join("c.pem"), dir.join("k.pem"));
        let ok = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-days", "1", "-subj", "/CN=t", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("openssl")
            .status
            .success();
        assert!(ok);
        (cert, key)
    }

    /// True when the peer closed the connection within `limit`.
    async fn closed(s: &mut TcpStream, limit: Duration) -> bool {
        let mut buf = [0u8; 16];
        matches!(
            tokio::time::timeout(limit, s.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }

    #[tokio::test]
    async fn at_the_bound_a_new_connection_ends_the_oldest_silent_handshake() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = certificate(dir.path());
        let tls = Tls::load(&cert, &key).unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let _listener = tls.listener(tcp, Duration::from_secs(60), 2).unwrap();
        let mut first = TcpStream::connect(addr).await.unwrap();
        let mut second = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !closed(&mut first, Duration::from_millis(200)).await,
            "under the bound"
        );
        let mut third = TcpStream::connect(addr).await.unwrap();
        assert!(
            closed(&mut first, Duration::from_secs(2)).await,
            "the oldest was ended"
        );
        assert!(!closed(&mut second, Duration::from_millis(200)).await);
        assert!(!closed(&mut third, Duration::from_millis(200)).await);
    }
}
