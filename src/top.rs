//! Heavy hitters in bounded memory: which keys carried the most weight.
//!
//! [`SpaceSaving`] is the Space-Saving sketch (Metwally, Agrawal, El Abbadi 2005) over `u64`
//! keys that are already hashes: `m` counters, each an upper bound on its key's weight. A key
//! that is not tracked takes the counter with the smallest count, adds its weight to it and
//! keeps that old count as its `error`. Recording costs one probe of an open-addressing table
//! on the (once mixed) key, then O(1) list moves among 64 buckets of the counts near the
//! minimum (a min-heap, O(log m), holds the larger ones); nothing allocates after `new`.
//!
//! A [`Summary`] is what a sketch hands on (to another thread, another node): its total, its
//! `floor` and its entries. [`merge`] adds summaries up into one of at most `m` entries, which
//! is a summary again, so merges compose (threads, then nodes). [`Recent`] keeps two
//! generations of a sketch to answer for the last one to two periods of time.
//!
//! # What a summary promises
//!
//! With `N` the total weight, `f(k)` a key's true weight and `floor` the summary's floor,
//! every [`Summary`] built here ([`SpaceSaving::summary`], [`merge`], [`Summary::truncate`],
//! [`Recent::summary`]) satisfies:
//!
//! 1. a listed entry has `count - error <= f(key) <= count` and `error <= floor <= count`;
//! 2. a key that is not listed has `f(key) <= floor`;
//! 3. the listed counts add up to at most `N`.
//!
//! **Top-n guarantee.** A key carrying more than `1/n` of the traffic (`f(k) * n > N`) is among
//! the first `n` entries (count descending, ties by key ascending) whenever
//! `n <= entries.len()` or `floor == 0` ([`Summary::guaranteed_top`]). A full sketch of
//! capacity `m` lists `m` entries, and so does the merge with parameter `m` of such sketches'
//! summaries: the bound is `n <= m` ([`guaranteed_top`]) for one sketch and for a merge alike.
//!
//! Proof sketch. By (3) and `floor <= count`, `floor <= N / len <= N / n`, so such a key
//! exceeds the floor, is listed (2) and has `count >= f(k) > N / n` (1). By (3) fewer than `n`
//! entries have a count above `N / n`, and every entry ranked before the key is one of them.
//! (3) holds for a sketch because its counts add up to exactly `N`, and for a merge because a
//! key's merged count sums its count in each part (the part's floor where unlisted): over the
//! `<= m` kept keys a part adds at most the sum of its own `>= m` listed counts, `<= N_part`.
//!
//! The guarantees hold while the total stays below `u64::MAX`; arithmetic saturates there.

use std::cmp::Ordering;
use std::fmt;

/// Largest capacity a sketch or a merge accepts; larger requests are clamped to it.
pub(crate) const MAX_CAPACITY: usize = 1 << 16;

/// Table cell with no key.
const EMPTY: u32 = u32::MAX;
/// Low half of a table cell: the counter's index (`m <= 2^16`).
const SLOT: u32 = 0xFFFF;
/// High half of a table cell: 15 bits of the key's hash (bit 16 clear, so no cell is EMPTY).
const TAG: u32 = 0xFFFE_0000;
/// Multiplier that mixes a key once (Fibonacci hashing); the table indexes by the top bits.
const MIX: u64 = 0x9E37_79B9_7F4A_7C15;
/// `prev` of a counter in the overflow heap (its `next` is then its heap position).
const IN_HEAP: u32 = u32::MAX;
/// Bucketed counts are `base..base + WINDOW`, in bucket `count % WINDOW`; larger ones in the heap.
const WINDOW: u64 = 64;

/// One key's estimate: its true weight lies in `count - error ..= count`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Entry {
    /// The key, as recorded.
    pub(crate) key: u64,
    /// Upper bound on the key's weight.
    pub(crate) count: u64,
    /// Largest possible overestimation: `count - error` is a lower bound.
    pub(crate) error: u64,
}

impl Entry {
    /// Lower bound on the key's weight: `count - error`.
    pub(crate) fn lower(&self) -> u64 {
        self.count.saturating_sub(self.error)
    }
}

/// The ranking of [`SpaceSaving::top`] and of a summary's entries.
fn by_rank(a: &Entry, b: &Entry) -> Ordering {
    b.count.cmp(&a.count).then(a.key.cmp(&b.key))
}

/// Ranks `v` and keeps its first `n` entries, selecting before sorting.
fn keep_top(v: &mut Vec<Entry>, n: usize) {
    if n < v.len() {
        v.select_nth_unstable_by(n, by_rank);
        v.truncate(n);
    }
    v.sort_unstable_by(by_rank);
}

/// The largest `n` for which the top-n guarantee (module docs) holds for a sketch of capacity
/// `m`, and for [`merge`] with parameter `m` of summaries that each list at least `m` entries
/// or have a zero floor (as those of full or unfilled sketches of capacity `m` do): `m`,
/// clamped to `1..=MAX_CAPACITY`.
pub(crate) fn guaranteed_top(m: usize) -> usize {
    m.clamp(1, MAX_CAPACITY)
}

/// Table tag of a mixed key `h`: bits of both halves, so keys that differ anywhere differ here.
fn tag(h: u64) -> u32 {
    (h ^ (h >> 32)) as u32 & TAG
}

/// A counter or, past the `m` counters, the sentinel head of a bucket's circular list.
#[derive(Clone, Copy, Debug, Default)]
#[repr(align(32))]
struct Slot {
    key: u64,
    count: u64,
    error: u64,
    /// Neighbours in the bucket list, or [`IN_HEAP`] and the heap position.
    prev: u32,
    next: u32,
}

/// Takes `s` out of its bucket list; true if that left the list empty.
#[inline(always)]
fn unlink(slots: &mut [Slot], s: usize) -> bool {
    let Slot { prev, next, .. } = slots[s];
    slots[prev as usize].next = next;
    slots[next as usize].prev = prev;
    prev == next // both are the head
}

/// Puts `s` first in the bucket list of its count (heads start at slot `m`).
#[inline(always)]
fn link(slots: &mut [Slot], m: usize, s: usize) {
    let head = m + (slots[s].count % WINDOW) as usize;
    let first = slots[head].next;
    (slots[s].prev, slots[s].next) = (head as u32, first);
    slots[first as usize].prev = s as u32;
    slots[head].next = s as u32;
}

/// Empties cell `hole` of the linear-probing table, shifting the rest of its run back.
#[inline(always)]
fn remove_cell(table: &mut [u32], slots: &[Slot], cells: &mut [u32], mut hole: usize, shift: u32) {
    let mask = table.len() - 1;
    let mut k = (hole + 1) & mask;
    while table[k] != EMPTY {
        let s = (table[k] & SLOT) as usize;
        let home = (slots[s].key.wrapping_mul(MIX) >> shift) as usize;
        // The cell may move into the hole if the hole lies on its probe path.
        if (k.wrapping_sub(home) & mask) >= (k.wrapping_sub(hole) & mask) {
            table[hole] = table[k];
            cells[s] = hole as u32;
            hole = k;
        }
        k = (k + 1) & mask;
    }
    table[hole] = EMPTY;
}

/// The Space-Saving heavy-hitters sketch with a fixed number of counters (module docs).
///
/// Counters within 64 of the smallest count sit in 64 circular bucket lists indexed by
/// count, with a bitmask of the non-empty ones, so the smallest is found and a counter moved
/// in O(1); larger counts sit in a min-heap (O(log m)), touched only by a counter leaving or
/// re-entering the window and by increments of the counters in it.
#[derive(Clone)]
pub(crate) struct SpaceSaving {
    /// Open addressing, linear probing, `2^k >= 8m` cells: `tag | slot` or [`EMPTY`].
    table: Box<[u32]>,
    /// `m` counters (the first `len` live), then the 64 bucket heads.
    slots: Box<[Slot]>,
    /// Each counter's table cell.
    cells: Box<[u32]>,
    /// Overflow min-heap (by count) of counters, the first `heap_len` live.
    heap: Box<[u32]>,
    /// Bit `b` set iff bucket `b` is non-empty.
    occupied: u64,
    /// No count is below `base`; bucketed counts are below `base + WINDOW`. It is also the
    /// floor: the count of the last counter that changed hands, 0 before any did.
    base: u64,
    len: usize,
    heap_len: usize,
    /// `64 - k`: a key's home cell is `hash >> shift`.
    shift: u32,
    total: u64,
}

impl fmt::Debug for SpaceSaving {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (m, len) = (self.capacity(), self.len);
        write!(f, "SpaceSaving {{ capacity: {m}, len: {len}, .. }}")
    }
}

impl SpaceSaving {
    /// A sketch of `capacity` counters, clamped to `1..=MAX_CAPACITY`. All its memory is
    /// allocated here.
    pub(crate) fn new(capacity: usize) -> Self {
        let m = guaranteed_top(capacity);
        // An eighth full keeps probe runs short (a miss, the common case when keys are many,
        // mostly meets an empty cell at once); one cell stays empty while an eviction holds
        // two.
        let cells = (8 * m).next_power_of_two();
        let mut sketch = Self {
            table: vec![EMPTY; cells].into_boxed_slice(),
            slots: vec![Slot::default(); m + WINDOW as usize].into_boxed_slice(),
            cells: vec![0; m].into_boxed_slice(),
            heap: vec![0; m].into_boxed_slice(),
            occupied: 0,
            base: 0,
            len: 0,
            heap_len: 0,
            shift: 64 - cells.trailing_zeros(),
            total: 0,
        };
        sketch.clear();
        sketch
    }

    /// Adds `weight` to `key`. A weight of 0 changes nothing. Never allocates.
    #[inline(always)]
    pub(crate) fn record(&mut self, key: u64, weight: u64) {
        if weight == 0 {
            return;
        }
        self.total = self.total.saturating_add(weight);
        let h = key.wrapping_mul(MIX);
        let tag = tag(h);
        let mut i = (h >> self.shift) as usize;
        loop {
            let cell = self.table[i];
            if cell == EMPTY {
                return self.admit(key, tag, i, weight);
            }
            let s = (cell & SLOT) as usize;
            if cell & TAG == tag && self.slots[s].key == key {
                return self.bump(s, weight);
            }
            i = (i + 1) & (self.table.len() - 1);
        }
    }

    /// Adds `weight` to the tracked counter `s`.
    #[inline(always)]
    fn bump(&mut self, s: usize, weight: u64) {
        let (m, base, mut occupied) = (self.cells.len(), self.base, self.occupied);
        let slots = &mut *self.slots;
        let (count, prev, next) = (slots[s].count, slots[s].prev, slots[s].next);
        let to = count.saturating_add(weight);
        slots[s].count = to;
        if prev == IN_HEAP {
            if 2 * next as usize + 1 < self.heap_len {
                self.heap_down(next as usize);
            }
            return;
        }
        if unlink(slots, s) {
            occupied &= !(1 << (count % WINDOW));
        }
        if to.wrapping_sub(base) < WINDOW {
            link(slots, m, s);
            self.occupied = occupied | 1 << (to % WINDOW);
        } else {
            self.occupied = occupied;
            self.heap_push(s);
        }
    }

    /// Starts tracking `key` (tag `tag`) in cell `i`, the free cell ending its probe sequence.
    #[inline(always)]
    fn admit(&mut self, key: u64, tag: u32, i: usize, weight: u64) {
        let m = self.cells.len();
        let full = self.len == m;
        // Full: a counter with the smallest count (the base) changes hands.
        let (s, min) = if full {
            (self.take_min(), self.base)
        } else {
            self.len += 1;
            (self.len - 1, 0)
        };
        let victim = self.cells[s] as usize;
        (self.table[i], self.cells[s]) = (tag | s as u32, i as u32);
        let slots = &mut *self.slots;
        let to = min.saturating_add(weight);
        (slots[s].key, slots[s].count, slots[s].error) = (key, to, min);
        if full {
            // With the new cell in: the shift may move it (and finds its home by the new key).
            remove_cell(&mut self.table, slots, &mut self.cells, victim, self.shift);
        }
        if to.wrapping_sub(self.base) < WINDOW {
            link(slots, m, s);
            self.occupied |= 1 << (to % WINDOW);
        } else {
            self.heap_push(s);
        }
    }

    /// Unlinks and returns a counter with the smallest count, making that count the base.
    #[inline(always)]
    fn take_min(&mut self) -> usize {
        let old = self.base;
        if self.occupied == 0 {
            // Every counter is in the heap, which is then non-empty.
            self.base = self.slots[self.heap[0] as usize].count;
            self.migrate();
        } else {
            let offset = self
                .occupied
                .rotate_right((old % WINDOW) as u32)
                .trailing_zeros();
            if offset > 0 {
                self.base = old + u64::from(offset);
                self.migrate();
            }
        }
        let slots = &mut *self.slots;
        let s = slots[self.cells.len() + (self.base % WINDOW) as usize].next as usize;
        if unlink(slots, s) {
            self.occupied &= !(1 << (self.base % WINDOW));
        }
        s
    }

    /// Moves the heap's counters that the window, moved up to `base`, now covers into buckets.
    #[inline(never)]
    fn migrate(&mut self) {
        while self.heap_len > 0 {
            let s = self.heap[0] as usize;
            let count = self.slots[s].count;
            if count.wrapping_sub(self.base) >= WINDOW {
                break;
            }
            self.heap_len -= 1;
            self.heap[0] = self.heap[self.heap_len];
            self.heap_down(0);
            link(&mut self.slots, self.cells.len(), s);
            self.occupied |= 1 << (count % WINDOW);
        }
    }

    /// Count of the heap node at `p`.
    fn heap_count(&self, p: usize) -> u64 {
        self.slots[self.heap[p] as usize].count
    }

    /// Puts counter `s` at heap position `p`.
    fn heap_set(&mut self, p: usize, s: u32) {
        self.heap[p] = s;
        self.slots[s as usize].next = p as u32;
    }

    /// Adds the unlinked counter `s` to the heap, moving it up past larger parents.
    #[inline(never)]
    fn heap_push(&mut self, s: usize) {
        self.slots[s].prev = IN_HEAP;
        let (count, mut p) = (self.slots[s].count, self.heap_len);
        self.heap_len += 1;
        while p > 0 && self.heap_count((p - 1) / 2) > count {
            self.heap_set(p, self.heap[(p - 1) / 2]);
            p = (p - 1) / 2;
        }
        self.heap_set(p, s as u32);
    }

    /// Moves the heap node at `p` down while a child has a strictly smaller count.
    #[inline(never)]
    fn heap_down(&mut self, mut p: usize) {
        let s = self.heap[p];
        let count = self.slots[s as usize].count;
        loop {
            let mut c = 2 * p + 1;
            if c + 1 < self.heap_len && self.heap_count(c + 1) < self.heap_count(c) {
                c += 1;
            }
            if c >= self.heap_len || self.heap_count(c) >= count {
                break;
            }
            self.heap_set(p, self.heap[c]);
            p = c;
        }
        self.heap_set(p, s);
    }

    /// Total weight recorded since creation or [`clear`](Self::clear) (saturating).
    #[cfg(test)]
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Number of keys tracked (at most the capacity).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether no key is tracked.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of counters, as clamped by [`new`](Self::new).
    pub(crate) fn capacity(&self) -> usize {
        self.cells.len()
    }

    /// Upper bound on the weight of any key not tracked: the count of the last counter that
    /// changed hands, 0 if none did.
    pub(crate) fn floor(&self) -> u64 {
        self.base // only evictions move the base, each to the count it evicts
    }

    /// The tracked keys' estimates, in no particular order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = Entry> + '_ {
        self.slots[..self.len].iter().map(|s| Entry {
            key: s.key,
            count: s.count,
            error: s.error,
        })
    }

    /// The `n` largest estimates, count descending, ties by key ascending (fewer if fewer keys
    /// are tracked).
    pub(crate) fn top(&self, n: usize) -> Vec<Entry> {
        let mut v: Vec<Entry> = self.entries().collect();
        keep_top(&mut v, n);
        v
    }

    /// Everything this sketch knows, as a [`Summary`] ranked as by [`top`](Self::top).
    pub(crate) fn summary(&self) -> Summary {
        Summary {
            total: self.total,
            floor: self.floor(),
            entries: self.top(self.len),
        }
    }

    /// Forgets every key and the total; keeps the memory.
    pub(crate) fn clear(&mut self) {
        self.table.fill(EMPTY);
        let m = self.cells.len();
        for (b, head) in self.slots[m..].iter_mut().enumerate() {
            (head.prev, head.next) = ((m + b) as u32, (m + b) as u32);
        }
        (self.occupied, self.base, self.heap_len, self.len) = (0, 0, 0, 0);
        self.total = 0;
    }

    /// Bytes this sketch occupies: the struct itself plus its fixed arrays, `2^k >= 8m` table
    /// cells of 4 bytes, `m + 64` counters and bucket heads of 32, and `m` back-pointers and heap
    /// entries of 4 (75 888 bytes at capacity 1024 on a 64-bit target).
    pub(crate) fn memory_bytes(&self) -> usize {
        size_of::<Self>()
            + size_of_val::<[u32]>(&self.table)
            + size_of_val::<[Slot]>(&self.slots)
            + size_of_val::<[u32]>(&self.cells)
            + size_of_val::<[u32]>(&self.heap)
    }
}

/// A sketch's contents as handed on: plain data, in the form [`merge`] takes.
///
/// Built here, it satisfies the three properties of the module docs; one built by hand or
/// received from elsewhere is trusted to (a malformed one costs accuracy, never a panic).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Summary {
    /// Total weight behind this summary (every key, listed or not).
    pub(crate) total: u64,
    /// Upper bound on the weight of every key not listed; at most every listed count.
    pub(crate) floor: u64,
    /// Listed keys, count descending, ties by key ascending.
    pub(crate) entries: Vec<Entry>,
}

impl Summary {
    /// The largest `n` for which this summary's top-n guarantee holds: its number of entries,
    /// or `usize::MAX` when the floor is 0 (every key with any weight is listed).
    pub(crate) fn guaranteed_top(&self) -> usize {
        if self.floor == 0 {
            usize::MAX
        } else {
            self.entries.len()
        }
    }

    /// Keeps the `n` highest-ranked entries (re-ranking them), raising the floor to the largest
    /// count dropped, so the summary stays valid with a guarantee for `n` and below.
    pub(crate) fn truncate(&mut self, n: usize) {
        self.entries.sort_unstable_by(by_rank);
        if let Some(dropped) = self.entries.get(n) {
            self.floor = self.floor.max(dropped.count);
            self.entries.truncate(n);
        }
    }
}

/// Adds `parts` up into one summary of at most `m` entries (`m` clamped to
/// `1..=MAX_CAPACITY`).
///
/// A key's merged count is the sum over the parts of its count there, or of the part's floor
/// where it is not listed; its error is that count minus the sum of its lower bounds. The `m'`
/// largest are kept, `m'` being `m` lowered to the length of each part with a nonzero floor
/// (property 3 could fail beyond it); the new floor is the largest merged count not kept, or
/// the sum of the floors if every key is kept. The result satisfies the properties of the
/// module docs if the parts do, with the top-n guarantee for `n <= m'`.
pub(crate) fn merge<'a, I: IntoIterator<Item = &'a Summary>>(parts: I, m: usize) -> Summary {
    let (mut keep, mut total, mut floors) = (guaranteed_top(m), 0u64, 0u64);
    // (key, sum of count - floor, sum of lower bounds): per listed entry, then per key.
    let mut all: Vec<(u64, u64, u64)> = Vec::new();
    for part in parts {
        total = total.saturating_add(part.total);
        floors = floors.saturating_add(part.floor);
        if part.floor > 0 {
            keep = keep.min(part.entries.len());
        }
        let excess = |e: &Entry| e.count.saturating_sub(part.floor);
        all.extend(part.entries.iter().map(|e| (e.key, excess(e), e.lower())));
    }
    all.sort_unstable_by_key(|&(key, _, _)| key);
    // `dedup_by` hands the later duplicate first: fold it into the earlier one.
    all.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 = kept.1.saturating_add(later.1);
            kept.2 = kept.2.saturating_add(later.2);
        }
        same
    });
    let entry = |(key, excess, lower): (u64, u64, u64)| {
        let count = floors.saturating_add(excess);
        let error = count.saturating_sub(lower);
        Entry { key, count, error }
    };
    let mut entries: Vec<Entry> = all.into_iter().map(entry).collect();
    let mut floor = floors;
    if keep < entries.len() {
        keep_top(&mut entries, keep + 1);
        floor = entries.pop().map_or(floors, |e| e.count);
    } else {
        entries.sort_unstable_by(by_rank);
    }
    Summary {
        total,
        floor,
        entries,
    }
}

/// Heavy hitters of the last one to two periods: two [`SpaceSaving`] generations, the current
/// one and the one before, rotated as time passes. Sans-IO: time is an argument, in
/// nanoseconds of any monotonic clock; periods are aligned to multiples of the period.
#[derive(Clone, Debug)]
pub(crate) struct Recent {
    current: SpaceSaving,
    previous: SpaceSaving,
    period: u64,
    /// End (exclusive) of the current generation's period; 0 before the first record.
    end: u64,
}

impl Recent {
    /// Two generations of `capacity` counters each, rotated every `period_ns` (at least 1).
    pub(crate) fn new(capacity: usize, period_ns: u64) -> Self {
        Self {
            current: SpaceSaving::new(capacity),
            previous: SpaceSaving::new(capacity),
            period: period_ns.max(1),
            end: 0,
        }
    }

    /// Adds `weight` to `key` at time `now_ns`. A time before the current period counts in it.
    #[inline(always)]
    pub(crate) fn record(&mut self, key: u64, weight: u64, now_ns: u64) {
        if now_ns >= self.end {
            self.rotate(now_ns);
        }
        self.current.record(key, weight);
    }

    /// Starts the generation holding `now_ns`, keeping the current one as the previous one if
    /// it is the period just before.
    #[cold]
    #[inline(never)]
    fn rotate(&mut self, now_ns: u64) {
        if now_ns - self.end < self.period {
            std::mem::swap(&mut self.current, &mut self.previous);
            self.end = self.end.saturating_add(self.period);
        } else {
            self.previous.clear();
            self.end = (now_ns - now_ns % self.period).saturating_add(self.period);
        }
        self.current.clear();
    }

    /// The merge of the generations that a record at `now_ns` would keep: both while `now_ns`
    /// is in the current period, the current one alone during the next period, none after.
    pub(crate) fn summary(&self, now_ns: u64) -> Summary {
        if now_ns < self.end {
            let m = self.current.capacity();
            merge([&self.previous.summary(), &self.current.summary()], m)
        } else if now_ns - self.end < self.period {
            self.current.summary()
        } else {
            Summary::default()
        }
    }

    /// Forgets both generations.
    #[cfg(test)]
    pub(crate) fn clear(&mut self) {
        self.current.clear();
        self.previous.clear();
        self.end = 0;
    }

    /// Bytes occupied: both generations and this struct.
    pub(crate) fn memory_bytes(&self) -> usize {
        let own = size_of::<Self>() - 2 * size_of::<SpaceSaving>();
        own + self.current.memory_bytes() + self.previous.memory_bytes()
    }
}

// Paths spelled out: `benches/top.rs` includes this file as a module of its own.
#[cfg(test)]
#[path = "top/edge.rs"]
mod edge;
#[cfg(test)]
#[path = "top/guarantee.rs"]
mod guarantee;

#[cfg(test)]
mod tests {
    use super::*;

    /// Buckets, heap, back-pointers, and one table cell per live counter, reachable from home.
    fn check(s: &SpaceSaving) {
        let (m, live) = (s.capacity(), &s.slots[..s.len]);
        let mut seen = 0;
        for b in 0..WINDOW as usize {
            let head = (m + b) as u32;
            let (mut prev, mut at) = (head, s.slots[head as usize].next);
            assert_eq!(at == head, s.occupied & (1 << b) == 0);
            while at != head {
                let slot = live[at as usize];
                assert_eq!((slot.prev, slot.count % WINDOW), (prev, b as u64));
                assert!(slot.count - s.base < WINDOW);
                (prev, at, seen) = (at, slot.next, seen + 1);
            }
            assert_eq!(s.slots[head as usize].prev, prev);
        }
        for (p, &at) in s.heap[..s.heap_len].iter().enumerate() {
            let slot = live[at as usize];
            assert_eq!((slot.prev, slot.next as usize), (IN_HEAP, p));
            assert!(slot.count - s.base >= WINDOW);
            assert!(p == 0 || s.heap_count((p - 1) / 2) <= slot.count);
        }
        assert_eq!(seen + s.heap_len, s.len);
        for (i, e) in s.entries().enumerate() {
            assert!(e.error <= s.floor() && s.floor() <= e.count);
            let (h, cell) = (e.key.wrapping_mul(MIX), s.cells[i] as usize);
            assert_eq!(s.table[cell], tag(h) | i as u32);
            let mut at = (h >> s.shift) as usize;
            while at != cell {
                assert_ne!(s.table[at], EMPTY, "key not reachable");
                at = (at + 1) % s.table.len();
            }
        }
        assert_eq!(s.table.iter().filter(|&&c| c != EMPTY).count(), s.len);
        assert_eq!(s.entries().map(|e| e.count).sum::<u64>(), s.total);
    }

    #[test]
    fn churn_keeps_structure() {
        for m in [1, 2, 3, 7, 64, 100] {
            let mut s = SpaceSaving::new(m);
            let (mut x, mut heap_used) = (12345u64, false);
            for i in 0..5000u64 {
                x = x
                    .wrapping_mul(0x5851_F42D_4C95_7F2D)
                    .wrapping_add(0x1405_7B7E_F767_814F);
                // Small keys collide in the table's top bits; a few hot keys and heavy weights
                // push counters past the window into the heap and back.
                let key = if i % 3 == 0 {
                    i % 4
                } else {
                    (x >> 33) % (3 * m as u64 + 5)
                };
                s.record(key, if i % 50 == 0 { 200 } else { 1 + i % 3 });
                heap_used |= s.heap_len > 0;
                if i % 97 == 0 {
                    check(&s);
                }
            }
            assert!(heap_used);
            check(&s);
            s.clear();
            check(&s);
            assert!(s.is_empty() && s.total() == 0 && s.floor() == 0);
        }
    }
}
