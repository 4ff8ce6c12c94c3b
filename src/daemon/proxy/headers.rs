//! The header fields a proxied request and its response lose and gain on the way: the
//! hop-by-hop fields are dropped both ways (`Connection` and every field it names,
//! `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`), and the
//! request gets this hop appended to `X-Forwarded-For` and `Forwarded`.
//!
//! The forwarding fields a client sent are kept only when its connection comes from a
//! trusted proxy (the policy file's `identity.trusted_proxies`); from anyone else they are
//! dropped, and the chain starts at the peer's address.

use std::fmt::Write as _;
use std::net::IpAddr;

use http::header::{CONNECTION, FORWARDED, HOST, TE, TRAILER, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue};

/// `X-Forwarded-For`.
pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
pub(crate) const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Forwarded-Host`.
pub(crate) const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// Remove the hop-by-hop fields. Returns whether the request asked for trailers
/// (`TE: trailers`), which an HTTP/2 upstream may need to hear again (gRPC).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) -> bool {
    // The fields `Connection` names; allocated only when it names something unusual.
    let mut named: Vec<HeaderName> = Vec::new();
    for value in headers.get_all(CONNECTION) {
        let Ok(text) = value.to_str() else { continue };
        for token in text.split(',').map(str::trim) {
            if token.is_empty()
                || token.eq_ignore_ascii_case("close")
                || token.eq_ignore_ascii_case("keep-alive")
            {
                continue;
            }
            if let Ok(name) = HeaderName::from_bytes(token.as_bytes()) {
                named.push(name);
            }
        }
    }
    for name in named {
        headers.remove(name);
    }
    let trailers = headers.get_all(TE).iter().any(|value| {
        value.to_str().is_ok_and(|text| {
            text.split(',')
                .any(|t| t.split(';').next().unwrap_or("").trim() == "trailers")
        })
    });
    for name in [
        CONNECTION,
        KEEP_ALIVE,
        TE,
        TRAILER,
        TRANSFER_ENCODING,
        UPGRADE,
    ] {
        headers.remove(name);
    }
    while let Some(name) = headers
        .keys()
        .find(|name| name.as_str().starts_with("proxy-"))
        .cloned()
    {
        headers.remove(name);
    }
    trailers
}

/// Append this hop to the request's forwarding fields: `peer` (the connection's address)
/// to `X-Forwarded-For` and `for=peer;proto=http[;host=…]` to `Forwarded`; set
/// `X-Forwarded-Proto` and `X-Forwarded-Host` when no trusted proxy set them. When
/// `trusted` is false the client's own forwarding fields are dropped first.
pub(crate) fn add_forwarded(headers: &mut HeaderMap, peer: Option<IpAddr>, trusted: bool) {
    if !trusted {
        for name in [
            X_FORWARDED_FOR,
            FORWARDED,
            X_FORWARDED_PROTO,
            X_FORWARDED_HOST,
        ] {
            headers.remove(name);
        }
    }
    let Some(peer) = peer else { return };
    let mut text = String::with_capacity(64);
    append_list(headers, &X_FORWARDED_FOR, &mut text);
    let _ = write!(text, "{peer}");
    if let Ok(value) = HeaderValue::from_str(&text) {
        headers.insert(X_FORWARDED_FOR, value);
    }

    text.clear();
    append_list(headers, &FORWARDED, &mut text);
    match peer {
        IpAddr::V4(ip) => {
            let _ = write!(text, "for={ip}");
        }
        IpAddr::V6(ip) => {
            let _ = write!(text, "for=\"[{ip}]\"");
        }
    }
    text.push_str(";proto=http");
    let host = headers.get(HOST).and_then(|v| v.to_str().ok());
    if let Some(host) = host.filter(|h| !h.is_empty() && !h.contains(['"', '\\'])) {
        let _ = write!(text, ";host=\"{host}\"");
    }
    if let Ok(value) = HeaderValue::from_str(&text) {
        headers.insert(FORWARDED, value);
    }

    if !headers.contains_key(X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
    if !headers.contains_key(X_FORWARDED_HOST)
        && let Some(host) = headers.get(HOST).cloned()
    {
        headers.insert(X_FORWARDED_HOST, host);
    }
}

/// Write the values of `name` (one or more lines) into `out` as one list, with a trailing
/// `", "` when there were any.
fn append_list(headers: &HeaderMap, name: &HeaderName, out: &mut String) {
    for value in headers.get_all(name) {
        let Ok(text) = value.to_str() else { continue };
        let text = text.trim().trim_end_matches(',').trim_end();
        if !text.is_empty() {
            out.push_str(text);
            out.push_str(", ");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_are_dropped() {
        let mut map = headers(&[
            ("connection", "keep-alive, X-Secret-Hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("proxy-authorization", "Basic abc"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers, deflate;q=0.5"),
            ("trailer", "x-checksum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("x-api-key", "k"),
            ("content-length", "3"),
        ]);
        assert!(strip_hop_by_hop(&mut map), "TE asked for trailers");
        let left: Vec<&str> = map.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-api-key", "content-length"]);
        let mut map = headers(&[("te", "gzip")]);
        assert!(!strip_hop_by_hop(&mut map));
    }

    #[test]
    fn this_hop_is_appended_only_to_a_trusted_chain() {
        let peer: IpAddr = "10.0.0.7".parse().unwrap();
        let sent = [
            ("x-forwarded-for", "203.0.113.9"),
            ("forwarded", "for=203.0.113.9"),
            ("x-forwarded-proto", "https"),
            ("host", "api.example.com"),
        ];
        let mut map = headers(&sent);
        add_forwarded(&mut map, Some(peer), true);
        assert_eq!(map[&X_FORWARDED_FOR], "203.0.113.9, 10.0.0.7");
        assert_eq!(
            map[&FORWARDED],
            "for=203.0.113.9, for=10.0.0.7;proto=http;host=\"api.example.com\""
        );
        assert_eq!(map[&X_FORWARDED_PROTO], "https");
        assert_eq!(map[&X_FORWARDED_HOST], "api.example.com");

        let mut map = headers(&sent);
        add_forwarded(&mut map, Some(peer), false);
        assert_eq!(
            map[&X_FORWARDED_FOR], "10.0.0.7",
            "a forged chain is dropped"
        );
        assert_eq!(map[&X_FORWARDED_PROTO], "http");

        let mut map = headers(&[("x-forwarded-for", "a, b"), ("x-forwarded-for", "c")]);
        add_forwarded(&mut map, Some("2001:db8::1".parse().unwrap()), true);
        assert_eq!(map[&X_FORWARDED_FOR], "a, b, c, 2001:db8::1");
        assert_eq!(map[&FORWARDED], "for=\"[2001:db8::1]\";proto=http");
    }
}
