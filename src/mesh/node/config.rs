//! A node's configuration and the errors that refuse it.

use crate::algorithm::calendar::{Calendar, CalendarWindow, ParseCalendarError};
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::lease::MAX_LEASE_TOKENS;
use crate::policy::Policy;

/// A node's configuration.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node.
    pub id: NodeId,
    /// The members it starts with; it may include `id`.
    pub seeds: Vec<NodeId>,
    /// The number of members a majority is counted over (at least the seeds and this node;
    /// 0: exactly those).
    pub cluster_size: usize,
    /// The gossip interval in ns (one round).
    pub gossip_interval_ns: Nanos,
    /// Rounds of silence after which a member is declared dead.
    pub dead_after_rounds: u64,
    /// The longest a request waits for its key's owner before it is denied, in ns.
    pub max_wait_ns: Nanos,
    /// The largest datagram, in bytes.
    pub max_datagram_bytes: usize,
    /// Bytes of key items (wants, grants, recalls, backups) the node sends per second at
    /// most, spent round by round, most urgent first; what a round cannot carry waits for
    /// the next (membership news, state transfers and heartbeats are never held back).
    /// `u64::MAX`: no budget.
    pub gossip_budget_bytes_per_s: u64,
    /// The most keys a node holds.
    pub max_keys: usize,
    /// The cluster's global policies, indexed by position (the same list on every node).
    pub policies: Vec<Policy>,
    /// This run's incarnation (0: derived from the clock at start); must change on restart.
    pub incarnation: u64,
    /// The node joins a running cluster: until a member answers it (or, with no configured
    /// member, until `join_timeout_ns` passes and it starts a cluster of its own), it owns
    /// no key and decides by `while_joining`. `false`: it starts as a member of `seeds`.
    pub joins: bool,
    /// How long a joining node with no configured member waits for one to answer before it
    /// starts a cluster of its own.
    pub join_timeout_ns: Nanos,
    /// How a node decides mesh policies before it has joined.
    pub while_joining: WhileJoining,
    /// A digest of the configuration the nodes must share (mesh policies, `key_secret`,
    /// `env`), announced to peers (0: none). Nodes whose digests differ are reported
    /// ([`crate::mesh::node::Node::config_mismatch`]) and enforce the lowest of their limits.
    pub digest: u64,
    /// Tokens a node may admit for a key it holds nothing of (its first request here, or
    /// its first since the node forgot it) without waiting for the key's owner; the owner
    /// is asked for them at once, as for a waiting request. Used only where every live
    /// member doing so at once costs at most a tenth of the limit (`capacity ≥ 10 ×
    /// first_credit × live members`), and by a node at most once per window (a bucket: per
    /// time to fill its burst) per key: the `first` term of `docs/overshoot.md`. 0 (the
    /// default): a first request waits for the owner.
    pub first_credit: u64,
    /// Each policy's lockout in ns (`block_for`, by the policies' index; missing or 0:
    /// none, at most a week): once the key's authority denies a request of a key, it
    /// grants nothing of the key for that long, cluster-wide, and the lockout outlives the
    /// authority's node (its successor keeps it).
    pub lockouts: Vec<Nanos>,
    /// Each window policy's calendar (by the policies' index; missing or `None`: windows
    /// of its length from the UNIX epoch), set by [`NodeConfig::set_calendar`].
    pub(crate) calendars: Vec<Option<CalendarWindow>>,
}

/// How a node decides the mesh policies before it has joined its cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhileJoining {
    /// Its even share of each limit (the limit over the members it expects), decided here.
    #[default]
    LocalShare,
    /// Deny every request (429).
    Deny,
    /// Admit every request.
    Allow,
}

impl WhileJoining {
    /// The name used in files and metrics: `local-share`, `deny`, `allow`.
    pub fn name(self) -> &'static str {
        match self {
            WhileJoining::LocalShare => "local-share",
            WhileJoining::Deny => "deny",
            WhileJoining::Allow => "allow",
        }
    }

    /// Parse a name (see [`WhileJoining::name`]).
    pub fn parse(name: &str) -> Option<WhileJoining> {
        [
            WhileJoining::LocalShare,
            WhileJoining::Deny,
            WhileJoining::Allow,
        ]
        .into_iter()
        .find(|w| w.name() == name)
    }
}

impl NodeConfig {
    /// A configuration with the defaults for `id` among `seeds`.
    pub fn new(id: NodeId, seeds: Vec<NodeId>, policies: Vec<Policy>) -> Self {
        NodeConfig {
            id,
            seeds,
            cluster_size: 0,
            gossip_interval_ns: 20_000_000,
            dead_after_rounds: 10,
            max_wait_ns: 100_000_000,
            max_datagram_bytes: 1150,
            gossip_budget_bytes_per_s: DEFAULT_GOSSIP_BUDGET_BYTES_PER_S,
            max_keys: 1_000_000,
            policies,
            incarnation: 0,
            joins: false,
            join_timeout_ns: 10_000_000_000,
            while_joining: WhileJoining::LocalShare,
            digest: 0,
            first_credit: 0,
            lockouts: Vec::new(),
            calendars: Vec::new(),
        }
    }

    /// Count policy `index`'s windows as calendar periods of `time_zone` (an IANA name such
    /// as `"Europe/Paris"`, or `"UTC"`): `period` is `"day"`, `"week"` (ISO, from Monday),
    /// `"month"` or `"year"`, each from the zone's local midnight to the next period's. The
    /// policy is a fixed or sliding window whose length is the period's nominal one (a day,
    /// 7 days, 31 days, 366 days), as `calendar` in a policy file makes it; every node must
    /// set the same calendars (they are part of the configuration the nodes share).
    pub fn set_calendar(
        &mut self,
        index: usize,
        period: &str,
        time_zone: &str,
    ) -> Result<(), MeshError> {
        let fail = |reason: String| MeshError::Calendar { index, reason };
        let policy = self
            .policies
            .get(index)
            .ok_or_else(|| fail("no such policy".into()))?;
        let calendar: Calendar = period
            .parse()
            .map_err(|e: ParseCalendarError| fail(e.to_string()))?;
        if !policy.algorithm().counts_per_window() {
            return Err(fail(
                "calendar periods are for fixed-window and sliding-window policies".into(),
            ));
        }
        if policy.window_ns() != calendar.nominal_ns() {
            return Err(fail(format!(
                "a calendar {calendar}'s policy has a window of {} ns, got {}",
                calendar.nominal_ns(),
                policy.window_ns()
            )));
        }
        let windows =
            CalendarWindow::from_zone_name(calendar, time_zone).map_err(|e| fail(e.to_string()))?;
        if self.calendars.len() <= index {
            self.calendars.resize(index + 1, None);
        }
        self.calendars[index] = Some(windows);
        Ok(())
    }

    /// Return the tokens a request for a key this node holds nothing of may be admitted
    /// with before the owner answers, under a policy of `capacity` with `live` members
    /// (see [`NodeConfig::first_credit`]); 0: none.
    pub fn credit_for(&self, capacity: u64, live: usize) -> u64 {
        let fleet = self
            .first_credit
            .saturating_mul(10)
            .saturating_mul(live.max(1) as u64);
        if capacity >= fleet {
            self.first_credit
        } else {
            0
        }
    }

    /// Rounds an authority stays valid after the frame its successor last confirmed: one
    /// round less than the silence after which the successor may declare it dead (the
    /// successor heard that frame no earlier than it was sent), so it lapses first. The
    /// round trip plus a round must stay below it, or the owner stalls.
    pub fn authority_lease_rounds(&self) -> u64 {
        self.dead_after_rounds.saturating_sub(1).max(1)
    }

    /// How long a request may wait at its key's owner for room the policy frees by itself
    /// (one gossip interval, within `max_wait_ns`): near the limit, a request that room
    /// reaches that soon is admitted a moment late instead of denied.
    pub fn hold_ns(&self) -> Nanos {
        self.gossip_interval_ns.min(self.max_wait_ns)
    }

    /// Bytes of key items one round may send ([`NodeConfig::gossip_budget_bytes_per_s`]
    /// over a round; at least one datagram's worth).
    pub fn round_budget_bytes(&self) -> usize {
        let per_round = u128::from(self.gossip_budget_bytes_per_s)
            * u128::from(self.gossip_interval_ns)
            / 1_000_000_000;
        usize::try_from(per_round)
            .unwrap_or(usize::MAX)
            .max(self.max_datagram_bytes)
    }
}

/// The default gossip budget: 16 MB/s per node.
pub const DEFAULT_GOSSIP_BUDGET_BYTES_PER_S: u64 = 16_000_000;

/// Why a node could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MeshError {
    /// A policy the mesh cannot share.
    #[error(
        "policy {index}: the mesh shares token buckets, GCRA, fixed and sliding windows, not {algorithm}"
    )]
    UnsupportedAlgorithm {
        /// The policy's index.
        index: usize,
        /// Its algorithm.
        algorithm: &'static str,
    },
    /// A limit above what a lease holds.
    #[error("policy {index}: a mesh limit is at most {MAX_LEASE_TOKENS}, got {limit}")]
    LimitTooLarge {
        /// The policy's index.
        index: usize,
        /// Its limit.
        limit: u64,
    },
    /// A live change of the policies that a running node cannot make.
    #[error("policy {index}: {reason}")]
    Reconfigure {
        /// The policy's index.
        index: usize,
        /// Why.
        reason: &'static str,
    },
    /// A calendar a policy cannot take.
    #[error("policy {index}: calendar: {reason}")]
    Calendar {
        /// The policy's index.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A setting out of range.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
}
