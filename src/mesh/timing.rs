//! What a node knows of a peer's clock: the offset between the two clocks and how sure it is,
//! from the timestamps every frame carries (NTP's four-timestamp exchange, for free).
//!
//! A frame from peer `p` says: I sent this at `t3` (my clock), and I received your frame sent
//! at `t1` (your clock) `held` ns before. The receiver, at `t4` (its clock), gets a round
//! trip `δ = (t4 − t1) − held` and the offset `θ = p − me = ((t3 − held − t1) + (t3 − t4)) / 2`,
//! wrong by at most `δ / 2` whatever the delays in each direction. The sample with the
//! smallest round trip among the last few wins; its error grows with its age to cover the
//! clocks' drift.

use std::cell::Cell;

use crate::clock::Nanos;

/// Samples kept per peer.
const SAMPLES: usize = 8;

/// Clock drift allowed for an ageing sample, in parts per million (crystal clocks drift well
/// under 100 ppm; NTP assumes 15).
const DRIFT_PPM: u64 = 100;

/// One offset measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    /// Peer clock minus local clock, in ns.
    offset: i64,
    /// Round trip (excluding the peer's hold), in ns.
    round_trip: u64,
    /// Local time of the measurement.
    at: Nanos,
}

/// The clock estimate for one peer.
#[derive(Debug, Clone, Default)]
pub(crate) struct PeerClock {
    samples: [Option<Sample>; SAMPLES],
    next: usize,
    /// The last estimate asked for and the instant it was for (a node asks several times
    /// at one instant: for each item of a frame, each key of a round).
    last: Cell<Option<(Nanos, Option<Offset>)>>,
}

/// A peer's clock offset as known now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offset {
    /// Peer clock minus local clock, in ns.
    pub offset: i64,
    /// How far the true offset may be from `offset`, in ns.
    pub error: u64,
    /// The round trip of the best sample, in ns.
    pub round_trip: u64,
}

impl Offset {
    /// Convert an instant on the peer's clock into the earliest local instant it can be.
    pub(crate) fn earliest_local(&self, peer_time: Nanos) -> Nanos {
        shift(peer_time, -self.offset).saturating_sub(self.error)
    }

    /// Convert an instant on the peer's clock into the latest local instant it can be.
    pub(crate) fn latest_local(&self, peer_time: Nanos) -> Nanos {
        shift(peer_time, -self.offset).saturating_add(self.error)
    }

    /// Convert a local instant into the peer's clock (central estimate).
    pub(crate) fn to_peer(self, local: Nanos) -> Nanos {
        shift(local, self.offset)
    }
}

fn shift(t: Nanos, by: i64) -> Nanos {
    if by >= 0 {
        t.saturating_add(by as u64)
    } else {
        t.saturating_sub(by.unsigned_abs())
    }
}

impl PeerClock {
    /// Record the timestamps of a frame received at `now` (local): the peer sent it at
    /// `sent_at` (its clock), having received our frame sent at `echo` (our clock) `held` ns
    /// earlier. A frame without an echo, or with impossible times, gives no sample.
    pub(crate) fn observe(&mut self, now: Nanos, sent_at: u64, echo: u64, held: u64) {
        if echo == 0 || echo > now {
            return;
        }
        let Some(round_trip) = (now - echo).checked_sub(held) else {
            return;
        };
        // θ = ((t2 − t1) + (t3 − t4)) / 2 with t2 = t3 − held.
        let t2 = i128::from(sent_at) - i128::from(held);
        let offset = ((t2 - i128::from(echo)) + (i128::from(sent_at) - i128::from(now))) / 2;
        let Ok(offset) = i64::try_from(offset) else {
            return;
        };
        self.samples[self.next] = Some(Sample {
            offset,
            round_trip,
            at: now,
        });
        self.next = (self.next + 1) % SAMPLES;
        self.last.set(None);
    }

    /// Return the best estimate at `now`, or `None` before the first sample.
    pub(crate) fn offset(&self, now: Nanos) -> Option<Offset> {
        if let Some((at, offset)) = self.last.get()
            && at == now
        {
            return offset;
        }
        let offset = self.estimate(now);
        self.last.set(Some((now, offset)));
        offset
    }

    fn estimate(&self, now: Nanos) -> Option<Offset> {
        self.samples
            .iter()
            .flatten()
            .map(|s| {
                let age = now.saturating_sub(s.at);
                let error = s.round_trip / 2 + 1 + age / 1_000_000 * DRIFT_PPM;
                (error, s)
            })
            .min_by_key(|(error, _)| *error)
            .map(|(error, s)| Offset {
                offset: s.offset,
                error,
                round_trip: s.round_trip,
            })
    }

    /// Forget every sample (the peer restarted: its clock may have been reset).
    pub(crate) fn reset(&mut self) {
        *self = PeerClock::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symmetric_exchange_gives_the_exact_offset() {
        // The peer's clock is 300 ms ahead; 2 ms each way; it holds our frame 5 ms.
        let mut clock = PeerClock::default();
        let t1 = 10_000_000_000; // we send
        let t2 = t1 + 300_000_000 + 2_000_000; // it receives (its clock)
        let t3 = t2 + 5_000_000; // it sends
        let t4 = t1 + 2_000_000 + 5_000_000 + 2_000_000; // we receive
        clock.observe(t4, t3, t1, t3 - t2);
        let o = clock.offset(t4).unwrap();
        assert_eq!(o.offset, 300_000_000);
        assert_eq!(o.round_trip, 4_000_000);
        assert!(o.error <= 2_000_001);
        assert_eq!(o.to_peer(t4), t4 + 300_000_000);
        // An instant on its clock maps back within the error.
        assert!(o.earliest_local(t3) <= t3 - 300_000_000);
        assert!(o.latest_local(t3) >= t3 - 300_000_000);
    }

    #[test]
    fn asymmetric_delays_stay_within_the_error() {
        let mut clock = PeerClock::default();
        let t1 = 5_000_000_000;
        // 1 ms out, 9 ms back; the peer is 40 ms behind.
        let t2 = t1 - 40_000_000 + 1_000_000;
        let t3 = t2;
        let t4 = t1 + 10_000_000;
        clock.observe(t4, t3, t1, 0);
        let o = clock.offset(t4).unwrap();
        let truth = -40_000_000i64;
        assert!((o.offset - truth).unsigned_abs() <= o.error, "{o:?}");
    }

    #[test]
    fn frames_without_an_echo_or_with_impossible_times_are_ignored() {
        let mut clock = PeerClock::default();
        clock.observe(1_000, 5_000, 0, 0);
        clock.observe(1_000, 5_000, 2_000, 0); // echo in our future
        clock.observe(1_000, 5_000, 900, 500); // held longer than the round trip
        assert!(clock.offset(1_000).is_none());
    }

    #[test]
    fn the_smallest_round_trip_wins_and_errors_grow_with_age() {
        let mut clock = PeerClock::default();
        clock.observe(1_000_000_000, 1_000_000_000, 990_000_000, 0); // 10 ms round trip
        clock.observe(2_000_000_000, 2_000_000_000, 1_999_000_000, 0); // 1 ms round trip
        let o = clock.offset(2_000_000_000).unwrap();
        assert_eq!(o.round_trip, 1_000_000);
        let later = clock.offset(12_000_000_000).unwrap();
        assert!(later.error > o.error);
    }
}
