//! The concurrent store and the layered limiter: exact admission under contention, the cap
//! on keys, eviction, layered refunds and waiting.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratemesh::local::Store;
use ratemesh::{Limiter, LimiterError, ManualClock, Policy, TokioClock, Verdict, WaitError};

const SECOND: u64 = 1_000_000_000;

#[test]
fn threads_hammering_one_key_admit_exactly_the_capacity() {
    for policy in [
        Policy::token_bucket(1, Duration::from_secs(3600), 10_000).unwrap(),
        Policy::gcra(1, Duration::from_secs(3600), 10_000).unwrap(),
        Policy::leaky_bucket_police(1, Duration::from_secs(3600), 10_000).unwrap(),
        Policy::fixed_window(10_000, Duration::from_secs(3600)).unwrap(),
        Policy::sliding_window(10_000, Duration::from_secs(3600)).unwrap(),
        Policy::sliding_log(10_000, Duration::from_secs(3600)).unwrap(),
    ] {
        // No refill: the clock stands still.
        let clock = ManualClock::new(SECOND);
        let limiter = Arc::new(
            Limiter::builder()
                .policy(policy)
                .clock(clock)
                .build::<String>()
                .unwrap(),
        );
        let admitted = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                let admitted = Arc::clone(&admitted);
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let cost = 1 + i % 3;
                        if limiter.check("hot", cost).is_allowed() {
                            admitted.fetch_add(cost, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(
            admitted.load(Ordering::Relaxed),
            10_000,
            "{}",
            policy.algorithm().name()
        );
        assert_eq!(limiter.check("hot", 0).remaining, 0);
    }
}

/// Threads keep shortcuts to hot keys' cells; an eviction retires those cells. Round after
/// round (the clock stands still within a round, then jumps until every key is idle and the
/// keys are evicted), four threads hammer eight keys through their stale shortcuts: each key
/// admits exactly its capacity per round, so no retired cell ever admits beside the fresh one.
#[test]
fn shortcuts_to_evicted_hot_keys_never_admit() {
    const KEYS: usize = 8;
    const ROUNDS: u64 = 20;
    const CAPACITY: u64 = 100;
    let hour = Duration::from_secs(3600);
    for policy in [
        Policy::token_bucket(1, hour, CAPACITY).unwrap(),
        Policy::gcra(1, hour, CAPACITY).unwrap(),
        Policy::leaky_bucket_police(1, hour, CAPACITY).unwrap(),
        Policy::fixed_window(CAPACITY, hour).unwrap(),
    ] {
        let clock = ManualClock::new(SECOND);
        let limiter = Arc::new(
            Limiter::builder()
                .policy(policy)
                .clock(clock.clone())
                .build::<String>()
                .unwrap(),
        );
        let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|k| format!("tenant-{k}")).collect());
        let admitted: Arc<Vec<AtomicU64>> =
            Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        let barrier = Arc::new(std::sync::Barrier::new(5));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (limiter, keys, admitted, barrier) = (
                    Arc::clone(&limiter),
                    Arc::clone(&keys),
                    Arc::clone(&admitted),
                    Arc::clone(&barrier),
                );
                std::thread::spawn(move || {
                    for _ in 0..ROUNDS {
                        barrier.wait();
                        for i in 0..3 * CAPACITY as usize {
                            // Each thread walks the keys in its own order, a few checks each.
                            let k = (i / 3 + t) % KEYS;
                            if limiter.check(keys[k].as_str(), 1).is_allowed() {
                                admitted[k].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        // Runs of one key: each thread turns it hot (after about 32).
                        for (k, key) in keys.iter().enumerate() {
                            for _ in 0..3 * CAPACITY {
                                if limiter.check(key.as_str(), 1).is_allowed() {
                                    admitted[k].fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        barrier.wait();
                    }
                })
            })
            .collect();
        let name = policy.algorithm().name();
        for round in 0..ROUNDS {
            barrier.wait();
            barrier.wait();
            for (k, count) in admitted.iter().enumerate() {
                let count = count.swap(0, Ordering::Relaxed);
                assert_eq!(count, CAPACITY, "{name}: key {k} in round {round}");
            }
            assert_eq!(limiter.stats()[0].hot_keys, KEYS, "{name}: round {round}");
            // Busy keys stay.
            assert_eq!(limiter.evict_idle(), 0, "{name}: round {round}");
            // Every key is idle 200 hours later (a full bucket, a new window); the sweep
            // removes (and retires) all of them, shared cells included.
            clock.advance(Duration::from_secs(200 * 3600));
            assert_eq!(limiter.evict_idle(), KEYS, "{name}: round {round}");
            assert_eq!(limiter.stats()[0].hot_keys, 0, "{name}: round {round}");
        }
        for thread in threads {
            thread.join().unwrap();
        }
        let moved = limiter.stats()[0].hot_keys_moved;
        assert!(moved >= KEYS as u64 * ROUNDS, "{name}: {moved} keys moved");
    }
}

/// The race itself: a sweeper evicts idle hot keys while four threads start spending them
/// through their shortcuts (the clock stands still within a round). Whichever comes first on
/// each key, that key admits exactly its capacity in the round: a decision that loses to the
/// sweep goes to a fresh key, and a sweep that loses to a decision leaves the key alone.
/// Which side wins is up to the scheduler, so every other round the keys are also evicted
/// before the workers start (their shortcuts are then all stale).
#[test]
fn a_sweep_racing_decisions_on_hot_keys_loses_and_duplicates_nothing() {
    const KEYS: usize = 4;
    const ROUNDS: u64 = 200;
    const CAPACITY: u64 = 20;
    let hour = Duration::from_secs(3600);
    for policy in [
        Policy::token_bucket(1, hour, CAPACITY).unwrap(),
        Policy::fixed_window(CAPACITY, hour).unwrap(),
    ] {
        let clock = ManualClock::new(SECOND);
        let limiter = Arc::new(
            Limiter::builder()
                .policy(policy)
                .clock(clock.clone())
                .build::<u64>()
                .unwrap(),
        );
        let admitted: Arc<Vec<AtomicU64>> =
            Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        let barrier = Arc::new(std::sync::Barrier::new(6));
        let running = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let (limiter, admitted, barrier, running) = (
                    Arc::clone(&limiter),
                    Arc::clone(&admitted),
                    Arc::clone(&barrier),
                    Arc::clone(&running),
                );
                std::thread::spawn(move || {
                    for _ in 0..ROUNDS {
                        barrier.wait();
                        // Runs of one key (so that it turns hot), each thread starting
                        // on another key.
                        for j in 0..KEYS {
                            let k = (j + t) % KEYS;
                            for _ in 0..2 * CAPACITY {
                                if limiter.check(&(k as u64), 1).is_allowed() {
                                    admitted[k].fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        running.fetch_sub(1, Ordering::AcqRel);
                        barrier.wait();
                    }
                })
            })
            .collect();
        let sweeper = {
            let (limiter, barrier, running) = (
                Arc::clone(&limiter),
                Arc::clone(&barrier),
                Arc::clone(&running),
            );
            std::thread::spawn(move || {
                let mut evicted = 0;
                for _ in 0..ROUNDS {
                    barrier.wait();
                    while running.load(Ordering::Acquire) > 0 {
                        evicted += limiter.evict_idle();
                    }
                    barrier.wait();
                }
                evicted
            })
        };
        let name = policy.algorithm().name();
        let mut evicted_first = 0;
        for round in 0..ROUNDS {
            running.store(4, Ordering::Release);
            if round % 2 == 1 {
                evicted_first += limiter.evict_idle();
            }
            barrier.wait();
            barrier.wait();
            for (k, count) in admitted.iter().enumerate() {
                let count = count.swap(0, Ordering::Relaxed);
                assert_eq!(count, CAPACITY, "{name}: key {k} in round {round}");
            }
            // Idle again for the next round's race.
            clock.advance(Duration::from_secs(200 * 3600));
        }
        for worker in workers {
            worker.join().unwrap();
        }
        let raced = sweeper.join().unwrap();
        let stats = limiter.stats()[0];
        // The sweeps before odd rounds found every key idle (what the sweeper had left), and
        // the keys turned hot again after each eviction.
        assert_eq!(
            evicted_first + raced,
            stats.evicted as usize,
            "{name}: {stats:?}"
        );
        assert_eq!(
            evicted_first,
            KEYS * ROUNDS as usize / 2,
            "{name}: {stats:?}"
        );
        assert!(stats.hot_keys_moved > ROUNDS / 2, "{name}: {stats:?}");
    }
}

/// At most one key in 16 of `max_keys` holds a shared cell, however many keys arrive in
/// runs; the others keep deciding (exactly) through the map.
#[test]
fn hot_keys_are_capped_at_one_in_16() {
    let policy = Policy::token_bucket(1, Duration::from_secs(3600), 500).unwrap();
    let store: Store<u64> = Store::new(policy, 1600);
    for key in 0..1000u64 {
        for _ in 0..500 {
            assert!(store.decide(&key, SECOND, 1).is_allowed());
        }
        assert!(!store.decide(&key, SECOND, 1).is_allowed());
    }
    let stats = store.stats();
    assert_eq!((stats.keys, stats.hot_keys), (1000, 100), "{stats:?}");
    assert_eq!(stats.hot_keys_moved, 100);
}

#[test]
fn ten_million_keys_never_exceed_a_cap_of_100k() {
    const CAP: usize = 100_000;
    // One token per millisecond: a key that took one token is idle again 1 ms later.
    let policy = Policy::token_bucket(1000, Duration::from_secs(1), 10).unwrap();
    let store: Store<u64> = Store::new(policy, CAP);
    let mut now = SECOND;
    let mut admitted = 0u64;
    for key in 0..10_000_000u64 {
        // 10k new keys per millisecond.
        if key % 10_000 == 0 {
            now += 1_000_000;
            assert!(store.len() <= CAP, "{} keys after {key}", store.len());
        }
        admitted += u64::from(store.decide(&key, now, 1).is_allowed());
    }
    assert!(store.len() <= CAP);
    let stats = store.stats();
    assert!(stats.evicted >= 9_800_000, "{stats:?}");
    // Sweeps free room for nearly every new key; the few that met a full store shared
    // the overflow bucket.
    assert!(admitted >= 9_900_000, "{admitted} admitted, {stats:?}");
}

#[test]
fn at_the_cap_busy_keys_are_never_reset_and_new_keys_share_the_overflow_budget() {
    const CAP: usize = 1_000;
    let policy = Policy::token_bucket(1, Duration::from_secs(60), 5).unwrap();
    let store: Store<u64> = Store::new(policy, CAP);
    let now = SECOND;
    // Fill the store with busy keys: each has spent its whole burst.
    for key in 0..CAP as u64 {
        assert!(store.decide(&key, now, 5).is_allowed());
    }
    // A flood of new keys: the store stays at the cap, the flood shares one bucket of 5.
    let mut flood_admitted = 0;
    for key in CAP as u64..CAP as u64 + 100_000 {
        flood_admitted += u64::from(store.decide(&key, now + 1, 1).is_allowed());
        assert!(store.len() <= CAP);
    }
    assert_eq!(
        flood_admitted, 5,
        "the overflow cell has the policy's burst"
    );
    assert!(store.stats().overflow_decisions >= 100_000);
    // The busy keys are still spent: nothing was reset to make room.
    for key in 0..CAP as u64 {
        assert_eq!(store.decide(&key, now + 2, 1).verdict, Verdict::Denied);
    }
    // Once they refill (5 tokens at one a minute: idle again), a new key gets its own cell.
    let later = now + 301 * SECOND;
    assert!(store.decide(&u64::MAX, later, 5).is_allowed());
    assert_eq!(store.decide(&u64::MAX, later, 1).verdict, Verdict::Denied);
    assert!(store.stats().evicted >= CAP as u64 - 1);
}

#[test]
fn eviction_removes_only_idle_keys() {
    let policy = Policy::sliding_log(3, Duration::from_secs(10)).unwrap();
    let store: Store<String> = Store::new(policy, 100);
    store.decide("old", SECOND, 1);
    store.decide("recent", 9 * SECOND, 3);
    assert_eq!(store.evict_idle(11 * SECOND), 1);
    assert_eq!(store.len(), 1);
    assert_eq!(
        store.decide("recent", 11 * SECOND, 1).verdict,
        Verdict::Denied
    );
}

#[test]
fn a_request_denied_by_one_layer_leaves_no_charge_on_the_others() {
    let clock = ManualClock::new(SECOND);
    let limiter = Limiter::builder()
        .policy(Policy::token_bucket(10, Duration::from_secs(1), 10).unwrap())
        .policy(Policy::fixed_window(1000, Duration::from_secs(86_400)).unwrap())
        .policy(Policy::sliding_log(3, Duration::from_secs(60)).unwrap())
        .clock(clock.clone())
        .build::<String>()
        .unwrap();
    for _ in 0..3 {
        assert!(limiter.check("tenant", 1).is_allowed());
    }
    // The sliding log (3 per minute) denies; the other layers must not keep a charge.
    for _ in 0..20 {
        let denied = limiter.check("tenant", 1);
        assert_eq!(denied.verdict, Verdict::Denied);
        assert_eq!(denied.policy_index, 2);
    }
    let remaining: Vec<u64> = limiter
        .peek_each("tenant")
        .iter()
        .map(|d| d.remaining)
        .collect();
    assert_eq!(remaining, vec![7, 997, 0]);
    // The tightest layer speaks for an admitted request.
    clock.advance(Duration::from_secs(61));
    let d = limiter.check("tenant", 1);
    assert!(d.is_allowed());
    assert_eq!((d.policy_index, d.remaining), (2, 2));
    let remaining: Vec<u64> = limiter
        .peek_each("tenant")
        .iter()
        .map(|d| d.remaining)
        .collect();
    assert_eq!(remaining, vec![9, 996, 2]);
}

#[test]
fn a_peek_does_not_create_a_key() {
    let limiter = Limiter::builder()
        .policy(Policy::gcra(10, Duration::from_secs(1), 10).unwrap())
        .build::<String>()
        .unwrap();
    assert_eq!(limiter.check("never-seen", 0).remaining, 10);
    assert_eq!(limiter.stats()[0].keys, 0);
}

#[test]
fn a_limiter_takes_one_shaper_and_checks_it_last() {
    let shaper =
        Policy::leaky_bucket_shape(10, Duration::from_secs(1), Duration::from_secs(1)).unwrap();
    let bucket = Policy::token_bucket(10, Duration::from_secs(1), 2).unwrap();
    assert_eq!(
        Limiter::builder()
            .policy(shaper)
            .policy(shaper)
            .build::<u64>()
            .unwrap_err(),
        LimiterError::TwoShapers {
            first: 0,
            second: 1
        }
    );
    assert_eq!(
        Limiter::builder().build::<u64>().unwrap_err(),
        LimiterError::NoPolicy
    );
    assert_eq!(
        Limiter::builder()
            .policy(bucket)
            .max_keys(0)
            .build::<u64>()
            .unwrap_err(),
        LimiterError::ZeroMaxKeys
    );
    let clock = ManualClock::new(SECOND);
    let limiter = Limiter::builder()
        .policy(shaper)
        .policy(bucket)
        .clock(clock)
        .build::<u64>()
        .unwrap();
    let first = limiter.check(&1, 1);
    let second = limiter.check(&1, 1);
    assert!(first.is_allowed() && second.is_allowed());
    assert_eq!((first.delay_ns, second.delay_ns), (0, SECOND / 10));
    // The bucket (index 1) denies the third: the shaper, checked last, reserved nothing.
    let third = limiter.check(&1, 1);
    assert_eq!((third.verdict, third.policy_index), (Verdict::Denied, 1));
    assert_eq!(limiter.peek_each(&1)[0].reset_after_ns, 2 * SECOND / 10);
}

#[tokio::test(start_paused = true)]
async fn until_ready_waits_for_the_earliest_slot() {
    let limiter = Limiter::builder()
        .policy(Policy::token_bucket(10, Duration::from_secs(1), 1).unwrap())
        .clock(TokioClock::new())
        .build::<String>()
        .unwrap();
    assert!(limiter.check("k", 1).is_allowed());
    let start = tokio::time::Instant::now();
    let decision = limiter
        .until_ready("k", 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(decision.is_allowed());
    assert_eq!(start.elapsed(), Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn until_ready_gives_up_at_once_when_the_wait_is_too_long_or_the_cost_never_fits() {
    let limiter = Limiter::builder()
        .policy(Policy::token_bucket(1, Duration::from_secs(1), 5).unwrap())
        .clock(TokioClock::new())
        .build::<String>()
        .unwrap();
    assert!(limiter.check("k", 5).is_allowed());
    let start = tokio::time::Instant::now();
    let err = limiter
        .until_ready("k", 3, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(matches!(err, WaitError::WaitTooLong(d) if d.retry_after_ns == 3 * SECOND));
    assert_eq!(start.elapsed(), Duration::ZERO);
    let err = limiter
        .until_ready("k", 6, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(matches!(err, WaitError::CannotFit(_)));
}

/// Poll `future` to completion on this thread, outside any async runtime.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}

/// On tokio's paused clock: each `sleep` below returns only once every task waits, so the
/// waiter has run as far as it can before each check (no real-time guess).
#[tokio::test(start_paused = true)]
async fn until_ready_returns_once_a_manual_clock_is_advanced_from_another_task() {
    let clock = ManualClock::new(SECOND);
    let limiter = Arc::new(
        Limiter::builder()
            .policy(Policy::token_bucket(1, Duration::from_secs(10), 1).unwrap())
            .clock(clock.clone())
            .build::<String>()
            .unwrap(),
    );
    assert!(limiter.check("k", 1).is_allowed());
    let waiter = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move { limiter.until_ready("k", 1, Duration::from_secs(60)).await }
    });
    // The limiter's clock stands still: the waiter waits, however long tokio's runs.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished());
    // Another task moves it halfway: still waiting.
    let half = clock.clone();
    tokio::spawn(async move { half.advance(Duration::from_secs(5)) })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished());
    // Then to the retry time: the waiter is admitted at once (not 10 s of real time later).
    tokio::spawn(async move { clock.advance(Duration::from_secs(5)) })
        .await
        .unwrap();
    let decision = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("until_ready returns once the clock reaches the retry time")
        .unwrap()
        .unwrap();
    assert!(decision.is_allowed());
    assert!(
        !limiter.check("k", 1).is_allowed(),
        "the waiter took the token"
    );
}

#[test]
fn until_ready_on_a_manual_clock_needs_no_timer() {
    let clock = ManualClock::new(SECOND);
    let limiter = Limiter::builder()
        .policy(Policy::token_bucket(1, Duration::from_secs(1), 1).unwrap())
        .clock(clock.clone())
        .build::<String>()
        .unwrap();
    let advance_soon = |clock: ManualClock| {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            clock.advance(Duration::from_secs(1));
        })
    };
    // A tokio runtime without timers.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert!(limiter.check("k", 1).is_allowed());
    let advancer = advance_soon(clock.clone());
    let waited = runtime.block_on(limiter.until_ready("k", 1, Duration::from_secs(5)));
    advancer.join().unwrap();
    assert!(waited.unwrap().is_allowed());
    // No runtime at all.
    let advancer = advance_soon(clock.clone());
    let waited = block_on(limiter.until_ready("k", 1, Duration::from_secs(5)));
    advancer.join().unwrap();
    assert!(waited.unwrap().is_allowed());
}

#[test]
fn until_ready_without_a_timer_is_an_error_not_a_panic() {
    let limiter = Limiter::builder()
        .policy(Policy::token_bucket(1, Duration::from_secs(60), 1).unwrap())
        .build::<String>()
        .unwrap();
    assert!(limiter.check("k", 1).is_allowed());
    // The system clock follows real time: waiting needs tokio's timer.
    let outside = block_on(limiter.until_ready("k", 1, Duration::from_secs(120)));
    assert_eq!(outside, Err(WaitError::NoTimer));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let no_time = runtime.block_on(limiter.until_ready("k", 1, Duration::from_secs(120)));
    assert_eq!(no_time, Err(WaitError::NoTimer));
    // Nothing was charged, and an admission needs no timer.
    assert!(!limiter.check("k", 0).is_allowed());
    let other = block_on(limiter.until_ready("other", 1, Duration::from_secs(120)));
    assert!(other.unwrap().is_allowed());
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_leaves_no_charge() {
    for policy in [
        Policy::token_bucket(10, Duration::from_secs(1), 1).unwrap(),
        Policy::leaky_bucket_shape(10, Duration::from_secs(1), Duration::from_secs(1)).unwrap(),
    ] {
        let limiter = Limiter::builder()
            .policy(policy)
            .clock(TokioClock::new())
            .build::<String>()
            .unwrap();
        assert!(limiter.check("k", 1).is_allowed());
        let before = limiter.check("k", 0);
        // Give up after 50 ms of a 100 ms wait.
        let waited = tokio::time::timeout(
            Duration::from_millis(50),
            limiter.until_ready("k", 1, Duration::from_secs(5)),
        )
        .await;
        assert!(waited.is_err(), "{}", policy.algorithm().name());
        let after = limiter.check("k", 0);
        assert_eq!(before.remaining, after.remaining);
        assert_eq!(
            after.reset_after_ns + 50_000_000,
            before.reset_after_ns,
            "{}: the cancelled wait moved the state",
            policy.algorithm().name()
        );
        // And the slot it would have had is still free for the next caller.
        tokio::time::advance(Duration::from_millis(50)).await;
        assert!(limiter.check("k", 1).is_allowed());
    }
}

#[tokio::test(start_paused = true)]
async fn shaped_waiters_are_released_one_interval_apart() {
    let limiter = Arc::new(
        Limiter::builder()
            .policy(
                Policy::leaky_bucket_shape(20, Duration::from_secs(1), Duration::from_secs(10))
                    .unwrap(),
            )
            .clock(TokioClock::new())
            .build::<String>()
            .unwrap(),
    );
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                limiter
                    .until_ready("k", 1, Duration::from_secs(10))
                    .await
                    .unwrap();
                start.elapsed()
            })
        })
        .collect();
    let mut released = Vec::new();
    for task in tasks {
        released.push(task.await.unwrap());
    }
    released.sort();
    for pair in released.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_millis(50),
            "{released:?}"
        );
    }
}
