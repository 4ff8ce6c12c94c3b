//! Seeds: where a node finds its cluster without knowing its members' ids. A seed is a
//! socket address (`"10.0.0.7:7000"`) or a DNS name with a port (`"ratemesh.ns.svc:7000"`,
//! a Kubernetes headless service); every A and AAAA record of a name is a seed. The names
//! are resolved at start and again every refresh interval (every second while the node has
//! not joined), and every address that is not a connected peer's is dialed under
//! [`crate::net::tls::SEED_NAME`]: the node there says who it is with its certificate.
//!
//! An address whose certificate names this node is this node's own, and is not dialed again.
//! When every seed resolved and each address is this node's own (or there is none), the node
//! is the first of its cluster and starts it at once, instead of waiting for the join
//! timeout.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::net::dial::{DialState, Failure};
use crate::net::{Input, NetShared};

/// While the node has not joined, the seeds are resolved (and dialed) this often.
pub(crate) const JOINING_RETRY: Duration = Duration::from_secs(1);

/// The most seed addresses a node dials (names that resolve to more are cut there).
pub(crate) const MAX_SEED_ADDRESSES: usize = 256;

/// Resolve `seeds` now; return the addresses (sorted, without duplicates) and whether every
/// seed resolved.
pub(crate) async fn resolve(seeds: &[String]) -> (Vec<SocketAddr>, bool) {
    let mut out = Vec::new();
    let mut complete = true;
    for seed in seeds {
        if let Ok(addr) = seed.parse::<SocketAddr>() {
            out.push(addr);
            continue;
        }
        match tokio::net::lookup_host(seed.as_str()).await {
            Ok(addrs) => out.extend(addrs),
            Err(error) => {
                complete = false;
                tracing::debug!(seed, %error, "seed does not resolve");
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out.truncate(MAX_SEED_ADDRESSES);
    (out, complete)
}

/// Resolve `seeds` every `refresh` (every [`JOINING_RETRY`] while the node joins) and hand
/// the addresses to the driver, until the node closes.
pub(crate) async fn resolve_loop(
    seeds: Vec<String>,
    refresh: Duration,
    inputs: mpsc::UnboundedSender<Input>,
    shared: Arc<NetShared>,
) {
    loop {
        let (addrs, complete) = resolve(&seeds).await;
        if inputs.send(Input::Seeds { addrs, complete }).is_err() {
            return;
        }
        let joined = shared.cells.is_joined();
        let wait = if joined {
            refresh
        } else {
            refresh.min(JOINING_RETRY)
        };
        tokio::time::sleep(wait).await;
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
    }
}

/// What the driver knows of the seed addresses.
#[derive(Debug, Default)]
pub(crate) struct SeedBook {
    /// The addresses of the latest resolution.
    latest: Vec<SocketAddr>,
    /// Whether every seed resolved then.
    complete: bool,
    /// Addresses that turned out to be this node's own.
    selves: HashSet<SocketAddr>,
    /// Addresses being dialed.
    dialing: HashSet<SocketAddr>,
    /// Failures per address, for the log.
    failures: HashMap<SocketAddr, DialState>,
}

impl SeedBook {
    /// Take in a resolution; return the addresses to dial: not this node's, not being
    /// dialed, and for which `known` (a connected peer's address) says no.
    pub(crate) fn resolved(
        &mut self,
        addrs: Vec<SocketAddr>,
        complete: bool,
        known: impl Fn(SocketAddr) -> bool,
    ) -> Vec<SocketAddr> {
        self.latest = addrs;
        self.complete = complete;
        let to_dial: Vec<SocketAddr> = self
            .latest
            .iter()
            .copied()
            .filter(|a| !self.selves.contains(a) && !self.dialing.contains(a) && !known(*a))
            .collect();
        self.dialing.extend(to_dial.iter().copied());
        to_dial
    }

    /// Return the number of members the seeds stand for: the addresses not this node's,
    /// and this node.
    pub(crate) fn expected_members(&self) -> usize {
        1 + self
            .latest
            .iter()
            .filter(|a| !self.selves.contains(a))
            .count()
    }

    /// Tell whether every seed resolved and every address is this node's own (or there
    /// is none): the node is the first of its cluster.
    pub(crate) fn only_self(&self) -> bool {
        self.complete && self.latest.iter().all(|a| self.selves.contains(a))
    }

    /// A dial of `addr` reached this node itself.
    pub(crate) fn is_self(&mut self, addr: SocketAddr) {
        self.dialing.remove(&addr);
        self.selves.insert(addr);
    }

    /// A dial of `addr` reached a member.
    pub(crate) fn reached(&mut self, addr: SocketAddr) {
        self.dialing.remove(&addr);
        if let Some(state) = self.failures.get_mut(&addr)
            && state.failures > 0
        {
            let failures = state.reached();
            tracing::info!(%addr, failures, "reached the seed");
        }
    }

    /// A dial of `addr` failed (it is tried again at the next resolution); log it when due.
    pub(crate) fn failed(&mut self, addr: SocketAddr, kind: Failure, reason: &str) {
        self.dialing.remove(&addr);
        let state = self.failures.entry(addr).or_default();
        let (_, log) = state.failed(kind, Instant::now());
        if log {
            tracing::warn!(
                %addr,
                attempts = state.failures,
                "cannot reach seed {addr}: {reason} (tried again at each resolution; logged \
                 again if the reason changes, then once a minute)"
            );
        }
    }
}
