//! `count_when`: a policy that counts a request only by its outcome (failed logins, errors).
//!
//! ```toml
//! [policies.failed_logins]
//! algorithm = "fixed-window"
//! limit = 5
//! window = "15m"
//! by = ["ip"]
//! count_when = { status = [401, 403, "500-599"] }
//! ```
//!
//! A request takes its tokens before it runs (so parallel attempts cannot all pass a check
//! that only reads the key, and a key already over is denied) and gets them back after its
//! response when the status is not one the policy counts.

use serde::Deserialize;

/// The statuses a policy counts (inclusive ranges).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StatusSet {
    /// `(first, last)` of each range.
    pub ranges: Vec<(u16, u16)>,
}

impl StatusSet {
    /// Tell whether `status` is counted.
    pub fn contains(&self, status: u16) -> bool {
        self.ranges.iter().any(|&(a, b)| (a..=b).contains(&status))
    }
}

/// One entry of `status`: a code or a range `"500-599"`.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum RawStatus {
    Code(i64),
    Range(String),
}

/// `count_when` as the file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCountWhen {
    status: Vec<RawStatus>,
}

impl RawCountWhen {
    pub(super) fn build(&self) -> Result<StatusSet, String> {
        let code = |n: i64| -> Result<u16, String> {
            u16::try_from(n)
                .ok()
                .filter(|c| (100..=599).contains(c))
                .ok_or_else(|| format!("`{n}` is not an HTTP status (100 to 599)"))
        };
        let mut ranges = Vec::new();
        for entry in &self.status {
            let range = match entry {
                RawStatus::Code(n) => (code(*n)?, code(*n)?),
                RawStatus::Range(text) => {
                    let (a, b) = text
                        .split_once('-')
                        .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)))
                        .ok_or_else(|| format!("`{text}`: a range is written \"500-599\""))?;
                    let (a, b) = (code(a)?, code(b)?);
                    if a > b {
                        return Err(format!("`{text}`: the range is empty"));
                    }
                    (a, b)
                }
            };
            ranges.push(range);
        }
        if ranges.is_empty() {
            return Err("name at least one status".into());
        }
        Ok(StatusSet { ranges })
    }
}
