//! The node's own certificates while it runs: when they end, exported and logged, and their
//! files read again when they change (a certificate renewed in place, as cert-manager does,
//! or a CA added to or removed from the bundle during a rotation). Files that change but do
//! not load (not PEM, a key that is not the certificate's, not signed by a CA of the bundle)
//! are looked at once more at the next check (a certificate and its key replaced one after
//! the other), then refused, logged once, and the configuration in force stays; refused
//! files are tried again every minute and on SIGHUP (a certificate not yet valid by this
//! node's clock becomes valid without changing).

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::daemon::node_file::{NodeFile, TlsFiles};
use crate::mesh::NodeId;
use crate::net::{MeshNet, TlsExpiry};

/// How often files refused earlier are tried again though they did not change.
const RETRY_REFUSED: Duration = Duration::from_secs(60);

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
    /// `seen` was refused: tried again now and then (a certificate not valid yet by this
    /// node's clock becomes valid without its files changing).
    refused_at: Option<std::time::Instant>,
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
            refused_at: None,
        }
    }

    /// Read the files again; if they changed and load, the node accepts and dials with them
    /// from now on (connections already up keep going). Files refused earlier are tried
    /// again every [`RETRY_REFUSED`], and at once when `now_asked` (SIGHUP).
    pub(crate) fn refresh(&mut self, mesh: &MeshNet, now_asked: bool) {
        let now = match self.files.contents() {
            Ok(now) => now,
            // A file replaced at this very moment (not there, or not readable yet): the next
            // look sees it.
            Err(_) => return,
        };
        let retry = self
            .refused_at
            .is_some_and(|at| now_asked || at.elapsed() >= RETRY_REFUSED);
        if now == self.seen && !retry {
            self.torn = None;
            return;
        }
        match self.files.load(&self.node_file, self.id) {
            Ok(tls) => {
                self.seen = now;
                self.torn = None;
                self.refused_at = None;
                mesh.set_tls(&tls);
                metrics::counter!("ratemesh_tls_reloads_total", "result" => "applied").increment(1);
                tracing::info!("[tls] files changed: the new certificates are in force");
                in_force(tls.expiry);
            }
            // Perhaps half written: once more at the next check.
            Err(_) if now != self.seen && self.torn.as_ref() != Some(&now) => self.torn = Some(now),
            // Refused before and still: said once.
            Err(_) if now == self.seen => self.refused_at = Some(std::time::Instant::now()),
            Err(error) => {
                self.seen = now;
                self.torn = None;
                self.refused_at = Some(std::time::Instant::now());
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
