//! The QUIC transport: a tokio + quinn driver that owns one [`Node`] and carries its frames
//! to and from the peers, with mutual TLS ([`node_tls`]).
//!
//! One UDP endpoint per node both accepts and dials. Deltas travel as unreliable QUIC
//! datagrams (the node keeps them under 1150 bytes); snapshots, and anything a datagram
//! cannot carry, on a unidirectional stream per frame, read with the frame size limit.
//! Keep-alives and an idle timeout notice a dead peer; a lost connection is dialed again
//! with backoff (`dial`: the reason of a failure is logged once per peer and backoff step,
//! not per attempt). A peer's node id comes from its certificate: any peer whose certificate
//! the cluster CA signed for one node name is a member (a new one is added to the node, which
//! tells the others; a member the node learns of that way is dialed at the address it was
//! told). A peer whose certificate the CA did not sign, or that names no node, is refused and
//! counted, and so is anything else on the peer port that is not a member's handshake
//! (`accept`), quietly. Seeds (`seeds`: addresses or DNS names, re-resolved) are dialed
//! to find the cluster; the node there says who it is with its certificate.
//! A peer is *up* ([`MeshNet::peers_up`]) while it is a live member and this node has a
//! connection to it whose handshake completed on both sides, shown by a frame heard from it
//! within the last 3 seconds.
//!
//! The request path ([`MeshNet::decide`]) takes no lock while the node's lease of the key
//! covers the request: one map read and the lease's compare-and-swap ([`Cells::decide`]).
//! Otherwise (a key's first request on the node, or a lease too short) the request goes on
//! a bounded queue to the driver, which takes it to the node with the others queued (one
//! lock of the node per batch, taken by the driver alone) and answers it, at once or once
//! the key's owner answered. When the queue is full (the node cannot introduce keys as
//! fast as they come), or a request waited in it longer than `max_wait`, a key the node
//! holds no lease for is decided by this node's share alone ([`Cells::overflow_decide`],
//! counted in [`NetStats::shed`]); a key it holds a lease for by that lease, or denied
//! ([`NetStats::late`]). The driver runs the
//! node's rounds before anything queued, so a backlog of requests or frames does not hold
//! back the frames its peers hear it by.

pub(crate) mod accept;
mod admin;
pub mod certs;
pub(crate) mod dial;
mod driver;
mod pending;
pub(crate) mod seeds;
pub(crate) mod tls;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::clock::{Clock, SystemClock};
use crate::decision::Decision;
use crate::decision::{MeshAnswer, MeshCharge, MeshDecision};
use crate::mesh::node::{MeshError, Node, NodeConfig};
use crate::mesh::{Behind, Cells, NodeId};
pub use crate::net::accept::{Refusal, Refusals};
pub use crate::net::admin::{AdminError, Question};
use crate::net::dial::Failure;
use crate::net::driver::Driver;
pub use crate::net::tls::{NodeTls, TlsError, TlsExpiry, admin_client, node_tls};

/// A connected peer counts as up while a frame from it arrived within this time.
pub(crate) const PEER_UP_WITHIN: Duration = Duration::from_secs(3);

/// The most requests queued for the driver (keys' first requests, leases too short); beyond
/// them a request is decided by the node's share alone.
pub(crate) const INTRO_QUEUE: usize = 4096;

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
    /// The mesh's own thread or its runtime could not be started.
    #[error("starting the mesh thread: {0}")]
    Thread(std::io::Error),
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

/// The UDP socket buffers the endpoint asks the kernel for (Linux grants at most
/// `net.core.rmem_max` / `wmem_max`): a burst of peers' frames that arrives while the node is
/// busy waits here instead of being dropped.
pub(crate) const UDP_BUFFER_BYTES: usize = 4 << 20;

/// Bind the endpoint's UDP socket at `addr`, with [`UDP_BUFFER_BYTES`] of buffers (or what
/// the kernel allows).
fn udp_socket(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    // Best effort: a kernel that refuses keeps its default.
    let _ = socket.set_recv_buffer_size(UDP_BUFFER_BYTES);
    let _ = socket.set_send_buffer_size(UDP_BUFFER_BYTES);
    socket.bind(&addr.into())?;
    Ok(socket.into())
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
    /// Datagrams sent.
    pub datagrams_sent: AtomicU64,
    /// Streams (snapshots) sent.
    pub streams_sent: AtomicU64,
    /// Bytes sent.
    pub bytes_sent: AtomicU64,
    /// Frames for a peer with no connection (dropped; the gossip catches up).
    pub unroutable: AtomicU64,
    /// Reliable frames (state handed over, sync answers, a leaving node's reports) that
    /// found no connection to their peer, or whose stream was lost: kept and sent on the
    /// peer's next connection.
    pub reliable_held: AtomicU64,
    /// Reliable frames given up: their peer left or was forgotten before a connection to it
    /// came up, or the frames waiting filled their bound (64 MiB).
    pub reliable_lost: AtomicU64,
    /// Failed attempts to reach a peer (dial errors, and connections the peer closed
    /// before it sent anything).
    pub dial_failures: AtomicU64,
    /// Requests for keys the node holds no lease for, decided by its share alone because
    /// the driver's queue was full, or they waited in it longer than the node's `max_wait`.
    pub shed: AtomicU64,
    /// Requests for keys the node holds a lease for, denied because the driver's queue was
    /// full, or they waited in it longer than the node's `max_wait`, and the lease could
    /// not cover them (the mesh's other holders may have the rest of the limit: the node's
    /// share would admit on top of it).
    pub late: AtomicU64,
}

/// A request the lease could not decide, on its way to the node.
struct Intro {
    policy: u32,
    key: u64,
    cost: u64,
    /// When the request came (the node's clock).
    at: u64,
    answer: tokio::sync::oneshot::Sender<MeshAnswer>,
}

struct Inner {
    node: Node,
    /// Requests waiting for their key's owner, by the id the node gave them.
    waiters: HashMap<u64, tokio::sync::oneshot::Sender<MeshAnswer>>,
    /// Peers with a connection whose handshake completed on this side.
    connected: HashSet<NodeId>,
    /// When a frame last arrived from each peer.
    heard: HashMap<NodeId, Instant>,
    /// The admin API's questions to peers waiting for their answer, and where questions
    /// from peers go ([`MeshNet::admin_questions`]).
    admin: admin::AdminWaiters,
}

pub(crate) struct NetShared {
    inner: Mutex<Inner>,
    /// The lease cells (the request path's read handle).
    cells: Arc<Cells>,
    /// Wakes the driver when the request path gave the node something to send.
    wake: tokio::sync::Notify,
    closed: AtomicBool,
    clock: SystemClock,
    stats: NetStats,
    /// Handshakes refused on the peer port, by reason.
    refusals: Refusals,
    /// Requests for the driver to take to the node.
    intros: mpsc::Sender<Intro>,
    /// The node's longest wait (fixed at start).
    max_wait_ns: u64,
    /// What this node dials with (its certificate and the CAs it trusts), replaced by
    /// [`MeshNet::set_tls`].
    client_tls: Mutex<quinn::ClientConfig>,
}

impl NetShared {
    /// Decide a request by this node's share alone, counted in `counter` (`shed` or
    /// `overflow` of [`NetStats`]).
    fn alone(&self, counter: &AtomicU64, policy: u32, key: u64, cost: u64, now: u64) -> Decision {
        counter.fetch_add(1, Ordering::Relaxed);
        self.cells.overflow_decide(
            policy,
            key,
            cost,
            now,
            self.cells.members(),
            self.cells.max_keys(),
        )
    }

    /// Decide a request the node cannot take in time (its queue is full, or the request
    /// waited in it longer than `max_wait`): see [`Cells::decide_behind`]; counted in
    /// `late` or `shed`.
    fn behind(&self, policy: u32, key: u64, cost: u64, now: u64) -> Decision {
        match self
            .cells
            .decide_behind(policy, key, cost, now, self.max_wait_ns.max(1))
        {
            Behind::Lease(d) => d,
            Behind::Late(d) => {
                self.stats.late.fetch_add(1, Ordering::Relaxed);
                d
            }
            Behind::Unheld => self.alone(&self.stats.shed, policy, key, cost, now),
        }
    }
}

pub(crate) enum Input {
    Frame(NodeId, Vec<u8>),
    Connected(NodeId, quinn::Connection),
    Dialed(NodeId, Result<quinn::Connection, (Failure, String)>),
    Closed(NodeId, usize),
    /// A reliable frame for the peer whose stream on the connection (by its stable id) was
    /// lost: sent again.
    Unsent(NodeId, usize, Vec<u8>),
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
///
/// ```
/// use std::time::Duration;
/// use ratemesh::Policy;
/// use ratemesh::mesh::{KeyHasher, NodeConfig};
/// use ratemesh::net::{MeshNet, NetConfig, certs, node_tls, transport_config};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Node 1 of a cluster of one; others join by naming it as a seed (`NodeConfig::seeds`,
/// // `add_peer`), with certificates from the same CA.
/// let certs = certs::generate("example", 1)?;
/// let (id, cert, key) = &certs.nodes[0];
/// let tls = node_tls(
///     certs.ca_cert_pem.as_bytes(),
///     cert.as_bytes(),
///     key.as_bytes(),
///     transport_config(),
/// )?;
/// let per_minute = Policy::global_fixed_window(100, Duration::from_secs(60))?;
/// let net = MeshNet::start(NetConfig {
///     node: NodeConfig::new(*id, vec![*id], vec![per_minute]),
///     listen: "127.0.0.1:0".parse()?,
///     peers: Vec::new(),
///     tls,
/// })
/// .await?;
///
/// // Keys cross the cluster as a keyed hash that every node computes alike.
/// let tenant = KeyHasher::from_secret("cluster-secret").key(&[b"tenant-42"]);
/// // From the node's lease of the key at once, or after the key's owner answered.
/// let decision = net.decide(0, tenant, 1).await;
/// assert!(decision.is_allowed());
/// assert_eq!(decision.limit, 100);
/// net.shutdown().await;
/// # Ok(()) }
/// ```
pub struct MeshNet {
    shared: Arc<NetShared>,
    inputs: mpsc::UnboundedSender<Input>,
    endpoint: quinn::Endpoint,
    driver: tokio::task::JoinHandle<()>,
    acceptor: tokio::task::JoinHandle<()>,
    /// With [`MeshNet::start_on_thread`]: dropped with the handle, which ends the thread.
    thread_keepalive: Option<tokio::sync::oneshot::Sender<()>>,
}

impl MeshNet {
    /// Open the endpoint, start the driver and dial the peers. Needs a tokio runtime.
    pub async fn start(config: NetConfig) -> Result<MeshNet, NetError> {
        let clock = SystemClock::new();
        let node = Node::new(config.node.clone(), clock.now_ns())?;
        let bind_error = |source| NetError::Bind {
            addr: config.listen,
            source,
        };
        let socket = udp_socket(config.listen).map_err(bind_error)?;
        let endpoint = quinn::Endpoint::new(
            quinn::EndpointConfig::default(),
            Some(config.tls.server.clone()),
            socket,
            Arc::new(quinn::TokioRuntime),
        )
        .map_err(bind_error)?;
        let (intros, intro_receiver) = mpsc::channel(INTRO_QUEUE);
        let shared = Arc::new(NetShared {
            cells: node.cells(),
            inner: Mutex::new(Inner {
                node,
                waiters: HashMap::new(),
                connected: HashSet::new(),
                heard: HashMap::new(),
                admin: admin::AdminWaiters::default(),
            }),
            wake: tokio::sync::Notify::new(),
            closed: AtomicBool::new(false),
            clock,
            stats: NetStats::default(),
            refusals: Refusals::default(),
            intros,
            max_wait_ns: config.node.max_wait_ns,
            client_tls: Mutex::new(config.tls.client.clone()),
        });
        let (inputs, receiver) = mpsc::unbounded_channel();
        let driver = Driver::new(
            Arc::clone(&shared),
            endpoint.clone(),
            inputs.clone(),
            &config.peers,
        );
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
            thread_keepalive: None,
        })
    }

    /// Like [`MeshNet::start`], but run the endpoint, the driver and their timers on a
    /// thread of their own (`ratemesh-mesh`, a single-threaded runtime) rather than on the
    /// caller's runtime: the node's rounds and its peers' frames never wait behind the
    /// caller's tasks for a worker, and the mesh's tasks wake one another on one thread
    /// instead of moving between workers. What `ratemesh node` does. The thread ends, and
    /// the endpoint with it, once the returned handle is dropped (or shut down).
    pub async fn start_on_thread(config: NetConfig) -> Result<MeshNet, NetError> {
        let (started, net) = tokio::sync::oneshot::channel();
        let (keep, dropped) = tokio::sync::oneshot::channel::<()>();
        let span = tracing::Span::current();
        std::thread::Builder::new()
            .name("ratemesh-mesh".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        let _ = started.send(Err(NetError::Thread(error)));
                        return;
                    }
                };
                runtime.block_on(
                    async move {
                        let net = MeshNet::start(config).await;
                        let ok = net.is_ok();
                        if started.send(net).is_ok() && ok {
                            // Serve until the handle is dropped.
                            let _ = dropped.await;
                        }
                    }
                    .instrument(span),
                );
            })
            .map_err(NetError::Thread)?;
        let mut net = net.await.map_err(|_| {
            NetError::Thread(std::io::Error::other(
                "the mesh thread ended before starting",
            ))
        })??;
        net.thread_keepalive = Some(keep);
        Ok(net)
    }

    /// Use `tls` from now on: for the handshakes this node accepts and the ones it dials (its
    /// certificate and the CAs it trusts, as when a certificate is renewed or the cluster's
    /// CA rotated). Connections already up keep going.
    pub fn set_tls(&self, tls: &NodeTls) {
        self.endpoint.set_server_config(Some(tls.server.clone()));
        *self.shared.client_tls.lock() = tls.client.clone();
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
        self.shared.cells.is_joined()
    }

    /// The node's admission front: its lease cells and what it publishes of itself.
    pub fn cells(&self) -> &Cells {
        &self.shared.cells
    }

    /// Tell whether the node has recovered its state and admits.
    pub fn is_running(&self) -> bool {
        self.shared.cells.is_running()
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
    /// on both sides (a frame from them arrived within the last 3 seconds).
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
        // By the key's lease, or beyond the key cap by the node's share: no need to ask it.
        if let Some((decision, charge)) = shared.cells.admit(policy, key, cost, now) {
            return MeshDecision::Ready(Some(MeshAnswer { decision, charge }));
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
            // The node cannot take keys as fast as they come (or it stopped).
            Err(_) => MeshDecision::Ready(Some(shared.behind(policy, key, cost, now).into())),
        }
    }

    /// Give back `cost` tokens that an admission of `key` under `policy` took (`charge`, from
    /// [`MeshDecision::answer`]), because another policy of the request denied it: see
    /// [`crate::mesh::Node::refund`]. Lock-free, like the decision. Return whether they
    /// went back.
    pub fn refund(&self, policy: u32, key: u64, cost: u64, charge: MeshCharge) -> bool {
        self.shared.cells.refund(policy, key, cost, charge)
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
        // The endpoint is closed and the driver done: the mesh's own thread may end.
        drop(self.thread_keepalive);
    }
}
