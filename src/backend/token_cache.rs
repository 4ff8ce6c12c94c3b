//! A small local token cache in front of the exact Redis backend, for very hot keys (off
//! unless a policy asks for it with `token_cache = { batch, ttl }`): each call to Redis takes
//! the request's cost plus a `batch` of tokens, and the next requests for that key on this
//! node spend the batch without a round trip, until it is used up or `ttl` passes. When Redis
//! answers that the bucket holds less than one token, the node denies the key's requests
//! itself until the instant Redis named for the next token, so a client hammering past its
//! limit costs Redis one call per refill, not one per request.
//!
//! Error, stated: the cache never admits a token Redis did not grant, so it never admits
//! more than Redis would over the tokens' grant times. It moves admissions later by up to
//! `ttl`: in admission time a bucket (rate `r`, burst `b`) admits at most `b + r·(|I| + ttl)`
//! in an interval `I`, i.e. at most `r·ttl` more than the policy, and on no interval more
//! than that. Tokens still cached when their entry expires are lost (at most `batch` per key
//! per node per `ttl`): under-admission, never over-admission. A local denial is exact: it
//! lasts until Redis's own next-token instant measured from before the call (less 1 µs), and
//! nothing but refill adds tokens to a Redis bucket, so Redis would have denied it too (if
//! Redis loses the key early, by eviction or a flush, the node still denies until that
//! instant: at most one refill interval). Both are timed on the system clock. At most
//! 100,000 keys are cached; when full, entries without live tokens are forgotten (at most
//! once per ttl) and keys that find no room go to Redis one request at a time.
//! Token buckets and GCRA only.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;

use crate::backend::redis::{BackendError, RedisLimiter};
use crate::clock::{Clock, Nanos, SystemClock, duration_to_nanos};
use crate::decision::{Decision, Verdict};
use crate::policy::Algorithm;

/// The most keys the cache holds before it forgets expired entries.
const MAX_CACHED_KEYS: usize = 100_000;

#[derive(Debug, Default)]
struct Entry {
    tokens: AtomicU64,
    expires_ns: AtomicU64,
    /// Redis had no batch to spare: ask for single requests until then.
    no_batch_until_ns: AtomicU64,
    /// Redis said it holds less than one token until then: deny without asking.
    empty_until_ns: AtomicU64,
    /// When Redis said the bucket would be full again (for the denial's reset time).
    full_at_ns: AtomicU64,
}

impl Entry {
    /// Tell whether forgetting the entry at `now` would lose granted tokens (anything else it
    /// holds is a hint).
    fn holds_tokens(&self, now: Nanos) -> bool {
        self.expires_ns.load(Ordering::Acquire) > now && self.tokens.load(Ordering::Acquire) > 0
    }
}

/// A Redis limiter with a per-node cache of granted tokens per key.
#[derive(Debug)]
pub struct TokenCache {
    redis: RedisLimiter,
    batch: u64,
    ttl_ns: Nanos,
    clock: SystemClock,
    entries: DashMap<String, Arc<Entry>>,
    redis_calls: AtomicU64,
    local_denials: AtomicU64,
    /// When the last sweep of a full cache ran.
    last_sweep_ns: AtomicU64,
}

impl TokenCache {
    /// Cache up to `batch` tokens per key for at most `ttl`. The policy must be a token
    /// bucket or GCRA, and `batch` below its burst.
    pub fn new(redis: RedisLimiter, batch: u64, ttl: Duration) -> Result<Self, BackendError> {
        let policy = redis.policy();
        if !matches!(policy.algorithm(), Algorithm::TokenBucket | Algorithm::Gcra) {
            return Err(BackendError::TokenCache(format!(
                "a token cache needs a token bucket or GCRA, not {}",
                policy.algorithm().name()
            )));
        }
        if batch == 0 || batch >= policy.capacity() {
            return Err(BackendError::TokenCache(format!(
                "cache batch {batch} must be between 1 and the burst ({}) exclusive",
                policy.capacity()
            )));
        }
        if ttl.is_zero() {
            return Err(BackendError::TokenCache(
                "the ttl must be above zero".into(),
            ));
        }
        Ok(TokenCache {
            redis,
            batch,
            ttl_ns: duration_to_nanos(ttl),
            clock: SystemClock::new(),
            entries: DashMap::new(),
            redis_calls: AtomicU64::new(0),
            local_denials: AtomicU64::new(0),
            last_sweep_ns: AtomicU64::new(0),
        })
    }

    /// Return how many calls went to Redis.
    pub fn redis_calls(&self) -> u64 {
        self.redis_calls.load(Ordering::Relaxed)
    }

    /// Decide a request of `cost` tokens for `key`: from the cache when it holds enough,
    /// else through Redis (taking a batch for the next requests when Redis has it).
    ///
    /// The ttl and the local denials are timed on the system clock, which runs at the same
    /// speed as Redis's: never on an injected test clock.
    pub async fn check(&self, key: &str, cost: u64) -> Result<Decision, BackendError> {
        let now = self.clock.now_ns();
        let policy = *self.redis.policy();
        let (limit, interval_ns) = (policy.capacity(), policy.interval_ns());
        if cost > limit {
            return Ok(Decision::cannot_fit(limit));
        }
        if cost == 0 {
            // A peek takes nothing: Redis reports its state.
            return self.redis.check(key, 0).await;
        }
        let entry = self.entries.get(key).map(|e| Arc::clone(&e));
        if let Some(entry) = &entry {
            if entry.expires_ns.load(Ordering::Acquire) > now {
                let taken = entry
                    .tokens
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| t.checked_sub(cost));
                if let Ok(before) = taken {
                    return Ok(Decision::allowed(limit, before - cost, 0));
                }
            }
            let empty_until_ns = entry.empty_until_ns.load(Ordering::Acquire);
            if now < empty_until_ns {
                // Redis said it holds less than one token until then: it would deny too.
                self.local_denials.fetch_add(1, Ordering::Relaxed);
                let full_at_ns = entry.full_at_ns.load(Ordering::Acquire);
                return Ok(Decision::denied(
                    limit,
                    0,
                    full_at_ns.saturating_sub(now),
                    empty_until_ns - now + (cost - 1) * interval_ns,
                ));
            }
        }
        // A batch needs somewhere to keep it: a key without an entry takes one only while the
        // cache has room, else its extra tokens would be thrown away.
        let batch_allowed = match &entry {
            Some(e) => e.no_batch_until_ns.load(Ordering::Acquire) <= now,
            None => self.has_room(now),
        };
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
        if decision.verdict == Verdict::CannotFit {
            return Ok(decision);
        }
        // Redis held fewer than `want` tokens: `retry_after` is when it will hold `want`, so
        // it holds `want · interval − retry_after` nanoseconds' worth now (exact: Redis counts
        // whole microseconds and the interval is a whole number of them).
        let level_ns = (want * interval_ns).saturating_sub(decision.retry_after_ns);
        if level_ns < interval_ns {
            // Less than one token: no request can pass until one has refilled. `now` was
            // read before Redis's clock, so this ends no later than Redis's own answer would
            // change (less a microsecond for rounding).
            let empty_until_ns = (now + interval_ns - level_ns).saturating_sub(1_000);
            if let Some(entry) = self.entry(key, now) {
                entry.full_at_ns.store(
                    now.saturating_add(decision.reset_after_ns),
                    Ordering::Release,
                );
                entry
                    .empty_until_ns
                    .store(empty_until_ns, Ordering::Release);
            }
        }
        if want == cost {
            return Ok(decision);
        }
        let cost_ns = cost * interval_ns;
        if level_ns < cost_ns {
            // The request alone does not fit either: say so without a second call.
            return Ok(Decision::denied(
                limit,
                decision.remaining,
                decision.reset_after_ns,
                cost_ns - level_ns,
            ));
        }
        // Not enough for a batch but enough for the request: ask for it alone, and for single
        // requests only until a batch could fit again.
        if let Some(entry) = self.entry(key, now) {
            entry.no_batch_until_ns.store(
                now.saturating_add(decision.retry_after_ns),
                Ordering::Release,
            );
        }
        self.redis_calls.fetch_add(1, Ordering::Relaxed);
        self.redis.check(key, cost).await
    }

    /// Return how many requests the cache denied without asking Redis (Redis had said it
    /// held less than one token until a refill).
    pub fn local_denials(&self) -> u64 {
        self.local_denials.load(Ordering::Relaxed)
    }

    /// Find or make `key`'s entry; `None` when the cache is full of live entries (then the
    /// request simply goes to Redis).
    fn entry(&self, key: &str, now: Nanos) -> Option<Arc<Entry>> {
        if let Some(entry) = self.entries.get(key) {
            return Some(Arc::clone(&entry));
        }
        if !self.has_room(now) {
            return None;
        }
        Some(Arc::clone(
            &self.entries.entry(key.to_string()).or_default(),
        ))
    }

    /// Tell whether a new key fits; when the cache is full, forget the entries that hold no
    /// live tokens (denial hints are only hints: Redis denies those requests anyway), at most
    /// once per ttl so that a full cache stays cheap.
    fn has_room(&self, now: Nanos) -> bool {
        if self.entries.len() < MAX_CACHED_KEYS {
            return true;
        }
        let last = self.last_sweep_ns.load(Ordering::Acquire);
        if now >= last.saturating_add(self.ttl_ns)
            && self
                .last_sweep_ns
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.entries.retain(|_, e| e.holds_tokens(now));
        }
        self.entries.len() < MAX_CACHED_KEYS
    }

    /// Put `tokens` granted at `now` in `key`'s entry.
    fn keep(&self, key: &str, tokens: u64, now: Nanos) {
        let Some(entry) = self.entry(key, now) else {
            // The cache is full: the tokens are lost (under-admission, never over).
            return;
        };
        if entry.expires_ns.load(Ordering::Acquire) <= now {
            // Expired tokens are dropped (under-admission, never over).
            entry.tokens.store(tokens, Ordering::Release);
        } else {
            entry.tokens.fetch_add(tokens, Ordering::AcqRel);
        }
        entry.expires_ns.store(now + self.ttl_ns, Ordering::Release);
    }
}
