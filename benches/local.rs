//! The local engine against governor, under the same quota, hasher and key pattern.
//!
//! `cargo bench --bench local` (add `-- local/hot_key` to filter). Both limiters use ahash
//! with a random seed and a quanta clock; ratemesh runs its token bucket.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};

mod common;
use common::{BURST, RATE_PER_S, governor, key_sequence, ratemesh, ratemesh_with};
use dashmap::DashMap;
use ratemesh::clock::Clock;
use ratemesh::policy::MAX_WINDOW_LIMIT;
use ratemesh::{Limiter, Policy, SystemClock};

/// Run `check` on two threads at once, `iters` times each; return the wall time.
fn two_threads(iters: u64, check: &(dyn Fn() + Sync)) -> Duration {
    let barrier = Barrier::new(2);
    std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            barrier.wait();
            for _ in 0..iters {
                check();
            }
        });
        barrier.wait();
        let start = Instant::now();
        for _ in 0..iters {
            check();
        }
        other.join().unwrap();
        start.elapsed()
    })
}

fn local(c: &mut Criterion) {
    let mut group = c.benchmark_group("local");
    let ours = ratemesh();
    let theirs = governor();
    group.bench_function("hot_key/ratemesh", |b| {
        b.iter(|| black_box(ours.check(black_box(&42u64), 1)))
    });
    group.bench_function("hot_key/governor", |b| {
        b.iter(|| black_box(theirs.check_key(black_box(&42u64))))
    });
    // Context: governor reporting what ratemesh's `Decision` always carries (remaining tokens).
    let informed = governor().with_middleware::<governor::middleware::StateInformationMiddleware>();
    group.bench_function("hot_key/governor_with_remaining", |b| {
        b.iter(|| {
            black_box(
                informed
                    .check_key(black_box(&42u64))
                    .map(|state| state.remaining_burst_capacity()),
            )
        })
    });

    // Each limiter is filled with the same million keys right before it is measured, so both
    // start from the same cache state; the other one is dropped first.
    let keys = key_sequence();
    {
        let ours = ratemesh();
        for &k in &keys {
            ours.check(&k, 1);
        }
        let mut i = 0usize;
        group.bench_function("1m_keys/ratemesh", |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                black_box(ours.check(&keys[i], 1))
            })
        });
    }
    {
        let theirs = governor();
        for &k in &keys {
            let _ = theirs.check_key(&k);
        }
        let mut i = 0usize;
        group.bench_function("1m_keys/governor", |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                black_box(theirs.check_key(&keys[i]))
            })
        });
    }

    let ours = ratemesh();
    let theirs = governor();
    group.bench_function("hot_key_2threads/ratemesh", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, &|| {
                black_box(ours.check(black_box(&42u64), 1));
            })
        })
    });
    group.bench_function("hot_key_2threads/governor", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, &|| {
                let _ = black_box(theirs.check_key(black_box(&42u64)));
            })
        })
    });
    group.finish();
}

/// Where the time goes: the clock, the map, and the floor of a map lookup plus an atomic add.
fn floor(c: &mut Criterion) {
    let mut group = c.benchmark_group("floor");
    let system = SystemClock::new();
    group.bench_function("clock/ratemesh_system", |b| {
        b.iter(|| black_box(system.now_ns()))
    });
    group.bench_function("clock/std_instant", |b| {
        b.iter(|| black_box(Instant::now()))
    });
    let map: DashMap<u64, std::sync::atomic::AtomicU64, ahash::RandomState> =
        DashMap::with_hasher(ahash::RandomState::new());
    map.insert(42, Default::default());
    group.bench_function("dashmap_get_atomic_add", |b| {
        b.iter(|| {
            map.get(black_box(&42u64))
                .map(|v| v.fetch_add(1, std::sync::atomic::Ordering::AcqRel))
        })
    });
    let siphash: Limiter<u64, SystemClock, std::hash::RandomState> = Limiter::builder()
        .policy(Policy::token_bucket(RATE_PER_S, Duration::from_secs(1), BURST).unwrap())
        .hasher(std::hash::RandomState::new())
        .build::<u64>()
        .unwrap();
    group.bench_function("hot_key/ratemesh_siphash", |b| {
        b.iter(|| black_box(siphash.check(black_box(&42u64), 1)))
    });
    // A mesh policy's request path on a node that holds the key's lease: one
    // compare-and-swap on the lease cell.
    #[cfg(feature = "mesh")]
    {
        let cell = ratemesh::mesh::LeaseCell::new();
        cell.renew(1 << 47, None);
        group.bench_function("mesh_lease_take", |b| {
            b.iter(|| black_box(cell.take(black_box(1), 1)))
        });
    }
    group.finish();
}

/// Every algorithm on one hot key, single thread.
fn algorithms(c: &mut Criterion) {
    let mut group = c.benchmark_group("algorithm");
    let s = Duration::from_secs(1);
    for policy in [
        Policy::token_bucket(RATE_PER_S, s, BURST).unwrap(),
        Policy::gcra(RATE_PER_S, s, BURST).unwrap(),
        Policy::leaky_bucket_police(RATE_PER_S, s, BURST).unwrap(),
        Policy::leaky_bucket_shape(RATE_PER_S, s, Duration::from_micros(10)).unwrap(),
        Policy::fixed_window(MAX_WINDOW_LIMIT, s).unwrap(),
        Policy::sliding_window(MAX_WINDOW_LIMIT, s).unwrap(),
        Policy::sliding_log(1000, Duration::from_micros(10)).unwrap(),
    ] {
        let limiter = ratemesh_with(policy);
        group.bench_function(format!("hot_key/{}", policy.algorithm().name()), |b| {
            b.iter(|| black_box(limiter.check(black_box(&42u64), 1)))
        });
    }
    let layered = Limiter::builder()
        .policy(Policy::token_bucket(RATE_PER_S, s, BURST).unwrap())
        .policy(Policy::fixed_window(MAX_WINDOW_LIMIT, Duration::from_secs(86_400)).unwrap())
        .build::<u64>()
        .unwrap();
    group.bench_function("hot_key/layered_bucket_and_daily_window", |b| {
        b.iter(|| black_box(layered.check(black_box(&42u64), 1)))
    });
    group.finish();
}

/// One hot key of a string type, checked through a borrowed `&str` (no allocation).
fn key_types(c: &mut Criterion) {
    let mut group = c.benchmark_group("key_type");
    let policy = Policy::token_bucket(RATE_PER_S, Duration::from_secs(1), BURST).unwrap();
    let strings = Limiter::builder().policy(policy).build::<String>().unwrap();
    group.bench_function("hot_key/string_by_str", |b| {
        b.iter(|| black_box(strings.check(black_box("tenant-42"), 1)))
    });
    group.finish();
}

criterion_group!(benches, local, floor, algorithms, key_types);
criterion_main!(benches);
