//! A policy file's `redis` policies on the deployment its `[redis]` section names, each with
//! its script and, when the file asks for one, its token cache: the [`ExactLimits`] that
//! [`crate::rules::Rules`] asks (fail modes are the rules' part).

use std::time::Instant;

use crate::backend::exact::{ExactAnswer, ExactError, ExactFuture, ExactLimits, RefundFuture};
use crate::backend::redis::{BackendError, RedisConnection, RedisLimiter, redis_key};
use crate::backend::token_cache::TokenCache;
use crate::config::GatewayConfig;
use crate::decision::Decision;

/// One `redis` policy of a file: its script, and its token cache if the file asks for one.
struct RedisPolicy {
    name: String,
    limiter: RedisLimiter,
    cache: Option<TokenCache>,
    /// A calendar policy's clock: its scripts are given the instant on it (from this
    /// machine's clock) instead of reading Redis `TIME`.
    warp: Option<crate::algorithm::calendar::Warp>,
}

/// The `redis` policies of a policy file on the deployment its `[redis]` section names: what
/// [`crate::rules::Rules`] asks through [`ExactLimits`] (fail modes are the rules' part).
pub struct RedisLimits {
    env: String,
    /// In the order of [`GatewayConfig::redis_policies`].
    policies: Vec<RedisPolicy>,
    /// Keys decided with a limit of their own (the admin API's overrides): by policy number
    /// and key, the policy's script with the override's limit (no token cache).
    overrides: dashmap::DashMap<(u32, u64), std::sync::Arc<RedisLimiter>>,
}

impl std::fmt::Debug for RedisLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimits")
            .field(
                "policies",
                &self.policies.iter().map(|p| &p.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl RedisLimits {
    /// Prepare the `redis` policies of `config` (connecting lazily, inside a tokio runtime);
    /// `None` if the file has no `[redis]` section.
    pub fn from_config(config: &GatewayConfig) -> Result<Option<Self>, BackendError> {
        let Some(redis) = &config.redis else {
            return Ok(None);
        };
        let connection = RedisConnection::from_config(redis)?;
        let policies = config
            .redis_policies()
            .into_iter()
            .map(|named| {
                let mut limiter = RedisLimiter::new(connection.clone(), named.policy)?;
                if let Some(block) = named.block_for {
                    limiter = limiter.with_block_for(block);
                }
                let cache = match named.token_cache {
                    Some(cache) => Some(TokenCache::new(limiter.clone(), cache.batch, cache.ttl)?),
                    None => None,
                };
                Ok(RedisPolicy {
                    name: named.name.clone(),
                    limiter,
                    cache,
                    warp: named
                        .calendar
                        .clone()
                        .map(crate::algorithm::calendar::Warp::new),
                })
            })
            .collect::<Result<_, BackendError>>()?;
        Ok(Some(RedisLimits {
            env: config.env.clone(),
            policies,
            overrides: dashmap::DashMap::new(),
        }))
    }

    /// Policy number `policy` and the Redis key of `key` (and `route`) under it.
    fn keyed(
        &self,
        policy: u32,
        key: u64,
        route: Option<&str>,
    ) -> Result<(&RedisPolicy, String), BackendError> {
        let named = usize::try_from(policy)
            .ok()
            .and_then(|p| self.policies.get(p))
            .ok_or(BackendError::UnknownPolicy(policy))?;
        let identity = format!("{key:016x}");
        Ok((named, redis_key(&self.env, &named.name, &identity, route)))
    }

    async fn check(
        &self,
        policy: u32,
        key: u64,
        route: Option<&str>,
        cost: u64,
    ) -> Result<Decision, BackendError> {
        let (named, rkey) = self.keyed(policy, key, route)?;
        let overridden = self.overridden(policy, key);
        let limiter = overridden.as_deref().unwrap_or(&named.limiter);
        if let Some(warp) = &named.warp {
            let warped = warp.at(wall_clock_ns());
            let mut d = limiter
                .check_at(&rkey, cost, Some(warped.now / 1000))
                .await?;
            d.reset_after_ns = warped.real(d.reset_after_ns);
            d.retry_after_ns = warped.real(d.retry_after_ns);
            return Ok(d);
        }
        if overridden.is_some() {
            return limiter.check(&rkey, cost).await;
        }
        match &named.cache {
            Some(cache) => cache.check(&rkey, cost).await,
            None => named.limiter.check(&rkey, cost).await,
        }
    }

    /// The override's script of `key`, if it has one (cloned out of the map: no lock is held
    /// while Redis answers).
    fn overridden(&self, policy: u32, key: u64) -> Option<std::sync::Arc<RedisLimiter>> {
        if self.overrides.is_empty() {
            return None;
        }
        self.overrides
            .get(&(policy, key))
            .map(|l| std::sync::Arc::clone(&l))
    }
}

/// This machine's clock, in ns since the UNIX epoch (a calendar policy's scripts run on it).
fn wall_clock_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl ExactLimits for RedisLimits {
    fn decide<'a>(
        &'a self,
        policy: u32,
        key: u64,
        route: Option<&'a str>,
        cost: u64,
    ) -> ExactFuture<'a> {
        Box::pin(async move {
            let sent = Instant::now();
            self.check(policy, key, route, cost)
                .await
                .map(|decision| ExactAnswer::new(decision, sent))
                .map_err(ExactError::new)
        })
    }

    fn set_override(&self, policy_number: u32, key: u64, policy: Option<crate::policy::Policy>) {
        let Some(named) = self.policies.get(policy_number as usize) else {
            return;
        };
        match policy {
            None => {
                self.overrides.remove(&(policy_number, key));
            }
            Some(policy) => {
                let limiter = std::sync::Arc::new(named.limiter.with_policy(policy));
                self.overrides.insert((policy_number, key), limiter);
            }
        }
    }

    /// In Redis; tokens a node's cache holds stay there (Redis counted them when it gave
    /// them), and a cached "empty until" answer holds until its time.
    fn reset<'a>(&'a self, policy: u32, key: u64, route: Option<&'a str>) -> RefundFuture<'a> {
        Box::pin(async move {
            let (named, rkey) = self.keyed(policy, key, route).map_err(ExactError::new)?;
            named.limiter.reset(&rkey).await.map_err(ExactError::new)
        })
    }

    /// Straight to Redis, with or without a token cache: a cache holds only buckets' tokens,
    /// which Redis counted when it granted them, so a token given back there is exact.
    fn refund<'a>(
        &'a self,
        policy: u32,
        key: u64,
        route: Option<&'a str>,
        cost: u64,
        sent: Instant,
    ) -> RefundFuture<'a> {
        Box::pin(async move {
            let (named, rkey) = self.keyed(policy, key, route).map_err(ExactError::new)?;
            // The charge was made after `sent`: within what has gone by since, measured on
            // this clock, plus the trip this refund is about to make, which Redis's clock
            // counts too and this one cannot (a refund queued behind other commands found
            // nothing to give back). Twice the time gone by, and 10 ms more, covers a trip
            // as long as the whole call took. Reaching further back is never more: a window's
            // charge near its start is kept, and a log loses its earliest entry in reach,
            // which may be older than the call's own (the newer one left counts longer).
            let elapsed = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
            let within_us = elapsed.saturating_mul(2).saturating_add(10_000);
            let overridden = self.overridden(policy, key);
            let limiter = overridden.as_deref().unwrap_or(&named.limiter);
            if let Some(warp) = &named.warp {
                let warped = warp.at(wall_clock_ns());
                return limiter
                    .refund_at(
                        &rkey,
                        cost,
                        within_us.saturating_add(1),
                        Some(warped.now / 1000),
                    )
                    .await
                    .map_err(ExactError::new);
            }
            limiter
                .refund(&rkey, cost, within_us.saturating_add(1))
                .await
                .map_err(ExactError::new)
        })
    }
}
