//! The node file's `[[proxy]]` routes (requests the node forwards to an upstream once the
//! policies admit them) and its `[forward_auth]` endpoint (decisions for another gateway).
//!
//! ```toml
//! [[proxy]]
//! path_prefix = "/api"                # /api and everything under /api/
//! upstream = "http://127.0.0.1:9000"  # http://host:port; the request's path and query are kept
//! http2 = false                       # true: HTTP/2 with prior knowledge (h2c) to the upstream
//! connect_timeout = "5s"              # the upstream's TCP connection (504 when it runs out)
//! timeout = "30s"                     # the upstream's response head, and the longest pause
//!                                     # in a body either way (504, or the stream is cut)
//! max_body_bytes = 1073741824         # optional: a longer request body is answered 413
//! forwarded = ["x-forwarded-for", "forwarded", "x-forwarded-proto", "x-forwarded-host"]
//!                                     # the forwarding fields the node writes (the default:
//!                                     # all four); a client's own are dropped either way
//!                                     # unless it is a trusted proxy
//!
//! [forward_auth]
//! path = "/v1/check"                  # Caddy forward_auth, Traefik forwardAuth, Envoy ext_authz
//! ```

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::config::{ConfigError, Source, parse_duration};

/// The most `[[proxy]]` routes a node file may have.
pub(super) const MAX_PROXY_ROUTES: usize = 1024;

/// The longest `path_prefix` or `forward_auth.path`, in bytes.
pub(super) const MAX_PATH_BYTES: usize = 1024;

/// The longest `connect_timeout` or `timeout` of a proxy route.
pub(super) const MAX_PROXY_TIMEOUT: Duration = Duration::from_secs(3600);

/// The default `connect_timeout` of a proxy route.
pub(super) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The default `timeout` of a proxy route.
pub(super) const DEFAULT_PROXY_TIMEOUT: Duration = Duration::from_secs(30);

/// The node's own paths: no proxy route or forward-auth endpoint may take them.
const OWN_PATHS: [&str; 2] = ["/health", "/metrics"];

/// One `[[proxy]]` entry: requests under `path_prefix` go to `upstream` once admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyRoute {
    /// The prefix as the node matches it: no trailing `/`, empty for `/` (every path).
    pub path_prefix: String,
    /// The upstream's scheme (`http`) and authority (`host:port`); the path is the request's.
    pub upstream: http::Uri,
    /// HTTP/2 with prior knowledge (h2c) to the upstream, instead of HTTP/1.1.
    pub http2: bool,
    /// How long the TCP connection to the upstream may take.
    pub connect_timeout: Duration,
    /// How long the upstream may take to send its response head, and the longest pause
    /// between two pieces of a body, either way.
    pub timeout: Duration,
    /// The longest request body forwarded (`None`: no limit).
    pub max_body_bytes: Option<u64>,
    /// The forwarding fields the node writes on the way to the upstream.
    pub forwarded: Forwarded,
    /// The entry's line in the node file (for logs).
    pub line: usize,
}

impl ProxyRoute {
    /// Tell whether `path` is under this route's prefix (`/api` takes `/api` and `/api/…`,
    /// not `/apis`).
    pub fn matches(&self, path: &str) -> bool {
        // `/` (kept as ``) takes every path, with no call to compare bytes.
        if self.path_prefix.is_empty() {
            return true;
        }
        path.strip_prefix(self.path_prefix.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }
}

/// A set of the forwarding fields a proxy route writes: `X-Forwarded-For`, `Forwarded`
/// (RFC 7239), `X-Forwarded-Proto` and `X-Forwarded-Host`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forwarded(u8);

impl Forwarded {
    /// `X-Forwarded-For`: the chain of client addresses.
    pub const FOR: Forwarded = Forwarded(1);
    /// `Forwarded`: `for=…;proto=…;host=…` (RFC 7239).
    pub const FORWARDED: Forwarded = Forwarded(2);
    /// `X-Forwarded-Proto`: the scheme the client used.
    pub const PROTO: Forwarded = Forwarded(4);
    /// `X-Forwarded-Host`: the `Host` the client sent.
    pub const HOST: Forwarded = Forwarded(8);
    /// All four (a route's default).
    pub const ALL: Forwarded = Forwarded(15);
    /// None: the upstream learns nothing of the client from the node.
    pub const NONE: Forwarded = Forwarded(0);

    /// The field names as the node file writes them.
    pub const NAMES: [(&'static str, Forwarded); 4] = [
        ("x-forwarded-for", Forwarded::FOR),
        ("forwarded", Forwarded::FORWARDED),
        ("x-forwarded-proto", Forwarded::PROTO),
        ("x-forwarded-host", Forwarded::HOST),
    ];

    /// Tell whether every field of `other` is in this set.
    pub fn contains(self, other: Forwarded) -> bool {
        self.0 & other.0 == other.0
    }

    /// This set with the fields of `other` added.
    pub fn with(self, other: Forwarded) -> Forwarded {
        Forwarded(self.0 | other.0)
    }
}

/// Read a `forwarded` list: known field names (any case), each at most once.
fn forwarded(names: &[String]) -> Result<Forwarded, String> {
    let mut set = Forwarded::NONE;
    for name in names {
        let Some(&(_, field)) = Forwarded::NAMES
            .iter()
            .find(|(known, _)| name.eq_ignore_ascii_case(known))
        else {
            return Err(format!(
                "`{}` is not a forwarding field; the node writes x-forwarded-for, forwarded, \
                 x-forwarded-proto and x-forwarded-host",
                name.escape_debug()
            ));
        };
        if set.contains(field) {
            return Err(format!("`{name}` is listed twice"));
        }
        set = set.with(field);
    }
    Ok(set)
}

/// The `[forward_auth]` table: where gateways ask for decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardAuth {
    /// The endpoint's path (requests to it and under it are checks).
    pub path: String,
}

impl ForwardAuth {
    /// The original path carried in a check's own path (`/v1/check/api/x` → `/api/x`, as
    /// Envoy's `ext_authz` sends it), or `None` when `path` is the endpoint itself or not
    /// under it.
    pub fn carried_path<'a>(&self, path: &'a str) -> Option<&'a str> {
        path.strip_prefix(self.path.as_str())
            .filter(|rest| rest.starts_with('/'))
    }

    /// Tell whether `path` is this endpoint or under it.
    pub fn matches(&self, path: &str) -> bool {
        path.strip_prefix(self.path.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProxy {
    path_prefix: String,
    upstream: String,
    http2: Option<bool>,
    connect_timeout: Option<String>,
    timeout: Option<String>,
    max_body_bytes: Option<i64>,
    forwarded: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawForwardAuth {
    path: String,
}

/// A path as written for a prefix or an endpoint: `/`-rooted visible ASCII without a query
/// or fragment, bounded; returned without its trailing `/`.
fn check_path(text: &str) -> Result<&str, String> {
    if !text.starts_with('/') {
        return Err(format!("`{text}` does not start with `/`"));
    }
    if text.len() > MAX_PATH_BYTES {
        return Err(format!("{} bytes; at most {MAX_PATH_BYTES}", text.len()));
    }
    if let Some(bad) = text
        .chars()
        .find(|&c| !c.is_ascii_graphic() || c == '?' || c == '#')
    {
        return Err(format!(
            "`{}` has {bad:?}: a path is visible ASCII without `?` or `#`",
            text.escape_debug()
        ));
    }
    Ok(text.trim_end_matches('/'))
}

/// Validate the `[[proxy]]` entries.
pub(super) fn proxy_routes(
    source: &Source<'_>,
    raw: &[Spanned<RawProxy>],
) -> Result<Vec<ProxyRoute>, ConfigError> {
    if raw.len() > MAX_PROXY_ROUTES {
        return Err(source.error(
            source.line_of(raw[MAX_PROXY_ROUTES].span().start),
            "proxy",
            format!("at most {MAX_PROXY_ROUTES} proxy routes"),
        ));
    }
    let mut routes: Vec<ProxyRoute> = Vec::with_capacity(raw.len());
    for (i, spanned) in raw.iter().enumerate() {
        let entry = spanned.get_ref();
        let span = spanned.span();
        let line = |key: &str| source.line_of_key(span.clone(), key);
        let error = |key: &str, reason: String| {
            source.error(line(key), format!("proxy[{i}].{key}"), reason)
        };

        let path_prefix = check_path(&entry.path_prefix).map_err(|r| error("path_prefix", r))?;
        if OWN_PATHS.contains(&path_prefix) {
            return Err(error(
                "path_prefix",
                format!("`{path_prefix}` is the node's own endpoint"),
            ));
        }
        if let Some(earlier) = routes.iter().position(|r| r.path_prefix == path_prefix) {
            return Err(error(
                "path_prefix",
                format!(
                    "`{}` is also the prefix of proxy[{earlier}]",
                    entry.path_prefix
                ),
            ));
        }
        let upstream = upstream(&entry.upstream).map_err(|r| error("upstream", r))?;
        let duration = |key: &str, text: &Option<String>, default: Duration| {
            let Some(text) = text else {
                return Ok(default);
            };
            let value = parse_duration(text).map_err(|reason| error(key, reason))?;
            if value.is_zero() || value > MAX_PROXY_TIMEOUT {
                return Err(error(
                    key,
                    format!("between 1ms and {MAX_PROXY_TIMEOUT:?}, got {value:?}"),
                ));
            }
            Ok(value)
        };
        let connect_timeout = duration(
            "connect_timeout",
            &entry.connect_timeout,
            DEFAULT_CONNECT_TIMEOUT,
        )?;
        let timeout = duration("timeout", &entry.timeout, DEFAULT_PROXY_TIMEOUT)?;
        let max_body_bytes = match entry.max_body_bytes {
            None => None,
            Some(n) if n >= 0 => Some(n as u64),
            Some(n) => {
                return Err(error(
                    "max_body_bytes",
                    format!("a number of bytes ≥ 0, got {n}"),
                ));
            }
        };
        let forwarded = match &entry.forwarded {
            None => Forwarded::ALL,
            Some(names) => forwarded(names).map_err(|r| error("forwarded", r))?,
        };
        routes.push(ProxyRoute {
            path_prefix: path_prefix.to_string(),
            upstream,
            http2: entry.http2.unwrap_or(false),
            connect_timeout,
            timeout,
            max_body_bytes,
            forwarded,
            line: source.line_of(span.start),
        });
    }
    Ok(routes)
}

/// `http://host:port`, with no path (or `/`), query or user info.
fn upstream(text: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = text.parse().map_err(|e| {
        format!("`{text}` is not a URL ({e}); write e.g. \"http://127.0.0.1:9000\"")
    })?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "`{text}`: TLS to an upstream is not supported; write http:// and keep the \
                 upstream on a trusted network (or terminate TLS beside it)"
            ));
        }
        _ => return Err(format!("`{text}` is not an http:// URL")),
    }
    let Some(authority) = uri.authority() else {
        return Err(format!("`{text}` names no host"));
    };
    if authority.as_str().contains('@') {
        return Err(format!("`{text}` carries user info; the node sends none"));
    }
    if authority.host().is_empty() {
        return Err(format!("`{text}` names no host"));
    }
    if uri.query().is_some() || !matches!(uri.path(), "" | "/") {
        return Err(format!(
            "`{text}` has a path or a query; an upstream is http://host:port, and the request's \
             own path and query are sent to it"
        ));
    }
    http::Uri::builder()
        .scheme("http")
        .authority(authority.clone())
        .path_and_query("/")
        .build()
        .map_err(|e| format!("`{text}`: {e}"))
}

/// Validate the `[forward_auth]` table.
pub(super) fn forward_auth(
    source: &Source<'_>,
    raw: &Spanned<RawForwardAuth>,
) -> Result<ForwardAuth, ConfigError> {
    let line = source.line_of_key(raw.span(), "path");
    let error = |reason: String| source.error(line, "forward_auth.path", reason);
    let path = check_path(&raw.get_ref().path).map_err(error)?;
    if path.is_empty() {
        return Err(error(
            "`/` would take every path; name an endpoint, e.g. \"/v1/check\"".to_string(),
        ));
    }
    if OWN_PATHS.contains(&path) {
        return Err(error(format!("`{path}` is the node's own endpoint")));
    }
    Ok(ForwardAuth {
        path: path.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(prefix: &str) -> ProxyRoute {
        ProxyRoute {
            path_prefix: prefix.to_string(),
            upstream: "http://127.0.0.1:1/".parse().unwrap(),
            http2: false,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            timeout: DEFAULT_PROXY_TIMEOUT,
            max_body_bytes: None,
            forwarded: Forwarded::ALL,
            line: 1,
        }
    }

    #[test]
    fn prefixes_take_whole_segments() {
        let api = route("/api");
        assert!(api.matches("/api"));
        assert!(api.matches("/api/orders"));
        assert!(!api.matches("/apis"));
        assert!(!api.matches("/"));
        let all = route("");
        assert!(all.matches("/") && all.matches("/anything/at/all"));
    }

    #[test]
    fn upstreams_are_plain_http_authorities() {
        assert_eq!(
            upstream("http://127.0.0.1:9000")
                .unwrap()
                .authority()
                .unwrap()
                .as_str(),
            "127.0.0.1:9000"
        );
        assert!(upstream("http://[::1]:9000/").is_ok());
        for bad in [
            "https://a:1",
            "127.0.0.1:9000",
            "http://a:1/base",
            "http://a:1/?q",
            "http://u:p@a:1",
            "ftp://a",
            "http://",
        ] {
            assert!(upstream(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn forwarding_fields_are_known_names_listed_once() {
        let names =
            |list: &[&str]| forwarded(&list.iter().map(|n| n.to_string()).collect::<Vec<_>>());
        assert_eq!(names(&[]).unwrap(), Forwarded::NONE);
        assert_eq!(
            names(&[
                "X-Forwarded-For",
                "forwarded",
                "x-forwarded-proto",
                "x-forwarded-host"
            ])
            .unwrap(),
            Forwarded::ALL
        );
        let only_for = names(&["x-forwarded-for"]).unwrap();
        assert!(only_for.contains(Forwarded::FOR) && !only_for.contains(Forwarded::FORWARDED));
        assert!(names(&["x-real-ip"]).unwrap_err().contains("x-real-ip"));
        assert!(
            names(&["forwarded", "Forwarded"])
                .unwrap_err()
                .contains("twice")
        );
    }

    #[test]
    fn checks_carry_the_original_path_after_the_endpoint() {
        let auth = ForwardAuth {
            path: "/v1/check".to_string(),
        };
        assert!(auth.matches("/v1/check") && auth.matches("/v1/check/api"));
        assert!(!auth.matches("/v1/checks"));
        assert_eq!(auth.carried_path("/v1/check/api/x"), Some("/api/x"));
        assert_eq!(auth.carried_path("/v1/check"), None);
        assert_eq!(auth.carried_path("/v1/checkx/y"), None);
    }
}
