//! Holders' reports that reached a key's owner while it had no authority of the key to count
//! them in: its authority was on its way back (a peer that declared the owner dead hands it
//! back), or on its way from a leaving owner. A report carries cumulative counts of what a
//! holder was granted, gave back and spent; one dropped there is lost if the holder stops
//! telling it before the authority arrives, with whatever it gave back. Kept here, the
//! latest per holding, and counted once the authority is made or arrives. Bounded:
//! [`MAX_DEFERRED`] reports in all; one kept longer than [`DEFERRED_FOR_NS`] is dropped (the
//! authority it waited for went elsewhere).

use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::keymap::FixedMap;
use crate::mesh::message::{KeyRef, Want};

/// The most reports kept, over every key.
const MAX_DEFERRED: usize = 4096;

/// How long a report is kept for an authority that does not come.
const DEFERRED_FOR_NS: Nanos = 10_000_000_000;

/// One report: from which holder (node, run), when it came, what it said.
#[derive(Debug, Clone)]
pub(super) struct Report {
    pub(super) from: NodeId,
    pub(super) incarnation: u64,
    pub(super) at: Nanos,
    pub(super) want: Want,
}

/// Reports by key, waiting for the key's authority.
#[derive(Debug, Default)]
pub(super) struct Deferred {
    reports: FixedMap<KeyRef, Vec<Report>>,
    count: usize,
}

impl Deferred {
    /// Keep `want` from holder `from` (run `incarnation`) until the key's authority is here;
    /// it replaces an earlier report of the same holding (counts only grow).
    pub(super) fn defer(&mut self, now: Nanos, from: NodeId, incarnation: u64, want: &Want) {
        if self.count >= MAX_DEFERRED {
            self.expire(now);
            if self.count >= MAX_DEFERRED {
                return;
            }
        }
        let list = self.reports.entry(want.key).or_default();
        let report = Report {
            from,
            incarnation,
            at: now,
            want: *want,
        };
        match list
            .iter_mut()
            .find(|r| (r.from, r.incarnation, r.want.holding) == (from, incarnation, want.holding))
        {
            Some(kept) if kept.want.seq <= want.seq => *kept = report,
            Some(_) => {}
            None => {
                list.push(report);
                self.count += 1;
            }
        }
    }

    /// Take the reports kept for `key`, oldest first.
    pub(super) fn take(&mut self, key: KeyRef) -> Vec<Report> {
        let list = self.reports.remove(&key).unwrap_or_default();
        self.count -= list.len();
        list
    }

    /// Drop the reports kept longer than [`DEFERRED_FOR_NS`].
    fn expire(&mut self, now: Nanos) {
        let mut dropped = 0;
        self.reports.retain(|_, list| {
            let before = list.len();
            list.retain(|r| now.saturating_sub(r.at) < DEFERRED_FOR_NS);
            dropped += before - list.len();
            !list.is_empty()
        });
        self.count -= dropped;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::tally::Tally;

    fn want(key: u64, holding: u64, seq: u32, returned: u64) -> Want {
        Want {
            key: KeyRef { policy: 0, key },
            window: 0,
            tally: Tally {
                granted: returned,
                returned,
                used: 0,
            },
            closed: false,
            need: 0,
            smallest: 0,
            seq,
            refill: false,
            demand: 0,
            spent_ago: 0,
            previous_used: None,
            holding,
        }
    }

    #[test]
    fn the_latest_report_of_a_holding_is_kept_until_taken_and_old_ones_make_room() {
        let mut d = Deferred::default();
        d.defer(0, 2, 7, &want(1, 1, 3, 4));
        d.defer(1, 2, 7, &want(1, 1, 2, 1)); // older: ignored
        d.defer(2, 2, 7, &want(1, 1, 5, 6));
        d.defer(2, 3, 9, &want(1, 4, 1, 0));
        d.defer(2, 2, 7, &want(2, 1, 1, 0));
        let one = d.take(KeyRef { policy: 0, key: 1 });
        assert_eq!(one.len(), 2);
        assert_eq!((one[0].from, one[0].want.tally.returned), (2, 6));
        assert_eq!(one[1].from, 3);
        assert!(d.take(KeyRef { policy: 0, key: 1 }).is_empty());
        assert_eq!(d.count, 1);
        for k in 0..MAX_DEFERRED as u64 {
            d.defer(5, 1, 1, &want(100 + k, 1, 1, 0));
        }
        assert_eq!(d.count, MAX_DEFERRED);
        // Full: a new one is dropped until the old ones expire.
        d.defer(6, 1, 1, &want(99, 1, 1, 0));
        assert!(d.take(KeyRef { policy: 0, key: 99 }).is_empty());
        d.defer(DEFERRED_FOR_NS + 6, 1, 1, &want(99, 1, 1, 0));
        assert_eq!(d.take(KeyRef { policy: 0, key: 99 }).len(), 1);
        assert_eq!(d.count, 0);
    }
}
