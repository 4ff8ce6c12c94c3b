//! Exact limits in Redis: one atomic Lua script per decision (`EVALSHA`, reloaded
//! transparently after `SCRIPT FLUSH`), a timeout on every call, and a fail mode per policy.
//!
//! Scripts read time from Redis `TIME` (microseconds), never from the gateway, so gateway
//! clocks cannot skew the limit. Keys are `rl:{<identity>}:<env>:<policy>[:<route>]`: the
//! braces are a Redis Cluster hash tag, so every key of one client's decisions lives in one
//! slot (no CROSSSLOT), and the identity inside them is already a keyed hash (no secret).
//!
//! [`ExactLimiter`] is one policy with its fail mode, for callers without a policy file; a
//! policy file's `redis` policies on one deployment are
//! [`RedisLimits`](crate::backend::redis_limits::RedisLimits).

use std::time::Duration;

use ::redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind, Value};

use crate::backend::exact::fail_over;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::policy::{Algorithm, Policy};

mod connection;

pub use connection::{LazyCluster, RedisConnection, SentinelPrimary};

const PRELUDE: &str = include_str!("lua/prelude.lua");

/// The script that gives back what a decision took, for every algorithm.
const REFUND: &str = include_str!("lua/refund.lua");

/// Why the Redis backend could not decide.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The policy has no exact Redis script (the leaky buckets).
    #[error(
        "algorithm `{0}` has no Redis script; use token-bucket, gcra, fixed-window, sliding-window or sliding-log"
    )]
    Unsupported(&'static str),
    /// The policy's interval or window is not a whole number of microseconds (Redis time).
    #[error("the policy's interval of {0} ns is not a whole number of microseconds")]
    NotWholeMicroseconds(Nanos),
    /// Connections must be made inside a tokio runtime.
    #[error("the Redis connection must be created inside a tokio runtime")]
    NoRuntime,
    /// Redis failed, timed out, or is unreachable.
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    /// A token cache was asked for with settings it cannot honour.
    #[error("token cache: {0}")]
    TokenCache(String),
    /// Redis answered something that is not a decision.
    #[error("unexpected reply from the script: {0}")]
    Reply(String),
    /// A decision named a `redis` policy number that the file does not have.
    #[error("no redis policy number {0}")]
    UnknownPolicy(u32),
}

/// How long a call may take before it counts as a failure.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

fn script_for(algorithm: Algorithm) -> Result<(&'static str, &'static str), BackendError> {
    Ok(match algorithm {
        Algorithm::TokenBucket => ("token_bucket", include_str!("lua/token_bucket.lua")),
        Algorithm::Gcra => ("gcra", include_str!("lua/gcra.lua")),
        Algorithm::FixedWindow => ("fixed_window", include_str!("lua/fixed_window.lua")),
        Algorithm::SlidingWindow => ("sliding_window", include_str!("lua/sliding_window.lua")),
        Algorithm::SlidingLog => ("sliding_log", include_str!("lua/sliding_log.lua")),
        other => return Err(BackendError::Unsupported(other.name())),
    })
}

/// The exact limiter for one policy, talking to one Redis (or Redis Cluster) deployment.
///
/// ```no_run
/// use std::time::Duration;
/// use ratemesh::Policy;
/// use ratemesh::backend::redis::{RedisConnection, RedisLimiter, redis_key};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Connects on first use; a call slower than 50 ms counts as a failure.
/// let redis = RedisConnection::single("redis://127.0.0.1:6379", Duration::from_millis(50))?;
/// let payouts = RedisLimiter::new(redis, Policy::sliding_window(10, Duration::from_secs(3600))?)?;
/// let key = redis_key("prod", "payouts", "acct-9", None);
/// let decision = payouts.check(&key, 1).await?;
/// println!("allowed: {}, {} left this hour", decision.is_allowed(), decision.remaining);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisLimiter {
    connection: RedisConnection,
    policy: Policy,
    script: Script,
    /// Gives back what a decision took ([`RedisLimiter::refund`]).
    refund: Script,
    /// The script's name in the refund script (`token_bucket`, `fixed_window`, …).
    algorithm: &'static str,
    /// The policy's rate interval or window, in microseconds.
    unit_us: u64,
    /// A lockout once the policy denies a key (`block_for`), in microseconds; 0: none.
    block_us: u64,
}

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("policy", &self.policy)
            .field("script_sha", &self.script.get_hash())
            .finish_non_exhaustive()
    }
}

/// Build the key of one decision: `rl:{identity}:env:policy[:route]`.
pub fn redis_key(env: &str, policy: &str, identity: &str, route: Option<&str>) -> String {
    match route {
        Some(route) => format!("rl:{{{identity}}}:{env}:{policy}:{route}"),
        None => format!("rl:{{{identity}}}:{env}:{policy}"),
    }
}

impl RedisLimiter {
    /// Prepare the script of `policy` on `connection`.
    pub fn new(connection: RedisConnection, policy: Policy) -> Result<Self, BackendError> {
        let (algorithm, body) = script_for(policy.algorithm())?;
        let unit_ns = if policy.algorithm().is_rate_based() {
            policy.interval_ns()
        } else {
            policy.window_ns()
        };
        if unit_ns % 1000 != 0 {
            return Err(BackendError::NotWholeMicroseconds(unit_ns));
        }
        let source = format!("{PRELUDE}\n{body}");
        Ok(RedisLimiter {
            connection,
            policy,
            script: Script::new(&source),
            refund: Script::new(&format!("{PRELUDE}\n{REFUND}")),
            algorithm,
            unit_us: unit_ns / 1000,
            block_us: 0,
        })
    }

    /// The same script, lockout and connection with `policy` (another limit or rate of the
    /// same algorithm: an override of one key).
    pub(crate) fn with_policy(&self, policy: Policy) -> RedisLimiter {
        let unit_ns = if policy.algorithm().is_rate_based() {
            policy.interval_ns() / 1000 * 1000
        } else {
            policy.window_ns()
        };
        let mut limiter = self.clone();
        limiter.policy = policy;
        limiter.unit_us = (unit_ns / 1000).max(1);
        limiter
    }

    /// Lock a key out for `block` once the policy denies it (`block_for`): its requests
    /// are then denied, uncounted, until the lockout ends, kept in Redis beside the key's
    /// counters (`…:lock`), so every gateway sees it and it survives their restarts.
    pub fn with_block_for(mut self, block: Duration) -> Self {
        self.block_us = u64::try_from(block.as_micros()).unwrap_or(u64::MAX);
        self
    }

    /// Return the policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Return the SHA1 under which Redis caches this policy's script (for `EVALSHA`).
    pub fn script_sha(&self) -> &str {
        self.script.get_hash()
    }

    /// Return the script's arguments after the instant: `interval or window (µs), capacity`.
    pub fn script_params(&self) -> (u64, u64) {
        (self.unit_us, self.policy.capacity())
    }

    /// Decide a request of `cost` tokens for `key` with Redis's clock.
    pub async fn check(&self, key: &str, cost: u64) -> Result<Decision, BackendError> {
        self.check_at(key, cost, None).await
    }

    /// Decide at an explicit instant (microseconds) instead of Redis `TIME`: for tests that
    /// compare the scripts with the local engine on one clock.
    pub async fn check_at(
        &self,
        key: &str,
        cost: u64,
        now_us: Option<u64>,
    ) -> Result<Decision, BackendError> {
        let reply = match self.query(self.evalsha(key, cost, now_us)).await {
            Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // The server lost its script cache (`SCRIPT FLUSH`, a restart, a failover):
                // load the script again and retry once.
                self.load_script().await?;
                self.query(self.evalsha(key, cost, now_us)).await?
            }
            reply => reply?,
        };
        decision_from_reply(&reply)
    }

    /// Give back `cost` tokens that a decision of this policy took for `key` at most
    /// `within_us` microseconds ago (another policy denied the request, or its response
    /// does not count). Return whether they went back: a window's charge is kept when its
    /// window is over, or when `within_us` reaches into the window before (the charge
    /// cannot be told apart from one of that window), so a refund never admits more than
    /// the policy would have without the charge.
    pub async fn refund(&self, key: &str, cost: u64, within_us: u64) -> Result<bool, BackendError> {
        self.refund_at(key, cost, within_us, None).await
    }

    /// [`RedisLimiter::refund`] at an explicit instant (microseconds) instead of Redis
    /// `TIME`, for tests.
    pub async fn refund_at(
        &self,
        key: &str,
        cost: u64,
        within_us: u64,
        now_us: Option<u64>,
    ) -> Result<bool, BackendError> {
        let command = || {
            let mut command = Cmd::with_capacity(10, 96 + key.len());
            command
                .arg("EVALSHA")
                .arg(self.refund.get_hash())
                .arg(1)
                .arg(key);
            match now_us {
                Some(now_us) => command.arg(now_us),
                None => command.arg(""),
            };
            command
                .arg(self.unit_us)
                .arg(self.policy.capacity())
                .arg(cost)
                .arg(within_us)
                .arg(self.algorithm);
            command
        };
        let reply = match self.query(command()).await {
            Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.connection.load_script(&self.refund).await?;
                self.query(command()).await?
            }
            reply => reply?,
        };
        match reply {
            Value::Int(0) => Ok(false),
            Value::Int(1) => Ok(true),
            other => Err(BackendError::Reply(format!("{other:?}"))),
        }
    }

    /// Forget what Redis counts for `key` (its count or bucket, a sliding log's sequence, a
    /// lockout): a reset, after which the key has its whole limit. Return whether anything
    /// was kept.
    pub async fn reset(&self, key: &str) -> Result<bool, BackendError> {
        let mut command = Cmd::with_capacity(4, 16 + 3 * key.len());
        command
            .arg("DEL")
            .arg(key)
            .arg([key.as_bytes(), b":seq"].concat())
            .arg([key.as_bytes(), b":lock"].concat());
        match self.query(command).await? {
            Value::Int(n) => Ok(n > 0),
            other => Err(BackendError::Reply(format!("{other:?}"))),
        }
    }

    /// Build `EVALSHA sha numkeys key [key:seq] [key:lock] now interval capacity cost
    /// [block]` in one buffer (the request path's only allocations: the command's two
    /// vectors).
    fn evalsha(&self, key: &str, cost: u64, now_us: Option<u64>) -> Cmd {
        let sliding_log = self.policy.algorithm() == Algorithm::SlidingLog;
        let locks = self.block_us > 0;
        let mut command = Cmd::with_capacity(11, 128 + 3 * key.len());
        command.arg("EVALSHA").arg(self.script.get_hash());
        command.arg(1 + usize::from(sliding_log) + usize::from(locks));
        command.arg(key);
        if sliding_log {
            command.arg([key.as_bytes(), b":seq"].concat());
        }
        if locks {
            command.arg([key.as_bytes(), b":lock"].concat());
        }
        match now_us {
            Some(now_us) => command.arg(now_us),
            None => command.arg(""),
        };
        command
            .arg(self.unit_us)
            .arg(self.policy.capacity())
            .arg(cost);
        if locks {
            command.arg(self.block_us);
        }
        command
    }

    async fn query(&self, command: Cmd) -> Result<Value, RedisError> {
        self.connection.query(command).await
    }

    async fn load_script(&self) -> Result<(), RedisError> {
        self.connection.load_script(&self.script).await
    }
}

/// Turn the script's `{verdict, limit, remaining, reset_us, retry_us}` into a `Decision`,
/// refusing anything else.
fn decision_from_reply(reply: &Value) -> Result<Decision, BackendError> {
    let unexpected = || BackendError::Reply(format!("{reply:?}"));
    let Value::Array(items) = reply else {
        return Err(unexpected());
    };
    let [verdict, limit, remaining, reset_us, retry_us] = &items[..] else {
        return Err(unexpected());
    };
    let non_negative = |v: &Value| match v {
        Value::Int(v) => u64::try_from(*v).map_err(|_| unexpected()),
        _ => Err(unexpected()),
    };
    // A key may hold more than its limit allows (the limit was lowered, an override of a
    // higher one removed): the scripts then say how far over as a negative `remaining`,
    // which is none left.
    let at_least_zero = |v: &Value| match v {
        Value::Int(v) => Ok(u64::try_from(*v).unwrap_or(0)),
        _ => Err(unexpected()),
    };
    let (limit, remaining) = (non_negative(limit)?, at_least_zero(remaining)?);
    let reset_after_ns = at_least_zero(reset_us)?.saturating_mul(1000);
    let retry_after_ns = at_least_zero(retry_us)?.saturating_mul(1000);
    Ok(match non_negative(verdict)? {
        0 => Decision::allowed(limit, remaining, reset_after_ns),
        1 => Decision::denied(limit, remaining, reset_after_ns, retry_after_ns),
        2 => Decision::cannot_fit(limit),
        _ => return Err(unexpected()),
    })
}

pub use crate::backend::exact::ExactDecision;
pub use crate::config::FailMode;

/// An exact policy with its fail mode and its local fallback (fail-open decides there).
///
/// ```
/// use std::time::Duration;
/// use ratemesh::backend::redis::{ExactDecision, ExactLimiter, FailMode, RedisConnection, RedisLimiter};
/// use ratemesh::{Limiter, Policy};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let policy = Policy::token_bucket(5, Duration::from_secs(60), 5)?;
/// // Nothing listens on port 1: every call to Redis fails.
/// let down = || RedisConnection::single("redis://127.0.0.1:1", Duration::from_millis(100));
/// let fallback = || Limiter::builder().policy(policy).build::<String>();
///
/// // A money path fails closed: no Redis, no transfer.
/// let transfers = ExactLimiter::new(RedisLimiter::new(down()?, policy)?, FailMode::Closed, fallback()?);
/// assert_eq!(transfers.check("acct-9", 1).await, ExactDecision::Unavailable);
///
/// // A fail-open policy decides on its local fallback meanwhile.
/// let search = ExactLimiter::new(RedisLimiter::new(down()?, policy)?, FailMode::Open, fallback()?);
/// assert!(matches!(search.check("acct-9", 1).await, ExactDecision::Fallback(d) if d.is_allowed()));
/// assert_eq!(search.failovers(), 1);
/// # Ok(()) }
/// ```
pub struct ExactLimiter {
    redis: RedisLimiter,
    fail_mode: FailMode,
    fallback: crate::Limiter<String>,
    fallbacks: std::sync::atomic::AtomicU64,
}

impl ExactLimiter {
    /// Combine a Redis limiter, a fail mode and a fallback limiter (used when failing open).
    pub fn new(redis: RedisLimiter, fail_mode: FailMode, fallback: crate::Limiter<String>) -> Self {
        ExactLimiter {
            redis,
            fail_mode,
            fallback,
            fallbacks: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Return how many decisions failed over (open or closed) since the start.
    pub fn failovers(&self) -> u64 {
        self.fallbacks.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Decide through Redis, or by the fail mode when Redis fails.
    pub async fn check(&self, key: &str, cost: u64) -> ExactDecision {
        let answer = self.redis.check(key, cost).await;
        if answer.is_err() {
            self.fallbacks
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let name = self.redis.policy().algorithm().name();
        fail_over(name, self.fail_mode, answer, || {
            self.fallback.check(key, cost)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&v| Value::Int(v)).collect())
    }

    #[test]
    fn a_reply_becomes_a_decision() {
        let allowed = decision_from_reply(&ints(&[0, 10, 7, 300, 0])).unwrap();
        assert_eq!(allowed, Decision::allowed(10, 7, 300_000));
        let denied = decision_from_reply(&ints(&[1, 10, 0, 900, 100])).unwrap();
        assert_eq!(denied, Decision::denied(10, 0, 900_000, 100_000));
        assert_eq!(
            decision_from_reply(&ints(&[2, 10, 0, 0, 0])).unwrap(),
            Decision::cannot_fit(10)
        );
        // Over a limit lowered since: none left, not an unreadable reply.
        let over = decision_from_reply(&ints(&[1, 3, -3, 900, 900])).unwrap();
        assert_eq!(over, Decision::denied(3, 0, 900_000, 900_000));
    }

    #[test]
    fn a_malformed_reply_is_an_error_not_a_panic() {
        for reply in [
            ints(&[0, 10, 7, 300]),
            ints(&[0, 10, 7, 300, 0, 1]),
            ints(&[0, -10, 7, 300, 0]),
            ints(&[-1, 10, 7, 300, 0]),
            ints(&[3, 10, 7, 300, 0]),
            ints(&[]),
            Value::Int(0),
            Value::Nil,
            Value::Array(vec![
                Value::Int(0),
                Value::BulkString(b"10".to_vec()),
                Value::Int(7),
                Value::Int(300),
                Value::Int(0),
            ]),
        ] {
            let error = decision_from_reply(&reply).unwrap_err();
            assert!(
                matches!(error, BackendError::Reply(_)),
                "{reply:?}: {error}"
            );
        }
        // Huge times saturate instead of overflowing.
        let far = decision_from_reply(&ints(&[1, 10, 0, i64::MAX, i64::MAX])).unwrap();
        assert_eq!(far.retry_after_ns, u64::MAX);
    }
}
