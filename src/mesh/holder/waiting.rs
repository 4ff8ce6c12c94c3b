//! A request on a holding's slow path: one that waits for tokens, and how each went.

use crate::clock::Nanos;
use crate::decision::{Decision, MeshCharge};

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
