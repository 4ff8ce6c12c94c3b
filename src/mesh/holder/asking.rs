//! What a holding told its key's authority and what it heard back: the wants it sent
//! (their numbers, and when to send again if no answer comes), its last report (the count,
//! round and demand it carried), and which of its counts the authority confirmed. The
//! holding decides what to ask and when; this part remembers that it did.

use crate::clock::Nanos;

/// How many times a holder at rest tells counts its authority has not confirmed before it
/// stops waiting (each `REPORT_ROUNDS` apart: 640 ms at 20 ms rounds).
const CONFIRM_TRIES: u8 = 8;

/// One holding's exchanges with its key's authority.
#[derive(Debug, Default)]
pub(super) struct Asking {
    /// When the oldest want not answered yet went out, and the newest want answered: a
    /// denial answering a later want counts its retry time from there (the authority
    /// decided no earlier).
    want_at: Nanos,
    answered: u32,
    /// The number of the last want sent (0: none yet).
    seq: u32,
    /// When to ask again if the last want for tokens gets no answer, and what it asked for.
    resend_at: Option<Nanos>,
    asked_for: u64,
    /// The count of admissions, the round and the demand the last want reported.
    reported_used: u64,
    reported_round: u64,
    reported_demand: u32,
    /// The counts the authority must see before the holding may be forgotten (what it gave
    /// back; a bucket's: and what it spent): those of the last want sent, with its number,
    /// and those of the newest want the authority answered.
    sent: (u32, (u64, u64)),
    confirmed: (u64, u64),
    /// Reports of the same unconfirmed counts sent at rest (the holder stops waiting after
    /// [`CONFIRM_TRIES`]: an owner that never confirms, such as one of an earlier version).
    confirm_tries: u8,
    /// Tell the authority at the next round: the key's owner changed (a new one learns
    /// this lease), or a lease closed as it arrived (its final count is due).
    report_due: bool,
    /// Tell the authority at the next round that nothing waits any more: the requests it
    /// asked for were denied at their deadline here, and the authority may still queue
    /// them (and keep this holding's lease from being recalled for others).
    withdraw_due: bool,
}

impl Asking {
    /// Tell whether a want for `need` tokens should go out at `now`: none in flight asked
    /// for as much, or its answer is overdue.
    pub(super) fn should_ask(&self, now: Nanos, need: u64) -> bool {
        match self.resend_at {
            None => true,
            Some(at) => need > self.asked_for || now >= at,
        }
    }

    /// A want goes out at `now`, asking for `need` tokens for waiting requests (`waiting`;
    /// sent again after `resend_after` without an answer), and reporting `used` admissions,
    /// at round `round`, with demand `demand` and the `counts` to confirm. Return its number.
    pub(super) fn send(
        &mut self,
        now: Nanos,
        need: Option<(u64, Nanos)>,
        used: u64,
        round: u64,
        demand: u32,
        counts: (u64, u64),
    ) -> u32 {
        if let Some((need, resend_after)) = need {
            self.resend_at = Some(now + resend_after);
            self.asked_for = need;
        }
        if self.answered == self.seq {
            self.want_at = now;
        }
        self.seq = self.seq.wrapping_add(1).max(1);
        self.reported_used = used;
        self.reported_round = round;
        self.report_due = false;
        self.withdraw_due = false;
        self.reported_demand = demand;
        self.sent = (self.seq, counts);
        self.seq
    }

    /// An answer to the wants up to number `answers` arrived at `now`: the counts they
    /// carried are confirmed. Return when the authority decided: when the oldest want not
    /// answered yet went out, if this answers it; else `now`.
    pub(super) fn answered(&mut self, answers: u32, now: Nanos) -> Nanos {
        if (answers.wrapping_sub(self.sent.0) as i32) >= 0 && self.sent.0 != 0 {
            self.confirmed = self.sent.1;
            self.confirm_tries = 0;
        }
        if (answers.wrapping_sub(self.answered) as i32) > 0 {
            self.answered = answers;
            self.want_at
        } else {
            now
        }
    }

    /// Ask for `need` tokens again at `at`, not before (an answer about a lease that ended
    /// here: the authority may not have ended its window yet).
    pub(super) fn ask_again_at(&mut self, at: Nanos, need: u64) {
        self.resend_at = Some(at);
        self.asked_for = need;
    }

    /// The lease grew: what still waits may ask again at once.
    pub(super) fn progress(&mut self) {
        self.resend_at = None;
        self.asked_for = 0;
    }

    /// A denial: what still waits asks again at `soon` at the latest, not at once.
    pub(super) fn denied(&mut self, soon: Nanos) {
        self.resend_at = Some(self.resend_at.map_or(soon, |at| at.min(soon)));
    }

    /// A lease for a new window: the authority's record of it starts at 0.
    pub(super) fn new_window(&mut self) {
        self.reported_used = 0;
        self.confirmed = (0, 0);
    }

    /// Tell whether the authority confirmed `counts`.
    pub(super) fn confirmed(&self, counts: (u64, u64)) -> bool {
        self.confirmed == counts
    }

    /// Counts at rest the authority has not confirmed are due again (`owner_answers`: the
    /// key's owner is heard). Tell whether to report them, or stop waiting after
    /// [`CONFIRM_TRIES`] reports (the holder then takes `counts` as confirmed).
    pub(super) fn unconfirmed_at_rest(&mut self, counts: (u64, u64), owner_answers: bool) -> bool {
        if self.confirm_tries >= CONFIRM_TRIES {
            self.confirmed = counts;
            self.confirm_tries = 0;
            false
        } else {
            self.confirm_tries += u8::from(owner_answers);
            true
        }
    }

    /// The requests the last wants asked for stopped waiting unanswered: say so at the
    /// next round, if a want asked for tokens.
    pub(super) fn withdraw(&mut self) {
        if self.resend_at.take().is_some() {
            self.asked_for = 0;
            self.withdraw_due = true;
        }
    }

    /// Whether the authority should hear at the next round that nothing waits.
    pub(super) fn withdraw_due(&self) -> bool {
        self.withdraw_due
    }

    /// Report at the next round.
    pub(super) fn report_next_round(&mut self) {
        self.report_due = true;
    }

    /// Report at the next round, and ask then for what waits (the key's owner may have
    /// changed: the new one has not heard the wants sent).
    pub(super) fn report_to_new_owner(&mut self) {
        self.report_due = true;
        self.resend_at = None;
    }

    /// When to ask again if the last want for tokens gets no answer.
    pub(super) fn resend_at(&self) -> Option<Nanos> {
        self.resend_at
    }

    /// Whether a report is due at the next round.
    pub(super) fn report_due(&self) -> bool {
        self.report_due
    }

    /// The count of admissions, the round and the demand the last report carried.
    pub(super) fn last_report(&self) -> (u64, u64, u32) {
        (
            self.reported_used,
            self.reported_round,
            self.reported_demand,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_confirms_the_counts_of_the_wants_it_covers_and_dates_the_decision() {
        let mut a = Asking::default();
        assert!(a.confirmed((0, 0)));
        let first = a.send(100, Some((5, 50)), 3, 1, 16, (2, 3));
        let second = a.send(120, Some((5, 50)), 4, 2, 16, (2, 4));
        assert_eq!((first, second), (1, 2));
        // The answer to the first want: not yet the second's counts; the authority decided
        // after the oldest unanswered want went out.
        assert_eq!(a.answered(first, 130), 100);
        assert!(!a.confirmed((2, 4)));
        // The answer to the second: its counts are confirmed; an answer repeated later is
        // dated by its arrival.
        assert_eq!(a.answered(second, 140), 100);
        assert!(a.confirmed((2, 4)));
        assert_eq!(a.answered(second, 150), 150);
        // The next want after every one was answered starts the clock again.
        let third = a.send(160, None, 4, 3, 0, (2, 4));
        assert_eq!(a.answered(third, 170), 160);
        assert_eq!(a.last_report(), (4, 3, 0));
    }

    #[test]
    fn a_want_is_sent_again_when_overdue_or_when_more_is_needed() {
        let mut a = Asking::default();
        assert!(a.should_ask(0, 1));
        a.send(100, Some((5, 50)), 0, 1, 0, (0, 0));
        assert!(!a.should_ask(149, 5));
        assert!(a.should_ask(149, 6));
        assert!(a.should_ask(150, 5));
        a.denied(120);
        assert_eq!(a.resend_at(), Some(120));
        a.progress();
        assert!(a.should_ask(101, 1));
        a.ask_again_at(200, 3);
        assert!(!a.should_ask(150, 3));
        a.report_to_new_owner();
        assert!(a.report_due() && a.should_ask(150, 3));
    }

    #[test]
    fn a_holder_at_rest_stops_waiting_for_a_confirmation_only_from_an_owner_that_answers() {
        let mut a = Asking::default();
        a.send(100, None, 7, 1, 0, (0, 7));
        // An owner that cannot be reached: the counts are told again for ever.
        for _ in 0..100 {
            assert!(a.unconfirmed_at_rest((0, 7), false));
        }
        assert!(!a.confirmed((0, 7)));
        // One that answers without confirming: after CONFIRM_TRIES reports, no more.
        for _ in 0..CONFIRM_TRIES {
            assert!(a.unconfirmed_at_rest((0, 7), true));
        }
        assert!(!a.unconfirmed_at_rest((0, 7), true));
        assert!(a.confirmed((0, 7)));
        // A new window's record starts at 0.
        a.new_window();
        assert!(a.confirmed((0, 0)));
    }
}
