//! Loom models of the per-key atomic cells: every interleaving of 2-3 threads deciding (and
//! refunding) on one cell. Run with:
//! `RUSTFLAGS="--cfg ratemesh_loom" CARGO_TARGET_DIR=target/loom cargo test --release --test loom_cells`
#![cfg(ratemesh_loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use ratemesh::local::{RETIRED, WordCell};
use ratemesh::{Policy, Verdict};

const NOW: u64 = 1_000_000_000;

/// Three threads each ask for `costs[i]` at the same instant on a cell of `policy` (no refill
/// in between): the admitted total never exceeds the capacity, every admission is recorded in
/// the cell, and a decision is denied only if the cell really had no room for it.
fn race(policy: Policy, costs: [u64; 3]) {
    loom::model(move || {
        let cell = Arc::new(WordCell::new());
        let admitted = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = costs
            .iter()
            .map(|&cost| {
                let cell = Arc::clone(&cell);
                let admitted = Arc::clone(&admitted);
                thread::spawn(move || {
                    let decision = cell.decide(&policy, NOW, cost, true);
                    if decision.verdict == Verdict::Allowed {
                        admitted.fetch_add(cost, Ordering::Relaxed);
                    }
                    decision.verdict
                })
            })
            .collect();
        let verdicts: Vec<Verdict> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let total = admitted.load(Ordering::Relaxed);
        assert!(total <= policy.capacity(), "admitted {total}");
        // No lost update: the cell shows exactly what was admitted.
        let left = cell.decide(&policy, NOW, 0, true).remaining;
        assert_eq!(left, policy.capacity() - total, "verdicts {verdicts:?}");
        // A denial means the room left was smaller than that request's cost.
        for (verdict, cost) in verdicts.iter().zip(costs) {
            if *verdict == Verdict::Denied {
                assert!(left < cost, "denied {cost} with {left} left");
            }
        }
    });
}

fn hour() -> Duration {
    Duration::from_secs(3600)
}

#[test]
fn token_bucket_cell() {
    race(Policy::token_bucket(1, hour(), 2).unwrap(), [1, 1, 1]);
    race(Policy::token_bucket(1, hour(), 4).unwrap(), [2, 1, 3]);
}

#[test]
fn gcra_cell() {
    race(Policy::gcra(1, hour(), 2).unwrap(), [1, 1, 1]);
    race(Policy::gcra(1, hour(), 4).unwrap(), [2, 1, 3]);
}

#[test]
fn leaky_bucket_police_cell() {
    race(
        Policy::leaky_bucket_police(1, hour(), 3).unwrap(),
        [2, 1, 1],
    );
}

#[test]
fn fixed_window_cell() {
    race(Policy::fixed_window(2, hour()).unwrap(), [1, 1, 1]);
    race(Policy::fixed_window(4, hour()).unwrap(), [3, 2, 1]);
}

/// A layered limiter gives tokens back when a later layer denies; the refund races other
/// threads' decisions. After thread A takes and returns 2 tokens while B and C take theirs,
/// the cell holds exactly B's and C's charges.
#[test]
fn refund_racing_decisions_loses_nothing() {
    for policy in [
        Policy::token_bucket(1, hour(), 5).unwrap(),
        Policy::gcra(1, hour(), 5).unwrap(),
        Policy::fixed_window(5, hour()).unwrap(),
    ] {
        loom::model(move || {
            let cell = Arc::new(WordCell::new());
            let refunder = {
                let cell = Arc::clone(&cell);
                thread::spawn(move || {
                    assert!(cell.decide(&policy, NOW, 2, true).is_allowed());
                    cell.refund(&policy, NOW, 2);
                })
            };
            let others: Vec<_> = [1u64, 2]
                .into_iter()
                .map(|cost| {
                    let cell = Arc::clone(&cell);
                    thread::spawn(move || cell.decide(&policy, NOW, cost, true).is_allowed())
                })
                .collect();
            refunder.join().unwrap();
            let admitted: Vec<bool> = others.into_iter().map(|h| h.join().unwrap()).collect();
            // 5 tokens: A's 2 plus B's 1 plus C's 2 always fit, so both must be admitted.
            assert_eq!(admitted, vec![true, true]);
            assert_eq!(cell.decide(&policy, NOW, 0, true).remaining, 2);
        });
    }
}

/// A sweep retires an idle cell while two threads decide on it through their shortcuts
/// (`decide_live`). Either the retirement wins and neither decision touches the cell (both
/// go back to the map, where the key is fresh), or a decision changed the state first and the
/// retirement fails: a retired cell never admits, and nothing admitted is forgotten.
#[test]
fn retiring_an_idle_cell_races_decisions_through_shortcuts() {
    for policy in [
        Policy::token_bucket(1, hour(), 2).unwrap(),
        Policy::gcra(1, hour(), 2).unwrap(),
        Policy::leaky_bucket_police(1, hour(), 2).unwrap(),
        Policy::fixed_window(2, hour()).unwrap(),
    ] {
        loom::model(move || {
            let cell = Arc::new(WordCell::new());
            let deciders: Vec<_> = [1u64, 2]
                .into_iter()
                .map(|cost| {
                    let cell = Arc::clone(&cell);
                    thread::spawn(move || cell.decide_live(&policy, NOW, cost, true))
                })
                .collect();
            let retired = cell.retire_if_idle(&policy, NOW);
            let outcomes: Vec<_> = deciders.into_iter().map(|h| h.join().unwrap()).collect();
            let admitted: u64 = outcomes
                .iter()
                .zip([1u64, 2])
                .filter(|(outcome, _)| matches!(outcome, Some(d) if d.is_allowed()))
                .map(|(_, cost)| cost)
                .sum();
            if retired {
                assert_eq!(cell.load(), RETIRED);
                // Every cost fits a fresh cell, so a decision that ran before the retirement
                // would have written and made it fail: both found the cell retired.
                assert!(outcomes.iter().all(Option::is_none), "{outcomes:?}");
                assert_eq!(admitted, 0);
            } else {
                assert!(outcomes.iter().all(Option::is_some), "{outcomes:?}");
                assert!(admitted >= 1, "the retirement failed with nothing admitted");
                let left = cell.decide(&policy, NOW, 0, true).remaining;
                assert_eq!(left, policy.capacity() - admitted);
            }
        });
    }
}

mod mesh {
    //! The mesh's lease cell: two threads admit on one key's lease while the node's gossip
    //! side installs a new lease (a new window), adds to it, or withdraws from it (a recall).

    use super::*;
    use ratemesh::mesh::LeaseCell;

    /// Two admissions of `costs` race `gossip` on a lease of `tokens`; return what the
    /// admissions took and what `gossip` returned.
    fn race(
        tokens: u64,
        costs: [u64; 2],
        gossip: fn(&LeaseCell) -> u64,
    ) -> (u64, u64, Arc<LeaseCell>) {
        let cell = Arc::new(LeaseCell::new());
        cell.renew(tokens, Some(NOW + 1_000_000_000));
        let taken = Arc::new(AtomicU64::new(0));
        let requests: Vec<_> = costs
            .into_iter()
            .map(|cost| {
                let cell = Arc::clone(&cell);
                let taken = Arc::clone(&taken);
                thread::spawn(move || {
                    if cell.take(NOW, cost).is_ok() {
                        taken.fetch_add(cost, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let side = {
            let cell = Arc::clone(&cell);
            thread::spawn(move || gossip(&cell))
        };
        for r in requests {
            r.join().unwrap();
        }
        let returned = side.join().unwrap();
        (taken.load(Ordering::Relaxed), returned, cell)
    }

    /// A new lease (the next window) replaces the old one while two requests take from the
    /// old: each token of the old lease is either taken or reported left over, never both,
    /// never lost; the new lease is whole.
    #[test]
    fn a_new_lease_races_admissions() {
        loom::model(|| {
            let (taken, left, cell) = race(6, [2, 3], |c| c.renew(4, Some(NOW + 2_000_000_000)));
            // Requests that came after the renewal took from the new lease.
            let from_new = 4 - cell.remaining();
            assert_eq!(
                taken - from_new + left,
                6,
                "old lease: {taken} taken, {left} left"
            );
            assert!(from_new <= 4);
        });
    }

    /// A recall withdraws what a lease holds while two requests take from it: what is
    /// withdrawn and what is taken add up to at most the lease, and nothing is lost.
    #[test]
    fn a_recall_races_admissions() {
        loom::model(|| {
            let (taken, withdrawn, cell) = race(6, [2, 3], |c| c.withdraw(u64::MAX));
            assert_eq!(taken + withdrawn + cell.remaining(), 6);
        });
    }

    /// Closing a lease at its window's end races two requests: after `close` returns, no
    /// request can take anything, and the tokens it reports left were not taken.
    #[test]
    fn closing_a_lease_races_admissions() {
        loom::model(|| {
            let (taken, left, cell) = race(4, [2, 3], |c| c.close());
            assert_eq!(taken + left, 4, "{taken} taken, {left} left");
            assert!(cell.take(NOW, 1).is_err(), "a closed lease admitted");
        });
    }

    /// A request's tokens given back (another policy of the request denied it) race a new
    /// lease: they go back to the lease they came from, or nowhere; never into the new one.
    #[test]
    fn a_give_back_races_a_new_lease() {
        loom::model(|| {
            let cell = Arc::new(LeaseCell::new());
            cell.renew(6, Some(NOW + 1_000_000_000));
            let request = {
                let cell = Arc::clone(&cell);
                thread::spawn(move || {
                    let (_, charge) = cell.take_charged(NOW, 2).ok()?;
                    Some(cell.give_back(charge, 2))
                })
            };
            let left = cell.renew(4, Some(NOW + 2_000_000_000));
            let back = request.join().unwrap();
            // The new lease is whole: a charge of it went back to it, one of the old did not.
            assert_eq!(cell.remaining(), 4, "{back:?}, {left} left");
            match back {
                // Taken from the old lease, and back before the new one: all 6 left over.
                // Or taken from the new one and back to it: the old was whole.
                Some(true) | None => assert_eq!(left, 6),
                // Taken from the old lease, which ended before the give-back: it stays spent.
                Some(false) => assert_eq!(left, 4),
            }
        });
    }

    /// A lease that expired admits nothing, whatever it holds.
    #[test]
    fn an_expired_lease_admits_nothing() {
        loom::model(|| {
            let cell = LeaseCell::new();
            cell.renew(5, Some(NOW));
            assert!(cell.take(NOW + 1_000_000, 1).is_err());
            assert_eq!(cell.remaining(), 5);
        });
    }
}
