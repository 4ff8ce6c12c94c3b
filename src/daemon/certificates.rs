//! The node's own certificates while it runs: when they end, exported and logged, and their
//! files read again when they change (a certificate renewed in place, as cert-manager does,
//! or a CA added to or removed from the bundle during a rotation). Files that change but do
//! not load (not PEM, a key that is not the certificate's, not signed by a CA of the bundle)
//! are looked at once more at the next check (a certificate and its key replaced one after
//! the other), then refused, logged once, and the configuration in force stays.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::daemon::node_file::{NodeFile, TlsFiles};
use crate::mesh::NodeId;
use crate::net::{MeshNet, TlsExpiry};

/// A certificate closer than this to its end is logged as a warning at each load.
const WARN_BEFORE: Duration = Duration::from_secs(30 * 86_400);

/// The `[tls]` files in force and what they were when last read.
pub(crate) struct Certificates {
    files: TlsFiles,
    /// The node file that names them (for errors) and the node's id.
    node_file: PathBuf,
    id: NodeId,
    /// The bytes of `ca`, `cert` and `key` last loaded or refused.
    seen: [Vec<u8>; 3],
    /// Bytes read once that did not load: refused if the next check reads them again.
    torn: Option<[Vec<u8>; 3]>,
}

impl Certificates {
    /// Track the `[tls]` files of `file`, whose configuration (ending at `expiry`) is in force.
    pub(crate) fn new(file: &NodeFile, expiry: TlsExpiry) -> Self {
        for result in ["applied", "refused"] {
            metrics::counter!("ratemesh_tls_reloads_total", "result" => result).increment(0);
        }
        in_force(expiry);
        Certificates {
            seen: file.tls.contents().unwrap_or_default(),
            files: file.tls.clone(),
            node_file: file.path.clone(),
            id: file.id,
            torn: None,
        }
    }

    /// Read the files again; if they changed and load, the node accepts and dials with them
    /// from now on (connections already up keep going).
    pub(crate) fn refresh(&mut self, mesh: &MeshNet) {
        let now = match self.files.contents() {
            Ok(now) => now,
            // A file replaced at this very moment (not there, or not readable yet): the next
            // look sees it.
            Err(_) => return,
        };
        if now == self.seen {
            self.torn = None;
            return;
        }
        match self.files.load(&self.node_file, self.id) {
            Ok(tls) => {
                self.seen = now;
                self.torn = None;
                mesh.set_tls(&tls);
                metrics::counter!("ratemesh_tls_reloads_total", "result" => "applied").increment(1);
                tracing::info!("[tls] files changed: the new certificates are in force");
                in_force(tls.expiry);
            }
            // Perhaps half written: once more at the next check.
            Err(_) if self.torn.as_ref() != Some(&now) => self.torn = Some(now),
            Err(error) => {
                self.seen = now;
                self.torn = None;
                metrics::counter!("ratemesh_tls_reloads_total", "result" => "refused").increment(1);
                tracing::error!(%error, "[tls] files changed but do not load: the certificates in force stay");
            }
        }
    }
}

/// Export and log when the certificates in force end.
fn in_force(expiry: TlsExpiry) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for (which, end) in [("node", expiry.node), ("ca", expiry.ca)] {
        metrics::gauge!("ratemesh_tls_certificate_expiry_timestamp_seconds", "certificate" => which)
            .set(end as f64);
        let left = Duration::from_secs(end.saturating_sub(now));
        let days = left.as_secs() / 86_400;
        if left < WARN_BEFORE {
            tracing::warn!(
                certificate = which,
                days,
                "a certificate in force ends soon; renew it"
            );
        } else {
            tracing::info!(certificate = which, days, "certificate in force");
        }
    }
}
