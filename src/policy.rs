//! Policies: what a limit is (algorithm, rate or window, burst), validated once at construction.
//!
//! A `Policy` can only be built through its validating constructors, so every value the
//! algorithms see is in range: no zero rate, window, burst or limit, no window over a year,
//! no rate finer than one token per nanosecond, nothing that overflows `u64` nanoseconds.

use std::time::Duration;

use crate::clock::{Nanos, duration_to_nanos};

/// The longest window or period a policy may use: 366 days, in nanoseconds.
pub const MAX_WINDOW_NS: Nanos = 366 * 24 * 3600 * 1_000_000_000;

/// The largest `limit` of a sliding log (it keeps up to `limit` entries per key).
pub const MAX_SLIDING_LOG_LIMIT: u64 = 1 << 20;

/// The largest `limit` of a fixed or sliding window (counts are packed into 32 bits, and a
/// fixed window's all-ones word is reserved for a retired cell).
pub const MAX_WINDOW_LIMIT: u64 = u32::MAX as u64 - 1;

/// The largest `limit` of a global (mesh) window: counts live in 48-bit leases
/// (`mesh::lease`), not in a local cell's 32 bits.
pub const MAX_GLOBAL_WINDOW_LIMIT: u64 = (1 << 48) - 1;

/// The largest bucket depth in nanoseconds (`burst` × interval); keeps arithmetic in `u64`.
pub const MAX_BUCKET_DEPTH_NS: Nanos = 1 << 62;

/// What was wrong with a policy or a cost, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A field that must be positive was zero.
    #[error("`{field}` must be greater than zero")]
    Zero {
        /// The field's name.
        field: &'static str,
    },
    /// A field was larger than the limiter supports.
    #[error("`{field}` is {value}, larger than the maximum {max}")]
    TooLarge {
        /// The field's name.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The largest accepted value, in the field's unit.
        max: u64,
    },
    /// More tokens per period than nanoseconds in the period.
    #[error("`rate` {rate} per {period_ns} ns is finer than one token per nanosecond")]
    RateTooHigh {
        /// Tokens per period.
        rate: u64,
        /// The period in nanoseconds.
        period_ns: Nanos,
    },
    /// A request cost more than the policy can ever admit at once.
    #[error("`cost` {cost} exceeds the policy's capacity of {capacity} tokens: it can never fit")]
    CostExceedsCapacity {
        /// The cost asked for, in tokens.
        cost: u64,
        /// The policy's capacity in tokens.
        capacity: u64,
    },
}

/// The algorithm that decides, with the parameters that only it uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// A bucket of `burst` tokens refilled at `rate` per `period`; a request takes `cost` tokens.
    TokenBucket,
    /// The generic cell rate algorithm with governor's and redis-cell's semantics: the same
    /// decisions as a token bucket of the same rate and burst, kept as a theoretical arrival time.
    Gcra,
    /// A leaky bucket used as a meter: requests fill a bucket of `burst` tokens that drains at
    /// `rate`; a request that would overflow it is rejected.
    LeakyBucketPolice,
    /// A leaky bucket used as a queue: each request gets the next free slot (one token per
    /// interval) and waits for it, up to `max_wait_ns`; requests are released no closer than
    /// `cost / rate` apart and never in bursts.
    LeakyBucketShape {
        /// The longest a request may wait for its slot, in nanoseconds.
        max_wait_ns: Nanos,
    },
    /// At most `limit` per window aligned to the clock's epoch (UTC for the system clock).
    FixedWindow,
    /// Exact: at most `limit` in every interval of length `window`, keeping one entry per
    /// admitted request.
    SlidingLog,
    /// Cloudflare's approximation of a sliding window: the previous window's count weighted by
    /// the part of it still inside the sliding window, plus the current window's count.
    SlidingWindow,
}

impl Algorithm {
    /// Tell whether the mesh shares this algorithm's count across nodes: token bucket,
    /// GCRA, fixed window and sliding window (the leaky buckets and the sliding log decide
    /// on each node alone).
    #[cfg(feature = "mesh")]
    pub(crate) fn is_shared_by_mesh(&self) -> bool {
        self.is_bucket() || self.counts_per_window()
    }

    /// Tell whether this is a bucket of free tokens refilled at a rate (token bucket, GCRA),
    /// as the mesh keeps it.
    #[cfg(feature = "mesh")]
    pub(crate) fn is_bucket(&self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::Gcra)
    }

    /// Tell whether this algorithm counts per window (fixed and sliding window): a mesh lease
    /// of it ends with its window.
    #[cfg(feature = "mesh")]
    pub(crate) fn counts_per_window(&self) -> bool {
        matches!(self, Algorithm::FixedWindow | Algorithm::SlidingWindow)
    }

    /// Tell whether a window's final count matters once the window is over: the sliding
    /// window weighs the previous window by it; a fixed window starts afresh.
    #[cfg(feature = "mesh")]
    pub(crate) fn weighs_previous(&self) -> bool {
        matches!(self, Algorithm::SlidingWindow)
    }

    /// Return the short name used in configs, logs and the demo.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token-bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::LeakyBucketPolice => "leaky-bucket-police",
            Algorithm::LeakyBucketShape { .. } => "leaky-bucket-shape",
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::SlidingLog => "sliding-log",
            Algorithm::SlidingWindow => "sliding-window",
        }
    }

    /// Tell whether this algorithm keeps a rate and a burst (as opposed to a limit per window).
    pub fn is_rate_based(&self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket
                | Algorithm::Gcra
                | Algorithm::LeakyBucketPolice
                | Algorithm::LeakyBucketShape { .. }
        )
    }
}

/// A divisor fixed at construction, divided by with one multiply and one correction step
/// (a 64-bit `div` costs more than the whole rest of a token-bucket decision).
///
/// With `m = ⌊(2⁶⁴−1)/d⌋`, `⌊x·m / 2⁶⁴⌋` is `⌊x/d⌋` or one less for every `x < 2⁶⁴`,
/// so one comparison of the remainder fixes it (checked against `/` by a unit test).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Divisor {
    divisor: u64,
    multiplier: u64,
}

impl Divisor {
    fn new(divisor: u64) -> Self {
        let divisor = divisor.max(1);
        Divisor {
            divisor,
            multiplier: u64::MAX / divisor,
        }
    }

    #[inline]
    fn get(&self) -> u64 {
        self.divisor
    }

    #[inline]
    fn divide(&self, x: u64) -> u64 {
        let estimate = ((u128::from(x) * u128::from(self.multiplier)) >> 64) as u64;
        let remainder = x - estimate * self.divisor;
        estimate + u64::from(remainder >= self.divisor)
    }
}

/// A validated limit: an algorithm with its rate and burst, or its limit and window.
///
/// Rate-based policies refill one token every `interval_ns = period_ns / rate` nanoseconds
/// (rounded down, like governor) and hold at most `capacity` tokens. Window policies admit
/// at most `capacity` (their `limit`) tokens per `window_ns`.
///
/// ```
/// use std::time::Duration;
/// use ratemesh::{Algorithm, Policy, PolicyError};
///
/// let api = Policy::token_bucket(100, Duration::from_secs(1), 200)?; // 100/s, bursts of 200
/// assert_eq!(api.algorithm(), Algorithm::TokenBucket);
/// assert_eq!(api.capacity(), 200);
/// assert_eq!(api.interval_ns(), 10_000_000); // one token every 10 ms
///
/// // A limit that cannot work is refused with a typed error, never at request time.
/// assert!(matches!(
///     Policy::fixed_window(0, Duration::from_secs(60)),
///     Err(PolicyError::Zero { .. })
/// ));
/// # Ok::<(), PolicyError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    algorithm: Algorithm,
    capacity: u64,
    interval: Divisor,
    window: Divisor,
}

fn positive(field: &'static str, value: u64) -> Result<u64, PolicyError> {
    if value == 0 {
        Err(PolicyError::Zero { field })
    } else {
        Ok(value)
    }
}

fn at_most(field: &'static str, value: u64, max: u64) -> Result<u64, PolicyError> {
    if value > max {
        Err(PolicyError::TooLarge { field, value, max })
    } else {
        Ok(value)
    }
}

fn rate_interval(rate: u64, period: Duration) -> Result<Nanos, PolicyError> {
    let rate = positive("rate", rate)?;
    let period_ns = at_most(
        "period",
        positive("period", duration_to_nanos(period))?,
        MAX_WINDOW_NS,
    )?;
    if period_ns < rate {
        return Err(PolicyError::RateTooHigh { rate, period_ns });
    }
    Ok(period_ns / rate)
}

fn bucket(
    algorithm: Algorithm,
    rate: u64,
    period: Duration,
    burst: u64,
) -> Result<Policy, PolicyError> {
    let interval_ns = rate_interval(rate, period)?;
    let burst = positive("burst", burst)?;
    at_most("burst", burst, MAX_BUCKET_DEPTH_NS / interval_ns)?;
    Ok(Policy::from_parts(
        algorithm,
        burst,
        interval_ns,
        burst * interval_ns,
    ))
}

fn window(
    algorithm: Algorithm,
    limit: u64,
    window: Duration,
    max_limit: u64,
) -> Result<Policy, PolicyError> {
    let limit = at_most("limit", positive("limit", limit)?, max_limit)?;
    let window_ns = at_most(
        "window",
        positive("window", duration_to_nanos(window))?,
        MAX_WINDOW_NS,
    )?;
    Ok(Policy::from_parts(
        algorithm,
        limit,
        (window_ns / limit).max(1),
        window_ns,
    ))
}

impl Policy {
    fn from_parts(
        algorithm: Algorithm,
        capacity: u64,
        interval_ns: Nanos,
        window_ns: Nanos,
    ) -> Self {
        Policy {
            algorithm,
            capacity,
            interval: Divisor::new(interval_ns),
            window: Divisor::new(window_ns),
        }
    }

    /// Return how many whole intervals (tokens) fit in `ns` nanoseconds.
    #[inline]
    pub fn tokens_in(&self, ns: Nanos) -> u64 {
        self.interval.divide(ns)
    }

    /// Return the index of the window containing `now` (`now / window`).
    #[inline]
    pub fn window_of(&self, now: Nanos) -> u64 {
        self.window.divide(now)
    }

    /// Build a token bucket of `burst` tokens refilled at `rate` tokens per `period`.
    pub fn token_bucket(rate: u64, period: Duration, burst: u64) -> Result<Self, PolicyError> {
        bucket(Algorithm::TokenBucket, rate, period, burst)
    }

    /// Build a GCRA limiter of `rate` per `period` with `burst` (governor's `max_burst`;
    /// redis-cell's `max_burst + 1`).
    pub fn gcra(rate: u64, period: Duration, burst: u64) -> Result<Self, PolicyError> {
        bucket(Algorithm::Gcra, rate, period, burst)
    }

    /// Build a policing leaky bucket of `capacity` tokens that drains at `rate` per `period`.
    pub fn leaky_bucket_police(
        rate: u64,
        period: Duration,
        capacity: u64,
    ) -> Result<Self, PolicyError> {
        bucket(Algorithm::LeakyBucketPolice, rate, period, capacity)
    }

    /// Build a shaping leaky bucket: one token per `period / rate`, each request waiting for
    /// its slot for at most `max_wait`.
    ///
    /// Its capacity, the largest cost it accepts, is `1 + max_wait / interval` tokens: the
    /// request in service plus the ones that may queue behind it.
    pub fn leaky_bucket_shape(
        rate: u64,
        period: Duration,
        max_wait: Duration,
    ) -> Result<Self, PolicyError> {
        let interval_ns = rate_interval(rate, period)?;
        let max_wait_ns = at_most("max_wait", duration_to_nanos(max_wait), MAX_WINDOW_NS)?;
        let capacity = 1 + max_wait_ns / interval_ns;
        at_most("max_wait", capacity, MAX_BUCKET_DEPTH_NS / interval_ns)?;
        Ok(Policy::from_parts(
            Algorithm::LeakyBucketShape { max_wait_ns },
            capacity,
            interval_ns,
            capacity * interval_ns,
        ))
    }

    /// Build a fixed window: at most `limit` tokens per aligned `window`.
    pub fn fixed_window(limit: u64, window_len: Duration) -> Result<Self, PolicyError> {
        window(Algorithm::FixedWindow, limit, window_len, MAX_WINDOW_LIMIT)
    }

    /// Build an exact sliding log: at most `limit` tokens in every interval of length `window`.
    pub fn sliding_log(limit: u64, window_len: Duration) -> Result<Self, PolicyError> {
        window(
            Algorithm::SlidingLog,
            limit,
            window_len,
            MAX_SLIDING_LOG_LIMIT,
        )
    }

    /// Build a sliding-window counter: about `limit` tokens per sliding `window`.
    pub fn sliding_window(limit: u64, window_len: Duration) -> Result<Self, PolicyError> {
        window(
            Algorithm::SlidingWindow,
            limit,
            window_len,
            MAX_WINDOW_LIMIT,
        )
    }

    /// Build a fixed window for the mesh, whose limit may exceed a local cell's
    /// ([`MAX_GLOBAL_WINDOW_LIMIT`]). Only the mesh may decide it: a local store cannot.
    pub fn global_fixed_window(limit: u64, window_len: Duration) -> Result<Self, PolicyError> {
        window(
            Algorithm::FixedWindow,
            limit,
            window_len,
            MAX_GLOBAL_WINDOW_LIMIT,
        )
    }

    /// Build a sliding-window counter for the mesh, whose limit may exceed a local cell's
    /// ([`MAX_GLOBAL_WINDOW_LIMIT`]). Only the mesh may decide it: a local store cannot.
    pub fn global_sliding_window(limit: u64, window_len: Duration) -> Result<Self, PolicyError> {
        window(
            Algorithm::SlidingWindow,
            limit,
            window_len,
            MAX_GLOBAL_WINDOW_LIMIT,
        )
    }

    /// The same algorithm (and window, for a window) with a limit (burst) of `capacity` and,
    /// for a bucket, `interval_ns` per token: a policy changed live (the mesh's reloads).
    /// `capacity` and `interval_ns` are at least 1; a bucket's depth saturates.
    #[cfg(feature = "mesh")]
    pub(crate) fn with_limits(&self, capacity: u64, interval_ns: Nanos) -> Policy {
        let capacity = capacity.max(1);
        if self.algorithm.is_rate_based() {
            let interval_ns = interval_ns.max(1);
            let depth = capacity
                .saturating_mul(interval_ns)
                .min(MAX_BUCKET_DEPTH_NS);
            Policy::from_parts(self.algorithm, capacity, interval_ns, depth)
        } else {
            let window_ns = self.window_ns();
            Policy::from_parts(
                self.algorithm,
                capacity,
                (window_ns / capacity).max(1),
                window_ns,
            )
        }
    }

    /// The same policy with a limit (a bucket's burst) of `limit` for one key (an override
    /// of the admin API): a window keeps its length, a bucket the time it takes to fill
    /// from empty (its rate scales with the burst).
    #[cfg(any(feature = "mesh", feature = "node"))]
    pub(crate) fn with_limit(&self, limit: u64) -> Result<Policy, PolicyError> {
        let limit = positive("limit", limit)?;
        let max = match self.algorithm {
            Algorithm::SlidingLog => MAX_SLIDING_LOG_LIMIT,
            _ if self.algorithm.is_rate_based() => self.window_ns(),
            _ => MAX_WINDOW_LIMIT,
        };
        let limit = at_most("limit", limit, max)?;
        let window_ns = self.window_ns();
        Ok(Policy::from_parts(
            self.algorithm,
            limit,
            (window_ns / limit).max(1),
            window_ns,
        ))
    }

    /// Return the algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Return the most tokens one request (or one burst) can take: the burst of a bucket,
    /// the limit of a window.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Return the nanoseconds per token of a rate-based policy (`window / limit` for windows).
    pub fn interval_ns(&self) -> Nanos {
        self.interval.get()
    }

    /// Return the window in nanoseconds; for a bucket, the time to refill it from empty.
    pub fn window_ns(&self) -> Nanos {
        self.window.get()
    }

    /// Check that a request of `cost` tokens could ever be admitted by this policy.
    pub fn validate_cost(&self, cost: u64) -> Result<(), PolicyError> {
        positive("cost", cost)?;
        if cost > self.capacity {
            return Err(PolicyError::CostExceedsCapacity {
                cost,
                capacity: self.capacity,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn divisor_matches_integer_division() {
        let divisors = [
            1,
            2,
            3,
            7,
            10,
            1_000_000_007,
            u64::MAX / 3,
            u64::MAX - 1,
            u64::MAX,
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for d in divisors {
            let divisor = Divisor::new(d);
            for special in [0, 1, d - 1, d, d.wrapping_add(1), u64::MAX - 1, u64::MAX] {
                assert_eq!(divisor.divide(special), special / d, "{special} / {d}");
            }
            for _ in 0..100_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                assert_eq!(divisor.divide(x), x / d, "{x} / {d}");
                let small = x >> (x % 64);
                assert_eq!(divisor.divide(small), small / d, "{small} / {d}");
            }
        }
    }

    #[test]
    fn rejects_zero_fields_by_name() {
        let field = |r: Result<Policy, PolicyError>| match r {
            Err(PolicyError::Zero { field }) => field,
            other => panic!("expected Zero, got {other:?}"),
        };
        assert_eq!(field(Policy::token_bucket(0, S, 10)), "rate");
        assert_eq!(
            field(Policy::token_bucket(10, Duration::ZERO, 10)),
            "period"
        );
        assert_eq!(field(Policy::gcra(10, S, 0)), "burst");
        assert_eq!(field(Policy::fixed_window(0, S)), "limit");
        assert_eq!(field(Policy::sliding_log(10, Duration::ZERO)), "window");
        assert_eq!(field(Policy::sliding_window(10, Duration::ZERO)), "window");
    }

    #[test]
    fn rejects_windows_over_a_year() {
        let year_and_a_day = Duration::from_secs(367 * 24 * 3600);
        assert!(matches!(
            Policy::fixed_window(10, year_and_a_day),
            Err(PolicyError::TooLarge {
                field: "window",
                ..
            })
        ));
        assert!(matches!(
            Policy::token_bucket(10, year_and_a_day, 1),
            Err(PolicyError::TooLarge {
                field: "period",
                ..
            })
        ));
        assert!(Policy::fixed_window(10, Duration::from_secs(365 * 24 * 3600)).is_ok());
    }

    #[test]
    fn rejects_rates_finer_than_a_nanosecond_and_overflowing_bursts() {
        assert!(matches!(
            Policy::token_bucket(2_000_000_000, S, 1),
            Err(PolicyError::RateTooHigh { .. })
        ));
        assert!(matches!(
            Policy::token_bucket(1, Duration::from_secs(3600), u64::MAX),
            Err(PolicyError::TooLarge { field: "burst", .. })
        ));
        assert!(matches!(
            Policy::fixed_window(u64::from(u32::MAX), S),
            Err(PolicyError::TooLarge { field: "limit", .. })
        ));
        assert!(Policy::fixed_window(u64::from(u32::MAX) - 1, S).is_ok());
    }

    #[test]
    fn cost_is_checked_against_capacity() {
        let p = Policy::token_bucket(10, S, 5).unwrap();
        assert_eq!(p.validate_cost(0), Err(PolicyError::Zero { field: "cost" }));
        assert_eq!(p.validate_cost(5), Ok(()));
        assert_eq!(
            p.validate_cost(6),
            Err(PolicyError::CostExceedsCapacity {
                cost: 6,
                capacity: 5
            })
        );
        let shape = Policy::leaky_bucket_shape(10, S, Duration::from_millis(250)).unwrap();
        assert_eq!(shape.capacity(), 1 + 250 / 100);
        let msg = p.validate_cost(6).unwrap_err().to_string();
        assert!(msg.contains("cost") && msg.contains("capacity"), "{msg}");
    }
}
