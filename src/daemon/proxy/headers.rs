//! The header fields a proxied request and its response lose and gain on the way: the
//! hop-by-hop fields are dropped both ways (`Connection` and every field it names,
//! `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`), and the
//! request gets this hop appended to `X-Forwarded-For` and `Forwarded`.
//!
//! The forwarding fields a client sent are kept only when its connection comes from a
//! trusted proxy (the policy file's `identity.trusted_proxies`); from anyone else they are
//! dropped, and the chain starts at the peer's address.

use std::fmt::Write as _;

use bytes::BytesMut;
use std::net::IpAddr;

use http::header::{CONNECTION, FORWARDED, HOST, TE, TRAILER, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::daemon::node_file::Forwarded;

/// `X-Forwarded-For`.
pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
pub(crate) const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Forwarded-Host`.
pub(crate) const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// Whether `name` is a hop-by-hop field (other than those `Connection` names).
pub(crate) fn hop_by_hop(name: &HeaderName) -> bool {
    name == CONNECTION
        || name == KEEP_ALIVE
        || name == TE
        || name == TRAILER
        || name == TRANSFER_ENCODING
        || name == UPGRADE
        || name.as_str().starts_with("proxy-")
}

/// Whether a `Connection` value names no field: only `close` or `keep-alive` tokens.
pub(crate) fn names_no_field(value: &[u8]) -> bool {
    value.split(|&b| b == b',').all(|token| {
        let token = token.trim_ascii();
        token.is_empty()
            || token.eq_ignore_ascii_case(b"close")
            || token.eq_ignore_ascii_case(b"keep-alive")
    })
}

/// Remove the hop-by-hop fields. Returns whether the request asked for trailers
/// (`TE: trailers`), which an HTTP/2 upstream may need to hear again (gRPC).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) -> bool {
    // Most messages have none, or only `Connection`: one pass over the names tells.
    let mut hops = headers.keys().filter(|name| hop_by_hop(name));
    let Some(first) = hops.next() else {
        return false;
    };
    // The usual case, one pass: only `Connection: keep-alive` (or `close`), naming no field.
    if first == CONNECTION && hops.next().is_none() {
        let names_none = headers
            .get_all(CONNECTION)
            .iter()
            .all(|value| names_no_field(value.as_bytes()));
        if names_none {
            headers.remove(CONNECTION);
            return false;
        }
    }
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
    while let Some(name) = headers.keys().find(|name| hop_by_hop(name)).cloned() {
        headers.remove(name);
    }
    trailers
}

/// Append this hop to the request's forwarding fields that `fields` names: `peer` (the
/// connection's address) to `X-Forwarded-For` and `for=peer;proto=http[;host=…]` to
/// `Forwarded`; set `X-Forwarded-Proto` and `X-Forwarded-Host` when no trusted proxy set
/// them. When `trusted` is false the client's own forwarding fields (all four, whether this
/// hop writes them or not) are dropped first.
pub(crate) fn add_forwarded(
    headers: &mut HeaderMap,
    peer: Option<IpAddr>,
    trusted: bool,
    fields: Forwarded,
) {
    let forwarding = |name: &HeaderName| {
        name == X_FORWARDED_FOR
            || name == FORWARDED
            || name == X_FORWARDED_PROTO
            || name == X_FORWARDED_HOST
    };
    let sent = headers.keys().any(forwarding);
    if !trusted && sent {
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
    if fields == Forwarded::NONE {
        return;
    }
    // Room for the four fields at once (one growth of the map at most).
    headers.reserve(4);
    let chain = trusted && sent;
    if fields.contains(Forwarded::FOR) {
        let mut text = BytesMut::with_capacity(64);
        if chain {
            append_list(headers, &X_FORWARDED_FOR, &mut text);
        }
        push_ip(&mut text, peer);
        if let Ok(value) = HeaderValue::from_maybe_shared(text.freeze()) {
            headers.insert(X_FORWARDED_FOR, value);
        }
    }

    let wants_host = fields.contains(Forwarded::FORWARDED) || fields.contains(Forwarded::HOST);
    let host = if wants_host {
        headers.get(HOST).cloned()
    } else {
        None
    };
    if fields.contains(Forwarded::FORWARDED) {
        let mut text = BytesMut::with_capacity(64);
        if chain {
            append_list(headers, &FORWARDED, &mut text);
        }
        match peer {
            IpAddr::V4(_) => {
                text.extend_from_slice(b"for=");
                push_ip(&mut text, peer);
            }
            IpAddr::V6(_) => {
                text.extend_from_slice(b"for=\"[");
                push_ip(&mut text, peer);
                text.extend_from_slice(b"]\"");
            }
        }
        text.extend_from_slice(b";proto=http");
        if let Some(host) = &host
            && let Ok(host) = host.to_str()
            && !host.is_empty()
            && !host.contains(['"', '\\'])
        {
            text.extend_from_slice(b";host=\"");
            text.extend_from_slice(host.as_bytes());
            text.extend_from_slice(b"\"");
        }
        if let Ok(value) = HeaderValue::from_maybe_shared(text.freeze()) {
            headers.insert(FORWARDED, value);
        }
    }

    if fields.contains(Forwarded::PROTO) && (!chain || !headers.contains_key(X_FORWARDED_PROTO)) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
    if fields.contains(Forwarded::HOST)
        && let Some(host) = host
        && (!chain || !headers.contains_key(X_FORWARDED_HOST))
    {
        headers.insert(X_FORWARDED_HOST, host);
    }
}

/// Write `ip` as text (IPv4 without the formatting machinery: it is on every request).
fn push_ip(out: &mut BytesMut, ip: IpAddr) {
    match ip {
        IpAddr::V4(ip) => {
            for (i, octet) in ip.octets().into_iter().enumerate() {
                if i > 0 {
                    out.extend_from_slice(b".");
                }
                if octet >= 100 {
                    out.extend_from_slice(&[b'0' + octet / 100]);
                }
                if octet >= 10 {
                    out.extend_from_slice(&[b'0' + octet / 10 % 10]);
                }
                out.extend_from_slice(&[b'0' + octet % 10]);
            }
        }
        IpAddr::V6(ip) => {
            let _ = write!(out, "{ip}");
        }
    }
}

/// Write the values of `name` (one or more lines) into `out` as one list, with a trailing
/// `", "` when there were any.
fn append_list(headers: &HeaderMap, name: &HeaderName, out: &mut BytesMut) {
    for value in headers.get_all(name) {
        let Ok(text) = value.to_str() else { continue };
        let text = text.trim().trim_end_matches(',').trim_end();
        if !text.is_empty() {
            out.extend_from_slice(text.as_bytes());
            out.extend_from_slice(b", ");
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
        // `Connection` alone: dropped, and the field it names with it.
        let mut map = headers(&[("connection", "Keep-Alive"), ("x-api-key", "k")]);
        assert!(!strip_hop_by_hop(&mut map));
        assert_eq!(
            map.keys().map(HeaderName::as_str).collect::<Vec<_>>(),
            ["x-api-key"]
        );
        let mut map = headers(&[("connection", "close, x-hop"), ("x-hop", "1"), ("x-b", "2")]);
        assert!(!strip_hop_by_hop(&mut map));
        assert_eq!(
            map.keys().map(HeaderName::as_str).collect::<Vec<_>>(),
            ["x-b"]
        );
    }

    #[test]
    fn addresses_are_written_as_their_display_form() {
        for text in [
            "0.0.0.0",
            "9.10.99.100",
            "255.255.255.255",
            "127.0.0.1",
            "::1",
        ] {
            let ip: IpAddr = text.parse().unwrap();
            let mut out = BytesMut::new();
            push_ip(&mut out, ip);
            assert_eq!(&out[..], ip.to_string().as_bytes());
        }
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
        add_forwarded(&mut map, Some(peer), true, Forwarded::ALL);
        assert_eq!(map[&X_FORWARDED_FOR], "203.0.113.9, 10.0.0.7");
        assert_eq!(
            map[&FORWARDED],
            "for=203.0.113.9, for=10.0.0.7;proto=http;host=\"api.example.com\""
        );
        assert_eq!(map[&X_FORWARDED_PROTO], "https");
        assert_eq!(map[&X_FORWARDED_HOST], "api.example.com");

        let mut map = headers(&sent);
        add_forwarded(&mut map, Some(peer), false, Forwarded::ALL);
        assert_eq!(
            map[&X_FORWARDED_FOR], "10.0.0.7",
            "a forged chain is dropped"
        );
        assert_eq!(map[&X_FORWARDED_PROTO], "http");

        let mut map = headers(&[("x-forwarded-for", "a, b"), ("x-forwarded-for", "c")]);
        add_forwarded(
            &mut map,
            Some("2001:db8::1".parse().unwrap()),
            true,
            Forwarded::ALL,
        );
        assert_eq!(map[&X_FORWARDED_FOR], "a, b, c, 2001:db8::1");
        assert_eq!(map[&FORWARDED], "for=\"[2001:db8::1]\";proto=http");
    }

    #[test]
    fn only_the_route_s_fields_are_written_and_forged_ones_still_dropped() {
        let peer: IpAddr = "10.0.0.7".parse().unwrap();
        let sent = [
            ("forwarded", "for=203.0.113.9"),
            ("x-forwarded-host", "evil.example"),
            ("host", "api.example.com"),
        ];
        let mut map = headers(&sent);
        add_forwarded(&mut map, Some(peer), false, Forwarded::FOR);
        assert_eq!(map[&X_FORWARDED_FOR], "10.0.0.7");
        for name in [FORWARDED, X_FORWARDED_PROTO, X_FORWARDED_HOST] {
            assert!(!map.contains_key(&name), "{name} was written or kept");
        }

        let mut map = headers(&sent);
        add_forwarded(&mut map, Some(peer), false, Forwarded::NONE);
        assert_eq!(map.len(), 1, "only host is left: {map:?}");

        let mut map = headers(&sent);
        add_forwarded(
            &mut map,
            Some(peer),
            false,
            Forwarded::FORWARDED.with(Forwarded::HOST),
        );
        assert!(!map.contains_key(&X_FORWARDED_FOR));
        assert_eq!(
            map[&FORWARDED],
            "for=10.0.0.7;proto=http;host=\"api.example.com\""
        );
        assert_eq!(map[&X_FORWARDED_HOST], "api.example.com");
    }
}
