//! The partition term of the declared bound, measured while a partition lasts: the leases
//! that authorities on a side without a majority granted beyond the backups the other side
//! kept of them at the split (what a takeover there cannot know).

use std::collections::BTreeMap;

use crate::mesh::authority::holding_id;
use crate::mesh::message::AuthorityState;
use crate::sim::{SimConfig, SimNode};

/// What a partition costs, measured while it lasts.
pub(crate) struct Cut {
    /// The nodes on a side without a majority of the members.
    cut_off: Vec<bool>,
    /// Per checked key, the backup of it each node kept when the network split.
    backups: Vec<Vec<Option<AuthorityState>>>,
    /// Per checked key and window: the most its cut-off authorities leased beyond them.
    unbacked: Vec<BTreeMap<u64, u64>>,
    healed: bool,
}

impl Cut {
    /// The network splits into the first `minority` nodes and the rest: measured for windows
    /// where the partition is the only fault (no crash, drain or loss: a lost report leaves
    /// the backups short of what this measure reads) and each of the `keys` is checked (at
    /// most `checked`); `None` otherwise, and the term is the declared most, a whole limit. (A
    /// bucket's states merge their levels at the heal, which this measure does not follow.)
    pub(crate) fn at_split(
        minority: usize,
        config: &SimConfig,
        nodes: &[SimNode],
        keys: u64,
        checked: u64,
    ) -> Option<Cut> {
        if !config.crashes.is_empty()
            || !config.drains.is_empty()
            || config.loss > 0.0
            || keys > checked
            || !config.policy.algorithm().counts_per_window()
        {
            return None;
        }
        let n = nodes.len();
        let sides = [minority, n - minority];
        let cut_off = (0..n)
            .map(|i| 2 * sides[usize::from(i >= minority)] <= n)
            .collect();
        let backups = (0..keys)
            .map(|key| {
                nodes
                    .iter()
                    .map(|s| s.node.as_ref().and_then(|n| n.backup(0, key + 1)).cloned())
                    .collect()
            })
            .collect();
        Some(Cut {
            cut_off,
            backups,
            unbacked: vec![BTreeMap::new(); keys as usize],
            healed: false,
        })
    }

    /// Node `i` ran: what its authorities leased that the other side's backups (at the
    /// split) do not show, per window.
    pub(crate) fn observe(&mut self, i: usize, nodes: &[SimNode]) {
        if self.healed || !self.cut_off[i] {
            return;
        }
        let Some(node) = &nodes[i].node else { return };
        for (key, per_window) in self.unbacked.iter_mut().enumerate() {
            let Some(a) = node.authority_state(0, key as u64 + 1) else {
                continue;
            };
            let (_, successor) = node.membership().owner_and_successor(key as u64 + 1);
            // A successor on the same side is cut off too: the other side takes the key
            // over with no backup.
            let backup = successor
                .map(|s| s as usize)
                .filter(|&s| s < nodes.len() && !self.cut_off[s])
                .and_then(|s| self.backups[key][s].as_ref());
            let u = unbacked(&a, backup);
            let most = per_window.entry(a.window).or_insert(0);
            *most = (*most).max(u);
        }
    }

    /// The partition healed: what the cut-off side leases from now on is seen.
    pub(crate) fn heal(&mut self) {
        self.healed = true;
    }

    /// The term: the most any key's cut-off authorities leased unseen, summed over the
    /// windows they leased in (a sliding window weighs the one before), over the limit; at
    /// most one limit.
    pub(crate) fn term(&self, limit: u64) -> f64 {
        self.unbacked
            .iter()
            .map(|w| w.values().sum::<u64>() as f64 / limit as f64)
            .fold(0.0f64, f64::max)
            .min(1.0)
    }
}

/// Tokens an authority leased in its window (granted and not given back) that `backup`, a
/// copy of it another node keeps, does not show: what a takeover from that backup (or with
/// none) cannot know.
pub(crate) fn unbacked(a: &AuthorityState, backup: Option<&AuthorityState>) -> u64 {
    let backup = backup.filter(|b| b.window == a.window);
    a.holders
        .iter()
        .map(|h| {
            // The same holding's record, live or retired: another holding of the node (one
            // it forgot, or made since) backs up none of this one's grants.
            let backed = backup
                .and_then(|b| b.holders.iter().find(|r| holding_id(r) == holding_id(h)))
                .map_or(0, |r| r.tally.granted.saturating_sub(r.tally.returned));
            h.tally
                .granted
                .saturating_sub(h.tally.returned)
                .saturating_sub(backed)
        })
        .sum()
}
