//! The mesh: how gateway nodes enforce one global limit per key without a central store.
//!
//! Sans-IO throughout (no sockets, no clock): [`node::Node`] is the per-node state machine
//! (rounds, budget shares, membership, deltas and snapshots), [`cell::MeshCell`] the per-key
//! atomic cell a request decides on, [`share`] the pure share arithmetic, [`counter`] the
//! per-node G-Counter the gossip merges, [`message`] the frames, and [`wire`] the only
//! place that parses bytes from peers. `docs/overshoot.md` states and proves the bound.

pub mod cell;
pub mod counter;
pub mod message;
pub mod node;
pub mod share;
pub mod wire;

pub use node::{Admission, Event, FrameError, MeshError, Node, NodeConfig, NodeStats, Transmit};

/// A node's identity in the cluster (from its certificate in the QUIC driver).
pub type NodeId = u64;
