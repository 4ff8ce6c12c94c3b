//! The quota, the governor limiter and the ratemesh limiter that the local benchmarks
//! compare: same quota, same hasher (ahash with a random seed), same clock (quanta).

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::QuantaClock;
use governor::{Quota, RateLimiter};
use ratemesh::{Limiter, Policy};

/// 100 million per second with a burst of 1000: nearly every check is admitted, so every
/// check writes (the dearer path for both).
pub const RATE_PER_S: u64 = 100_000_000;
/// The burst of both limiters, in tokens.
pub const BURST: u64 = 1000;
/// Distinct keys of the `1m_keys` benchmarks.
pub const KEYS: u64 = 1_000_000;

/// governor keyed by `u64` in a DashMap with ahash, on quanta's clock.
pub type Governor = RateLimiter<
    u64,
    governor::state::keyed::DashMapStateStore<u64, ahash::RandomState>,
    QuantaClock,
    governor::middleware::NoOpMiddleware<governor::clock::QuantaInstant>,
>;

/// Build governor with the shared quota.
pub fn governor() -> Governor {
    let quota = Quota::per_second(NonZeroU32::new(RATE_PER_S as u32).unwrap())
        .allow_burst(NonZeroU32::new(BURST as u32).unwrap());
    RateLimiter::dashmap_with_clock_and_hasher(
        quota,
        QuantaClock::default(),
        ahash::RandomState::new(),
    )
}

/// Build ratemesh with `policy`, room for twice `KEYS` keys.
pub fn ratemesh_with(policy: Policy) -> Limiter<u64> {
    Limiter::builder()
        .policy(policy)
        .max_keys(2 * KEYS as usize)
        .build::<u64>()
        .unwrap()
}

/// Build ratemesh's token bucket with the shared quota.
pub fn ratemesh() -> Limiter<u64> {
    ratemesh_with(Policy::token_bucket(RATE_PER_S, Duration::from_secs(1), BURST).unwrap())
}

/// `KEYS` keys in a fixed pseudo-random order (xorshift), the same for both limiters.
pub fn key_sequence() -> Vec<u64> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..KEYS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % KEYS
        })
        .collect()
}
