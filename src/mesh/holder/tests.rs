//! Unit tests of a holding: grants, leases, waiting requests, demand and reports.

use std::time::Duration;

use super::*;

const KEY: KeyRef = KeyRef { policy: 0, key: 1 };
const S: Nanos = 1_000_000_000;

/// [`Holding::apply_grant`], returning the requests it decided.
fn apply(
    h: &mut Holding,
    policy: &Policy,
    now: Nanos,
    grant: &Grant,
    expiry: Nanos,
) -> Vec<crate::mesh::holder::Decided> {
    let mut decided = Vec::new();
    h.apply_grant(policy, now, grant, expiry, &mut decided);
    decided
}

/// [`Holding::timeouts`], returning the requests it decided.
fn timeouts(
    h: &mut Holding,
    policy: &Policy,
    now: Nanos,
    retry_after: Nanos,
) -> Vec<crate::mesh::holder::Decided> {
    let mut decided = Vec::new();
    h.timeouts(policy, now, retry_after, &mut decided);
    decided
}

fn grant(window: u64, granted: u64, retry_after: Nanos) -> Grant {
    Grant {
        key: KEY,
        window,
        granted,
        ends_at: 0,
        retry_after,
        more_coming: 0,
        answers: 1,
        holding: 1,
    }
}

#[test]
fn waiting_requests_are_served_in_order_when_the_grant_arrives() {
    let policy = Policy::sliding_window(100, Duration::from_secs(1)).unwrap();
    let mut h = Holding::new(KEY, &policy, 1);
    assert_eq!(h.slow(&policy, 10 * S, 1, 3, 11 * S), Slow::Waits);
    assert_eq!(h.slow(&policy, 10 * S, 2, 2, 11 * S), Slow::Waits);
    assert_eq!(h.need(), 5);
    let want = h.want(10 * S, 500, false, 1);
    assert_eq!((want.need, want.window, want.tally.granted), (5, 0, 0));
    let decided = apply(&mut h, &policy, 10 * S + 1, &grant(10, 8, 0), 11 * S);
    assert_eq!(decided.len(), 2);
    assert!(decided.iter().all(|(_, d, _)| d.is_allowed()));
    // The rest went to the cell.
    assert_eq!(h.cell().remaining(), 3);
    assert_eq!(h.cell().take(10 * S + 2, 3), Ok(0));
    // The window ends: the lease is closed with its exact count.
    h.expire(11 * S);
    let want = h.want(11 * S, 550, false, 1);
    assert!(want.closed);
    assert_eq!(want.tally.used, 8);
    // A grant for the next window carries the final count of this one.
    h.slow(&policy, 11 * S, 3, 1, 12 * S);
    apply(&mut h, &policy, 11 * S + 1, &grant(11, 1, 0), 12 * S);
    assert_eq!(h.want(11 * S + 1, 551, false, 1).previous_used, Some(8));
}

#[test]
fn a_fixed_windows_spent_lease_reports_nothing_more() {
    let policy = Policy::fixed_window(100, Duration::from_secs(1)).unwrap();
    let mut h = Holding::new(KEY, &policy, 1);
    assert_eq!(h.slow(&policy, 10 * S, 1, 1, 11 * S), Slow::Waits);
    h.want(10 * S, 500, false, 1);
    let decided = apply(&mut h, &policy, 10 * S + 1, &grant(10, 1, 0), 11 * S);
    assert!(decided[0].1.is_allowed());
    // Spent to its last token: the authority counts the grant as spent already.
    for round in 501..540 {
        assert_eq!(
            h.tick(10 * S + (round - 500) * S / 50, round, true),
            (false, false)
        );
    }
    assert!(h.at_rest(539));
    // Its window ends: a fixed window's final count is never used. The holding stays a
    // window longer (an owner taking over without a backup learns its grant from it).
    assert!(!h.expire_now(11 * S));
    assert!(!h.is_idle(11 * S + S / 2));
    assert!(h.is_idle(12 * S));
    let sliding = Policy::sliding_window(100, Duration::from_secs(1)).unwrap();
    let mut h = Holding::new(KEY, &sliding, 1);
    h.slow(&policy, 10 * S, 1, 1, 11 * S);
    h.want(10 * S, 500, false, 1);
    apply(&mut h, &policy, 10 * S + 1, &grant(10, 1, 0), 11 * S);
    for round in 501..540 {
        assert_eq!(
            h.tick(10 * S + (round - 500) * S / 50, round, true),
            (false, false)
        );
    }
    assert!(h.expire_now(11 * S));
    assert!(!h.is_idle(11 * S + S / 2));
}

#[test]
fn a_windows_holdings_are_forgotten_over_16_rounds_and_a_fixed_lease_sets_no_timer() {
    let fixed = Policy::fixed_window(100, Duration::from_secs(1)).unwrap();
    let round_ns = S / 50;
    let mut wakes = std::collections::BTreeSet::new();
    for key in 1..=64u64 {
        let k = KeyRef { policy: 0, key };
        let mut h = Holding::new(k, &fixed, 1);
        h.slow(&fixed, 10 * S, 1, 1, 11 * S);
        h.want(10 * S, 500, false, 1);
        let g = Grant {
            key: k,
            ..grant(10, 1, 0)
        };
        assert!(
            apply(&mut h, &fixed, 10 * S + 1, &g, 11 * S)[0]
                .1
                .is_allowed()
        );
        // Spent out, nothing waits: a fixed window's lease has nothing to do at its expiry.
        assert_eq!(h.next_deadline(), None);
        for round in 501..540 {
            h.tick(10 * S + (round - 500) * round_ns, round, true);
        }
        assert!(h.at_rest(539));
        // Looked at again once it may be forgotten (a window after its lease's end, round
        // 600), each key up to 15 rounds later.
        let wake = h.wake_round(539, round_ns);
        assert!((600..616).contains(&wake), "{wake}");
        wakes.insert(wake);
    }
    assert_eq!(wakes.len(), 16);
    // A sliding window's lease keeps its timer: its final count is due at the expiry.
    let sliding = Policy::sliding_window(100, Duration::from_secs(1)).unwrap();
    let mut h = Holding::new(KEY, &sliding, 1);
    h.slow(&fixed, 10 * S, 1, 1, 11 * S);
    h.want(10 * S, 500, false, 1);
    apply(&mut h, &fixed, 10 * S + 1, &grant(10, 1, 0), 11 * S);
    assert_eq!(h.next_deadline(), Some(11 * S));
}

#[test]
fn a_sliding_windows_lease_that_arrives_closed_still_sends_its_final_count() {
    let policy = Policy::sliding_window(100, Duration::from_secs(1)).unwrap();
    let mut h = Holding::new(KEY, &policy, 1);
    h.slow(&policy, 10 * S, 1, 1, 11 * S);
    h.want(10 * S, 500, false, 1);
    apply(&mut h, &policy, 10 * S + 1, &grant(10, 1, 0), 11 * S);
    for round in 501..540 {
        h.tick(10 * S + (round - 500) * S / 50, round, true);
    }
    assert!(h.expire_now(11 * S));
    h.want(11 * S, 550, false, 1);
    // A refill for window 11 lands after that window ended here: the lease closes unspent.
    apply(&mut h, &policy, 12 * S, &grant(11, 5, 0), 12 * S);
    // (The node confirms the previous window's count on any grant of a later window.)
    h.previous_confirmed();
    let (tell, _) = h.tick(12 * S, 600, true);
    assert!(tell, "its final count is due");
    let want = h.want(12 * S, 600, false, 1);
    assert_eq!(
        (
            want.window,
            want.tally.granted,
            want.tally.used,
            want.closed
        ),
        (11, 5, 0, true)
    );
}

#[test]
fn a_denial_decides_the_waiting_and_later_requests_until_the_retry() {
    let policy = Policy::token_bucket(10, Duration::from_secs(1), 10).unwrap();
    let mut h = Holding::new(KEY, &policy, 1);
    h.slow(&policy, S, 1, 4, 2 * S);
    h.slow(&policy, S, 2, 4, 2 * S);
    assert_eq!(h.want(S, 1, false, 1).need, 8);
    // A request after the want waits for its own answer.
    assert_eq!(h.slow(&policy, S, 5, 1, 2 * S), Slow::Waits);
    let decided = apply(&mut h, &policy, S, &grant(0, 5, S / 2), 0);
    assert_eq!(decided.len(), 3);
    assert!(decided[0].1.is_allowed());
    assert!(!decided[1].1.is_allowed());
    assert_eq!(decided[1].1.retry_after_ns, S / 2);
    // The request after the want is served from what the denied one held back.
    assert_eq!(decided[2].0, 5);
    assert!(decided[2].1.is_allowed());
    // As large a request is denied without asking until the retry time, a smaller one
    // may still fit and asks.
    assert_eq!(h.cell().remaining(), 0);
    assert!(matches!(h.slow(&policy, S + 1, 3, 4, 2 * S), Slow::Decided(d) if !d.is_allowed()));
    assert!(matches!(h.slow(&policy, S + 1, 4, 2, 2 * S), Slow::Waits));
}

#[test]
fn costs_above_the_capacity_cannot_fit_and_deadlines_deny() {
    let policy = Policy::token_bucket(10, Duration::from_secs(1), 10).unwrap();
    let mut h = Holding::new(KEY, &policy, 1);
    assert!(
        matches!(h.slow(&policy, S, 1, 11, 2 * S), Slow::Decided(d) if d.verdict == crate::Verdict::CannotFit)
    );
    h.slow(&policy, S, 2, 1, S + 100);
    assert!(timeouts(&mut h, &policy, S + 99, 1).is_empty());
    let decided = timeouts(&mut h, &policy, S + 100, 1);
    assert_eq!(decided.len(), 1);
    assert!(!decided[0].1.is_allowed());
}

#[test]
fn an_idle_lease_is_given_back() {
    let policy = Policy::token_bucket(10, Duration::from_secs(1), 10).unwrap();
    let mut h = Holding::new(KEY, &policy, 1);
    h.slow(&policy, S, 1, 1, 2 * S);
    apply(&mut h, &policy, S, &grant(0, 6, 0), 0);
    for round in 0..IDLE_ROUNDS as u64 + 1 {
        h.tick(S + round, round, true);
    }
    assert_eq!(h.cell().remaining(), 0);
    assert_eq!(h.want(2 * S, 100, false, 1).tally.returned, 5);
}

#[test]
fn a_key_that_went_quiet_stops_asking_and_is_forgotten() {
    let policy = Policy::token_bucket(100, Duration::from_secs(1), 100).unwrap();
    let mut h = Holding::new(KEY, &policy, 1);
    h.slow(&policy, S, 1, 1, 2 * S);
    apply(&mut h, &policy, S, &grant(0, 1, 0), 0);
    // A steady stream: 3 requests a round, served from the lease.
    let mut granted = 1;
    for round in 0..50u64 {
        for _ in 0..3 {
            if h.cell().take(S + round, 1).is_err() {
                granted += 3;
                apply(&mut h, &policy, S + round, &grant(0, granted, 0), 0);
                h.cell().take(S + round, 1).unwrap();
            }
        }
        h.tick(S + round, round, true);
    }
    // The stream stops: once the lease is given back no refill is asked for, the
    // demand decays to nothing and the holding can be forgotten, once the authority
    // confirmed what it gave back (an owner out of reach never stops it waiting).
    let mut refills = 0;
    for round in 50..200u64 {
        let (_, refill) = h.tick(S + round, round, false);
        if round >= 50 + u64::from(IDLE_ROUNDS) {
            refills += u32::from(refill);
        }
    }
    assert_eq!(refills, 0);
    assert!(!h.is_idle(S + 200), "{h:?}");
    let (tell, _) = h.tick(S + 200, 200, false);
    assert!(tell, "the unconfirmed counts are told again");
    let w = h.want(S + 200, 200, false, 1);
    apply(
        &mut h,
        &policy,
        S + 200,
        &Grant {
            answers: w.seq,
            ..grant(0, granted, 0)
        },
        0,
    );
    assert!(h.is_idle(S + 201), "{h:?}");
}
#[test]
fn a_holder_stops_waiting_for_an_owner_that_answers_without_confirming() {
    let policy = Policy::token_bucket(100, Duration::from_secs(1), 100).unwrap();
    let mut h = Holding::new(KEY, &policy, 1);
    h.slow(&policy, S, 1, 1, 2 * S);
    apply(&mut h, &policy, S, &grant(0, 10, 0), 0);
    // Idle: the lease goes back, and the owner (of an earlier version) never confirms it.
    let mut told = 0;
    for round in 0..200u64 {
        let (tell, _) = h.tick(S + round, round, true);
        if tell {
            told += 1;
            h.want(S + round, round, false, 1);
        }
        if h.is_idle(S + round) {
            // A few reports of the fading demand and the give-back, then 8 more tries,
            // 4 rounds apart.
            assert!(told <= 12 && round < 60, "round {round}, told {told}");
            return;
        }
    }
    panic!("never stopped waiting: {h:?}");
}

#[test]
fn a_closed_lease_is_no_new_demand() {
    let policy = Policy::sliding_window(100, Duration::from_secs(1)).unwrap();
    let mut h = Holding::new(KEY, &policy, 1);
    h.slow(&policy, 10 * S, 1, 1, 11 * S);
    h.want(10 * S, 500, false, 1);
    apply(&mut h, &policy, 10 * S, &grant(10, 1, 0), 11 * S);
    let round = S / 50;
    // The window ends and the lease closes with its final count of 1.
    let mut demands = Vec::new();
    let mut refills = 0;
    for r in 0..60u64 {
        let now = 10 * S + (r + 1) * round;
        h.expire_now(now);
        let (_, refill) = h.tick(now, 501 + r, true);
        refills += u32::from(refill && now > 11 * S);
        demands.push(h.demand.level());
    }
    assert_eq!(refills, 0, "{demands:?}");
}

#[test]
fn a_lone_requests_fading_demand_rests_and_catches_up_as_round_by_round() {
    let fixed = Policy::fixed_window(1000, Duration::from_secs(1)).unwrap();
    let round_ns = S / 50;
    let at = |round: u64| 10 * S + (round - 500) * round_ns;
    // A request of `cost` at round 500, its grant, and the round after.
    let lone = |cost: u64| {
        let mut h = Holding::new(KEY, &fixed, 1);
        h.slow(&fixed, at(500), 1, cost, 11 * S);
        h.want(at(500), 500, false, 1);
        assert!(
            apply(&mut h, &fixed, at(500) + 1, &grant(10, cost, 0), 11 * S)[0]
                .1
                .is_allowed()
        );
        h.catch_up(1);
        let ticked = h.tick(at(501), 501, true);
        (h, ticked)
    };
    let (mut each, ticked) = lone(1);
    assert_eq!(ticked, (false, false));
    let (mut skipped, _) = lone(1);
    // Demand is left, but it fades out before a report of it is due: at rest.
    assert!(skipped.demand.level() > 0 && skipped.fading_rounds() > 1);
    assert!(skipped.at_rest(501));
    // Asked again one round later (a recall, say): it reports what round-by-round would.
    each.catch_up(2);
    assert_eq!(each.tick(at(502), 502, true), (false, false));
    assert!(each.demand.level() > 0);
    skipped.catch_up_to(2);
    let round_by_round = each.want(at(502) + 1, 502, false, 1);
    assert_eq!(skipped.want(at(502) + 1, 502, false, 1), round_by_round);
    // Caught up over more rounds than it fades: nothing left, as each round would leave.
    let (mut each, _) = lone(1);
    let (mut skipped, _) = lone(1);
    for count in 2..12 {
        each.catch_up(count);
        assert_eq!(
            each.tick(at(500 + count), 500 + count, true),
            (false, false)
        );
    }
    skipped.catch_up(12);
    each.catch_up(12);
    assert_eq!(skipped.demand.level(), 0);
    assert_eq!(
        (skipped.demand.level(), skipped.demand.idle_rounds()),
        (each.demand.level(), each.demand.idle_rounds())
    );
    // A larger request's demand is still there when its report comes due: not at rest
    // (its rounds report it).
    let (big, _) = lone(40);
    assert!(big.demand.level() > 0);
    assert!(!big.at_rest(501));
}

#[test]
fn a_cheap_request_behind_a_denied_dear_one_is_served_when_it_fits() {
    let policy = Policy::sliding_window(23, Duration::from_secs(1)).unwrap();
    let mut h = Holding::new(KEY, &policy, 1);
    assert_eq!(h.slow(&policy, 10 * S, 1, 10, 11 * S), Slow::Waits);
    assert_eq!(h.slow(&policy, 10 * S, 2, 3, 11 * S), Slow::Waits);
    assert_eq!(h.want(10 * S, 500, false, 1).need, 13);
    // 6 tokens are free, and no more will be: the 10 is denied, the 3 fits in the 6.
    let decided = apply(&mut h, &policy, 10 * S + 1, &grant(10, 6, S / 4), 11 * S);
    assert_eq!(decided.len(), 2);
    let by_id = |id| decided.iter().find(|(i, _, _)| *i == id).unwrap().1;
    assert!(!by_id(1).is_allowed());
    assert!(by_id(2).is_allowed());
    // The 3 left are the cell's.
    assert_eq!(h.cell().remaining(), 3);
}

#[test]
fn a_first_lease_for_a_window_after_the_ask_reports_nothing_spent_in_the_window_before() {
    let policy = Policy::sliding_window(100, Duration::from_secs(1)).unwrap();
    // Asked in window 10, answered with a lease of window 11 (the lease of window 10 the
    // authority may have granted never came): it used none of window 10.
    let mut h = Holding::new(KEY, &policy, 1);
    assert_eq!(h.slow(&policy, 10 * S + S / 2, 1, 3, 12 * S), Slow::Waits);
    h.want(10 * S + S / 2, 500, false, 1);
    apply(&mut h, &policy, 11 * S + 1, &grant(11, 3, 0), 12 * S);
    assert_eq!(h.want(11 * S + 2, 551, false, 1).previous_used, Some(0));
    // Asked and answered in the same window: nothing to say of the one before.
    let mut h = Holding::new(KEY, &policy, 1);
    assert_eq!(h.slow(&policy, 11 * S + 1, 1, 3, 12 * S), Slow::Waits);
    h.want(11 * S + 1, 551, false, 1);
    apply(&mut h, &policy, 11 * S + 2, &grant(11, 3, 0), 12 * S);
    assert_eq!(h.want(11 * S + 3, 552, false, 1).previous_used, None);
}

#[test]
fn requests_denied_at_their_deadline_withdraw_the_want_at_the_next_round() {
    let policy = Policy::sliding_window(100, Duration::from_secs(1)).unwrap();
    let mut h = Holding::new(KEY, &policy, 1);
    assert_eq!(h.slow(&policy, 10 * S, 1, 5, 10 * S + 100), Slow::Waits);
    assert_eq!(h.want(10 * S, 500, false, 1).need, 5);
    assert_eq!(timeouts(&mut h, &policy, 10 * S + 100, 1).len(), 1);
    // The authority still queues the want: the next round tells it nothing waits.
    assert!(!h.at_rest(501));
    assert!(h.tick(10 * S + 200, 501, true).0);
    let want = h.want(10 * S + 200, 501, false, 1);
    assert_eq!(want.need, 0);
    assert!(!h.asking.withdraw_due());
}

/// Tokens given back to the lease after a want reported them used may be admitted again
/// here, but never go back to the authority as well: its counts keep `returned + used ≤
/// granted`, so a bucket's authority never credits one token twice (as returned, and as
/// spent refill).
#[test]
fn a_refund_after_a_report_is_never_returned_to_the_authority_too() {
    let policy = Policy::token_bucket(10, Duration::from_secs(1), 10).unwrap();
    let mut h = Holding::new(KEY, &policy, 1);
    assert_eq!(h.slow(&policy, S, 1, 1, 2 * S), Slow::Waits);
    let _ = h.want(S, 1, false, S);
    let decided = apply(&mut h, &policy, S + 1, &grant(0, 10, 0), 0);
    let (_, first, charge) = decided[0];
    assert!(first.is_allowed());
    // Four more from the cell, then a report of 5 used.
    let mut charges = vec![charge.unwrap()];
    for _ in 0..4 {
        charges.push(h.cell.take_charged(S + 2, 1).unwrap().1);
    }
    let want = h.want(S + 3, 2, false, S);
    assert_eq!(want.tally.used, 5);
    // Two are given back (another policy denied those requests): the lease has them again,
    // the report does not go down.
    assert!(h.cell.give_back(charges[3], 1));
    assert!(h.cell.give_back(charges[4], 1));
    assert_eq!(h.cell.remaining(), 7);
    assert_eq!(h.want(S + 4, 3, false, S).tally.used, 5);
    // One of them is admitted again: still 5 used.
    h.cell.take(S + 5, 1).unwrap();
    assert_eq!(h.want(S + 5, 4, false, S).tally.used, 5);
    // The lease goes back: 6 tokens left the cell, 5 of them returned.
    assert_eq!(h.give_back(0), 5);
    let tally = h.want(S + 6, 5, false, S).tally;
    assert_eq!((tally.granted, tally.returned, tally.used), (10, 5, 5));
    assert!(tally.returned + tally.used <= tally.granted);
    // Before any report, a refund lowers what is reported.
    let mut h = Holding::new(KEY, &policy, 2);
    assert_eq!(h.slow(&policy, S, 1, 1, 2 * S), Slow::Waits);
    let _ = h.want(S, 1, false, S);
    let mut g = grant(0, 10, 0);
    g.holding = 2;
    let decided = apply(&mut h, &policy, S + 1, &g, 0);
    assert!(h.cell.give_back(decided[0].2.unwrap(), 1));
    let tally = h.want(S + 2, 2, false, S).tally;
    assert_eq!((tally.granted, tally.returned, tally.used), (10, 0, 0));
}
