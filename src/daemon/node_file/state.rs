//! The node file's `[state]` table: where the node keeps what must outlive its process
//! (the admin API's overrides; snapshots of long windows' counts), and how often it writes
//! the snapshots.
//!
//! ```toml
//! [state]
//! dir = "state/node-1"               # relative to the node file; default state/node-ID
//! snapshot_interval = "1s"           # how often changed long-window counts are written
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::config::{ConfigError, Source};

/// The default `snapshot_interval`.
pub(crate) const DEFAULT_SNAPSHOT_INTERVAL: Duration = Duration::from_secs(1);

/// The `[state]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// The directory.
    pub dir: PathBuf,
    /// How often changed long-window counts are written.
    pub snapshot_interval: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawState {
    dir: Option<String>,
    snapshot_interval: Option<String>,
}

/// Validate `[state]` (absent: the defaults) for node `id` whose file is in `base`.
pub(super) fn state(
    source: &Source<'_>,
    spanned: Option<&Spanned<RawState>>,
    id: u64,
    base: &Path,
) -> Result<State, ConfigError> {
    let default_dir = || base.join(format!("state/node-{id}"));
    let Some(spanned) = spanned else {
        return Ok(State {
            dir: default_dir(),
            snapshot_interval: DEFAULT_SNAPSHOT_INTERVAL,
        });
    };
    let raw = spanned.get_ref();
    let at = |key: &str| source.line_of_key(spanned.span(), key);
    let snapshot_interval = match &raw.snapshot_interval {
        None => DEFAULT_SNAPSHOT_INTERVAL,
        Some(text) => {
            let d = humantime::parse_duration(text).map_err(|e| {
                source.error(
                    at("snapshot_interval"),
                    "state.snapshot_interval",
                    format!("`{text}` is not a duration ({e})"),
                )
            })?;
            if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
                return Err(source.error(
                    at("snapshot_interval"),
                    "state.snapshot_interval",
                    format!("between 100ms and 1h, got {text}"),
                ));
            }
            d
        }
    };
    Ok(State {
        dir: raw.dir.as_ref().map_or_else(default_dir, |d| base.join(d)),
        snapshot_interval,
    })
}
