//! `[identity]`: which parts of a request identify a client, and which proxies to believe.

use http::HeaderName;
use ipnet::IpNet;
use serde::Deserialize;
use toml::Spanned;

use super::key::AddressPrefixes;
use super::source::{ConfigError, Source};

/// The parts of a request that can identify a client, in order of preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentitySource {
    /// The authenticated user that an earlier auth layer put in the request's extensions
    /// ([`crate::http::AuthenticatedUser`]).
    User,
    /// The API key header (hashed before use).
    ApiKey,
    /// The device id header (hashed before use).
    Device,
    /// The client IP: the peer address, or the forwarded address when the peer is a trusted
    /// proxy.
    Ip,
}

impl IdentitySource {
    /// Return the short name used in keys, logs and configs.
    pub fn name(self) -> &'static str {
        match self {
            IdentitySource::User => "user",
            IdentitySource::ApiKey => "api_key",
            IdentitySource::Device => "device",
            IdentitySource::Ip => "ip",
        }
    }
}

/// How the client is identified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityConfig {
    /// The sources to try, first present wins.
    pub order: Vec<IdentitySource>,
    /// The API key header.
    pub api_key_header: HeaderName,
    /// The device id header.
    pub device_header: HeaderName,
    /// Peers whose `X-Forwarded-For` / `Forwarded` headers are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// How client addresses are grouped into keys (`ipv4_prefix`, `ipv6_prefix`).
    pub prefixes: AddressPrefixes,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        IdentityConfig {
            order: vec![
                IdentitySource::User,
                IdentitySource::ApiKey,
                IdentitySource::Device,
                IdentitySource::Ip,
            ],
            api_key_header: HeaderName::from_static("x-api-key"),
            device_header: HeaderName::from_static("x-device-id"),
            trusted_proxies: Vec::new(),
            prefixes: AddressPrefixes::default(),
        }
    }
}

pub(super) fn build_identity(
    source: &Source<'_>,
    spanned: &Spanned<RawIdentity>,
) -> Result<IdentityConfig, ConfigError> {
    let raw = spanned.get_ref();
    let span = spanned.span();
    let mut identity = IdentityConfig::default();
    if let Some(order) = &raw.order {
        if order.is_empty() {
            let line = source.line_of_key(span.clone(), "order");
            return Err(source.error(line, "identity.order", "must name at least one source"));
        }
        identity.order = order.clone();
    }
    let header = |key: &str, value: &Option<String>, default: HeaderName| match value {
        None => Ok(default),
        Some(name) => HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            source.error(
                source.line_of_key(span.clone(), key),
                format!("identity.{key}"),
                format!("`{name}` is not a valid header name"),
            )
        }),
    };
    identity.api_key_header = header(
        "api_key_header",
        &raw.api_key_header,
        identity.api_key_header,
    )?;
    identity.device_header = header("device_header", &raw.device_header, identity.device_header)?;
    for proxy in &raw.trusted_proxies {
        let net = proxy
            .parse::<IpNet>()
            .or_else(|_| proxy.parse::<std::net::IpAddr>().map(IpNet::from))
            .map_err(|_| {
                source.error(
                    source.line_of_key(span.clone(), "trusted_proxies"),
                    "identity.trusted_proxies",
                    format!("`{proxy}` is not an IP address or CIDR range"),
                )
            })?;
        identity.trusted_proxies.push(net);
    }
    let prefix = |key: &str, value: Option<u8>, most: u8, default: u8| match value {
        None => Ok(default),
        Some(bits) if (1..=most).contains(&bits) => Ok(bits),
        Some(bits) => Err(source.error(
            source.line_of_key(span.clone(), key),
            format!("identity.{key}"),
            format!("between 1 and {most} bits, got {bits}"),
        )),
    };
    identity.prefixes = AddressPrefixes {
        v4: prefix("ipv4_prefix", raw.ipv4_prefix, 32, identity.prefixes.v4)?,
        v6: prefix("ipv6_prefix", raw.ipv6_prefix, 128, identity.prefixes.v6)?,
    };
    Ok(identity)
}

/// `[identity]` as the file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIdentity {
    order: Option<Vec<IdentitySource>>,
    api_key_header: Option<String>,
    device_header: Option<String>,
    #[serde(default)]
    trusted_proxies: Vec<String>,
    ipv4_prefix: Option<u8>,
    ipv6_prefix: Option<u8>,
}
