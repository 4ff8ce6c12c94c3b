//! For callers of rate-limited APIs: honour `Retry-After`, otherwise back off exponentially
//! with full jitter, and never retry more than a budget allows.
//!
//! ```no_run
//! # async fn demo() -> Result<(), std::io::Error> {
//! use ratemesh::http::client::RetryPolicy;
//! let policy = RetryPolicy::default();
//! // Any closure returning a future of `Result<http::Response<_>, _>`: a hyper or tower call.
//! let response = policy
//!     .send(|| async { Ok::<_, std::io::Error>(http::Response::new("body")) })
//!     .await?;
//! assert_eq!(response.status(), 200);
//! # Ok(()) }
//! ```
//! (`send` takes any response type that implements [`Retryable`]; `http::Response` does.)

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

use crate::policy::{Policy, PolicyError};
use crate::{Limiter, Verdict};

/// A response that may ask for a retry.
pub trait Retryable {
    /// The status code.
    fn status_code(&self) -> StatusCode;
    /// The headers.
    fn header_map(&self) -> &HeaderMap;
}

impl<B> Retryable for http::Response<B> {
    fn status_code(&self) -> StatusCode {
        self.status()
    }
    fn header_map(&self) -> &HeaderMap {
        self.headers()
    }
}

/// Parse `Retry-After`: delay-seconds or an HTTP-date (relative to `now`).
pub fn parse_retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = jiff::fmt::rfc2822::parse(text).ok()?.timestamp();
    let now = jiff::Timestamp::try_from(now).ok()?;
    let wait = at.duration_since(now);
    Some(Duration::try_from(wait).unwrap_or(Duration::ZERO))
}

/// A bound on retries: at most `ratio` retries per request on average, plus a floor of
/// `min_per_second` retries per second, so that retries cannot multiply an overload.
#[derive(Debug)]
pub struct RetryBudget {
    ratio_milli: u64,
    max_milli: u64,
    balance_milli: AtomicU64,
    floor: Limiter<()>,
}

impl RetryBudget {
    /// Allow `ratio` (e.g. 0.1) retries per request, at most `max_saved` saved up, plus
    /// `min_per_second` retries per second regardless (1 to 1e9).
    pub fn new(ratio: f64, max_saved: u64, min_per_second: u64) -> Result<Self, PolicyError> {
        let floor = Policy::token_bucket(min_per_second, Duration::from_secs(1), min_per_second)?;
        let floor = Limiter::builder()
            .policy(floor)
            .build::<()>()
            .map_err(|_| PolicyError::Zero {
                field: "min_per_second",
            })?;
        Ok(RetryBudget {
            ratio_milli: (ratio.clamp(0.0, 1000.0) * 1000.0) as u64,
            max_milli: max_saved.saturating_mul(1000),
            balance_milli: AtomicU64::new(0),
            floor,
        })
    }

    /// Record a first attempt (it earns `ratio` of a retry).
    pub fn deposit(&self) {
        let _ = self
            .balance_milli
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                Some((b + self.ratio_milli).min(self.max_milli))
            });
    }

    /// Take one retry from the budget; false when it is spent.
    pub fn withdraw(&self) -> bool {
        if self.floor.check(&(), 1).verdict == Verdict::Allowed {
            return true;
        }
        self.balance_milli
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| b.checked_sub(1000))
            .is_ok()
    }
}

/// When and how often to retry a rate-limited call.
#[derive(Debug)]
pub struct RetryPolicy {
    /// The first backoff (before jitter).
    pub base: Duration,
    /// The longest backoff (before jitter).
    pub cap: Duration,
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// A `Retry-After` longer than this is not waited for: the response is returned.
    pub max_retry_after: Duration,
    /// The retry budget, shared by all calls through this policy.
    pub budget: RetryBudget,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(10),
            max_retries: 4,
            max_retry_after: Duration::from_secs(60),
            budget: RetryBudget::new(0.1, 100, 5).expect("constant budget parameters are valid"),
        }
    }
}

impl RetryPolicy {
    /// Return how long to wait before retry number `retry` (0-based) after a response, or
    /// `None` when it should not be retried. `random` is uniform in [0, 1) (full jitter).
    pub fn delay(
        &self,
        retry: u32,
        status: StatusCode,
        headers: &HeaderMap,
        random: f64,
    ) -> Option<Duration> {
        let retryable =
            status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE;
        if !retryable || retry >= self.max_retries {
            return None;
        }
        if let Some(wait) = parse_retry_after(headers, SystemTime::now()) {
            return (wait <= self.max_retry_after).then_some(wait);
        }
        let exponential = self
            .base
            .saturating_mul(1u32 << retry.min(30))
            .min(self.cap);
        Some(exponential.mul_f64(random.clamp(0.0, 1.0)))
    }

    /// Call `attempt` until it succeeds, fails, or its response is not worth retrying (any
    /// status but 429 and 503, a retry budget spent, too many retries, a `Retry-After` past
    /// `max_retry_after`). Returns the last response.
    pub async fn send<F, Fut, R, E>(&self, mut attempt: F) -> Result<R, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: Retryable,
    {
        self.budget.deposit();
        let mut retry = 0;
        loop {
            let response = attempt().await?;
            let wait = self.delay(
                retry,
                response.status_code(),
                response.header_map(),
                fastrand::f64(),
            );
            match wait {
                Some(wait) if self.budget.withdraw() => {
                    tokio::time::sleep(wait).await;
                    retry += 1;
                }
                _ => return Ok(response),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(retry_after: Option<&str>) -> HeaderMap {
        let mut map = HeaderMap::new();
        if let Some(value) = retry_after {
            map.insert(http::header::RETRY_AFTER, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn retry_after_wins_over_backoff_and_is_bounded() {
        let policy = RetryPolicy::default();
        let tmr = StatusCode::TOO_MANY_REQUESTS;
        assert_eq!(
            policy.delay(0, tmr, &headers(Some("7")), 0.5),
            Some(Duration::from_secs(7))
        );
        assert_eq!(policy.delay(0, tmr, &headers(Some("3600")), 0.5), None);
        assert_eq!(policy.delay(0, StatusCode::OK, &headers(None), 0.5), None);
        assert_eq!(
            policy.delay(0, StatusCode::UNAUTHORIZED, &headers(Some("1")), 0.5),
            None
        );
        assert_eq!(
            policy.delay(4, tmr, &headers(None), 0.5),
            None,
            "max_retries"
        );
    }

    #[test]
    fn backoff_is_exponential_with_full_jitter_up_to_the_cap() {
        let policy = RetryPolicy::default();
        let tmr = StatusCode::TOO_MANY_REQUESTS;
        let none = headers(None);
        assert_eq!(
            policy.delay(0, tmr, &none, 0.999_999).unwrap().as_millis(),
            99
        );
        assert_eq!(
            policy.delay(2, tmr, &none, 0.5),
            Some(Duration::from_millis(200))
        );
        assert_eq!(policy.delay(3, tmr, &none, 0.0), Some(Duration::ZERO));
        let big = RetryPolicy {
            max_retries: 40,
            ..RetryPolicy::default()
        };
        assert_eq!(
            big.delay(30, tmr, &none, 1.0),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn http_dates_are_understood() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        let map = headers(Some("Sun, 06 Nov 1994 08:49:47 GMT"));
        assert_eq!(parse_retry_after(&map, now), Some(Duration::from_secs(10)));
        assert_eq!(parse_retry_after(&headers(Some("soon")), now), None);
    }

    #[test]
    fn the_budget_limits_retries_to_a_share_of_requests() {
        let budget = RetryBudget::new(0.5, 10, 1).unwrap();
        assert!(budget.withdraw(), "the floor allows one per second");
        assert!(!budget.withdraw());
        for _ in 0..4 {
            budget.deposit();
        }
        assert!(budget.withdraw() && budget.withdraw());
        assert!(!budget.withdraw());
    }
}
