//! Edge cases of the public API: clamping, capacity 1, weight 0 and `u64::MAX`, empty
//! sketches, `n = 0` and `n > len`, truncation, memory, and the window's rotation.

use super::{Entry, MAX_CAPACITY, Recent, SpaceSaving, Summary, guaranteed_top, merge};

#[test]
fn capacity_is_clamped() {
    assert_eq!(SpaceSaving::new(0).capacity(), 1);
    assert_eq!(SpaceSaving::new(usize::MAX).capacity(), MAX_CAPACITY);
    assert_eq!(guaranteed_top(0), 1);
    assert_eq!(guaranteed_top(1024), 1024);
    assert_eq!(guaranteed_top(usize::MAX), MAX_CAPACITY);
}

#[test]
fn capacity_one() {
    let mut s = SpaceSaving::new(1);
    for key in [1, 2, 1] {
        s.record(key, 1);
    }
    let e = Entry {
        key: 1,
        count: 3,
        error: 2,
    };
    assert_eq!(s.top(5), vec![e]);
    assert_eq!((s.total(), s.floor(), s.len()), (3, 2, 1));
}

#[test]
fn weight_zero_and_saturation() {
    let mut s = SpaceSaving::new(2);
    s.record(7, 0);
    assert!(s.is_empty() && s.total() == 0);
    for key in [1, 1, 2, 3, 3, 4] {
        s.record(key, u64::MAX);
    }
    assert_eq!(s.total(), u64::MAX);
    assert!(
        s.entries()
            .all(|e| e.count == u64::MAX && e.lower() <= e.count)
    );
    let merged = merge([&s.summary(), &s.summary()], 2);
    assert_eq!(merged.total, u64::MAX);
    assert!(merged.entries.len() <= 2);
}

#[test]
fn empty_and_n_edges() {
    let mut s = SpaceSaving::new(8);
    assert!(s.top(3).is_empty() && s.entries().next().is_none());
    assert_eq!(s.summary(), Summary::default());
    assert_eq!(merge([], 8), Summary::default());
    assert_eq!(merge([&Summary::default()], 0), Summary::default());
    for key in 0..5 {
        s.record(key, key + 1);
    }
    assert!(s.top(0).is_empty());
    let all = s.top(100);
    assert_eq!(
        all.iter().map(|e| e.key).collect::<Vec<_>>(),
        [4, 3, 2, 1, 0]
    );
    assert_eq!(s.summary().guaranteed_top(), usize::MAX);
}

#[test]
fn truncate_raises_floor() {
    let mut s = SpaceSaving::new(4);
    for (key, w) in [(1, 5), (2, 3), (3, 3), (4, 1)] {
        s.record(key, w);
    }
    let mut sum = s.summary();
    sum.truncate(1);
    assert_eq!(
        (sum.floor, sum.entries.len(), sum.guaranteed_top()),
        (3, 1, 1)
    );
    // A part with a floor and one entry caps the merge at one entry.
    assert_eq!(merge([&sum, &s.summary()], 4).entries.len(), 1);
}

#[test]
fn memory_at_1024() {
    let s = SpaceSaving::new(1024);
    assert_eq!(
        s.memory_bytes(),
        size_of::<SpaceSaving>() + 8192 * 4 + (1024 + 64) * 32 + 1024 * (4 + 4)
    );
    if cfg!(target_pointer_width = "64") {
        assert_eq!(s.memory_bytes(), 75_888);
    }
    assert_eq!(
        Recent::new(1024, 1).memory_bytes(),
        size_of::<Recent>() + 2 * (s.memory_bytes() - size_of::<SpaceSaving>())
    );
}

#[test]
fn recent_rotates() {
    let p = 100;
    let mut r = Recent::new(4, p);
    r.record(1, 10, 50); // period [0, 100)
    r.record(2, 20, 150); // [100, 200): 1's generation becomes the previous one
    assert_eq!(r.summary(199).total, 30);
    assert_eq!(r.summary(200).total, 20); // only [100, 200) is still within reach
    assert_eq!(r.summary(300).total, 0);
    r.record(3, 5, 250); // [200, 300)
    let s = r.summary(260);
    assert_eq!((s.total, s.entries[0].key), (25, 2));
    r.record(4, 1, 1000); // skipped periods: both generations start afresh
    assert_eq!(r.summary(1000).total, 1);
    r.record(5, 1, 10); // time going back counts in the current period
    assert_eq!(r.summary(1000).total, 2);
    r.record(6, 1, u64::MAX);
    assert_eq!(r.summary(u64::MAX).total, 1);
    r.clear();
    assert_eq!(r.summary(0), Summary::default());
}
