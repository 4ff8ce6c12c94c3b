//! The simulated world: the nodes with their clocks, the links and the events queued on
//! them in virtual time (deliveries, ticks, crashes, drains, restarts, a partition and its
//! heal), and the baselines' counts riding the frames.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::baseline::{self, Admission, Baseline, Count};
use super::{SimConfig, measure};
use crate::clock::Nanos;
use crate::mesh::keymap::FixedMap;
use crate::mesh::message::Frame;
use crate::mesh::node::{Event as NodeEvent, Node};

#[derive(Debug)]
pub(super) enum SimEvent {
    Tick(usize),
    Deliver {
        from: usize,
        to: usize,
        incarnation: u64,
        reliable: bool,
        frame: Payload,
    },
    Crash(usize),
    Drain(usize),
    Stop(usize),
    Restart(usize),
    Heal,
    Split,
}

/// A frame on a link, and the `stale_sum` counts that ride on it.
#[derive(Debug, Clone)]
pub(super) struct Payload {
    pub(super) bytes: Vec<u8>,
    pub(super) counts: Vec<Count>,
}

pub(crate) struct SimNode {
    pub(crate) node: Option<Node>,
    /// A baseline run's rule, which decides the node's requests.
    pub(super) baseline: Option<Baseline>,
    /// `stale_sum`: the counts each peer is owed, sent with the next frame to it.
    pub(super) counts_owed: FixedMap<u64, Vec<Count>>,
    pub(crate) offset_ns: i64,
    pub(super) incarnation: u64,
    /// It drains: it takes no more requests and stops soon.
    pub(super) draining: bool,
    /// Requests waiting on this node: id → (arrival index, arrival time).
    pub(super) waiting: FixedMap<u64, (usize, Nanos)>,
    /// Windows its authorities began while they could not grant (cut off from a majority,
    /// their lease run out): `(policy, key, window, start in true time)`, recorded once the
    /// authority may grant in them, dropped once it moved on.
    pub(super) unframed: Vec<(u32, u64, u64, Nanos)>,
}

impl SimNode {
    /// `stale_sum`, after a round: owe every live peer this node's counts changed since
    /// the last round (they ride the next frame to it, the round's heartbeat).
    pub(super) fn owe_counts(&mut self) {
        let (Some(b), Some(node)) = (&mut self.baseline, &self.node) else {
            return;
        };
        let counts = b.changed_counts();
        if counts.is_empty() {
            return;
        }
        for (peer, alive) in node.members() {
            if alive && peer != node.id() {
                self.counts_owed
                    .entry(peer)
                    .or_default()
                    .extend_from_slice(&counts);
            }
        }
    }
    /// Whether a key's authority on this node frames decisions at `local`: it may grant, or
    /// its side keeps a majority (whose windows are the key's, granting or not yet).
    fn may_grant(&self, policy: u32, key: u64, local: Nanos) -> bool {
        self.node
            .as_ref()
            .is_some_and(|n| n.has_majority() || n.can_grant(policy, key, local))
    }
    pub(crate) fn local(&self, true_ns: Nanos) -> Nanos {
        (true_ns as i64 + self.offset_ns) as Nanos
    }
    pub(crate) fn true_time(&self, local_ns: Nanos) -> Nanos {
        (local_ns as i64 - self.offset_ns) as Nanos
    }
}

pub(super) struct World<'a> {
    pub(super) config: &'a SimConfig,
    pub(super) rng: fastrand::Rng,
    /// Pending events by (time, sequence number), pointing into `slots`.
    pub(super) queue: BinaryHeap<Reverse<(Nanos, u64, usize)>>,
    /// The pending events; `free` lists the empty slots.
    pub(super) slots: Vec<Option<SimEvent>>,
    pub(super) free: Vec<usize>,
    pub(super) seq: u64,
    /// Reused buffer of a node's events.
    pub(super) events: Vec<NodeEvent>,
    pub(super) nodes: Vec<SimNode>,
    pub(super) partitioned: bool,
    /// Reliable frames across the cut, waiting for the heal as the transport keeps them for
    /// a peer's next connection: (from, to, bytes, frame).
    pub(super) held: Vec<(usize, usize, usize, Payload)>,
    pub(super) bytes_sent: u64,
    pub(super) frames_dropped: u64,
    pub(super) next_tick: Vec<Nanos>,
}

impl World<'_> {
    /// The authority states on their way to node `to` (handoffs): a crash of `to` loses
    /// them.
    pub(super) fn handoffs_to(&self, to: usize) -> Vec<crate::mesh::message::AuthorityState> {
        let mut states = Vec::new();
        let on_links = self.slots.iter().flatten().filter_map(|event| match event {
            SimEvent::Deliver {
                from, to, frame, ..
            } => Some((*from, *to, frame)),
            _ => None,
        });
        let held = self
            .held
            .iter()
            .map(|(from, to, _, frame)| (*from, *to, frame));
        for (_, t, frame) in on_links.chain(held) {
            if t != to {
                continue;
            }
            let items = crate::mesh::wire::decode::<Frame>(&frame.bytes)
                .map(|f| f.items)
                .unwrap_or_default();
            for item in items {
                if let crate::mesh::message::Item::Handoff(state) = item {
                    states.push(state);
                }
            }
        }
        states
    }

    pub(super) fn push(&mut self, at: Nanos, event: SimEvent) {
        self.seq += 1;
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(event);
                slot
            }
            None => {
                self.slots.push(Some(event));
                self.slots.len() - 1
            }
        };
        self.queue.push(Reverse((at, self.seq, slot)));
    }

    /// Remove the earliest event.
    pub(super) fn pop(&mut self) -> Option<SimEvent> {
        let Reverse((_, _, slot)) = self.queue.pop()?;
        self.free.push(slot);
        self.slots[slot].take()
    }

    pub(super) fn cut(&self, a: usize, b: usize) -> bool {
        match self.config.partition {
            Some(p) if self.partitioned => (a < p.minority) != (b < p.minority),
            _ => false,
        }
    }

    pub(super) fn start_node(&mut self, i: usize, now: Nanos) {
        let local = self.nodes[i].local(now);
        self.nodes[i].incarnation += 1;
        let incarnation = local.max(1) + self.nodes[i].incarnation;
        let node = Node::new(self.config.node_config(i, incarnation), local)
            .expect("valid simulated config");
        self.nodes[i].node = Some(node);
        self.nodes[i].counts_owed.clear();
        self.nodes[i].baseline = (self.config.admission != Admission::Leases).then(|| {
            Baseline::new(
                self.config.admission,
                self.config.nodes,
                vec![self.config.policy],
            )
        });
        self.schedule(i, now);
    }

    /// Make sure node `i` has a tick queued for its next timeout.
    pub(super) fn schedule(&mut self, i: usize, now: Nanos) {
        if !self.config.admission.talks() {
            // A rule that decides alone needs no rounds, and sends nothing.
            return;
        }
        let Some(node) = &self.nodes[i].node else {
            return;
        };
        let at = self.nodes[i].true_time(node.poll_timeout()).max(now + 1);
        if at < self.next_tick[i] || self.next_tick[i] <= now {
            self.next_tick[i] = at;
            self.push(at, SimEvent::Tick(i));
        }
    }

    /// Move node `i`'s outgoing frames onto the links (a rule that decides alone sends
    /// nothing).
    pub(super) fn flush(&mut self, i: usize, now: Nanos) {
        let talks = self.config.admission.talks();
        loop {
            let Some(node) = self.nodes[i].node.as_mut() else {
                return;
            };
            let Some(t) = node.poll_transmit() else {
                return;
            };
            if !talks {
                continue;
            }
            let counts = self.nodes[i].counts_owed.remove(&t.to).unwrap_or_default();
            let len = t.bytes.len() + baseline::counts_len(&counts);
            let frame = Payload {
                bytes: t.bytes,
                counts,
            };
            self.send(i, now, t.to as usize, len, t.reliable, frame);
        }
    }

    /// Put a frame of `len` bytes from node `i` for node `to` on the link (a datagram may be
    /// lost or duplicated).
    pub(super) fn send(
        &mut self,
        i: usize,
        now: Nanos,
        to: usize,
        len: usize,
        reliable: bool,
        frame: Payload,
    ) {
        if to >= self.nodes.len() {
            return;
        }
        if self.cut(i, to) {
            if reliable {
                self.held.push((i, to, len, frame));
            }
            return;
        }
        self.bytes_sent += len as u64;
        let copies = if reliable {
            1
        } else if self.rng.f64() < self.config.loss {
            0
        } else if self.rng.f64() < self.config.duplication {
            2
        } else {
            1
        };
        let mut frame = Some(frame);
        for copy in 0..copies {
            let jitter = if self.config.jitter_ns > 0 {
                self.rng.u64(0..=self.config.jitter_ns)
            } else {
                0
            };
            let at = now + self.config.latency_ns + jitter;
            let incarnation = self.nodes[to].incarnation;
            let frame = if copy + 1 == copies {
                frame.take()
            } else {
                frame.clone()
            };
            let Some(frame) = frame else { return };
            self.push(
                at,
                SimEvent::Deliver {
                    from: i,
                    to,
                    incarnation,
                    reliable,
                    frame,
                },
            );
        }
    }
}

pub(super) fn drain_events(
    world: &mut World<'_>,
    record: &mut measure::Recorder,
    i: usize,
    now: Nanos,
) {
    let offset = world.nodes[i].offset_ns;
    let local = world.nodes[i].local(now);
    let Some(node) = world.nodes[i].node.as_mut() else {
        return;
    };
    let mut events = std::mem::take(&mut world.events);
    while let Some(event) = node.poll_event() {
        events.push(event);
    }
    for event in events.drain(..) {
        match event {
            NodeEvent::Decided { id, decision, .. } => {
                if let Some((index, at)) = world.nodes[i].waiting.remove(&id) {
                    record.decided(index, now, decision.is_allowed(), now - at);
                }
            }
            NodeEvent::Window {
                policy,
                key,
                window,
                start,
            } => {
                let start = (start as i64 - offset).max(0) as Nanos;
                let sim_node = &mut world.nodes[i];
                sim_node
                    .unframed
                    .retain(|&(p, k, ..)| (p, k) != (policy, key));
                if sim_node.may_grant(policy, key, local) {
                    record.window(key - 1, window, start);
                } else {
                    sim_node.unframed.push((policy, key, window, start));
                }
            }
            NodeEvent::PeerDown(p) | NodeEvent::PeerLeft(p) => record.peer_down(now, p as usize),
            NodeEvent::PeerRestarted(p) => {
                if let Some(b) = &mut world.nodes[i].baseline {
                    b.forget(p);
                }
            }
            _ => {}
        }
    }
    world.events = events;
    frame_unframed(&mut world.nodes[i], record, local);
}

/// Windows a node's authorities began while they could not grant frame the decisions they
/// grant from once they may (a cut-off owner whose side regained a majority): recorded then;
/// those the authority moved on from (or lost) framed nothing.
fn frame_unframed(sim_node: &mut SimNode, record: &mut measure::Recorder, local: Nanos) {
    if sim_node.unframed.is_empty() {
        return;
    }
    let mut unframed = std::mem::take(&mut sim_node.unframed);
    unframed.retain(|&(policy, key, window, start)| {
        let current = sim_node
            .node
            .as_ref()
            .and_then(|n| n.authority(policy, key))
            .map(|a| a.frame().0);
        if current != Some(window) {
            return false;
        }
        if sim_node.may_grant(policy, key, local) {
            record.window(key - 1, window, start);
            return false;
        }
        true
    });
    sim_node.unframed = unframed;
}
