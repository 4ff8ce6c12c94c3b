use crate::mesh::tally::Tally;
use std::time::Duration;

use super::*;

pub(super) const KEY: KeyRef = KeyRef { policy: 0, key: 7 };
const S: Nanos = 1_000_000_000;

pub(super) fn want(window: u64, granted: u64, used: u64, demand: u32) -> Want {
    Want {
        key: KEY,
        window,
        tally: Tally {
            granted,
            returned: 0,
            used,
        },
        closed: false,
        need: 0,
        smallest: 0,
        seq: 0,
        refill: false,
        demand,
        spent_ago: 0,
        previous_used: None,
        holding: 1,
    }
}

fn granted(answer: Answer) -> (u64, Nanos) {
    match answer {
        Answer::Grant {
            granted,
            retry_after,
            ..
        } => (granted, retry_after),
        Answer::Wait => panic!("waits"),
    }
}

#[test]
fn a_fixed_window_never_leases_more_than_the_limit() {
    let policy = MeshPolicy::from(Policy::fixed_window(100, Duration::from_secs(1)).unwrap());
    let mut a = Authority::fresh(KEY, &policy, 10 * S);
    let mut total = 0;
    for i in 0..300u64 {
        let node = i % 3;
        let before = a
            .holders()
            .iter()
            .find(|h| h.node == node)
            .map_or(0, |h| h.tally.granted);
        a.report(
            &policy,
            10 * S + i,
            node,
            1,
            &want(10, before, before, 32),
            true,
        );
        let (g, _) = granted(a.request(&policy, 10 * S + i, node, 1, 1, 0));
        total += g - before;
    }
    assert_eq!(total, 100);
    // The next window starts afresh.
    let (g, retry) = granted(a.request(&policy, 11 * S, 0, 1, 5, 0));
    assert_eq!(retry, 0);
    assert!(g >= 5);
}

#[test]
fn a_sliding_window_weighs_the_previous_window_and_corrects_it_with_final_counts() {
    let policy = MeshPolicy::from(Policy::sliding_window(100, Duration::from_secs(1)).unwrap());
    let mut a = Authority::fresh(KEY, &policy, 10 * S);
    a.report(&policy, 10 * S, 1, 1, &want(10, 0, 0, 0), true);
    granted(a.request(&policy, 10 * S, 1, 1, 80, 0));
    // Half-way through the next window, 80 · 0.5 = 40 of the previous still weighs.
    assert_eq!(a.available(&policy, 11 * S + S / 2), 60);
    // The holder reports it only used 20: the previous count shrinks.
    let mut w = want(10, 80, 20, 0);
    w.closed = true;
    a.report(&policy, 11 * S + S / 2, 1, 1, &w, true);
    assert_eq!(a.available(&policy, 11 * S + S / 2), 90);
}

#[test]
fn states_that_rolled_apart_merge_both_counts_of_the_window_before() {
    // A partition: each side's state of the key leased 8 of 20 in window 10; the majority's
    // rolled to window 11 before they met again. Whichever merges into which, window 11
    // weighs all 16.
    let policy = MeshPolicy::from(Policy::sliding_window(20, Duration::from_secs(1)).unwrap());
    let mut majority = Authority::fresh(KEY, &policy, 10 * S);
    let mut minority = majority.clone();
    majority.report(&policy, 10 * S, 1, 1, &want(10, 0, 0, 0), true);
    granted(majority.request(&policy, 10 * S, 1, 1, 8, 0));
    minority.report(&policy, 10 * S, 2, 1, &want(10, 0, 0, 0), true);
    granted(minority.request(&policy, 10 * S, 2, 1, 8, 0));
    assert_eq!(
        majority.available(&policy, 11 * S),
        12,
        "it knows its own 8"
    );
    let mut newer = majority.clone();
    newer.merge(&policy, &minority);
    assert_eq!(
        newer.available(&policy, 11 * S),
        4,
        "the older state's 8 weigh too"
    );
    let mut older = minority.clone();
    older.merge(&policy, &majority);
    assert_eq!(
        older.available(&policy, 11 * S),
        4,
        "merged the other way round"
    );
    // Merged again (a duplicate handoff), nothing counts twice.
    newer.merge(&policy, &minority);
    assert_eq!(newer.available(&policy, 11 * S), 4);
}

#[test]
fn a_final_count_above_the_lease_here_raises_the_previous_window() {
    // The holder spent 5 leased here and 4 leased by a state kept apart by a partition: its
    // final count of 9 weighs, not the 5 this state leased it.
    let policy = MeshPolicy::from(Policy::sliding_window(20, Duration::from_secs(1)).unwrap());
    let mut a = Authority::fresh(KEY, &policy, 10 * S);
    a.report(&policy, 10 * S, 1, 1, &want(10, 0, 0, 0), true);
    granted(a.request(&policy, 10 * S, 1, 1, 5, 0));
    assert_eq!(a.available(&policy, 11 * S), 15);
    let mut w = want(10, 9, 9, 0);
    w.closed = true;
    a.report(&policy, 11 * S, 1, 1, &w, true);
    assert_eq!(a.available(&policy, 11 * S), 11);
}

#[test]
fn a_dead_holders_closed_lease_still_weighs_as_the_previous_window() {
    let policy = MeshPolicy::from(Policy::sliding_window(20, Duration::from_secs(1)).unwrap());
    let mut a = Authority::fresh(KEY, &policy, 10 * S);
    a.report(&policy, 10 * S, 1, 1, &want(10, 0, 0, 0), true);
    granted(a.request(&policy, 10 * S, 1, 1, 5, 0));
    // The holder's lease closes at the window's end, with all 5 spent; then it dies.
    let mut w = want(10, 5, 5, 0);
    w.closed = true;
    a.report(&policy, 10 * S + S - 1, 1, 1, &w, true);
    a.forget_holder(&policy, 1);
    // At the start of the next window, the 5 still weigh in full.
    assert_eq!(a.available(&policy, 11 * S), 15);
}

#[test]
fn a_bucket_refills_but_never_above_the_burst_less_the_leases() {
    let policy = MeshPolicy::from(Policy::token_bucket(100, Duration::from_secs(1), 100).unwrap());
    let mut a = Authority::fresh(KEY, &policy, 10 * S);
    a.report(&policy, 10 * S, 1, 1, &want(0, 0, 0, 0), true);
    granted(a.request(&policy, 10 * S, 1, 1, 60, 0));
    assert_eq!(a.available(&policy, 10 * S), 40);
    // A second later the bucket would be full, but 60 tokens are still leased.
    assert_eq!(a.available(&policy, 11 * S), 40);
    // The holder reports it spent them: the cap rises, the level refills from there.
    a.report(&policy, 11 * S, 1, 1, &want(0, 60, 60, 0), true);
    assert_eq!(a.available(&policy, 11 * S), 40);
    assert_eq!(a.available(&policy, 11 * S + S / 2), 90);
    // A dead holder's lease counts as spent.
    granted(a.request(&policy, 12 * S, 1, 1, 50, 0));
    a.forget_holder(&policy, 1);
    assert_eq!(a.available(&policy, 12 * S), 50);
    assert_eq!(a.available(&policy, 13 * S), 100);
}

#[test]
fn a_fresh_bucket_state_neither_refunds_old_returns_nor_forgets_held_tokens() {
    let policy = MeshPolicy::from(Policy::token_bucket(100, Duration::from_secs(1), 100).unwrap());
    let mut a = Authority::fresh(KEY, &policy, 10 * S);
    assert_eq!(a.available(&policy, 10 * S), 100);
    // A holder leased 715 tokens from an earlier state of this key, gave 91 back and
    // spent 600: 24 are still in its lease, and its 91 returned tokens went back into
    // the earlier state's bucket, not into this one.
    let mut w = want(0, 715, 600, 0);
    w.tally.returned = 91;
    a.report(&policy, 10 * S, 0, 1, &w, true);
    assert_eq!(a.available(&policy, 10 * S), 76);
    // Once its lease is spent, later reports change nothing until the bucket refills.
    let mut w = want(0, 715, 624, 0);
    w.tally.returned = 91;
    a.report(&policy, 10 * S, 0, 1, &w, true);
    assert_eq!(a.available(&policy, 10 * S), 76);
}

#[test]
fn a_request_waits_for_recalled_tokens_instead_of_a_denial() {
    let policy = MeshPolicy::from(Policy::fixed_window(10, Duration::from_secs(3600)).unwrap());
    let mut a = Authority::fresh(KEY, &policy, 10 * S);
    a.report(&policy, 10 * S, 1, 1, &want(0, 0, 0, 0), true);
    granted(a.request(&policy, 10 * S, 1, 1, 10, 0));
    a.report(&policy, 10 * S, 2, 1, &want(0, 0, 0, 0), true);
    assert_eq!(a.request(&policy, 10 * S, 2, 1, 3, 11 * S), Answer::Wait);
    assert_eq!(a.recall_targets(&policy, 10 * S, 0), vec![(1, 0)]);
    // Node 1 gives 5 back.
    let window = a.frame().0;
    let mut back = want(window, 10, 2, 0);
    back.tally.returned = 5;
    a.report(&policy, 10 * S + 1, 1, 1, &back, true);
    let answers = a.serve_waiting(&policy, 10 * S + 1);
    assert_eq!(answers.len(), 1);
    assert_eq!(granted(answers[0].2), (3, 0));
    // Node 3 needs 5: the 2 left are granted, 3 more may come back from node 1 (it holds
    // 3 unspent): the rest of its requests wait for them.
    a.report(&policy, 10 * S + 2, 3, 1, &want(0, 0, 0, 0), true);
    match a.request(&policy, 10 * S + 2, 3, 1, 5, 11 * S) {
        Answer::Grant {
            granted,
            retry_after,
            more_coming,
            ..
        } => assert_eq!((granted, retry_after, more_coming), (2, 0, 3)),
        Answer::Wait => panic!("waits"),
    }
    // Node 1 spent them after all: node 3's waiting need cannot be met, it is denied
    // with the window's end.
    a.report(&policy, 10 * S + 3, 1, 1, &want(window, 10, 5, 0), true);
    a.report(&policy, 10 * S + 3, 2, 1, &want(window, 3, 3, 0), true);
    let answers = a.serve_waiting(&policy, 10 * S + 3);
    assert_eq!(answers.len(), 1);
    let (_, retry) = granted(answers[0].2);
    assert!(retry > 3000 * S, "{retry}");
}

#[test]
fn leases_follow_demand_and_shrink_near_the_limit() {
    let policy = MeshPolicy::from(Policy::fixed_window(10_000, Duration::from_secs(1)).unwrap());
    let mut a = Authority::fresh(KEY, &policy, 10 * S);
    // 10 tokens per round: plenty of room, a long lease.
    a.report(&policy, 10 * S, 1, 1, &want(0, 0, 0, 160), true);
    let (g, _) = granted(a.request(&policy, 10 * S, 1, 1, 1, 0));
    assert_eq!(g, 1 + 250);
    // Near the limit: at most half of the headroom.
    let policy = MeshPolicy::from(Policy::fixed_window(100, Duration::from_secs(1)).unwrap());
    let mut a = Authority::fresh(KEY, &policy, 10 * S);
    a.report(&policy, 10 * S, 1, 1, &want(0, 0, 0, 160), true);
    let (g, _) = granted(a.request(&policy, 10 * S, 1, 1, 1, 0));
    assert_eq!(g, 1 + 40);
}

#[test]
fn a_taken_over_state_ends_its_window_no_later_than_the_sender() {
    let policy = MeshPolicy::from(Policy::fixed_window(100, Duration::from_secs(1)).unwrap());
    let mut a = Authority::fresh(KEY, &policy, 10 * S);
    a.report(&policy, 10 * S, 1, 1, &want(0, 0, 0, 0), true);
    granted(a.request(&policy, 10 * S, 1, 1, 30, 0));
    // The receiver's clock is 5 s behind, known within 2 ms.
    let offset = Offset {
        offset: 5 * S as i64,
        error: 2_000_000,
        round_trip: 4_000_000,
    };
    let mut b = Authority::from_state(&a.state(), &policy, offset, 5 * S);
    let (window, _, end) = b.frame();
    assert_eq!(window, 10);
    assert_eq!(end, 6 * S - 2_000_000);
    assert_eq!(b.available(&policy, 5 * S), 70);
    // Between its end and the next start (within the clock error on both sides), requests
    // wait.
    assert!(!b.between_windows(&policy, end - 1));
    assert!(b.between_windows(&policy, end));
    assert!(b.between_windows(&policy, 6 * S + 1_999_999));
    assert!(!b.between_windows(&policy, 6 * S + 2_000_000));
    assert_eq!(b.request(&policy, 6 * S, 2, 1, 1, 7 * S), Answer::Wait);
    let answers = b.serve_waiting(&policy, 6 * S + 2_000_000);
    assert_eq!(answers.len(), 1);
}

#[test]
fn a_request_that_room_reaches_within_the_hold_waits_for_it_instead_of_a_denial() {
    const MS: Nanos = 1_000_000;
    let policy = MeshPolicy::from(Policy::sliding_window(100, Duration::from_secs(1)).unwrap());
    for hold in [0, 20 * MS] {
        let mut a = Authority::fresh(KEY, &policy, 10 * S).with_hold(hold);
        a.report(&policy, 10 * S, 1, 1, &want(0, 0, 0, 0), true);
        granted(a.request(&policy, 10 * S, 1, 1, 100, 0));
        // Half-way through the next window the previous window's 100 weigh 50; node 1
        // takes them.
        let t = 11 * S + S / 2;
        let (g, _) = granted(a.request(&policy, t, 1, 1, 50, 0));
        assert_eq!(g, 50);
        // It reports them spent, and its final count of the previous window: nothing can
        // come back from a recall.
        let mut spent = want(a.frame().0, 50, 50, 0);
        spent.previous_used = Some(100);
        a.report(&policy, t, 1, 1, &spent, true);
        // Room for one more comes 10 ms later (100 · 0.49 + 50 + 1 ≤ 100).
        a.report(&policy, t, 2, 1, &want(0, 0, 0, 0), true);
        let answer = a.request(&policy, t, 2, 1, 1, t + 100 * MS);
        if hold == 0 {
            assert_eq!(granted(answer), (0, 10 * MS));
            continue;
        }
        assert_eq!(answer, Answer::Wait);
        assert_eq!(a.next_timeout(), Some(t + 10 * MS));
        assert!(a.serve_waiting(&policy, t + 9 * MS).is_empty());
        let answers = a.serve_waiting(&policy, t + 10 * MS);
        assert_eq!(answers.len(), 1);
        assert_eq!((answers[0].0, granted(answers[0].2)), (2, (1, 0)));
        a.report(
            &policy,
            t + 10 * MS,
            2,
            1,
            &want(a.frame().0, 1, 1, 0),
            true,
        );
        // Room that comes later than the hold is not waited for: a denial at once.
        a.report(&policy, t + 10 * MS, 3, 1, &want(0, 0, 0, 0), true);
        let (g, retry) = granted(a.request(&policy, t + 10 * MS, 3, 1, 5, t + 100 * MS));
        assert_eq!(g, 0);
        assert!(retry > 20 * MS, "{retry}");
        assert!(!a.has_waiters());
    }
}

#[test]
fn a_denied_holder_is_not_leased_what_serves_none_of_its_requests() {
    let policy = MeshPolicy::from(Policy::fixed_window(100, Duration::from_secs(1)).unwrap());
    let mut a = Authority::fresh(KEY, &policy, 10 * S);
    a.report(&policy, 10 * S, 1, 1, &want(0, 0, 0, 0), true);
    granted(a.request(&policy, 10 * S, 1, 1, 58, 0));
    let window = a.frame().0;
    a.report(&policy, 10 * S, 1, 1, &want(window, 58, 58, 0), true);
    // Node 2's one request costs 49: 42 are free, nothing can come back. It is denied, and
    // the 42 stay free instead of sitting in node 2's lease.
    let mut big = want(0, 0, 0, 0);
    big.smallest = 49;
    a.report(&policy, 10 * S + 1, 2, 1, &big, true);
    let (g, retry) = granted(a.request(&policy, 10 * S + 1, 2, 1, 49, 11 * S));
    assert_eq!(g, 0);
    assert!(retry > 0);
    assert_eq!(a.available(&policy, 10 * S + 1), 42);
    // Node 3's request of 16 is served at once.
    a.report(&policy, 10 * S + 2, 3, 1, &want(0, 0, 0, 0), true);
    let (g, _) = granted(a.request(&policy, 10 * S + 2, 3, 1, 16, 11 * S));
    assert!(g >= 16);
}

#[test]
fn a_state_passed_on_twice_never_begins_the_next_window_before_any_holder_of_it() {
    let policy = MeshPolicy::from(Policy::fixed_window(100, Duration::from_secs(1)).unwrap());
    let a = Authority::fresh(KEY, &policy, 10 * S);
    // B's clock is 5 s behind A's, known within 20 ms: B ends window 10 at 5.98 s and
    // begins window 11 at 6.02 s.
    let loose = Offset {
        offset: 5 * S as i64,
        error: 20_000_000,
        round_trip: 40_000_000,
    };
    let b = Authority::from_state(&a.state(), &policy, loose, 5 * S);
    assert_eq!(b.frame().2, 6 * S - 20_000_000);
    // C reads B's clock exactly: it begins window 11 no earlier than B would, 40 ms after
    // B's early end (not 20 ms before A's end, as B's end alone would say).
    let exact = Offset {
        offset: 0,
        error: 0,
        round_trip: 0,
    };
    let mut c = Authority::from_state(&b.state(), &policy, exact, 5 * S);
    assert_eq!(c.frame().2, 6 * S - 20_000_000);
    assert_eq!(c.request(&policy, 6 * S, 2, 1, 1, 7 * S), Answer::Wait);
    assert!(c.serve_waiting(&policy, 6 * S + 19_000_000).is_empty());
    assert_eq!(c.serve_waiting(&policy, 6 * S + 20_000_000).len(), 1);
}

#[test]
fn a_denial_counts_from_what_the_holders_lease_already_holds() {
    // 100 tokens a second: one every 10 ms.
    let policy = MeshPolicy::from(Policy::token_bucket(100, Duration::from_secs(1), 10).unwrap());
    let mut a = Authority::fresh(KEY, &policy, 10 * S);
    a.report(&policy, 10 * S, 1, 1, &want(0, 0, 0, 0), true);
    granted(a.request(&policy, 10 * S, 1, 1, 10, 0));
    // The holder spent 6 of its 10 and waits for a request of 5: it needs 1 more, and the
    // bucket is empty. It fits 10 ms later (not the 50 ms that 5 whole tokens take).
    let mut w = want(0, 10, 6, 0);
    w.need = 1;
    w.smallest = 5;
    a.report(&policy, 10 * S, 1, 1, &w, true);
    let (_, retry) = granted(a.request(&policy, 10 * S, 1, 1, 1, 10 * S));
    assert_eq!(retry, 10_000_000);
}

#[test]
fn a_bucket_gives_back_the_refill_its_cap_held_back_for_tokens_spent_before_the_report() {
    // 100 tokens a second, burst 100: one token every 10 ms.
    let policy = MeshPolicy::from(Policy::token_bucket(100, Duration::from_secs(1), 100).unwrap());
    let mut a = Authority::fresh(KEY, &policy, 10 * S);
    a.report(&policy, 10 * S, 1, 1, &want(0, 0, 0, 0), true);
    a.report(&policy, 10 * S, 2, 1, &want(0, 0, 0, 0), true);
    granted(a.request(&policy, 10 * S, 1, 1, 30, 0));
    granted(a.request(&policy, 10 * S, 2, 1, 30, 0));
    assert_eq!(a.available(&policy, 10 * S), 40);
    // 100 ms later both report their 30 spent, the last at least 50 ms before: a central
    // bucket would have refilled from then, 5 tokens by now (once, not once per holder).
    let t = 10 * S + 100_000_000;
    let mut w = want(0, 30, 30, 0);
    w.spent_ago = 50_000_000;
    a.report(&policy, t, 1, 1, &w, true);
    a.report(&policy, t, 2, 1, &w, true);
    assert_eq!(a.available(&policy, t), 45);
    // Spending reported as just done gets nothing back; refill resumes from the report.
    let mut b = Authority::fresh(KEY, &policy, 10 * S);
    b.report(&policy, 10 * S, 1, 1, &want(0, 0, 0, 0), true);
    granted(b.request(&policy, 10 * S, 1, 1, 30, 0));
    b.report(&policy, t, 1, 1, &want(0, 30, 30, 0), true);
    assert_eq!(b.available(&policy, t), 70);
    assert_eq!(b.available(&policy, t + 50_000_000), 75);
}

#[test]
fn a_backup_is_idle_exactly_when_its_takeover_would_be() {
    let offsets = [
        Offset {
            offset: 0,
            error: 0,
            round_trip: 0,
        },
        Offset {
            offset: 300_000_000,
            error: 5_000_000,
            round_trip: 1_000_000,
        },
        Offset {
            offset: -700_000_000,
            error: 200_000_000,
            round_trip: 0,
        },
    ];
    let policies = [
        Policy::fixed_window(100, Duration::from_secs(1)).unwrap(),
        Policy::sliding_window(100, Duration::from_secs(1)).unwrap(),
        Policy::token_bucket(100, Duration::from_secs(1), 50).unwrap(),
    ];
    let mut idle_seen = 0;
    for policy in policies.map(MeshPolicy::from) {
        for spent_all in [false, true] {
            // An authority that leased some tokens to node 1, which spent part or all of them.
            let mut a = Authority::fresh(KEY, &policy, 10 * S);
            a.report(&policy, 10 * S, 1, 1, &want(10, 0, 0, 32), true);
            let (g, _) = granted(a.request(&policy, 10 * S, 1, 1, 20, 0));
            let used = if spent_all { g } else { g / 2 };
            a.report(&policy, 10 * S + 1000, 1, 1, &want(10, g, used, 32), true);
            let state = a.state();
            for offset in offsets {
                for later in [0, S / 2, S, 2 * S, 3 * S, 10 * S] {
                    let now = (10 * S + later).saturating_add_signed(-offset.offset);
                    let expected =
                        Authority::from_state(&state, &policy, offset, now).is_idle(&policy, now);
                    assert_eq!(
                        Authority::state_is_idle(&state, &policy, offset, now),
                        expected,
                        "{:?} {offset:?} {later}",
                        policy.algorithm()
                    );
                    idle_seen += u32::from(expected);
                }
            }
        }
    }
    // Windows end in time, and a bucket refills once nothing is out.
    assert!(idle_seen > 10, "{idle_seen}");
}

#[test]
fn a_holder_that_stops_waiting_leaves_the_queue_and_its_lease_may_be_recalled() {
    let policy = MeshPolicy::from(Policy::fixed_window(23, Duration::from_secs(3600)).unwrap());
    let mut a = Authority::fresh(KEY, &policy, 10 * S);
    // Node 2 took 16 and spent 10 of them; node 1 holds 7 and waits for 9 more: the 6
    // node 2 holds may come back for it.
    a.report(&policy, 10 * S, 2, 1, &want(0, 0, 0, 0), true);
    granted(a.request(&policy, 10 * S, 2, 1, 16, 0));
    let window = a.frame().0;
    a.report(&policy, 10 * S, 2, 1, &want(window, 16, 10, 0), true);
    let mut w = want(0, 0, 0, 0);
    w.seq = 1;
    w.need = 16;
    a.report(&policy, 10 * S, 1, 1, &w, true);
    granted(a.request(&policy, 10 * S, 1, 1, 7, 11 * S));
    let coming = |answer| match answer {
        Answer::Grant {
            granted,
            more_coming,
            retry_after,
            ..
        } => (granted, more_coming, retry_after > 0),
        Answer::Wait => panic!("waits"),
    };
    assert_eq!(
        coming(a.request(&policy, 10 * S, 1, 1, 9, 11 * S)),
        (7, 6, true)
    );
    // Node 3 needs 10: what node 1 holds serves its own wait, never a recall; only node
    // 2's 6 may come: the rest is denied now.
    let mut w = want(0, 0, 0, 0);
    w.seq = 1;
    w.need = 10;
    a.report(&policy, 10 * S + 1, 3, 1, &w, true);
    assert_eq!(
        coming(a.request(&policy, 10 * S + 1, 3, 1, 10, 11 * S)),
        (0, 6, true)
    );
    // Node 1's requests timed out: its newest want needs nothing, it leaves the queue, and
    // its 7 may come back for node 3.
    let mut w = want(window, 7, 0, 0);
    w.seq = 2;
    a.report(&policy, 10 * S + 2, 1, 1, &w, true);
    assert_eq!(
        a.request(&policy, 10 * S + 2, 3, 1, 10, 11 * S),
        Answer::Wait
    );
    let mut targets = a.recall_targets(&policy, 10 * S + 2, 0);
    targets.sort_unstable();
    assert_eq!(targets, vec![(1, 0), (2, 0)]);
    // An older want of node 3 that needed nothing, delivered late, does not take its
    // place in the queue.
    let mut old = want(0, 0, 0, 0);
    old.seq = 0;
    a.report(&policy, 10 * S + 3, 3, 1, &old, true);
    assert!(a.has_waiters());
}

#[test]
fn a_calendar_authority_rolls_to_the_period_of_now_placed_as_its_windows_are() {
    use crate::algorithm::calendar::{Calendar, CalendarWindow};
    let month = Policy::fixed_window(100, Duration::from_secs(31 * 86_400)).unwrap();
    let utc = CalendarWindow::from_zone_name(Calendar::Month, "UTC").unwrap();
    let policy = MeshPolicy::new(month, Some(utc));
    // 2028-02-15, then 2028-05-10 (three months idle): May 2028 exactly.
    let (may, june) = (1_840_752_000 * S, 1_843_430_400 * S);
    let mut a = Authority::fresh(KEY, &policy, 1_834_185_600 * S);
    let feb = a.frame().0;
    a.report(&policy, 1_834_185_600 * S, 1, 1, &want(feb, 0, 0, 4), true);
    granted(a.request(&policy, 1_834_185_600 * S, 1, 1, 60, 0));
    assert_eq!(a.available(&policy, 1_841_529_600 * S), 100);
    assert_eq!(a.frame(), (feb + 3, may, june));
    // An authority taken over from a node whose clock is 2 s behind places its windows
    // 2 s later here (each begins no earlier than it did there), period after period.
    let behind = Offset {
        offset: -2_000_000_000,
        error: 0,
        round_trip: 0,
    };
    let mut b = Authority::from_state(&a.state(), &policy, behind, may + 10 * S);
    assert_eq!(b.frame(), (feb + 3, may + 2 * S, june + 2 * S));
    b.available(&policy, june + S);
    assert_eq!(b.frame().0, feb + 3, "June has not begun on this clock");
    b.available(&policy, june + 3 * S);
    // July 2028 begins 30 days after June.
    assert_eq!(
        b.frame(),
        (feb + 4, june + 2 * S, june + 30 * 86_400 * S + 2 * S)
    );
}
