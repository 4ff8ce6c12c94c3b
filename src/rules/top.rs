//! The heaviest keys of each policy over the last minutes (the admin API's `/v1/top`): every
//! decision of a policy is recorded, admitted and denied apart, in a Space-Saving sketch of
//! the thread that made it (`crate::top`; no lock shared between threads on the request
//! path: the thread takes its own sketch with one atomic exchange and gives it back with a
//! store, an `AtomicRefCell` a query borrows in turn), of two generations of 5 minutes each. A query merges the threads' summaries into
//! one that keeps the sketch's guarantee: a key that carried more than 1/n of the decisions
//! is among the first n, for n up to the capacity.
//!
//! Memory: [`CAPACITY`] counters per sketch, two sketches per generation pair, one pair per
//! policy, outcome and thread that decided for the policy (about 20 KB per pair).

#[cfg(feature = "node")]
use atomic_refcell::AtomicRefCell;

#[cfg(feature = "node")]
use thread_local::ThreadLocal;

#[cfg(feature = "node")]
use super::Rules;
use crate::clock::Nanos;
#[cfg(feature = "node")]
use crate::top::{Recent, Summary, merge};

/// Counters per sketch: the most keys a summary lists, and the largest `n` the top-n
/// guarantee holds for.
#[cfg(feature = "node")]
pub(crate) const CAPACITY: usize = 256;

/// How long one generation lasts: a summary covers the last 5 to 10 minutes.
#[cfg(feature = "node")]
const PERIOD_NS: Nanos = 5 * 60 * 1_000_000_000;

/// One policy's sketches, by outcome and thread.
#[cfg(feature = "node")]
#[derive(Default)]
pub(super) struct PolicyTop {
    admitted: ThreadLocal<AtomicRefCell<Recent>>,
    denied: ThreadLocal<AtomicRefCell<Recent>>,
}

/// Without the node (and its admin API), nothing reads the sketches: nothing is recorded.
#[cfg(not(feature = "node"))]
#[derive(Default)]
pub(super) struct PolicyTop;

#[cfg(not(feature = "node"))]
impl PolicyTop {
    /// Record nothing.
    #[inline]
    pub(super) fn note(&self, _key: u64, _allowed: bool, _now: Nanos) {}
}

#[cfg(feature = "node")]
impl PolicyTop {
    /// Record a decision for `key` at `now`.
    #[inline]
    pub(super) fn note(&self, key: u64, allowed: bool, now: Nanos) {
        let sketches = if allowed {
            &self.admitted
        } else {
            &self.denied
        };
        let sketch = sketches.get_or(|| AtomicRefCell::new(Recent::new(CAPACITY, PERIOD_NS)));
        // Only a query (a copy of the summary) holds it besides this thread: wait it out.
        loop {
            if let Ok(mut sketch) = sketch.try_borrow_mut() {
                sketch.record(key, 1, now);
                return;
            }
            std::hint::spin_loop();
        }
    }

    /// `f` of `sketch`, borrowed once its thread is not recording in it.
    fn read<T>(sketch: &AtomicRefCell<Recent>, f: impl FnOnce(&Recent) -> T) -> T {
        loop {
            if let Ok(sketch) = sketch.try_borrow() {
                return f(&sketch);
            }
            std::hint::spin_loop();
        }
    }

    /// Bytes its sketches take on this node.
    fn memory_bytes(&self) -> usize {
        self.admitted
            .iter()
            .chain(self.denied.iter())
            .map(|s| Self::read(s, Recent::memory_bytes))
            .sum()
    }

    /// The merged summary of every thread's sketches at `now`.
    fn summary(&self, denied: bool, now: Nanos) -> Summary {
        let sketches = if denied { &self.denied } else { &self.admitted };
        let parts: Vec<Summary> = sketches
            .iter()
            .map(|s| Self::read(s, |s| s.summary(now)))
            .collect();
        merge(&parts, CAPACITY)
    }
}

#[cfg(feature = "node")]
impl Rules {
    /// Policy `policy`'s heaviest keys on this node at `now` (denied or admitted), as a
    /// summary of at most `n` entries, with the bytes the policy's sketches take here;
    /// `None` for a policy the file does not have.
    pub(crate) fn top(
        &self,
        policy: &str,
        denied: bool,
        n: usize,
        now: Nanos,
    ) -> Option<(Summary, usize)> {
        let compiled = self.policies.iter().find(|c| c.name == policy)?;
        let mut summary = compiled.top.summary(denied, now);
        summary.truncate(n);
        Some((summary, compiled.top.memory_bytes()))
    }
}
