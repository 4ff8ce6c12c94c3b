//! The messages nodes exchange, encoded by [`crate::mesh::wire`] (the only decoder of peer
//! bytes). Keys travel as 64-bit hashes that are stable across processes.

use bincode::{Decode, Encode};

use crate::mesh::NodeId;
use crate::mesh::share::Share;

/// One frame from a peer.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum Frame {
    /// What changed on the sender since the receiver last confirmed (a datagram).
    Delta(Delta),
    /// "Send me everything you know": from a node that starts, restarts or heals.
    SnapshotRequest {
        /// The requester's round.
        round: u64,
    },
    /// One part of a full state (a stream).
    Snapshot(Snapshot),
}

/// The sender's round header: its membership view and how much of the receiver's state it
/// holds.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct RoundHeader {
    /// The sender's round (`floor(its clock / gossip interval)`).
    pub round: u64,
    /// The digest of the sender's membership view in this round.
    pub digest: u64,
    /// The digest in the round before.
    pub previous_digest: u64,
    /// The members the sender knows (itself included).
    pub members: Vec<NodeId>,
    /// The highest round of the receiver whose changes the sender holds completely (0: none).
    pub ack: u64,
}

/// The sender's changes in rounds `since + 1 ..= header.round`, split into parts that each
/// fit a datagram.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct Delta {
    /// Round and membership.
    pub header: RoundHeader,
    /// The receiver's `ack` this delta starts after.
    pub since: u64,
    /// This part's index.
    pub part: u16,
    /// How many parts the round's delta has.
    pub parts: u16,
    /// The changed keys.
    pub keys: Vec<KeyUpdate>,
}

/// The sender's own state for one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub struct KeyUpdate {
    /// The policy's index in the cluster's policy list.
    pub policy: u32,
    /// The key's stable 64-bit hash.
    pub key: u64,
    /// The window the counts are for (a bucket counts per bucket-refill time).
    pub window: u64,
    /// The sender's count in `window`.
    pub current: u64,
    /// The sender's count in `window - 1`.
    pub previous: u64,
    /// The round in which the announced values last changed.
    pub changed: u64,
    /// The announced share and demand since `changed`.
    pub now: Announce,
    /// The values before `changed`.
    pub before: Announce,
}

/// A member's announced share and demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Encode, Decode)]
pub struct Announce {
    /// The share of the key's budget.
    pub share: Share,
    /// Offered cost per round averaged over about 16 rounds, in sixteenths (it decays by
    /// 1/16 per round until announced again).
    pub demand: u32,
    /// Bucket tokens this member gave up with its share in that round, for the claimers of
    /// the round to take over (so a release moves tokens instead of destroying them).
    pub released: u32,
}

/// One part of a full state: the sender's own keys and, for recovery, the counts and share
/// it holds for the receiver.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct Snapshot {
    /// Round and membership.
    pub header: RoundHeader,
    /// This part's index.
    pub part: u16,
    /// How many parts.
    pub parts: u16,
    /// The sender's keys.
    pub keys: Vec<KeyUpdate>,
    /// What the sender knows of the receiver's own state (its counts and its announced
    /// share), so a restarted receiver gets them back.
    pub yours: Vec<KeyUpdate>,
    /// The sender released the receiver's share while it was away (declared dead for
    /// longer than the hold): the receiver must start from a zero share.
    pub you_were_released: bool,
    /// The sender runs (a recovering sender's snapshot does not carry its own state, so it
    /// does not count as one of its rounds).
    pub sender_running: bool,
}
