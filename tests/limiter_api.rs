//! The edges of `Limiter::check`: which key types it takes, and what a cost of 0 reports.

use std::sync::Arc;
use std::time::Duration;

use ratemesh::{Limiter, ManualClock, Policy, Verdict};

const SECOND: u64 = 1_000_000_000;

fn bucket() -> Policy {
    Policy::token_bucket(1, Duration::from_secs(1), 3).unwrap()
}

#[test]
fn string_keys_of_every_kind_are_checked_with_a_str() {
    let clock = ManualClock::new(SECOND);
    let strings = Limiter::builder()
        .policy(bucket())
        .clock(clock.clone())
        .build::<String>()
        .unwrap();
    let arcs = Limiter::builder()
        .policy(bucket())
        .clock(clock.clone())
        .build::<Arc<str>>()
        .unwrap();
    let boxes = Limiter::builder()
        .policy(bucket())
        .clock(clock.clone())
        .build::<Box<str>>()
        .unwrap();
    let names = Limiter::builder()
        .policy(bucket())
        .clock(clock.clone())
        .build::<&'static str>()
        .unwrap();
    let owned = String::from("tenant-42");
    let shared: Arc<str> = Arc::from("tenant-42");
    for round in 1..=3 {
        // A literal, a borrowed `String` and an `Arc<str>`'s contents are one key.
        let key: &str = match round {
            1 => "tenant-42",
            2 => owned.as_str(),
            _ => &shared,
        };
        assert_eq!(strings.check(key, 1).remaining, 3 - round);
        assert_eq!(arcs.check(key, 1).remaining, 3 - round);
        assert_eq!(boxes.check(key, 1).remaining, 3 - round);
    }
    // A `Limiter<&'static str>` takes a literal as it is (a route name, say).
    assert_eq!(names.check("search", 1).remaining, 2);
    assert_eq!(names.check("search", 1).remaining, 1);
    assert!(!strings.check("tenant-42", 1).is_allowed());
    assert_eq!(strings.check("tenant-7", 1).remaining, 2);
}

#[test]
fn byte_and_copy_keys_are_checked_borrowed() {
    let bytes = Limiter::builder()
        .policy(bucket())
        .clock(ManualClock::new(SECOND))
        .build::<Vec<u8>>()
        .unwrap();
    let shared = Limiter::builder()
        .policy(bucket())
        .clock(ManualClock::new(SECOND))
        .build::<Arc<[u8]>>()
        .unwrap();
    let numbers = Limiter::builder()
        .policy(bucket())
        .clock(ManualClock::new(SECOND))
        .build::<(u32, u64)>()
        .unwrap();
    assert_eq!(bytes.check(&b"k"[..], 1).remaining, 2);
    assert_eq!(bytes.check(&vec![b'k'], 1).remaining, 1);
    assert_eq!(shared.check(&b"k"[..], 1).remaining, 2);
    assert_eq!(numbers.check(&(1, 2), 1).remaining, 2);
    assert_eq!(numbers.check(&(1, 2), 1).remaining, 1);
}

#[test]
fn a_zero_cost_peeks_at_a_layered_limiter_and_takes_nothing() {
    let clock = ManualClock::new(10 * SECOND);
    let limiter = Limiter::builder()
        .policy(Policy::token_bucket(10, Duration::from_secs(1), 5).unwrap())
        .policy(Policy::fixed_window(2, Duration::from_secs(60)).unwrap())
        .clock(clock.clone())
        .build::<String>()
        .unwrap();
    // A peek at a key never seen: a fresh key's state, and nothing stored.
    let fresh = limiter.check("k", 0);
    assert_eq!((fresh.verdict, fresh.remaining), (Verdict::Allowed, 2));
    assert_eq!(limiter.stats()[0].keys, 0);
    assert!(limiter.check("k", 1).is_allowed());
    let peek = limiter.check("k", 0);
    assert_eq!(
        (peek.verdict, peek.remaining, peek.policy_index),
        (Verdict::Allowed, 1, 1)
    );
    assert_eq!(limiter.check("k", 0), peek, "a peek took something");
    assert!(limiter.check("k", 1).is_allowed());
    // The window is spent: a peek is the window's denial, until its end.
    let peek = limiter.check("k", 0);
    assert_eq!(
        (peek.verdict, peek.remaining, peek.policy_index),
        (Verdict::Denied, 0, 1)
    );
    assert_eq!(peek.retry_after_ns, 60 * SECOND - 10 * SECOND);
    // And the bucket, which the window's denial gave back nothing to, still holds 3.
    assert_eq!(limiter.peek_each("k")[0].remaining, 3);
    clock.advance_ns(peek.retry_after_ns);
    assert!(limiter.check("k", 0).is_allowed());
    assert!(limiter.check("k", 1).is_allowed());
}
