//! The messages nodes exchange, encoded by [`crate::mesh::wire`] (the only decoder of peer
//! bytes). Keys travel as 64-bit hashes that are stable across processes.
//!
//! Every frame starts with a [`Header`] that carries the sender's clock and echoes the last
//! frame it received from the receiver, so every exchange doubles as a clock-offset sample
//! (`mesh::timing`) and as proof that the sender still hears the receiver (the authority
//! lease of `mesh::node`). Counts are cumulative (granted, returned, used), so a duplicated,
//! reordered or lost item is harmless: the receiver keeps the largest value it saw.

use bincode::{Decode, Encode};

use crate::mesh::NodeId;
use crate::mesh::tally::Tally;
use crate::policy::{Algorithm, Policy};

/// One frame from a peer.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Frame {
    /// Who sends, when, and what it heard of the receiver.
    pub(crate) header: Header,
    /// What the frame carries (none: a heartbeat).
    pub(crate) items: Vec<Item>,
}

/// The sender's identity and clock, and what it last heard from the receiver.
#[derive(Debug, Clone, PartialEq, Eq, Default, Encode, Decode)]
pub(crate) struct Header {
    /// The sender's incarnation (chosen at start): a new value means it restarted and lost
    /// its state.
    pub(crate) incarnation: u64,
    /// The receiver's incarnation as the sender knows it (0: not known yet). Grants and
    /// recalls in a frame addressed to an earlier run of the receiver are about that run's
    /// leases, not this one's: the receiver drops them.
    pub(crate) to_incarnation: u64,
    /// The sender's clock when it sent this frame, in ns.
    pub(crate) sent_at: u64,
    /// The `sent_at` of the newest frame the sender received from the receiver (0: none).
    pub(crate) echo: u64,
    /// Nanoseconds the sender held that frame before sending this one.
    pub(crate) held: u64,
    /// How many times the sender declared the receiver dead (the receiver learns from it that
    /// its authorities may have been taken over).
    pub(crate) your_deaths: u32,
    /// The sender is starting and asks for everything the receiver holds that it should hold
    /// itself (authorities it owns, backups it keeps).
    pub(crate) syncing: bool,
    /// The sender is leaving the cluster for good (a drain): drop it from the membership now.
    pub(crate) leaving: bool,
    /// The members the sender counts as dead (at most [`MAX_DEAD_LISTED`], sorted); `None`
    /// when it counts more. A key's owner grants only while its successor's view, so told,
    /// names it the owner too.
    pub(crate) dead: Option<Vec<u64>>,
    /// A digest of the sender's mesh policies, `key_secret` and `env`. A
    /// receiver whose own differs reports the mismatch, and each tells the other its limits
    /// ([`Item::Limits`]) so that the lowest of each policy's limits applies while they differ.
    pub(crate) digest: u64,
    /// How far behind the sender itself runs (its lag score, 0 to 8): a receiver waits half
    /// of `dead_after` longer per point before it declares the sender dead.
    pub(crate) lag: u8,
}

/// The most dead members a header lists (beyond, it lists none and says so).
pub(crate) const MAX_DEAD_LISTED: usize = 32;

/// One thing a frame carries, about one key of one mesh policy.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) enum Item {
    /// From a node that uses the key to the key's authority: its lease and what it needs.
    Want(Want),
    /// From the authority: the lease granted to the receiver (or a denial).
    Grant(Grant),
    /// From the authority: please give back what your lease holds beyond `keep` tokens
    /// (requests wait for them), and report.
    Recall {
        /// The key.
        key: KeyRef,
        /// Tokens the holder may keep.
        keep: u64,
    },
    /// From the authority to its successor: the key's whole state, to take over if it dies.
    Backup(AuthorityState),
    /// The key's authority moves to the receiver (it owns the key now).
    Handoff(AuthorityState),
    /// To a node that restarted: the backup of an authority it kept before (its times are on
    /// the receiver's own clock).
    Restore(AuthorityState),
    /// The receiver asked the sender about a key the sender is not the authority for.
    NotOwner(KeyRef),
    /// The sender finished answering a `syncing` header: everything it held for the receiver
    /// was in this frame or an earlier one.
    SyncDone,
    /// Never sent. It keeps the number of the items after it: an item's number is its
    /// place in this list, so an item is never taken out of it, only retired.
    Retired,
    /// What the sender knows of some members (at most [`MAX_MEMBERS_PER_ITEM`]): its whole
    /// list when a peer starts or now and then, and news (a member came, is suspected,
    /// refuted a suspicion, left) as it learns them.
    Members(Vec<Member>),
    /// The sender's own mesh policies, in their order, sent while its configuration digest
    /// differs from the receiver's (at most [`MAX_POLICIES_ANNOUNCED`]).
    Limits(Vec<PolicyLimits>),
    /// An item of a kind added after wire version 8 ([`Ext`]). A node of that version
    /// refuses a whole frame that carries one, so these travel in frames of their own
    /// ([`crate::mesh::outbox`]); a later build's kinds that this one does not know are
    /// skipped.
    Ext(Ext),
}

/// An extension item: its kind, and its body (bincode of the kind's type, at most
/// [`MAX_EXT_BODY_BYTES`]).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Ext {
    /// What the body is ([`EXT_LOCKOUT`]; others are skipped).
    pub(crate) kind: u32,
    /// The body.
    pub(crate) body: Vec<u8>,
}

/// The largest body an [`Ext`] may carry.
pub(crate) const MAX_EXT_BODY_BYTES: usize = 16 * 1024;

/// [`Ext::kind`] of a [`Lockout`].
pub(crate) const EXT_LOCKOUT: u32 = 1;

/// A key locked out by its policy (`block_for`): from a key's authority to its successor
/// or its next owner, so that the lockout outlives the authority's node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Lockout {
    /// The key.
    pub(crate) key: KeyRef,
    /// Nanoseconds the lockout still lasts when the item is made.
    pub(crate) left_ns: u64,
}

/// [`Ext::kind`] of an [`Ask`].
pub(crate) const EXT_ASK: u32 = 2;

/// [`Ext::kind`] of a [`Reply`].
pub(crate) const EXT_REPLY: u32 = 3;

/// [`Ext::kind`] of a [`Reset`].
pub(crate) const EXT_RESET: u32 = 4;

/// A question from one node to another (the admin API's calls that span the cluster): a
/// kind the mesh answers itself (a key's state or reset, from its owner) or one it hands
/// to the program that embeds it ([`crate::mesh::AdminMessage`]).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Ask {
    /// The asker's number for it, which the reply names.
    pub(crate) id: u64,
    /// What is asked ([`crate::mesh::ASK_KEY`], [`crate::mesh::ASK_RESET`], or a kind of
    /// the embedding program's from [`crate::mesh::ASK_APP`] on).
    pub(crate) kind: u32,
    /// The question.
    pub(crate) body: Vec<u8>,
}

/// The answer to an [`Ask`].
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Reply {
    /// The [`Ask::id`] answered.
    pub(crate) id: u64,
    /// The answer (empty: the question was not understood).
    pub(crate) body: Vec<u8>,
}

/// A key reset by its authority (the admin API): from the authority to its successor, so
/// that the successor drops the key's lockout and, should it take the key over in the same
/// window, forgives what the reset forgave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Reset {
    /// The key.
    pub(crate) key: KeyRef,
    /// The window the reset was in (0 for buckets).
    pub(crate) window: u64,
    /// Tokens of that window the reset forgave.
    pub(crate) forgiven: u64,
}

/// The most policies one [`Item::Limits`] lists.
pub(crate) const MAX_POLICIES_ANNOUNCED: usize = 256;

/// One mesh policy as a sender enforces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub(crate) struct PolicyLimits {
    /// The algorithm (`1` token bucket, `2` GCRA, `3` fixed window, `4` sliding window).
    pub(crate) algorithm: u8,
    /// The limit of a window, the burst of a bucket.
    pub(crate) capacity: u64,
    /// Nanoseconds per token (a bucket's rate).
    pub(crate) interval_ns: u64,
    /// The window, or a bucket's time to refill from empty.
    pub(crate) window_ns: u64,
}

impl PolicyLimits {
    /// `policy`'s limits as a node announces them.
    pub(crate) fn of(policy: &Policy) -> Self {
        PolicyLimits {
            algorithm: algorithm_code(policy.algorithm()),
            capacity: policy.capacity(),
            interval_ns: policy.interval_ns(),
            window_ns: policy.window_ns(),
        }
    }

    /// Tell whether these limits are of `policy`'s algorithm (and, for a window, of its
    /// window), so that the lower of the two may apply.
    pub(crate) fn comparable(&self, policy: &Policy) -> bool {
        self.algorithm == algorithm_code(policy.algorithm())
            && (!policy.algorithm().counts_per_window() || self.window_ns == policy.window_ns())
    }
}

/// How [`PolicyLimits`] writes an [`Algorithm`] on the wire (0: one the mesh does not share).
fn algorithm_code(algorithm: Algorithm) -> u8 {
    match algorithm {
        Algorithm::TokenBucket => 1,
        Algorithm::Gcra => 2,
        Algorithm::FixedWindow => 3,
        Algorithm::SlidingWindow => 4,
        _ => 0,
    }
}

/// The most members one [`Item::Members`] lists.
pub(crate) const MAX_MEMBERS_PER_ITEM: usize = 32;

/// The longest contact address a [`Member`] carries, in bytes.
pub(crate) const MAX_ADDR_BYTES: usize = 64;

/// One member as the sender knows it.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Member {
    /// Its id (from its certificate).
    pub(crate) id: u64,
    /// Its incarnation (0: the sender has not heard it yet).
    pub(crate) incarnation: u64,
    /// Its liveness counter within the incarnation: a member that hears it is suspected
    /// refutes with a higher one.
    pub(crate) seq: u32,
    /// What the sender thinks of it.
    pub(crate) state: MemberState,
    /// Where the sender reaches it (a socket address as text; empty: unknown). Opaque to the
    /// mesh; at most [`MAX_ADDR_BYTES`].
    pub(crate) addr: Vec<u8>,
}

/// A member's state as a sender tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub(crate) enum MemberState {
    /// Heard recently.
    Alive,
    /// Silent for a while: it should refute if it is alive.
    Suspect,
    /// Declared dead by the sender.
    Dead,
    /// It left the cluster (a drain).
    Left,
}

/// A key of a mesh policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Encode, Decode)]
pub(crate) struct KeyRef {
    /// The policy's index in the cluster's policy list.
    pub(crate) policy: u32,
    /// The key's stable 64-bit hash.
    pub(crate) key: u64,
}

/// A holder's lease as it stands, with what it asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Want {
    /// The key.
    pub(crate) key: KeyRef,
    /// The window the counts are for (windows; 0 for buckets and before any grant).
    pub(crate) window: u64,
    /// What the sender was granted, gave back and admitted for `window` so far.
    pub(crate) tally: Tally,
    /// The lease of `window` ended: `used` is the sender's final count of that window.
    pub(crate) closed: bool,
    /// Tokens the sender needs now for requests that wait.
    pub(crate) need: u64,
    /// The cost of the cheapest request that waits (what a denial's retry time is for).
    pub(crate) smallest: u64,
    /// Numbers the sender's wants; a grant says which one it answers.
    pub(crate) seq: u32,
    /// The sender would like a longer lease (its lease runs low); with `need` 0 and this
    /// false, the item is a report only.
    pub(crate) refill: bool,
    /// The sender's demand: cost offered per gossip round, in sixteenths.
    pub(crate) demand: u32,
    /// Nanoseconds, on the sender's clock, between its last admission counted in `used`
    /// and this want (at least; 0 when not known). A bucket's authority learns from it that
    /// those tokens were spent at least that long before the want arrived, and refills from
    /// then on what it held back for them.
    pub(crate) spent_ago: u64,
    /// The sender's final count of the window before `window` (windows), until the
    /// authority has it.
    pub(crate) previous_used: Option<u64>,
    /// Which of the sender's holdings of the key the counts are for: a holding forgotten
    /// while idle and made again later starts its counts afresh, under a larger number.
    pub(crate) holding: u64,
}

/// The authority's answer to a holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Grant {
    /// The key.
    pub(crate) key: KeyRef,
    /// The window the lease is for (windows; 0 for buckets).
    pub(crate) window: u64,
    /// Tokens granted to the receiver for `window` so far (cumulative).
    pub(crate) granted: u64,
    /// When `window` ends on the authority's clock, in ns (windows; 0 for buckets).
    pub(crate) ends_at: u64,
    /// Not 0: what the receiver needs cannot be had now; requests that do not fit are denied
    /// and may be retried after this many ns.
    pub(crate) retry_after: u64,
    /// Tokens the authority is recalling from other holders for the receiver: waiting
    /// requests that fit in them keep waiting (the others are denied when `retry_after` is
    /// set).
    pub(crate) more_coming: u64,
    /// The newest want of the receiver's the authority had seen (a denial answering an
    /// older one, duplicated or delayed, is ignored).
    pub(crate) answers: u32,
    /// The receiver's holding the counts are for (see [`Want::holding`]): another holding's
    /// grant is ignored.
    pub(crate) holding: u64,
}

/// The per-holder record of an authority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub(crate) struct HolderRecord {
    /// The holder.
    pub(crate) node: NodeId,
    /// The holder's incarnation when the record was made.
    pub(crate) incarnation: u64,
    /// The holder's holding the counts are for ([`Want::holding`]).
    pub(crate) holding: u64,
    /// What the holding was granted, gave back and reported used in the current window.
    pub(crate) tally: Tally,
    /// Demand in sixteenths of a token per round.
    pub(crate) demand: u32,
    /// What the holder held in the previous window (granted − returned), for the sliding
    /// window's previous count.
    pub(crate) previous_held: u64,
    /// Whether `previous_held` is the holder's final count (reported) or only an upper bound.
    pub(crate) previous_final: bool,
    /// Whether `used` is the holder's final count of the current window (its lease ended).
    pub(crate) closed: bool,
}

/// Everything an authority knows about one key: enough for another node to carry on.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct AuthorityState {
    /// The key.
    pub(crate) key: KeyRef,
    /// Increases with every change: a receiver ignores an older state than it has.
    pub(crate) version: u64,
    /// The current window's index (windows).
    pub(crate) window: u64,
    /// When the current window ends, on the sender's clock (windows): the sender grants
    /// nothing of it from then on.
    pub(crate) ends_at: u64,
    /// When the next window begins, on the sender's clock (windows): no earlier than
    /// `ends_at`, later by the sender's own uncertainty about the owner it took the window
    /// from.
    pub(crate) next_at: u64,
    /// The previous window's count (windows; sliding window), an upper bound.
    pub(crate) previous: u64,
    /// The bucket's free tokens, in ns of refill (buckets).
    pub(crate) level_ns: u64,
    /// When `level_ns` was measured, on the sender's clock (buckets).
    pub(crate) level_at: u64,
    /// The holders' records.
    pub(crate) holders: Vec<HolderRecord>,
}
