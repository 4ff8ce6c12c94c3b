//! The request path of a mesh policy: one key's lease on one node, in two atomic words.
//!
//! A node admits a request for a global key by taking its cost from the tokens the key's
//! authority leased to it: one compare-and-swap, no lock, no allocation. The words are
//!
//! - `word`: `[generation: 16][remaining tokens: 48]`;
//! - `expiry`: `[generation: 16][expiry: 48]`, the local instant (in units of 2^14 ns,
//!   rounded down) after which the lease may not be used: a window's lease dies with its
//!   window; a bucket's never expires.
//!
//! Only the node's gossip side (holding the node's lock) installs a new lease: it bumps the
//! generation of `word` first, then stores the new `expiry` with the same generation. A
//! request reads both and uses the lease only when their generations match and `now` is
//! before the expiry; its compare-and-swap on `word` then fails if a new lease was installed
//! in between. So a request never takes tokens from a lease it did not check
//! (`tests/loom_cells.rs` models this). A lease's *used* count is what it was granted minus
//! what remains. A request's tokens go back into the lease only while it is the one they
//! came from (same holding, same generation: [`LeaseCell::give_back`]), when another policy
//! of the request denied it: they were never admitted.

use crate::clock::Nanos;
use crate::decision::MeshCharge;
use crate::sync::{AtomicU64, Ordering};

/// The most tokens a lease holds (48 bits).
pub(crate) const MAX_LEASE_TOKENS: u64 = (1 << 48) - 1;

const GEN_SHIFT: u32 = 48;
const LOW_MASK: u64 = (1 << GEN_SHIFT) - 1;
const EXPIRY_UNIT_SHIFT: u32 = 14;
const NEVER: u64 = LOW_MASK;

/// Why a request could not be decided on the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// The lease has fewer tokens than the cost.
    Short {
        /// Tokens left.
        remaining: u64,
    },
    /// The lease expired (or none was installed).
    Expired,
}

/// One key's lease on one node.
#[derive(Debug)]
pub struct LeaseCell {
    word: AtomicU64,
    expiry: AtomicU64,
    /// The holding whose cell this is (its number among the node's holdings of the key),
    /// low 48 bits: a charge names it, so that it is never given back to a later holding's
    /// cell of the same key.
    holding: u64,
}

fn pack(generation: u64, low: u64) -> u64 {
    (generation << GEN_SHIFT) | (low & LOW_MASK)
}

fn generation(word: u64) -> u64 {
    word >> GEN_SHIFT
}

fn low(word: u64) -> u64 {
    word & LOW_MASK
}

/// Convert a local expiry instant into its 48-bit units (rounded down, so never later).
fn expiry_units(expiry: Option<Nanos>) -> u64 {
    match expiry {
        None => NEVER,
        Some(t) => (t >> EXPIRY_UNIT_SHIFT).min(NEVER - 1),
    }
}

impl Default for LeaseCell {
    fn default() -> Self {
        Self::new()
    }
}

impl LeaseCell {
    /// An empty, expired lease.
    pub fn new() -> Self {
        Self::of_holding(0)
    }

    /// An empty, expired lease of holding number `holding` of its key.
    pub(crate) fn of_holding(holding: u64) -> Self {
        LeaseCell {
            word: AtomicU64::new(0),
            expiry: AtomicU64::new(0),
            holding: holding & LOW_MASK,
        }
    }

    /// Take `cost` tokens at `now`: one compare-and-swap. Return the tokens left.
    #[inline]
    pub fn take(&self, now: Nanos, cost: u64) -> Result<u64, Miss> {
        self.take_charged(now, cost).map(|(left, _)| left)
    }

    /// Name the current lease in a charge: what [`LeaseCell::give_back`] gives back to.
    /// Call it where no other lease can be installed meanwhile (under the node's lock).
    pub(crate) fn charge(&self) -> MeshCharge {
        MeshCharge::new(pack(
            generation(self.word.load(Ordering::Acquire)),
            self.holding,
        ))
    }

    /// Give `tokens` of `charge` back to the lease they were taken from, if it is still
    /// this cell's current one (not renewed, not closed): they were not admitted after all.
    /// Return whether they went back.
    pub fn give_back(&self, charge: MeshCharge, tokens: u64) -> bool {
        let (holding, taken_in) = (low(charge.token()), generation(charge.token()));
        holding == self.holding && self.add_within(tokens, Some(taken_in))
    }

    /// Take `cost` tokens at `now`, as [`LeaseCell::take`]; also name the lease they came
    /// from.
    #[inline]
    pub fn take_charged(&self, now: Nanos, cost: u64) -> Result<(u64, MeshCharge), Miss> {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            let expiry = self.expiry.load(Ordering::Acquire);
            if generation(expiry) != generation(word) {
                // A new lease is being installed: the slow path waits for it under the lock.
                return Err(Miss::Expired);
            }
            let units = low(expiry);
            if units != NEVER && (now >> EXPIRY_UNIT_SHIFT) >= units {
                return Err(Miss::Expired);
            }
            let remaining = low(word);
            if remaining < cost {
                return Err(Miss::Short { remaining });
            }
            let next = pack(generation(word), remaining - cost);
            match self
                .word
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    let charge = MeshCharge::new(pack(generation(word), self.holding));
                    return Ok((remaining - cost, charge));
                }
                Err(actual) => word = actual,
            }
        }
    }

    /// Return the tokens left (whatever the expiry).
    pub fn remaining(&self) -> u64 {
        low(self.word.load(Ordering::Acquire))
    }

    /// Return the local expiry (`None`: never), as stored (rounded down).
    pub fn expiry(&self) -> Option<Nanos> {
        let units = low(self.expiry.load(Ordering::Acquire));
        (units != NEVER).then_some(units << EXPIRY_UNIT_SHIFT)
    }

    /// Add `tokens` to the current lease (a larger grant of the same window). The caller
    /// holds the node's lock: no other lease is installed meanwhile.
    pub fn add(&self, tokens: u64) {
        self.add_within(tokens, None);
    }

    /// Add `tokens` to the current lease if its generation is `generation` (any: `None`);
    /// return whether they were added.
    fn add_within(&self, tokens: u64, generation_wanted: Option<u64>) -> bool {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            if generation_wanted.is_some_and(|g| g != generation(word)) {
                return false;
            }
            let next = pack(
                generation(word),
                low(word).saturating_add(tokens).min(MAX_LEASE_TOKENS),
            );
            match self
                .word
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(actual) => word = actual,
            }
        }
    }

    /// Take up to `max` tokens out of the lease (to give them back, or to reserve them for
    /// waiting requests); return how many were taken.
    pub fn withdraw(&self, max: u64) -> u64 {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            let taken = low(word).min(max);
            if taken == 0 {
                return 0;
            }
            let next = pack(generation(word), low(word) - taken);
            match self
                .word
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return taken,
                Err(actual) => word = actual,
            }
        }
    }

    /// Replace the lease by a new one of `tokens` valid until `expiry` (`None`: never);
    /// return the tokens the old lease had left (exactly: no request can take them after).
    pub fn renew(&self, tokens: u64, expiry: Option<Nanos>) -> u64 {
        let old = self.word.load(Ordering::Acquire);
        let next_generation = (generation(old) + 1) & 0xffff;
        let old = self.word.swap(
            pack(next_generation, tokens.min(MAX_LEASE_TOKENS)),
            Ordering::AcqRel,
        );
        self.expiry.store(
            pack(next_generation, expiry_units(expiry)),
            Ordering::Release,
        );
        low(old)
    }

    /// End the lease: nothing can be taken any more. Return the tokens it had left.
    pub fn close(&self) -> u64 {
        self.renew(0, Some(0))
    }
}

#[cfg(all(test, not(ratemesh_loom)))]
mod tests {
    use super::*;

    #[test]
    fn takes_within_the_lease_and_its_expiry() {
        let cell = LeaseCell::new();
        assert_eq!(cell.take(10, 1), Err(Miss::Expired));
        assert_eq!(cell.renew(5, Some(1 << 30)), 0);
        assert_eq!(cell.take(100, 2), Ok(3));
        assert_eq!(cell.take(100, 4), Err(Miss::Short { remaining: 3 }));
        assert_eq!(cell.take(1 << 30, 1), Err(Miss::Expired));
        cell.add(10);
        assert_eq!(cell.remaining(), 13);
        assert_eq!(cell.withdraw(20), 13);
        assert_eq!(cell.close(), 0);
    }

    #[test]
    fn a_bucket_lease_never_expires_and_renewal_reports_what_was_left() {
        let cell = LeaseCell::new();
        cell.renew(7, None);
        assert_eq!(cell.expiry(), None);
        assert_eq!(cell.take(u64::MAX >> 2, 3), Ok(4));
        assert_eq!(cell.renew(2, Some(5 << 20)), 4);
        assert_eq!(cell.expiry(), Some(5 << 20));
    }

    #[test]
    fn a_charge_goes_back_only_to_the_lease_it_came_from() {
        let cell = LeaseCell::of_holding(3);
        cell.renew(5, Some(1 << 30));
        let (left, charge) = cell.take_charged(100, 2).unwrap();
        assert_eq!(left, 3);
        assert!(cell.give_back(charge, 2));
        assert_eq!(cell.remaining(), 5);
        // Another holding's cell of the key, even at the same generation, refuses it.
        let other = LeaseCell::of_holding(4);
        other.renew(5, Some(1 << 30));
        assert!(!other.give_back(charge, 2));
        assert_eq!(other.remaining(), 5);
        // A renewed (or closed) lease refuses it: the tokens belonged to the old one.
        let (_, charge) = cell.take_charged(100, 1).unwrap();
        cell.renew(1, Some(1 << 31));
        assert!(!cell.give_back(charge, 1));
        assert_eq!(cell.remaining(), 1);
        let (_, charge) = cell.take_charged(100, 1).unwrap();
        assert_eq!(cell.charge(), charge);
        cell.close();
        assert!(!cell.give_back(charge, 1));
        assert_eq!(cell.remaining(), 0);
    }

    #[test]
    fn expiry_rounds_down() {
        let cell = LeaseCell::new();
        let expiry = (3 << EXPIRY_UNIT_SHIFT) + 100;
        cell.renew(1, Some(expiry));
        assert_eq!(cell.take(3 << EXPIRY_UNIT_SHIFT, 1), Err(Miss::Expired));
    }

    #[test]
    fn generations_wrap() {
        let cell = LeaseCell::new();
        for i in 0..70_000u64 {
            cell.renew(i % 3 + 1, None);
        }
        assert_eq!(cell.take(1, 1), Ok(cell.remaining()));
    }
}
