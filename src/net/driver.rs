//! The driver: the tokio task that owns the node's side of the transport. It runs the node's
//! timer (rounds first), hears frames from the peers' connections, takes queued requests to
//! the node in batches, sends what the node has to send, and dials peers and seeds.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::{INPUT_BATCH, INTRO_BATCH, Input, Intro, NetShared, PEER_UP_WITHIN};
use crate::clock::Clock;
use crate::decision::MeshAnswer;
use crate::mesh::node::{Admit, Event};
use crate::mesh::wire::MAX_FRAME_BYTES;
use crate::mesh::{NodeId, Transmit};
use crate::net::certs;
use crate::net::dial::{self, DialState, Failure};
use crate::net::pending::Pending;
use crate::net::seeds::SeedBook;
use crate::net::tls::{SEED_NAME, peer_id};

/// The most keys of a round the node looks at in one go: a round of many keys is split
/// into slices of this many, with the frames and requests that came meanwhile taken in
/// between (a slice takes about a millisecond at most).
const ROUND_SLICE_KEYS: usize = 128;

pub(super) struct Driver {
    shared: Arc<NetShared>,
    endpoint: quinn::Endpoint,
    inputs: mpsc::UnboundedSender<Input>,
    connections: HashMap<NodeId, quinn::Connection>,
    /// Other open connections to a peer than the one in `connections` (both sides dialed,
    /// and each kept the one it saw last): the peer may send on them, and one takes over
    /// when the current one closes.
    spares: HashMap<NodeId, Vec<quinn::Connection>>,
    addresses: HashMap<NodeId, SocketAddr>,
    /// Peers given by address (configured): dialed for as long as the node runs.
    statics: std::collections::HashSet<NodeId>,
    dials: HashMap<NodeId, DialState>,
    seeds: SeedBook,
    /// Reliable frames waiting for a connection to their peer.
    pending: Pending,
}

impl Driver {
    /// A driver for the node in `shared`, on `endpoint`, that dials the configured `peers`
    /// for as long as the node runs; `inputs` is where its tasks send what they learn.
    pub(super) fn new(
        shared: Arc<NetShared>,
        endpoint: quinn::Endpoint,
        inputs: mpsc::UnboundedSender<Input>,
        peers: &[(NodeId, SocketAddr)],
    ) -> Driver {
        Driver {
            shared,
            endpoint,
            inputs,
            connections: HashMap::new(),
            spares: HashMap::new(),
            addresses: peers.iter().copied().collect(),
            statics: peers.iter().map(|(id, _)| *id).collect(),
            dials: HashMap::new(),
            seeds: SeedBook::default(),
            pending: Pending::default(),
        }
    }

    pub(super) async fn run(
        mut self,
        mut receiver: mpsc::UnboundedReceiver<Input>,
        mut intros: mpsc::Receiver<Intro>,
    ) {
        // A round split over several calls has keys left.
        let mut rest = false;
        loop {
            if rest {
                // Between a round's slices: let the connections' tasks run, then take what
                // they and the HTTP threads queued meanwhile before the round's next keys.
                tokio::task::yield_now().await;
                for _ in 0..INPUT_BATCH.min(receiver.len()) {
                    let Ok(input) = receiver.try_recv() else {
                        break;
                    };
                    self.input(input);
                }
                if let Ok(intro) = intros.try_recv() {
                    self.introduce(intro, &mut intros);
                }
                self.flush();
                rest = self.timeout();
                self.flush();
                continue;
            }
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
                    rest = self.timeout();
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

    /// Run the node's timer now (no more than [`ROUND_SLICE_KEYS`] of a round's keys): return
    /// whether the round has keys left.
    fn timeout(&self) -> bool {
        let now = self.shared.clock.now_ns();
        self.shared
            .inner
            .lock()
            .node
            .handle_timeout_within(now, ROUND_SLICE_KEYS)
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
                    let d = shared.behind(intro.policy, intro.key, intro.cost, now);
                    let _ = intro.answer.send(d.into());
                } else {
                    match inner.node.decide(intro.policy, intro.key, intro.cost, now) {
                        Admit::Now(decision, charge) => {
                            let _ = intro.answer.send(MeshAnswer { decision, charge });
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
                // The node counts what it received and refused (`NodeStats`).
                if let Err(error) = &result {
                    tracing::debug!(peer = from, %error, "frame dropped");
                }
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
                if let Some(spares) = self.spares.get_mut(&id) {
                    spares.retain(|c| c.stable_id() != stable);
                }
                if self
                    .connections
                    .get(&id)
                    .is_some_and(|c| c.stable_id() == stable)
                {
                    let connection = self.connections.remove(&id).expect("checked above");
                    if self.promote_spare(id) {
                        return;
                    }
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
            Input::Unsent(id, stable, bytes) => {
                // A reliable frame whose stream was lost: again on the peer's connection if
                // that is another one (or still open), else on its next one.
                match self.connections.get(&id) {
                    Some(c) if c.stable_id() != stable || c.close_reason().is_none() => {
                        self.send_stream(id, c.clone(), bytes);
                    }
                    _ => self.hold(id, bytes),
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
            let tls = shared.client_tls.lock().clone();
            let result = match endpoint.connect_with(tls, addr, SEED_NAME) {
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
        for bytes in self.pending.take(id) {
            self.send_stream(id, connection.clone(), bytes);
        }
        if let Some(old) = self.connections.insert(id, connection)
            && old.close_reason().is_none()
        {
            let spares = self.spares.entry(id).or_default();
            spares.retain(|c| c.close_reason().is_none());
            spares.push(old);
        }
        let now = self.shared.clock.now_ns();
        let mut inner = self.shared.inner.lock();
        inner.connected.insert(id);
        // A member the node did not know is one now (its certificate says who it is).
        inner.node.add_member(now, id, Some(addr));
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

    /// A member reported `id` alive (or restarted): without a connection to it, dial it now
    /// rather than after the backoff its failures built up (while it was cut off, say).
    fn hurry(&mut self, id: NodeId) {
        if self.connections.contains_key(&id) || !self.addresses.contains_key(&id) {
            return;
        }
        if !self.dials.entry(id).or_default().hurry() {
            self.dial(id, Duration::ZERO);
        }
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
        let wake = Arc::clone(&state.wake);
        let endpoint = self.endpoint.clone();
        let inputs = self.inputs.clone();
        let shared = Arc::clone(&self.shared);
        tokio::spawn(async move {
            // Cut short by `hurry` (only while waiting here: no permit is stored).
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = wake.notified() => {}
            }
            if shared.closed.load(Ordering::Acquire) {
                return;
            }
            let tls = shared.client_tls.lock().clone();
            let result = match endpoint.connect_with(tls, addr, &certs::node_name(id)) {
                Err(error) => Err((Failure::Other, error.to_string())),
                Ok(connecting) => {
                    match tokio::time::timeout(dial::ATTEMPT_TIMEOUT, connecting).await {
                        Err(_) => Err(dial::describe(&quinn::ConnectionError::TimedOut)),
                        Ok(Err(error)) => Err(dial::describe(&error)),
                        // The server's certificate was checked for `id`'s name by the handshake.
                        Ok(Ok(connection)) if peer_id(&connection) == Ok(id) => Ok(connection),
                        Ok(Ok(connection)) => {
                            connection.close(1u32.into(), b"unexpected identity");
                            Err((
                                Failure::WrongIdentity,
                                format!("the node at {addr} presents another node's certificate"),
                            ))
                        }
                    }
                }
            };
            let _ = inputs.send(Input::Dialed(id, result));
        });
    }

    fn flush(&mut self) {
        let (transmits, events) = {
            let mut inner = self.shared.inner.lock();
            let mut transmits = Vec::new();
            while let Some(t) = inner.node.poll_transmit() {
                transmits.push(t);
            }
            while let Some(message) = inner.node.poll_admin() {
                inner.admin.deliver(message);
            }
            let mut events = Vec::new();
            while let Some(e) = inner.node.poll_event() {
                match e {
                    Event::Decided {
                        id,
                        decision,
                        charge,
                    } => {
                        if let Some(waiter) = inner.waiters.remove(&id) {
                            let _ = waiter.send(MeshAnswer { decision, charge });
                        }
                    }
                    // Where the member that told of it reaches it.
                    Event::PeerLearned(peer) => {
                        let addr = inner.node.membership().peer(peer).and_then(|p| p.addr);
                        events.push((e, addr));
                    }
                    e => events.push((e, None)),
                }
            }
            (transmits, events)
        };
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
            Event::PeerDown(peer) => {
                tracing::warn!(peer, "peer declared dead");
                // Its connection may only be waiting out QUIC's loss recovery, whose probes
                // grow ever further apart while the peer is cut off (until the idle timeout):
                // closed, and a fresh one dialed (and retried with backoff) from now on, the
                // link is up again soon after a cut is lifted.
                // Its spare connections too: the peer would go on sending on one of them,
                // heard here, while this node could not answer.
                for spare in self.spares.remove(&peer).unwrap_or_default() {
                    spare.close(4u32.into(), b"declared dead");
                }
                if let Some(connection) = self.connections.remove(&peer) {
                    connection.close(4u32.into(), b"declared dead");
                    self.shared.inner.lock().connected.remove(&peer);
                    self.dial(peer, Duration::ZERO);
                }
            }
            Event::PeerUp(peer) => {
                tracing::info!(peer, "peer is up");
                self.hurry(peer);
            }
            Event::PeerRestarted(peer) => {
                tracing::info!(peer, "peer restarted");
                self.hurry(peer);
            }
            Event::PeerSuspected(peer) => tracing::debug!(peer, "peer suspected (silent)"),
            Event::PeerLeft(peer) | Event::PeerForgotten(peer) => {
                if matches!(event, Event::PeerLeft(_)) {
                    tracing::info!(peer, "peer left the cluster");
                }
                let lost = self.pending.forget(peer);
                self.shared
                    .stats
                    .reliable_lost
                    .fetch_add(lost, Ordering::Relaxed);
                if !self.statics.contains(&peer) {
                    self.addresses.remove(&peer);
                    self.dials.remove(&peer);
                }
                self.spares.remove(&peer);
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

    /// The current connection to `id` closed, or there is none: make an open spare the
    /// current one; tell whether there was one.
    fn promote_spare(&mut self, id: NodeId) -> bool {
        let Some(spares) = self.spares.get_mut(&id) else {
            return false;
        };
        spares.retain(|c| c.close_reason().is_none());
        let Some(spare) = spares.pop() else {
            self.spares.remove(&id);
            return false;
        };
        self.connections.insert(id, spare);
        true
    }

    fn send(&mut self, t: Transmit) {
        if !self.connections.contains_key(&t.to) {
            self.promote_spare(t.to);
        }
        let Some(connection) = self.connections.get(&t.to) else {
            if t.reliable {
                self.hold(t.to, t.bytes);
            } else {
                self.shared.stats.unroutable.fetch_add(1, Ordering::Relaxed);
            }
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
        if !t.reliable {
            // A delta too large for a datagram: on a stream, not retried (the gossip
            // catches up).
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
            return;
        }
        self.send_stream(t.to, connection.clone(), t.bytes);
    }

    /// Send a reliable frame to `to` on a stream of `connection`; if the stream is lost
    /// before the peer acknowledged all of it, the frame comes back ([`Input::Unsent`]).
    fn send_stream(&self, to: NodeId, connection: quinn::Connection, bytes: Vec<u8>) {
        self.shared
            .stats
            .streams_sent
            .fetch_add(1, Ordering::Relaxed);
        let inputs = self.inputs.clone();
        tokio::spawn(async move {
            let sent = match connection.open_uni().await {
                Ok(mut stream) => {
                    stream.write_all(&bytes).await.is_ok()
                        && stream.finish().is_ok()
                        // `Some(code)`: the peer stopped reading it (a frame it refuses),
                        // which sending again would not change.
                        && stream.stopped().await.is_ok()
                }
                Err(_) => false,
            };
            if !sent {
                let _ = inputs.send(Input::Unsent(to, connection.stable_id(), bytes));
            }
        });
    }

    /// Keep a reliable frame for `to` until a connection to it comes up.
    fn hold(&mut self, to: NodeId, bytes: Vec<u8>) {
        let stats = &self.shared.stats;
        stats.reliable_held.fetch_add(1, Ordering::Relaxed);
        let dropped = self.pending.push(to, bytes);
        stats.reliable_lost.fetch_add(dropped, Ordering::Relaxed);
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
