//! A holding's demand: the cost offered per round, averaged, and the rounds it was busy and
//! idle. The holding reports it to the key's authority (which leases in proportion to it)
//! and decides from it when to refill, give its lease back and rest; a node that skips a
//! holding's rounds while it rests counts them here afterwards.

use super::IDLE_ROUNDS;

/// The demand of one holding and its count of rounds.
#[derive(Debug, Clone)]
pub(super) struct Demand {
    /// Cost offered per round, exponentially averaged, in sixteenths of a token.
    level: u32,
    /// Cost offered since the last round that the lease's count does not show (requests
    /// that waited or were denied, and what a lease admitted before its window turned).
    offered: u64,
    /// Rounds in a row with nothing offered.
    idle_rounds: u32,
    /// The last round with requests, and how many rounds before it the one before came
    /// (`u64::MAX`: none).
    busy_round: Option<u64>,
    busy_gap: u64,
    /// The node's count of rounds at the holding's last round (see [`Demand::catch_up`]).
    rounds: u64,
}

impl Default for Demand {
    fn default() -> Self {
        Demand {
            level: 0,
            offered: 0,
            idle_rounds: 0,
            busy_round: None,
            busy_gap: u64::MAX,
            rounds: 0,
        }
    }
}

impl Demand {
    /// The demand, in sixteenths of a token per round.
    #[inline]
    pub(super) fn level(&self) -> u32 {
        self.level
    }

    /// Tokens per round the demand asks for (rounded up).
    #[inline]
    pub(super) fn per_round(&self) -> u64 {
        u64::from(self.level).div_ceil(16)
    }

    /// Cost offered since the last round, beyond the lease's count.
    #[inline]
    pub(super) fn offered(&self) -> u64 {
        self.offered
    }

    /// Rounds in a row with nothing offered.
    #[inline]
    pub(super) fn idle_rounds(&self) -> u32 {
        self.idle_rounds
    }

    /// Requests came less than [`IDLE_ROUNDS`] rounds apart lately (not a lone request).
    #[inline]
    pub(super) fn busy(&self) -> bool {
        self.busy_gap <= u64::from(IDLE_ROUNDS)
    }

    /// Count `cost` offered in this round beyond the lease's count.
    pub(super) fn offer(&mut self, cost: u64) {
        self.offered = self.offered.saturating_add(cost);
    }

    /// A round `round` with `spent` admitted from the lease since the last and `waiting`
    /// cost waiting: the demand averages what was offered. Return whether more than one
    /// token was asked for (spent, or asked for on the slow path).
    pub(super) fn round(&mut self, round: u64, spent: u64, waiting: u64) -> bool {
        let several = spent.max(self.offered) > 1;
        let offered = spent + self.offered + waiting;
        self.offered = 0;
        let sample = u32::try_from(offered.saturating_mul(16)).unwrap_or(u32::MAX);
        self.level = if offered == 0 {
            fade(self.level)
        } else {
            self.level - self.level.div_ceil(8) + sample / 8
        };
        if offered > 0 {
            self.busy_gap = self
                .busy_round
                .map_or(u64::MAX, |last| round.saturating_sub(last));
            self.busy_round = Some(round);
        }
        self.idle_rounds = if offered == 0 {
            self.idle_rounds + 1
        } else {
            0
        };
        several
    }

    /// Return the rounds with nothing offered after which the demand is 0.
    pub(super) fn fading_rounds(&self) -> u64 {
        let mut demand = self.level;
        let mut rounds = 0;
        while demand > 0 {
            demand = fade(demand);
            rounds += 1;
        }
        rounds
    }

    /// The demand is 0, or fades to 0 over the rounds after `round` with nothing offered
    /// before the round `report_at`, when a report of it would be due.
    pub(super) fn fades_unreported(&self, round: u64, report_at: u64) -> bool {
        if self.level == 0 {
            return true;
        }
        if self.busy() {
            return false;
        }
        // The rounds after `round` but the last of them leave some demand: a report of it
        // would come due in the last of those.
        let fading = self.fading_rounds();
        fading == 1 || round + fading - 1 < report_at
    }

    /// Rounds still to go, at rest, before the holding has been idle for [`IDLE_ROUNDS`].
    pub(super) fn idle_rounds_left(&self) -> u64 {
        u64::from(IDLE_ROUNDS.saturating_sub(self.idle_rounds))
    }

    /// Start counting rounds from the node's count `rounds` (a new holding).
    pub(super) fn count_rounds_from(&mut self, rounds: u64) {
        self.rounds = rounds;
    }

    /// The node runs its round number `rounds` (its count) for this holding: the rounds it
    /// skipped since the holding's last, all at rest, were idle rounds.
    pub(super) fn catch_up(&mut self, rounds: u64) {
        self.skip_rounds(rounds.saturating_sub(self.rounds).saturating_sub(1));
        self.rounds = rounds;
    }

    /// The node ran its rounds up to its count `rounds`, and this holding was not looked at
    /// since its last: count them (all at rest) before anything reads the demand.
    pub(super) fn catch_up_to(&mut self, rounds: u64) {
        if rounds > self.rounds {
            self.skip_rounds(rounds - self.rounds);
            self.rounds = rounds;
        }
    }

    /// `skipped` rounds at rest: idle, the demand fading as a round with nothing offered
    /// fades it.
    fn skip_rounds(&mut self, skipped: u64) {
        self.idle_rounds = self
            .idle_rounds
            .saturating_add(u32::try_from(skipped).unwrap_or(u32::MAX));
        for _ in 0..skipped {
            if self.level == 0 {
                break;
            }
            self.level = fade(self.level);
        }
    }
}

/// The demand (sixteenths of a token per round, averaged) after a round with nothing
/// offered. `div_ceil`: it reaches 0 (a floor would stop at 7); below 2 it is 0.
fn fade(demand: u32) -> u32 {
    let faded = demand - demand.div_ceil(8);
    if faded < 2 { 0 } else { faded }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_request_fades_to_nothing_and_skipped_rounds_count_as_idle_ones() {
        let mut each = Demand::default();
        let mut skipped = Demand::default();
        for d in [&mut each, &mut skipped] {
            d.count_rounds_from(1);
            d.offer(1);
            assert!(!d.round(1, 0, 0));
            d.catch_up(1);
        }
        assert_eq!(each.level(), 2);
        assert!(!each.busy());
        let fading = each.fading_rounds();
        for r in 2..=20 {
            each.catch_up(r);
            each.round(r, 0, 0);
        }
        // Skipped rounds at rest fade the demand and count idle as rounds run would.
        skipped.catch_up_to(19);
        skipped.catch_up(20);
        skipped.round(20, 0, 0);
        assert_eq!(
            (each.level(), each.idle_rounds()),
            (skipped.level(), skipped.idle_rounds())
        );
        assert_eq!(each.level(), 0);
        assert!(fading >= 1);
    }

    #[test]
    fn requests_a_round_apart_are_busy_and_several_tokens_say_so() {
        let mut d = Demand::default();
        assert!(d.round(5, 3, 0));
        assert!(!d.round(6, 1, 0));
        assert!(d.busy());
        assert_eq!(d.idle_rounds(), 0);
        assert!(d.per_round() >= 1);
        assert!(!d.fades_unreported(6, 100));
    }
}
