//! The node file's `[envoy_rls]` table: a gRPC port that answers Envoy's rate limit service
//! API (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) with the policy
//! file's `[envoy]` descriptors.
//!
//! ```toml
//! [envoy_rls]
//! listen = "127.0.0.1:8081"          # gRPC (HTTP/2 over TCP, no TLS)
//! max_message_bytes = 65536          # a larger request is refused (OUT_OF_RANGE)
//! ```

use std::net::SocketAddr;

use serde::Deserialize;
use toml::Spanned;

use crate::config::{ConfigError, Source};

/// The default `max_message_bytes`: Envoy's requests are a few hundred bytes.
pub(super) const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// The largest `max_message_bytes` a node accepts.
pub(super) const MAX_MESSAGE_BYTES_LIMIT: usize = 4 * 1024 * 1024;

/// The `[envoy_rls]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyRls {
    /// The gRPC address.
    pub listen: SocketAddr,
    /// The largest request message decoded.
    pub max_message_bytes: usize,
    /// The table's line in the node file (for errors found later).
    pub line: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEnvoyRls {
    listen: String,
    max_message_bytes: Option<i64>,
}

/// Validate `[envoy_rls]`; `http` is the node's HTTP address (the two must differ).
pub(super) fn envoy_rls(
    source: &Source<'_>,
    spanned: &Spanned<RawEnvoyRls>,
    http: SocketAddr,
) -> Result<EnvoyRls, ConfigError> {
    let raw = spanned.get_ref();
    let span = spanned.span();
    let at = |key: &str| source.line_of_key(span.clone(), key);
    let listen = own_port(&raw.listen, http, "127.0.0.1:8081")
        .map_err(|reason| source.error(at("listen"), "envoy_rls.listen", reason))?;
    let max_message_bytes = match raw.max_message_bytes {
        None => DEFAULT_MAX_MESSAGE_BYTES,
        Some(n) if (1024..=MAX_MESSAGE_BYTES_LIMIT as i64).contains(&n) => n as usize,
        Some(n) => {
            return Err(source.error(
                at("max_message_bytes"),
                "envoy_rls.max_message_bytes",
                format!("between 1024 and {MAX_MESSAGE_BYTES_LIMIT} bytes, got {n}"),
            ));
        }
    };
    Ok(EnvoyRls {
        listen,
        max_message_bytes,
        line: source.line_of(span.start),
    })
}

/// Read the address of a port beside the node's HTTP port (`http`): an address, and not one
/// that would take the HTTP port; `example` is shown in the error.
pub(super) fn own_port(text: &str, http: SocketAddr, example: &str) -> Result<SocketAddr, String> {
    let listen = text
        .parse::<SocketAddr>()
        .map_err(|e| format!("`{text}` is not an address ({e}); write e.g. \"{example}\""))?;
    if listen == http
        || (listen.port() == http.port() && listen.port() != 0 && overlaps(listen, http))
    {
        return Err(format!(
            "{listen} is the node's HTTP address; give this port its own"
        ));
    }
    Ok(listen)
}

/// Tell whether two addresses with one port would take the same TCP port (one of them on
/// every interface, or both on the same one).
pub(super) fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.ip().is_unspecified() || b.ip().is_unspecified() || a.ip() == b.ip()
}
