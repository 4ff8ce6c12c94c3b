//! ratemesh against governor on one hot key, measured in alternating rounds.
//!
//! `cargo bench --bench local_paired` (`RATEMESH_BENCH_ROUNDS`, default 31). Criterion's
//! `local/hot_key*` ids measure one limiter for seconds and then the other, and this VM's
//! speed drifts by tens of percent between such runs; here the two take turns in short
//! rounds (A B B A …), each round gives a ratio, and the median ratio is reported with its
//! quartiles. Same quota, hasher (ahash), clock (quanta) and key as `benches/local.rs`.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

mod common;
use common::{governor, ratemesh};

/// Checks per turn: about 0.1 s at 60 ns.
const CHECKS: u64 = 1_500_000;

/// Return the nanoseconds per check of `check` run `CHECKS` times on `threads` threads at
/// once (wall time, so two threads report the time of a pair of checks).
fn per_check_ns(threads: usize, check: &(dyn Fn() + Sync)) -> f64 {
    let barrier = Barrier::new(threads);
    let elapsed = std::thread::scope(|scope| {
        for _ in 1..threads {
            scope.spawn(|| {
                barrier.wait();
                for _ in 0..CHECKS {
                    check();
                }
            });
        }
        barrier.wait();
        let start = Instant::now();
        for _ in 0..CHECKS {
            check();
        }
        start.elapsed()
    });
    elapsed.as_nanos() as f64 / CHECKS as f64
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn compare(name: &str, rounds: usize, threads: usize) {
    let ours = ratemesh();
    let theirs = governor();
    let ratemesh_check = || {
        black_box(ours.check(black_box(&42u64), 1));
    };
    let governor_check = || {
        let _ = black_box(theirs.check_key(black_box(&42u64)));
    };
    // Warm both up.
    per_check_ns(threads, &ratemesh_check);
    per_check_ns(threads, &governor_check);
    let (mut ratios, mut ours_ns, mut theirs_ns) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (a, b) = if round % 2 == 0 {
            let a = per_check_ns(threads, &ratemesh_check);
            (a, per_check_ns(threads, &governor_check))
        } else {
            let b = per_check_ns(threads, &governor_check);
            (per_check_ns(threads, &ratemesh_check), b)
        };
        ratios.push(a / b);
        ours_ns.push(a);
        theirs_ns.push(b);
    }
    for values in [&mut ratios, &mut ours_ns, &mut theirs_ns] {
        values.sort_by(f64::total_cmp);
    }
    println!(
        "{name}: ratemesh / governor, median of {rounds} rounds {:.3} (quartiles {:.3}–{:.3}); \
         medians {:.1} / {:.1} ns per check",
        quantile(&ratios, 0.5),
        quantile(&ratios, 0.25),
        quantile(&ratios, 0.75),
        quantile(&ours_ns, 0.5),
        quantile(&theirs_ns, 0.5),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument is a filter meant for other benches.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with("--") && !"local_paired".contains(a.as_str()))
    {
        return;
    }
    let rounds = std::env::var("RATEMESH_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(31)
        .max(1);
    compare("local_paired/hot_key", rounds, 1);
    compare("local_paired/hot_key_2threads", rounds, 2);
}
