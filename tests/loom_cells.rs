//! Loom models of the per-key atomic cells: every interleaving of 2-3 threads deciding (and
//! refunding) on one cell. Run with:
//! `RUSTFLAGS="--cfg ratemesh_loom" CARGO_TARGET_DIR=target/loom cargo test --release --test loom_cells`
#![cfg(ratemesh_loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use ratemesh::local::WordCell;
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
