//! `[redis]`: where the `redis` backend lives (one server, a cluster, or the primary a set of
//! Sentinels names), its timeout, and `[redis.tls]` for `rediss://` endpoints.
//!
//! ```toml
//! [redis]
//! url = "rediss://redis.internal:6380"   # or cluster = [...], or sentinels = [...] and master
//! timeout = "250ms"
//!
//! [redis.tls]                             # optional with rediss://
//! ca = "redis-ca.pem"                     # the CAs to trust (default: the system's)
//! cert = "redis-client.pem"               # a client certificate, if the server asks for one
//! key = "redis-client.key"
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::source::{ConfigError, Source, parse_duration};

/// Where the `redis` backend lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// One server (`redis://host:port`, `rediss://…`, `redis+unix:///path`), the nodes of a
    /// cluster, or Sentinels.
    pub endpoints: RedisEndpoints,
    /// The timeout of every call; past it the policy's fail mode decides.
    pub timeout: Duration,
    /// What `rediss://` connections trust and present (`[redis.tls]`); without it they trust
    /// the system's CAs and present no certificate.
    pub tls: Option<RedisTls>,
}

/// One Redis server, a Redis Cluster, or the primary that Sentinels name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisEndpoints {
    /// One server.
    Single(String),
    /// Any nodes of one cluster.
    Cluster(Vec<String>),
    /// The primary of `master` as the Sentinels at `sentinels` know it, asked again after a
    /// failure (a failover moves it).
    Sentinel {
        /// The Sentinels (`redis://host:26379`, or `rediss://` for TLS to the Sentinels and
        /// the primary).
        sentinels: Vec<String>,
        /// The name the Sentinels monitor the primary under.
        master: String,
    },
}

impl RedisEndpoints {
    /// The URLs given (one, the cluster's nodes, or the Sentinels).
    pub fn urls(&self) -> Vec<&str> {
        match self {
            RedisEndpoints::Single(url) => vec![url.as_str()],
            RedisEndpoints::Cluster(urls)
            | RedisEndpoints::Sentinel {
                sentinels: urls, ..
            } => urls.iter().map(String::as_str).collect(),
        }
    }
}

/// `[redis.tls]`: PEM read from the files the policy file names.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisTls {
    /// The CA certificates that sign the servers' certificates (`None`: the system's).
    pub ca_pem: Option<Vec<u8>>,
    /// A client certificate chain and its key, for servers that ask for one.
    pub client_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// The files, for messages.
    pub files: Vec<PathBuf>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key's bytes.
        f.debug_struct("RedisTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// The largest certificate or key file read.
const MAX_PEM_BYTES: u64 = 1 << 20;

pub(super) fn build_redis(
    source: &Source<'_>,
    spanned: &Spanned<RawRedis>,
) -> Result<RedisConfig, ConfigError> {
    let raw = spanned.get_ref();
    let span = spanned.span();
    let line_of = |key: &str| source.line_of_key(span.clone(), key);
    let given = [
        raw.url.is_some(),
        !raw.cluster.is_empty(),
        !raw.sentinels.is_empty(),
    ];
    if given.iter().filter(|&&g| g).count() > 1 {
        return Err(source.error(
            line_of(if raw.url.is_some() { "url" } else { "cluster" }),
            "redis",
            "give one of `url`, `cluster` or `sentinels`",
        ));
    }
    let endpoints = if let Some(url) = &raw.url {
        RedisEndpoints::Single(url.clone())
    } else if !raw.cluster.is_empty() {
        RedisEndpoints::Cluster(raw.cluster.clone())
    } else if !raw.sentinels.is_empty() {
        let master = raw.master.clone().ok_or_else(|| {
            source.error(
                line_of("sentinels"),
                "redis.master",
                "`sentinels` needs `master`: the name they monitor the primary under",
            )
        })?;
        if let Some(url) = raw.sentinels.iter().find(|u| {
            let rest = u.split_once("://").map_or(u.as_str(), |(_, rest)| rest);
            rest.contains('@') || rest.trim_end_matches('/').contains('/')
        }) {
            return Err(source.error(
                line_of("sentinels"),
                "redis.sentinels",
                format!(
                    "`{}`: give a Sentinel as scheme, host and port only; a user, a password or a \
                     database there would not reach the primary",
                    url.split_once('@').map_or(url.as_str(), |(_, host)| host)
                ),
            ));
        }
        RedisEndpoints::Sentinel {
            sentinels: raw.sentinels.clone(),
            master,
        }
    } else {
        return Err(source.error(
            source.line_of(span.start),
            "redis",
            "needs `url` (one server), `cluster` (its nodes) or `sentinels` and `master`",
        ));
    };
    if raw.master.is_some() && !matches!(endpoints, RedisEndpoints::Sentinel { .. }) {
        return Err(source.error(
            line_of("master"),
            "redis.master",
            "`master` names the primary that `sentinels` watch; give `sentinels` too",
        ));
    }
    let timeout = match &raw.timeout {
        None => Duration::from_millis(250),
        Some(text) => parse_duration(text)
            .map_err(|reason| source.error(line_of("timeout"), "redis.timeout", reason))?,
    };
    let urls = endpoints.urls();
    let secure = urls.iter().filter(|u| u.starts_with("rediss://")).count();
    if secure != 0 && secure != urls.len() {
        return Err(source.error(
            line_of(if raw.cluster.is_empty() {
                "sentinels"
            } else {
                "cluster"
            }),
            "redis",
            "either every address is `rediss://` (TLS) or none is",
        ));
    }
    let tls = match &raw.tls {
        None => None,
        Some(tls) => {
            let line = source.line_of(tls.span().start);
            if secure == 0 {
                return Err(source.error(
                    line,
                    "redis.tls",
                    "`[redis.tls]` is for `rediss://` addresses; these are not TLS",
                ));
            }
            Some(build_tls(source, tls.get_ref(), line)?)
        }
    };
    Ok(RedisConfig {
        endpoints,
        timeout,
        tls,
    })
}

fn build_tls(source: &Source<'_>, raw: &RawTls, line: usize) -> Result<RedisTls, ConfigError> {
    let base = Path::new(source.file).parent().unwrap_or(Path::new(""));
    let mut files = Vec::new();
    let mut read = |field: &str, file: &str, marker: &str| {
        let path = base.join(file);
        let bytes = read_pem(&path, marker)
            .map_err(|reason| source.error(line, format!("redis.tls.{field}"), reason))?;
        files.push(path);
        Ok::<_, ConfigError>(bytes)
    };
    let ca_pem = match &raw.ca {
        Some(file) => Some(read("ca", file, "CERTIFICATE")?),
        None => None,
    };
    let client_pem = match (&raw.cert, &raw.key) {
        (Some(cert), Some(key)) => Some((
            read("cert", cert, "CERTIFICATE")?,
            read("key", key, "PRIVATE KEY")?,
        )),
        (None, None) => None,
        (Some(_), None) | (None, Some(_)) => {
            return Err(source.error(
                line,
                "redis.tls",
                "give `cert` and `key` together (a client certificate and its key)",
            ));
        }
    };
    Ok(RedisTls {
        ca_pem,
        client_pem,
        files,
    })
}

/// Read a PEM file of at most [`MAX_PEM_BYTES`] holding a `marker` block.
fn read_pem(path: &Path, marker: &str) -> Result<Vec<u8>, String> {
    let bytes = super::source::read_capped(path, MAX_PEM_BYTES)?;
    let text = String::from_utf8_lossy(&bytes);
    if !text
        .lines()
        .any(|l| l.starts_with("-----BEGIN ") && l.trim_end().ends_with(&format!("{marker}-----")))
    {
        return Err(format!("{} holds no PEM `{marker}` block", path.display()));
    }
    Ok(bytes)
}

/// `[redis]` as the file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRedis {
    url: Option<String>,
    #[serde(default)]
    cluster: Vec<String>,
    #[serde(default)]
    sentinels: Vec<String>,
    master: Option<String>,
    timeout: Option<String>,
    tls: Option<Spanned<RawTls>>,
}

/// `[redis.tls]` as the file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    ca: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}
