//! The node file's `[http]` section, the table form of `http = "…"`: the HTTP port's
//! address, its timeouts and its size limits (the settings and their defaults are shown in
//! the node file's example, in the parent module).

use std::time::Duration;

use serde::Deserialize;

use crate::config::{ConfigError, Source, parse_duration};
use crate::http::identity::DEFAULT_MAX_IDENTITY_BYTES;

/// The longest `http.header_read_timeout` and `http.idle_timeout`.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// The largest `http.max_identity_bytes` a node accepts (HTTP servers refuse larger header
/// blocks anyway).
pub(crate) const MAX_IDENTITY_BYTES_LIMIT: usize = 64 * 1024;

/// The largest `http.max_body_bytes` a node accepts.
pub(crate) const MAX_BODY_BYTES_LIMIT: u64 = 64 * 1024 * 1024;

/// The default `http.max_body_bytes`: the node's own endpoints take no body.
pub(crate) const DEFAULT_MAX_BODY_BYTES: u64 = 64 * 1024;

/// The largest `http.max_connections` a node accepts.
const MAX_CONNECTIONS_LIMIT: i64 = 1 << 24;

/// The `[http]` section of a node file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    /// How long a client has to send a request's head (from the connection's start, or
    /// from the first byte of a request on a kept-alive connection); then the connection is
    /// closed.
    pub header_read_timeout: Duration,
    /// How long a kept-alive connection may wait for its next request; then it is closed.
    pub idle_timeout: Duration,
    /// The most connections open at once; `None`: the open-file limit less
    /// `RESERVED_FDS`. Beyond it, new connections wait in the listen queue.
    pub max_connections: Option<usize>,
    /// The longest identity header (API key, device id) a request may carry; longer ones
    /// are answered 431.
    pub max_identity_bytes: usize,
    /// The largest request body the node reads; a longer one is answered 413 and the
    /// connection closed.
    pub max_body_bytes: u64,
}

/// File descriptors kept for the node itself (QUIC, files, logs) when the connection cap
/// is derived from the open-file limit.
pub(crate) const RESERVED_FDS: usize = 256;

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: None,
            max_identity_bytes: DEFAULT_MAX_IDENTITY_BYTES,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    pub(super) addr: String,
    pub(super) header_read_timeout: Option<String>,
    pub(super) idle_timeout: Option<String>,
    pub(super) max_connections: Option<i64>,
    pub(super) max_identity_bytes: Option<i64>,
    pub(super) max_body_bytes: Option<i64>,
}

pub(super) fn http_settings(
    source: &Source<'_>,
    span: std::ops::Range<usize>,
    raw: &RawHttp,
) -> Result<HttpSettings, ConfigError> {
    let mut settings = HttpSettings::default();
    let timeouts = [
        ("header_read_timeout", &raw.header_read_timeout),
        ("idle_timeout", &raw.idle_timeout),
    ];
    for (key, text) in timeouts {
        let Some(text) = text else { continue };
        let line = source.line_of_key(span.clone(), key);
        let field = format!("http.{key}");
        let value = parse_duration(text).map_err(|reason| source.error(line, &field, reason))?;
        if value.is_zero() || value > MAX_TIMEOUT {
            return Err(source.error(
                line,
                &field,
                format!("between 1ms and {MAX_TIMEOUT:?}, got {value:?}"),
            ));
        }
        match key {
            "header_read_timeout" => settings.header_read_timeout = value,
            _ => settings.idle_timeout = value,
        }
    }
    if let Some(value) = raw.max_connections {
        if !(1..=MAX_CONNECTIONS_LIMIT).contains(&value) {
            return Err(source.error(
                source.line_of_key(span.clone(), "max_connections"),
                "http.max_connections",
                format!("between 1 and {MAX_CONNECTIONS_LIMIT}, got {value}"),
            ));
        }
        settings.max_connections = Some(value as usize);
    }
    if let Some(value) = raw.max_identity_bytes {
        let limit = MAX_IDENTITY_BYTES_LIMIT as i64;
        if !(1..=limit).contains(&value) {
            return Err(source.error(
                source.line_of_key(span.clone(), "max_identity_bytes"),
                "http.max_identity_bytes",
                format!("between 1 and {limit} bytes, got {value}"),
            ));
        }
        settings.max_identity_bytes = value as usize;
    }
    if let Some(value) = raw.max_body_bytes {
        let limit = MAX_BODY_BYTES_LIMIT as i64;
        if !(0..=limit).contains(&value) {
            return Err(source.error(
                source.line_of_key(span, "max_body_bytes"),
                "http.max_body_bytes",
                format!("between 0 and {limit} bytes, got {value}"),
            ));
        }
        settings.max_body_bytes = value as u64;
    }
    Ok(settings)
}
