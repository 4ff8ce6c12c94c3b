//! Mutual TLS for the QUIC transport: every node presents a certificate signed by the
//! cluster CA and verifies its peers' against it, with one crypto provider (`ring`) chosen
//! explicitly (two providers in one build make rustls's implicit builders panic).
//!
//! A node's id is the one its certificate names (`node-<id>.ratemesh`, exactly one such
//! name): the CA's signature is the only admission ticket, no list of members is needed.
//! A peer dialed by id must present that id's certificate; a seed dialed by address (its id
//! unknown) is dialed under [`SEED_NAME`], and its certificate must chain to the CA for the
//! one node name it carries ([`node_id_of`]).

use std::sync::Arc;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;

use crate::mesh::NodeId;

/// The DNS name a node's certificate carries: `node-<id>.ratemesh`.
pub fn node_name(id: NodeId) -> String {
    format!("node-{id}.ratemesh")
}

/// Why the TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM input holds no usable certificate or key.
    #[error("{what}: {reason}")]
    Pem {
        /// Which input.
        what: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// quinn refused the cipher suites.
    #[error("QUIC TLS configuration: {0}")]
    Quic(#[from] quinn::crypto::rustls::NoInitialCipherSuite),
}

/// The most incoming handshakes the endpoint holds before the node accepts or refuses them.
pub(crate) const MAX_PENDING_HANDSHAKES: usize = 1024;

/// The server name under which a seed is dialed by address: its certificate is checked
/// against the CA for whichever single node name it carries. A client of a node's admin port
/// dials under it too ([`admin_client`]).
pub(crate) const SEED_NAME: &str = "seed.ratemesh";

/// Why a certificate names no node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum IdentityError {
    /// It is not a certificate webpki can read.
    #[error("the certificate does not parse")]
    Unreadable,
    /// It names no `node-<id>.ratemesh`.
    #[error("the certificate names no node (node-<id>.ratemesh)")]
    NoNodeName,
    /// It names more than one node.
    #[error("the certificate names several nodes")]
    SeveralNodes,
}

/// Return the node id a certificate names: its one `node-<id>.ratemesh` DNS name (id ≥ 1,
/// written as [`node_name`] writes it). The chain is not checked here.
pub(crate) fn node_id_of(cert: &CertificateDer<'_>) -> Result<NodeId, IdentityError> {
    let leaf = webpki::EndEntityCert::try_from(cert).map_err(|_| IdentityError::Unreadable)?;
    let mut ids = leaf.valid_dns_names().filter_map(|name| {
        let id: NodeId = name
            .strip_prefix("node-")?
            .strip_suffix(".ratemesh")?
            .parse()
            .ok()?;
        ((1..=crate::ids::MAX_NODE_ID).contains(&id) && node_name(id).eq_ignore_ascii_case(name))
            .then_some(id)
    });
    let id = ids.next().ok_or(IdentityError::NoNodeName)?;
    if ids.any(|other| other != id) {
        return Err(IdentityError::SeveralNodes);
    }
    Ok(id)
}

/// Return the node id the peer's (verified) certificate names.
pub(crate) fn peer_id(connection: &quinn::Connection) -> Result<NodeId, IdentityError> {
    let identity = connection
        .peer_identity()
        .ok_or(IdentityError::Unreadable)?;
    let certs = identity
        .downcast::<Vec<CertificateDer<'static>>>()
        .map_err(|_| IdentityError::Unreadable)?;
    node_id_of(certs.first().ok_or(IdentityError::Unreadable)?)
}

/// Checks a server's certificate against the cluster CA: for the name dialed, or, dialed
/// under [`SEED_NAME`], for the one node name the certificate carries.
#[derive(Debug)]
struct NodeServerVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
}

impl rustls::client::danger::ServerCertVerifier for NodeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let seed = matches!(server_name, ServerName::DnsName(name) if name.as_ref() == SEED_NAME);
        if !seed {
            return self.inner.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            );
        }
        let not_a_node =
            || rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName);
        let id = node_id_of(end_entity).map_err(|_| not_a_node())?;
        let name = ServerName::try_from(node_name(id)).map_err(|_| not_a_node())?;
        self.inner
            .verify_server_cert(end_entity, intermediates, &name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Why a node's own certificate or key cannot serve it in the cluster.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OwnCertError {
    /// The files do not parse (no certificate, no key, bad PEM).
    #[error(transparent)]
    Pem(#[from] TlsError),
    /// The certificate does not chain to the cluster CA (or is expired, or names another
    /// node): the peers would refuse it.
    #[error("the certificate does not chain to the cluster CA for {name}: {reason}")]
    NotFromCa {
        /// The name checked, `node-<id>.ratemesh`.
        name: String,
        /// What the verifier said.
        reason: String,
    },
    /// The private key is not the certificate's.
    #[error("the private key does not match the certificate: {0}")]
    KeyMismatch(String),
}

/// Check, before a node starts, that its certificate chains to the cluster CA for its own
/// name (`node-<id>.ratemesh`) and that its private key is the certificate's.
pub(crate) fn check_own_certificate(
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
    id: NodeId,
) -> Result<(), OwnCertError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem) {
        roots
            .add(ca.map_err(pem_error("CA certificate"))?)
            .map_err(TlsError::from)?;
    }
    if roots.is_empty() {
        return Err(TlsError::Pem {
            what: "CA certificate",
            reason: "no certificate in the file".into(),
        }
        .into());
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(pem_error("node certificate"))?;
    let Some((leaf, intermediates)) = chain.split_first() else {
        return Err(TlsError::Pem {
            what: "node certificate",
            reason: "no certificate in the file".into(),
        }
        .into());
    };
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(pem_error("node key"))?;
    let name = node_name(id);
    let server_name = ServerName::try_from(name.clone()).map_err(|e| OwnCertError::NotFromCa {
        name: name.clone(),
        reason: e.to_string(),
    })?;
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::clone(&provider),
    )
    .build()
    .map_err(|e| OwnCertError::NotFromCa {
        name: name.clone(),
        reason: e.to_string(),
    })?;
    use rustls::client::danger::ServerCertVerifier;
    verifier
        .verify_server_cert(
            leaf,
            intermediates,
            &server_name,
            &[],
            rustls::pki_types::UnixTime::now(),
        )
        .map_err(|e| OwnCertError::NotFromCa {
            name: name.clone(),
            reason: e.to_string(),
        })?;
    // `from_der` compares the key's public half with the certificate's.
    rustls::sign::CertifiedKey::from_der(chain, key, &provider)
        .map(|_| ())
        .map_err(|e| OwnCertError::KeyMismatch(e.to_string()))
}

/// One node's QUIC configurations: accept peers and dial them, both with mutual TLS.
#[derive(Debug, Clone)]
pub struct NodeTls {
    /// For the accepting side (requires and verifies the peer's certificate).
    pub server: quinn::ServerConfig,
    /// For the dialing side (presents this node's certificate).
    pub client: quinn::ClientConfig,
    /// When the certificates they were built from end.
    pub expiry: TlsExpiry,
}

/// When a node's certificates end, in seconds since the UNIX epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsExpiry {
    /// The node's certificate chain (its earliest end).
    pub node: u64,
    /// The CA file (its earliest-ending certificate: past it, peers signed by that CA are
    /// refused).
    pub ca: u64,
}

/// Return the earliest end of validity (seconds since the UNIX epoch) of the certificates in
/// `pem`: when a chain stops working, or the first CA of a bundle runs out.
pub(crate) fn expiry_of(pem: &[u8]) -> Result<u64, TlsError> {
    let mut earliest: Option<u64> = None;
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(pem_error("certificate"))?;
        let (_, parsed) =
            x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|e| TlsError::Pem {
                what: "certificate",
                reason: format!("does not parse as X.509: {e}"),
            })?;
        let end = u64::try_from(parsed.validity().not_after.timestamp()).unwrap_or(0);
        earliest = Some(earliest.map_or(end, |e| e.min(end)));
    }
    earliest.ok_or(TlsError::Pem {
        what: "certificate",
        reason: "no certificate in the file".into(),
    })
}

fn pem_error(what: &'static str) -> impl Fn(rustls::pki_types::pem::Error) -> TlsError {
    move |e| TlsError::Pem {
        what,
        reason: e.to_string(),
    }
}

/// The CA certificates of the PEM file `path`, refusing a file that holds none; an error
/// names the file.
#[cfg(feature = "node")]
pub(crate) fn read_roots(path: &std::path::Path) -> Result<Arc<rustls::RootCertStore>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    roots_of(&pem).map_err(|e| format!("{}: {e}", path.display()))
}

/// The CA certificates of `ca_pem`, refusing PEM that holds none.
fn roots_of(ca_pem: &[u8]) -> Result<Arc<rustls::RootCertStore>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(ca.map_err(pem_error("CA certificate"))?)?;
    }
    if roots.is_empty() {
        return Err(TlsError::Pem {
            what: "CA certificate",
            reason: "no certificate in the file".into(),
        });
    }
    Ok(Arc::new(roots))
}

/// Build a node's configurations from PEM: the cluster CA, its certificate chain and key.
pub fn node_tls(
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
    transport: Arc<quinn::TransportConfig>,
) -> Result<NodeTls, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = roots_of(ca_pem)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(pem_error("node certificate"))?;
    if chain.is_empty() {
        return Err(TlsError::Pem {
            what: "node certificate",
            reason: "no certificate in the file".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(pem_error("node key"))?;
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
            .build()?;
    let server_crypto = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())?;
    let mut server =
        quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(server_crypto)?));
    server.transport_config(Arc::clone(&transport));
    // Handshakes not yet accepted or refused, and the bytes they buffer: bounded, so a flood
    // of Initials on the peer port cannot grow memory (beyond these, quinn drops them).
    server.max_incoming(MAX_PENDING_HANDSHAKES);
    server.incoming_buffer_size(64 * 1024);
    server.incoming_buffer_size_total(4 * 1024 * 1024);
    let server_verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
            .build()?;
    let client_crypto = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NodeServerVerifier {
            inner: server_verifier,
        }))
        .with_client_auth_cert(chain, key)?;
    let mut client = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(client_crypto)?));
    client.transport_config(transport);
    let expiry = TlsExpiry {
        node: expiry_of(cert_pem)?,
        ca: expiry_of(ca_pem)?,
    };
    Ok(NodeTls {
        server,
        client,
        expiry,
    })
}

/// A TLS client of a node's admin port (`[admin] client_ca`) and the server name to dial
/// under: the node must present a certificate of the cluster CA `ca_pem` naming one node;
/// with `identity` (a certificate chain and its key, PEM) the client presents it.
pub fn admin_client(
    ca_pem: &[u8],
    identity: Option<(&[u8], &[u8])>,
) -> Result<(rustls::ClientConfig, ServerName<'static>), TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = roots_of(ca_pem)?;
    let inner =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
            .build()?;
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NodeServerVerifier { inner }));
    let server_name = ServerName::try_from(SEED_NAME).expect("a valid DNS name");
    let config = match identity {
        Some((cert_pem, key_pem)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
                .collect::<Result<_, _>>()
                .map_err(pem_error("client certificate"))?;
            let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(pem_error("client key"))?;
            builder.with_client_auth_cert(chain, key)?
        }
        None => builder.with_no_client_auth(),
    };
    Ok((config, server_name))
}

/// Tell whether the first certificate of `cert_pem` names node `id` (`node-<id>.ratemesh`):
/// a node started with another node's certificate would be refused by its peers.
#[cfg(feature = "node")]
pub(crate) fn certificate_names_node(cert_pem: &[u8], id: NodeId) -> bool {
    let Some(Ok(leaf)) = CertificateDer::pem_slice_iter(cert_pem).next() else {
        return false;
    };
    let Ok(leaf) = webpki::EndEntityCert::try_from(&leaf) else {
        return false;
    };
    ServerName::try_from(node_name(id))
        .is_ok_and(|name| leaf.verify_is_valid_for_subject_name(&name).is_ok())
}
