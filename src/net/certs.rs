//! The cluster's certificates: one CA, and one certificate per node naming the node
//! (`node-<id>.ratemesh` as its DNS subject alternative name), signed by the CA.
//! `ratemesh certs --out DIR --nodes N` writes them; `ratemesh certs --out DIR --add-node ID`
//! signs one more with the CA already in `DIR` (a node that joins a running cluster, or a
//! node's certificate renewed); the QUIC driver reads them. Each is valid from an hour before
//! it was made to a stated end ([`Validity`]: a year for a node, ten for the CA by default),
//! so a leaked key ages out.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
    /// A validity that no certificate can carry (past the year 9999).
    #[error("certificate validity: {reason}")]
    Validity {
        /// What is wrong.
        reason: String,
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

/// How long the certificates made here are valid, from when they are made (each starts an
/// hour earlier, for clocks that run behind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// The CA's (10 years by default).
    pub ca: Duration,
    /// Each node's (1 year by default; never past the end of the CA that signs it).
    pub node: Duration,
}

/// A day.
const DAY: Duration = Duration::from_secs(86_400);

impl Default for Validity {
    fn default() -> Self {
        Validity {
            ca: DAY * 3650,
            node: DAY * 365,
        }
    }
}

/// Seconds since the UNIX epoch, now.
fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Give `params` the validity from an hour ago to `until` (seconds since the epoch).
fn valid_until(params: &mut CertificateParams, until: i64) -> Result<(), CertError> {
    let at = |secs: i64| {
        time::OffsetDateTime::from_unix_timestamp(secs).map_err(|e| CertError::Validity {
            reason: e.to_string(),
        })
    };
    params.not_before = at(unix_now() - 3600)?;
    params.not_after = at(until)?;
    Ok(())
}

/// The end of a validity of `length` from now, in seconds since the epoch.
fn from_now(length: Duration) -> i64 {
    unix_now().saturating_add(i64::try_from(length.as_secs()).unwrap_or(i64::MAX))
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

/// A certificate with DNS `names` (the first also its common name), valid until `until`
/// (seconds since the epoch), and its key, as PEM.
fn leaf(
    names: &[String],
    issuer: &Issuer<'_, KeyPair>,
    until: i64,
) -> Result<(String, String), CertError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    valid_until(&mut params, until)?;
    if let Some(first) = names.first() {
        params
            .distinguished_name
            .push(DnType::CommonName, first.as_str());
    }
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Sign a certificate for DNS `names` with the CA of cluster `cluster` whose key is
/// `ca_key_pem` (node `id`'s names are `[node_name(id)]`), valid for `validity` from now;
/// return it and its key, as PEM.
pub fn issue(
    cluster: &str,
    ca_key_pem: &str,
    names: &[String],
    validity: Duration,
) -> Result<(String, String), CertError> {
    let ca_key = KeyPair::from_pem(ca_key_pem)?;
    let issuer = Issuer::new(ca_params(cluster)?, ca_key);
    leaf(names, &issuer, from_now(validity))
}

/// The CA of cluster `cluster` in `dir` (`ca.pem`, `ca.key`, as [`write()`] wrote them): its
/// certificate (PEM), its issuer, and the end of a certificate valid for `validity` from now
/// (never past the CA's).
fn existing_ca(
    dir: &Path,
    cluster: &str,
    validity: Duration,
) -> Result<(String, Issuer<'static, KeyPair>, i64), CertError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|source| CertError::Io { path, source })
    };
    let ca_pem = read("ca.pem")?;
    let ca_key = read("ca.key")?;
    let ca_ends = crate::net::tls::expiry_of(ca_pem.as_bytes()).map_err(|e| CertError::Pem {
        path: dir.join("ca.pem"),
        reason: e.to_string(),
    })?;
    let until = from_now(validity).min(i64::try_from(ca_ends).unwrap_or(i64::MAX));
    let ca_key = KeyPair::from_pem(&ca_key)?;
    Ok((ca_pem, Issuer::new(ca_params(cluster)?, ca_key), until))
}

/// Sign certificates for nodes `ids` with the CA of cluster `cluster` in `dir` (`ca.pem`,
/// `ca.key`, as [`write()`] wrote them), valid for `validity` (or until the CA's end, if
/// sooner), check that each chains to `ca.pem` (a wrong cluster name does not), and write
/// them next to it, replacing a node's earlier pair; return the files written.
pub fn add_nodes(
    dir: &Path,
    cluster: &str,
    ids: &[NodeId],
    validity: Duration,
) -> Result<Vec<PathBuf>, CertError> {
    let (ca_pem, issuer, until) = existing_ca(dir, cluster, validity)?;
    let mut written = Vec::new();
    for &id in ids {
        let (cert, key) = leaf(&[node_name(id)], &issuer, until)?;
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
        written.extend(write_pair(dir, &format!("node-{id}"), &cert, &key)?);
    }
    Ok(written)
}

/// Sign a client certificate for each operator of `names` (its common name, which names the
/// caller on a node's admin port with `client_ca`) with the CA of cluster `cluster` in `dir`,
/// valid for `validity` (or until the CA's end), and write `operator-NAME.pem` and
/// `operator-NAME.key` next to it; return the files written. A name is 1 to 64 letters,
/// digits, `.`, `_`, `-` or `@`. It names no node, so the mesh refuses it as a peer.
pub fn add_operators(
    dir: &Path,
    cluster: &str,
    names: &[String],
    validity: Duration,
) -> Result<Vec<PathBuf>, CertError> {
    let (_, issuer, until) = existing_ca(dir, cluster, validity)?;
    let mut written = Vec::new();
    for name in names {
        let good = (1..=64).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'));
        if !good {
            return Err(CertError::Pem {
                path: dir.join(format!("operator-{name}.pem")),
                reason: "an operator's name is 1 to 64 letters, digits, `.`, `_`, `-` or `@`"
                    .into(),
            });
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        valid_until(&mut params, until)?;
        params
            .distinguished_name
            .push(DnType::CommonName, name.as_str());
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer)?;
        written.extend(write_pair(
            dir,
            &format!("operator-{name}"),
            &cert.pem(),
            &key.serialize_pem(),
        )?);
    }
    Ok(written)
}

/// Write `STEM.pem` and `STEM.key` (the key readable by its owner only) in `dir`.
fn write_pair(dir: &Path, stem: &str, cert: &str, key: &str) -> Result<[PathBuf; 2], CertError> {
    let cert_path = dir.join(format!("{stem}.pem"));
    let key_path = dir.join(format!("{stem}.key"));
    write_file(&cert_path, cert, false)?;
    write_file(&key_path, key, true)?;
    Ok([cert_path, key_path])
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

/// Generate a CA named `cluster` and one certificate per node `1..=nodes`, valid for the
/// default [`Validity`].
///
/// ```
/// let certs = ratemesh::net::certs::generate("prod-eu", 3)?;
/// assert_eq!(certs.nodes.len(), 3);
/// assert!(certs.ca_cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
/// // `certs::write(dir, &certs)` writes them as files, as `ratemesh certs` does.
/// # Ok::<(), ratemesh::net::certs::CertError>(())
/// ```
pub fn generate(cluster: &str, nodes: u64) -> Result<ClusterCerts, CertError> {
    generate_with(cluster, nodes, Validity::default())
}

/// [`generate`] with the validity given (a node's never past the CA's end).
pub fn generate_with(
    cluster: &str,
    nodes: u64,
    validity: Validity,
) -> Result<ClusterCerts, CertError> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = ca_params(cluster)?;
    let ca_until = from_now(validity.ca);
    valid_until(&mut ca_params, ca_until)?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let node_until = from_now(validity.node).min(ca_until);
    let mut out = Vec::new();
    for id in 1..=nodes {
        let (cert, key) = leaf(&[node_name(id)], &issuer, node_until)?;
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
