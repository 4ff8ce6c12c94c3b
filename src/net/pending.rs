//! Reliable frames waiting for a connection to their peer.
//!
//! The node sends state it gives away (a key's authority handed to its owner, a sync
//! answer, a leaving node's last reports) on reliable frames and keeps no copy: such a frame
//! must reach its peer. One that finds no connection to the peer (between a cut and the
//! dial that follows it, say), or whose stream is lost before the peer acknowledged all of
//! it, waits here and goes out on the peer's next connection. What the node merges from
//! these frames merges by maximum, so one that arrives twice counts once. Bounded: at most
//! [`MAX_PENDING_BYTES`] in all, the oldest dropped first (counted); a peer that left or was
//! forgotten takes its frames with it.

use std::collections::{HashMap, VecDeque};

use crate::mesh::NodeId;

/// The most bytes of reliable frames kept waiting, over every peer.
pub(super) const MAX_PENDING_BYTES: usize = 64 << 20;

/// Reliable frames by peer, oldest first.
#[derive(Debug, Default)]
pub(super) struct Pending {
    frames: HashMap<NodeId, VecDeque<Vec<u8>>>,
    bytes: usize,
    /// The order peers' frames were queued in (for dropping the oldest), with stale entries.
    order: VecDeque<NodeId>,
}

impl Pending {
    /// Keep `bytes` for `to`; return how many frames were dropped to make room.
    pub(super) fn push(&mut self, to: NodeId, bytes: Vec<u8>) -> u64 {
        let mut dropped = 0;
        while self.bytes + bytes.len() > MAX_PENDING_BYTES {
            let Some(peer) = self.order.pop_front() else {
                break;
            };
            if let Some(old) = self.frames.get_mut(&peer).and_then(VecDeque::pop_front) {
                self.bytes -= old.len();
                dropped += 1;
            }
            if self.frames.get(&peer).is_some_and(VecDeque::is_empty) {
                self.frames.remove(&peer);
            }
        }
        if bytes.len() > MAX_PENDING_BYTES {
            return dropped + 1;
        }
        self.bytes += bytes.len();
        self.frames.entry(to).or_default().push_back(bytes);
        self.order.push_back(to);
        dropped
    }

    /// Take the frames waiting for `to`, oldest first.
    pub(super) fn take(&mut self, to: NodeId) -> VecDeque<Vec<u8>> {
        let frames = self.frames.remove(&to).unwrap_or_default();
        self.bytes -= frames.iter().map(Vec::len).sum::<usize>();
        self.order.retain(|&p| p != to);
        frames
    }

    /// Drop the frames waiting for `to` (it left the cluster); return how many.
    pub(super) fn forget(&mut self, to: NodeId) -> u64 {
        self.take(to).len() as u64
    }

    /// How many frames wait, over every peer.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.frames.values().map(VecDeque::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_wait_per_peer_in_order_and_the_oldest_go_first_when_full() {
        let mut p = Pending::default();
        assert_eq!(p.push(2, vec![1; 10]), 0);
        assert_eq!(p.push(3, vec![2; 10]), 0);
        assert_eq!(p.push(2, vec![3; 10]), 0);
        assert_eq!(p.len(), 3);
        let two: Vec<Vec<u8>> = p.take(2).into();
        assert_eq!(two, vec![vec![1; 10], vec![3; 10]]);
        assert_eq!(p.len(), 1);
        assert_eq!(p.forget(3), 1);
        assert_eq!((p.len(), p.bytes), (0, 0));

        let half = MAX_PENDING_BYTES / 2;
        assert_eq!(p.push(2, vec![0; half]), 0);
        assert_eq!(p.push(3, vec![0; half]), 0);
        // A third half-sized frame pushes out the oldest (peer 2's).
        assert_eq!(p.push(4, vec![0; half]), 1);
        assert!(p.take(2).is_empty());
        assert_eq!(p.take(3).len(), 1);
        assert_eq!(p.take(4).len(), 1);
        assert_eq!(p.bytes, 0);
        // A frame larger than the whole bound is dropped itself.
        assert_eq!(p.push(5, vec![0; MAX_PENDING_BYTES + 1]), 1);
        assert_eq!(p.len(), 0);
    }
}
