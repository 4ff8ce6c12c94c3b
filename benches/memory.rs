//! Bytes of heap per key with one million keys, for each kind of cell and for governor.
//!
//! `cargo bench --bench memory`. Counts live heap bytes with a counting global allocator,
//! so the figure includes the map's spare capacity (DashMap grows its shards by doubling).

use std::alloc::{GlobalAlloc, Layout, System};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use governor::{Quota, RateLimiter};
use ratemesh::{Limiter, ManualClock, Policy};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const KEYS: u64 = 1_000_000;

fn per_key(name: &str, fill: impl FnOnce() -> Box<dyn std::any::Any>) {
    let before = LIVE.load(Ordering::Relaxed);
    let kept = fill();
    let bytes = LIVE.load(Ordering::Relaxed) - before;
    println!(
        "memory/1m_keys/{name:<28} {:>7.1} bytes per key ({:.1} MiB)",
        bytes as f64 / KEYS as f64,
        bytes as f64 / (1 << 20) as f64
    );
    drop(kept);
}

fn ratemesh(policy: Policy) -> Box<dyn std::any::Any> {
    ratemesh_checked(policy, 1)
}

/// Fill a limiter with `KEYS` keys, each checked `checks` times in a row (a key checked
/// about 32 times in a row turns hot: its cell moves into one shared with the thread's
/// shortcuts, until hot keys reach their cap, one in 16 of `max_keys`).
fn ratemesh_checked(policy: Policy, checks: usize) -> Box<dyn std::any::Any> {
    let limiter = Limiter::builder()
        .policy(policy)
        .max_keys(2 * KEYS as usize)
        .clock(ManualClock::new(1_000_000_000))
        .build::<u64>()
        .unwrap();
    for key in 0..KEYS {
        for _ in 0..checks {
            limiter.check(&key, 1);
        }
    }
    Box::new(limiter)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter other than "memory" skips this target.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with("--") && !"memory".contains(a.as_str()))
    {
        return;
    }
    let s = Duration::from_secs(1);
    per_key("ratemesh/token-bucket", || {
        ratemesh(Policy::token_bucket(10, s, 10).unwrap())
    });
    per_key("ratemesh/token-bucket (125k hot)", || {
        ratemesh_checked(Policy::token_bucket(10, s, 10).unwrap(), 200)
    });
    per_key("ratemesh/fixed-window", || {
        ratemesh(Policy::fixed_window(10, s).unwrap())
    });
    per_key("ratemesh/sliding-window", || {
        ratemesh(Policy::sliding_window(10, s).unwrap())
    });
    per_key("ratemesh/sliding-log (1 entry)", || {
        ratemesh(Policy::sliding_log(10, s).unwrap())
    });
    per_key("governor (gcra)", || {
        let quota = Quota::per_second(NonZeroU32::new(10).unwrap());
        let limiter = RateLimiter::dashmap_with_clock_and_hasher(
            quota,
            governor::clock::FakeRelativeClock::default(),
            ahash::RandomState::new(),
        );
        for key in 0..KEYS {
            let _ = limiter.check_key(&key);
        }
        Box::new(limiter)
    });
}
