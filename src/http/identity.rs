//! Who is asking: the identity of a request, by the configured order of preference.
//!
//! `X-Forwarded-For` and `Forwarded` are believed only when the connection comes from a
//! configured trusted proxy; then the client is the right-most address that is not itself a
//! trusted proxy (the left-most entries are whatever the client chose to send).

use std::net::{IpAddr, SocketAddr};

use http::{Extensions, HeaderMap};
use ipnet::IpNet;

use crate::config::{IdentityConfig, IdentitySource};
use crate::rules::Identity;

/// The authenticated user, put into the request's extensions by an earlier auth layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticatedUser(pub String);

/// The client's tier (plan), put into the request's extensions by an earlier layer; it takes
/// precedence over the `tenants` table of the policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTier(pub String);

/// The peer address of the connection, for servers that do not use axum's `ConnectInfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

/// The default cap on an identity taken from a header (API key, device id): 4 KiB.
pub const DEFAULT_MAX_IDENTITY_BYTES: usize = 4096;

/// A request whose identity header is longer than the cap. The identity is never shortened
/// (two long keys that share a prefix would share a bucket): the request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {} identity is {len} bytes; at most {max}", origin.name())]
pub struct IdentityTooLong {
    /// Where the identity came from.
    pub origin: IdentitySource,
    /// Its length in bytes (trimmed).
    pub len: usize,
    /// The cap.
    pub max: usize,
}

/// The header's value, trimmed; `None` when absent, empty or not visible ASCII.
fn header_text<'a>(
    headers: &'a HeaderMap,
    name: &http::HeaderName,
    source: IdentitySource,
    max: usize,
) -> Result<Option<&'a str>, IdentityTooLong> {
    let Some(value) = headers.get(name).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    let value = value.trim();
    if value.len() > max {
        return Err(IdentityTooLong {
            origin: source,
            len: value.len(),
            max,
        });
    }
    Ok((!value.is_empty()).then_some(value))
}

fn is_trusted(ip: IpAddr, proxies: &[IpNet]) -> bool {
    proxies.iter().any(|net| net.contains(&ip))
}

/// Parse one `for=` value or one `X-Forwarded-For` entry: `192.0.2.1`, `"[2001:db8::1]:4711"`,
/// `192.0.2.1:8080`.
fn parse_node(text: &str) -> Option<IpAddr> {
    let text = text.trim().trim_matches('"');
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    // An IPv6 address with a zone (`fe80::1%eth0`, `[fe80::1%eth0]:443`): the zone names an
    // interface of the proxy, not the client, and is left out.
    let bare = text
        .strip_prefix('[')
        .map_or(text, |rest| rest.split(']').next().unwrap_or(""));
    let address = bare.split_once('%').map_or(bare, |(address, _)| address);
    match address.parse::<IpAddr>() {
        Ok(ip @ IpAddr::V6(_)) => Some(ip),
        Ok(IpAddr::V4(_)) if !bare.contains('%') => address.parse().ok(),
        _ => None,
    }
}

/// The forwarding chain, left (client side) to right (nearest proxy).
fn forwarded_chain(headers: &HeaderMap) -> Vec<IpAddr> {
    let mut chain = Vec::new();
    for value in headers.get_all(http::header::FORWARDED) {
        let Ok(text) = value.to_str() else { continue };
        for element in text.split(',') {
            for pair in element.split(';') {
                if let Some((key, node)) = pair.split_once('=')
                    && key.trim().eq_ignore_ascii_case("for")
                    && let Some(ip) = parse_node(node)
                {
                    chain.push(ip);
                }
            }
        }
    }
    if chain.is_empty() {
        for value in headers.get_all("x-forwarded-for") {
            let Ok(text) = value.to_str() else { continue };
            chain.extend(text.split(',').filter_map(parse_node));
        }
    }
    chain
}

/// Return the client IP: the peer, or (behind trusted proxies) the right-most untrusted hop.
pub(crate) fn client_ip(
    headers: &HeaderMap,
    peer: Option<IpAddr>,
    trusted: &[IpNet],
) -> Option<IpAddr> {
    let peer = peer?;
    if !is_trusted(peer, trusted) {
        return Some(peer);
    }
    let chain = forwarded_chain(headers);
    chain
        .iter()
        .rev()
        .find(|ip| !is_trusted(**ip, trusted))
        .or(chain.first())
        .copied()
        .or(Some(peer))
}

/// The connection's peer as the request's extensions tell it ([`ClientAddr`], or axum's
/// `ConnectInfo`), for a layer that is not told it otherwise.
pub(crate) fn peer_of(extensions: &Extensions) -> Option<IpAddr> {
    extensions
        .get::<ClientAddr>()
        .map(|a| a.0.ip())
        .or_else(|| {
            extensions
                .get::<axum::extract::ConnectInfo<SocketAddr>>()
                .map(|info| info.0.ip())
        })
}

/// Identify the client of a request from `peer` by `config.order`; a request with none of
/// the sources (no peer address either) is `ip:unknown`, and all such requests share one
/// key.
///
/// The identity is used whole (it is hashed, never cut); an API key or device id longer than
/// `max_bytes` is an error, for the caller to refuse the request.
pub(crate) fn identify(
    headers: &HeaderMap,
    extensions: &Extensions,
    peer: Option<IpAddr>,
    config: &IdentityConfig,
    max_bytes: usize,
) -> Result<Identity, IdentityTooLong> {
    for source in &config.order {
        let found = match source {
            IdentitySource::User => extensions
                .get::<AuthenticatedUser>()
                .map(|user| user.0.clone()),
            IdentitySource::ApiKey => {
                header_text(headers, &config.api_key_header, *source, max_bytes)?
                    .map(str::to_string)
            }
            IdentitySource::Device => {
                header_text(headers, &config.device_header, *source, max_bytes)?.map(str::to_string)
            }
            IdentitySource::Ip => client_ip(headers, peer, &config.trusted_proxies)
                .map(|ip| crate::rules::address_text(ip, config.prefixes)),
        };
        if let Some(value) = found {
            return Ok(Identity::new(*source, value));
        }
    }
    Ok(Identity::new(IdentitySource::Ip, "unknown"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn an_ipv6_hop_with_a_zone_is_its_address_and_nothing_else_panics() {
        let link: IpAddr = "fe80::1".parse().unwrap();
        for text in [
            "fe80::1%eth0",
            "[fe80::1%eth0]:443",
            "\"[fe80::1%25]\"",
            "fe80::1%",
        ] {
            assert_eq!(parse_node(text), Some(link), "{text}");
        }
        for text in [
            "192.0.2.1%eth0",
            "%",
            "[%]",
            "fe80::1%eth0%x]",
            "[",
            "]",
            "",
            "::g%1",
        ] {
            assert!(parse_node(text).is_none_or(|ip| ip == link), "{text}");
        }
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let h = headers(&[("x-forwarded-for", "fe80::1%eth0")]);
        let proxy: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(client_ip(&h, Some(proxy), &trusted), Some(link));
    }

    #[test]
    fn forwarded_headers_count_only_from_trusted_proxies() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let spoofed = headers(&[("x-forwarded-for", "203.0.113.9")]);
        let stranger: IpAddr = "198.51.100.4".parse().unwrap();
        assert_eq!(
            client_ip(&spoofed, Some(stranger), &trusted),
            Some(stranger)
        );
        let proxy: IpAddr = "10.1.2.3".parse().unwrap();
        let chain = headers(&[("x-forwarded-for", "1.1.1.1, 203.0.113.9, 10.9.9.9")]);
        assert_eq!(
            client_ip(&chain, Some(proxy), &trusted),
            Some("203.0.113.9".parse().unwrap()),
            "the right-most untrusted hop, not what the client wrote first"
        );
        let forwarded = headers(&[(
            "forwarded",
            "for=\"[2001:db8::7]:4711\";proto=https, for=10.0.0.1",
        )]);
        assert_eq!(
            client_ip(&forwarded, Some(proxy), &trusted),
            Some("2001:db8::7".parse().unwrap())
        );
        let garbage = headers(&[("x-forwarded-for", "not-an-ip, ;;;")]);
        assert_eq!(client_ip(&garbage, Some(proxy), &trusted), Some(proxy));
    }

    #[test]
    fn long_identities_are_used_whole_or_refused() {
        let config = IdentityConfig::default();
        let extensions = Extensions::new();
        let prefix = "k".repeat(600);
        let a = headers(&[("x-api-key", &format!("{prefix}a"))]);
        let b = headers(&[("x-api-key", &format!("{prefix}b"))]);
        let id_a = identify(&a, &extensions, None, &config, 4096).unwrap();
        let id_b = identify(&b, &extensions, None, &config, 4096).unwrap();
        assert_ne!(
            id_a, id_b,
            "keys that differ after 512 bytes are two identities"
        );
        let error = identify(&a, &extensions, None, &config, 600).unwrap_err();
        assert_eq!(error.origin, IdentitySource::ApiKey);
        assert_eq!((error.len, error.max), (601, 600));
    }
}
