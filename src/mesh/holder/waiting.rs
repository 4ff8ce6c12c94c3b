//! A request on a holding's slow path: one that waits for tokens, and how each went; the
//! holding's waiting requests served from its reserve, in order, and denied at their
//! deadline.

use super::Holding;
use crate::clock::Nanos;
use crate::decision::{Decision, MeshCharge};
use crate::policy::Policy;

/// A request waiting for tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waiting {
    /// The caller's id for it.
    pub id: u64,
    /// Its cost.
    pub cost: u64,
    /// When it is denied if still waiting (local).
    pub deadline: Nanos,
    /// The first want that counted it (0: none yet).
    pub asked: u32,
    /// It was admitted already, on the node's first-request credit: it takes its tokens
    /// from the lease like any waiting request, but nobody waits for its decision.
    pub prepaid: bool,
}

/// A waiting request decided: its id, the decision, and for an admission what it took.
pub(crate) type Decided = (u64, Decision, Option<MeshCharge>);

/// How a request went on the holder's slow path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slow {
    /// Decided now.
    Decided(Decision),
    /// Admitted now from the lease: what it took.
    Taken(Decision, MeshCharge),
    /// It waits: ask the authority.
    Waits,
}

impl Holding {
    /// Mark the waiting request `id` admitted already (on the node's credit, see
    /// [`crate::mesh::node::NodeConfig::first_credit`]): it still takes its tokens from the
    /// next grants, but its decision goes nowhere. The holding is kept until `keep_until`.
    pub(crate) fn prepay(&mut self, id: u64, keep_until: Nanos) {
        if let Some(w) = self.waiting.iter_mut().find(|w| w.id == id) {
            w.prepaid = true;
        }
        self.keep_until = self.keep_until.max(keep_until);
    }

    /// Tokens the waiting requests need beyond the reserve.
    pub(crate) fn need(&self) -> u64 {
        let total: u64 = self.waiting.iter().map(|w| w.cost).sum();
        total.saturating_sub(if self.closed { 0 } else { self.reserve })
    }

    /// Serve waiting requests from the reserve, in order (added to `decided`).
    pub(super) fn serve(&mut self, policy: &Policy, now: Nanos, decided: &mut Vec<Decided>) {
        if self.algorithm.counts_per_window() && (self.closed || now >= self.expiry) {
            return;
        }
        // The reserve is the current lease's.
        let charge = self.cell.charge();
        while let Some(w) = self.waiting.front().copied() {
            if w.cost > self.reserve {
                break;
            }
            self.waiting.pop_front();
            self.reserve -= w.cost;
            let remaining = self.reserve + self.cell.remaining();
            if !w.prepaid {
                decided.push((w.id, self.allowed(policy, now, remaining), Some(charge)));
            }
        }
    }

    /// With nobody waiting, the reserve goes back to the cell.
    pub(super) fn settle(&mut self) {
        if self.waiting.is_empty() && self.reserve > 0 {
            if !self.closed {
                self.cell.add(self.reserve);
            }
            self.reserve = 0;
        }
    }

    /// Deny the waiting requests past their deadline at `now` (retry after `retry_after`);
    /// those decided are added to `decided`.
    pub(crate) fn timeouts(
        &mut self,
        policy: &Policy,
        now: Nanos,
        retry_after: Nanos,
        decided: &mut Vec<Decided>,
    ) {
        while let Some(w) = self.waiting.front().copied() {
            if w.deadline > now {
                break;
            }
            self.waiting.pop_front();
            if !w.prepaid {
                decided.push((w.id, self.denied(policy, now, retry_after), None));
            }
            if self.waiting.is_empty() {
                self.asking.withdraw();
            }
        }
        // What the denied held back may serve those behind them.
        self.serve(policy, now, decided);
        self.settle();
    }
}
