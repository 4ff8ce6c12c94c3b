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

/// Return the 64-bit hash that identifies `key` on the wire: SipHash-1-3 keyed with the
/// cluster's 16-byte secret, so it is the same in every process of the cluster (unlike a
/// `HashMap`'s random state) and clients cannot aim collisions at it without the secret.
pub fn key_hash(cluster_secret: &[u8; 16], key: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut hasher = siphasher::sip::SipHasher13::new_with_key(cluster_secret);
    hasher.write(key);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::key_hash;

    #[test]
    fn key_hashes_are_stable_across_processes_and_keyed() {
        let secret = *b"ratemesh-cluster";
        // A fixed vector: any process of any build computes the same value.
        assert_eq!(
            key_hash(&secret, b"tenant-42"),
            key_hash(&secret, b"tenant-42")
        );
        assert_eq!(key_hash(&secret, b"tenant-42"), 0xa23a_a750_bd8d_7405);
        assert_ne!(
            key_hash(&secret, b"tenant-42"),
            key_hash(&secret, b"tenant-43")
        );
        assert_ne!(
            key_hash(&secret, b"tenant-42"),
            key_hash(b"another-cluster!", b"tenant-42")
        );
    }
}
