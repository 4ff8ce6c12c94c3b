//! The QUIC transport: a tokio + quinn driver that owns one [`Node`] and carries its frames
//! to and from the peers, with mutual TLS (see [`tls`]).
//!
//! One UDP endpoint per node both accepts and dials. Deltas travel as unreliable QUIC
//! datagrams (the node keeps them under 1150 bytes); snapshots, and anything a datagram
//! cannot carry, on a unidirectional stream per frame, read with the frame size limit.
//! Keep-alives and an idle timeout notice a dead peer; a lost connection is dialed again
//! with backoff. A peer's node id comes from its certificate; a peer whose certificate the
//! cluster CA did not sign, or that names no member, is refused and counted.
//!
//! The request path ([`MeshNet::decide`]) takes no lock while the node's lease of the key
//! covers the request: one map read and the lease's compare-and-swap ([`Cells::decide`]).
//! Otherwise it locks the node, which asks the key's owner, and the request waits (without
//! holding the lock) for the answer the driver delivers.

pub mod certs;
pub mod tls;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::backend::mesh::MeshDecision;
use crate::clock::{Clock, SystemClock};
use crate::decision::Decision;
use crate::mesh::node::{Admit, Event, MeshError, Node, NodeConfig};
use crate::mesh::wire::MAX_FRAME_BYTES;
use crate::mesh::{Cells, NodeId, Transmit};
use crate::net::tls::{NodeTls, peer_node_id};

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
}

struct Inner {
    node: Node,
    /// Requests waiting for their key's owner, by the id the node gave them.
    waiters: HashMap<u64, tokio::sync::oneshot::Sender<Decision>>,
}

struct Shared {
    inner: Mutex<Inner>,
    /// The lease cells (the request path's read handle).
    cells: Arc<Cells>,
    /// Wakes the driver when the request path gave the node something to send.
    wake: tokio::sync::Notify,
    running: AtomicBool,
    closed: AtomicBool,
    clock: SystemClock,
    stats: NetStats,
}

enum Input {
    Frame(NodeId, Vec<u8>),
    Connected(NodeId, quinn::Connection),
    Closed(NodeId, usize),
    AddPeer(NodeId, SocketAddr),
}

/// A running mesh node with its QUIC transport.
pub struct MeshNet {
    shared: Arc<Shared>,
    inputs: mpsc::UnboundedSender<Input>,
    endpoint: quinn::Endpoint,
    driver: tokio::task::JoinHandle<()>,
}

impl MeshNet {
    /// Open the endpoint, start the driver and dial the peers. Needs a tokio runtime.
    pub async fn start(config: NetConfig) -> Result<MeshNet, NetError> {
        let clock = SystemClock::new();
        let node = Node::new(config.node.clone(), clock.now_ns())?;
        let mut endpoint = quinn::Endpoint::server(config.tls.server.clone(), config.listen)
            .map_err(|source| NetError::Bind {
                addr: config.listen,
                source,
            })?;
        endpoint.set_default_client_config(config.tls.client.clone());
        let shared = Arc::new(Shared {
            cells: node.cells(),
            inner: Mutex::new(Inner {
                node,
                waiters: HashMap::new(),
            }),
            wake: tokio::sync::Notify::new(),
            running: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            clock,
            stats: NetStats::default(),
        });
        let (inputs, receiver) = mpsc::unbounded_channel();
        let members: Vec<NodeId> = config.node.seeds.clone();
        let driver = Driver {
            shared: Arc::clone(&shared),
            endpoint: endpoint.clone(),
            inputs: inputs.clone(),
            connections: HashMap::new(),
            addresses: config.peers.iter().copied().collect(),
            members,
            me: config.node.id,
        };
        let driver = tokio::spawn(driver.run(receiver).in_current_span());
        for (id, addr) in config.peers {
            let _ = inputs.send(Input::AddPeer(id, addr));
        }
        Ok(MeshNet {
            shared,
            inputs,
            endpoint,
            driver,
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

    /// Tell whether the node has recovered its state and admits.
    pub fn is_running(&self) -> bool {
        self.shared.running.load(Ordering::Acquire)
    }

    /// Return the transport's counters.
    pub fn stats(&self) -> &NetStats {
        &self.shared.stats
    }

    /// Run `f` on the node (for metrics and tests; holds the node's lock).
    pub fn with_node<T>(&self, f: impl FnOnce(&Node) -> T) -> T {
        f(&self.shared.inner.lock().expect("node lock").node)
    }

    /// Decide a request of `cost` for `key` (its stable hash, see [`crate::mesh::key_hash`])
    /// under global policy `policy`: at once from the node's lease of the key, or after the
    /// key's owner answered (await the result; at most the node's `max_wait`).
    pub fn decide(&self, policy: u32, key: u64, cost: u64) -> MeshDecision {
        let now = self.shared.clock.now_ns();
        if let Some(d) = self.shared.cells.decide(policy, key, cost, now) {
            return MeshDecision::Ready(Some(d));
        }
        let mut inner = self.shared.inner.lock().expect("node lock");
        let admit = inner.node.decide(policy, key, cost, now);
        let decision = match admit {
            Admit::Now(d) => MeshDecision::Ready(Some(d)),
            Admit::Wait(id) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                inner.waiters.insert(id, tx);
                let limit = inner
                    .node
                    .config()
                    .policies
                    .get(policy as usize)
                    .map_or(0, |p| p.capacity());
                MeshDecision::Waiting {
                    answer: rx,
                    fallback: Decision::denied(limit, 0, 0, 1_000_000_000),
                }
            }
        };
        drop(inner);
        // The node may have frames to send (the want) and a nearer deadline.
        self.shared.wake.notify_one();
        decision
    }

    /// Leave the cluster for good: give every lease back, hand every key this node owns to
    /// its next owner, and tell the peers (they drop this node at once instead of waiting
    /// to declare it dead). Then close.
    pub async fn leave(&self) {
        {
            let mut inner = self.shared.inner.lock().expect("node lock");
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
}

struct Driver {
    shared: Arc<Shared>,
    endpoint: quinn::Endpoint,
    inputs: mpsc::UnboundedSender<Input>,
    connections: HashMap<NodeId, quinn::Connection>,
    addresses: HashMap<NodeId, SocketAddr>,
    members: Vec<NodeId>,
    me: NodeId,
}

impl Driver {
    async fn run(mut self, mut receiver: mpsc::UnboundedReceiver<Input>) {
        loop {
            let next = {
                let inner = self.shared.inner.lock().expect("node lock");
                inner.node.poll_timeout()
            };
            let wait = next.saturating_sub(self.shared.clock.now_ns());
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_nanos(wait)) => {
                    let now = self.shared.clock.now_ns();
                    self.shared.inner.lock().expect("node lock").node.handle_timeout(now);
                }
                _ = self.shared.wake.notified() => {}
                incoming = self.endpoint.accept() => {
                    let Some(incoming) = incoming else { return };
                    self.accept(incoming);
                }
                input = receiver.recv() => {
                    let Some(input) = input else { return };
                    self.input(input);
                }
            }
            self.flush();
        }
    }

    fn input(&mut self, input: Input) {
        match input {
            Input::Frame(from, bytes) => {
                let now = self.shared.clock.now_ns();
                let result = self
                    .shared
                    .inner
                    .lock()
                    .expect("node lock")
                    .node
                    .handle_frame(now, from, &bytes);
                let counter = if result.is_ok() {
                    &self.shared.stats.frames_received
                } else {
                    &self.shared.stats.frames_dropped
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            Input::Connected(id, connection) => {
                spawn_readers(id, connection.clone(), self.inputs.clone());
                self.connections.insert(id, connection);
            }
            Input::Closed(id, stable) => {
                if self
                    .connections
                    .get(&id)
                    .is_some_and(|c| c.stable_id() == stable)
                {
                    self.connections.remove(&id);
                    if let Some(&addr) = self.addresses.get(&id) {
                        self.dial(id, addr, Duration::from_millis(200));
                    }
                }
            }
            Input::AddPeer(id, addr) => {
                self.addresses.insert(id, addr);
                if !self.members.contains(&id) {
                    self.members.push(id);
                }
                self.dial(id, addr, Duration::ZERO);
            }
        }
    }

    /// Dial `id` at `addr` after `delay`, retrying with backoff until connected.
    fn dial(&self, id: NodeId, addr: SocketAddr, delay: Duration) {
        let endpoint = self.endpoint.clone();
        let inputs = self.inputs.clone();
        let members = self.members.clone();
        let shared = Arc::clone(&self.shared);
        tokio::spawn(async move {
            let mut backoff = delay;
            loop {
                tokio::time::sleep(backoff).await;
                if shared.closed.load(Ordering::Acquire) {
                    return;
                }
                backoff = (backoff * 2).clamp(Duration::from_millis(100), Duration::from_secs(5));
                let Ok(connecting) = endpoint.connect(addr, &certs::node_name(id)) else {
                    continue;
                };
                let Ok(connection) = connecting.await else {
                    continue;
                };
                // The server's certificate was checked for `id`'s name by the handshake.
                if peer_node_id(&connection, members.iter().copied()) != Some(id) {
                    connection.close(1u32.into(), b"unexpected identity");
                    continue;
                }
                let _ = inputs.send(Input::Connected(id, connection));
                return;
            }
        });
    }

    fn accept(&self, incoming: quinn::Incoming) {
        let inputs = self.inputs.clone();
        let members: Vec<NodeId> = self
            .members
            .iter()
            .copied()
            .filter(|&m| m != self.me)
            .collect();
        let shared = Arc::clone(&self.shared);
        tokio::spawn(
            async move {
                let connection = match incoming.await {
                    Ok(c) => c,
                    Err(error) => {
                        // Another CA's certificate, or none: the handshake fails here.
                        shared.stats.refused.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%error, "refused a peer connection");
                        return;
                    }
                };
                match peer_node_id(&connection, members) {
                    Some(id) => {
                        let _ = inputs.send(Input::Connected(id, connection));
                    }
                    None => {
                        shared.stats.refused.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!("refused a peer whose certificate names no member");
                        connection.close(2u32.into(), b"not a member");
                    }
                }
            }
            .in_current_span(),
        );
    }

    fn flush(&mut self) {
        let (transmits, events, running) = {
            let mut inner = self.shared.inner.lock().expect("node lock");
            let mut transmits = Vec::new();
            while let Some(t) = inner.node.poll_transmit() {
                transmits.push(t);
            }
            let mut events = Vec::new();
            while let Some(e) = inner.node.poll_event() {
                if let Event::Decided { id, decision } = e {
                    if let Some(waiter) = inner.waiters.remove(&id) {
                        let _ = waiter.send(decision);
                    }
                } else {
                    events.push(e);
                }
            }
            (transmits, events, inner.node.is_running())
        };
        self.shared.running.store(running, Ordering::Release);
        for event in events {
            match event {
                Event::PeerDown(peer) => tracing::warn!(peer, "peer declared dead"),
                Event::PeerUp(peer) => tracing::info!(peer, "peer is up"),
                Event::PeerRestarted(peer) => tracing::info!(peer, "peer restarted"),
                Event::PeerLeft(peer) => tracing::info!(peer, "peer left the cluster"),
                Event::Recovered => tracing::info!("every peer answered; serving owned keys"),
                Event::Decided { .. } | Event::Window { .. } => {}
            }
        }
        for t in transmits {
            self.send(t);
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
