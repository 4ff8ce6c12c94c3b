//! The mesh: what nodes share so that a cluster enforces one limit per key.
//!
//! This module is sans-IO (no sockets, no clock). So far it holds the two pieces every later
//! part stands on: [`counter::GCounter`], the per-node grow-only counter that the gossip
//! merges, and [`wire`], the only place that parses bytes from peers. The gossip state
//! machine, budget shares and the simulator are the open part of the mesh issue.

pub mod counter;
pub mod wire;

/// A node's identity in the cluster (from its certificate in the QUIC driver).
pub type NodeId = u64;
