//! A money path: at most 5 transfers per minute per account across every gateway, decided
//! exactly in Redis (one atomic Lua script, on Redis's clock), and failing closed: when
//! Redis cannot answer in time, a transfer is refused with 503, never admitted on a guess.
//!
//! ```sh
//! redis-server &                                                     # or any Redis 6+
//! cargo run --release --example redis_money_path                     # redis://127.0.0.1:6379
//! REDIS_URL=redis://127.0.0.1:1 cargo run --release --example redis_money_path   # no Redis: 503s
//! ```
//!
//! The same policy in a policy file, for `RateLimitLayer` or `ratemesh node`:
//!
//! ```toml
//! [redis]
//! url = "redis://127.0.0.1:6379"
//! timeout = "250ms"
//!
//! [policies.transfers]
//! algorithm = "token-bucket"
//! rate = 5
//! period = "1m"
//! burst = 5
//! backend = "redis"
//! fail_mode = "closed"    # 503 {"error":"temporary-reduced-capacity"} when Redis fails
//! ```
//!
//! Cargo.toml:
//!
//! ```toml
//! ratemesh = { version = "0.1", default-features = false, features = ["redis"] }
//! tokio = { version = "1", features = ["rt-multi-thread", "macros"] }
//! ```

use std::time::Duration;

use ratemesh::backend::redis::{
    ExactDecision, ExactLimiter, FailMode, RedisConnection, RedisLimiter, redis_key,
};
use ratemesh::{Limiter, Policy};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());

    // 5 transfers per minute per account, bursts of 5.
    let policy = Policy::token_bucket(5, Duration::from_secs(60), 5)?;
    // Connects on first use, so the gateway starts even while Redis is down; every call
    // that takes longer than the timeout counts as a failure.
    let connection = RedisConnection::single(&url, Duration::from_millis(250))?;
    let redis = RedisLimiter::new(connection, policy)?;
    // The fallback limiter decides only for `FailMode::Open`; a closed policy never uses it.
    let fallback = Limiter::builder().policy(policy).build::<String>()?;
    let transfers = ExactLimiter::new(redis, FailMode::Closed, fallback);

    // `rl:{<identity>}:<env>:<policy>`: the braces keep one client's keys in one Redis
    // Cluster slot. Pass a keyed hash of the account, not the account number (the policy
    // file's `key_secret` does this for you). A fresh identity per run here, so that every
    // run shows the same thing.
    let identity = format!("acct-7f3a9c-{}", std::process::id());
    let key = redis_key("prod", "transfers", &identity, None);

    println!("7 transfers from one account through {url}:");
    for n in 1..=7 {
        let answer = match transfers.check(&key, 1).await {
            ExactDecision::Exact(d) if d.is_allowed() => {
                format!("200, {} of {} left this minute", d.remaining, d.limit)
            }
            ExactDecision::Exact(d) => format!(
                "429, Retry-After: {} s",
                d.retry_after_ns.div_ceil(1_000_000_000)
            ),
            // Only a fail-open policy decides on the local fallback.
            ExactDecision::Fallback(d) => format!("decided locally: {:?}", d.verdict),
            ExactDecision::Unavailable => {
                "503: Redis did not answer; the transfer is refused (fail closed)".to_string()
            }
        };
        println!("  transfer {n}: {answer}");
    }
    println!(
        "{} decision(s) failed over to the fail mode",
        transfers.failovers()
    );
    Ok(())
}
