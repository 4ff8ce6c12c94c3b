//! The cluster's certificates: one CA, and one certificate per node naming the node
//! (`node-<id>.ratemesh` as its DNS subject alternative name), signed by the CA.
//! `ratemesh certs --out DIR --nodes N` writes them; the QUIC driver reads them.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

use crate::mesh::NodeId;

/// Why certificates could not be made, read or written.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// Generating or signing failed.
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A PEM file holds no usable certificate or key.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The DNS name a node's certificate carries.
pub fn node_name(id: NodeId) -> String {
    format!("node-{id}.ratemesh")
}

/// A CA and the certificates of nodes `1..=nodes`, PEM-encoded.
#[derive(Debug, Clone)]
pub struct ClusterCerts {
    /// The CA certificate.
    pub ca_cert_pem: String,
    /// The CA's private key (keep it offline; it signs new nodes).
    pub ca_key_pem: String,
    /// `(id, certificate, private key)` per node.
    pub nodes: Vec<(NodeId, String, String)>,
}

/// Generate a CA named `cluster` and one certificate per node `1..=nodes`.
pub fn generate(cluster: &str, nodes: u64) -> Result<ClusterCerts, CertError> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("ratemesh cluster {cluster}"));
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let mut out = Vec::new();
    for id in 1..=nodes {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![node_name(id)])?;
        params
            .distinguished_name
            .push(DnType::CommonName, node_name(id));
        let cert = params.signed_by(&key, &issuer)?;
        out.push((id, cert.pem(), key.serialize_pem()));
    }
    Ok(ClusterCerts {
        ca_cert_pem: ca_cert.pem(),
        ca_key_pem,
        nodes: out,
    })
}

/// The files of one node: `ca.pem`, `node-<id>.pem`, `node-<id>.key` in `dir`.
pub fn node_files(dir: &Path, id: NodeId) -> (PathBuf, PathBuf, PathBuf) {
    (
        dir.join("ca.pem"),
        dir.join(format!("node-{id}.pem")),
        dir.join(format!("node-{id}.key")),
    )
}

/// Write `certs` into `dir` (created if missing): `ca.pem`, `ca.key`, and per node
/// `node-<id>.pem` and `node-<id>.key` (keys readable by the owner only).
pub fn write(dir: &Path, certs: &ClusterCerts) -> Result<Vec<PathBuf>, CertError> {
    let io = |path: &Path, source| CertError::Io {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let mut written = Vec::new();
    let mut put = |name: String, contents: &str, secret: bool| -> Result<(), CertError> {
        let path = dir.join(name);
        std::fs::write(&path, contents).map_err(|e| io(&path, e))?;
        #[cfg(unix)]
        if secret {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| io(&path, e))?;
        }
        let _ = secret;
        written.push(path);
        Ok(())
    };
    put("ca.pem".into(), &certs.ca_cert_pem, false)?;
    put("ca.key".into(), &certs.ca_key_pem, true)?;
    for (id, cert, key) in &certs.nodes {
        put(format!("node-{id}.pem"), cert, false)?;
        put(format!("node-{id}.key"), key, true)?;
    }
    Ok(written)
}
