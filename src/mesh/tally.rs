//! What one holding of a key was granted, gave back and spent: three cumulative counts that
//! only grow, so that two copies of them merge by keeping each count's maximum.
//!
//! A [`Tally`] is a state-based CRDT ([`CvRDT`]): its merge is commutative, associative and
//! idempotent, so a duplicated, reordered or late report, a backup, a handoff or the state of
//! the other side of a partition can be folded in any number of times, in any order, and no
//! message can lower a count. An authority keeps one per holding of its key (in each
//! [`HolderRecord`](crate::mesh::message::HolderRecord)), and a holder sends its own in every
//! [`Want`](crate::mesh::message::Want): across holdings the tallies are a grow-only counter
//! per count (a G-Counter keyed by holding), which the property tests check against
//! `crdts::GCounter`.

use std::convert::Infallible;

use bincode::{Decode, Encode};
use crdts::CvRDT;

/// One holding's cumulative counts in its lease's window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Tally {
    /// Tokens granted to the holding (cumulative).
    pub(crate) granted: u64,
    /// Tokens the holding gave back (cumulative).
    pub(crate) returned: u64,
    /// Tokens the holding admitted (cumulative).
    pub(crate) used: u64,
}

impl Tally {
    /// Tokens leased and not reported spent or given back.
    #[inline]
    pub(crate) fn unspent(&self) -> u64 {
        self.granted
            .saturating_sub(self.returned)
            .saturating_sub(self.used)
    }

    /// Tokens that moved between the holding and the authority: granted plus given back.
    #[inline]
    pub(crate) fn traffic(&self) -> u64 {
        self.granted.saturating_add(self.returned)
    }

    /// What this tally counts beyond `other` of the same holding: `(granted, returned)`.
    #[inline]
    pub(crate) fn beyond(&self, other: &Tally) -> (u64, u64) {
        (
            self.granted.saturating_sub(other.granted),
            self.returned.saturating_sub(other.returned),
        )
    }
}

impl CvRDT for Tally {
    type Validation = Infallible;

    fn validate_merge(&self, _other: &Self) -> Result<(), Infallible> {
        Ok(())
    }

    #[inline]
    fn merge(&mut self, other: Self) {
        self.granted = self.granted.max(other.granted);
        self.returned = self.returned.max(other.returned);
        self.used = self.used.max(other.used);
    }
}

#[cfg(test)]
mod tests;
