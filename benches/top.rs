//! The heavy-hitters sketch behind `GET /v1/top`, at the cost one decision pays to record in
//! it: the recording thread's sketch looked up (`thread_local::ThreadLocal`), borrowed
//! (`AtomicRefCell`: one atomic exchange, a store to give it back), and `Recent::record`
//! (Space-Saving, 256 counters, two generations), as `rules::top` records each decision of a
//! node.
//!
//! `cargo bench --bench top`. Key patterns: one key; Zipf (s = 1.1) over 100,000 keys; uniform
//! over 1,000,000 keys (almost every decision a key the sketch does not hold, the worst case).

use std::hint::black_box;

use atomic_refcell::AtomicRefCell;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use thread_local::ThreadLocal;

#[allow(
    dead_code,
    unused_imports,
    reason = "the benchmark uses the recording half; the file's unit tests come along, unrun"
)]
#[path = "../src/top.rs"]
mod top;

/// Counters per sketch, as `rules::top::CAPACITY`.
const CAPACITY: usize = 256;
/// A generation, as `rules::top`'s: 5 minutes.
const PERIOD_NS: u64 = 5 * 60 * 1_000_000_000;
/// Keys drawn ahead of the loop (a power of two).
const DRAWN: usize = 1 << 16;

/// `n` keys drawn from Zipf(s) over `keys` keys (inverse transform on the cumulative weights).
fn zipf(keys: usize, s: f64, n: usize) -> Vec<u64> {
    let mut cumulative = Vec::with_capacity(keys);
    let mut total = 0.0;
    for rank in 1..=keys {
        total += 1.0 / (rank as f64).powf(s);
        cumulative.push(total);
    }
    let mut rng = fastrand::Rng::with_seed(7);
    (0..n)
        .map(|_| {
            let u = rng.f64() * total;
            let rank = cumulative.partition_point(|&c| c < u);
            // Hashed, as counter keys are.
            (rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        })
        .collect()
}

fn record(c: &mut Criterion) {
    let mut rng = fastrand::Rng::with_seed(9);
    let patterns: [(&str, Vec<u64>); 3] = [
        ("one_key", vec![42; DRAWN]),
        ("zipf_100k", zipf(100_000, 1.1, DRAWN)),
        (
            "uniform_1m",
            (0..DRAWN)
                .map(|_| rng.u64(..1_000_000).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .collect(),
        ),
    ];
    let mut group = c.benchmark_group("top");
    group.throughput(Throughput::Elements(1));
    for (name, keys) in patterns {
        let sketches: ThreadLocal<AtomicRefCell<top::Recent>> = ThreadLocal::new();
        let mut i = 0usize;
        let mut now = 0u64;
        group.bench_function(name, |b| {
            b.iter(|| {
                let key = keys[i & (DRAWN - 1)];
                i = i.wrapping_add(1);
                now += 1_000;
                let sketch =
                    sketches.get_or(|| AtomicRefCell::new(top::Recent::new(CAPACITY, PERIOD_NS)));
                loop {
                    if let Ok(mut sketch) = sketch.try_borrow_mut() {
                        sketch.record(black_box(key), 1, now);
                        break;
                    }
                    std::hint::spin_loop();
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, record);
criterion_main!(benches);
