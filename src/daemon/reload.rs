//! SIGHUP: re-read the policy file. A valid file applies at once (the counters of unchanged
//! policies are kept); an invalid one is refused, logged with its file, line and field, and
//! the node keeps serving under the rules it had. A `mesh` policy's limit, rate and burst
//! change live (the node announces its new configuration digest; until every node runs the
//! same, each policy is enforced with the lowest limit among them); a file that adds, removes
//! or renames a `mesh` policy, or changes its algorithm or window, is refused.

use std::path::PathBuf;
use std::sync::Mutex;

use crate::daemon::node_file::read_policy_file;
use crate::http::RateLimitLayer;
use crate::rules::RulesError;

/// The policy file a node enforces and the layer that enforces it.
pub(crate) struct PolicyReloader {
    layer: RateLimitLayer,
    path: PathBuf,
    /// The SHA-256 (hex) of the file in force.
    sha256: Mutex<String>,
    /// The last error reading `[jwt]`'s key file (logged once until it changes).
    key_error: Mutex<Option<String>>,
}

/// What a reload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReloadResult {
    /// The new file is in force.
    Applied,
    /// The old rules stay.
    Refused,
}

impl PolicyReloader {
    /// Track `layer`, built from `path` whose bytes hash to `sha256`.
    pub(crate) fn new(layer: RateLimitLayer, path: PathBuf, sha256: String) -> Self {
        for result in ["applied", "refused"] {
            metrics::counter!("ratemesh_config_reloads_total", "result" => result).increment(0);
        }
        plans_in_force(&layer);
        PolicyReloader {
            layer,
            path,
            sha256: Mutex::new(sha256),
            key_error: Mutex::new(None),
        }
    }

    /// Read `[jwt]`'s key file again if it changed on disk; a file that no longer loads
    /// keeps the keys in force, logged once per distinct error.
    pub(crate) fn refresh_keys(&self) {
        let result = self.layer.rules_now().refresh_keys();
        let mut last = self
            .key_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match result {
            Ok(false) => {}
            Ok(true) => {
                *last = None;
                metrics::counter!("ratemesh_jwt_key_reloads_total", "result" => "applied")
                    .increment(1);
                tracing::info!("[jwt] key file changed: its keys are in force");
            }
            Err(reason) => {
                if last.as_deref() != Some(reason.as_str()) {
                    metrics::counter!("ratemesh_jwt_key_reloads_total", "result" => "refused")
                        .increment(1);
                    tracing::error!(%reason, "[jwt] key file changed but does not load: the keys in force stay");
                    *last = Some(reason);
                }
            }
        }
    }

    /// The SHA-256 (hex) of the policy file in force.
    pub(crate) fn sha256(&self) -> String {
        self.sha256
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Re-read the policy file and apply it, or refuse it and keep the rules in force.
    pub(crate) fn reload(&self) -> ReloadResult {
        let file = self.path.display().to_string();
        // Every arm but the applied one refuses the file.
        match read_policy_file(&self.path) {
            Err(error) => {
                tracing::error!(
                    file = %error.file,
                    line = error.line,
                    field = %error.field,
                    reason = %error.reason,
                    "policy reload refused: {error}; the node keeps serving the policies it had"
                );
            }
            Ok((config, sha256)) => match self.layer.reload(config) {
                Ok(()) => {
                    tracing::info!(%file, %sha256, "policy file reloaded");
                    plans_in_force(&self.layer);
                    let mut in_force = self
                        .sha256
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    *in_force = sha256;
                    // Counted under the hash's lock: a scrape that reads the counter, then
                    // the hash, sees this file's hash whenever it sees this reload counted.
                    metrics::counter!("ratemesh_config_reloads_total", "result" => "applied")
                        .increment(1);
                    return ReloadResult::Applied;
                }
                Err(RulesError::MeshPoliciesChanged { before, after }) => {
                    tracing::error!(
                        %file,
                        before = %before,
                        after = %after,
                        "policy reload refused: the file adds, removes or renames a `mesh` policy, \
                         which a running node cannot change; the node keeps serving the policies it had. \
                         To apply it, stop every node, then start them all with the new file (mesh policies are numbered by name on every node)"
                    );
                }
                Err(error) => {
                    tracing::error!(
                        %file,
                        "policy reload refused: {file}: {error}; the node keeps serving the policies it had"
                    );
                }
            },
        }
        metrics::counter!("ratemesh_config_reloads_total", "result" => "refused").increment(1);
        ReloadResult::Refused
    }
}

/// Say how many API keys the plans file in force lists (`ratemesh_plan_keys`).
fn plans_in_force(layer: &RateLimitLayer) {
    let keys = layer
        .rules_now()
        .config()
        .plans
        .as_ref()
        .map_or(0, |plans| plans.len());
    metrics::gauge!("ratemesh_plan_keys").set(keys as f64);
}
