//! ratemesh against governor on one hot key and on a million keys, in alternating rounds.
//!
//! `cargo bench --bench local_paired` (`RATEMESH_BENCH_ROUNDS`, default 31). Criterion's
//! `local/hot_key*` ids measure one limiter for seconds and then the other, and a shared
//! machine's speed drifts by tens of percent between such runs; here the two take turns in
//! short rounds (A B B A …), each round gives a ratio, and the median ratio is reported with
//! its quartiles. Same quota, hasher (ahash), clock (quanta) and keys as `benches/local.rs`.

use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

mod common;
use common::{Governor, governor, key_sequence, ratemesh};
use ratemesh::Limiter;

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

/// Compare on one hot key (`local/hot_key*`).
fn compare_hot_key(name: &str, rounds: usize, threads: usize) {
    let ours = ratemesh();
    let theirs = governor();
    let ratemesh_check = || {
        black_box(ours.check(black_box(&42u64), 1));
    };
    let governor_check = || {
        let _ = black_box(theirs.check_key(black_box(&42u64)));
    };
    compare(name, rounds, threads, &ratemesh_check, &governor_check);
}

/// Compare on a million keys in random order (`local/1m_keys`). Where a map's memory lands
/// (which pages, which cache sets) moves a random-access benchmark by several percent, so
/// each round builds and fills both limiters anew (in alternating order) and measures them.
fn compare_1m_keys(name: &str, rounds: usize) {
    let keys = key_sequence();
    let next = AtomicUsize::new(0);
    // One thread: a plain load and store of the position (no read-modify-write).
    let next_key = || {
        let i = (next.load(Ordering::Relaxed) + 1) % keys.len();
        next.store(i, Ordering::Relaxed);
        &keys[i]
    };
    let mut measures = Measures::default();
    for round in 0..rounds {
        let (ours, theirs) = if round.is_multiple_of(2) {
            let ours = filled_ratemesh(&keys);
            (ours, filled_governor(&keys))
        } else {
            let theirs = filled_governor(&keys);
            (filled_ratemesh(&keys), theirs)
        };
        let ratemesh_check = || {
            black_box(ours.check(next_key(), 1));
        };
        let governor_check = || {
            let _ = black_box(theirs.check_key(next_key()));
        };
        measures.round(round, 1, &ratemesh_check, &governor_check);
    }
    measures.report(name);
}

fn filled_ratemesh(keys: &[u64]) -> Limiter<u64> {
    let limiter = ratemesh();
    for k in keys {
        limiter.check(k, 1);
    }
    limiter
}

fn filled_governor(keys: &[u64]) -> Governor {
    let limiter = governor();
    for k in keys {
        let _ = limiter.check_key(k);
    }
    limiter
}

/// Per-round times and ratios of the two limiters.
#[derive(Default)]
struct Measures {
    ratios: Vec<f64>,
    ours_ns: Vec<f64>,
    theirs_ns: Vec<f64>,
}

impl Measures {
    /// Measure one round, in the order A B on even rounds and B A on odd ones.
    fn round(
        &mut self,
        round: usize,
        threads: usize,
        ratemesh_check: &(dyn Fn() + Sync),
        governor_check: &(dyn Fn() + Sync),
    ) {
        let (a, b) = if round.is_multiple_of(2) {
            let a = per_check_ns(threads, ratemesh_check);
            (a, per_check_ns(threads, governor_check))
        } else {
            let b = per_check_ns(threads, governor_check);
            (per_check_ns(threads, ratemesh_check), b)
        };
        self.ratios.push(a / b);
        self.ours_ns.push(a);
        self.theirs_ns.push(b);
    }

    fn report(mut self, name: &str) {
        for values in [&mut self.ratios, &mut self.ours_ns, &mut self.theirs_ns] {
            values.sort_by(f64::total_cmp);
        }
        println!(
            "{name}: ratemesh / governor, median of {} rounds {:.3} (quartiles {:.3}–{:.3}); \
             medians {:.1} / {:.1} ns per check",
            self.ratios.len(),
            quantile(&self.ratios, 0.5),
            quantile(&self.ratios, 0.25),
            quantile(&self.ratios, 0.75),
            quantile(&self.ours_ns, 0.5),
            quantile(&self.theirs_ns, 0.5),
        );
    }
}

fn compare(
    name: &str,
    rounds: usize,
    threads: usize,
    ratemesh_check: &(dyn Fn() + Sync),
    governor_check: &(dyn Fn() + Sync),
) {
    // Warm both up.
    per_check_ns(threads, ratemesh_check);
    per_check_ns(threads, governor_check);
    let mut measures = Measures::default();
    for round in 0..rounds {
        measures.round(round, threads, ratemesh_check, governor_check);
    }
    measures.report(name);
}

fn main() {
    // `cargo bench` passes `--bench`; other arguments filter by name (`-- 1m_keys`).
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |name: &str| filters.iter().all(|f| name.contains(f.as_str()));
    let rounds = std::env::var("RATEMESH_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(31)
        .max(1);
    for (name, threads) in [
        ("local_paired/hot_key", 1),
        ("local_paired/hot_key_2threads", 2),
    ] {
        if wanted(name) {
            compare_hot_key(name, rounds, threads);
        }
    }
    if wanted("local_paired/1m_keys") {
        compare_1m_keys("local_paired/1m_keys", rounds);
    }
}
