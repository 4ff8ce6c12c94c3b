//! The request path allocates nothing: decisions on a known key, admitted or denied, for
//! every algorithm and for a layered limiter. Counted with a global allocator.

use std::time::Duration;

use ratemesh::{Algorithm, Limiter, ManualClock, Policy};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::allocations_during;

#[test]
fn checks_on_a_known_key_do_not_allocate() {
    let s = Duration::from_secs(1);
    let policies = [
        Policy::token_bucket(100, s, 10).unwrap(),
        Policy::gcra(100, s, 10).unwrap(),
        Policy::leaky_bucket_police(100, s, 10).unwrap(),
        Policy::leaky_bucket_shape(100, s, Duration::from_millis(50)).unwrap(),
        Policy::fixed_window(10, s).unwrap(),
        Policy::sliding_window(10, s).unwrap(),
        Policy::sliding_log(10, s).unwrap(),
    ];
    for policy in policies {
        let clock = ManualClock::new(1_000_000_000);
        let limiter = Limiter::builder()
            .policy(policy)
            .clock(clock.clone())
            .build::<String>()
            .unwrap();
        // Warm up: create the key, let it turn hot (its cell moves into one shared with
        // this thread's shortcut, after about 32 checks), and let a sliding log reach its
        // largest size.
        let word = !matches!(
            policy.algorithm(),
            Algorithm::SlidingLog | Algorithm::SlidingWindow
        );
        let mut checks = 0;
        while word && limiter.stats()[0].hot_keys == 0 {
            limiter.check("client", 1);
            checks += 1;
            assert!(checks < 2000, "not hot after {checks} checks");
        }
        for _ in 0..3 {
            for _ in 0..20 {
                limiter.check("client", 1);
                clock.advance(Duration::from_millis(10));
            }
            clock.advance(s);
        }
        let count = allocations_during(|| {
            for _ in 0..1000 {
                limiter.check("client", 1);
                clock.advance(Duration::from_millis(3));
            }
        });
        assert_eq!(count, 0, "{} allocated", policy.algorithm().name());
    }
}

#[test]
fn a_layered_denial_with_refunds_does_not_allocate() {
    let clock = ManualClock::new(1_000_000_000);
    let limiter = Limiter::builder()
        .policy(Policy::token_bucket(100, Duration::from_secs(1), 100).unwrap())
        .policy(Policy::fixed_window(1000, Duration::from_secs(3600)).unwrap())
        .policy(Policy::gcra(1, Duration::from_secs(60), 2).unwrap())
        .clock(clock)
        .build::<String>()
        .unwrap();
    // A key's first checks allocate: its map entry (the key and the shard's table), then,
    // when it turns hot (after about 32 checks on a thread), this thread's shortcut table,
    // the shared cell with a copy of the key, and its entry in the map of shared cells
    // (another copy and that shard's table): seven per layer.
    let warm_up = allocations_during(|| {
        for _ in 0..1000 {
            limiter.check("client", 1);
        }
    });
    let hot: Vec<usize> = limiter.stats().iter().map(|layer| layer.hot_keys).collect();
    assert_eq!(hot, vec![1, 1, 1], "1000 checks made every layer's key hot");
    assert!(warm_up <= 3 * 7, "{warm_up} allocations to warm up");
    let count = allocations_during(|| {
        for _ in 0..1000 {
            limiter.check("client", 1);
        }
    });
    assert_eq!(count, 0);
}

/// More hot keys than a thread has shortcuts (32 per store): the shortcuts keep changing
/// (each change clones an `Arc`), and still nothing is allocated.
#[test]
fn many_interleaved_hot_keys_do_not_allocate() {
    let clock = ManualClock::new(1_000_000_000);
    let limiter = Limiter::builder()
        .policy(Policy::token_bucket(100, Duration::from_secs(1), 1_000_000).unwrap())
        .clock(clock)
        .build::<String>()
        .unwrap();
    let keys: Vec<String> = (0..100).map(|k| format!("tenant-{k}")).collect();
    for key in &keys {
        for _ in 0..1000 {
            limiter.check(key.as_str(), 1);
        }
    }
    let count = allocations_during(|| {
        for _ in 0..20 {
            for key in &keys {
                limiter.check(key.as_str(), 1);
                limiter.check(key.as_str(), 1);
            }
        }
    });
    assert_eq!(count, 0);
    assert_eq!(limiter.stats()[0].hot_keys, 100);
}

/// Keys kept as `Arc<str>` or `Box<str>` are checked with a `&str`: once known, as cold
/// keys (through the map) and as hot ones (through the shortcuts), nothing is allocated.
#[test]
fn shared_and_boxed_str_keys_checked_with_a_str_do_not_allocate() {
    fn exercise<K>(limiter: &Limiter<K, ManualClock>, keys: &[String]) -> (u64, u64)
    where
        K: std::borrow::Borrow<str> + std::hash::Hash + Eq + Send + Sync,
        str: for<'a> ratemesh::ToKey<'a, K>,
    {
        let pass = || {
            for key in keys {
                limiter.check(key.as_str(), 1);
            }
        };
        pass();
        // A key that a thread happens to note twice in a row moves its cell once (the one
        // allocation of its life): measure a pass in which no key moved.
        let moved = || limiter.stats()[0].hot_keys_moved;
        let cold = (0..20)
            .find_map(|_| {
                let before = moved();
                let count = allocations_during(pass);
                (moved() == before).then_some(count)
            })
            .expect("keys kept moving");
        for _ in 0..1000 {
            limiter.check(keys[0].as_str(), 1);
        }
        let hot = allocations_during(|| {
            for _ in 0..1000 {
                limiter.check(keys[0].as_str(), 1);
            }
        });
        (cold, hot)
    }
    let policy = Policy::token_bucket(100, Duration::from_secs(1), 1_000_000).unwrap();
    let keys: Vec<String> = (0..1000).map(|k| format!("tenant-{k}")).collect();
    let arcs = Limiter::builder()
        .policy(policy)
        .clock(ManualClock::new(1_000_000_000))
        .build::<std::sync::Arc<str>>()
        .unwrap();
    assert_eq!(exercise(&arcs, &keys), (0, 0), "Arc<str> keys");
    // The key checked 2,000 times in a row is hot (a cold pass's key may be too, at random:
    // the sampler may note one key of a set twice in a row across passes).
    assert!(arcs.stats()[0].hot_keys >= 1);
    let boxes = Limiter::builder()
        .policy(policy)
        .clock(ManualClock::new(1_000_000_000))
        .build::<Box<str>>()
        .unwrap();
    assert_eq!(exercise(&boxes, &keys), (0, 0), "Box<str> keys");
}
