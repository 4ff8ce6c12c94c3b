//! Live changes of the mesh policies, and what nodes do while their configurations differ.
//!
//! [`Node::reconfigure`] (a reload) changes a window's limit, or a bucket's rate and burst,
//! while the node runs; not an algorithm or a window's length, whose counts would not carry
//! over (those need every node restarted). Every header carries the digest of its sender's
//! configuration ([`super::NodeConfig::digest`]: the mesh policies, `key_secret`, `env`). A
//! node that hears a digest other than its own reports the peer ([`Node::config_mismatch`])
//! and sends it its own limits every round ([`Item::Limits`]). The rule while they differ:
//! each policy is enforced with the lowest limit (and the slowest rate) among this node and
//! the live peers that announced theirs. A rollout half done then enforces the lower of the
//! old and new limits, on every node, and never a sum or a mix of the two; a raised limit
//! applies once every live member runs it.

use std::collections::{BTreeMap, HashMap};

use super::{Event, MeshError, Node};
use crate::algorithm::calendar::CalendarWindow;
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::holder::Holding;
use crate::mesh::lease::MAX_LEASE_TOKENS;
use crate::mesh::message::{Item, KeyRef, PolicyLimits};
use crate::mesh::windows::MeshPolicy;
use crate::policy::Policy;

/// The policies a node was given, and its peers' where their configurations differ.
#[derive(Debug, Default)]
pub(super) struct Enforcement {
    /// The policies enforced now: the node's own ([`super::NodeConfig::policies`]) with
    /// the lowest-limit rule applied. The one place they live: the request path's cells
    /// get a copy of each change, the keys' authorities and holdings are handed them.
    enforced: Vec<Policy>,
    /// Each peer's digest as last heard.
    digests: BTreeMap<NodeId, u64>,
    /// The peers whose digest differs from this node's, with the limits they announced.
    differ: BTreeMap<NodeId, Option<Vec<PolicyLimits>>>,
    /// Keys enforced with a limit of their own (the admin API's overrides).
    overrides: HashMap<KeyRef, u64>,
    /// Each policy's calendar, where its windows are calendar periods (fixed while the
    /// nodes run, as a window's length is).
    calendars: Vec<Option<CalendarWindow>>,
}

impl Enforcement {
    pub(super) fn new(own: Vec<Policy>, calendars: Vec<Option<CalendarWindow>>) -> Self {
        Enforcement {
            enforced: own,
            calendars,
            ..Enforcement::default()
        }
    }

    /// The policies enforced now.
    pub(super) fn enforced(&self) -> &[Policy] {
        &self.enforced
    }

    /// The policy `key` is enforced with now: its policy's, or its override's limit
    /// (a window keeps its length, a bucket its time to fill); `None` for a policy the node
    /// does not have.
    pub(super) fn of_key(&self, key: &KeyRef) -> Option<MeshPolicy> {
        let policy = self.of_policy(key.policy)?;
        if self.overrides.is_empty() {
            return Some(policy);
        }
        Some(match self.overrides.get(key) {
            Some(&limit) => policy.with_limit(limit),
            None => policy,
        })
    }

    /// Policy number `index` as enforced now, with its windows.
    pub(super) fn of_policy(&self, index: u32) -> Option<MeshPolicy> {
        let policy = *self.enforced.get(index as usize)?;
        Some(MeshPolicy::new(
            policy,
            self.calendars.get(index as usize).cloned().flatten(),
        ))
    }
}

impl Node {
    /// Enforce `policies` from now on, with `digest` as this node's configuration's: the
    /// same number of policies, each with its algorithm (and window) unchanged; limits, rates
    /// and bursts may change. While a live peer's digest differs, the lowest of each
    /// policy's limits applies (see the module's docs).
    pub fn reconfigure(&mut self, policies: Vec<Policy>, digest: u64) -> Result<(), MeshError> {
        let old = &self.config.policies;
        if policies.len() != old.len() {
            return Err(MeshError::Reconfigure {
                index: policies.len().min(old.len()),
                reason: "the number of mesh policies cannot change while the nodes run: restart them all with the new file",
            });
        }
        for (index, (new, old)) in policies.iter().zip(old).enumerate() {
            if !new.algorithm().is_shared_by_mesh() {
                return Err(MeshError::UnsupportedAlgorithm {
                    index,
                    algorithm: new.algorithm().name(),
                });
            }
            if new.algorithm() != old.algorithm() {
                return Err(MeshError::Reconfigure {
                    index,
                    reason: "its algorithm cannot change while the nodes run (the counts would not carry over): restart them all with the new file",
                });
            }
            if new.algorithm().counts_per_window() && new.window_ns() != old.window_ns() {
                return Err(MeshError::Reconfigure {
                    index,
                    reason: "its window cannot change while the nodes run (the counts would not carry over): restart them all with the new file",
                });
            }
            if new.capacity() > MAX_LEASE_TOKENS {
                return Err(MeshError::LimitTooLarge {
                    index,
                    limit: new.capacity(),
                });
            }
        }
        let before = self.config.digest;
        // Peers that agree with the new configuration agree again.
        let digests = &self.limits.digests;
        let events = &mut self.events;
        self.limits.differ.retain(|&peer, _| {
            let agrees = digests.get(&peer) == Some(&digest);
            if agrees {
                events.push_back(Event::ConfigAgrees(peer));
            }
            !agrees
        });
        // The peers that ran this node's configuration until now differ, and run its old
        // limits: those count at once, before their own announcements arrive.
        if digest != before {
            let old_limits: Vec<PolicyLimits> =
                self.config.policies.iter().map(PolicyLimits::of).collect();
            for (&peer, &d) in digests {
                if d == before && self.membership.is_alive(peer) {
                    self.limits.differ.insert(peer, Some(old_limits.clone()));
                    events.push_back(Event::ConfigDiffers(peer));
                }
            }
        }
        self.config.policies = policies;
        self.config.digest = digest;
        self.membership.set_digest(digest);
        self.apply_limits();
        Ok(())
    }

    /// Return the live peers whose configuration's digest differs from this node's.
    pub fn config_mismatch(&self) -> Vec<NodeId> {
        self.limits
            .differ
            .keys()
            .copied()
            .filter(|&p| self.membership.is_alive(p))
            .collect()
    }

    /// A frame from `from` carried `digest`.
    pub(super) fn heard_digest(&mut self, from: NodeId, digest: u64) {
        self.limits.digests.insert(from, digest);
        if digest == self.config.digest {
            if let Some(announced) = self.limits.differ.remove(&from) {
                self.events.push_back(Event::ConfigAgrees(from));
                if announced.is_some() {
                    self.apply_limits();
                }
            }
        } else if let std::collections::btree_map::Entry::Vacant(entry) =
            self.limits.differ.entry(from)
        {
            entry.insert(None);
            self.events.push_back(Event::ConfigDiffers(from));
            // Told at once, not at the next round: the lower limit applies a round sooner.
            let own = self.config.policies.iter().map(PolicyLimits::of).collect();
            self.outbox.push(from, Item::Limits(own));
        }
    }

    /// Peer `from` announced its limits.
    pub(super) fn on_limits(&mut self, from: NodeId, limits: Vec<PolicyLimits>) {
        if let Some(entry) = self.limits.differ.get_mut(&from)
            && entry.as_ref() != Some(&limits)
        {
            *entry = Some(limits);
            self.apply_limits();
        }
    }

    /// Once a round: forget the peers that died or left, and tell the others whose digest
    /// differs this node's limits.
    pub(super) fn limits_round(&mut self) {
        let membership = &self.membership;
        let events = &mut self.events;
        let before = self.limits.differ.len();
        self.limits.differ.retain(|&p, _| {
            let alive = membership.is_alive(p);
            if !alive {
                events.push_back(Event::ConfigAgrees(p));
            }
            alive
        });
        self.limits
            .digests
            .retain(|&p, _| membership.peer(p).is_some());
        if self.limits.differ.len() != before {
            self.apply_limits();
        }
        if self.limits.differ.is_empty() {
            return;
        }
        let own: Vec<PolicyLimits> = self.config.policies.iter().map(PolicyLimits::of).collect();
        let peers: Vec<NodeId> = self.limits.differ.keys().copied().collect();
        for p in peers {
            self.outbox.push(p, Item::Limits(own.clone()));
        }
    }

    /// Enforce, for each policy, the lowest limit of this node's and the live differing
    /// peers' (those of the same algorithm and window).
    /// Enforce `limit` on `key` of mesh policy `policy` from `now` on, or (`None`) the
    /// policy's own limit again: the key's authority here grants by it (what it counted
    /// stays counted), and its holding asks again. Return whether the node has the policy.
    pub fn set_override(&mut self, now: Nanos, policy: u32, key: u64, limit: Option<u64>) -> bool {
        let key = KeyRef { policy, key };
        let Some(old) = self.limits.of_key(&key) else {
            return false;
        };
        match limit {
            Some(limit) => {
                self.limits
                    .overrides
                    .insert(key, limit.clamp(1, MAX_LEASE_TOKENS));
            }
            None => {
                self.limits.overrides.remove(&key);
            }
        }
        let new = self.enforced(key);
        if new != old {
            if let Some(a) = self.authorities.get_mut(&key) {
                a.limits_changed(&old, &new);
                a.mark_dirty();
            }
            if let Some(h) = self.holdings.get_mut(&key) {
                h.limits_changed();
            }
            self.stats.policy_changes += 1;
            self.serve_waiting(key, now);
        }
        true
    }

    fn apply_limits(&mut self) {
        for index in 0..self.config.policies.len() {
            let own = self.config.policies[index];
            let mut capacity = own.capacity();
            let mut interval = own.interval_ns();
            for (&peer, list) in &self.limits.differ {
                let Some(l) = list.as_ref().and_then(|l| l.get(index)) else {
                    continue;
                };
                if l.comparable(&own) && self.membership.is_alive(peer) {
                    capacity = capacity.min(l.capacity);
                    interval = interval.max(l.interval_ns);
                }
            }
            let enforced = own.with_limits(capacity, interval);
            let old = self.limits.enforced[index];
            if old == enforced {
                continue;
            }
            self.limits.enforced[index] = enforced;
            self.cells.set_policy(index, &enforced);
            let index = index as u32;
            self.authorities
                .limits_changed(index, &old, &enforced, &self.limits.overrides);
            self.holdings.for_each(Some(index), Holding::limits_changed);
            self.stats.policy_changes += 1;
        }
    }
}
