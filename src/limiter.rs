//! The `Limiter`: where a request is decided. One or more policies over one key space,
//! checked together ("layered"), with one clock read per decision.
//!
//! A request is admitted only if every policy admits it. Policies are charged in order; when
//! one denies, the charges already taken from the earlier ones are given back, so a denied
//! request leaves no charge anywhere. A shaping leaky bucket (at most one per limiter) is
//! always checked last, so its reserved slot never needs to be given back.
//!
//! Keys are taken borrowed, as `HashMap::get` takes them (see [`ToKey`]): a
//! `Limiter<String>` (or `Limiter<Arc<str>>`) is checked with a `&str`. A cost of 0 is a
//! peek: it reports the key's state, admitted or denied as a request of one token would be
//! now, and takes nothing.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
#[cfg(feature = "tokio")]
use std::time::Duration;

use crate::clock::{Clock, Nanos, SystemClock};
#[cfg(feature = "tokio")]
use crate::clock::{duration_to_nanos, wait_until};
use crate::decision::Decision;
#[cfg(feature = "tokio")]
use crate::decision::Verdict;
use crate::local::{Charge, DEFAULT_MAX_KEYS, DefaultHasher, Store, StoreStats, ToKey};
use crate::policy::{Algorithm, Policy};

/// The most policies one limiter layers.
pub const MAX_POLICIES: usize = 64;

/// Why a limiter could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimiterError {
    /// A limiter needs at least one policy.
    #[error("a limiter needs at least one policy")]
    NoPolicy,
    /// More than `MAX_POLICIES` policies.
    #[error("{count} policies given; a limiter layers at most {MAX_POLICIES}")]
    TooManyPolicies {
        /// How many were given.
        count: usize,
    },
    /// `max_keys(0)`: a store of no keys would put every key on its shared overflow cell.
    #[error("max_keys must be at least 1 (0 would make every key share one limit)")]
    ZeroMaxKeys,
    /// Two shaping leaky buckets: only one can decide when a request is released.
    #[error("policies {first} and {second} are both shaping leaky buckets; a limiter takes one")]
    TwoShapers {
        /// Index of the first.
        first: usize,
        /// Index of the second.
        second: usize,
    },
}

/// Why `until_ready` gave up. Nothing was charged.
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// The cost exceeds a policy's capacity; no wait can help.
    #[error("the cost can never fit policy {}", .0.policy_index)]
    CannotFit(Decision),
    /// The request could not be admitted within the maximum wait; the decision says when
    /// it could be (`retry_after_ns`, from the moment of giving up).
    #[error("not admitted within the maximum wait; retry after {} ns", .0.retry_after_ns)]
    WaitTooLong(Decision),
    /// The request had to wait, and there is no timer to wait on: the limiter's clock follows
    /// real time and the future is not polled inside a tokio runtime with timers enabled
    /// (`Builder::enable_time`, or `enable_all`). A clock that wakes its own waiters
    /// ([`ManualClock`](crate::ManualClock)) needs no timer.
    #[error(
        "until_ready has to wait but there is no timer: poll it inside a tokio runtime with timers enabled"
    )]
    NoTimer,
}

/// Build a [`Limiter`].
#[derive(Debug, Clone)]
pub struct LimiterBuilder<C = SystemClock, S = DefaultHasher> {
    policies: Vec<Policy>,
    max_keys: usize,
    clock: C,
    hasher: S,
}

impl LimiterBuilder<SystemClock, DefaultHasher> {
    fn new() -> Self {
        LimiterBuilder {
            policies: Vec::new(),
            max_keys: DEFAULT_MAX_KEYS,
            clock: SystemClock::new(),
            hasher: DefaultHasher::new(),
        }
    }
}

impl<C: Clock, S: BuildHasher + Clone> LimiterBuilder<C, S> {
    /// Add a policy; a request must satisfy all of them.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }

    /// Hold at most `max_keys` keys per policy (see [`Store`] for the rule at the cap); 0 is
    /// refused by [`LimiterBuilder::build`].
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// Read time from `clock` instead of the system clock.
    pub fn clock<C2: Clock>(self, clock: C2) -> LimiterBuilder<C2, S> {
        LimiterBuilder {
            policies: self.policies,
            max_keys: self.max_keys,
            clock,
            hasher: self.hasher,
        }
    }

    /// Hash keys with `hasher` (keys come from clients: keep it keyed and seeded).
    pub fn hasher<S2: BuildHasher + Clone>(self, hasher: S2) -> LimiterBuilder<C, S2> {
        LimiterBuilder {
            policies: self.policies,
            max_keys: self.max_keys,
            clock: self.clock,
            hasher,
        }
    }

    /// Build the limiter.
    pub fn build<K: Hash + Eq + Send + Sync>(self) -> Result<Limiter<K, C, S>, LimiterError> {
        let count = self.policies.len();
        if count == 0 {
            return Err(LimiterError::NoPolicy);
        }
        if count > MAX_POLICIES {
            return Err(LimiterError::TooManyPolicies { count });
        }
        if self.max_keys == 0 {
            return Err(LimiterError::ZeroMaxKeys);
        }
        let is_shaper = |p: &Policy| matches!(p.algorithm(), Algorithm::LeakyBucketShape { .. });
        let shapers: Vec<usize> = (0..count)
            .filter(|&i| is_shaper(&self.policies[i]))
            .collect();
        if let [first, second, ..] = shapers[..] {
            return Err(LimiterError::TwoShapers { first, second });
        }
        // Evaluation order: the shaper last; `index` keeps the caller's numbering.
        let mut order: Vec<usize> = (0..count).collect();
        order.sort_by_key(|&i| is_shaper(&self.policies[i]));
        let layers = order
            .into_iter()
            .map(|index| Layer {
                index: index as u32,
                store: Store::with_hasher(self.policies[index], self.max_keys, self.hasher.clone()),
            })
            .collect();
        Ok(Limiter {
            layers,
            clock: self.clock,
        })
    }
}

#[derive(Debug)]
struct Layer<K: Send + Sync, S> {
    /// The policy's position in the builder (at most `MAX_POLICIES`).
    index: u32,
    store: Store<K, S>,
}

/// Decide requests for keys of type `K` against one or more layered policies.
///
/// `Limiter` is `Sync`: share it behind an `Arc` and call it from any thread (keys are
/// `Send + Sync`: threads keep shortcuts to hot keys).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use ratemesh::{Limiter, ManualClock, Policy, Verdict};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // A clock the test moves; `SystemClock` (the default) follows real time.
/// let clock = ManualClock::new(0);
/// let limiter = Limiter::builder()
///     .policy(Policy::gcra(2, Duration::from_secs(1), 2)?) // 2/s, bursts of 2
///     .max_keys(100_000)
///     .clock(clock.clone())
///     .build::<Arc<str>>()?;
///
/// // Requests can cost more than one token; keys are looked up by their borrowed form.
/// assert!(limiter.check("tenant-7", 2).is_allowed());
/// let denied = limiter.check("tenant-7", 1);
/// assert_eq!(denied.verdict, Verdict::Denied);
/// assert_eq!(denied.retry_after_ns, 500_000_000); // one token every 500 ms
///
/// clock.advance(Duration::from_millis(500));
/// assert!(limiter.check("tenant-7", 1).is_allowed());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Limiter<K: Send + Sync, C = SystemClock, S = DefaultHasher> {
    layers: Box<[Layer<K, S>]>,
    clock: C,
}

impl Limiter<(), SystemClock, DefaultHasher> {
    /// Start building a limiter (system clock, ahash, one million keys per policy).
    pub fn builder() -> LimiterBuilder<SystemClock, DefaultHasher> {
        LimiterBuilder::new()
    }
}

impl<K: Hash + Eq + Send + Sync, C: Clock, S: BuildHasher + Clone> Limiter<K, C, S> {
    /// Return the clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Return the policies in the order they were given.
    pub fn policies(&self) -> Vec<Policy> {
        let mut policies: Vec<(u32, Policy)> = self
            .layers
            .iter()
            .map(|l| (l.index, *l.store.policy()))
            .collect();
        policies.sort_by_key(|&(i, _)| i);
        policies.into_iter().map(|(_, p)| p).collect()
    }

    /// Return each policy's store counters, in the order the policies were given.
    pub fn stats(&self) -> Vec<StoreStats> {
        let mut stats: Vec<(u32, StoreStats)> = self
            .layers
            .iter()
            .map(|l| (l.index, l.store.stats()))
            .collect();
        stats.sort_by_key(|&(i, _)| i);
        stats.into_iter().map(|(_, s)| s).collect()
    }

    /// Decide a request of `cost` tokens for `key` now.
    ///
    /// `key` is any borrowed form of `K` that [`ToKey`] turns into a `K` (a `&str` for
    /// `String`, `Box<str>`, `Arc<str>` or `&str` keys; `&K` for any `K: Clone`). Only a key
    /// never seen before is turned into a `K`; a known key costs no allocation.
    ///
    /// A cost of 0 is a peek: it takes nothing and reports the key's state now. It is
    /// `Allowed` when a request of one token would be (with `remaining` the tokens left, and
    /// for a shaping bucket the `delay_ns` that request would wait), and `Denied` with
    /// `retry_after_ns` when the key is exhausted, under every algorithm. A peek at a key
    /// never seen reports a fresh key and stores nothing.
    #[inline]
    pub fn check<'a, Q>(&self, key: &'a Q, cost: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToKey<'a, K> + ?Sized,
    {
        self.decide(key, cost, self.clock.now_ns(), true)
    }

    /// Decide a request of `cost` tokens for `key` at `now` (nanoseconds on this limiter's
    /// clock), for callers that already read the clock.
    #[inline]
    pub fn check_at<'a, Q>(&self, key: &'a Q, cost: u64, now: Nanos) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToKey<'a, K> + ?Sized,
    {
        self.decide(key, cost, now, true)
    }

    /// Report every policy's state for `key` without charging, in the order the policies
    /// were given: each policy's peek, as `check(key, 0)` reports the tightest
    /// (allocates: for status pages and tests, not the request path).
    pub fn peek_each<'a, Q>(&self, key: &'a Q) -> Vec<Decision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToKey<'a, K> + ?Sized,
    {
        let now = self.clock.now_ns();
        let mut decisions: Vec<Decision> = self
            .layers
            .iter()
            .map(|layer| {
                let mut decision = layer.store.decide(key, now, 0);
                decision.policy_index = layer.index;
                decision
            })
            .collect();
        decisions.sort_by_key(|d| d.policy_index);
        decisions
    }

    /// Wait until a request of `cost` tokens for `key` is admitted, at most `max_wait` on the
    /// limiter's clock.
    ///
    /// The future holds no tokens while it waits: it checks, waits until the earliest
    /// instant a retry can succeed, and checks again. Dropping it (a timeout, a client that
    /// went away) therefore leaves no charge. Waiters are not served in FIFO order.
    ///
    /// It waits on the limiter's clock ([`Clock::wake_at`]): a [`ManualClock`](crate::ManualClock)
    /// wakes it when another task advances the clock far enough; a clock that follows real
    /// time sleeps on tokio's timer, and without a tokio runtime with timers it returns
    /// [`WaitError::NoTimer`] (only when it has to wait; an admission needs no timer).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratemesh::{Limiter, Policy, TokioClock, WaitError};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // tokio's clock: a paused test runtime (`start_paused`) moves it without sleeping.
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::token_bucket(10, Duration::from_secs(1), 1)?)
    ///     .clock(TokioClock::new())
    ///     .build::<String>()?;
    /// assert!(limiter.check("batch-job", 1).is_allowed());
    ///
    /// // The next token comes in 100 ms: wait for it, at most one second.
    /// let decision = limiter.until_ready("batch-job", 1, Duration::from_secs(1)).await?;
    /// assert!(decision.is_allowed());
    ///
    /// // Five tokens never fit a bucket of one: no wait can help.
    /// let error = limiter.until_ready("batch-job", 5, Duration::from_secs(1)).await;
    /// assert!(matches!(error, Err(WaitError::CannotFit(_))));
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn until_ready<'a, Q>(
        &self,
        key: &'a Q,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToKey<'a, K> + ?Sized,
    {
        let start = self.clock.now_ns();
        let deadline = start.saturating_add(duration_to_nanos(max_wait));
        let mut now = start;
        loop {
            let decision = self.decide(key, cost, now, false);
            match decision.verdict {
                Verdict::Allowed => return Ok(decision),
                Verdict::CannotFit => return Err(WaitError::CannotFit(decision)),
                Verdict::Denied => {
                    let retry_at = now.saturating_add(decision.retry_after_ns);
                    if retry_at > deadline {
                        return Err(WaitError::WaitTooLong(decision));
                    }
                    wait_until(&self.clock, retry_at)
                        .await
                        .map_err(|_| WaitError::NoTimer)?;
                    now = self.clock.now_ns();
                }
            }
        }
    }

    /// Remove idle keys from every policy's store; return how many were removed.
    pub fn evict_idle(&self) -> usize {
        let now = self.clock.now_ns();
        self.layers.iter().map(|l| l.store.evict_idle(now)).sum()
    }

    #[inline]
    fn decide<'a, Q>(&self, key: &'a Q, cost: u64, now: Nanos, reserve: bool) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToKey<'a, K> + ?Sized,
    {
        if let [only] = &self.layers[..] {
            let mut decision = only
                .store
                .decide_charge(key, now, cost, reserve, &mut Charge::Key);
            decision.policy_index = only.index;
            return decision;
        }
        self.decide_layered(key, cost, now, reserve)
    }

    /// Decide against two or more layers, giving back earlier charges on a denial.
    #[inline(never)]
    fn decide_layered<'a, Q>(&self, key: &'a Q, cost: u64, now: Nanos, reserve: bool) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToKey<'a, K> + ?Sized,
    {
        decide_in_layers(
            self.layers.len(),
            |i, charge| {
                let layer = &self.layers[i];
                let mut decision = layer.store.decide_charge(key, now, cost, reserve, charge);
                decision.policy_index = layer.index;
                decision
            },
            |i, charge| self.layers[i].store.refund(key, charge, now, cost),
        )
    }
}

/// What the layers of one decision took, so that a denial (by a later layer, or a remote
/// one) can give it back: how many layers charged, and which of them charged their store's
/// overflow cell instead of the key's own. Nothing allocated: one bit per layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Charges {
    count: usize,
    /// Bit i set: layer i charged the overflow cell.
    overflow: u64,
}

impl Charges {
    /// Note that layer `layer`, the one after those noted so far, took `charge` (for
    /// `rules`, whose remote layers may deny after the local ones admitted).
    #[cfg(feature = "http")]
    #[inline]
    pub(crate) fn note(&mut self, layer: usize, charge: Charge) {
        if charge == Charge::Overflow {
            self.overflow |= 1 << layer;
        }
        self.count = layer + 1;
    }

    /// What layer `layer` (one noted) took.
    #[cfg(feature = "http")]
    pub(crate) fn charge_of(&self, layer: usize) -> Charge {
        if self.overflow & (1 << layer) != 0 {
            Charge::Overflow
        } else {
            Charge::Key
        }
    }

    /// Give back every charge with `refund(layer, charge)`, latest first: the one way earlier
    /// layers are refunded.
    #[inline(always)]
    pub(crate) fn refund(self, refund: &mut impl FnMut(usize, Charge)) {
        for layer in (0..self.count).rev() {
            let charge = if self.overflow & (1 << layer) != 0 {
                Charge::Overflow
            } else {
                Charge::Key
            };
            refund(layer, charge);
        }
    }
}

/// Decide `count` layers in order with `decide(i, &mut charge)`; when layer `i` denies, give
/// back what layers `0..i` took with `refund(j, charge)` ([`Charges::refund`]) and return the
/// denial. Otherwise return the tightest admission (fewest tokens left, then the latest
/// reset), with the longest shaping delay of all. `count` is at most [`MAX_POLICIES`].
pub(crate) fn decide_in_layers(
    count: usize,
    mut decide: impl FnMut(usize, &mut Charge) -> Decision,
    mut refund: impl FnMut(usize, Charge),
) -> Decision {
    debug_assert!(count <= MAX_POLICIES);
    // The neutral element: every real decision is at least as tight.
    let mut result = Decision::allowed(u64::MAX, u64::MAX, 0);
    // Bit i set: layer i charged the overflow cell instead of the key's own.
    let mut overflow = 0;
    for i in 0..count.min(MAX_POLICIES) {
        let mut charge = Charge::Key;
        let decision = decide(i, &mut charge);
        if !decision.is_allowed() {
            Charges { count: i, overflow }.refund(&mut refund);
            return decision;
        }
        if charge == Charge::Overflow {
            overflow |= 1 << i;
        }
        let delay_ns = result.delay_ns.max(decision.delay_ns);
        if !result.is_tighter_than(&decision) {
            result = decision;
        }
        result.delay_ns = delay_ns;
    }
    result
}
