//! When a node must run next: its rounds, and every instant a key needs it.
//!
//! One owner for the node's scheduling, as quinn's timer table is for a connection: the
//! round's number and when the next begins; the timers (each key's next deadline, queued
//! with the instant the key keeps here, so a timer whose key's instant moved or went is
//! stale and skipped); the keys touched since the last call, those the next round looks at,
//! those at rest until a later round, and those whose demand still fades; and a round split
//! over several calls. The node decides what a key's deadline is and what its round does;
//! this part decides when. [`Schedule::next_timeout`] is the node's `poll_timeout`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::collections::hash_map::Entry;

use crate::clock::Nanos;
use crate::mesh::keymap::FixedMap;
use crate::mesh::message::KeyRef;

/// The most keys' room the lists of due keys keep from one timeout to the next.
const MAX_KEPT_DUE: usize = 4096;

/// The node's rounds and the instants its keys need it.
#[derive(Debug)]
pub(super) struct Schedule {
    /// The current round's number (the local clock over the gossip interval).
    round: u64,
    /// When the next round begins.
    next_tick: Nanos,
    /// The node's count of rounds whose look at the keys is done: the last round's during
    /// its keys' looks, that round's afterwards.
    rounds_done: u64,
    /// When each key needs the node next, earliest first. An entry is live while it is the
    /// instant `queued` keeps for its key.
    timers: BinaryHeap<Reverse<(Nanos, KeyRef)>>,
    /// The instant each key was last queued for.
    queued: FixedMap<KeyRef, Nanos>,
    /// Keys changed since the last call: their timers are armed before it returns.
    touched: Vec<KeyRef>,
    /// Keys the next round looks at: changed since the last round, or with work left.
    candidates: Vec<KeyRef>,
    /// Keys whose holding is at rest, by the round at which to look at them again (an
    /// entry may be stale: looking at a key early is harmless).
    wakes: BinaryHeap<Reverse<(u64, KeyRef)>>,
    /// Holdings at rest whose demand still fades, by the round at which it reaches 0: a
    /// round later than the next one (a late node) looks at them, as it would report it.
    fading: Vec<(u64, KeyRef)>,
    /// The current round's keys, in order (kept between the calls a round is split over).
    due: Vec<KeyRef>,
    /// While a round is split over several calls: where its keys not looked at yet begin,
    /// and the instant of the last call.
    round_left: Option<(usize, Nanos)>,
    /// Scratch of a timeout outside a round's start: the keys due.
    deadline_keys: Vec<KeyRef>,
}

impl Schedule {
    /// The schedule of a node started at `now`, with rounds every `interval` ns.
    pub(super) fn new(now: Nanos, interval: Nanos) -> Self {
        Schedule {
            round: now / interval,
            next_tick: (now / interval + 1) * interval,
            rounds_done: 0,
            timers: BinaryHeap::new(),
            queued: FixedMap::default(),
            touched: Vec::new(),
            candidates: Vec::new(),
            wakes: BinaryHeap::new(),
            fading: Vec::new(),
            due: Vec::new(),
            round_left: None,
            deadline_keys: Vec::new(),
        }
    }

    /// When the node must be called again, at the latest: at once while a round is split
    /// over several calls, else the next round or the earliest timer.
    #[inline]
    pub(super) fn next_timeout(&self) -> Nanos {
        if let Some((_, at)) = self.round_left {
            return at;
        }
        match self.timers.peek() {
            Some(Reverse((at, _))) => self.next_tick.min(*at),
            None => self.next_tick,
        }
    }

    /// The current round's number.
    #[inline]
    pub(super) fn round(&self) -> u64 {
        self.round
    }

    /// When the next round begins.
    #[inline]
    pub(super) fn next_tick(&self) -> Nanos {
        self.next_tick
    }

    /// The count of rounds whose look at the keys is done.
    #[inline]
    pub(super) fn rounds_done(&self) -> u64 {
        self.rounds_done
    }

    /// Tell whether a round is split over calls and has keys left.
    pub(super) fn round_unfinished(&self) -> bool {
        self.round_left.is_some()
    }

    /// Begin the round that `now` falls in (rounds of `interval` ns), the node's
    /// `rounds`-th; return the previous round's number.
    pub(super) fn begin_round(&mut self, now: Nanos, interval: Nanos, rounds: u64) -> u64 {
        let previous = self.round;
        self.round = now / interval;
        self.next_tick = (self.round + 1) * interval;
        self.rounds_done = rounds - 1;
        previous
    }

    /// Note that `key` changed in this call.
    #[inline]
    pub(super) fn touch(&mut self, key: KeyRef) {
        self.touched.push(key);
    }

    /// Queue `at`, the next instant `key` needs the node (`None`: none), unless it is the
    /// one queued already.
    pub(super) fn arm(&mut self, key: KeyRef, at: Option<Nanos>) {
        match (self.queued.entry(key), at) {
            (Entry::Occupied(e), Some(at)) if *e.get() == at => {}
            (Entry::Occupied(mut e), Some(at)) => {
                e.insert(at);
                self.timers.push(Reverse((at, key)));
            }
            (Entry::Vacant(e), Some(at)) => {
                e.insert(at);
                self.timers.push(Reverse((at, key)));
            }
            (Entry::Occupied(e), None) => {
                e.remove();
            }
            (Entry::Vacant(_), None) => {}
        }
    }

    /// Tell whether the timers' entry `(at, key)` is the instant queued for `key`.
    #[inline]
    fn is_queued(&self, at: Nanos, key: KeyRef) -> bool {
        self.queued.get(&key) == Some(&at)
    }

    /// `key`'s queued instant, up to `now`, has been taken from the timers.
    pub(super) fn fired(&mut self, key: KeyRef, now: Nanos) {
        if let Entry::Occupied(e) = self.queued.entry(key)
            && *e.get() <= now
        {
            e.remove();
        }
    }

    /// `key` is gone from the node (no holding, no authority): nothing is queued for it.
    pub(super) fn forget(&mut self, key: KeyRef) {
        self.queued.remove(&key);
    }

    /// Take the timers' entries due at `now` that are live (queued, or `busy`: a key whose
    /// every look may find room for its waiting requests) into `due`.
    fn pop_due(&mut self, now: Nanos, due: &mut Vec<KeyRef>, busy: &impl Fn(KeyRef) -> bool) {
        while let Some(&Reverse((at, key))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            if self.is_queued(at, key) || busy(key) {
                due.push(key);
            }
        }
    }

    /// Drop the timers' first entries while they are not live, so that
    /// [`Schedule::next_timeout`] names an instant the node has something to do at.
    pub(super) fn drop_stale_timers(&mut self, busy: impl Fn(KeyRef) -> bool) {
        while let Some(&Reverse((at, key))) = self.timers.peek() {
            if self.is_queued(at, key) || busy(key) {
                return;
            }
            self.timers.pop();
        }
    }

    /// The keys whose deadlines are due at `now`, outside a round's start, sorted; give
    /// the list back with [`Schedule::keep_deadline_keys`].
    pub(super) fn deadline_keys(
        &mut self,
        now: Nanos,
        busy: impl Fn(KeyRef) -> bool,
    ) -> Vec<KeyRef> {
        let mut due = std::mem::take(&mut self.deadline_keys);
        self.pop_due(now, &mut due, &busy);
        due.sort_unstable();
        due.dedup();
        due
    }

    /// Keep the emptied list of [`Schedule::deadline_keys`] for the next call.
    pub(super) fn keep_deadline_keys(&mut self, mut due: Vec<KeyRef>) {
        due.clear();
        if due.capacity() <= MAX_KEPT_DUE {
            self.deadline_keys = due;
        }
    }

    /// List the keys the round begun at `now` looks at: those due, those touched or left
    /// with work, those whose wake round came, and, after a round skipped (`previous` is
    /// not the round before), those whose demand fades; the round's slices take them from
    /// the start ([`Schedule::slice`]).
    pub(super) fn plan_round(&mut self, now: Nanos, previous: u64, busy: impl Fn(KeyRef) -> bool) {
        let round = self.round;
        let mut due = std::mem::take(&mut self.due);
        self.pop_due(now, &mut due, &busy);
        due.append(&mut self.candidates);
        // Keys the membership change just touched are looked at in this round.
        due.append(&mut self.touched);
        while let Some(&Reverse((at, key))) = self.wakes.peek() {
            if at > round {
                break;
            }
            self.wakes.pop();
            due.push(key);
        }
        if round > previous + 1 {
            due.extend(self.fading.drain(..).map(|(_, key)| key));
        } else {
            self.fading.retain(|&(until, _)| until > round);
        }
        due.sort_unstable();
        due.dedup();
        self.due = due;
        self.round_left = Some((0, now));
    }

    /// The next slice of the current round's keys: up to `max_keys` from where the last
    /// slice ended (none if no round is under way), with the round's whole list (give it
    /// back with [`Schedule::end_slice`]) and where the slice begins and ends in it.
    pub(super) fn slice(&mut self, max_keys: usize) -> Option<(Vec<KeyRef>, usize, usize)> {
        let (from, _) = self.round_left?;
        let due = std::mem::take(&mut self.due);
        let to = due.len().min(from.saturating_add(max_keys));
        Some((due, from, to))
    }

    /// How many keys this call touched so far.
    pub(super) fn touched_len(&self) -> usize {
        self.touched.len()
    }

    /// Tell whether the keys touched from `from` on are all `key`.
    pub(super) fn touched_only(&self, from: usize, key: KeyRef) -> bool {
        self.touched[from..].iter().all(|&k| k == key)
    }

    /// Take the list of keys touched in this call, as it is; give it back with
    /// [`Schedule::put_touched`].
    pub(super) fn take_touched_list(&mut self) -> Vec<KeyRef> {
        std::mem::take(&mut self.touched)
    }

    /// Give back the list [`Schedule::take_touched_list`] returned.
    pub(super) fn put_touched(&mut self, touched: Vec<KeyRef>) {
        self.touched = touched;
    }

    /// Take every key touched in this call, sorted and once each.
    pub(super) fn take_touched(&mut self) -> Vec<KeyRef> {
        let mut touched = std::mem::take(&mut self.touched);
        touched.sort_unstable();
        touched.dedup();
        touched
    }

    /// Give back the list [`Schedule::take_touched`] returned, emptied (its room serves
    /// the next call).
    pub(super) fn keep_touched(&mut self, mut touched: Vec<KeyRef>) {
        touched.clear();
        if self.touched.is_empty() {
            self.touched = touched;
        }
    }

    /// The next round looks at `key`.
    #[inline]
    pub(super) fn candidate(&mut self, key: KeyRef) {
        self.candidates.push(key);
    }

    /// After `key`'s round, its holding at rest: look at it again at round `wake`, or at
    /// once after a skipped round while its demand fades (`fading` more rounds).
    pub(super) fn rest(&mut self, key: KeyRef, wake: u64, fading: u64) {
        if fading > 0 {
            self.fading.push((self.round + fading, key));
        }
        self.wakes.push(Reverse((wake, key)));
    }

    /// End a slice of the round: give back its list; `to`: where the next slice begins,
    /// if keys are left (at `now`). Return whether the round is done, then counted as the
    /// node's `rounds`-th done.
    pub(super) fn end_slice(
        &mut self,
        due: Vec<KeyRef>,
        to: usize,
        now: Nanos,
        rounds: u64,
    ) -> bool {
        if to < due.len() {
            self.due = due;
            self.round_left = Some((to, now));
            return false;
        }
        self.round_left = None;
        self.rounds_done = rounds;
        let mut due = due;
        due.clear();
        if due.capacity() <= MAX_KEPT_DUE {
            self.due = due;
        }
        true
    }

    /// Give back the memory a burst of keys grew and that is now mostly unused.
    pub(super) fn shrink(&mut self) {
        if self.timers.capacity() > 1024 && self.timers.len() < self.timers.capacity() / 4 {
            self.timers.shrink_to(self.timers.len() * 2);
        }
        if self.wakes.capacity() > 1024 && self.wakes.len() < self.wakes.capacity() / 4 {
            self.wakes.shrink_to(self.wakes.len() * 2);
        }
        if self.fading.capacity() > 1024 && self.fading.len() < self.fading.capacity() / 4 {
            self.fading.shrink_to(self.fading.len() * 2);
        }
        if self.queued.capacity() > 1024 && self.queued.len() < self.queued.capacity() / 4 {
            self.queued.shrink_to(self.queued.len() * 2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: u64) -> KeyRef {
        KeyRef { policy: 0, key: k }
    }

    #[test]
    fn a_key_whose_instant_moved_leaves_a_stale_timer_that_is_skipped() {
        let mut s = Schedule::new(0, 20);
        s.arm(key(1), Some(5));
        assert_eq!(s.next_timeout(), 5);
        // Moved later: the entry at 5 is stale, dropped, and the next timeout is 12.
        s.arm(key(1), Some(12));
        s.drop_stale_timers(|_| false);
        assert_eq!(s.next_timeout(), 12);
        // Armed again at the same instant: no second entry.
        s.arm(key(1), Some(12));
        let due = s.deadline_keys(12, |_| false);
        assert_eq!(due, vec![key(1)]);
        s.fired(key(1), 12);
        s.keep_deadline_keys(due);
        assert_eq!(s.next_timeout(), 20);
        // A key with nothing queued but requests waiting at its authority stays live.
        s.arm(key(2), Some(15));
        s.arm(key(2), None);
        s.drop_stale_timers(|k| k == key(2));
        assert_eq!(s.next_timeout(), 15);
    }

    #[test]
    fn a_round_looks_at_due_touched_and_woken_keys_once_each_in_slices() {
        let mut s = Schedule::new(0, 20);
        s.arm(key(3), Some(10));
        s.touch(key(1));
        s.touch(key(1));
        s.candidate(key(2));
        s.rest(key(4), 1, 0);
        s.rest(key(5), 9, 0);
        let previous = s.begin_round(20, 20, 1);
        assert_eq!((previous, s.round(), s.next_tick()), (0, 1, 40));
        s.plan_round(20, previous, |_| false);
        let (due, from, to) = s.slice(3).unwrap();
        assert_eq!(&due[from..to], &[key(1), key(2), key(3)]);
        assert!(!s.end_slice(due, to, 21, 1));
        assert!(s.round_unfinished());
        assert_eq!(s.next_timeout(), 21);
        let (due, from, to) = s.slice(3).unwrap();
        assert_eq!(&due[from..to], &[key(4)]);
        assert!(s.end_slice(due, to, 22, 1));
        assert_eq!(s.rounds_done(), 1);
        assert!(s.slice(3).is_none());
    }
}
