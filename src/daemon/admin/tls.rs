//! The admin ports' connections: plain TCP, or TLS with client certificates when the node
//! file's `[admin]` names a `client_ca`.
//!
//! Under TLS the ports present the node's `[tls]` certificate, and a caller whose certificate
//! chains to `client_ca` is named by the certificate's common name (else its first DNS
//! name). Without a token file the certificate is required at the handshake; with one, it is
//! optional and a call without it needs a token. Handshakes run off the accept loop (at most
//! [`MAX_HANDSHAKES`] at once, each for at most [`HANDSHAKE_TIMEOUT`]), so a slow or silent
//! client holds up nobody. The files are read again when they change ([`Acceptor::refresh`]):
//! a renewed certificate or CA applies to the next connection.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::daemon::node_file::Admin;

/// The most handshakes under way at once on one port.
pub(crate) const MAX_HANDSHAKES: usize = 256;

/// How long a client may take to finish its handshake.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection may be idle before the kernel probes it.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// The longest caller name kept from a certificate.
const MAX_NAME_BYTES: usize = 128;

/// Who is at the other end of an admin connection.
#[derive(Clone, Debug)]
pub(crate) struct Peer {
    /// The client's address.
    pub(crate) addr: SocketAddr,
    /// The name of the client's verified certificate, if it gave one.
    pub(crate) certificate: Option<String>,
}

/// The TLS settings of the admin ports, shared by both and swapped whole when a file changes.
pub(crate) struct Acceptor {
    files: Option<TlsFiles>,
    current: ArcSwapOption<TlsAcceptor>,
    /// The files' modification times when last read.
    read_at: parking_lot::Mutex<Vec<Option<SystemTime>>>,
}

/// The files the acceptor is built from.
struct TlsFiles {
    client_ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    /// Whether a caller may come without a certificate (and give a token).
    optional: bool,
}

impl TlsFiles {
    fn paths(&self) -> [&Path; 3] {
        [&self.client_ca, &self.cert, &self.key]
    }

    fn build(&self) -> Result<TlsAcceptor, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = crate::net::tls::read_roots(&self.client_ca)?;
        let read =
            |path: &Path| std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()));
        let cert_pem = read(&self.cert)?;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}: {e}", self.cert.display()))?;
        let key = PrivateKeyDer::from_pem_slice(&read(&self.key)?)
            .map_err(|e| format!("{}: {e}", self.key.display()))?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots,
            Arc::clone(&provider),
        );
        let verifier = if self.optional {
            verifier.allow_unauthenticated()
        } else {
            verifier
        }
        .build()
        .map_err(|e| format!("{}: {e}", self.client_ca.display()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| format!("{}: {e}", self.cert.display()))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// When each of `paths` was last modified.
fn modified(paths: [&Path; 3]) -> Vec<Option<SystemTime>> {
    paths
        .iter()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

impl Acceptor {
    /// The admin ports' TLS for `settings`: none without `client_ca`.
    pub(crate) fn new(settings: &Admin) -> Result<Acceptor, String> {
        let (cert, key) = &settings.server_cert;
        let files = settings.client_ca.as_ref().map(|client_ca| TlsFiles {
            client_ca: client_ca.clone(),
            cert: cert.clone(),
            key: key.clone(),
            optional: settings.token_file.is_some(),
        });
        let current = match &files {
            Some(files) => Some(Arc::new(files.build()?)),
            None => None,
        };
        let read_at = files
            .as_ref()
            .map(|f| modified(f.paths()))
            .unwrap_or_default();
        Ok(Acceptor {
            files,
            current: ArcSwapOption::new(current),
            read_at: parking_lot::Mutex::new(read_at),
        })
    }

    /// Build the TLS settings again if a file changed: files that no longer load keep the
    /// settings in force (logged, counted in `ratemesh_admin_tls_reloads_total{result}`).
    pub(crate) fn refresh(&self) {
        let Some(files) = &self.files else {
            return;
        };
        let now = modified(files.paths());
        let mut read_at = self.read_at.lock();
        if *read_at == now {
            return;
        }
        *read_at = now;
        match files.build() {
            Ok(acceptor) => {
                self.current.store(Some(Arc::new(acceptor)));
                tracing::info!("admin ports' TLS files read again");
                metrics::counter!("ratemesh_admin_tls_reloads_total", "result" => "applied")
                    .increment(1);
            }
            Err(reason) => {
                tracing::warn!(%reason, "admin ports' TLS files not read again; the ones in force stay");
                metrics::counter!("ratemesh_admin_tls_reloads_total", "result" => "refused")
                    .increment(1);
            }
        }
    }
}

/// An accepted admin connection.
pub(crate) struct Conn {
    io: Io,
    peer: Peer,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

/// The name a verified client certificate gives its caller: its common name, else its first
/// DNS name (printable ASCII, at most [`MAX_NAME_BYTES`]).
fn certificate_name(cert: &CertificateDer<'_>) -> String {
    let name = x509_parser::parse_x509_certificate(cert.as_ref())
        .ok()
        .and_then(|(_, cert)| {
            let cn = cert
                .subject()
                .iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok().map(str::to_string));
            cn.or_else(|| {
                let san = cert.subject_alternative_name().ok().flatten()?;
                san.value.general_names.iter().find_map(|name| match name {
                    x509_parser::extensions::GeneralName::DNSName(dns) => Some(dns.to_string()),
                    _ => None,
                })
            })
        })
        .unwrap_or_default();
    let clean: String = name
        .chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(MAX_NAME_BYTES)
        .collect();
    if clean.is_empty() {
        "certificate without a name".into()
    } else {
        clean
    }
}

/// The connections of one admin port, accepted (and their handshakes finished) by a task of
/// their own; stops accepting when dropped.
pub(crate) struct Incoming {
    connections: mpsc::Receiver<Conn>,
    /// The accept loop.
    task: AbortOnDrop,
    addr: SocketAddr,
}

impl Incoming {
    /// Accept on `listener`, with TLS when `tls` has it.
    pub(crate) fn start(listener: TcpListener, tls: Arc<Acceptor>) -> Incoming {
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let (send, connections) = mpsc::channel(64);
        let task = AbortOnDrop(tokio::spawn(accept(listener, tls, send)));
        Incoming {
            connections,
            task,
            addr,
        }
    }

    /// The connections as a stream, for tonic.
    pub(crate) fn into_stream(
        self,
    ) -> impl tokio_stream::Stream<Item = Result<Conn, std::io::Error>> + Send + 'static {
        let Incoming {
            connections, task, ..
        } = self;
        // The accept loop lives as long as the stream does.
        tokio_stream::StreamExt::map(
            tokio_stream::wrappers::ReceiverStream::new(connections),
            move |conn| {
                let _ = &task;
                Ok(conn)
            },
        )
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Accept connections, each handshake in a task of its own, and hand them on.
async fn accept(listener: TcpListener, tls: Arc<Acceptor>, send: mpsc::Sender<Conn>) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let (stream, addr) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors, or a connection reset before it was taken: try again.
                tracing::debug!(%error, "admin port: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        // A client gone without a word (a laptop closed mid-call) is noticed.
        let keepalive = socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE);
        let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
        let Some(acceptor) = tls.current.load_full() else {
            let peer = Peer {
                addr,
                certificate: None,
            };
            if send
                .send(Conn {
                    io: Io::Plain(stream),
                    peer,
                })
                .await
                .is_err()
            {
                return;
            }
            continue;
        };
        let Ok(permit) = Arc::clone(&handshakes).acquire_owned().await else {
            return;
        };
        let send = send.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream))
                .await
            {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    tracing::info!(target: "ratemesh::admin", %addr, %error, "refused: TLS handshake failed");
                    metrics::counter!("ratemesh_admin_calls_total", "call" => "handshake", "result" => "unauthorized")
                            .increment(1);
                    return;
                }
                Err(_) => {
                    tracing::debug!(%addr, "admin port: handshake timed out");
                    return;
                }
            };
            let certificate = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(certificate_name);
            let peer = Peer { addr, certificate };
            let _ = send
                .send(Conn {
                    io: Io::Tls(Box::new(stream)),
                    peer,
                })
                .await;
        });
    }
}

impl axum::serve::Listener for Incoming {
    type Io = Conn;
    type Addr = Peer;

    async fn accept(&mut self) -> (Conn, Peer) {
        match self.connections.recv().await {
            Some(conn) => {
                let peer = conn.peer.clone();
                (conn, peer)
            }
            // The accept loop ended (it ends only when aborted): serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Peer> {
        Ok(Peer {
            addr: self.addr,
            certificate: None,
        })
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Incoming>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Incoming>) -> Peer {
        stream.remote_addr().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_names_its_caller_by_common_name_then_dns_name() {
        let certs = crate::net::certs::generate("admin-test", 1).unwrap();
        let (_, cert, _) = &certs.nodes[0];
        let der = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
        assert_eq!(certificate_name(&der), "node-1.ratemesh");
        let ca = CertificateDer::from_pem_slice(certs.ca_cert_pem.as_bytes()).unwrap();
        assert_eq!(certificate_name(&ca), "ratemesh cluster admin-test");
        assert_eq!(
            certificate_name(&CertificateDer::from(vec![0u8; 8])),
            "certificate without a name"
        );
    }
}
