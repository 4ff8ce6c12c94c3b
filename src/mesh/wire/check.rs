//! The checks every frame from a peer passes before anything it carries is applied: beyond
//! decoding ([`super::decode`]), each value against the cluster's policies and the
//! protocol's bounds. A frame that fails any check is refused whole, with a typed
//! [`FrameError`] that says what and why.

use crate::mesh::NodeId;
use crate::mesh::lease::MAX_LEASE_TOKENS;
use crate::mesh::locks::MAX_LOCKOUT_NS;
use crate::mesh::message::{
    Ask, AuthorityState, EXT_ASK, EXT_LOCKOUT, EXT_REPLY, EXT_RESET, Ext, Frame, Item, Lockout,
    MAX_ADDR_BYTES, MAX_DEAD_LISTED, MAX_EXT_BODY_BYTES, MAX_MEMBERS_PER_ITEM,
    MAX_POLICIES_ANNOUNCED, Member, PolicyLimits, Reply, Reset, Want,
};
use crate::mesh::wire::{self, WireError};
use crate::policy::{MAX_BUCKET_DEPTH_NS, Policy};

/// The most holder records a state transfer may carry (a key used by every node of the
/// largest cluster).
pub(crate) const MAX_HOLDERS: usize = 1024;

/// The most items one frame may carry.
pub(crate) const MAX_ITEMS: usize = 4096;

/// Why a frame from a peer was refused. Nothing it carried was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The bytes are not a frame.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The sender is not a member.
    #[error("frame from node {0}, which is not a member")]
    UnknownPeer(NodeId),
    /// A value out of range.
    #[error("{what}: {why}")]
    Invalid {
        /// Which field.
        what: &'static str,
        /// What is wrong.
        why: &'static str,
    },
}

fn invalid(what: &'static str, why: &'static str) -> FrameError {
    FrameError::Invalid { what, why }
}

/// Decode and check a frame against the cluster's `policies`.
pub(crate) fn decode(bytes: &[u8], policies: &[Policy]) -> Result<Frame, FrameError> {
    check(wire::decode(bytes)?, policies)
}

/// Check a decoded frame against the cluster's `policies`.
fn check(frame: Frame, policies: &[Policy]) -> Result<Frame, FrameError> {
    if frame.header.incarnation == 0 {
        return Err(invalid("header.incarnation", "is 0"));
    }
    if frame.items.len() > MAX_ITEMS {
        return Err(invalid("items", "too many in one frame"));
    }
    if frame
        .header
        .dead
        .as_ref()
        .is_some_and(|d| d.len() > MAX_DEAD_LISTED)
    {
        return Err(invalid("header.dead", "lists too many members"));
    }
    for item in &frame.items {
        check_item(item, policies)?;
    }
    Ok(frame)
}

fn policy_of(policies: &[Policy], index: u32) -> Result<&Policy, FrameError> {
    policies
        .get(index as usize)
        .ok_or_else(|| invalid("key.policy", "no such mesh policy"))
}

/// The most tokens any count may reach: a bucket's counts grow for ever, but never faster
/// than one token per ns.
const MAX_COUNT: u64 = 1 << 62;

fn check_want(w: &Want, policies: &[Policy]) -> Result<(), FrameError> {
    policy_of(policies, w.key.policy)?;
    if w.tally.granted > MAX_COUNT
        || w.tally.returned > w.tally.granted
        || w.tally.used > w.tally.granted
    {
        return Err(invalid("want", "counts out of range"));
    }
    // A peer's limit may differ from this node's while a change rolls out: bounded by the
    // largest lease any policy allows, not by this node's limit.
    if w.need > MAX_LEASE_TOKENS.saturating_mul(MAX_ITEMS as u64) {
        return Err(invalid("want.need", "larger than any request could need"));
    }
    if w.previous_used.is_some_and(|u| u > MAX_COUNT) {
        return Err(invalid("want.previous_used", "out of range"));
    }
    Ok(())
}

pub(crate) fn check_state(s: &AuthorityState, policies: &[Policy]) -> Result<(), FrameError> {
    policy_of(policies, s.key.policy)?;
    if s.holders.len() > MAX_HOLDERS {
        return Err(invalid("state.holders", "too many"));
    }
    // A bucket's level is at most its depth; the sender's bucket may be deeper than this
    // node's while a change rolls out (the receiver caps it at its own depth).
    if s.level_ns > MAX_BUCKET_DEPTH_NS {
        return Err(invalid("state.level_ns", "above any bucket's depth"));
    }
    for h in &s.holders {
        if h.tally.granted > MAX_COUNT
            || h.tally.returned > h.tally.granted
            || h.tally.used > h.tally.granted
        {
            return Err(invalid("state.holders", "counts out of range"));
        }
    }
    Ok(())
}

fn check_members(members: &[Member]) -> Result<(), FrameError> {
    if members.len() > MAX_MEMBERS_PER_ITEM {
        return Err(invalid("members", "too many in one item"));
    }
    for m in members {
        if m.addr.len() > MAX_ADDR_BYTES {
            return Err(invalid("members.addr", "too long"));
        }
    }
    Ok(())
}

fn check_limits(limits: &[PolicyLimits]) -> Result<(), FrameError> {
    if limits.len() > MAX_POLICIES_ANNOUNCED {
        return Err(invalid("limits", "too many policies"));
    }
    for l in limits {
        if l.capacity == 0 || l.capacity > MAX_LEASE_TOKENS {
            return Err(invalid("limits.capacity", "out of range"));
        }
        if l.interval_ns == 0 || l.window_ns == 0 || l.window_ns > MAX_BUCKET_DEPTH_NS {
            return Err(invalid("limits.window_ns", "out of range"));
        }
    }
    Ok(())
}

fn check_item(item: &Item, policies: &[Policy]) -> Result<(), FrameError> {
    match item {
        Item::Want(w) => check_want(w, policies),
        Item::Grant(g) => {
            policy_of(policies, g.key.policy)?;
            if g.granted > MAX_COUNT {
                return Err(invalid("grant.granted", "out of range"));
            }
            Ok(())
        }
        Item::Recall { key, .. } | Item::NotOwner(key) => {
            policy_of(policies, key.policy).map(|_| ())
        }
        Item::Backup(s) | Item::Handoff(s) | Item::Restore(s) => check_state(s, policies),
        Item::SyncDone => Ok(()),
        Item::Retired => Err(invalid("item", "is retired (never sent)")),
        Item::Members(m) => check_members(m),
        Item::Limits(l) => check_limits(l),
        Item::Ext(ext) => check_ext(ext, policies),
    }
}

/// An extension item: a body within its bound, and, of a kind this build knows, a valid
/// value (a kind it does not know is skipped when applied).
fn check_ext(ext: &Ext, policies: &[Policy]) -> Result<(), FrameError> {
    if ext.body.len() > MAX_EXT_BODY_BYTES {
        return Err(invalid("ext.body", "too long"));
    }
    if ext.kind == EXT_LOCKOUT {
        let lockout: Lockout = wire::decode_ext(ext)?;
        policy_of(policies, lockout.key.policy)?;
        if lockout.left_ns > MAX_LOCKOUT_NS {
            return Err(invalid("lockout.left_ns", "longer than any lockout"));
        }
    }
    if ext.kind == EXT_ASK {
        let _: Ask = wire::decode_ext(ext)?;
    }
    if ext.kind == EXT_REPLY {
        let _: Reply = wire::decode_ext(ext)?;
    }
    if ext.kind == EXT_RESET {
        let reset: Reset = wire::decode_ext(ext)?;
        policy_of(policies, reset.key.policy)?;
        // Resets add up: a window reset n times forgives up to n limits.
        if reset.forgiven > MAX_COUNT {
            return Err(invalid("reset.forgiven", "more than any count"));
        }
    }
    Ok(())
}
