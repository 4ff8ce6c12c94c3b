//! A small local token cache in front of the exact Redis backend, for very hot keys (off
//! unless you build one): each call to Redis takes the request's cost plus a `batch` of
//! tokens, and the next requests for that key on this node spend the batch without a round
//! trip, until it is used up or `ttl` passes.
//!
//! Error, stated: the cache never admits a token Redis did not grant, so it never admits
//! more than Redis would over the tokens' grant times. It moves admissions later by up to
//! `ttl`: in admission time a bucket (rate `r`, burst `b`) admits at most `b + r·(|I| + ttl)`
//! in an interval `I`, i.e. at most `r·ttl` more than the policy, and on no interval more
//! than that. Tokens still cached when their entry expires are lost (at most `batch` per key
//! per node per `ttl`): under-admission, never over-admission. Token buckets and GCRA only.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;

use crate::backend::redis::{BackendError, RedisLimiter};
use crate::clock::{Clock, Nanos, SystemClock, duration_to_nanos};
use crate::decision::Decision;
use crate::policy::Algorithm;

/// The most keys the cache holds before it forgets expired entries.
const MAX_CACHED_KEYS: usize = 100_000;

#[derive(Debug, Default)]
struct Entry {
    tokens: AtomicU64,
    expires_ns: AtomicU64,
    /// Redis had no batch to spare: ask for single requests until then.
    no_batch_until_ns: AtomicU64,
}

/// A Redis limiter with a per-node cache of granted tokens per key.
pub struct TokenCache {
    redis: RedisLimiter,
    batch: u64,
    ttl_ns: Nanos,
    clock: SystemClock,
    entries: DashMap<String, Arc<Entry>>,
    redis_calls: AtomicU64,
}

impl TokenCache {
    /// Cache up to `batch` tokens per key for at most `ttl`. The policy must be a token
    /// bucket or GCRA, and `batch` below its burst.
    pub fn new(redis: RedisLimiter, batch: u64, ttl: Duration) -> Result<Self, BackendError> {
        let policy = redis.policy();
        if !matches!(policy.algorithm(), Algorithm::TokenBucket | Algorithm::Gcra) {
            return Err(BackendError::Reply(format!(
                "a token cache needs a token bucket or GCRA, not {}",
                policy.algorithm().name()
            )));
        }
        if batch == 0 || batch >= policy.capacity() {
            return Err(BackendError::Reply(format!(
                "cache batch {batch} must be between 1 and the burst ({}) exclusive",
                policy.capacity()
            )));
        }
        Ok(TokenCache {
            redis,
            batch,
            ttl_ns: duration_to_nanos(ttl),
            clock: SystemClock::new(),
            entries: DashMap::new(),
            redis_calls: AtomicU64::new(0),
        })
    }

    /// Return how many calls went to Redis.
    pub fn redis_calls(&self) -> u64 {
        self.redis_calls.load(Ordering::Relaxed)
    }

    /// Decide a request of `cost` tokens for `key`: from the cache when it holds enough,
    /// else through Redis (taking a batch for the next requests when Redis has it).
    pub async fn check(&self, key: &str, cost: u64) -> Result<Decision, BackendError> {
        let now = self.clock.now_ns();
        let limit = self.redis.policy().capacity();
        let entry = self.entries.get(key).map(|e| Arc::clone(&e));
        if let Some(entry) = &entry
            && entry.expires_ns.load(Ordering::Acquire) > now
        {
            let taken = entry
                .tokens
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| t.checked_sub(cost));
            if let Ok(before) = taken {
                return Ok(Decision::allowed(limit, before - cost, 0));
            }
        }
        let batch_allowed = entry
            .as_ref()
            .is_none_or(|e| e.no_batch_until_ns.load(Ordering::Acquire) <= now);
        let want = if batch_allowed {
            (cost + self.batch).min(limit)
        } else {
            cost
        };
        self.redis_calls.fetch_add(1, Ordering::Relaxed);
        let decision = self.redis.check(key, want).await?;
        if decision.is_allowed() {
            let extra = want - cost;
            if extra > 0 {
                self.keep(key, extra, now);
            }
            return Ok(Decision {
                remaining: decision.remaining + extra,
                ..decision
            });
        }
        if want == cost {
            return Ok(decision);
        }
        // Not enough for a batch: ask for the request alone, and for single requests only
        // until a batch could fit again.
        let entry = Arc::clone(&self.entries.entry(key.to_string()).or_default());
        entry
            .no_batch_until_ns
            .store(now + decision.retry_after_ns, Ordering::Release);
        self.redis_calls.fetch_add(1, Ordering::Relaxed);
        self.redis.check(key, cost).await
    }

    /// Put `tokens` granted at `now` in `key`'s entry.
    fn keep(&self, key: &str, tokens: u64, now: Nanos) {
        if self.entries.len() >= MAX_CACHED_KEYS {
            self.entries
                .retain(|_, e| e.expires_ns.load(Ordering::Acquire) > now);
        }
        let entry = Arc::clone(&self.entries.entry(key.to_string()).or_default());
        if entry.expires_ns.load(Ordering::Acquire) <= now {
            // Expired tokens are dropped (under-admission, never over).
            entry.tokens.store(tokens, Ordering::Release);
        } else {
            entry.tokens.fetch_add(tokens, Ordering::AcqRel);
        }
        entry.expires_ns.store(now + self.ttl_ns, Ordering::Release);
    }
}
