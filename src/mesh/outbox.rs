//! What a node has to say to each peer, packed into frames: small items into datagrams of at
//! most `max_datagram_bytes` (a lost one is harmless: every item is cumulative and sent
//! again while it matters), state transfers (handoffs, sync answers) into reliable frames
//! that travel on streams. The checks every frame from a peer passes are the wire's
//! ([`crate::mesh::wire::check`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::mesh::NodeId;
use crate::mesh::message::{AuthorityState, Ext, Header, Item, KeyRef};
use crate::mesh::wire::check::MAX_ITEMS;
use crate::mesh::wire::{self, MAX_FRAME_BYTES};

/// Bytes for one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The peer.
    pub to: NodeId,
    /// One frame.
    pub bytes: Vec<u8>,
    /// Send on a stream (state transfers) rather than as a datagram.
    pub reliable: bool,
}

/// Items waiting for the next flush, per peer.
///
/// Datagram items are sent within a byte budget per round ([`Outbox::new_round`]), most
/// urgent first: membership news and state transfers are never held back; answers,
/// recalls and wants that requests wait on, or that close a window, come next; reports and
/// backups last, within half of the round's budget (the other half stays for urgent items
/// met later in the round). What the budget cannot carry waits for the next round, where a
/// newer item of the same kind for the same key replaces it (counts are cumulative). Every
/// peer owed a heartbeat ([`Outbox::heartbeat`]) gets a frame whatever the budget.
#[derive(Debug)]
pub(crate) struct Outbox {
    datagram: Queues,
    reliable: BTreeMap<NodeId, Vec<Item>>,
    /// Extension items ([`Item::Ext`]), sent on streams in frames of their own: a node of
    /// the previous wire refuses a frame that carries one, and loses only them.
    ext: BTreeMap<NodeId, Vec<Item>>,
    /// Peers owed a frame at the next flush (heartbeats), sorted and deduplicated by the
    /// flush (kept from flush to flush).
    beats: Vec<NodeId>,
    /// Items the budget held back, for the next round.
    deferred: BTreeMap<NodeId, Vec<Item>>,
    /// Items held back in an earlier round, to send before newer ones unless one of those
    /// replaces them.
    carried: BTreeMap<NodeId, Vec<Item>>,
    /// Bytes of datagram items left in this round's budget.
    budget: usize,
    /// Of them, what routine items may still take.
    routine_budget: usize,
    /// Items held back by the budget so far.
    held_back: u64,
    /// Scratch of a flush, kept for the next: every peer's items in turn with their length
    /// and whether they go now, where each peer's begin, the routine items' places, and the
    /// frames (item count, length bound) of one peer.
    planned: Vec<Planned>,
    peers: Vec<(NodeId, usize)>,
    routine: Vec<usize>,
    frames: Vec<(usize, usize)>,
}

impl Default for Outbox {
    fn default() -> Self {
        Outbox {
            datagram: Queues::default(),
            reliable: BTreeMap::new(),
            ext: BTreeMap::new(),
            beats: Vec::new(),
            deferred: BTreeMap::new(),
            carried: BTreeMap::new(),
            budget: usize::MAX,
            routine_budget: usize::MAX,
            held_back: 0,
            planned: Vec::new(),
            peers: Vec::new(),
            routine: Vec::new(),
            frames: Vec::new(),
        }
    }
}

/// The most entries a flush's scratch keeps for the next flush.
const MAX_KEPT_SCRATCH: usize = 1024;

/// Items queued per peer, in the order of the peers' ids (a flush sends to them in that
/// order), and the lists of earlier flushes kept empty for reuse.
#[derive(Debug, Default)]
struct Queues {
    /// Each peer with something queued (or owed a frame), by id.
    by_peer: Vec<(NodeId, Vec<Item>)>,
    /// Emptied lists, their room kept.
    spare: Vec<Vec<Item>>,
}

/// The most emptied per-peer lists the outbox keeps, and the most items' room each keeps
/// (a flush usually has a few items per peer; a burst's longer lists are not kept).
const MAX_SPARE_QUEUES: usize = 64;
const MAX_SPARE_QUEUE_ITEMS: usize = 64;

impl Queues {
    /// `to`'s list, made (empty) if it has none.
    fn entry(&mut self, to: NodeId) -> &mut Vec<Item> {
        let at = match self.by_peer.binary_search_by_key(&to, |&(peer, _)| peer) {
            Ok(at) => at,
            Err(at) => {
                let list = self.spare.pop().unwrap_or_default();
                self.by_peer.insert(at, (to, list));
                at
            }
        };
        &mut self.by_peer[at].1
    }

    fn is_empty(&self) -> bool {
        self.by_peer.is_empty()
    }
}

/// The most items held back for one peer; beyond them the oldest are dropped, as a lost
/// datagram would be (every item is cumulative and sent again while it matters).
pub(crate) const MAX_DEFERRED_PER_PEER: usize = 65_536;

/// How urgent an item is under the budget: 0 never held back, 1 before 2.
fn urgency(item: &Item) -> u8 {
    match item {
        Item::Members(_)
        | Item::Limits(_)
        | Item::Ext(_)
        | Item::SyncDone
        | Item::Handoff(_)
        | Item::Restore(_) => 0,
        Item::Grant(_) | Item::Recall { .. } | Item::NotOwner(_) => 1,
        Item::Want(w) if w.need > 0 || w.refill || w.closed || w.previous_used.is_some() => 1,
        Item::Want(_) | Item::Backup(_) | Item::Retired => 2,
    }
}

/// What an item replaces an older one of, to the same peer: wants and grants carry
/// cumulative counts (per holding and, for a grant, per window), a backup a whole state, a
/// recall what the holder may keep now.
type Supersedes = (u8, KeyRef, u64, u64);

fn supersedes(item: &Item) -> Option<Supersedes> {
    match item {
        Item::Want(w) => Some((0, w.key, w.holding, 0)),
        Item::Backup(state) => Some((1, state.key, 0, 0)),
        Item::Grant(g) => Some((2, g.key, g.holding, g.window)),
        Item::Recall { key, .. } => Some((3, *key, 0, 0)),
        _ => None,
    }
}

impl Outbox {
    /// Queue `item` for `to` on a datagram.
    pub(crate) fn push(&mut self, to: NodeId, item: Item) {
        self.datagram.entry(to).push(item);
    }

    /// Queue a backup for `to`, replacing one of the same key among the last few queued
    /// (a newer state supersedes an older one).
    pub(crate) fn push_backup(&mut self, to: NodeId, state: AuthorityState) {
        let queue = self.datagram.entry(to);
        let recent = queue.len().saturating_sub(8);
        for item in &mut queue[recent..] {
            if let Item::Backup(old) = item
                && old.key == state.key
            {
                *old = state;
                return;
            }
        }
        queue.push(Item::Backup(state));
    }

    /// Queue `item` for `to` on a reliable frame.
    pub(crate) fn push_reliable(&mut self, to: NodeId, item: Item) {
        self.reliable.entry(to).or_default().push(item);
    }

    /// Queue the extension item `ext` for `to`, on a stream, in a frame that carries only
    /// extension items.
    pub(crate) fn push_ext(&mut self, to: NodeId, ext: Ext) {
        self.ext.entry(to).or_default().push(Item::Ext(ext));
    }

    /// Tell whether anything waits to be sent now (items the budget held back wait for the
    /// next round).
    pub(crate) fn is_empty(&self) -> bool {
        self.datagram.is_empty()
            && self.reliable.is_empty()
            && self.ext.is_empty()
            && self.beats.is_empty()
            && self.carried.is_empty()
    }

    /// Begin a round with `budget` bytes for datagram items (half of them for routine
    /// ones): what earlier rounds held back goes first, unless a newer item replaces it.
    pub(crate) fn new_round(&mut self, budget: usize) {
        // What the last round left unspent carries over, up to one round's worth (a burst
        // right after the rounds of every node begin need not wait a round).
        self.budget = budget.saturating_add(self.budget.min(budget));
        self.routine_budget = budget / 2;
        for (to, mut old) in std::mem::take(&mut self.deferred) {
            self.carried.entry(to).or_default().append(&mut old);
        }
    }

    /// Return how many items the budget has held back so far.
    pub(crate) fn held_back(&self) -> u64 {
        self.held_back
    }

    /// Pack everything into frames; `header` builds each frame's header for a peer.
    pub(crate) fn flush(
        &mut self,
        max_datagram_bytes: usize,
        mut header: impl FnMut(NodeId) -> Header,
        out: &mut Vec<Transmit>,
    ) {
        let mut frames = std::mem::take(&mut self.frames);
        let ext = std::mem::take(&mut self.ext);
        for (to, items) in ext.into_iter().chain(std::mem::take(&mut self.reliable)) {
            let h = header(to);
            split(
                &h,
                items.iter().map(item_len),
                MAX_FRAME_BYTES - 1,
                &mut frames,
            );
            let sized = items.iter().map(|item| {
                let len = item_len(item);
                (item, len)
            });
            emit(to, &h, sized, &frames, None, out);
            frames.clear();
        }
        let mut beats = std::mem::take(&mut self.beats);
        beats.sort_unstable();
        beats.dedup();
        let mut queues = std::mem::take(&mut self.datagram);
        for (to, old) in std::mem::take(&mut self.carried) {
            let queue = queues.entry(to);
            let newer: BTreeSet<Supersedes> = queue.iter().filter_map(supersedes).collect();
            let mut merged: Vec<Item> = old
                .into_iter()
                .filter(|item| supersedes(item).is_none_or(|k| !newer.contains(&k)))
                .collect();
            merged.append(queue);
            *queue = merged;
        }
        for &to in &beats {
            queues.entry(to);
        }
        // The budget goes to the urgent items of every peer before any routine one; the
        // items sent keep the order they were queued in. `planned` lists every peer's items
        // in turn, `peers` where each peer's begin (scratch kept from flush to flush).
        let mut planned = std::mem::take(&mut self.planned);
        let mut peers = std::mem::take(&mut self.peers);
        let mut routine = std::mem::take(&mut self.routine);
        let Queues { by_peer, spare } = &mut queues;
        for (to, mut items) in by_peer.drain(..) {
            peers.push((to, planned.len()));
            for item in items.drain(..) {
                let len = item_len(&item);
                let send = match urgency(&item) {
                    0 => true,
                    1 => {
                        let fits = len <= self.budget;
                        if fits {
                            self.budget -= len;
                        }
                        fits
                    }
                    _ => {
                        routine.push(planned.len());
                        false
                    }
                };
                planned.push((item, len, send));
            }
            if spare.len() < MAX_SPARE_QUEUES && items.capacity() <= MAX_SPARE_QUEUE_ITEMS {
                spare.push(items);
            }
        }
        // The peers' lists, emptied, serve the next flush.
        self.datagram = queues;
        for &at in &routine {
            let entry = &mut planned[at];
            let len = entry.1;
            if len <= self.budget.min(self.routine_budget) {
                self.budget -= len;
                self.routine_budget -= len;
                entry.2 = true;
            }
        }
        routine.clear();
        for (index, &(to, begin)) in peers.iter().enumerate() {
            let end = peers
                .get(index + 1)
                .map_or(planned.len(), |&(_, next)| next);
            let mine = &mut planned[begin..end];
            if !mine.iter().any(|(_, _, go)| *go) && beats.binary_search(&to).is_err() {
                continue;
            }
            let h = header(to);
            split(
                &h,
                mine.iter().filter(|(_, _, go)| *go).map(|(_, len, _)| *len),
                max_datagram_bytes.saturating_sub(1),
                &mut frames,
            );
            // The items sent are encoded into their frames; the others
            // are held for the next round below.
            let items = mine
                .iter()
                .filter(|(_, _, go)| *go)
                .map(|(item, len, _)| (item, *len));
            emit(to, &h, items, &frames, Some(max_datagram_bytes), out);
            frames.clear();
        }
        if frames.capacity() <= MAX_KEPT_SCRATCH {
            self.frames = frames;
        }
        // What the budget held back waits for the next round.
        let mut held = Vec::new();
        let mut next = peers.iter().skip(1).map(|&(_, begin)| begin);
        let mut bound = next.next().unwrap_or(usize::MAX);
        let mut peer = peers.iter().map(|&(to, _)| to);
        let mut to = peer.next();
        for (at, (item, _, go)) in planned.drain(..).enumerate() {
            while at >= bound {
                self.hold(to, &mut held);
                bound = next.next().unwrap_or(usize::MAX);
                to = peer.next();
            }
            if !go {
                held.push(item);
            }
        }
        self.hold(to, &mut held);
        peers.clear();
        // A flush after a burst may have grown the scratch: that much is not kept.
        if planned.capacity() <= MAX_KEPT_SCRATCH {
            self.planned = planned;
        }
        if routine.capacity() <= MAX_KEPT_SCRATCH {
            self.routine = routine;
        }
        self.peers = peers;
        beats.clear();
        if beats.capacity() <= MAX_KEPT_SCRATCH {
            self.beats = beats;
        }
    }

    /// Keep the items in `held` (taken from it) for `to`'s next round.
    fn hold(&mut self, to: Option<NodeId>, held: &mut Vec<Item>) {
        let Some(to) = to else {
            return;
        };
        if held.is_empty() {
            return;
        }
        self.held_back += held.len() as u64;
        let queue = self.deferred.entry(to).or_default();
        // A newer item replaces one held earlier for the same key.
        let newer: BTreeSet<Supersedes> = held.iter().filter_map(supersedes).collect();
        if !queue.is_empty() && !newer.is_empty() {
            queue.retain(|item| supersedes(item).is_none_or(|k| !newer.contains(&k)));
        }
        queue.append(held);
        let excess = queue.len().saturating_sub(MAX_DEFERRED_PER_PEER);
        queue.drain(..excess);
    }

    /// Owe `to` a frame at the next flush (a heartbeat): an empty one unless something
    /// else goes there.
    pub(crate) fn heartbeat(&mut self, to: NodeId) {
        self.beats.push(to);
    }
}

/// An item to send now or hold back: the item, its [`item_len`], and whether it goes now.
type Planned = (Item, usize, bool);

/// What [`item_len`] adds to an item's own bytes: room for the frame's count prefix.
const ITEM_SLACK: usize = 2;

/// The bytes `item` takes in a frame, plus [`ITEM_SLACK`] for the count prefix.
fn item_len(item: &Item) -> usize {
    wire::encoded_len(item).saturating_add(ITEM_SLACK)
}

/// Encode `items` (each with its [`item_len`]) after `header` as the frames `frames` lists
/// (item count, length bound), for `to`: on a stream, or as datagrams if
/// `max_datagram_bytes` is given (a frame larger than that, a big backup, still goes on a
/// stream). A frame that fails to encode (larger than any frame a peer accepts) is dropped.
fn emit<'a>(
    to: NodeId,
    header: &Header,
    mut items: impl Iterator<Item = (&'a Item, usize)>,
    frames: &[(usize, usize)],
    max_datagram_bytes: Option<usize>,
    out: &mut Vec<Transmit>,
) {
    let reliable = |len: usize| max_datagram_bytes.is_none_or(|max| len > max);
    for &(count, len) in frames {
        let mut chunk = items.by_ref().take(count);
        let encoded = wire::encode_frame(header, count, chunk.by_ref().map(|(i, _)| i), len);
        // A frame that failed to encode leaves the next its own items.
        chunk.for_each(drop);
        if let Ok(bytes) = encoded {
            out.push(Transmit {
                to,
                reliable: reliable(bytes.len()),
                bytes,
            });
        }
    }
}

/// Split items of the lengths `lens` (each an [`item_len`]) into frames after `header` whose
/// bodies stay within `budget` bytes (an item larger than the budget gets a frame of its
/// own): push each frame's item count and an upper bound of its encoded length (the version
/// byte included) to `frames`.
fn split(
    header: &Header,
    lens: impl Iterator<Item = usize>,
    budget: usize,
    frames: &mut Vec<(usize, usize)>,
) {
    // The header and the empty item list's length.
    let base = wire::encoded_len(header) + 1;
    let mut count = 0;
    let mut size = base;
    for len in lens {
        if count > 0 && (size + len > budget || count >= MAX_ITEMS) {
            frames.push((count, size + 1));
            size = base;
            count = 0;
        }
        size += len;
        count += 1;
    }
    if count > 0 || frames.is_empty() {
        frames.push((count, size + 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::message::{Grant, KeyRef, Want};
    use crate::mesh::tally::Tally;
    use crate::mesh::wire::check::decode;

    fn grant(key: u64) -> Item {
        Item::Grant(Grant {
            key: KeyRef { policy: 0, key },
            window: 1 << 40,
            granted: 1 << 30,
            ends_at: 1 << 60,
            retry_after: 0,
            more_coming: 0,
            answers: 0,
            holding: 1 << 40,
        })
    }

    #[test]
    fn datagrams_stay_under_the_limit() {
        let mut outbox = Outbox::default();
        for k in 0..500 {
            outbox.push(2, grant(u64::MAX - k));
        }
        let mut out = Vec::new();
        outbox.flush(
            1150,
            |_| Header {
                incarnation: 1,
                sent_at: u64::MAX >> 1,
                ..Header::default()
            },
            &mut out,
        );
        assert!(out.len() > 10);
        assert!(out.iter().all(|t| t.bytes.len() <= 1150 && !t.reliable));
        let policies =
            [crate::Policy::fixed_window(10, std::time::Duration::from_secs(1)).unwrap()];
        let items: usize = out
            .iter()
            .map(|t| decode(&t.bytes, &policies).unwrap().items.len())
            .sum();
        assert_eq!(items, 500);
    }

    fn want(key: u64, need: u64, used: u64) -> Item {
        Item::Want(Want {
            key: KeyRef { policy: 0, key },
            window: 0,
            tally: Tally {
                granted: 100,
                returned: 0,
                used,
            },
            closed: false,
            need,
            smallest: 1,
            seq: 1,
            refill: false,
            demand: 16,
            spent_ago: 0,
            previous_used: None,
            holding: 1,
        })
    }

    fn header(_: NodeId) -> Header {
        Header {
            incarnation: 1,
            sent_at: 1,
            ..Header::default()
        }
    }

    fn sent(out: &[Transmit]) -> Vec<(NodeId, Item)> {
        let policies =
            [crate::Policy::fixed_window(1000, std::time::Duration::from_secs(1)).unwrap()];
        out.iter()
            .flat_map(|t| {
                decode(&t.bytes, &policies)
                    .unwrap()
                    .items
                    .into_iter()
                    .map(move |i| (t.to, i))
            })
            .collect()
    }

    #[test]
    fn the_budget_sends_the_urgent_items_first_and_the_rest_next_round() {
        let mut outbox = Outbox::default();
        let report = wire::encoded_len(&want(1, 0, 5)) + 2;
        let urgent = wire::encoded_len(&want(1, 3, 5)) + 2;
        // Room for the two urgent items and one report (reports take at most half).
        outbox.new_round(2 * urgent + report.max(urgent));
        for k in 0..4 {
            outbox.push(2, want(k, 0, 5)); // reports
        }
        outbox.push(2, want(10, 3, 5)); // requests wait on these
        outbox.push(3, want(11, 2, 5));
        outbox.heartbeat(4);
        let mut out = Vec::new();
        outbox.flush(1150, header, &mut out);
        let items = sent(&out);
        let keys: Vec<u64> = items
            .iter()
            .map(|(_, i)| match i {
                Item::Want(w) => w.key.key,
                _ => unreachable!(),
            })
            .collect();
        assert!(keys.contains(&10) && keys.contains(&11), "{keys:?}");
        assert_eq!(items.len(), 3, "{keys:?}");
        assert_eq!(outbox.held_back(), 3);
        // The heartbeat went, with no item.
        assert!(out.iter().any(|t| t.to == 4));
        // Nothing more is sent before the next round.
        assert!(outbox.is_empty());
        // A newer report of key 1 replaces the held one; the others go now.
        outbox.new_round(usize::MAX);
        outbox.push(2, want(1, 0, 9));
        let mut out = Vec::new();
        outbox.flush(1150, header, &mut out);
        let mut reports: Vec<(u64, u64)> = sent(&out)
            .into_iter()
            .map(|(_, i)| match i {
                Item::Want(w) => (w.key.key, w.tally.used),
                _ => unreachable!(),
            })
            .collect();
        reports.sort_unstable();
        assert_eq!(reports, vec![(1, 9), (2, 5), (3, 5)]);
    }

    #[test]
    fn membership_and_heartbeats_pass_an_exhausted_budget() {
        let mut outbox = Outbox::default();
        outbox.new_round(0);
        outbox.push(2, want(1, 3, 0));
        outbox.push(2, Item::SyncDone);
        outbox.heartbeat(3);
        let mut out = Vec::new();
        outbox.flush(1150, header, &mut out);
        let items = sent(&out);
        assert_eq!(items, vec![(2, Item::SyncDone)]);
        assert!(out.iter().any(|t| t.to == 3));
        assert_eq!(outbox.held_back(), 1);
    }

    #[test]
    fn extension_items_travel_on_streams_in_frames_of_their_own() {
        let mut outbox = Outbox::default();
        let ext = Ext {
            kind: 99,
            body: vec![7; 16],
        };
        outbox.push(2, want(1, 3, 0));
        outbox.push_reliable(2, Item::SyncDone);
        outbox.push_ext(2, ext.clone());
        outbox.push_ext(2, ext.clone());
        let mut out = Vec::new();
        outbox.flush(1150, header, &mut out);
        let policies =
            [crate::Policy::fixed_window(1000, std::time::Duration::from_secs(1)).unwrap()];
        let frames: Vec<(bool, Vec<Item>)> = out
            .iter()
            .map(|t| (t.reliable, decode(&t.bytes, &policies).unwrap().items))
            .collect();
        let with_ext: Vec<&(bool, Vec<Item>)> = frames
            .iter()
            .filter(|(_, items)| items.iter().any(|i| matches!(i, Item::Ext(_))))
            .collect();
        assert_eq!(with_ext.len(), 1, "{frames:?}");
        assert!(with_ext[0].0, "on a stream");
        assert_eq!(with_ext[0].1, vec![Item::Ext(ext.clone()), Item::Ext(ext)]);
        // The other items went as before: the want on a datagram, the sync on a stream.
        assert_eq!(frames.len(), 3, "{frames:?}");
    }

    #[test]
    fn frames_are_encoded_as_the_frame_holding_their_items_would_be() {
        let len = |item: &Item| wire::encoded_len(item) + 2;
        let filled = || {
            let mut outbox = Outbox::default();
            let (mut urgent, mut routine) = (0, 0);
            for k in 0..300 {
                let (g, w) = (grant(u64::MAX - k), want(k, k % 2, 5));
                urgent += len(&g);
                if k % 2 == 1 {
                    urgent += len(&w);
                } else {
                    routine += len(&w);
                }
                outbox.push(2 + k % 3, g);
                outbox.push(2 + k % 3, w);
            }
            // Room for every urgent item and half of the reports (none carried over).
            outbox.new_round(0);
            outbox.new_round(urgent + routine / 2);
            outbox.push_reliable(7, Item::SyncDone);
            outbox.heartbeat(9);
            outbox
        };
        let mut outbox = filled();
        let mut out = Vec::new();
        outbox.flush(1150, header, &mut out);
        let policies =
            [crate::Policy::fixed_window(1000, std::time::Duration::from_secs(1)).unwrap()];
        // Several datagrams for each of three peers, one frame on a stream, a heartbeat.
        assert!(out.len() > 6, "{}", out.len());
        for t in &out {
            let frame = decode(&t.bytes, &policies).unwrap();
            assert_eq!(wire::encode(&frame).unwrap(), t.bytes);
        }
        assert!(out.iter().any(|t| t.to == 7 && t.reliable));
        assert!(out.iter().any(|t| t.to == 9));
        // The budget held reports back for every peer.
        assert!(outbox.held_back() > 0);
        let sent = sent(&out).len() as u64;
        assert_eq!(sent + outbox.held_back(), 601);
    }
}
