//! A grow-only counter with one entry per node (a G-Counter), compact for few nodes.
//!
//! Merge keeps the maximum of each entry, so merges are commutative, associative and
//! idempotent: duplicated, reordered or lost deltas are harmless, and no message can lower a
//! count. Entries are a vector sorted by node id (clusters have a handful of nodes; a
//! `crdts::GCounter` keeps a `BTreeMap` of at least 192 bytes and reads into a `BigUint`).
//! It implements crdts' [`CvRDT`] (state merge) and [`CmRDT`] (ops: a [`Dot`] carrying a
//! node's absolute count), and the property tests check it against `crdts::GCounter`.

use std::convert::Infallible;

use crdts::{CmRDT, CvRDT, Dot};
use serde::{Deserialize, Serialize};

use crate::mesh::NodeId;

/// One count per node; the total is their sum.
///
/// Decoding (serde or bincode) goes through [`GCounter::from_entries`], so a peer's unsorted
/// or duplicated entries are normalized, never trusted.
///
/// ```
/// use crdts::CvRDT;
/// use ratemesh::mesh::counter::GCounter;
///
/// let mut a = GCounter::new();
/// a.increment(1, 3); // node 1 counted 3
/// let mut b = GCounter::new();
/// b.increment(2, 5); // node 2 counted 5, and heard an older count of node 1
/// b.increment(1, 1);
/// a.merge(b.clone());
/// b.merge(a.clone());
/// assert_eq!(a, b); // merges commute: both converge
/// assert_eq!(a.total(), 8); // node 1's highest count plus node 2's
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, bincode::Encode)]
#[serde(from = "Vec<(NodeId, u64)>")]
pub struct GCounter {
    /// `(node, count)`, sorted by node, no duplicates.
    entries: Vec<(NodeId, u64)>,
}

impl From<Vec<(NodeId, u64)>> for GCounter {
    fn from(entries: Vec<(NodeId, u64)>) -> Self {
        GCounter::from_entries(entries)
    }
}

impl<Context> bincode::Decode<Context> for GCounter {
    fn decode<D: bincode::de::Decoder<Context = Context>>(
        decoder: &mut D,
    ) -> Result<Self, bincode::error::DecodeError> {
        let entries: Vec<(NodeId, u64)> = bincode::Decode::decode(decoder)?;
        Ok(GCounter::from_entries(entries))
    }
}

impl<'de, Context> bincode::BorrowDecode<'de, Context> for GCounter {
    fn borrow_decode<D: bincode::de::BorrowDecoder<'de, Context = Context>>(
        decoder: &mut D,
    ) -> Result<Self, bincode::error::DecodeError> {
        let entries: Vec<(NodeId, u64)> = bincode::BorrowDecode::borrow_decode(decoder)?;
        Ok(GCounter::from_entries(entries))
    }
}

impl GCounter {
    /// Create an empty counter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Build a counter from entries in any order; a node listed twice keeps its maximum and
    /// zero counts are dropped.
    pub fn from_entries(mut entries: Vec<(NodeId, u64)>) -> Self {
        entries.sort_unstable();
        let mut normalized: Vec<(NodeId, u64)> = Vec::with_capacity(entries.len());
        for (node, count) in entries {
            match normalized.last_mut() {
                Some(last) if last.0 == node => last.1 = last.1.max(count),
                _ if count == 0 => {}
                _ => normalized.push((node, count)),
            }
        }
        GCounter {
            entries: normalized,
        }
    }

    /// Return `node`'s count.
    pub fn get(&self, node: NodeId) -> u64 {
        self.entries
            .binary_search_by_key(&node, |&(n, _)| n)
            .map_or(0, |i| self.entries[i].1)
    }

    /// Return the sum of all entries (saturating).
    pub fn total(&self) -> u64 {
        self.entries
            .iter()
            .fold(0u64, |sum, &(_, count)| sum.saturating_add(count))
    }

    /// Return the entries, sorted by node.
    pub fn entries(&self) -> &[(NodeId, u64)] {
        &self.entries
    }

    /// Raise `node`'s entry to at least `count`; return whether it changed.
    pub fn raise(&mut self, node: NodeId, count: u64) -> bool {
        match self.entries.binary_search_by_key(&node, |&(n, _)| n) {
            Ok(i) if self.entries[i].1 >= count => false,
            Ok(i) => {
                self.entries[i].1 = count;
                true
            }
            Err(_) if count == 0 => false,
            Err(i) => {
                self.entries.insert(i, (node, count));
                true
            }
        }
    }

    /// Add `by` to `node`'s own entry and return the op that carries the new absolute count
    /// (re-sending it is harmless).
    pub fn increment(&mut self, node: NodeId, by: u64) -> Dot<NodeId> {
        let count = self.get(node).saturating_add(by);
        self.raise(node, count);
        Dot::new(node, count)
    }
}

impl CvRDT for GCounter {
    type Validation = Infallible;

    fn validate_merge(&self, _other: &Self) -> Result<(), Infallible> {
        Ok(())
    }

    fn merge(&mut self, other: Self) {
        for (node, count) in other.entries {
            self.raise(node, count);
        }
    }
}

impl CmRDT for GCounter {
    type Op = Dot<NodeId>;
    type Validation = Infallible;

    fn validate_op(&self, _op: &Dot<NodeId>) -> Result<(), Infallible> {
        Ok(())
    }

    fn apply(&mut self, op: Dot<NodeId>) {
        self.raise(op.actor, op.counter);
    }
}
