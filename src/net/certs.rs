//! The cluster's certificates: one CA, and one certificate per node naming the node
//! (`node-<id>.ratemesh` as its DNS subject alternative name), signed by the CA.
//! `ratemesh certs --out DIR --nodes N` writes them; `ratemesh certs --out DIR --add-node ID`
//! signs one more with the CA already in `DIR` (a node that joins a running cluster); the
//! QUIC driver reads them.

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

pub use crate::net::tls::node_name;

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

/// The parameters of the CA of cluster `cluster` (the same every time: a certificate signed
/// later with the CA's key chains to the CA made earlier).
fn ca_params(cluster: &str) -> Result<CertificateParams, CertError> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("ratemesh cluster {cluster}"));
    Ok(ca_params)
}

/// A certificate with DNS `names` (the first also its common name) and its key, as PEM.
fn leaf(names: &[String], issuer: &Issuer<'_, KeyPair>) -> Result<(String, String), CertError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    if let Some(first) = names.first() {
        params
            .distinguished_name
            .push(DnType::CommonName, first.as_str());
    }
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Sign a certificate for DNS `names` with the CA of cluster `cluster` whose key is
/// `ca_key_pem` (node `id`'s names are `[node_name(id)]`); return it and its key, as PEM.
pub fn issue(
    cluster: &str,
    ca_key_pem: &str,
    names: &[String],
) -> Result<(String, String), CertError> {
    let ca_key = KeyPair::from_pem(ca_key_pem)?;
    let issuer = Issuer::new(ca_params(cluster)?, ca_key);
    leaf(names, &issuer)
}

/// Sign certificates for nodes `ids` with the CA of cluster `cluster` in `dir` (`ca.pem`,
/// `ca.key`, as [`write()`] wrote them), check that each chains to `ca.pem` (a wrong cluster
/// name does not), and write them next to it; return the files written.
pub fn add_nodes(dir: &Path, cluster: &str, ids: &[NodeId]) -> Result<Vec<PathBuf>, CertError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|source| CertError::Io { path, source })
    };
    let ca_pem = read("ca.pem")?;
    let ca_key = read("ca.key")?;
    let mut written = Vec::new();
    for &id in ids {
        let (cert, key) = issue(cluster, &ca_key, &[node_name(id)])?;
        crate::net::tls::check_own_certificate(
            ca_pem.as_bytes(),
            cert.as_bytes(),
            key.as_bytes(),
            id,
        )
        .map_err(|e| CertError::Pem {
            path: dir.join("ca.pem"),
            reason: format!("the new certificate does not chain to it ({e}); is the cluster name the one the CA was made with?"),
        })?;
        for (name, contents, secret) in [
            (format!("node-{id}.pem"), &cert, false),
            (format!("node-{id}.key"), &key, true),
        ] {
            let path = dir.join(name);
            write_file(&path, contents, secret)?;
            written.push(path);
        }
    }
    Ok(written)
}

fn write_file(path: &Path, contents: &str, secret: bool) -> Result<(), CertError> {
    let io = |source| CertError::Io {
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(path, contents).map_err(io)?;
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    }
    let _ = secret;
    Ok(())
}

/// Generate a CA named `cluster` and one certificate per node `1..=nodes`.
///
/// ```
/// let certs = ratemesh::net::certs::generate("prod-eu", 3)?;
/// assert_eq!(certs.nodes.len(), 3);
/// assert!(certs.ca_cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
/// // `certs::write(dir, &certs)` writes them as files, as `ratemesh certs` does.
/// # Ok::<(), ratemesh::net::certs::CertError>(())
/// ```
pub fn generate(cluster: &str, nodes: u64) -> Result<ClusterCerts, CertError> {
    let ca_key = KeyPair::generate()?;
    let ca_params = ca_params(cluster)?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let mut out = Vec::new();
    for id in 1..=nodes {
        let (cert, key) = leaf(&[node_name(id)], &issuer)?;
        out.push((id, cert, key));
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
        write_file(&path, contents, secret)?;
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
