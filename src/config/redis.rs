//! `[redis]`: where the `redis` backend lives (one server or a cluster) and its timeout.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::source::{ConfigError, Source, parse_duration};

/// Where the `redis` backend lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// One server (`redis://host:port`, `redis+unix:///path`), or the nodes of a cluster.
    pub endpoints: RedisEndpoints,
    /// The timeout of every call; past it the policy's fail mode decides.
    pub timeout: Duration,
}

/// One Redis server or a Redis Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisEndpoints {
    /// One server.
    Single(String),
    /// Any nodes of one cluster.
    Cluster(Vec<String>),
}

pub(super) fn build_redis(
    source: &Source<'_>,
    spanned: &Spanned<RawRedis>,
) -> Result<RedisConfig, ConfigError> {
    let raw = spanned.get_ref();
    let span = spanned.span();
    let endpoints = match (&raw.url, raw.cluster.is_empty()) {
        (Some(url), true) => RedisEndpoints::Single(url.clone()),
        (None, false) => RedisEndpoints::Cluster(raw.cluster.clone()),
        (Some(_), false) => {
            return Err(source.error(
                source.line_of_key(span.clone(), "cluster"),
                "redis.cluster",
                "give either `url` or `cluster`, not both",
            ));
        }
        (None, true) => {
            return Err(source.error(
                source.line_of(span.start),
                "redis",
                "needs `url` (one server) or `cluster` (its nodes)",
            ));
        }
    };
    let timeout = match &raw.timeout {
        None => Duration::from_millis(250),
        Some(text) => parse_duration(text).map_err(|reason| {
            source.error(
                source.line_of_key(span.clone(), "timeout"),
                "redis.timeout",
                reason,
            )
        })?,
    };
    Ok(RedisConfig { endpoints, timeout })
}

/// `[redis]` as the file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRedis {
    url: Option<String>,
    #[serde(default)]
    cluster: Vec<String>,
    timeout: Option<String>,
}
