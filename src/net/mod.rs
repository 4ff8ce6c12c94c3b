//! The QUIC transport: a tokio + quinn driver that owns one [`Node`] and carries its frames
//! to and from the peers, with mutual TLS (see [`tls`]).
//!
//! One UDP endpoint per node both accepts and dials. Deltas travel as unreliable QUIC
//! datagrams (the node keeps them under 1150 bytes); snapshots, and anything a datagram
//! cannot carry, on a unidirectional stream per frame, read with the frame size limit.
//! Keep-alives and an idle timeout notice a dead peer; a lost connection is dialed again
//! with backoff ([`dial`]: the reason of a failure is logged once per peer and backoff step,
//! not per attempt). A peer's node id comes from its certificate: any peer whose certificate
//! the cluster CA signed for one node name is a member (a new one is added to the node, which
//! tells the others; a member the node learns of that way is dialed at the address it was
//! told). A peer whose certificate the CA did not sign, or that names no node, is refused and
//! counted, and so is anything else on the peer port that is not a member's handshake
//! ([`accept`]), quietly. Seeds ([`seeds`]: addresses or DNS names, re-resolved) are dialed
//! to find the cluster; the node there says who it is with its certificate.
//! A peer is *up* ([`MeshNet::peers_up`]) while it is a live member and this node has a
//! connection to it whose handshake completed on both sides, shown by a frame heard from it
//! within [`PEER_UP_WITHIN`].
//!
//! The request path ([`MeshNet::decide`]) takes no lock while the node's lease of the key
//! covers the request: one map read and the lease's compare-and-swap ([`Cells::decide`]).
//! Otherwise (a key's first request on the node, or a lease too short) the request goes on
//! a bounded queue to the driver, which takes it to the node with the others queued (one
//! lock of the node per batch, taken by the driver alone) and answers it, at once or once
//! the key's owner answered. When the queue is full (the node cannot introduce keys as
//! fast as they come), the request is decided by this node's share alone
//! ([`Cells::overflow_decide`]) and counted ([`NetStats::shed`]). The driver runs the
//! node's rounds before anything queued, so a backlog of requests or frames does not hold
//! back the frames its peers hear it by.

pub mod accept;
pub mod certs;
pub mod dial;
pub mod seeds;
pub mod tls;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::backend::mesh::MeshDecision;
use crate::clock::{Clock, SystemClock};
use crate::decision::Decision;
use crate::mesh::node::{Admit, Event, MeshError, Node, NodeConfig};
use crate::mesh::wire::MAX_FRAME_BYTES;
use crate::mesh::{Cells, NodeId, Transmit};
use crate::net::accept::Refusals;
use crate::net::dial::{DialState, Failure};
use crate::net::seeds::SeedBook;
use crate::net::tls::{NodeTls, SEED_NAME, peer_id};

/// A connected peer counts as up while a frame from it arrived within this time.
pub const PEER_UP_WITHIN: Duration = Duration::from_secs(3);

/// The most requests queued for the driver (keys' first requests, leases too short); beyond
/// them a request is decided by the node's share alone.
pub const INTRO_QUEUE: usize = 4096;

/// The most queued requests the driver takes to the node under one lock.
const INTRO_BATCH: usize = 256;

/// The most queued frames the driver hears before it flushes what they caused.
const INPUT_BATCH: usize = 64;

/// Why the transport could not start.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The mesh configuration is invalid.
    #[error(transparent)]
    Mesh(#[from] MeshError),
    /// The UDP endpoint could not be opened.
    #[error("opening the QUIC endpoint on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A node's transport settings.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// The mesh node (its id, members, policies, gossip interval).
    pub node: NodeConfig,
    /// The UDP address to listen on (port 0: any).
    pub listen: SocketAddr,
    /// The peers' addresses, by node id (more can be added with [`MeshNet::add_peer`]).
    pub peers: Vec<(NodeId, SocketAddr)>,
    /// This node's TLS configurations.
    pub tls: NodeTls,
}

/// Default transport parameters: keep-alive every second, a peer silent for 5 s is gone.
pub fn transport_config() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(Duration::from_secs(1)));
    t.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(Duration::from_secs(5)).expect("5 s is a valid timeout"),
    ));
    Arc::new(t)
}

/// Counters of the transport.
#[derive(Debug, Default)]
pub struct NetStats {
    /// Connections whose handshake failed or whose certificate names no member.
    pub refused: AtomicU64,
    /// Frames the node refused (malformed, out of range).
    pub frames_dropped: AtomicU64,
    /// Frames received.
    pub frames_received: AtomicU64,
    /// Datagrams sent.
    pub datagrams_sent: AtomicU64,
    /// Streams (snapshots) sent.
    pub streams_sent: AtomicU64,
    /// Bytes sent.
    pub bytes_sent: AtomicU64,
    /// Frames for a peer with no connection (dropped; the gossip catches up).
    pub unroutable: AtomicU64,
    /// Failed attempts to reach a peer (dial errors, and connections the peer closed
    /// before it sent anything).
    pub dial_failures: AtomicU64,
    /// Requests decided by the node's share alone because the driver's queue was full, or
    /// they waited in it longer than the node's `max_wait`.
    pub shed: AtomicU64,
    /// Requests for new keys while the node holds `max_keys`, decided by its share alone
    /// (the node counts those it meets itself in its own stats).
    pub overflow: AtomicU64,
}

/// A request the lease could not decide, on its way to the node.
struct Intro {
    policy: u32,
    key: u64,
    cost: u64,
    /// When the request came (the node's clock).
    at: u64,
    answer: tokio::sync::oneshot::Sender<Decision>,
}

struct Inner {
    node: Node,
    /// Requests waiting for their key's owner, by the id the node gave them.
    waiters: HashMap<u64, tokio::sync::oneshot::Sender<Decision>>,
    /// Peers with a connection whose handshake completed on this side.
    connected: HashSet<NodeId>,
    /// When a frame last arrived from each peer.
    heard: HashMap<NodeId, Instant>,
}

pub(crate) struct Shared {
    inner: Mutex<Inner>,
    /// The lease cells (the request path's read handle).
    cells: Arc<Cells>,
    /// Wakes the driver when the request path gave the node something to send.
    wake: tokio::sync::Notify,
    running: AtomicBool,
    /// The node has joined its cluster.
    joined: AtomicBool,
    closed: AtomicBool,
    clock: SystemClock,
    stats: NetStats,
    /// Handshakes refused on the peer port, by reason.
    refusals: Refusals,
    /// Requests for the driver to take to the node.
    intros: mpsc::Sender<Intro>,
    /// The configured members (the share of a request decided alone), as of the last flush.
    members: std::sync::atomic::AtomicUsize,
    /// The node's key cap and longest wait (fixed at start).
    max_keys: usize,
    max_wait_ns: u64,
}

impl Shared {
    /// Decide a request by this node's share alone, counted as shed.
    fn shed(&self, policy: u32, key: u64, cost: u64, now: u64) -> Decision {
        self.stats.shed.fetch_add(1, Ordering::Relaxed);
        let members = self.members.load(Ordering::Relaxed);
        self.cells
            .overflow_decide(policy, key, cost, now, members, self.max_keys)
    }
}

pub(crate) enum Input {
    Frame(NodeId, Vec<u8>),
    Connected(NodeId, quinn::Connection),
    Dialed(NodeId, Result<quinn::Connection, (Failure, String)>),
    Closed(NodeId, usize),
    AddPeer(NodeId, SocketAddr),
    /// The seeds' addresses, and whether every seed resolved.
    Seeds {
        addrs: Vec<SocketAddr>,
        complete: bool,
    },
    /// A seed address dialed: the member there (by its certificate) and the connection.
    SeedDialed(
        SocketAddr,
        Result<(NodeId, quinn::Connection), (Failure, String)>,
    ),
}

/// A running mesh node with its QUIC transport.
pub struct MeshNet {
    shared: Arc<Shared>,
    inputs: mpsc::UnboundedSender<Input>,
    endpoint: quinn::Endpoint,
    driver: tokio::task::JoinHandle<()>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl MeshNet {
    /// Open the endpoint, start the driver and dial the peers. Needs a tokio runtime.
    pub async fn start(config: NetConfig) -> Result<MeshNet, NetError> {
        let clock = SystemClock::new();
        let node = Node::new(config.node.clone(), clock.now_ns())?;
        let joined = node.is_joined();
        let mut endpoint = quinn::Endpoint::server(config.tls.server.clone(), config.listen)
            .map_err(|source| NetError::Bind {
                addr: config.listen,
                source,
            })?;
        endpoint.set_default_client_config(config.tls.client.clone());
        let (intros, intro_receiver) = mpsc::channel(INTRO_QUEUE);
        let members = node.membership().configured();
        let shared = Arc::new(Shared {
            cells: node.cells(),
            inner: Mutex::new(Inner {
                node,
                waiters: HashMap::new(),
                connected: HashSet::new(),
                heard: HashMap::new(),
            }),
            wake: tokio::sync::Notify::new(),
            running: AtomicBool::new(false),
            joined: AtomicBool::new(joined),
            closed: AtomicBool::new(false),
            clock,
            stats: NetStats::default(),
            refusals: Refusals::default(),
            intros,
            members: std::sync::atomic::AtomicUsize::new(members),
            max_keys: config.node.max_keys,
            max_wait_ns: config.node.max_wait_ns,
        });
        let (inputs, receiver) = mpsc::unbounded_channel();
        let driver = Driver {
            shared: Arc::clone(&shared),
            endpoint: endpoint.clone(),
            inputs: inputs.clone(),
            connections: HashMap::new(),
            addresses: config.peers.iter().copied().collect(),
            statics: config.peers.iter().map(|(id, _)| *id).collect(),
            dials: HashMap::new(),
            seeds: SeedBook::default(),
        };
        let driver = tokio::spawn(driver.run(receiver, intro_receiver).in_current_span());
        let acceptor = tokio::spawn(
            accept::accept_loop(
                endpoint.clone(),
                config.node.id,
                inputs.clone(),
                Arc::clone(&shared),
            )
            .in_current_span(),
        );
        for (id, addr) in config.peers {
            let _ = inputs.send(Input::AddPeer(id, addr));
        }
        Ok(MeshNet {
            shared,
            inputs,
            endpoint,
            driver,
            acceptor,
        })
    }

    /// Return the UDP address the endpoint listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.endpoint
            .local_addr()
            .expect("a bound endpoint has an address")
    }

    /// Tell the driver where peer `id` listens (it dials it).
    pub fn add_peer(&self, id: NodeId, addr: SocketAddr) {
        let _ = self.inputs.send(Input::AddPeer(id, addr));
    }

    /// Find the cluster through `seeds`: socket addresses or DNS names with a port, resolved
    /// now and every `refresh` (every second until the node joined), each address dialed.
    pub fn add_seeds(&self, seeds: Vec<String>, refresh: Duration) {
        if seeds.is_empty() {
            return;
        }
        tokio::spawn(
            seeds::resolve_loop(
                seeds,
                refresh,
                self.inputs.clone(),
                Arc::clone(&self.shared),
            )
            .in_current_span(),
        );
    }

    /// Tell whether the node has joined its cluster (before, it decides by
    /// `while_joining` and owns no key).
    pub fn is_joined(&self) -> bool {
        self.shared.joined.load(Ordering::Acquire)
    }

    /// Tell whether the node has recovered its state and admits.
    pub fn is_running(&self) -> bool {
        self.shared.running.load(Ordering::Acquire)
    }

    /// Return the transport's counters.
    pub fn stats(&self) -> &NetStats {
        &self.shared.stats
    }

    /// Return the handshakes refused on the peer port, by reason.
    pub fn refusals(&self) -> &Refusals {
        &self.shared.refusals
    }

    /// Return the peers that are up: live members connected, with the handshake completed
    /// on both sides (a frame from them arrived within [`PEER_UP_WITHIN`]).
    pub fn peers_up(&self) -> Vec<NodeId> {
        let inner = self.shared.inner.lock();
        let membership = inner.node.membership();
        let mut up: Vec<NodeId> = inner
            .connected
            .iter()
            .copied()
            .filter(|&id| {
                membership.is_alive(id)
                    && inner
                        .heard
                        .get(&id)
                        .is_some_and(|at| at.elapsed() <= PEER_UP_WITHIN)
            })
            .collect();
        up.sort_unstable();
        up
    }

    /// Run `f` on the node (for metrics and tests; holds the node's lock).
    pub fn with_node<T>(&self, f: impl FnOnce(&Node) -> T) -> T {
        f(&self.shared.inner.lock().node)
    }

    /// Decide a request of `cost` for `key` (its stable hash, see [`crate::ids::KeyHasher::key`])
    /// under global policy `policy`: at once from the node's lease of the key, or after the
    /// key's owner answered (await the result; at most the node's `max_wait`).
    pub fn decide(&self, policy: u32, key: u64, cost: u64) -> MeshDecision {
        let shared = &*self.shared;
        let now = shared.clock.now_ns();
        if let Some(d) = shared.cells.decide(policy, key, cost, now) {
            return MeshDecision::Ready(Some(d));
        }
        if shared.cells.len() >= shared.max_keys && !shared.cells.contains(policy, key) {
            // Beyond the key cap: no need to ask the node.
            shared.stats.overflow.fetch_add(1, Ordering::Relaxed);
            let members = shared.members.load(Ordering::Relaxed);
            return MeshDecision::Ready(Some(shared.cells.overflow_decide(
                policy,
                key,
                cost,
                now,
                members,
                shared.max_keys,
            )));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let intro = Intro {
            policy,
            key,
            cost,
            at: now,
            answer: tx,
        };
        match shared.intros.try_send(intro) {
            Ok(()) => MeshDecision::Waiting {
                answer: rx,
                fallback: Decision::denied(shared.cells.capacity(policy), 0, 0, 1_000_000_000),
            },
            // The node cannot take keys as fast as they come (or it stopped): this node's
            // share decides.
            Err(_) => MeshDecision::Ready(Some(shared.shed(policy, key, cost, now))),
        }
    }

    /// Enforce `policies` from now on and announce `digest` (see
    /// [`crate::mesh::node::Node::reconfigure`]).
    pub fn reconfigure(
        &self,
        policies: Vec<crate::policy::Policy>,
        digest: u64,
    ) -> Result<(), MeshError> {
        let result = self.shared.inner.lock().node.reconfigure(policies, digest);
        self.shared.wake.notify_one();
        result
    }

    /// Return the live peers whose configuration (mesh policies, `key_secret`, `env`)
    /// differs from this node's.
    pub fn config_mismatch(&self) -> Vec<NodeId> {
        self.with_node(|n| n.config_mismatch())
    }

    /// Leave the cluster for good: give every lease back, hand every key this node owns to
    /// its next owner, and tell the peers (they drop this node at once instead of waiting
    /// to declare it dead). Then close.
    pub async fn leave(&self) {
        {
            let mut inner = self.shared.inner.lock();
            let now = self.shared.clock.now_ns();
            inner.node.leave(now);
        }
        self.shared.wake.notify_one();
        // Let the driver send the handoffs (streams) and the leaving frames.
        let round = self.with_node(|n| n.config().gossip_interval_ns);
        tokio::time::sleep(Duration::from_nanos((3 * round).max(200_000_000))).await;
        self.close().await;
    }

    /// Stop the driver and close the endpoint (the peers hear the close at once); the node
    /// then sends and receives nothing. For a handle that is shared (e.g. with the rules).
    pub async fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.driver.abort();
        self.acceptor.abort();
        self.endpoint.close(0u32.into(), b"shutdown");
        // Let the peers hear the close, but do not wait out their idle timeouts.
        let _ = tokio::time::timeout(Duration::from_millis(300), self.endpoint.wait_idle()).await;
    }

    /// Stop the driver and close the endpoint.
    pub async fn shutdown(self) {
        self.close().await;
        let _ = self.driver.await;
    }
}

impl crate::backend::mesh::GlobalLimits for MeshNet {
    fn decide(&self, policy: u32, key: u64, cost: u64) -> MeshDecision {
        MeshNet::decide(self, policy, key, cost)
    }

    fn reconfigure(&self, policies: &[crate::policy::Policy], digest: u64) -> Result<(), String> {
        MeshNet::reconfigure(self, policies.to_vec(), digest).map_err(|e| e.to_string())
    }
}

struct Driver {
    shared: Arc<Shared>,
    endpoint: quinn::Endpoint,
    inputs: mpsc::UnboundedSender<Input>,
    connections: HashMap<NodeId, quinn::Connection>,
    addresses: HashMap<NodeId, SocketAddr>,
    /// Peers given by address (configured): dialed for as long as the node runs.
    statics: std::collections::HashSet<NodeId>,
    dials: HashMap<NodeId, DialState>,
    seeds: SeedBook,
}

impl Driver {
    async fn run(
        mut self,
        mut receiver: mpsc::UnboundedReceiver<Input>,
        mut intros: mpsc::Receiver<Intro>,
    ) {
        loop {
            let next = {
                let inner = self.shared.inner.lock();
                inner.node.poll_timeout()
            };
            let wait = next.saturating_sub(self.shared.clock.now_ns());
            tokio::select! {
                // The node's timer first: its rounds carry what the peers hear it by, and a
                // backlog of frames or requests must not hold them back.
                biased;
                _ = tokio::time::sleep(Duration::from_nanos(wait)) => {
                    // Frames that arrived before the round are heard first: a backlog here
                    // (a long round, a busy node) must not look like a silent peer.
                    // Only those queued now: frames that keep arriving must not hold the
                    // round off.
                    for _ in 0..receiver.len() {
                        let Ok(input) = receiver.try_recv() else { break };
                        self.input(input);
                    }
                    let now = self.shared.clock.now_ns();
                    self.shared.inner.lock().node.handle_timeout(now);
                }
                input = receiver.recv() => {
                    let Some(input) = input else { return };
                    self.input(input);
                    // Frames queued behind it are heard before the flush: fewer, fuller
                    // datagrams, one flush for a burst.
                    for _ in 0..INPUT_BATCH.min(receiver.len()) {
                        let Ok(input) = receiver.try_recv() else { break };
                        self.input(input);
                    }
                }
                Some(intro) = intros.recv() => self.introduce(intro, &mut intros),
                _ = self.shared.wake.notified() => {}
            }
            self.flush();
        }
    }

    /// Take `first` and the requests queued behind it (at most [`INTRO_BATCH`]) to the node
    /// under one lock; answer those it decides at once, keep the others' answers for later.
    fn introduce(&mut self, first: Intro, intros: &mut mpsc::Receiver<Intro>) {
        let shared = &*self.shared;
        let now = shared.clock.now_ns();
        let mut inner = shared.inner.lock();
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(intro) = next.take() {
            taken += 1;
            // The client gave up meanwhile: nothing to decide (nothing was charged).
            if !intro.answer.is_closed() {
                if now.saturating_sub(intro.at) > shared.max_wait_ns {
                    // Queued longer than a request may wait: the node is far behind.
                    let d = shared.shed(intro.policy, intro.key, intro.cost, intro.at);
                    let _ = intro.answer.send(d);
                } else {
                    match inner.node.decide(intro.policy, intro.key, intro.cost, now) {
                        Admit::Now(d) => {
                            let _ = intro.answer.send(d);
                        }
                        Admit::Wait(id) => {
                            inner.waiters.insert(id, intro.answer);
                        }
                    }
                }
            }
            if taken < INTRO_BATCH {
                next = intros.try_recv().ok();
            }
        }
    }

    fn input(&mut self, input: Input) {
        match input {
            Input::Frame(from, bytes) => {
                let now = self.shared.clock.now_ns();
                let result = {
                    let mut inner = self.shared.inner.lock();
                    inner.heard.insert(from, Instant::now());
                    inner.node.handle_frame(now, from, &bytes)
                };
                let counter = if result.is_ok() {
                    &self.shared.stats.frames_received
                } else {
                    &self.shared.stats.frames_dropped
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if let Some(state) = self.dials.get_mut(&from)
                    && state.failures > 0
                {
                    let failures = state.reached();
                    tracing::info!(peer = from, failures, "reached the peer");
                }
            }
            Input::Connected(id, connection) => self.connected(id, connection),
            Input::Dialed(id, result) => {
                self.dials.entry(id).or_default().dialing = false;
                match result {
                    Ok(connection) => self.connected(id, connection),
                    Err((kind, reason)) => {
                        // An accepted connection from the peer may have come meanwhile.
                        if !self.connections.contains_key(&id) {
                            self.failed(id, kind, &reason);
                        }
                    }
                }
            }
            Input::Closed(id, stable) => {
                if self
                    .connections
                    .get(&id)
                    .is_some_and(|c| c.stable_id() == stable)
                {
                    let connection = self.connections.remove(&id).expect("checked above");
                    let heard = {
                        let mut inner = self.shared.inner.lock();
                        inner.connected.remove(&id);
                        inner.heard.get(&id).copied()
                    };
                    // Closed before the peer sent anything: it refused the handshake.
                    let silent = heard.is_none_or(|at| at.elapsed() > PEER_UP_WITHIN);
                    match connection.close_reason() {
                        Some(error) if silent => {
                            let (kind, reason) = dial::describe(&error);
                            self.failed(id, kind, &reason);
                        }
                        _ => self.dial(id, Duration::from_millis(200)),
                    }
                }
            }
            Input::AddPeer(id, addr) => {
                self.addresses.insert(id, addr);
                self.statics.insert(id);
                self.dial(id, Duration::ZERO);
            }
            Input::Seeds { addrs, complete } => {
                let connected: std::collections::HashSet<SocketAddr> = self
                    .connections
                    .values()
                    .map(quinn::Connection::remote_address)
                    .chain(
                        self.addresses
                            .iter()
                            .filter(|(id, _)| self.connections.contains_key(id))
                            .map(|(_, &a)| a),
                    )
                    .collect();
                for addr in self
                    .seeds
                    .resolved(addrs, complete, |a| connected.contains(&a))
                {
                    self.dial_seed(addr);
                }
                self.seeds_settled();
            }
            Input::SeedDialed(addr, result) => {
                match result {
                    Ok((id, connection)) if id == self.me() => {
                        connection.close(3u32.into(), b"this is me");
                        self.seeds.is_self(addr);
                    }
                    Ok((id, connection)) => {
                        self.seeds.reached(addr);
                        self.addresses.entry(id).or_insert(addr);
                        self.connected(id, connection);
                    }
                    Err((kind, reason)) => self.seeds.failed(addr, kind, &reason),
                }
                self.seeds_settled();
            }
        }
    }

    fn me(&self) -> NodeId {
        self.shared.inner.lock().node.id()
    }

    /// After a resolution or a seed dial: tell the node how many members the seeds stand
    /// for, and start a cluster when the seeds are this node alone.
    fn seeds_settled(&mut self) {
        let now = self.shared.clock.now_ns();
        let mut inner = self.shared.inner.lock();
        inner.node.expect_members(self.seeds.expected_members());
        if self.seeds.only_self() && !inner.node.is_joined() {
            tracing::info!("the seeds name no other member: starting the cluster");
            inner.node.start_alone(now);
        }
    }

    /// Dial seed address `addr` (its node's id unknown); the result comes back as
    /// [`Input::SeedDialed`].
    fn dial_seed(&mut self, addr: SocketAddr) {
        let endpoint = self.endpoint.clone();
        let inputs = self.inputs.clone();
        let shared = Arc::clone(&self.shared);
        tokio::spawn(async move {
            if shared.closed.load(Ordering::Acquire) {
                return;
            }
            let result = match endpoint.connect(addr, SEED_NAME) {
                Err(error) => Err((Failure::Other, error.to_string())),
                Ok(connecting) => match connecting.await {
                    Err(error) => Err(dial::describe(&error)),
                    // The certificate was checked against the CA for the node it names.
                    Ok(connection) => match peer_id(&connection) {
                        Ok(id) => Ok((id, connection)),
                        Err(error) => {
                            connection.close(1u32.into(), b"unexpected identity");
                            Err((Failure::WrongIdentity, format!("at {addr}: {error}")))
                        }
                    },
                },
            };
            let _ = inputs.send(Input::SeedDialed(addr, result));
        });
    }

    fn connected(&mut self, id: NodeId, connection: quinn::Connection) {
        let addr = *self
            .addresses
            .entry(id)
            .or_insert_with(|| connection.remote_address());
        spawn_readers(id, connection.clone(), self.inputs.clone());
        self.connections.insert(id, connection);
        let now = self.shared.clock.now_ns();
        let mut inner = self.shared.inner.lock();
        inner.connected.insert(id);
        // A member the node did not know is one now (its certificate says who it is).
        inner
            .node
            .add_member(now, id, Some(addr.to_string().into_bytes()));
    }

    /// Count a failed attempt to reach `id`, log it when due, and dial again after the
    /// backoff.
    fn failed(&mut self, id: NodeId, kind: Failure, reason: &str) {
        self.shared
            .stats
            .dial_failures
            .fetch_add(1, Ordering::Relaxed);
        let state = self.dials.entry(id).or_default();
        let (delay, log) = state.failed(kind, Instant::now());
        if log {
            let addr = self.addresses.get(&id).map(ToString::to_string);
            tracing::warn!(
                peer = id,
                addr = addr.as_deref().unwrap_or("?"),
                attempts = state.failures,
                retry_in = ?delay,
                "cannot reach peer {id}: {reason} (logged again if the reason changes, when \
                 the retries reach every {:?}, then once a minute)",
                dial::MAX_BACKOFF
            );
        }
        self.dial(id, delay);
    }

    /// Dial `id` once after `delay` (unless an attempt is already under way); the result
    /// comes back as [`Input::Dialed`].
    fn dial(&mut self, id: NodeId, delay: Duration) {
        let Some(&addr) = self.addresses.get(&id) else {
            return;
        };
        let state = self.dials.entry(id).or_default();
        if state.dialing {
            return;
        }
        state.dialing = true;
        let endpoint = self.endpoint.clone();
        let inputs = self.inputs.clone();
        let shared = Arc::clone(&self.shared);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if shared.closed.load(Ordering::Acquire) {
                return;
            }
            let result = match endpoint.connect(addr, &certs::node_name(id)) {
                Err(error) => Err((Failure::Other, error.to_string())),
                Ok(connecting) => match connecting.await {
                    Err(error) => Err(dial::describe(&error)),
                    // The server's certificate was checked for `id`'s name by the handshake.
                    Ok(connection) if peer_id(&connection) == Ok(id) => Ok(connection),
                    Ok(connection) => {
                        connection.close(1u32.into(), b"unexpected identity");
                        Err((
                            Failure::WrongIdentity,
                            format!("the node at {addr} presents another node's certificate"),
                        ))
                    }
                },
            };
            let _ = inputs.send(Input::Dialed(id, result));
        });
    }

    fn flush(&mut self) {
        let (transmits, events, running, joined) = {
            let mut inner = self.shared.inner.lock();
            let mut transmits = Vec::new();
            while let Some(t) = inner.node.poll_transmit() {
                transmits.push(t);
            }
            let mut events = Vec::new();
            while let Some(e) = inner.node.poll_event() {
                match e {
                    Event::Decided { id, decision } => {
                        if let Some(waiter) = inner.waiters.remove(&id) {
                            let _ = waiter.send(decision);
                        }
                    }
                    // Where the member that told of it reaches it.
                    Event::PeerLearned(peer) => {
                        let addr = inner
                            .node
                            .membership()
                            .peer(peer)
                            .and_then(|p| p.addr.as_deref())
                            .and_then(|a| std::str::from_utf8(a).ok())
                            .and_then(|a| a.parse::<SocketAddr>().ok());
                        events.push((e, addr));
                    }
                    e => events.push((e, None)),
                }
            }
            let node = &inner.node;
            self.shared
                .members
                .store(node.membership().configured(), Ordering::Relaxed);
            (transmits, events, node.is_running(), node.is_joined())
        };
        self.shared.running.store(running, Ordering::Release);
        self.shared.joined.store(joined, Ordering::Release);
        for (event, addr) in events {
            self.event(event, addr);
        }
        for t in transmits {
            self.send(t);
        }
    }

    /// Log a node event, and follow the membership: dial a member learned of, stop dialing
    /// one that left or was forgotten (unless it was configured).
    fn event(&mut self, event: Event, addr: Option<SocketAddr>) {
        match event {
            Event::PeerDown(peer) => tracing::warn!(peer, "peer declared dead"),
            Event::PeerUp(peer) => tracing::info!(peer, "peer is up"),
            Event::PeerRestarted(peer) => tracing::info!(peer, "peer restarted"),
            Event::PeerSuspected(peer) => tracing::debug!(peer, "peer suspected (silent)"),
            Event::PeerLeft(peer) | Event::PeerForgotten(peer) => {
                if matches!(event, Event::PeerLeft(_)) {
                    tracing::info!(peer, "peer left the cluster");
                }
                if !self.statics.contains(&peer) {
                    self.addresses.remove(&peer);
                    self.dials.remove(&peer);
                }
            }
            Event::PeerLearned(peer) => {
                tracing::info!(peer, addr = ?addr, "learned of a member");
                if let Some(addr) = addr
                    && !self.connections.contains_key(&peer)
                {
                    self.addresses.entry(peer).or_insert(addr);
                    self.dial(peer, Duration::ZERO);
                }
            }
            Event::Joined => tracing::info!("joined the cluster"),
            Event::ConfigDiffers(peer) => tracing::warn!(
                peer,
                "the peer's configuration (mesh policies, key_secret or env) differs from this \
                 node's: each mesh policy is enforced with the lowest limit among them until \
                 they agree (ratemesh_config_mismatch)"
            ),
            Event::ConfigAgrees(peer) => {
                tracing::info!(
                    peer,
                    "the peer's configuration agrees with this node's again"
                );
            }
            Event::Recovered => tracing::info!("every peer answered; serving owned keys"),
            Event::Decided { .. } | Event::Window { .. } => {}
        }
    }

    fn send(&self, t: Transmit) {
        let Some(connection) = self.connections.get(&t.to) else {
            self.shared.stats.unroutable.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.shared
            .stats
            .bytes_sent
            .fetch_add(t.bytes.len() as u64, Ordering::Relaxed);
        let fits = connection
            .max_datagram_size()
            .is_some_and(|max| t.bytes.len() <= max);
        if !t.reliable && fits {
            if connection.send_datagram(Bytes::from(t.bytes)).is_ok() {
                self.shared
                    .stats
                    .datagrams_sent
                    .fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        self.shared
            .stats
            .streams_sent
            .fetch_add(1, Ordering::Relaxed);
        let connection = connection.clone();
        tokio::spawn(async move {
            if let Ok(mut stream) = connection.open_uni().await
                && stream.write_all(&t.bytes).await.is_ok()
            {
                let _ = stream.finish();
            }
        });
    }
}

/// Read `id`'s datagrams and streams into the driver until the connection closes.
fn spawn_readers(id: NodeId, connection: quinn::Connection, inputs: mpsc::UnboundedSender<Input>) {
    let datagrams = connection.clone();
    let datagram_inputs = inputs.clone();
    tokio::spawn(async move {
        while let Ok(bytes) = datagrams.read_datagram().await {
            if datagram_inputs
                .send(Input::Frame(id, bytes.to_vec()))
                .is_err()
            {
                return;
            }
        }
    });
    tokio::spawn(async move {
        while let Ok(mut stream) = connection.accept_uni().await {
            let inputs = inputs.clone();
            tokio::spawn(async move {
                if let Ok(bytes) = stream.read_to_end(MAX_FRAME_BYTES).await {
                    let _ = inputs.send(Input::Frame(id, bytes));
                }
            });
        }
        let _ = inputs.send(Input::Closed(id, connection.stable_id()));
    });
}
