//! The mesh: how gateway nodes enforce one global limit per key without a central store.
//!
//! Every key has one *authority*, kept by the key's owner (rendezvous hashing over the live
//! members) and backed up on its successor. The authority runs the policy's algorithm for
//! the whole cluster and leases tokens to the nodes that use the key; a node admits locally
//! from its lease (one compare-and-swap), and asks for more when it runs short. So the
//! cluster never admits more than the authority granted, and a node under its limit only
//! ever waits for its owner, never gets denied because the limit is shared.
//! `docs/overshoot.md` states the bound and its proof.
//!
//! Sans-IO throughout (no sockets, no clock): [`node::Node`] is the per-node state machine,
//! made of [`membership`] (liveness, ownership, headers), [`timing`] (peers' clock offsets),
//! [`holder`] (a key's lease and waiting requests on one node), [`authority`] (a key's
//! budget), [`lease`] (the atomic cell the request path decides on), [`cells`] (the map of
//! cells shared with the request path), [`keymap`] (the hasher of the node's maps),
//! [`outbox`] (frames, and the checks on incoming ones), [`message`] (what travels), [`wire`] (the only parser of peer bytes) and
//! [`baseline`] (the rules the simulator compares with).

pub mod authority;
pub mod baseline;
pub mod cells;
pub mod counter;
pub mod holder;
pub mod keymap;
pub mod lease;
pub mod membership;
pub mod message;
pub mod node;
pub mod outbox;
pub mod timing;
pub mod wire;

pub use authority::MeshKind;
pub use baseline::Admission;
pub use cells::Cells;
pub use node::{Admit, Event, MeshError, Node, NodeConfig, NodeStats};
pub use outbox::{FrameError, Transmit};

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
